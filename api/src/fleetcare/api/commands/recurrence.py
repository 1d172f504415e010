"""``fleetcare recurrence``: which nodes will fail again, from incident history alone.

    fleetcare recurrence --db PATH [--at TIME] [--limit N] [--json]

Every node with an incident on record, ranked by ``risk_7d`` (the probability of a failure
within 7 days), from the incidents known at ``--at`` (default now) only, with reasons in
plain words. The model is fit on a real production fault trace
(``fleetcare.models.recurrence``); import your own history first with
``fleetcare incident import --csv`` or ``--slurm-events``.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetcare.api.commands.common import CliError, Settings, existing_db, print_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "recurrence", help="rank nodes by the risk of failing again within 7 days, from "
                           "incident history alone",
        description="Repeat failures from incident history (tickets, Slurm node events): "
                    "how recently and how often each node failed, no telemetry needed. "
                    "The model was fit on a real 400-server production fault trace "
                    "(InfiniteHBD); see the README for how it ranks next-week faults.")
    p.add_argument("--db", help="the database with the incidents (default [cli] db)")
    p.add_argument("--at", default="now", metavar="TIME",
                   help="rank as of this ISO-8601 time, using only incidents up to it "
                        "(default now)")
    p.add_argument("--limit", type=int, default=None, help="nodes to show (default all)")
    p.add_argument("--json", action="store_true",
                   help='print {"at", "model", "nodes": [{"node", "risk_7d", "reasons"}]}')


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.models import recurrence
    from fleetcare.pipeline.incidents import IncidentError, parse_time
    from fleetcare.pipeline.store import Store

    try:
        at = parse_time(args.at)
    except IncidentError as exc:
        raise CliError(f"--at: {exc}") from None
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit {args.limit}: give 1 or more nodes")
    db = args.db or cfg.db
    store = Store(existing_db(db, make=f"fleetcare incident import --csv FILE --db {db}"))
    try:
        history = recurrence.store_history(store, at)
    finally:
        store.close()
    model = recurrence.load()
    nodes = recurrence.score(history, at, model, limit=args.limit)
    when = at.isoformat().replace("+00:00", "Z")
    data = model.meta.get("data")
    out = {"at": when, "horizon_days": recurrence.HORIZON_DAYS,
           "model": {"id": model.model_id, "data": data}, "nodes": nodes}
    if args.json:
        print_json(out)
        return 0
    if not nodes:
        print(f"no incidents on record up to {when}: import them with "
              "`fleetcare incident import --csv FILE --db DB`")
        return 0
    width = max(len(n["node"]) for n in nodes)
    for n in nodes:
        print(f"{n['node']:<{width}}  {n['risk_7d']:.3f}  {'; '.join(n['reasons'])}")
    print(f"risk of a failure within 7 days, as of {when}; {model.model_id} ({data})")
    return 0
