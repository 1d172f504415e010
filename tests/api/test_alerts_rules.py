"""The alert rule over synthetic scoring runs, with a manual clock: N minutes, hysteresis,
dedup, the resolved message, routing, restarts."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from fleetcare.api.alerts import AlertEngine, Rule, Score
from fleetcare.pipeline.store import Store
from tests.api import test_alerts_helpers as helpers
from tests.api.test_alerts_helpers import (
    T0,
    Clock,
    config,
    minutes,
    put_scores,
)

db = helpers.db  # fixture

HOOK = "http://127.0.0.1:9/hook"


def engine(store: Store, cfg: Any, clock: Clock) -> AlertEngine:
    return AlertEngine.from_config(store, cfg, clock=clock, rng=lambda: 0.5,
                                   node_labels=lambda n: {"partition": n[:3]})


def run(store: Store, eng: AlertEngine, clock: Clock, minute: float,
        risks: dict[str, float]) -> list[Any]:
    ts = T0 + minutes(minute)
    put_scores(store, ts, risks)
    return eng.evaluate(clock.at(ts + dt.timedelta(seconds=5)))


def rows(store: Store) -> list[tuple[Any, ...]]:
    return store.cursor().execute(
        "SELECT node, state, risk, started_at, fired_at, resolved_at FROM alerts "
        "ORDER BY node, started_at").fetchall()


def outbox(store: Store) -> list[tuple[Any, ...]]:
    return store.cursor().execute(
        "SELECT sink, alert_id, event FROM alert_outbox ORDER BY seq").fetchall()


def am(name: str = "am", **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "alertmanager", "url": HOOK, **kw}


def test_fires_after_n_minutes_of_consecutive_runs(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config([am()]), clock)
    for m in range(5):                                   # minutes 0..4: pending
        assert run(db, eng, clock, m, {"gpu01": 0.6, "gpu02": 0.1}) == []
        assert rows(db) == [("gpu01", "pending", 0.6, T0, None, None)]
    events = run(db, eng, clock, 5, {"gpu01": 0.7, "gpu02": 0.1})
    assert [(e.status, e.node, e.risk, e.started_at, e.fired_at) for e in events] == [
        ("firing", "gpu01", 0.7, T0, T0 + minutes(5))]
    assert rows(db) == [("gpu01", "firing", 0.7, T0, T0 + minutes(5), None)]
    assert outbox(db) == [("am", "gpu01@20260301T120000Z", "firing")]


def test_a_risk_at_the_immediate_threshold_fires_at_once(db: Store) -> None:
    """The fleet prior's operating point (issue 12): a risk held at the threshold for
    ``for``, or at once at ``immediate_threshold``."""
    clock = Clock()
    eng = engine(db, config([am()], immediate_threshold=0.9), clock)
    assert run(db, eng, clock, 0, {"gpu01": 0.6, "gpu02": 0.1}) == []   # pending
    events = run(db, eng, clock, 1, {"gpu01": 0.6, "gpu02": 0.95})     # gpu02 at once
    assert [(e.status, e.node, e.started_at, e.fired_at) for e in events] == [
        ("firing", "gpu02", T0 + minutes(1), T0 + minutes(1))]
    events = run(db, eng, clock, 2, {"gpu01": 0.92, "gpu02": 0.95})    # gpu01 reaches it
    assert [(e.status, e.node, e.started_at) for e in events] == [("firing", "gpu01", T0)]


def test_the_immediate_threshold_is_not_below_the_threshold() -> None:
    from fleetcare.collectors.config import ConfigError

    with pytest.raises(ValueError, match="at least the threshold"):
        Rule(threshold=0.5, immediate=0.4)
    with pytest.raises(ConfigError, match="immediate_threshold"):
        config(immediate_threshold=0.4)
    assert config(env={"FLEETCARE_ALERTS_IMMEDIATE_THRESHOLD": "0.93"}).immediate_threshold == 0.93


def test_a_dip_restarts_the_n_minutes(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config([am()]), clock)
    for m in range(4):
        run(db, eng, clock, m, {"gpu01": 0.6})
    run(db, eng, clock, 4, {"gpu01": 0.49})               # below threshold: pending dropped
    assert rows(db) == []
    for m in range(5, 10):
        assert run(db, eng, clock, m, {"gpu01": 0.6}) == []
    assert [e.status for e in run(db, eng, clock, 10, {"gpu01": 0.6})] == ["firing"]
    assert rows(db)[0][3] == T0 + minutes(5)               # started again at the dip's end


def test_a_node_missing_from_a_run_drops_pending_but_never_resolves(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config([am()], **{"for": "0"}), clock)
    assert [e.status for e in run(db, eng, clock, 0, {"gpu01": 0.9})] == ["firing"]
    for m in range(1, 30):                                 # gpu01 went silent
        assert run(db, eng, clock, m, {"gpu02": 0.1}) == []
    assert rows(db)[0][1] == "firing"


def test_hysteresis_and_resolved_message(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config([am()], **{"for": "0"}), clock)
    assert [e.status for e in run(db, eng, clock, 0, {"gpu01": 0.8})] == ["firing"]
    # between resolve_threshold (0.3) and threshold (0.5): still firing, no message
    for m in range(1, 10):
        assert run(db, eng, clock, m, {"gpu01": 0.4}) == []
    assert rows(db)[0][1] == "firing"
    # below 0.3 for less than resolve_for (3m), then back up: the resolve clock restarts
    run(db, eng, clock, 10, {"gpu01": 0.2})
    run(db, eng, clock, 12, {"gpu01": 0.2})
    run(db, eng, clock, 13, {"gpu01": 0.35})
    assert rows(db)[0][1] == "firing"
    for m in (14, 15, 16):
        assert run(db, eng, clock, m, {"gpu01": 0.1}) == []
    events = run(db, eng, clock, 17, {"gpu01": 0.1})
    assert [(e.status, e.risk, e.peak_risk, e.resolved_at) for e in events] == [
        ("resolved", 0.1, 0.8, T0 + minutes(17))]
    assert rows(db) == [("gpu01", "resolved", 0.1, T0, T0, T0 + minutes(17))]
    assert outbox(db) == [("am", "gpu01@20260301T120000Z", "firing"),
                          ("am", "gpu01@20260301T120000Z", "resolved")]
    # a new episode is a new alert
    assert [e.alert_id for e in run(db, eng, clock, 18, {"gpu01": 0.9})] == [
        "gpu01@20260301T121800Z"]
    assert [r[1] for r in rows(db)] == ["resolved", "firing"]


def test_dedup_one_open_alert_per_node_and_optional_renotification(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config([am()], **{"for": "0"}), clock)
    fired = [e for m in range(60) for e in run(db, eng, clock, m, {"gpu01": 0.9})]
    assert [e.status for e in fired] == ["firing"]
    assert db.cursor().execute("SELECT count(*) FROM alerts").fetchone() == (1,)

    clock2 = Clock()
    db.cursor().execute("DELETE FROM node_scores; DELETE FROM alerts; DELETE FROM alert_outbox;"
                        "DELETE FROM meta").fetchall()
    eng = engine(db, config([am()], **{"for": "0", "repeat_interval": "20m"}), clock2)
    fired = [e for m in range(61) for e in run(db, eng, clock2, m, {"gpu01": 0.9})]
    assert [(e.fired_at, e.repeat, e.event_id.rsplit(":", 1)[1]) for e in fired] == [
        (T0, False, "20260301T120000Z"), (T0, True, "20260301T122000Z"),
        (T0, True, "20260301T124000Z"), (T0, True, "20260301T130000Z")]


def test_a_sinks_own_repeat_interval_and_repeats_while_the_node_is_silent(db: Store) -> None:
    clock = Clock()
    sinks = [am("am", repeat_interval="2m"), am("once"),
             {"name": "api", "kind": "alertmanager-api", "url": "http://127.0.0.1:9"}]
    eng = engine(db, config(sinks, **{"for": "0"}), clock)
    run(db, eng, clock, 0, {"gpu01": 0.9})
    run(db, eng, clock, 1, {"gpu01": 0.9})
    for m in (2, 3, 4):                     # gpu01 went silent: still firing, still repeated
        run(db, eng, clock, m, {"gpu02": 0.1})
    sent = [(s, e) for s, _, e in outbox(db)]
    # alertmanager-api: every run (1 min by default, so Alertmanager keeps the alert)
    assert sent == [("am", "firing"), ("once", "firing"), ("api", "firing"),
                    ("api", "firing"),
                    ("am", "firing"), ("api", "firing"),
                    ("api", "firing"),
                    ("am", "firing"), ("api", "firing")]


def test_routing_min_risk_labels_events_and_escalation(db: Store) -> None:
    clock = Clock()
    sinks = [am("all"), am("page", min_risk=0.8), am("gpu-only", match={"node": "gpu*"}),
             am("firing-only", events=["firing"]), am("part", match={"partition": "cpu"})]
    eng = engine(db, config(sinks, **{"for": "0"}), clock)
    run(db, eng, clock, 0, {"gpu01": 0.6, "cpu01": 0.6})
    assert sorted(outbox(db)) == sorted([
        ("all", "cpu01@20260301T120000Z", "firing"), ("all", "gpu01@20260301T120000Z", "firing"),
        ("gpu-only", "gpu01@20260301T120000Z", "firing"),
        ("firing-only", "cpu01@20260301T120000Z", "firing"),
        ("firing-only", "gpu01@20260301T120000Z", "firing"),
        ("part", "cpu01@20260301T120000Z", "firing")])
    run(db, eng, clock, 1, {"gpu01": 0.85, "cpu01": 0.6})  # escalates to the paging sink
    assert outbox(db)[-1] == ("page", "gpu01@20260301T120000Z", "firing")
    before = len(outbox(db))
    run(db, eng, clock, 2, {"gpu01": 0.1, "cpu01": 0.6})
    run(db, eng, clock, 5, {"gpu01": 0.1, "cpu01": 0.6})   # resolved: to who got the firing
    assert sorted(outbox(db)[before:]) == [
        ("all", "gpu01@20260301T120000Z", "resolved"),
        ("gpu-only", "gpu01@20260301T120000Z", "resolved"),
        ("page", "gpu01@20260301T120000Z", "resolved")]


def test_state_survives_a_restart_and_no_run_is_evaluated_twice(db: Store, tmp_path: Any) -> None:
    clock = Clock()
    eng = engine(db, config([am()]), clock)
    for m in range(3):
        run(db, eng, clock, m, {"gpu01": 0.6})
    db.close()
    store = Store(tmp_path / "alerts.duckdb")            # a new process
    try:
        eng = engine(store, config([am()]), clock)
        assert eng.evaluate(clock()) == []                  # nothing new: nothing again
        put_scores(store, T0 + minutes(3), {"gpu01": 0.6})
        put_scores(store, T0 + minutes(4), {"gpu01": 0.6})
        put_scores(store, T0 + minutes(5), {"gpu01": 0.6})  # three runs while it was down
        events = eng.evaluate(clock.at(T0 + minutes(6)))
        assert [(e.status, e.fired_at) for e in events] == [("firing", T0 + minutes(5))]
        assert rows(store) == [("gpu01", "firing", 0.6, T0, T0 + minutes(5), None)]
    finally:
        store.close()


def test_first_evaluation_starts_for_s_before_the_newest_run(db: Store) -> None:
    for m in range(0, 120):                                 # two hours of history
        put_scores(db, T0 + minutes(m), {"gpu01": 0.9})
    clock = Clock(T0 + minutes(120))
    events = engine(db, config([am()]), clock).evaluate()
    assert [(e.started_at, e.fired_at) for e in events] == [
        (T0 + minutes(114), T0 + minutes(119))]


def test_alerts_rows_have_the_api_columns(db: Store) -> None:
    clock = Clock()
    eng = engine(db, config(**{"for": "0"}), clock)
    put_scores(db, T0, {"gpu01": 0.9}, reasons={"gpu01": ["GPU 3: HBM errors 40x fleet"]})
    eng.evaluate(clock.at(T0 + minutes(1)))
    cols = [r[0] for r in db.cursor().execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'alerts' "
        "ORDER BY column_index").fetchall()]
    assert cols[:9] == ["id", "node", "state", "risk", "started_at", "fired_at", "resolved_at",
                        "reasons", "updated_at"]
    r = db.cursor().execute("SELECT reasons, updated_at FROM alerts").fetchone()
    assert json.loads(r[0]) == ["GPU 3: HBM errors 40x fleet"]
    assert r[1] == T0 + minutes(1)


def test_rule_rejects_a_resolve_threshold_above_the_threshold() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        Rule(threshold=0.5, resolve_threshold=0.6)


def test_rule_step_is_pure() -> None:
    rule = Rule(threshold=0.5, for_s=0, resolve_threshold=0.3, resolve_for_s=0)
    alert, change = rule.step(None, Score(T0, "n", 0.7), T0)
    assert (alert.state, change) == ("firing", "firing")
    alert2, change = rule.step(alert, Score(T0 + minutes(1), "n", 0.2), T0 + minutes(1))
    assert (alert2.state, alert2.resolved_at, change) == ("resolved", T0 + minutes(1), "resolved")
    assert alert.state == "firing"


def test_alerts_carry_the_labels_set_through_the_api(db: Store) -> None:
    from fleetcare.api import queries

    cur = db.cursor()
    cur.execute(queries.LABELS_DDL)
    queries.set_labels(cur, "gpu01", {"partition": "train-a", "rack": "r7"}, T0)
    eng = AlertEngine.from_config(db, config([am()], **{"for": "0"}), clock=Clock(),
                                  node_labels=queries.labels_reader(db))
    events = run(db, eng, Clock(), 0, {"gpu01": 0.9, "gpu02": 0.9})
    assert [(e.node, dict(e.labels)) for e in events] == [
        ("gpu01", {"partition": "train-a", "rack": "r7"}), ("gpu02", {})]
