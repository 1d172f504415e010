"""Time-split training and held-out evaluation on a synthetic feature/label timeline."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa

from fleetcare.models.training import (
    Splits,
    aftermath,
    feature_columns,
    fit_and_evaluate,
    ts_column,
)

from .conftest import T0


def test_splits_by_time():
    s = Splits.of(T0, T0 + dt.timedelta(days=20))
    assert s.cal_start == T0 + dt.timedelta(days=12)
    assert s.test_start == T0 + dt.timedelta(days=15)


def test_fit_and_evaluate_on_timeline(timeline):
    assert feature_columns(timeline) == ["ecc_corrected_24h", "gpu_temp_c", "noise"]
    splits = Splits.of(T0 + dt.timedelta(days=1), T0 + dt.timedelta(days=20))
    seen = []
    model, m = fit_and_evaluate(timeline, splits, seed=0, progress=seen.append,
                                params={"n_estimators": 60})
    json.dumps(m, allow_nan=False)
    assert seen and seen[0].startswith("fitting on ")
    # no row's label window crosses a boundary; test rows only from the test period
    ts = ts_column(timeline)
    H = np.timedelta64(24, "h")
    train_end = np.datetime64(splits.cal_start.replace(tzinfo=None), "us")
    in_train = ((ts >= np.datetime64(splits.start.replace(tzinfo=None), "us"))
                & (ts + H <= train_end))
    after = aftermath(timeline)
    assert (in_train & after).any()  # failures in the training period leave an aftermath
    assert m["train_rows"] == int((in_train & ~after).sum())
    assert m["n_failures"] > 0 and m["test_positives"] > 0
    assert m["gpu_roc_auc"] > 0.8  # the signal shows 18 h ahead, labels look 24 h
    assert m["pr_auc"] > 0.5
    assert m["recall_at_budget"] is not None and m["recall_at_budget"] > 0.3
    assert m["false_drains_per_1000_node_days"] <= 1.0
    assert 0 < m["median_lead_time_h"] <= 18.5
    assert set(m["recall_by_mode"]) <= {"hbm", "thermal"}
    assert m["ece"] is not None and m["ece"] < 0.05
    assert m["calibration"] in ("isotonic", "sigmoid")
    assert model.feature_names_in_ == ["ecc_corrected_24h", "gpu_temp_c", "noise"]


def test_aftermath_rows_follow_each_failure_of_their_node():
    t0 = np.datetime64("2025-03-01T00:00", "us")
    hour = np.timedelta64(1, "h")
    ts = np.concatenate([t0 + np.arange(6) * hour] * 2)
    node = ["a"] * 6 + ["b"] * 6
    fail = t0 + 2 * hour + np.timedelta64(30, "m")  # a fails at 02:30; rows 00:00-02:00 see it
    looks = [True, True, True, False, False, False] + [False] * 6
    table = pa.table({
        "ts": pa.array(ts, pa.timestamp("us")), "node": node, "gpu_uuid": ["g"] * 12,
        "node_label": looks,
        "failure_ts": pa.array([fail if x else None for x in looks], pa.timestamp("us")),
        "failure_mode": ["hbm" if x else None for x in looks],
    })
    assert aftermath(table, 2.0).tolist() == [False, False, False, True, True, False] + [False] * 6
    assert aftermath(table, 24.0).tolist() == [False] * 3 + [True] * 3 + [False] * 6
    assert not aftermath(table, 0.0).any()


def test_same_seed_same_result(timeline):
    splits = Splits.of(T0 + dt.timedelta(days=1), T0 + dt.timedelta(days=20))
    a, ma = fit_and_evaluate(timeline, splits, seed=3, params={"n_estimators": 30})
    b, mb = fit_and_evaluate(timeline, splits, seed=3, params={"n_estimators": 30})
    assert a.to_bytes() == b.to_bytes() and ma == mb


def test_model_sees_health_signals_not_identity_or_load():
    from fleetcare.models.training import model_features, monotone_features
    from fleetcare.pipeline.feature_defs import FEATURES

    names = [f.name for f in FEATURES]
    kept = model_features(names)
    for gone in ("ecc_corrected_lifetime", "node_gpus", "hours_since_sample", "power_mean_7d",
                 "gpu_temp_mean_24h", "throttle_power_frac_1h", "pcie_gen_down_frac_6h",
                 "gpu_temp_now"):
        assert gone not in kept
    for stays in ("ecc_corrected_1h", "pcie_replay_24h_rel", "node_max_gpu_temp_resid_24h",
                  "gpu_temp_resid_1h", "gpu_temp_slope_6h", "throttle_thermal_frac_24h_rel",
                  "xid_application_7d", "gpu_failures_28d", "remapped_rows_pending_now"):
        assert stays in kept
    mono = monotone_features(kept)
    assert {"ecc_corrected_1h", "nvlink_crc_24h_rel", "node_max_pcie_replay_24h",
            "xid_memory_6h", "node_xid_bus_24h", "remapped_rows_failure_now"} <= set(mono)
    assert not {"xid_application_1h", "gpu_temp_resid_1h", "xid_memory_hours_since"} & set(mono)
