"""Each sink kind against a real HTTP receiver on loopback: exact bodies and headers,
from a scoring run to the receiver, firing then resolved."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetcare.api.alerts import AlertEngine, verify_signature
from fleetcare.api.alerts.sinks import fingerprint
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
receivers = helpers.receivers  # fixture

REASONS = ["GPU 3: HBM ECC errors 40x the fleet's rate", "GPU 3: 2 rows remapped in 24 h"]
ALERT_ID = "gpu017@20260301T120000Z"
SECRET = "s3cr3t-shared"
ROUTING_KEY = "R0UTINGKEY0123456789abcdef012345"


def setup(db: Store, receivers: Any) -> tuple[AlertEngine, Clock, dict[str, Any]]:
    recv = {k: receivers() for k in ("alertmanager", "slack", "pagerduty", "hmac")}
    env = {"FLEETCARE_ALERTS_OPS_SLACK_URL": recv["slack"].url("/services/T0/B0/XYZ"),
           "FLEETCARE_ALERTS_PAGER_ROUTING_KEY": ROUTING_KEY,
           "FLEETCARE_ALERTS_SIGNED_SECRET": SECRET}
    sinks = [{"name": "am", "kind": "alertmanager", "url": recv["alertmanager"].url("/am"),
              "receiver": "fleetcare-ops"},
             {"name": "ops-slack", "kind": "slack"},
             {"name": "pager", "kind": "pagerduty", "url": recv["pagerduty"].url("/v2/enqueue")},
             {"name": "signed", "kind": "hmac", "url": recv["hmac"].url("/fleetcare")}]
    cfg = config(sinks, env, **{"for": "0", "resolve_for": "0"})
    clock = Clock()
    eng = AlertEngine.from_config(db, cfg, clock=clock, rng=lambda: 0.5,
                                  node_labels=lambda n: {"partition": "a100"})
    return eng, clock, recv


def fire_and_resolve(db: Store, eng: AlertEngine, clock: Clock) -> None:
    put_scores(db, T0, {"gpu017": 0.83, "gpu018": 0.05}, reasons={"gpu017": REASONS})
    assert len(eng.evaluate(clock.at(T0 + dt.timedelta(seconds=5)))) == 4
    assert eng.outbox.deliver_due(clock.at(T0 + dt.timedelta(seconds=6))).delivered == 4
    put_scores(db, T0 + minutes(1), {"gpu017": 0.1, "gpu018": 0.05})
    assert len(eng.evaluate(clock.at(T0 + minutes(1) + dt.timedelta(seconds=5)))) == 4
    assert eng.outbox.deliver_due(clock.at(T0 + minutes(1) + dt.timedelta(seconds=6))
                                  ).delivered == 4


def test_alertmanager_webhook_version_4(db: Store, receivers: Any) -> None:
    eng, clock, recv = setup(db, receivers)
    fire_and_resolve(db, eng, clock)
    firing, resolved = recv["alertmanager"].got
    assert firing.path == "/am"
    assert firing.headers["Content-Type"] == "application/json"
    assert firing.headers["User-Agent"].startswith("fleetcare-alerts/")
    labels = {"alertname": "FleetcareNodeFailureRisk", "partition": "a100", "node": "gpu017"}
    annotations = {"summary": "gpu017: failure risk 0.83 >= 0.50 since 2026-03-01T12:00:00Z",
                   "description": "; ".join(REASONS), "risk": "0.8300",
                   "alert_id": ALERT_ID, "top_gpu_uuid": "GPU-gpu017-0"}
    assert firing.json() == {
        "receiver": "fleetcare-ops", "status": "firing",
        "alerts": [{"status": "firing", "labels": labels, "annotations": annotations,
                    "startsAt": "2026-03-01T12:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "http://fleetcare.test:8000/v1/nodes/gpu017",
                    "fingerprint": fingerprint(labels)}],
        "groupLabels": {"alertname": "FleetcareNodeFailureRisk", "node": "gpu017"},
        "commonLabels": labels, "commonAnnotations": annotations,
        "externalURL": "http://fleetcare.test:8000", "version": "4",
        "groupKey": '{}:{alertname="FleetcareNodeFailureRisk", node="gpu017"}',
        "truncatedAlerts": 0}
    body = resolved.json()
    assert body["status"] == "resolved"
    assert body["alerts"][0]["status"] == "resolved"
    assert body["alerts"][0]["endsAt"] == "2026-03-01T12:01:00Z"
    assert body["alerts"][0]["fingerprint"] == fingerprint(labels)   # same alert
    assert body["alerts"][0]["annotations"]["summary"] == (
        "gpu017: failure risk fell to 0.10 (peak 0.83)")
    assert body["groupKey"] == firing.json()["groupKey"]


def test_fingerprint_is_prometheus_label_set_fingerprint() -> None:
    # prometheus/common model: labelSetToFingerprint test vectors
    assert fingerprint({}) == f"{14695981039346656037:016x}"
    assert fingerprint({"name": "garland, briggs", "fear": "love is not enough"}) == (
        f"{5799056148416392346:016x}")


def test_slack_incoming_webhook(db: Store, receivers: Any) -> None:
    eng, clock, recv = setup(db, receivers)
    fire_and_resolve(db, eng, clock)
    firing, resolved = recv["slack"].got
    assert firing.path == "/services/T0/B0/XYZ"
    assert firing.headers["Content-Type"] == "application/json"
    title = "🔥 FIRING: gpu017 failure risk 0.83"
    assert firing.json() == {
        "text": f"{title}: gpu017: failure risk 0.83 >= 0.50 since 2026-03-01T12:00:00Z",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title}},
            {"type": "section", "text": {"type": "mrkdwn", "text": (
                "*gpu017: failure risk 0.83 >= 0.50 since 2026-03-01T12:00:00Z*\n"
                f"• {REASONS[0]}\n• {REASONS[1]}")}},
            {"type": "section", "fields": [
                {"type": "mrkdwn", "text": "*Node*\ngpu017"},
                {"type": "mrkdwn", "text": "*Risk*\n0.83 (peak 0.83)"},
                {"type": "mrkdwn", "text": "*Firing since*\n2026-03-01T12:00:00Z"}]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": (
                f"alert {ALERT_ID} · <http://fleetcare.test:8000/v1/nodes/gpu017|node details>"
            )}]}]}
    body = resolved.json()
    assert body["text"] == ("✅ RESOLVED: gpu017 failure risk 0.10: gpu017: failure risk fell "
                            "to 0.10 (peak 0.83)")
    assert body["blocks"][2]["fields"][-1] == {"type": "mrkdwn",
                                               "text": "*Resolved at*\n2026-03-01T12:01:00Z"}


def test_pagerduty_events_v2_trigger_then_resolve(db: Store, receivers: Any) -> None:
    eng, clock, recv = setup(db, receivers)
    fire_and_resolve(db, eng, clock)
    trigger, resolve = recv["pagerduty"].got
    assert trigger.path == resolve.path == "/v2/enqueue"
    assert trigger.headers["Content-Type"] == "application/json"
    assert trigger.json() == {
        "routing_key": ROUTING_KEY, "event_action": "trigger",
        "dedup_key": f"fleetcare/{ALERT_ID}",
        "payload": {
            "summary": "gpu017: failure risk 0.83 >= 0.50 since 2026-03-01T12:00:00Z",
            "source": "gpu017", "severity": "critical", "timestamp": "2026-03-01T12:00:00Z",
            "component": "GPU-gpu017-0", "group": "gpu017", "class": "predicted GPU failure",
            "custom_details": {"risk": 0.83, "peak_risk": 0.83, "threshold": 0.5,
                               "reasons": REASONS, "alert_id": ALERT_ID,
                               "started_at": "2026-03-01T12:00:00Z", "model_id": "m1",
                               "labels": {"partition": "a100"}}},
        "client": "fleetcare", "client_url": "http://fleetcare.test:8000/v1/nodes/gpu017"}
    assert resolve.json() == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                              "dedup_key": f"fleetcare/{ALERT_ID}"}


def test_hmac_signed_json_verifies_and_rejects_replays(db: Store, receivers: Any) -> None:
    eng, clock, recv = setup(db, receivers)
    fire_and_resolve(db, eng, clock)
    firing, resolved = recv["hmac"].got
    sent_at = T0 + dt.timedelta(seconds=6)
    assert firing.headers["X-Fleetcare-Timestamp"] == str(int(sent_at.replace(
        tzinfo=dt.UTC).timestamp()))
    assert firing.headers["X-Fleetcare-Event"] == "alert.firing"
    assert firing.headers["X-Fleetcare-Delivery"] == f"{ALERT_ID}:firing:20260301T120000Z"
    assert firing.json() == {
        "version": "1", "id": f"{ALERT_ID}:firing:20260301T120000Z", "type": "alert.firing",
        "repeat": False,
        "alert": {"id": ALERT_ID, "node": "gpu017", "status": "firing", "risk": 0.83,
                  "peak_risk": 0.83, "threshold": 0.5, "started_at": "2026-03-01T12:00:00Z",
                  "fired_at": "2026-03-01T12:00:00Z", "resolved_at": None, "reasons": REASONS,
                  "labels": {"partition": "a100"}, "top_gpu_uuid": "GPU-gpu017-0",
                  "model_id": "m1", "url": "http://fleetcare.test:8000/v1/nodes/gpu017"}}
    ts, sig = firing.headers["X-Fleetcare-Timestamp"], firing.headers["X-Fleetcare-Signature"]
    assert sig.startswith("sha256=") and len(sig) == len("sha256=") + 64
    now = int(ts) + 2
    assert verify_signature(SECRET, ts, firing.body, sig, now)
    assert not verify_signature("wrong", ts, firing.body, sig, now)
    assert not verify_signature(SECRET, ts, firing.body + b" ", sig, now)       # tampered
    assert not verify_signature(SECRET, str(int(ts) + 1), firing.body, sig, now)  # ts bound
    assert verify_signature(SECRET, ts, firing.body, sig, int(ts) + 300)
    assert not verify_signature(SECRET, ts, firing.body, sig, int(ts) + 301)    # replayed late
    assert not verify_signature(SECRET, ts, firing.body, sig, int(ts) - 301)    # from the future
    assert not verify_signature(SECRET, "not-a-number", firing.body, sig, now)
    assert resolved.json()["type"] == "alert.resolved"
    assert resolved.json()["alert"]["resolved_at"] == "2026-03-01T12:01:00Z"
    rts = resolved.headers["X-Fleetcare-Timestamp"]
    assert verify_signature(SECRET, rts, resolved.body,
                            resolved.headers["X-Fleetcare-Signature"], int(rts))


def test_alertmanager_api_v2_alerts_with_basic_auth_added_at_send_time(
        db: Store, receivers: Any) -> None:
    recv = receivers()
    cfg = config([{"name": "am", "kind": "alertmanager-api", "url": recv.url("/"),
                   "username": "fleetcare", "job": "serve-a"}],
                 {"FLEETCARE_ALERTS_AM_SECRET": "pw"},
                 **{"for": "0", "resolve_for": "0"})
    clock = Clock()
    eng = AlertEngine.from_config(db, cfg, clock=clock, rng=lambda: 0.5,
                                  node_labels=lambda n: {"partition": "a100", "rack-id": "r7",
                                                         "empty": "", "job": "not-this"})
    put_scores(db, T0, {"gpu017": 0.83}, reasons={"gpu017": REASONS})
    eng.evaluate(clock.at(T0 + dt.timedelta(seconds=5)))
    put_scores(db, T0 + minutes(1), {"gpu017": 0.1})
    eng.evaluate(clock.at(T0 + minutes(1) + dt.timedelta(seconds=5)))
    assert eng.outbox.deliver_due(clock()).delivered == 2
    stored = db.cursor().execute("SELECT headers FROM alert_outbox").fetchall()
    assert all("Authorization" not in h and "pw" not in h for (h,) in stored)
    firing, resolved = recv.got
    assert (firing.path, resolved.path) == ("/api/v2/alerts", "/api/v2/alerts")
    assert firing.headers["Authorization"] == "Basic ZmxlZXRjYXJlOnB3"  # fleetcare:pw
    assert firing.headers["Content-Type"] == "application/json"
    labels = {"alertname": "FleetcareNodeFailureRisk", "node": "gpu017",
              "severity": "warning", "partition": "a100", "rack_id": "r7",
              "job": "serve-a"}  # the sink's job, never a node label's
    annotations = {"summary": "gpu017: failure risk 0.83 >= 0.50 since 2026-03-01T12:00:00Z",
                   "description": "; ".join(REASONS), "risk": "0.8300",
                   "peak_risk": "0.8300", "threshold": "0.5000", "alert_id": ALERT_ID,
                   "model_id": "m1", "top_gpu_uuid": "GPU-gpu017-0"}
    assert firing.json() == [{"labels": labels, "annotations": annotations,
                              "startsAt": "2026-03-01T12:00:00Z",
                              "generatorURL": "http://fleetcare.test:8000/v1/nodes/gpu017"}]
    body = resolved.json()
    assert [(a["labels"], a["startsAt"], a["endsAt"]) for a in body] == [
        (labels, "2026-03-01T12:00:00Z", "2026-03-01T12:01:00Z")]
    assert body[0]["annotations"]["summary"] == "gpu017: failure risk fell to 0.10 (peak 0.83)"
