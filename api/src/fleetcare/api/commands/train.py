"""``fleetcare train``: train the fleet failure model on a time split.

    fleetcare train --db var/fleet.duckdb --horizon 24h [--json]

On a terminal, steps go to stderr as they happen (``train: [  12s] labels for ...``);
the result goes to stdout, its metrics rounded for people (``--json``: full precision).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetcare.api.commands.common import (
    CliError,
    Settings,
    open_store,
    print_json,
    print_metrics,
    progress_steps,
    train_model,
)
from fleetcare.collectors.durations import parse_duration


def add_parser(subparsers: Any) -> None:
    t = subparsers.add_parser("train", help="train the fleet failure model on a time split")
    t.add_argument("--db", help="DuckDB file with telemetry and incidents")
    t.add_argument("--lake", default=None,
                   help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                        "workers); --db is then the service's state DB (created if missing)")
    t.add_argument("--horizon", default=None,
                   help="predict failures within this time, e.g. 24h (default 24h)")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--min-failures", type=int, default=None, metavar="N",
                   help="node failures the training period must hold before a model of this "
                        "fleet is fitted (default 30; below it the fleet prior scores "
                        "better)")
    t.add_argument("--no-promote", action="store_true",
                   help="register the model without comparing it with the current one "
                        "(default: it becomes current only if it beats it on its held-out "
                        "period)")
    t.add_argument("--quiet", action="store_true",
                   help="no progress lines (shown on stderr when it is a terminal)")
    t.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    try:
        horizon_h = parse_duration(args.horizon or cfg.horizon, bare=None) / 3600
    except ValueError as exc:
        raise CliError(f"--horizon: {exc}") from None
    store = open_store(args.db or cfg.db, lake=args.lake, create=bool(args.lake), sync=True)
    from fleetcare.models.training import TrainError

    say = progress_steps("train", enabled=False if args.quiet else None)
    try:
        result = train_model(store, horizon_h, args.seed if args.seed is not None else cfg.seed,
                             args.min_failures, progress=say)
    except TrainError as exc:
        store.close()
        raise CliError(str(exc)) from None
    if args.no_promote:
        why = (f"{result.model_id} registered, not promoted (--no-promote): "
               f"`fleetcare models promote {result.model_id}` compares it with the current one")
    else:
        from fleetcare.models.promotion import consider

        say("comparing with the current model on its held-out period")
        # current only if it beats the current model on its own held-out period
        why = consider(store, result.model_id).reason
    store.close()
    if args.json:
        print_json({"model_id": result.model_id, "metrics": result.metrics})
        print(f"fleetcare train: {why}", file=sys.stderr)  # the decision: not the contract
    else:
        print(f"trained {result.model_id} (horizon {horizon_h:g} h); held-out metrics:")
        print_metrics(result.metrics)
        print(why)
    return 0
