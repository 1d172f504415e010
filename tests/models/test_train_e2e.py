"""End to end on a real store: telemetry + incidents → features → train → registry → score.

Telemetry is planted (not the simulator) so the test controls how many failures fall in
each period: a GPU that will fail logs corrected ECC errors fast for 18 h before.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from fleetcare.collectors.contract import Incident
from fleetcare.models import registry
from fleetcare.models.scoring import latest_node_scores, score
from fleetcare.models.training import train

from .conftest import T0

NODES, GPUS, DAYS, TICK_MIN = 8, 2, 14, 10


def _plant(store) -> list[Incident]:
    rng = np.random.default_rng(0)
    ticks = DAYS * 24 * 60 // TICK_MIN
    grid = np.datetime64(T0.replace(tzinfo=None), "us") + np.arange(ticks) * np.timedelta64(TICK_MIN, "m")
    fails = [(k % NODES, k % GPUS, T0 + dt.timedelta(hours=36 + 12 * k + 5)) for k in range(25)
             if 36 + 12 * k + 5 < DAYS * 24]
    incidents = [Incident(ts=f, node=f"node-{n}", kind="failure", cause="gpu_hbm3_memory",
                          source="test", gpu_uuid=f"GPU-{n}-{g}", mode="hbm", xid=48)
                 for n, g, f in fails]
    for n in range(NODES):
        down = np.zeros(ticks, dtype=bool)
        for fn, _, f in fails:
            if fn == n:
                f64 = np.datetime64(f.replace(tzinfo=None), "us")
                down |= (grid >= f64) & (grid < f64 + np.timedelta64(4, "h"))
        for g in range(GPUS):
            rate = np.full(ticks, 0.01)
            for fn, fg, f in fails:
                if (fn, fg) == (n, g):
                    f64 = np.datetime64(f.replace(tzinfo=None), "us")
                    rate[(grid >= f64 - np.timedelta64(18, "h")) & (grid < f64)] = 5.0
            ecc = np.cumsum(rng.poisson(rate))
            keep = ~down
            k = int(keep.sum())
            store.insert_sample_columns({
                "ts": grid[keep],
                "node": np.full(k, f"node-{n}", dtype=object),
                "gpu_uuid": np.full(k, f"GPU-{n}-{g}", dtype=object),
                "gpu_index": np.full(k, g),
                "pci_bus_id": np.full(k, f"00000000:{g + 1:02x}:00.0", dtype=object),
                "model": np.full(k, "NVIDIA H100 80GB HBM3", dtype=object),
                "gpu_temp_c": rng.normal(60, 3, k),
                "power_w": rng.normal(500, 30, k),
                "util_gpu_pct": rng.uniform(80, 100, k),
                "ecc_corrected_volatile": ecc[keep],
                "ecc_corrected_aggregate": ecc[keep] + 1000,
                "ecc_uncorrected_volatile": np.zeros(k, dtype=np.int64),
                "ecc_uncorrected_aggregate": np.zeros(k, dtype=np.int64),
                "pcie_replay_count": np.zeros(k, dtype=np.int64),
            })
    store.insert_incidents(incidents)
    return incidents


def test_train_register_and_score(store):
    _plant(store)
    stages: list[str] = []
    result = train(store, horizon_h=24, seed=0, progress=stages.append,
                   params={"n_estimators": 60}, min_failures=1,
                   created_at=T0 + dt.timedelta(days=DAYS))
    json.dumps(result.metrics, allow_nan=False)
    m = result.metrics
    assert m["train_positives"] > 0 and m["test_rows"] > 0
    assert m["n_failures"] >= 2
    for key in ("pr_auc", "recall_at_budget", "false_drains_per_1000_node_days",
                "median_lead_time_h", "recall_by_mode", "ece"):
        assert key in m
    assert m["pr_auc"] is not None and m["pr_auc"] > 0.3
    assert any(s.startswith("saved m-") for s in stages)

    rec = registry.current(store)
    assert rec.model_id == result.model_id and rec.features == result.model.feature_names_in_
    assert rec.test_range[1] <= T0 + dt.timedelta(days=DAYS)

    scored = score(store)
    assert scored.model_id == result.model_id
    assert scored.node_scores.num_rows > 0
    latest = latest_node_scores(store)
    assert latest.num_rows == scored.node_scores.num_rows
    assert isinstance(json.loads(latest.column("reasons")[0].as_py()), list)


def test_too_few_failures_is_a_clear_error_and_registers_nothing(store):
    """Issue 12: a fleet's own model needs enough failures; below the bound ``train``
    says how many it saw and needs, and the registry is untouched."""
    from fleetcare.models import registry
    from fleetcare.models.training import NotEnoughFailures

    _plant(store)
    with pytest.raises(NotEnoughFailures) as err:
        train(store, horizon_h=24, seed=0, params={"n_estimators": 10}, min_failures=500)
    e = err.value
    assert 0 < e.train < 500 and e.needed == 500 and e.total >= e.train + e.cal
    assert str(e).startswith(f"{e.total} failures in this fleet's history ({e.train} in the "
                             f"training period, {e.cal} in calibration): a model of its own "
                             "needs about 500 in training")
    assert registry.list_models(store) == []


def test_training_in_chunks_gives_the_model_of_one_pass(store, monkeypatch):
    """Issue 15 §1: features are built a few scoring times at a time (memory bounded by
    the chunk, not the fleet); the chunk boundaries change nothing the model learns or
    any held-out figure."""
    from fleetcare.models import dataset

    _plant(store)
    kw = {"horizon_h": 24, "seed": 0, "params": {"n_estimators": 40}, "min_failures": 1,
          "register": False}
    whole = train(store, **kw)
    stages: list[str] = []
    monkeypatch.setattr(dataset, "CHUNK_ROWS", NODES * GPUS * 5)  # 5 scoring times a chunk
    chunked = train(store, progress=stages.append, **kw)
    assert sum(s.startswith("features 20") for s in stages) > 40  # ~13 days / 5 h
    assert chunked.model.to_bytes() == whole.model.to_bytes()
    assert chunked.metrics == whole.metrics
    assert whole.metrics["healthy_rows_sampled"] == 1.0


def test_a_fleet_above_the_row_cap_trains_on_sampled_healthy_rows(store, monkeypatch):
    """Above ``MAX_FIT_ROWS`` healthy rows are sampled (weighted to the base rate), every
    positive and every row of a node with a failure ahead kept: the fit stays the same
    size however large the fleet, and the model still ranks the planted failures."""
    from fleetcare.models import dataset

    _plant(store)
    kw = {"horizon_h": 24, "seed": 0, "params": {"n_estimators": 40}, "min_failures": 1,
          "register": False}
    whole = train(store, **kw)
    monkeypatch.setattr(dataset, "MAX_FIT_ROWS", 1000)
    small = train(store, **kw)
    m, w = small.metrics, whole.metrics
    assert 0 < m["healthy_rows_sampled"] < 0.5
    assert m["train_positives"] == w["train_positives"]
    assert m["train_rows"] < 0.6 * w["train_rows"]
    assert m["test_rows"] == w["test_rows"]  # the held-out period is never sampled
    assert m["pr_auc"] is not None and m["pr_auc"] > 0.3
