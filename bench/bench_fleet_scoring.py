"""One rescoring cycle of a 100,000-GPU fleet (simulated data), cold and steady state.

A model is trained on a small simulated fleet, then a 12,500-node x 8-GPU fleet gets
``--hours`` of history at ``--interval`` seconds (default: a week, hourly, so every
7-day window is full; a short history understates the windowed features). A cycle is
what the service's ``rescore`` does each period: ``features.refresh`` (hourly rollups) + ``latest_features``
+ ``score`` (LightGBM, calibration, explanations, writing gpu_scores and node_scores).

- cold: the first cycle after the history was loaded (every rollup row is built);
- steady: ``--cycles`` times, one new tick (``--tick`` seconds, default 5 minutes) for
  every GPU is landed through the store's insert (``Store.insert_samples``, as the
  service's ingest worker does), then one cycle is timed. Figures are the median over the
  cycles. Live features merge the newest hours into a per-GPU base of the older ones
  (``live_features``); as in the service, the next hour's base is built after each
  cycle when not held (``prepare_next``, off the scoring path: ``prepare_s``, not in
  ``cycle_s``). A cycle that had to build a base itself is reported apart
  (``base_built`` / ``base_held``).

Each stage is reported in wall seconds and in CPU seconds of the process (both of
DuckDB's threads count): on a shared machine the CPU seconds move less with other
people's jobs. Ceilings, measured in the same run on the same data: DuckDB aggregating just the new
tick's rows per GPU (count, sums, maxima, last value: what a rollup of them must at
least read), and LightGBM's ``predict`` alone on the same float32 matrix that scoring
builds. Peak RSS is the process's high-water mark over the whole run, and over the
steady cycles alone (``/proc/self/clear_refs`` resets the mark before them).
``thermal_ramp_s``: the thermal-ramp rule's live read (``thermal_ramp.live``, a part of
``score``) timed again on its own after each cycle, its hours as the cycle left them;
``thermal_ramp_cold_s``: the same from nothing (all eleven hours computed, as the code
before kept none; the first cycle of a new hour computes one, inside ``score_s``);
``trend_gpus``: the GPUs it read the trend of (0 and 0 s for code before the rule).

    .venv/bin/python bench/bench_fleet_scoring.py [--nodes 12500] [--hours 168]
        [--interval 3600] [--tick 300] [--cycles 6]     # ~8 min, peak ~3.7 GB
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.models import registry
from fleetcare.models.scoring import score
from fleetcare.models.training import train
from fleetcare.pipeline import features
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def _hwm_mib() -> float:
    """The process's peak RSS since start or the last ``_reset_hwm`` (MiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


try:
    from fleetcare.pipeline import live_features
except ImportError:  # code before live_features (PYTHONPATH at another checkout's sources)
    live_features = None  # type: ignore[assignment]
try:
    from fleetcare.models import thermal_ramp
    from fleetcare.pipeline import temp_trend
except ImportError:  # code before the thermal-ramp rule
    thermal_ramp = None  # type: ignore[assignment]


def _base_builds() -> int:
    """Live-feature bases built so far (0 for code before they existed)."""
    return live_features.BASES.builds if live_features is not None else 0


def _prepare_next(store: Store) -> float:
    """What the service does after each scoring run: the next hour's base, ahead."""
    t0 = time.perf_counter()
    if live_features is not None:
        live_features.prepare_next(store)
    return time.perf_counter() - t0


def _cycle(store: Store) -> tuple[dict[str, Any], Any]:
    """One timed cycle's figures, and the features it scored (for the predict ceiling)."""
    builds = _base_builds()
    c0, t0 = time.process_time(), time.perf_counter()
    features.refresh(store)
    c1, t1 = time.process_time(), time.perf_counter()
    feats = features.latest_features(store)
    c2, t2 = time.process_time(), time.perf_counter()
    result = score(store, features=feats)
    c3, t3 = time.process_time(), time.perf_counter()
    return {"refresh_s": t1 - t0, "latest_features_s": t2 - t1, "score_s": t3 - t2,
            "cycle_s": t3 - t0, "cycle_cpu_s": c3 - c0, "refresh_cpu_s": c1 - c0,
            "latest_features_cpu_s": c2 - c1, "score_cpu_s": c3 - c2,
            "gpus": feats.num_rows, "scored_nodes": result.node_scores.num_rows,
            "base_built": _base_builds() > builds}, feats


def _ingest_tick(store: Store, sim: FleetSimulator, t: dt.datetime, interval_s: int) -> int:
    """Land one tick of every GPU through the store's insert (the ingest path)."""
    n = 0
    for chunk in sim.history(t, t + dt.timedelta(seconds=interval_s), interval_s=interval_s):
        n += store.insert_sample_columns(chunk.samples)
        store.insert_events(chunk.events)
        store.insert_incidents(chunk.incidents)
    return n


def _rollup_ceiling(store: Store, after: dt.datetime) -> float:
    """DuckDB aggregating the rows newer than ``after`` per GPU (and reading them)."""
    t0 = time.perf_counter()
    store.cursor().execute(
        "SELECT gpu_uuid, count(*), min(ts), max(ts), sum(gpu_temp_c), "
        "max(gpu_temp_c), sum(power_w), sum(util_gpu_pct), arg_max(ecc_corrected_volatile, ts), "
        "arg_max(pcie_replay_count, ts), arg_max(nvlink_crc_flit_total, ts) "
        "FROM telemetry WHERE ts > ? GROUP BY gpu_uuid", [after]).fetchall()
    return time.perf_counter() - t0


def _ramp(store: Store, feats: Any) -> tuple[float, float | None, int]:
    """The thermal-ramp rule's live read alone (a part of ``score``) in seconds, as the
    cycle left it (its hours kept, where the code keeps them) and from nothing (every
    hour computed: the first scoring after a start; None for code that keeps none), and
    the GPUs whose trend it read (those at least ``RESID_C`` over their power's
    prediction)."""
    if thermal_ramp is None:
        return 0.0, None, 0
    t0 = time.perf_counter()
    ramp = thermal_ramp.live(store, feats)
    warm = time.perf_counter() - t0
    cold = None
    kept = getattr(temp_trend, "HOURS", None)
    if kept is not None:
        try:
            temp_trend.HOURS = type(kept)()
            t0 = time.perf_counter()
            thermal_ramp.live(store, feats)
            cold = time.perf_counter() - t0
        finally:
            temp_trend.HOURS = kept
    return warm, cold, int((ramp.resid >= thermal_ramp.RESID_C).sum())


def _predict_ceiling(store: Store, feats: Any) -> float:
    """LightGBM's predict alone on the float32 matrix scoring predicts on."""
    rec = registry.current(store)
    assert rec is not None
    m = registry.load(store, rec.model_id)
    X = m.matrix(feats)
    t0 = time.perf_counter()
    m.booster_.predict(X, raw_score=True, num_threads=m.num_threads)
    return time.perf_counter() - t0


def _median(rows: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--hours", type=float, default=168,
                   help="hours of history (default a week: every 7-day window full)")
    p.add_argument("--interval", type=int, default=3600,
                   help="seconds between history samples (default hourly: one per rollup row)")
    p.add_argument("--tick", type=int, default=300,
                   help="seconds of telemetry landed before each steady cycle")
    p.add_argument("--cycles", type=int, default=6)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = Store(Path(tmp) / "small.duckdb")
        spec = FleetSpec(nodes=24, seed=5, failure_scale=20)
        sim = FleetSimulator(spec, simulate_incidents(spec, 13))
        load_history(small, sim, spec.start, spec.start + dt.timedelta(days=12), interval_s=600)
        features.refresh(small)
        # any model of the fleet's features will do: this small fleet has fewer failures
        # than `train` asks of a fleet's own model, so the floor is lowered
        model = train(small, register=False, min_failures=1).model
        small.close()

        big = Store(Path(tmp) / "big.duckdb")
        registry.save(big, model, make_current=True)
        spec = FleetSpec(nodes=args.nodes, seed=9)
        sim = FleetSimulator(spec, simulate_incidents(spec, 1))
        end = spec.start + dt.timedelta(hours=args.hours)
        t0 = time.perf_counter()
        loaded = load_history(big, sim, spec.start, end, interval_s=args.interval)
        load_s = time.perf_counter() - t0
        cold, _ = _cycle(big)
        cold["prepare_s"] = _prepare_next(big)
        _reset_hwm()
        steady: list[dict[str, float]] = []
        t = end
        for _ in range(args.cycles):
            t0 = time.perf_counter()
            new = _ingest_tick(big, sim, t, args.tick)
            ingest_s = time.perf_counter() - t0
            row, feats = _cycle(big)
            row["ingest_s"] = ingest_s
            row["new_samples"] = new
            row["rollup_ceiling_s"] = _rollup_ceiling(big, t - dt.timedelta(microseconds=1))
            row["predict_ceiling_s"] = _predict_ceiling(big, feats)
            row["thermal_ramp_s"], cold_ramp, row["trend_gpus"] = _ramp(big, feats)
            if cold_ramp is not None:
                row["thermal_ramp_cold_s"] = cold_ramp
            row["prepare_s"] = _prepare_next(big)
            steady.append(row)
            t += dt.timedelta(seconds=args.tick)
        steady_hwm = _hwm_mib()
        big.close()
    keys = ("refresh_s", "latest_features_s", "score_s", "cycle_s", "ingest_s",
            "rollup_ceiling_s", "predict_ceiling_s", "thermal_ramp_s", "refresh_cpu_s",
            "latest_features_cpu_s", "score_cpu_s", "cycle_cpu_s")
    med = {k: _median(steady, k) for k in keys}
    split = {}
    for name, rows in (("base_built", [r for r in steady if r["base_built"]]),
                       ("base_held", [r for r in steady if not r["base_built"]])):
        if rows:
            split[name] = {"cycles": len(rows), **{k: _median(rows, k) for k in keys}}
    report("fleet_scoring", {
        "gpus": cold["gpus"], "history_samples": loaded.samples,
        "history_load_s": round(load_s, 2),
        "cold": {k: round(v, 3) for k, v in cold.items()},
        "tick_s": args.tick,
        "steady_median": med, "steady_cycles": len(steady), **split,
        "new_samples_per_cycle": steady[0]["new_samples"],
        "trend_gpus": steady[0]["trend_gpus"],
        "thermal_ramp_s_each": [round(r["thermal_ramp_s"], 3) for r in steady],
        "thermal_ramp_cold_s_each": [round(r["thermal_ramp_cold_s"], 3) for r in steady
                                     if "thermal_ramp_cold_s" in r],
        "steady_cycle_s_each": [round(r["cycle_s"], 3) for r in steady],
        "steady_cycle_cpu_s_each": [round(r["cycle_cpu_s"], 3) for r in steady],
        "prepare_s_each": [round(r["prepare_s"], 3) for r in steady],
        "refresh_over_rollup_ceiling": round(med["refresh_s"] / med["rollup_ceiling_s"], 1),
        "score_over_predict_ceiling": round(med["score_s"] / med["predict_ceiling_s"], 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "steady_peak_rss_mib": round(steady_hwm),
    })


if __name__ == "__main__":
    main()
