"""Labels: failure incidents within (ts, ts + H]."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from fleetcare.collectors.contract import Incident, XidEvent
from fleetcare.pipeline import labels
from fleetcare.pipeline.store import Store

T = dt.datetime(2025, 3, 1, 12)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "l.duckdb") as s:
        yield s


def keys(*rows) -> pa.Table:
    return pa.table({
        "ts": pa.array([r[0] for r in rows], pa.timestamp("us")),
        "node": [r[1] for r in rows], "gpu_uuid": [r[2] for r in rows],
    })


def fail(hours: float, node: str = "n1", gpu: str | None = "G0", kind: str = "failure",
         mode: str = "hbm") -> Incident:
    return Incident(ts=(T + dt.timedelta(hours=hours)).replace(tzinfo=dt.UTC), node=node,
                    kind=kind, cause="gpu_hbm3_memory", source="sim", gpu_uuid=gpu,
                    mode=mode)


def test_failure_within_horizon_is_positive(store):
    store.insert_incidents([fail(10)])
    out = labels.attach_labels(store, keys((T, "n1", "G0"), (T, "n1", "G1"),
                                           (T, "n2", "G9")), horizon_h=24).to_pylist()
    assert [(r["label"], r["node_label"]) for r in out] == [
        (True, True), (False, True), (False, False)]
    assert out[0]["failure_ts"] == T + dt.timedelta(hours=10)
    assert out[0]["failure_mode"] == "hbm"
    assert out[0]["failure_cause"] == "gpu_hbm3_memory"
    assert out[2]["failure_ts"] is None


def test_failure_after_horizon_is_negative(store):
    store.insert_incidents([fail(30)])
    out = labels.attach_labels(store, keys((T, "n1", "G0")), horizon_h=24).to_pylist()
    assert (out[0]["label"], out[0]["node_label"]) == (False, False)


def test_window_is_open_at_ts_and_closed_at_horizon(store):
    store.insert_incidents([fail(0), fail(24, gpu="G1")])
    out = labels.attach_labels(store, keys((T, "n1", "G0"), (T, "n1", "G1"))).to_pylist()
    assert [r["label"] for r in out] == [False, True]


def test_only_failures_count_and_xids_never_label(store):
    store.insert_incidents([fail(2, kind="repair"), fail(3, kind="rma")])
    store.insert_events([XidEvent(ts=(T + dt.timedelta(hours=1)).replace(tzinfo=dt.UTC),
                                  node="n1", xid=79, message="off the bus", source="sim",
                                  gpu_uuid="G0")])
    out = labels.attach_labels(store, keys((T, "n1", "G0"))).to_pylist()
    assert (out[0]["label"], out[0]["node_label"]) == (False, False)


def test_first_failure_wins_and_keys_keep_their_columns_and_order(store):
    store.insert_incidents([fail(5, gpu=None, mode="none"), fail(8, mode="thermal")])
    k = keys((T + dt.timedelta(hours=6), "n1", "G0"), (T, "n1", "G0")).append_column(
        "x", pa.array([1.5, 2.5]))
    out = labels.attach_labels(store, k).to_pylist()
    assert [r["x"] for r in out] == [1.5, 2.5]
    assert out[0]["failure_mode"] == "thermal" and out[0]["label"]
    assert out[1]["failure_mode"] == "none" and out[1]["label"]


def test_failures_lists_the_range(store):
    store.insert_incidents([fail(1), fail(2, kind="repair"), fail(50)])
    out = labels.failures(store, T, T + dt.timedelta(hours=48)).to_pylist()
    assert [(r["node"], r["gpu_uuid"], r["mode"]) for r in out] == [("n1", "G0", "hbm")]
