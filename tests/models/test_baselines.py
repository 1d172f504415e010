"""Baselines on hand-made timelines: reactive XID rules, DCGM thresholds, logistic."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from fleetcare.collectors.contract import GpuSample
from fleetcare.models import baselines as B
from fleetcare.models.metrics import Failure, average_precision
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2026, 1, 1)
N0 = np.datetime64("2026-01-01T00:00:00", "us")
HOUR = np.timedelta64(3600, "s")


def test_fatal_xid_fires_at_its_time_and_is_a_reaction_with_lead_zero():
    t = [T0 + dt.timedelta(hours=10)]
    al = B.reactive_xid_alarms(t, ["node-a"], ["GPU-a0"], [79])
    assert al.ts.tolist() == [dt.datetime(2026, 1, 1, 10)]
    assert al.reason.tolist() == ["fatal XID 79"]
    f = [Failure("node-a", N0 + 10 * HOUR, "pcie")]
    m = B.evaluate_rule(al, f, 24.0, node_days=10.0)
    assert m["recall"] == 0.0  # fired at the failure, not before it
    assert m["median_lead_time_h"] == 0.0
    assert (m["false_drains"], m["reactions"], m["failures_reacted"]) == (0, 1, 1)
    assert m["pr_auc"] is None


def test_application_and_single_warning_xids_do_not_fire():
    t = [T0, T0 + dt.timedelta(hours=1)]
    al = B.reactive_xid_alarms(t, ["n", "n"], ["g", "g"], [13, 94])
    assert len(al.ts) == 0


def test_repeated_xids_of_a_class_within_the_window_fire_before_the_failure():
    hours = [0, 5, 20, 50]
    t = [T0 + dt.timedelta(hours=h) for h in hours]
    al = B.reactive_xid_alarms(t, ["node-a"] * 4, ["g0"] * 4, [94, 92, 63, 94],
                               repeat_count=3, repeat_window_h=24.0)
    assert al.ts.tolist() == [T0 + dt.timedelta(hours=20)]  # 3 memory XIDs in 24 h
    assert al.reason.tolist() == ["3 memory XIDs within 24 h"]
    f = [Failure("node-a", N0 + 30 * HOUR, "hbm")]
    m = B.evaluate_rule(al, f, 24.0, node_days=1000.0)
    assert (m["recall"], m["recall_at_budget"], m["median_lead_time_h"]) == (1.0, 1.0, 10.0)


def test_rule_over_budget_has_zero_recall_at_budget():
    al = B.RuleAlarms("r", np.array([N0, N0 + 100 * HOUR]), np.array(["a", "b"], dtype=object),
                      np.array(["x", "x"], dtype=object))
    f = [Failure("a", N0 + 5 * HOUR, "hbm")]
    m = B.evaluate_rule(al, f, 24.0, node_days=500.0)  # budget allows 0 false drains
    assert (m["recall"], m["false_drains"], m["recall_at_budget"]) == (1.0, 1, 0.0)
    assert m["false_drains_per_1000_node_days"] == 2.0


@pytest.fixture
def tele(tmp_path):
    with Store(tmp_path / "t.duckdb") as store:  # the real telemetry table
        yield store


def _row(store, minute, gpu="g0", node="node-a", dbe=0, replay=0, remap_fail=False, reasons=0,
         up=(True, True)):
    store.insert_sample_records([GpuSample(
        ts=T0 + dt.timedelta(minutes=minute), node=node, gpu_uuid=gpu, gpu_index=0,
        pci_bus_id="00000000:18:00.0", model="H100", ecc_uncorrected_volatile=dbe,
        remapped_rows_failure=remap_fail, remapped_rows_pending=False,
        pcie_replay_count=replay, nvlink_up=list(up), nvlink_crc_flit=[0, 0],
        nvlink_crc_data=[0, 0], nvlink_replay=[0, 0], nvlink_recovery=[0, 0],
        clock_event_reasons=reasons)])


def test_dcgm_dbe_threshold_fires_on_the_first_new_dbe(tele):
    for i, dbe in enumerate([0, 0, 1, 1, 2]):
        _row(tele, 10 * i, dbe=dbe)
    al = B.dcgm_alarms(tele, T0, T0 + dt.timedelta(hours=2))
    assert al.ts.tolist() == [T0 + dt.timedelta(minutes=20), T0 + dt.timedelta(minutes=40)]
    assert set(al.reason) == {"DBE ECC error"}


def test_dcgm_pcie_replay_rate_remap_failure_thermal_and_link(tele):
    _row(tele, 0, replay=0)
    _row(tele, 10, replay=80)  # 8/min: not above the threshold
    _row(tele, 20, replay=170, remap_fail=True)  # 9/min and a remap failure
    _row(tele, 30, replay=170, reasons=B.HW_THERMAL)
    _row(tele, 40, replay=170, up=(True, False))
    al = B.dcgm_alarms(tele, T0, T0 + dt.timedelta(hours=1))
    assert al.reason.tolist() == ["row remap failure; PCIe replay rate", "thermal violation",
                                  "NVLink down"]


def test_logistic_learns_a_planted_signal(planted):
    X, y = planted(6000, seed=1)
    m = B.LogisticBaseline().fit(X[:4000], y[:4000])
    p = m.predict_proba(X[4000:])[:, 1]
    ap = average_precision(y[4000:], p)
    assert ap is not None and ap > 0.3 > y[4000:].mean()
    coef = m.pipeline_[-1].coef_[0]
    assert abs(coef[0]) == max(abs(coef))  # feature 0 carries the signal


def test_logistic_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        B.LogisticBaseline().fit(np.zeros((5, 2)), np.zeros(5, dtype=bool))
