"""Evaluation orchestration: the same failures and node-days for every method."""

from __future__ import annotations

import numpy as np
import pytest

from fleetcare.models import evaluation as E
from fleetcare.models.goodput import CostModel


def test_failures_of_are_distinct_node_failures_with_modes(timeline):
    mask = np.ones(timeline.num_rows, dtype=bool)
    fails = E.failures_of(timeline, mask)
    assert len(fails) == len({(f.node, f.ts) for f in fails}) > 0
    assert {f.mode for f in fails} <= {"hbm", "thermal"}
    assert fails == sorted(fails, key=lambda f: (f.node, f.ts))


def test_node_scores_take_the_node_risk_and_label(timeline):
    mask = np.zeros(timeline.num_rows, dtype=bool)
    mask[:4] = True  # node-000, 2 hours x 2 GPUs
    s = E.node_scores(timeline, mask, np.array([0.5, 0.5, 0.0, 0.2]))
    assert s.node.tolist() == ["node-000", "node-000"]
    assert s.risk.tolist() == pytest.approx([0.75, 0.2])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from fleetcare.api.cli import main
    from fleetcare.pipeline.store import Store

    db = str(tmp_path_factory.mktemp("eval") / "fleet.duckdb")
    assert main(["simulate", "--nodes", "24", "--days", "12", "--seed", "5",
                 "--failure-scale", "20", "--interval", "10m", "--db", db]) == 0
    store = Store(db)
    try:
        yield E.evaluate_store(store, E.EvalConfig(cost=CostModel(drain_cost_gpu_h=24.0)))
    finally:
        store.close()


def test_every_method_is_measured_on_the_same_failures(report):
    n = report["test_period"]["failures"]
    assert report["model"]["n_failures"] == n
    for name in ("reactive_xid", "dcgm_thresholds", "logistic"):
        assert report["baselines"][name]["n_failures"] == n
    modes = set(report["model"]["recall_by_mode"])
    assert set(report["baselines"]["logistic"]["recall_by_mode"]) == modes


def test_goodput_is_consistent(report):
    g = report["goodput"]
    base = g["no_action"]
    assert base["interruptions_avoided"] == 0 and base["false_drains"] == 0
    for k in ("reactive_xid", "dcgm_thresholds", "fleetcare"):
        assert g[k]["failures"] == base["failures"]
        assert g[k]["interruptions"] + g[k]["interruptions_avoided"] == base["failures"]
        assert g[k]["gpu_hours_lost"] == pytest.approx(
            g[k]["crash_gpu_hours"] + g[k]["drain_gpu_hours"])
        assert 0.0 <= g[k]["ettr"] <= 1.0
    # the threshold was chosen on calibration: at least as good there as never draining
    assert g["fleetcare"]["threshold_kind"].startswith("expected saving")
    assert E.public(report).keys() == report.keys() - {"_curves"}


def test_the_test_period_runs_to_the_end_of_the_data(report):
    """Alarms use every test row up to the last telemetry, not only rows with a known
    label: a failure in the last H of the data can be seen coming."""
    tp = report["test_period"]
    assert (tp["horizon_h"], tp["window_h"]) == (24.0, 72.0)
    assert report["model"]["window_h"] == 72.0
    end = np.datetime64(tp["end"])
    last_ts = report["_curves"]["alarm_rows_end"]
    assert last_ts + np.timedelta64(3600, "s") == end
    assert report["_curves"]["labeled_rows_end"] + np.timedelta64(24, "h") <= end


def test_a_fleet_in_shards_is_trained_and_measured_as_one(tmp_path):
    """Two stores over the same time, node names colliding: every figure covers both."""
    from fleetcare.api.cli import main
    from fleetcare.pipeline.store import Store

    dbs = []
    for seed in (7, 8):
        db = str(tmp_path / f"shard{seed}.duckdb")
        assert main(["simulate", "--nodes", "12", "--days", "10", "--seed", str(seed),
                     "--failure-scale", "20", "--interval", "10m", "--db", db]) == 0
        dbs.append(db)
    stores = [Store(d) for d in dbs]
    try:
        cfg = E.EvalConfig()
        singles = [E.load_fleet(st, cfg) for st in stores]
        tests = [f.test_rows({}) for f in singles]
        for f, t in zip(singles, tests, strict=True):
            # the passes read 11 h before their periods (the rule's lags), keep none of it
            assert E._ts(t.keys).min() == E._np(f.test_from)
            spill = f.fit.cal_all
            assert spill is not None
            cal_start = E._np(f.splits.cal_start)
            assert min(E._ts(x).min() for x in spill.tables()) < cal_start
            _, cal_keys = E._cal_scores([f], lambda x: np.zeros(x.num_rows))
            assert cal_start <= E._ts(cal_keys).min() < cal_start + np.timedelta64(1, "h")
        report = E.evaluate_store(stores, cfg)
    finally:
        for st in stores:
            st.close()
    s = report["_curves"]["node_scores"]
    assert {n.split("/")[0] for n in s.node} == {"0", "1"}  # node-00003 of each kept apart
    assert len({n for n in s.node}) == 24
    expected = sum(len(E.failures_of(t.keys)) for t in tests)
    assert report["test_period"]["failures"] == expected > 0
    assert report["test_period"]["shards"] == 2
    rows = sum(t.num_rows for t in tests) // 8  # node-hours (8 GPUs a node)
    assert report["test_period"]["node_days"] == pytest.approx(rows / 24, abs=0.01)
    assert report["goodput"]["no_action"]["failures"] == expected
