"""``[alerts] threshold = "model"``: alerts fire at the scoring model's own operating point
(the shipped prior's threshold held for its hold, or its immediate risk at once; a fleet
model's threshold at once), and follow a promotion from the next evaluation."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fleetcare.api.alerts import AlertEngine
from fleetcare.api.alerts.config import AlertsConfig, parse
from fleetcare.api.alerts.engine import operating_point
from fleetcare.collectors.config import ConfigError
from fleetcare.models import prior, registry
from fleetcare.models.model import FailureModel
from fleetcare.pipeline.store import Store
from tests.api import test_alerts_helpers as helpers
from tests.api.test_alerts_helpers import T0, Clock, config, minutes, put_scores

db = helpers.db  # fixture
receivers = helpers.receivers  # fixture


def model_config(env: dict[str, str] | None = None, **top: object) -> AlertsConfig:
    return parse({"threshold": "model", "resolve_threshold": 0.3, "resolve_for": "3m",
                  "sinks": [], **top}, env or {})


def evaluate(store: Store, eng: AlertEngine, clock: Clock, minute: float,
             risks: dict[str, float]) -> None:
    ts = T0 + minutes(minute)
    put_scores(store, ts, risks)
    eng.evaluate(clock.at(ts + minutes(0.1)))


def fired(store: Store) -> dict[str, dt.datetime]:
    """node -> when its alert fired (no sinks here: the alerts table is the record)."""
    return dict(store.cursor().execute(
        "SELECT node, fired_at FROM alerts WHERE fired_at IS NOT NULL").fetchall())


def test_the_prior_s_point_holds_then_fires_or_fires_at_once(db: Store) -> None:
    meta = prior.load()[1]
    prior.ensure_current(db)
    thr, hold_min, at_once = meta["threshold"], meta["hold_h"] * 60, meta["immediate"]
    assert hold_min >= 20 and at_once is not None  # what this test steps through
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    above, below = thr + (at_once - thr) / 2, thr - 0.01
    step = hold_min / 4
    for i in range(6):  # n1 held above the threshold; n2 just under it; n3 at once at i=2
        evaluate(db, eng, clock, i * step, {"n1": above, "n2": below,
                                            "n3": at_once if i == 2 else 0.01})
    assert fired(db) == {"n3": T0 + minutes(2 * step), "n1": T0 + minutes(4 * step)}
    # a fixed rule of the same config fires n1 and n2 after its own 5 minutes instead
    fixed = AlertEngine.from_config(db, config(threshold=0.5), clock=clock).current_rule()
    assert (fixed.threshold, fixed.for_s, fixed.immediate) == (0.5, 300.0, None)


def test_a_promoted_fleet_model_s_point_applies_from_the_next_run(db: Store) -> None:
    prior.ensure_current(db)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    evaluate(db, eng, clock, 0, {"n1": 0.6})
    assert fired(db) == {}  # under the prior's threshold
    model = FailureModel.from_bytes(prior.load()[0])
    registry.save(db, model, metrics={"threshold": 0.55, "recall_at_budget": 0.5},
                  model_id="fleet-test", make_current=True)
    evaluate(db, eng, clock, 1, {"n1": 0.6})
    assert fired(db) == {"n1": T0 + minutes(1)}  # at once
    rule = eng.current_rule()
    assert (rule.threshold, rule.for_s, rule.immediate) == (0.55, 0.0, None)
    assert eng.point_of == "fleet-test"
    # the same model with its metrics rewritten (a refreshed prior meta, say): read again
    registry.set_metrics(db, "fleet-test", {"threshold": 0.65})
    assert eng.current_rule().threshold == 0.65 and eng.point_of == "fleet-test"


def test_without_a_model_point_the_configured_values_apply(db: Store) -> None:
    clock = Clock()  # no model registered at all
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    rule = eng.current_rule()
    assert (rule.threshold, rule.for_s, eng.point_of) == (0.5, 600.0, None)


def test_operating_point_of_registry_metrics() -> None:
    assert operating_point({"threshold": 0.74, "hold_h": 1.0, "immediate": 0.93}) == (
        0.74, 3600.0, 0.93, None)
    assert operating_point({"threshold": 0.6}) == (0.6, 0.0, None, None)
    assert operating_point({"threshold": 0.74, "network_head": {"threshold": 0.05}}) == (
        0.74, 0.0, None, 0.05)
    assert operating_point({"pr_auc": 0.2}) is None


def test_model_is_a_threshold_and_for_then_comes_from_it() -> None:
    assert model_config().from_model
    assert parse({}, {"FLEETCARE_ALERTS_THRESHOLD": "model"}).from_model
    assert not config(threshold=0.7).from_model
    # the default, when nothing says when to fire; a fixed rule once anything does
    assert parse({}, {}).from_model and parse({"resolve_for": "5m"}, {}).from_model
    assert not parse({"for": "20m"}, {}).from_model
    assert not parse({}, {"FLEETCARE_ALERTS_IMMEDIATE_THRESHOLD": "0.9"}).from_model
    with pytest.raises(ConfigError) as err:
        parse({"threshold": "model", "for": "1h"}, {})
    assert "[alerts] for" in str(err.value) and 'threshold = "model"' in str(err.value)
    with pytest.raises(ConfigError) as err:
        config(threshold="modle")
    assert 'or "model"' in str(err.value)


def put_network(store: Store, ts: dt.datetime, p_net: dict[str, float],
                model_id: str = "m1") -> None:
    """The network head's probabilities of one run, as ``scoring.score`` writes them."""
    for node, p in p_net.items():
        store.cursor().execute("INSERT INTO node_network_scores VALUES (?, ?, ?, ?)",
                               [ts, node, p, model_id]).fetchall()


def test_the_prior_s_network_head_alarms_at_its_own_threshold(db: Store) -> None:
    """The prior's operating point is one threshold per head: a node whose network
    probability reaches the head's threshold alarms (held as any other) though its
    combined risk is far under the GPU side's; its alert keeps its own risk and says why;
    it resolves once the probability falls back."""
    meta = prior.load()[1]
    net = meta["network_head"]["threshold"]
    prior.ensure_current(db)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    assert eng.current_rule().network == pytest.approx(net)
    step = meta["hold_h"] * 60 / 4
    risk = net + 0.01  # the node's risk, the GPUs' and the network's combined
    for i in range(6):  # n1 over the head's threshold; n2 just under it
        ts = T0 + minutes(i * step)
        put_scores(db, ts, {"n1": risk, "n2": risk, "n3": 0.01})
        put_network(db, ts, {"n1": net * 1.1, "n2": net * 0.9})
        eng.evaluate(clock.at(ts + minutes(0.1)))
    assert fired(db) == {"n1": T0 + minutes(4 * step)}
    row = eng.alerts(state="firing")[0]
    assert row["risk"] == pytest.approx(risk) and row["p_net"] == pytest.approx(net * 1.1)
    assert row["reasons"][0].startswith(f"network risk {net * 1.1:.0%}: at or above")
    assert row["reasons"][1] == "n1 reason"
    for i in range(6, 12):  # the probability falls under the head's (scaled) resolve level
        ts = T0 + minutes(i * step)
        put_scores(db, ts, {"n1": risk})
        put_network(db, ts, {"n1": net * 0.2})
        eng.evaluate(clock.at(ts + minutes(0.1)))
    assert [a["state"] for a in eng.alerts()] == ["resolved"]


def test_a_model_without_a_head_threshold_alarms_on_the_risk_alone(db: Store) -> None:
    prior.ensure_current(db)
    model = FailureModel.from_bytes(prior.load()[0])
    registry.save(db, model, metrics={"threshold": 0.55}, model_id="fleet-test",
                  make_current=True)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    put_scores(db, T0, {"n1": 0.2})
    put_network(db, T0, {"n1": 0.19})
    eng.evaluate(clock.at(T0 + minutes(0.1)))
    assert eng.current_rule().network is None and fired(db) == {}


def run_network(db: Store, eng: AlertEngine, clock: Clock, minute: float, risk: float,
                p_net: float, node: str = "n1") -> None:
    ts = T0 + minutes(minute)
    put_scores(db, ts, {node: risk})
    put_network(db, ts, {node: p_net})
    eng.evaluate(clock.at(ts + minutes(0.1)))


def test_a_probability_hovering_at_the_head_s_threshold_fires_once(db: Store) -> None:
    """The network side has the risk side's hysteresis (scaled to the head's threshold):
    a probability that dips just under its threshold keeps a firing alert, and only one
    under the scaled resolve level resolves it (after ``resolve_for``)."""
    meta = prior.load()[1]
    net, thr = meta["network_head"]["threshold"], meta["threshold"]
    prior.ensure_current(db)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)  # resolve 0.3 for 3 min
    hold = meta["hold_h"] * 60
    for i, p in enumerate([1.02, 1.02, 1.02, 0.98, 1.02, 0.98, 0.98, 0.98, 1.02, 0.98]):
        run_network(db, eng, clock, i * hold / 2, 0.06, net * p)
    assert [(a["state"], a["fired_at"] is not None) for a in eng.alerts()] == [
        ("firing", True)]
    resolve_level = net * 0.3 / thr
    for i in range(10, 14):  # under the scaled resolve level: resolves after 3 minutes
        run_network(db, eng, clock, i * hold / 2, 0.06, resolve_level * 0.9)
    assert [a["state"] for a in eng.alerts()] == ["resolved"]


def test_two_models_at_one_ts_the_node_s_row_is_chosen_before_the_filter(db: Store) -> None:
    """Two models scored the same ts (a promotion between runs): the node's row is the
    later model id's, whatever the other model's network probability says."""
    meta = prior.load()[1]
    net = meta["network_head"]["threshold"]
    prior.ensure_current(db)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    for i in range(6):
        ts = T0 + minutes(i * 20)
        put_scores(db, ts, {"n1": 0.06}, model_id="m1")
        put_network(db, ts, {"n1": net * 2}, model_id="m1")
        put_scores(db, ts, {"n1": 0.06}, model_id="m2")
        put_network(db, ts, {"n1": net / 2}, model_id="m2")
        eng.evaluate(clock.at(ts + minutes(0.1)))
    assert fired(db) == {} and eng.alerts() == []


def test_a_bad_network_threshold_in_the_registry_leaves_the_risk_rule(
        db: Store, caplog: pytest.LogCaptureFixture) -> None:
    assert operating_point({"threshold": 0.74, "network_head": {"threshold": 1.5}}) == (
        0.74, 0.0, None, None)
    assert "alerts.bad_network_threshold" in caplog.text
    point = operating_point({"threshold": 0.74, "network_head": {"threshold": "x"}})
    assert point is not None and point.network is None


def test_an_unusable_registry_value_is_logged_once_per_model_not_per_evaluation(
        db: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The engine reads the current model each evaluation; a bad value it found is logged
    when the model or its metrics change, not again on every scoring run."""
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    for i in range(2):  # no model yet: the configured rule
        evaluate(db, eng, clock, i, {"n1": 0.1})
    assert eng.current_rule().threshold == 0.5 and eng.point_of is None
    model = FailureModel.from_bytes(prior.load()[0])
    registry.save(db, model, metrics={"threshold": 0.7, "network_head": {"threshold": 1.5}},
                  model_id="fleet-bad-head", make_current=True)
    for i in range(2, 6):  # a model arrives: read at once, its bad head logged once
        evaluate(db, eng, clock, i, {"n1": 0.1})
    assert caplog.text.count("alerts.bad_network_threshold") == 1
    assert eng.current_rule().threshold == 0.7 and eng.current_rule().network is None
    registry.set_metrics(db, "fleet-bad-head", {"threshold": "high"})  # rewritten: read again
    for i in range(6, 9):
        evaluate(db, eng, clock, i, {"n1": 0.1})
    assert caplog.text.count("alerts.bad_operating_point") == 1
    assert eng.current_rule().threshold == 0.5 and eng.point_of is None  # the configured


def test_an_unusable_operating_point_leaves_the_configured_rule(
        caplog: pytest.LogCaptureFixture) -> None:
    # what `/metrics` exports as fleetcare_alarm_threshold is read the same way
    for bad in ({"threshold": "high"}, {"threshold": 0.0}, {"threshold": 1.5},
                {"threshold": 0.7, "hold_h": "1h"}, {"threshold": 0.7, "hold_h": -1.0},
                {"threshold": True}):
        caplog.clear()
        assert operating_point(bad) is None, bad
        assert "alerts.bad_operating_point" in caplog.text
    assert operating_point({"threshold": 0.7, "immediate": "x"}) == (0.7, 0.0, None, None)


def test_sinks_say_the_network_alarmed_and_read_it_as_at_the_threshold(
        db: Store, receivers: Any) -> None:
    """The summary names the ports, the payloads carry ``p_net``; PagerDuty's severity and
    a sink's ``min_risk`` read the alert as at the threshold, not at its small risk."""
    meta = prior.load()[1]
    net, thr = meta["network_head"]["threshold"], meta["threshold"]
    prior.ensure_current(db)
    pd, signed, strict, chat = receivers(), receivers(), receivers(), receivers()
    cfg = model_config(env={"FLEETCARE_ALERTS_PAGER_ROUTING_KEY": "R" * 32,
                            "FLEETCARE_ALERTS_CHAT_URL": chat.url("/slack"),
                            "FLEETCARE_ALERTS_SIGNED_SECRET": "s3cr3t",
                            "FLEETCARE_ALERTS_STRICT_SECRET": "s3cr3t"},
                       sinks=[{"name": "pager", "kind": "pagerduty", "url": pd.url("/pd")},
                              {"name": "signed", "kind": "hmac", "url": signed.url("/h"),
                               "min_risk": 0.7},
                              {"name": "strict", "kind": "hmac", "url": strict.url("/s"),
                               "min_risk": 0.9},
                              {"name": "chat", "kind": "slack"}])
    clock = Clock()
    eng = AlertEngine.from_config(db, cfg, clock=clock, rng=lambda: 0.5)
    hold = meta["hold_h"] * 60
    for i in range(3):
        run_network(db, eng, clock, i * hold / 2, 0.06, net * 1.5)
    eng.outbox.deliver_due(clock.at(T0 + minutes(hold + 1)))
    assert fired(db) == {"n1": T0 + minutes(hold)}
    payload = pd.got[0].json()["payload"]
    assert payload["summary"].startswith(
        f"n1: network failure risk {net * 1.5:.3f} from its InfiniBand ports (alarms at "
        f"{net:.3f}; node failure risk 0.06)")
    assert payload["severity"] == ("critical" if thr >= 0.8 else "error")
    assert payload["custom_details"]["p_net"] == round(net * 1.5, 4)
    alert = signed.got[0].json()["alert"]
    assert (alert["risk"], alert["network_threshold"]) == (0.06, net)
    assert strict.got == []
    for i in range(3, 6):  # the ports look healthy again: resolved, and said so
        run_network(db, eng, clock, i * hold / 2, 0.06, 0.0)
    eng.outbox.deliver_due(clock.at(T0 + minutes(3 * hold)))
    assert pd.got[-1].json()["event_action"] == "resolve"
    assert chat.got[-1].json()["text"].endswith(
        "n1: network failure risk fell to 0.000 (node failure risk 0.06)")


def test_the_network_band_holds_only_alerts_the_network_raised(db: Store) -> None:
    """An alert the risk fired resolves on the risk's hysteresis even with the node's
    network probability in the network side's band; one the network raised keeps firing
    through a run without its network probability (its ports went silent)."""
    meta = prior.load()[1]
    net, thr = meta["network_head"]["threshold"], meta["threshold"]
    band = (net * 0.3 / thr + net) / 2  # between the scaled resolve level and the threshold
    prior.ensure_current(db)
    clock = Clock()
    eng = AlertEngine.from_config(db, model_config(), clock=clock)
    hold = meta["hold_h"] * 60
    for i in range(3):  # n1 fired by its risk, n2 by its network probability
        ts = T0 + minutes(i * hold / 2)
        put_scores(db, ts, {"n1": thr + 0.05, "n2": 0.06})
        put_network(db, ts, {"n1": 0.0, "n2": net * 1.5})
        eng.evaluate(clock.at(ts + minutes(0.1)))
    assert set(fired(db)) == {"n1", "n2"}
    for i in range(3, 6):  # both in the band; n2's ports silent (no network row)
        ts = T0 + minutes(i * hold / 2)
        put_scores(db, ts, {"n1": 0.06, "n2": 0.06})
        put_network(db, ts, {"n1": band})
        eng.evaluate(clock.at(ts + minutes(0.1)))
    assert {a["node"]: a["state"] for a in eng.alerts()} == {"n1": "resolved",
                                                           "n2": "firing"}
