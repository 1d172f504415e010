"""The simulator's incident process: calibration against Llama 3 Table 5, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetcare.collectors.contract import CAUSES
from fleetcare.collectors.sim import (
    CAUSE_NAMES,
    MODES,
    FleetSpec,
    simulate_incidents,
    summarize,
)


@pytest.fixture(scope="module", params=[0, 1, 2])
def llama_run(request):
    return simulate_incidents(FleetSpec(nodes=2048, seed=request.param), days=54)


def test_total_and_gpu_share_match_llama3(llama_run):
    s = summarize(llama_run)
    assert s["nodes"] == 2048 and s["gpus"] == 16384 and s["days"] == 54
    total = s["incidents"]["total"]
    assert 419 * 0.85 <= total <= 419 * 1.15
    assert abs(s["incidents"]["gpu_caused"] / total - 268 / 419) <= 0.05
    assert sum(s["incidents"]["by_cause"].values()) == total
    assert set(s["incidents"]["by_cause"]) == set(CAUSES)


@pytest.mark.parametrize("cause", ["gpu_hbm3_memory", "faulty_gpu", "network_switch_cable"])
def test_big_causes_within_poisson_bounds(llama_run, cause):
    expected = CAUSES[cause][0]
    got = summarize(llama_run)["incidents"]["by_cause"][cause]
    assert abs(got - expected) <= 4 * math.sqrt(expected) + 2


def test_lemons_fail_more_and_repeat(llama_run):
    per_node = np.bincount(llama_run.node, minlength=2048)
    assert llama_run.lemon.sum() == round(0.012 * 2048)
    assert per_node[llama_run.lemon].mean() > 5 * per_node[~llama_run.lemon].mean()
    assert (per_node[llama_run.lemon] >= 2).mean() > 0.4


def test_modes_xids_and_leads_follow_the_cause(llama_run):
    p = llama_run
    for i in range(len(p)):
        cause, mode, xid = CAUSE_NAMES[p.cause[i]], MODES[p.mode[i]], int(p.xid[i])
        if not CAUSES[cause][1]:
            assert (mode, xid, p.gpu[i], p.lead_h[i]) == ("none", -1, -1, 0.0)
            continue
        assert 0 <= p.gpu[i] < 8
        if cause == "silent_data_corruption":
            assert (mode, xid) == ("none", -1)
        expected = {"hbm": {48, 64, 94, 95}, "sram": {48, 94, 95}, "gsp": {119, 120},
                    "thermal": {79}, "nvlink": {74}, "pcie": {79}}.get(mode)
        if expected is not None:
            assert xid in expected and p.lead_h[i] > 0
    assert np.all(np.diff(p.time_h) >= 0)
    assert p.time_h.max() < 54 * 24


def test_a_node_does_not_fail_while_down(llama_run):
    p = llama_run
    for n in np.unique(p.node):
        idx = np.flatnonzero(p.node == n)
        assert np.all(p.time_h[idx][1:] >= (p.time_h + p.repair_h)[idx][:-1])


def test_decoys_are_on_gpus_that_never_fail(llama_run):
    p = llama_run
    failed = set(zip(p.node[p.gpu >= 0].tolist(), p.gpu[p.gpu >= 0].tolist(), strict=True))
    assert 50 < len(p.decoy_time_h) < 300
    assert not failed & set(zip(p.decoy_node.tolist(), p.decoy_gpu.tolist(), strict=True))


def test_same_seed_same_plan_other_seed_other_plan():
    a = simulate_incidents(FleetSpec(nodes=256, seed=7, failure_scale=4), 20)
    b = simulate_incidents(FleetSpec(nodes=256, seed=7, failure_scale=4), 20)
    c = simulate_incidents(FleetSpec(nodes=256, seed=8, failure_scale=4), 20)
    assert a.incidents() == b.incidents()
    assert a.incidents() != c.incidents()


def test_failure_scale_multiplies_the_rate():
    base = sum(len(simulate_incidents(FleetSpec(nodes=2048, seed=s), 54)) for s in range(3))
    double = sum(
        len(simulate_incidents(FleetSpec(nodes=2048, seed=s, failure_scale=2), 54))
        for s in range(3)
    )
    assert 1.75 < double / base < 2.25


def test_incident_records():
    plan = simulate_incidents(FleetSpec(nodes=64, seed=3, failure_scale=20), 10)
    recs = plan.incidents()
    fails = [r for r in recs if r.kind == "failure"]
    assert len(fails) == len(plan)
    assert all(r.source == "sim" and r.ts.tzinfo is not None for r in recs)
    assert [r.ts for r in recs] == sorted(r.ts for r in recs)
    assert {r.kind for r in recs} == {"failure", "repair"}
    gpu_fail = next(r for r in fails if r.gpu_uuid is not None)
    assert gpu_fail.gpu_uuid.startswith("GPU-") and len(gpu_fail.gpu_uuid) == 40


def test_simulation_is_fast():
    import time

    t = time.perf_counter()
    simulate_incidents(FleetSpec(nodes=2048, seed=0), 54)
    assert time.perf_counter() - t < 0.5


@pytest.fixture(scope="module", params=[0, 1, 2])
def repeats_run(request):
    from fleetcare.collectors.sim.incidents import TRACE_REPEATS

    return simulate_incidents(FleetSpec(nodes=2048, seed=request.param, **TRACE_REPEATS),
                              days=54)


def test_repeats_keep_table5_totals(repeats_run):
    s = summarize(repeats_run)
    total = s["incidents"]["total"]
    assert 419 * 0.85 <= total <= 419 * 1.15
    assert abs(s["incidents"]["gpu_caused"] / total - 268 / 419) <= 0.05
    for cause in ("gpu_hbm3_memory", "faulty_gpu", "network_switch_cable"):
        expected = CAUSES[cause][0]
        assert abs(s["incidents"]["by_cause"][cause] - expected) <= 4 * math.sqrt(expected) + 2


def _repeat_7d(plan) -> float:
    """Share of failures followed by another of the same node within 7 days."""
    nxt = {}
    hits = 0
    for i in range(len(plan) - 1, -1, -1):
        n, t = int(plan.node[i]), float(plan.time_h[i])
        hits += n in nxt and nxt[n] - t <= 7 * 24
        nxt[n] = t
    return hits / len(plan)


def test_repeats_make_failures_repeat(repeats_run):
    default = simulate_incidents(FleetSpec(nodes=2048, seed=repeats_run.spec.seed), days=54)
    assert _repeat_7d(repeats_run) > 3 * _repeat_7d(default)
    down = repeats_run.time_h + repeats_run.repair_h   # still never fails while down
    for node in np.unique(repeats_run.node):
        idx = np.flatnonzero(repeats_run.node == node)
        assert (repeats_run.time_h[idx][1:] >= down[idx][:-1]).all()


def test_repeats_are_opt_in_and_checked():
    assert FleetSpec(nodes=4).repeat_branching == 0.0
    a = simulate_incidents(FleetSpec(nodes=64, seed=3, repeat_branching=0.3), 30)
    b = simulate_incidents(FleetSpec(nodes=64, seed=3, repeat_branching=0.3), 30)
    assert np.array_equal(a.time_h, b.time_h) and np.array_equal(a.cause, b.cause)
    with pytest.raises(ValueError, match="repeat_branching must be in"):
        FleetSpec(nodes=4, repeat_branching=1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trace_faults_keep_table5_totals_with_the_trace_repair_times(seed):
    """Repairs as long as the real trace's (median 35 h, p90 ~530 h) leave nodes fewer
    days to fail in; the uptime rate is raised so Table 5's totals still hold."""
    from fleetcare.collectors.sim.incidents import TRACE_FAULTS

    plan = simulate_incidents(FleetSpec(nodes=2048, seed=seed, **TRACE_FAULTS), days=54)
    total = summarize(plan)["incidents"]["total"]
    assert 419 * 0.85 <= total <= 419 * 1.15
    default = simulate_incidents(FleetSpec(nodes=2048, seed=seed), days=54)
    assert np.median(plan.repair_h) > 2 * np.median(default.repair_h)
    assert np.quantile(plan.repair_h, 0.9) > 5 * np.quantile(default.repair_h, 0.9)


def test_repair_knobs_are_opt_in_and_checked():
    from fleetcare.collectors.sim.incidents import CAUSE_NAMES, _downtime_factor

    counts = np.array([CAUSES[c][0] for c in CAUSE_NAMES], dtype=float)
    rate = np.array([0.004, 0.05])  # failures per node-day: a node, a lemon
    default = _downtime_factor(FleetSpec(nodes=4), counts, rate, 54)
    assert (default == 1.0).all()  # the default knobs' draws are unchanged
    longer = _downtime_factor(FleetSpec(nodes=4, repair_scale=3.0, repair_sigma=2.0),
                              counts, rate, 54)
    assert 1.0 < longer[0] < longer[1]  # a lemon, down more often, more so
    with pytest.raises(ValueError, match="repair_scale must be > 0"):
        FleetSpec(nodes=4, repair_scale=0)
    with pytest.raises(ValueError, match="repairs would keep nodes down"):
        simulate_incidents(FleetSpec(nodes=4, failure_scale=50, repair_scale=50.0,
                                     repair_sigma=3.0), 30)


def test_default_repairs_take_any_failure_scale():
    """The repair correction is off at the default knobs: a fleet failing 40x as often
    (nodes down much of the time) simulates as before."""
    assert len(simulate_incidents(FleetSpec(nodes=64, seed=7, failure_scale=40), 7)) > 0
