"""DrainController rules with an in-memory drainer: review, escalation, clearing,
health checks, stale scores, refusals logged once. The real schedulers are in
test_drains_slurm.py and test_drains_kubernetes.py."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest

from fleetcare.api.drains import (
    BreakerPolicy,
    ControllerError,
    DrainController,
    DrainerError,
    DrainPolicy,
    NodeState,
    drain_reason,
)
from fleetcare.api.drains.audit import AuditLog
from fleetcare.models.goodput import CostModel
from fleetcare.models.scoring import ensure_schema
from fleetcare.pipeline.store import Store

T = dt.datetime(2026, 11, 29, 12, 0)
COST = CostModel()  # break-even risk 24 / 768 = 0.03125


class FakeDrainer:
    name = "fake"

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = {n: NodeState(n, "idle") for n in nodes}
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()

    def state(self, node: str) -> NodeState:
        return self.nodes.get(node, NodeState(node, "unknown"))

    def drain(self, node: str, reason: str) -> None:
        if node in self.fail:
            raise DrainerError(node, f"scontrol update NodeName={node} failed (exit 1): boom")
        self.calls.append(("drain", node))
        self.nodes[node] = NodeState(node, "drained", reason, "IDLE+DRAIN")

    def resume(self, node: str, reason: str) -> None:
        self.calls.append(("resume", node))
        self.nodes[node] = NodeState(node, "idle")


def put_scores(store: Store, ts: dt.datetime, risks: dict[str, float]) -> None:
    ensure_schema(store)
    for node, risk in risks.items():
        store.cursor().execute("INSERT INTO node_scores VALUES (?, ?, ?, ?, ?, ?)",
                               [ts, node, risk, json.dumps(["GPU 3: HBM errors 40x the fleet"]),
                                f"GPU-{node}", "m1"])


@pytest.fixture
def store(tmp_path: object) -> Iterator[Store]:
    s = Store(f"{tmp_path}/fleet.duckdb")
    yield s
    s.close()


NODES = [f"n{i:02d}" for i in range(20)]


def controller(store: Store, drainer: FakeDrainer, **kw: object) -> DrainController:
    kw.setdefault("dry_run", False)
    return DrainController(store, drainer, COST, **kw)  # type: ignore[arg-type]


def test_reason_is_one_clean_line_starting_with_fleetcare() -> None:
    r = drain_reason(0.834, ['GPU 3: "HBM" errors\nrising', "GPU 1: PCIe replays", "third"])
    assert r == "fleetcare: risk 0.83, GPU 3: HBM errors rising; GPU 1: PCIe replays"
    assert len(drain_reason(0.5, ["x" * 500])) == 200


def test_drains_above_break_even_and_logs_it(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n03": 0.5})
    d = FakeDrainer(NODES)
    report = controller(store, d).run_once(T)
    assert report.by_action("drain") == ["n03"]
    assert d.calls == [("drain", "n03")]
    row = AuditLog(store).rows()[0]
    assert (row.node, row.action, row.actor, row.result, row.dry_run) == (
        "n03", "drain", "fleetcare", "ok", False)
    assert row.reason == "fleetcare: risk 0.50, GPU 3: HBM errors 40x the fleet"
    assert report.decisions[0].saving_gpu_h == pytest.approx(0.5 * 768)


def test_breaker_limit_is_the_smaller_of_count_and_fraction() -> None:
    p = BreakerPolicy()
    assert [p.limit(n) for n in (4, 20, 100, 1000)] == [1, 1, 5, 10]
    assert BreakerPolicy(max_nodes=0).limit(1000) == 0


def test_refusals_are_logged_once_not_every_run(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9, "n02": 0.8, "n03": 0.7})
    d = FakeDrainer(NODES)
    ctl = controller(store, d, breaker=BreakerPolicy(max_nodes=1))
    r1 = ctl.run_once(T)
    assert (r1.by_action("drain"), r1.by_action("refuse")) == (["n01"], ["n02", "n03"])
    ctl.run_once(T + dt.timedelta(minutes=5))
    assert [(r.node, r.action) for r in AuditLog(store).rows()] == [
        ("n03", "refuse"), ("n02", "refuse"), ("n01", "drain")]


def test_stale_scores_drain_nothing(store: Store) -> None:
    put_scores(store, T, {"n01": 0.9})
    d = FakeDrainer(NODES)
    r = controller(store, d).run_once(T + dt.timedelta(hours=3))
    assert r.by_action("refuse") == ["n01"] and d.calls == []
    assert "older than 2:00:00" in r.decisions[0].result


def test_a_scheduler_error_is_audited_and_the_round_goes_on(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9, "n02": 0.8})
    d = FakeDrainer(NODES)
    d.fail.add("n01")
    r = controller(store, d).run_once(T)
    assert [(x.node, x.result[:6]) for x in r.decisions] == [("n01", "error:"), ("n02", "ok")]


def test_resume_needs_low_risk_and_a_clearance(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    ctl = controller(store, d)
    ctl.run_once(T)
    put_scores(store, T + dt.timedelta(hours=1), {n: 0.001 for n in NODES})
    r = ctl.run_once(T + dt.timedelta(hours=1))
    assert r.by_action("hold") == ["n01"] and d.nodes["n01"].state == "drained"
    out = ctl.clear("n01", actor="alice", note="reseated GPU 3", now=T + dt.timedelta(hours=1))
    assert [(x.action, x.actor, x.result) for x in out] == [
        ("clear", "alice", "ok"), ("resume", "alice", "ok")]
    assert d.nodes["n01"].state == "idle"
    assert AuditLog(store).active() == {}
    with pytest.raises(ControllerError, match="not drained by fleetcare"):
        ctl.clear("n01", actor="alice")


def test_cleared_but_still_risky_waits_unless_forced(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    ctl = controller(store, d)
    ctl.run_once(T)
    out = ctl.clear("n01", actor="bob", now=T)
    assert out[-1].action == "hold" and "not below" in out[-1].reason
    out = ctl.clear("n01", actor="bob", force=True, now=T)
    assert (out[-1].action, out[-1].actor, out[-1].result) == ("resume", "bob (force)", "ok")


def test_health_check_clears(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    ok: set[str] = set()
    ctl = controller(store, d, health_check=lambda n: n in ok)
    ctl.run_once(T)
    put_scores(store, T + dt.timedelta(hours=1), {n: 0.001 for n in NODES})
    assert ctl.run_once(T + dt.timedelta(hours=1)).by_action("hold") == ["n01"]
    ok.add("n01")
    r = ctl.run_once(T + dt.timedelta(hours=2))
    assert [(x.action, x.actor) for x in r.decisions] == [("resume", "health-check")]


def test_a_forgotten_drain_escalates_at_review_time_and_again_later(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    paged: list[str] = []
    ctl = controller(store, d, on_escalate=lambda dec: paged.append(dec.node),
                     policy=DrainPolicy(max_score_age=dt.timedelta(days=9)))
    ctl.run_once(T)
    assert ctl.run_once(T + dt.timedelta(hours=23)).by_action("escalate") == []
    r = ctl.run_once(T + dt.timedelta(hours=24))
    assert r.by_action("escalate") == ["n01"] and paged == ["n01"]
    assert "fleetcare drain clear n01" in r.decisions[0].reason
    assert ctl.run_once(T + dt.timedelta(hours=30)).by_action("escalate") == []
    assert ctl.run_once(T + dt.timedelta(hours=48)).by_action("escalate") == ["n01"]
    assert d.nodes["n01"].state == "drained"


def test_review_can_resume_when_risk_fell(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    ctl = controller(store, d, policy=DrainPolicy(on_review="resume-if-low"))
    ctl.run_once(T)
    put_scores(store, T + dt.timedelta(hours=24), {n: 0.001 for n in NODES})
    r = ctl.run_once(T + dt.timedelta(hours=24))
    assert [(x.action, x.actor) for x in r.decisions] == [("resume", "fleetcare:review")]


def test_a_drain_undone_or_taken_over_elsewhere_is_forgotten_never_resumed(
        store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9, "n02": 0.8})
    d = FakeDrainer(NODES)
    ctl = controller(store, d, breaker=BreakerPolicy(max_fraction=0.1))
    assert ctl.run_once(T).by_action("drain") == ["n01", "n02"]
    d.nodes["n01"] = NodeState("n01", "idle")  # an operator resumed it
    d.nodes["n02"] = NodeState("n02", "drained", "RMA ticket 4711", "IDLE+DRAIN")
    put_scores(store, T + dt.timedelta(minutes=5), {n: 0.001 for n in NODES})
    r = ctl.run_once(T + dt.timedelta(minutes=5))
    assert sorted(r.by_action("forget")) == ["n01", "n02"]
    assert ("resume", "n02") not in d.calls and AuditLog(store).active() == {}


def test_nodes_already_drained_or_down_are_skipped(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9, "n02": 0.9})
    d = FakeDrainer(NODES)
    d.nodes["n01"] = NodeState("n01", "down", "Not responding", "DOWN*")
    d.nodes["n02"] = NodeState("n02", "draining", "bad fan", "MIXED+DRAIN")
    r = controller(store, d).run_once(T)
    assert r.by_action("skip") == ["n01", "n02"] and d.calls == []
    assert "refused: node is draining in the scheduler (MIXED+DRAIN), reason: bad fan" in [
        x.result for x in r.decisions]


def test_dry_run_changes_nothing_but_audits(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n01": 0.9})
    d = FakeDrainer(NODES)
    r = controller(store, d, dry_run=True).run_once(T)
    assert [(x.action, x.result) for x in r.decisions] == [("drain", "dry-run")]
    assert d.calls == [] and AuditLog(store).active() == {}
    assert AuditLog(store).rows()[0].dry_run is True
    # dry-run drains do not use the breaker's budget
    assert controller(store, d).run_once(T).by_action("drain") == ["n01"]


def put_incidents(store: Store, rows: list[tuple[float, str, str, str | None]]) -> None:
    from fleetcare.collectors.contract import Incident

    store.insert_incidents([
        Incident(ts=(T + dt.timedelta(days=d)).replace(tzinfo=dt.UTC), node=n, kind=k,
                 cause="faulty_gpu" if k == "failure" else "repair", source="test",
                 gpu_uuid=g) for d, n, k, g in rows])


def test_a_repeat_offender_is_drained_with_the_suggestion_in_its_reason(store: Store) -> None:
    put_scores(store, T, {n: 0.001 for n in NODES} | {"n03": 0.5, "n04": 0.5})
    put_incidents(store, [(-20, "n03", "failure", "GPU-a"), (-19, "n03", "repair", None),
                          (-5, "n03", "failure", "GPU-b"), (-60, "n04", "failure", None),
                          (-5, "n04", "failure", None)])
    report = controller(store, FakeDrainer(NODES)).run_once(T)
    assert report.by_action("drain") == ["n03"]
    assert report.by_action("refuse") == ["n04"]  # the breaker: one drain an hour
    d03, d04 = report.decisions
    assert d03.repeat_offender is not None and d04.repeat_offender is None
    assert d03.reason == ("fleetcare: risk 0.50, repeat offender (2 failures in 30 d): "
                          "burn-in before large jobs; GPU 3: HBM errors 40x the fleet")
    j = d03.to_json()
    assert j["repeat_offender"]["suggestion"] == "burn-in before large jobs"
    assert j["repeat_offender"]["failures"] == 2 and j["post_repair_risk"] is None
    assert d04.to_json()["repeat_offender"] is None
    assert [r.reason for r in AuditLog(store).rows() if r.node == "n03"] == [d03.reason]


def test_a_repeat_offender_back_from_repair_is_decided_on_its_post_repair_risk(
        store: Store) -> None:
    cost = CostModel(job_gpus=256)  # break-even 24 / 192 = 0.125
    put_scores(store, T, {n: 0.001 for n in NODES})
    put_incidents(store, [(-20, "n05", "failure", "GPU-x"), (-19, "n05", "repair", None),
                          (-4, "n05", "failure", "GPU-x"), (-2, "n05", "repair", None)])
    dc = DrainController(store, FakeDrainer(NODES), cost, dry_run=True,  # type: ignore[arg-type]
                         policy=DrainPolicy(risk_horizon_h=24.0 * 7))
    report = dc.run_once(T)
    assert report.by_action("drain") == ["n05"]
    d = report.decisions[0]
    o = d.repeat_offender
    assert o is not None and o.suggestion == "RMA / replace the GPU" and o.risk_7d
    assert d.risk == 0.001 and d.post_repair_risk == pytest.approx(o.risk_7d)
    assert o.risk_7d > 0.125  # 0.158 with the shipped model
    assert d.saving_gpu_h == pytest.approx(o.risk_7d * 192)
    assert "post-repair risk" in d.reason
    # over a 24 h horizon the same recurrence risk is below break-even: not drained
    dc24 = DrainController(store, FakeDrainer(NODES), cost, dry_run=True)  # type: ignore[arg-type]
    assert dc24.run_once(T).by_action("drain") == []
    # repaired longer ago than post_repair_days: the model's risk alone decides
    dc_old = DrainController(store, FakeDrainer(NODES), cost, dry_run=True,  # type: ignore[arg-type]
                             policy=DrainPolicy(risk_horizon_h=168.0, post_repair_days=1.0))
    assert dc_old.run_once(T).by_action("drain") == []


def test_post_repair_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="post_repair_days=-1 is invalid"):
        DrainPolicy(post_repair_days=-1)
    with pytest.raises(ValueError, match="risk_horizon_h=0 is invalid"):
        DrainPolicy(risk_horizon_h=0)
