"""``fleetcare rollup``: bring the hourly rollups up to date, or rebuild them.

    fleetcare rollup --db var/fleet.duckdb [--full] [--json]

Every command that scores (``score``, ``serve``, ``train``, ``evaluate``) already rolls up
what arrived since its last run; this command does only that, for a cron job or after a
bulk load. ``--full`` rebuilds every hour that still has raw telemetry (hours whose raw
rows retention deleted are kept as they are). A store rolled up in bulk before rollups
were written in hour order (zone maps then skip the other hours: a one-node live build
took 0.6x the time on large stores) gets that order from one ``--full`` run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from fleetcare.api.commands.common import Settings, open_store, print_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rollup", help="roll up telemetry into hourly rows now (--full: rebuild them)",
        description="Roll the raw telemetry that arrived since the last rollup into "
                    "telemetry_hourly and nic_hourly (what scoring does first anyway). "
                    "--full rebuilds every hour that still has raw telemetry, in hour "
                    "order: run it once on a store rolled up by an older version.")
    p.add_argument("--db")
    p.add_argument("--lake", default=None,
                   help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                        "workers); --db is then the service's state DB")
    p.add_argument("--full", action="store_true",
                   help="rebuild every hour that still has raw telemetry")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.pipeline import nic_rollup, rollup

    store = open_store(args.db or cfg.db, lake=args.lake, sync=True)
    try:
        t0 = time.perf_counter()
        rollup.refresh(store, full=args.full)
        nic_rollup.refresh(store, full=args.full)
        seconds = time.perf_counter() - t0
        cur = store.cursor()
        rollup.ensure_tables(cur)  # an empty store has no rollup table yet
        rows, hours, first, last = cur.execute(
            f"SELECT count(*), count(DISTINCT hour), min(hour), max(hour) "
            f"FROM {rollup.TABLE}").fetchall()[0]
        nic_rows = cur.execute(f"SELECT count(*) FROM {nic_rollup.TABLE}").fetchall()[0][0]
    finally:
        store.close()
    out = {"full": args.full, "telemetry_hourly_rows": rows, "hours": hours,
           "first_hour": first.isoformat() if first else None,
           "last_hour": last.isoformat() if last else None,
           "nic_hourly_rows": nic_rows, "seconds": round(seconds, 2)}
    if args.json:
        print_json(out)
    else:
        what = "rebuilt" if args.full else "brought up to date"
        span = f", {first:%Y-%m-%d %H:00} to {last:%Y-%m-%d %H:00}" if first else ""
        print(f"rollups {what} in {seconds:.1f} s: {rows:,} GPU-hours over {hours:,} "
              f"hours{span}; {nic_rows:,} NIC port-hours")
    return 0
