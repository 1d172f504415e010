"""``fleetcare retention apply --db PATH --keep-raw 30d [--dry-run] [--json]``.

Deletes raw telemetry older than --keep-raw once its hours are rolled up; rollups,
features, XID events and incidents are kept (see ``fleetcare.pipeline.retention``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "retention", help="delete raw telemetry that is rolled up and older than N days",
        description="Raw telemetry is the bulk of the database; once its hours are rolled up "
                    "it is no longer needed for features. Rollups and incidents are kept.")
    sub = p.add_subparsers(dest="retention_command", required=True, metavar="ACTION")
    a = sub.add_parser("apply", help="delete raw telemetry older than --keep-raw")
    a.add_argument("--db", required=True)
    a.add_argument("--keep-raw", default="30d",
                   help="keep this much raw telemetry (default 30d; 12h, 90d, ...)")
    a.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    a.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import existing_db
    from fleetcare.collectors.durations import parse_duration
    from fleetcare.pipeline import retention
    from fleetcare.pipeline.store import Store

    try:
        keep = dt.timedelta(seconds=parse_duration(args.keep_raw))
    except ValueError as exc:
        raise ValueError(f"--keep-raw: {exc}") from None
    store = Store(existing_db(args.db))
    try:
        res = retention.apply(store, keep, dry_run=args.dry_run)
    finally:
        store.close()
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        verb = "would delete" if res.dry_run else "deleted"
        held = f" (held back by {res.held_back_by})" if res.held_back_by else ""
        print(f"{verb} {res.deleted:,} raw rows before {res.cutoff or '-'}{held}; "
              f"{res.kept:,} kept")
    return 0
