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


def test_a_repaired_repeat_offender_is_decided_on_the_higher_post_repair_risk():
    cm = CostModel(job_gpus=128, checkpoint_interval_h=1.0, restart_overhead_h=0.25,
                   drain_cost_gpu_h=24.0)  # crash 96 GPU-h, break-even 0.25
    assert cm.decision_risk(0.1, 0.3) == 0.3 and cm.decision_risk(0.4, 0.3) == 0.4
    assert cm.decision_risk(0.1) == 0.1
    assert cm.should_drain(0.1) is False
    assert cm.should_drain(0.1, post_repair_risk=0.3) is True
    assert cm.should_drain(0.1, post_repair_risk=0.2) is False
    with pytest.raises(GoodputError, match=r"post_repair_risk=2 is invalid"):
        cm.should_drain(0.1, post_repair_risk=2)


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


# -- job-level simulation --------------------------------------------------------------------
import numpy as np  # noqa: E402

from fleetcare.models import goodput_sim as G  # noqa: E402
from fleetcare.models.metrics import Failure  # noqa: E402

T0 = np.datetime64("2026-01-01T00:00:00", "us")
HOUR = np.timedelta64(3600, "s")


def one_job(gpus=1024, phase=0.0):
    return [G.Job(0, gpus, ("node-a",), gpus // 8, phase)]


def test_pack_jobs_cycles_sizes_and_cuts_jobs():
    jobs = G.pack_jobs([f"n{i}" for i in range(6)], (8, 16), seed=0)
    assert [(j.gpus, j.nodes, j.nodes_needed) for j in jobs] == [
        (8, ("n0",), 1), (8, ("n2",), 1), (8, ("n4",), 1), (16, ("n1", "n3"), 2), (16, ("n5",), 2)]


def test_one_failure_without_a_drain_costs_n_times_work_since_checkpoint_plus_restart():
    cost = CostModel(job_gpus=1024, checkpoint_interval_h=1.0, restart_overhead_h=0.25)
    f = [Failure("node-a", T0 + 10 * HOUR + np.timedelta64(30, "m"), "hbm")]
    r = G.simulate_goodput(f, [], one_job(phase=0.0), cost, T0, T0 + 100 * HOUR,
                           checkpoint_write_h=0.0)
    assert r.gpu_hours_lost == 1024 * (0.5 + 0.25) == 768.0
    assert (r.interruptions, r.interruptions_avoided, r.false_drains) == (1, 0, 0)
    # ETTR: one node of a 128-node job lost 768 of 1024*100 GPU-h, scaled to 128 nodes
    assert r.ettr == pytest.approx(1 - 768 * 128 / (1024 * 100))


def test_a_drain_with_enough_lead_costs_the_drain_instead():
    cost = CostModel(job_gpus=1024, drain_cost_gpu_h=24.0)
    f = [Failure("node-a", T0 + 10 * HOUR, "hbm")]
    early = [("node-a", T0 + 4 * HOUR)]
    r = G.simulate_goodput(f, early, one_job(), cost, T0, T0 + 100 * HOUR)
    assert (r.gpu_hours_lost, r.interruptions_avoided, r.false_drains) == (24.0, 1, 0)
    late = [("node-a", T0 + 10 * HOUR - np.timedelta64(5, "m"))]  # < 15 min: too late
    r = G.simulate_goodput(f, late, one_job(), cost, T0, T0 + 100 * HOUR)
    assert r.interruptions_avoided == 0
    assert r.gpu_hours_lost == 24.0 + 1024 * 0.25  # the drain, and a crash right at a checkpoint


def test_reaction_at_the_failure_saves_nothing_and_is_not_a_false_drain():
    cost = CostModel()
    f = [Failure("node-a", T0 + 10 * HOUR, "nvlink")]
    r = G.simulate_goodput(f, [("node-a", T0 + 10 * HOUR)], one_job(), cost, T0, T0 + 100 * HOUR)
    no = G.simulate_goodput(f, [], one_job(), cost, T0, T0 + 100 * HOUR)
    assert r.gpu_hours_lost == no.gpu_hours_lost == 1024 * 0.25
    assert (r.false_drains, r.drains) == (0, 0)


def test_false_drain_costs_the_drain():
    r = G.simulate_goodput([], [("node-a", T0 + 5 * HOUR)], one_job(), CostModel(), T0,
                           T0 + 100 * HOUR)
    assert (r.gpu_hours_lost, r.false_drains) == (24.0, 1)


def test_decision_score_is_expected_saving_over_drain_cost():
    jobs = one_job(gpus=64)
    s = G.decision_score(np.array(["node-a", "other"], dtype=object), np.array([0.5, 0.5]),
                         jobs, CostModel(drain_cost_gpu_h=24.0))
    assert s.tolist() == [0.5 * 64 * 0.75 / 24.0, 0.0]


def test_optimal_threshold_picks_the_best_of_a_known_set():
    cost = CostModel(job_gpus=1024, drain_cost_gpu_h=24.0)
    ts = np.array([T0 + h * HOUR for h in (2, 5, 30)])
    node = np.array(["node-a"] * 3, dtype=object)
    score = np.array([0.5, 3.0, 0.8])  # 5h: a true warning 5 h ahead; 2h and 30h: noise
    f = [Failure("node-a", T0 + 10 * HOUR, "hbm")]
    thr, res, lost = G.choose_goodput_threshold(
        ts, node, score, f, one_job(), cost, T0, T0 + 100 * HOUR,
        candidates=[0.4, 0.7, 2.0, float("inf")])
    # 0.4: drains at 2h (avoids the failure, lead 8h) and 30h (false) -> 48
    # 0.7: drains at 5h (avoids) and 30h (false) -> 48; 2.0: only 5h -> 24; inf: crash 256
    assert lost == {0.4: 48.0, 0.7: 48.0, 2.0: 24.0, float("inf"): 1024 * 0.25}
    assert thr == 2.0 and res.interruptions_avoided == 1
