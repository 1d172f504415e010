"""Simulator throughput: samples per second of columnar history (simulated data).

    .venv/bin/python bench/bench_simulator.py [--nodes 64] [--hours 24]
"""

from __future__ import annotations

import argparse
import datetime as dt

from _common import best_of, report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator


def run(nodes: int, hours: float, interval_s: int) -> int:
    spec = FleetSpec(nodes=nodes, seed=1)
    sim = FleetSimulator(spec, simulate_incidents(spec, hours / 24 + 1))
    n = 0
    for chunk in sim.history(spec.start, spec.start + dt.timedelta(hours=hours), interval_s=interval_s):
        n += len(chunk.samples["ts"])
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--hours", type=float, default=24)
    args = p.parse_args()
    secs, n = best_of(lambda: run(args.nodes, args.hours, 60))
    report("simulator", {"gpus": args.nodes * 8, "hours": args.hours, "samples": n,
                         "seconds": round(secs, 3), "samples_per_s": round(n / secs)})
    big_secs, big_n = best_of(lambda: run(12_500, 0.25, 60), repeat=1)
    report("simulator_100k_gpus", {"gpus": 100_000, "ticks": 15, "samples": big_n,
                                   "seconds": round(big_secs, 3),
                                   "samples_per_s": round(big_n / big_secs)})


if __name__ == "__main__":
    main()
