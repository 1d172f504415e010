"""``fleetcare tokens``: create, list and revoke the REST API's bearer tokens.

    fleetcare tokens create --scope read|write|admin --db PATH [--name N] [--json]
    fleetcare tokens list --db PATH [--json]
    fleetcare tokens revoke ID --db PATH [--json]

    fleetcare tokens create|list|revoke ... --api URL [--token ADMIN_TOKEN]

``create`` prints the new token once, alone on stdout (``--json``: ``{"token", "id",
"scope"}``); only its SHA-256 is stored. Store it where the scheduler reads it.
DuckDB lets one process write a database: while ``fleetcare serve`` holds it, manage
tokens through its API (``--api``, with an admin token from ``--token`` or
``FLEETCARE_TOKEN``); the first admin token is made with ``--db`` before serving.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetcare.api import auth
from fleetcare.api.http_client import add_api_arguments


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="the DuckDB file (while no server holds it)")
    add_api_arguments(p)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokens", help="create, list and revoke API bearer tokens",
        description="Bearer tokens for the REST API. Scopes nest: read (schedulers, "
                    "dashboards) < write (incident reports) < admin (configuration).")
    sub = p.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")

    c = sub.add_parser("create", help="create a token and print it (once)")
    c.add_argument("--scope", required=True, choices=auth.SCOPES)
    c.add_argument("--name", help="who or what uses it, e.g. slurm-prolog")
    _where(c)
    c.add_argument("--json", action="store_true",
                   help='print {"token", "id", "scope"} instead of the bare token')

    ls = sub.add_parser("list", help="list tokens (never their values)")
    _where(ls)
    ls.add_argument("--json", action="store_true")

    r = sub.add_parser("revoke", help="revoke a token by id")
    r.add_argument("id", metavar="ID", help="the token's id (tok_..., see `tokens list`)")
    _where(r)
    r.add_argument("--json", action="store_true")


def _via_api(args: argparse.Namespace) -> tuple[str, Any]:
    from fleetcare.api.http_client import call, quote

    action = args.tokens_command
    if action == "create":
        doc = call(args.api, "POST", "/v1/tokens", token=args.token,
                   body={"scope": args.scope, "name": args.name})
        return doc.pop("token"), doc
    if action == "list":
        return "", call(args.api, "GET", "/v1/tokens", token=args.token)["tokens"]
    return "", call(args.api, "POST", f"/v1/tokens/{quote(args.id)}/revoke", token=args.token)


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import existing_db
    from fleetcare.pipeline.store import Store, StoreError

    if (args.db is None) == (args.api is None):
        print("fleetcare tokens: give --db PATH (no server holds it) or --api URL (a "
              "running `fleetcare serve`), one of them", file=sys.stderr)
        return 2
    action = args.tokens_command
    if args.api:
        token, got = _via_api(args)
        _show(args, action, token, got)
        return 0
    try:
        store = Store(existing_db(args.db))
    except StoreError as exc:
        print(f"fleetcare tokens: {exc} While `fleetcare serve` runs: fleetcare tokens "
              f"{action} ... --api http://HOST:8000 --token ADMIN_TOKEN", file=sys.stderr)
        return 1
    try:
        cur = store.cursor()
        if action == "create":
            token, info = auth.create_token(cur, args.scope, name=args.name)
            _show(args, action, token, info.as_json())
        elif action == "list":
            _show(args, action, "", [t.as_json() for t in auth.list_tokens(cur)])
        else:
            _show(args, action, "", auth.revoke_token(cur, args.id).as_json())
    finally:
        store.close()
    return 0


def _show(args: argparse.Namespace, action: str, token: str, got: Any) -> None:
    """Print what ``action`` gave: the token and its row for create, the rows for list,
    the revoked row for revoke (rows as ``TokenInfo.as_json``)."""
    if action == "create":
        if args.json:
            print(json.dumps({"token": token, "id": got["id"], "scope": got["scope"]}))
        else:
            print(token)
        print(f"created token {got['id']} (scope {got['scope']}); it is shown only this "
              "once: store it now", file=sys.stderr)
    elif action == "list":
        if args.json:
            print(json.dumps(got))
        else:
            for t in got:
                state = f"revoked {t['revoked_at']}" if t["revoked_at"] else "active"
                print(f"{t['id']}  {t['scope']:5s}  {state:30s}  created "
                      f"{t['created_at']}  {t['name'] or '-'}")
    elif args.json:
        print(json.dumps(got))
    else:
        print(f"revoked {got['id']} (scope {got['scope']})")
