"""``fleetcare score``: score every GPU and node now with the current model.

    fleetcare score --db var/fleet.duckdb [--limit 10] [--json]
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetcare.api.commands.common import Settings, open_store, print_json, print_top, top_risk


def add_parser(subparsers: Any) -> None:
    sc = subparsers.add_parser("score", help="score every GPU and node now with the current "
                                             "model")
    sc.add_argument("--db")
    sc.add_argument("--lake", default=None,
                    help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                         "workers); --db is then the service's state DB (created if missing)")
    sc.add_argument("--limit", type=int, default=10, help="nodes to show (default 10)")
    sc.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.models import registry
    from fleetcare.models.scoring import score
    from fleetcare.pipeline import features

    store = open_store(args.db or cfg.db, lake=args.lake, create=bool(args.lake), sync=True)
    features.refresh(store)
    result = score(store)  # the fleet prior when the fleet has no model of its own
    rec = registry.get(store, result.model_id)
    top = top_risk(store, args.limit)
    store.close()
    if args.json:
        print_json({"top_risk": top, "model_id": rec.model_id, "origin": rec.origin})
    else:
        print_top(top)
        print(f"scored with {rec.model_id} ({rec.origin}"
              f"{': ' + rec.current_reason if rec.current_reason else ''})")
    return 0
