"""Goodput arithmetic: the cost model, the ETTR formula and the job-level simulation."""

from __future__ import annotations

import pytest

from fleetcare.models.goodput import CostModel, GoodputError, ettr


def test_crash_cost_is_n_times_half_interval_plus_restart():
    cm = CostModel(job_gpus=1024, checkpoint_interval_h=1.0, restart_overhead_h=0.25)
    assert cm.crash_cost_gpu_h() == 1024 * 0.75 == 768.0


def test_expected_saving_and_break_even():
    cm = CostModel(job_gpus=64, checkpoint_interval_h=2.0, restart_overhead_h=0.5, drain_cost_gpu_h=24.0)
    assert cm.crash_cost_gpu_h() == 96.0
    assert cm.expected_saving_gpu_h(0.5) == 48.0
    assert cm.break_even_risk() == 0.25
    assert cm.should_drain(0.3) is True
    assert cm.should_drain(0.25) is False  # equal is not "exceeds"
    assert cm.should_drain(0.2) is False


def test_break_even_capped_at_one_for_small_jobs():
    cm = CostModel(job_gpus=8, checkpoint_interval_h=1.0, restart_overhead_h=0.25, drain_cost_gpu_h=24.0)
    assert cm.crash_cost_gpu_h() == 6.0
    assert cm.break_even_risk() == 1.0
    assert cm.should_drain(1.0) is False


@pytest.mark.parametrize("kwargs, name", [
    ({"job_gpus": 0}, "job_gpus"),
    ({"job_gpus": 1.5}, "job_gpus"),
    ({"checkpoint_interval_h": 0.0}, "checkpoint_interval_h"),
    ({"restart_overhead_h": -1.0}, "restart_overhead_h"),
    ({"drain_cost_gpu_h": float("nan")}, "drain_cost_gpu_h"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
])
def test_cost_model_rejects_bad_arguments(kwargs, name):
    with pytest.raises(GoodputError, match=name) as info:
        CostModel(**kwargs)
    assert info.value.name == name


def test_risk_must_be_a_probability():
    with pytest.raises(GoodputError, match=r"risk=1\.5 is invalid"):
        CostModel().should_drain(1.5)


def test_ettr_exact():
    # 1024 GPUs = 128 nodes; r_f = 1/1000 per node-hour; u0 + Δ/2 = 0.75 h
    # (1 - 128 * 0.001 * 0.75) / (1 + 0.1 / 1.0) = 0.904 / 1.1
    assert ettr(1024, 0.001, 0.25, 1.0, 0.1) == pytest.approx(0.904 / 1.1, abs=1e-12)
    assert ettr(8, 0.0, 0.25, 1.0, 0.0) == 1.0
    assert ettr(12, 0.0, 0.0, 2.0, 1.0, gpus_per_node=8) == pytest.approx(2 / 3)


def test_ettr_clipped_at_zero():
    assert ettr(16384, 0.1, 0.25, 1.0, 0.1) == 0.0


def test_ettr_rejects_bad_arguments():
    with pytest.raises(GoodputError, match="checkpoint_interval_h"):
        ettr(1024, 0.001, 0.25, 0.0, 0.1)
    with pytest.raises(GoodputError, match="failures_per_node_h"):
        ettr(1024, -0.001, 0.25, 1.0, 0.1)
