"""Repeat offenders from a real DuckDB store's incidents: the window, the suggestion, the
recurrence risk (equal to scoring the whole history), and the post-repair risk."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetcare.collectors.contract import Incident
from fleetcare.models import offenders as O
from fleetcare.models import recurrence as R

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
AT = T0 + dt.timedelta(days=60)


def inc(day: float, node: str, kind: str = "failure", cause: str = "faulty_gpu",
        gpu: str | None = None) -> Incident:
    return Incident(ts=T0 + dt.timedelta(days=day), node=node, kind=kind, cause=cause,
                    source="test", gpu_uuid=gpu)


@pytest.fixture
def fleet(store):
    store.insert_incidents([
        inc(0, "old"),  # starts the record; one failure long ago, one recent: not in window
        inc(50, "old"),
        inc(40, "twice", cause="nic"), inc(41, "twice", "repair", "nic"),
        inc(55, "twice", cause="gpu_hbm3_memory", gpu="GPU-1"),
        inc(56, "twice", "repair", "gpu_hbm3_memory"),
        inc(35, "same-gpu", gpu="GPU-9"), inc(58, "same-gpu", cause="fatal_xid", gpu="GPU-9"),
        inc(33, "thrice"), inc(45, "thrice"), inc(59, "thrice", cause="node_down"),
        inc(52, "planned", cause="planned_maintenance"), inc(57, "planned"),
        inc(61, "future"), inc(62, "future"),  # after AT: not known yet
    ])
    return store


def test_two_failures_in_30_days_make_an_offender_with_a_suggestion(fleet):
    got = {o.node: o for o in O.repeat_offenders(fleet, AT)}
    assert sorted(got) == ["same-gpu", "thrice", "twice"]
    twice = got["twice"]
    assert (twice.failures, twice.last_cause, twice.last_gpu_uuid) == (
        2, "gpu_hbm3_memory", "GPU-1")
    assert twice.last_failure_ts == T0 + dt.timedelta(days=55)
    assert twice.repaired_since and twice.repaired_at == T0 + dt.timedelta(days=56)
    assert (twice.suggestion, twice.why) == (O.BURN_IN, "failed again (2 failures in the window)")
    assert (got["same-gpu"].suggestion, got["same-gpu"].why) == (
        O.RMA_GPU, "2 failures blamed GPU GPU-9")
    assert not got["same-gpu"].repaired_since and got["same-gpu"].repaired_at is None
    assert (got["thrice"].suggestion, got["thrice"].why) == (
        O.RMA_GPU, "3 failures in the window")
    assert [o.node for o in O.repeat_offenders(fleet, AT)][0] == "thrice"  # most failures


def test_the_recurrence_risk_equals_scoring_the_whole_history(fleet):
    model = R.load()
    full = {s["node"]: s for s in R.score(R.store_history(fleet, AT), AT, model)}
    for o in O.repeat_offenders(fleet, AT, model=model):
        assert o.risk_7d == full[o.node]["risk_7d"]
        assert list(o.reasons) == full[o.node]["reasons"]
        assert o.risk_7d is not None and 0 < o.risk_7d < 1


def test_window_and_threshold_are_parameters(fleet):
    assert [o.node for o in O.repeat_offenders(fleet, AT, failures=3, use_model=False)] == [
        "thrice"]
    wide = {o.node for o in O.repeat_offenders(fleet, AT, days=61, use_model=False)}
    assert "old" in wide  # days 0 and 50: twice in 61 days, once in 30
    assert O.repeat_offenders(fleet, T0 + dt.timedelta(days=30)) == []
    with pytest.raises(ValueError, match="failures=0"):
        O.repeat_offenders(fleet, AT, failures=0)


def test_json_and_line(fleet):
    o = next(o for o in O.repeat_offenders(fleet, AT) if o.node == "twice")
    j = o.to_json()
    assert j["last_failure_ts"] == "2026-04-25T00:00:00Z"
    assert j["repaired_at"] == "2026-04-26T00:00:00Z"
    assert j["suggestion"] == O.BURN_IN and j["window_days"] == 30
    assert o.line().startswith("repeat offender: 2 failures in 30 days, recurrence risk ")
    assert o.line().endswith("suggest burn-in before large jobs (failed again (2 failures "
                             "in the window))")


def test_an_empty_store_has_no_offenders(store):
    assert O.repeat_offenders(store, AT) == []


def test_post_repair_risk_scales_at_constant_hazard():
    assert O.post_repair_risk(0.3, 168.0) == pytest.approx(0.3)
    assert O.post_repair_risk(0.3, 24.0) == pytest.approx(1 - 0.7 ** (1 / 7))
    assert O.post_repair_risk(0.0, 24.0) == 0.0
    with pytest.raises(ValueError):
        O.post_repair_risk(1.5, 24.0)


def test_post_repair_risks_only_for_offenders_back_from_repair_lately(fleet):
    found = O.repeat_offenders(fleet, AT)
    twice = next(o for o in found if o.node == "twice")
    assert O.post_repair_risks(found, AT) == {
        "twice": pytest.approx(O.post_repair_risk(twice.risk_7d, 24.0))}  # others: in repair
    assert O.post_repair_risks(found, AT, within_days=3) == {}  # repaired 4 days before AT
