"""``fleetcare simulate``: a simulated fleet's telemetry and failures, into DuckDB.

    fleetcare simulate --nodes 64 --days 30 --seed 1 --db var/fleet.duckdb
    fleetcare simulate --nodes 2048 --days 54 --incidents-only --json
    fleetcare simulate --nodes 400 --days 348 --incidents-only --incidents-csv inc.csv
    fleetcare simulate --nodes 64 --days 30 --nic-ports 8 --db var/fleet.duckdb
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from fleetcare.api.commands.common import Settings, duration_type, print_json


def add_parser(subparsers: Any) -> None:
    s = subparsers.add_parser(
        "simulate", help="simulate a fleet's telemetry and failures into DuckDB",
        description="Simulate a GPU fleet (calibrated to Llama 3's failure mix) and write "
                    "its history into DuckDB. The data is labelled as simulated everywhere "
                    "it shows.")
    s.add_argument("--nodes", type=int, default=64, help="nodes to simulate (8 GPUs each)")
    s.add_argument("--days", type=float, default=30, help="days of history (default 30)")
    s.add_argument("--seed", type=int, default=None, help="random seed (same seed, same fleet)")
    s.add_argument("--db", help="DuckDB file to write")
    s.add_argument("--interval", type=duration_type(), default="60s",
                   help="sample interval, e.g. 60s or 5m (default 60s; a bare number is "
                        "seconds)")
    s.add_argument("--model", default="H100",
                   help="GPU model or mix: H100, A100, H200, 'H100:3,A100:1'")
    s.add_argument("--failure-scale", type=float, default=1.0,
                   help="multiply every failure rate (1 = Llama 3's rates)")
    s.add_argument("--trace-repeats", action="store_true",
                   help="make failures repeat on the same node as in the real InfiniteHBD "
                        "trace (opt-in repeat knobs fit on it; totals stay Table 5's)")
    s.add_argument("--trace-repairs", action="store_true",
                   help="also repair times as long as the trace's (median 35 h, 90th "
                        "percentile ~530 h), with the repeat knobs fit again for them; "
                        "implies --trace-repeats")
    s.add_argument("--nic-ports", type=int, default=0, metavar="N",
                   help="InfiniBand ports per node (a DGX H100 has 8): write NIC port "
                        "telemetry too, and give a share of cable/switch and NIC failures "
                        "precursors on a port (default 0: no NIC telemetry)")
    s.add_argument("--incidents-only", action="store_true",
                   help="only simulate incidents, write nothing (fast: 2,048 nodes x 54 days "
                        "< 1 s)")
    s.add_argument("--incidents-csv", metavar="FILE",
                   help="also write every simulated incident (failures and repairs) as CSV "
                        "that `fleetcare incident import --csv` reads; notes say 'simulated'")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.api.progress import progress_bar
    from fleetcare.collectors.sim import FleetSpec, simulate_incidents, summarize
    from fleetcare.collectors.sim.incidents import TRACE_FAULTS, TRACE_REPEATS

    knobs: dict[str, Any] = dict(TRACE_FAULTS if args.trace_repairs  # (defaults: all off)
                                 else TRACE_REPEATS if args.trace_repeats else {})
    spec = FleetSpec(nodes=args.nodes, seed=args.seed if args.seed is not None else cfg.seed,
                     model=args.model, failure_scale=args.failure_scale,
                     nic_ports=args.nic_ports, **knobs)
    plan = simulate_incidents(spec, args.days)
    summary = summarize(plan)
    if args.incidents_csv:
        summary["incidents_csv"] = {"path": args.incidents_csv,
                                    "rows": _write_csv(plan, Path(args.incidents_csv))}
    if args.incidents_only:
        if args.json:
            print_json(summary)
        else:
            inc = summary["incidents"]
            print(f"simulated {summary['nodes']} nodes / {summary['gpus']} GPUs for "
                  f"{summary['days']} days: {inc['total']} failures, {inc['gpu_caused']} "
                  "GPU-caused")
            if args.incidents_csv:
                print(f"wrote {summary['incidents_csv']['rows']:,} incidents (failures and "
                      f"repairs, simulated) to {args.incidents_csv}")
            for cause, n in sorted(inc["by_cause"].items(), key=lambda kv: -kv[1]):
                print(f"  {cause:30s} {n:5d}")
        return 0
    from fleetcare.collectors.sim.telemetry import FleetSimulator
    from fleetcare.pipeline.simload import load_history, mark_simulated
    from fleetcare.pipeline.store import Store

    db = args.db or cfg.db
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(db)
    end = spec.start + dt.timedelta(days=args.days)
    progress = progress_bar("simulate", unit="tick")
    result = load_history(store, FleetSimulator(spec, plan), spec.start, end,
                          interval_s=args.interval, progress=progress)
    progress.close()
    mark_simulated(store, f"nodes={spec.nodes} days={args.days} seed={spec.seed} "
                          f"model={spec.model} failure_scale={spec.failure_scale}"
                          + (f" nic_ports={spec.nic_ports}" if spec.nic_ports else "")
                          + "".join(f" {k}={v}" for k, v in knobs.items()))
    store.close()
    out = {**summary, "db": db, "rows": {"telemetry": result.samples, "xid_events": result.events,
                                          "incidents": result.incidents,
                                          "nic_telemetry": result.nic_samples},
           "simulated": True}
    if args.json:
        print_json(out)
    else:
        nics = f", {result.nic_samples:,} NIC port samples" if spec.nic_ports else ""
        print(f"wrote {result.samples:,} samples{nics}, {result.events:,} XID events and "
              f"{result.incidents:,} incidents (simulated) to {db}")
    return 0


def _write_csv(plan: Any, path: Path) -> int:
    """Every incident of ``plan`` (repairs that end within the run too) as import CSV."""
    from fleetcare.collectors.sim import plan_incidents
    from fleetcare.pipeline.incident_import import write_csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        return write_csv(plan_incidents(plan), out,
                         note_prefix=f"simulated seed={plan.spec.seed}")
