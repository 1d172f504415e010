"""Simulator throughput: samples per second of columnar history (simulated data).

    .venv/bin/python bench/bench_simulator.py [--nodes 64] [--hours 24] [--runs 5]

For each case, ``samples_per_s`` is the history's own rate (``FleetSimulator.history``,
its first chunk included); ``setup_s`` (fleet layout, incident plan, simulator) is timed
apart and ``samples_per_s_with_setup`` counts it too. ``steady_samples_per_s`` leaves the
first chunk out (it builds the simulator's groups and, three days in, catches the
counters up from the fleet's start: ``first_chunk_s``), i.e. the rate of a long history. The ceiling is numpy copying every
array of every chunk once, measured chunk by chunk in the same run: what writing the
same arrays costs here, with no simulation. ``samples_per_cpu_s`` divides by the
process's CPU time instead of wall time (steadier on a shared machine). Each figure is
the median of ``--runs``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import statistics
import time

from _common import report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator


def run(nodes: int, hours: float, interval_s: int, start_h: float = 0.0) -> dict[str, float]:
    t0 = time.perf_counter()
    spec = FleetSpec(nodes=nodes, seed=1)
    sim = FleetSimulator(spec, simulate_incidents(spec, (start_h + hours) / 24 + 1))
    setup = time.perf_counter() - t0
    start = spec.start + dt.timedelta(hours=start_h)
    chunks = sim.history(start, start + dt.timedelta(hours=hours), interval_s=interval_s)
    n, hist, ceil, cpu = 0, 0.0, 0.0, 0.0
    first: tuple[int, float] | None = None  # (samples, seconds) of the first chunk
    while True:
        t0, c0 = time.perf_counter(), time.process_time()
        chunk = next(chunks, None)
        took = time.perf_counter() - t0
        hist += took
        cpu += time.process_time() - c0
        if chunk is None:
            break
        t0 = time.perf_counter()
        copies = {k: v.copy() for k, v in chunk.samples.items()}
        ceil += time.perf_counter() - t0
        n += len(copies["ts"])
        first = first or (n, took)
        del copies, chunk
    assert first is not None and n > first[0], "a case needs two chunks or more"
    return {"samples": n, "setup": setup, "history": hist, "ceiling": ceil, "cpu": cpu,
            "first_samples": first[0], "first": first[1]}


def case(name: str, gpus: int, runs: list[dict[str, float]], **extra: object) -> None:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    n = runs[0]["samples"]
    rate = statistics.median(r["samples"] / r["history"] for r in runs)
    ceiling = statistics.median(r["samples"] / r["ceiling"] for r in runs)
    report(name, {
        "gpus": gpus, **extra, "samples": n, "runs": len(runs),
        "samples_per_s": round(rate), "ceiling_samples_per_s": round(ceiling),
        "ratio": round(statistics.median(r["ceiling"] / r["history"] for r in runs), 3),
        "samples_per_cpu_s": round(statistics.median(r["samples"] / r["cpu"] for r in runs)),
        "steady_samples_per_s": round(statistics.median(
            (r["samples"] - r["first_samples"]) / (r["history"] - r["first"]) for r in runs)),
        "first_chunk_s": round(med("first"), 3),
        "setup_s": round(med("setup"), 3),
        "samples_per_s_with_setup": round(statistics.median(
            r["samples"] / (r["setup"] + r["history"]) for r in runs)),
        "all_samples_per_s": [round(r["samples"] / r["history"]) for r in runs],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    })


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--hours", type=float, default=24)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    small = [run(args.nodes, args.hours, 60) for _ in range(args.runs)]
    case("simulator", args.nodes * 8, small, hours=args.hours)
    # 100,000 GPUs: 15 ticks from the fleet's start (no node down yet), and 15 ticks
    # three days in, when repairs keep some nodes down (their rows are left out)
    big = [run(12_500, 0.25, 60) for _ in range(args.runs)]
    case("simulator_100k_gpus", 100_000, big, ticks=15, from_h=0)
    later = [run(12_500, 0.25, 60, start_h=72.0) for _ in range(args.runs)]
    case("simulator_100k_gpus_day3", 100_000, later, ticks=15, from_h=72)


if __name__ == "__main__":
    main()
