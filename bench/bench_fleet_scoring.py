"""Featurise + score a 100,000-GPU fleet (simulated data).

A model is trained on a small simulated fleet, then a 12,500-node x 8-GPU fleet gets a
short history; the figure is one rescoring cycle as the service runs it every minute:
``features.refresh`` (incremental hourly rollups) + ``latest_features`` + ``score``
(LightGBM, calibration, explanations, writing gpu_scores and node_scores).

    .venv/bin/python bench/bench_fleet_scoring.py [--nodes 12500] [--hours 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

from _common import report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.models import registry
from fleetcare.models.scoring import score
from fleetcare.models.training import train
from fleetcare.pipeline import features
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--hours", type=float, default=2)
    p.add_argument("--interval", type=int, default=300)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = Store(Path(tmp) / "small.duckdb")
        spec = FleetSpec(nodes=24, seed=5, failure_scale=20)
        sim = FleetSimulator(spec, simulate_incidents(spec, 13))
        load_history(small, sim, spec.start, spec.start + dt.timedelta(days=12), interval_s=600)
        features.refresh(small)
        model = train(small, register=False).model
        small.close()

        big = Store(Path(tmp) / "big.duckdb")
        registry.save(big, model, make_current=True)
        spec = FleetSpec(nodes=args.nodes, seed=9)
        sim = FleetSimulator(spec, simulate_incidents(spec, 1))
        t0 = time.perf_counter()
        loaded = load_history(big, sim, spec.start, spec.start + dt.timedelta(hours=args.hours),
                              interval_s=args.interval)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        features.refresh(big)
        t1 = time.perf_counter()
        feats = features.latest_features(big)
        t2 = time.perf_counter()
        result = score(big, features=feats)
        t3 = time.perf_counter()
        gpus = feats.num_rows
        big.close()
    report("fleet_scoring", {
        "gpus": gpus, "history_samples": loaded.samples, "history_load_s": round(load_s, 2),
        "refresh_s": round(t1 - t0, 2), "latest_features_s": round(t2 - t1, 2),
        "score_s": round(t3 - t2, 2), "cycle_s": round(t3 - t0, 2),
        "scored_nodes": result.node_scores.num_rows,
    })


if __name__ == "__main__":
    main()
