"""Repeat failures: the real trace's earlier and later part vs the simulator (issue 16).

    .venv/bin/python bench/bench_repeats.py [--seeds 5] [--lemon-fraction F]

``repeat_stats`` (``fleetcare.models.repeats``) on stepfun-ai/InfiniteHBD-Trace (real:
400 GPU servers, 348 days; vendored in ``bench/data/infinitehbd``), split as the
recurrence model is (``FIT_FRACTION``: the first 60 % to calibrate, the last 40 % to
check) and whole, and on simulated fleets of the same size and duration (``simulate_incidents``,
incidents only, no telemetry), cut into the same windows. The trace's servers are
8-GPU servers of an unknown GPU model: the simulator uses its default (H100). Simulated
figures are the mean over ``--seeds`` seeds with their range; every section says whether
its data is real or simulated. Prints one JSON line (~2 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Any

from fleetcare.collectors.sim import FleetSpec, plan_incidents, simulate_incidents
from fleetcare.models.recurrence import (
    FIT_FRACTION,
    TRACE_ORIGIN,
    TRACE_SERVERS,
    trace_incidents,
)
from fleetcare.models.repeats import repeat_stats

TRACE = Path(__file__).parent / "data" / "infinitehbd" / "fault_trace.json"
STATS = ("failures_per_1000_node_days", "repeat_7d", "repeat_30d", "top10_share",
         "repair_h_median", "repair_h_p90")


def windows(rows: list[tuple], start: dt.datetime, days: float, servers: int
            ) -> dict[str, dict[str, Any]]:
    split = days * FIT_FRACTION
    return {
        "whole": repeat_stats(rows, servers, days, start=start),
        "earlier": repeat_stats(rows, servers, split, start=start),
        "later": repeat_stats(rows, servers, days - split,
                              start=start + dt.timedelta(days=split)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--lemon-fraction", type=float, default=None,
                    help="FleetSpec.lemon_fraction of the simulated fleets (default: its own)")
    args = ap.parse_args()
    events = json.loads(TRACE.read_text())
    days = max(float(e["event_time"]) for e in events)
    trace_rows = [(r["ts"], r["node"], r["kind"], r["cause"]) for r in trace_incidents(events)]
    real = windows(trace_rows, TRACE_ORIGIN, days, TRACE_SERVERS)
    extra = {} if args.lemon_fraction is None else {"lemon_fraction": args.lemon_fraction}
    per_seed = []
    for seed in range(1, args.seeds + 1):
        spec = FleetSpec(nodes=TRACE_SERVERS, seed=seed, **extra)
        inc = plan_incidents(simulate_incidents(spec, days))
        rows = [(i.ts, i.node, i.kind, i.cause) for i in inc]
        per_seed.append(windows(rows, spec.start, days, TRACE_SERVERS))
    sim: dict[str, dict[str, Any]] = {}
    for part in ("whole", "earlier", "later"):
        sim[part] = {}
        for k in STATS:
            vals = [s[part][k] for s in per_seed if s[part][k] is not None]
            sim[part][k] = {"mean": round(sum(vals) / len(vals), 4),
                            "min": min(vals), "max": max(vals)}
    print(json.dumps({
        "bench": "repeats",
        "trace": {"data": "real: stepfun-ai/InfiniteHBD-Trace (Apache-2.0)",
                  "servers": TRACE_SERVERS, "days": round(days, 2),
                  "split_day": round(days * FIT_FRACTION, 2), **real},
        "simulator": {"data": "simulated", "nodes": TRACE_SERVERS, "days": round(days, 2),
                      "model": "H100", "seeds": args.seeds, **extra, **sim},
        "note": "repeat_7d / repeat_30d count only failures with 30 days of the window "
                "after them; top10_share is over all servers, never-failing ones included",
        "cpus": os.cpu_count(), "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()
