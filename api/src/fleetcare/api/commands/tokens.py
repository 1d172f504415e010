"""``fleetcare tokens``: create, list and revoke the REST API's bearer tokens.

    fleetcare tokens create --scope read|write|admin --db PATH [--name N] [--json]
    fleetcare tokens list --db PATH [--json]
    fleetcare tokens revoke ID --db PATH [--json]

``create`` prints the new token once, alone on stdout (``--json``: ``{"token", "id",
"scope"}``); only its SHA-256 is stored. Store it where the scheduler reads it.
DuckDB lets one process write a database: run these while ``fleetcare serve`` is
stopped (the service holds the file while it runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetcare.api import auth


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokens", help="create, list and revoke API bearer tokens",
        description="Bearer tokens for the REST API. Scopes nest: read (schedulers, "
                    "dashboards) < write (incident reports) < admin (configuration).")
    sub = p.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")

    c = sub.add_parser("create", help="create a token and print it (once)")
    c.add_argument("--scope", required=True, choices=auth.SCOPES)
    c.add_argument("--name", help="who or what uses it, e.g. slurm-prolog")
    c.add_argument("--db", required=True)
    c.add_argument("--json", action="store_true",
                   help='print {"token", "id", "scope"} instead of the bare token')

    ls = sub.add_parser("list", help="list tokens (never their values)")
    ls.add_argument("--db", required=True)
    ls.add_argument("--json", action="store_true")

    r = sub.add_parser("revoke", help="revoke a token by id")
    r.add_argument("id", metavar="ID", help="the token's id (tok_..., see `tokens list`)")
    r.add_argument("--db", required=True)
    r.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.cli import _existing_db
    from fleetcare.pipeline.store import Store, StoreError

    try:
        store = Store(_existing_db(args.db))
    except StoreError as exc:
        print(f"fleetcare tokens: {exc}", file=sys.stderr)
        return 1
    try:
        cur = store.cursor()
        action = args.tokens_command
        if action == "create":
            token, info = auth.create_token(cur, args.scope, name=args.name)
            if args.json:
                print(json.dumps({"token": token, "id": info.id, "scope": info.scope}))
            else:
                print(token)
            print(f"created token {info.id} (scope {info.scope}); it is shown only this "
                  "once: store it now", file=sys.stderr)
        elif action == "list":
            rows = [t.as_json() for t in auth.list_tokens(cur)]
            if args.json:
                print(json.dumps(rows))
            else:
                for t in rows:
                    state = f"revoked {t['revoked_at']}" if t["revoked_at"] else "active"
                    print(f"{t['id']}  {t['scope']:5s}  {state:30s}  created "
                          f"{t['created_at']}  {t['name'] or '-'}")
        else:
            info = auth.revoke_token(cur, args.id)
            if args.json:
                print(json.dumps(info.as_json()))
            else:
                print(f"revoked {info.id} (scope {info.scope})")
    finally:
        store.close()
    return 0
