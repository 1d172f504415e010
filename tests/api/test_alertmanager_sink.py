"""The ``alertmanager-api`` sink against a real Alertmanager (Debian's
``prometheus-alertmanager`` on loopback, its own config and storage): fleetcare's risk
alert arrives and is routed to a webhook receiver, a silence made through Alertmanager's
API keeps it quiet (re-sends included), and the resolve reaches the receiver; and the
route example's inhibition (deploy/prometheus/alertmanager.example.yml) holds a node's
alert back during a fleet-wide one."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetcare.api.alerts import AlertEngine
from fleetcare.api.alerts.sinks import rfc3339
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store
from tests.api import test_alerts_helpers as helpers
from tests.api.test_alerts_helpers import Clock, Received, config, put_scores

from . import daemons

pytestmark = pytest.mark.prometheus

db = helpers.db  # fixture
receivers = helpers.receivers  # fixture

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alertmanager.example.yml"
REASONS = ["GPU 3: HBM ECC errors 40x the fleet's rate"]


def api(url: str, path: str, body: Any = None, method: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def wait_for(what: str, ok: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := ok()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def notifications(recv: Any, status: str | None = None) -> list[dict[str, Any]]:
    got: list[Received] = list(recv.got)
    return [n for n in (r.json() for r in got) if status is None or n["status"] == status]


def am_alerts(url: str, matcher: str) -> list[dict[str, Any]]:
    return api(url, "/api/v2/alerts?" + urllib.parse.urlencode({"filter": matcher}))


def hook_config(hook: str) -> str:
    return f"""
route:
  receiver: hook
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1s
receivers:
  - name: hook
    webhook_configs: [{{url: "{hook}", send_resolved: true}}]
"""


def engine(db: Store, am_url: str, clock: Clock, **sink: Any) -> AlertEngine:
    cfg = config([{"name": "am", "kind": "alertmanager-api", "url": am_url, **sink}],
                 **{"for": "0", "resolve_for": "0"})
    return AlertEngine.from_config(db, cfg, clock=clock, rng=lambda: 0.5,
                                   node_labels=lambda n: {"partition": "train-a"})


def test_risk_alert_is_routed_silenced_and_resolved_by_a_real_alertmanager(
        db: Store, receivers: Any, tmp_path: Path) -> None:
    recv = receivers()
    # scoring runs a few minutes ago (a resolve's endsAt must not lie in Alertmanager's future)
    t0 = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0) - dt.timedelta(minutes=5)
    wall = Clock(t0 + dt.timedelta(minutes=3))
    with daemons.alertmanager(hook_config(recv.url("/hook")), tmp_path / "am") as url:
        eng = engine(db, url, wall)
        put_scores(db, t0, {"gpu03": 0.91, "gpu04": 0.02}, reasons={"gpu03": REASONS})
        eng.evaluate(wall())
        assert eng.outbox.deliver_due(wall()).delivered == 1  # Alertmanager took it (200)

        # routed to the receiver, and repeated while nothing silences it
        firing = wait_for("two firing notifications",
                          lambda: len(notifications(recv, "firing")) >= 2 and
                          notifications(recv, "firing"))[0]
        assert firing["receiver"] == "hook" and firing["groupLabels"] == {
            "alertname": "FleetcareNodeFailureRisk", "node": "gpu03"}
        (alert,) = firing["alerts"]
        assert alert["labels"] == {"alertname": "FleetcareNodeFailureRisk", "node": "gpu03",
                                   "severity": "warning", "partition": "train-a",
                                   "job": "fleetcare"}
        assert alert["annotations"]["summary"] == (
            f"gpu03: failure risk 0.91 >= 0.50 since {rfc3339(t0)}")
        assert alert["annotations"]["description"] == REASONS[0]
        assert alert["startsAt"] == rfc3339(t0)
        assert alert["generatorURL"] == "http://fleetcare.test:8000/v1/nodes/gpu03"

        # a silence made in Alertmanager: no notification while it holds, re-sends included
        now = dt.datetime.now(dt.UTC)
        silence = api(url, "/api/v2/silences", {
            "matchers": [{"name": "node", "value": "gpu03", "isRegex": False,
                          "isEqual": True}],
            "startsAt": rfc3339(now), "endsAt": rfc3339(now + dt.timedelta(hours=1)),
            "createdBy": "fleetcare tests", "comment": "gpu03 is being inspected"})
        (silenced,) = wait_for("the alert silenced", lambda: [
            a for a in am_alerts(url, 'node="gpu03"')
            if a["status"]["state"] == "suppressed"])
        assert silenced["status"]["silencedBy"] == [silence["silenceID"]]
        time.sleep(1.5)  # a notification already on its way may still land
        before = len(recv.got)
        put_scores(db, t0 + dt.timedelta(minutes=1), {"gpu03": 0.93, "gpu04": 0.02})
        eng.evaluate(wall.at(t0 + dt.timedelta(minutes=4)))     # 1 min later: re-sent
        assert eng.outbox.deliver_due(wall()).delivered == 1
        time.sleep(3)
        assert len(recv.got) == before, [n["status"] for n in notifications(recv)[before:]]

        # the silence expires, then fleetcare resolves the alert: the receiver hears it
        api(url, f"/api/v2/silence/{silence['silenceID']}", method="DELETE")
        put_scores(db, t0 + dt.timedelta(minutes=2), {"gpu03": 0.05, "gpu04": 0.02})
        eng.evaluate(wall.at(t0 + dt.timedelta(minutes=5)))
        assert eng.outbox.deliver_due(wall()).delivered == 1
        resolved = wait_for("a resolved notification",
                            lambda: notifications(recv, "resolved"))[0]
        (alert,) = resolved["alerts"]
        assert (alert["status"], alert["labels"]["node"], alert["endsAt"]) == (
            "resolved", "gpu03", rfc3339(t0 + dt.timedelta(minutes=2)))
        assert am_alerts(url, 'node="gpu03"') == []  # resolved alerts are not active


def test_the_route_example_inhibits_node_alerts_during_a_fleet_wide_one(
        db: Store, receivers: Any, tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    hooks = {r["name"]: receivers() for r in doc["receivers"]}
    # the example's receivers are placeholders: the same names, on loopback; faster timing
    doc["receivers"] = [{"name": n, "webhook_configs": [
        {"url": h.url(f"/{n}"), "send_resolved": True}]} for n, h in hooks.items()]
    doc["route"].update(group_wait="1s", group_interval="1s")
    t0 = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0) - dt.timedelta(minutes=1)
    with daemons.alertmanager(yaml.safe_dump(doc), tmp_path / "am") as url:
        # FleetcareFleetWideRisk as Prometheus sends it (fleetcare-risk-rules.yml)
        api(url, "/api/v2/alerts", [{"labels": {
            "alertname": "FleetcareFleetWideRisk", "job": "fleetcare", "scope": "fleet",
            "severity": "critical"}, "annotations": {"summary": "4 nodes at risk"},
            "startsAt": rfc3339(t0)}])
        wait_for("the fleet-wide page", lambda: hooks["gpu-ops-pager"].got)
        eng = engine(db, url, Clock(t0 + dt.timedelta(seconds=30)))
        put_scores(db, t0, {"gpu01": 0.9}, reasons={"gpu01": REASONS})
        eng.evaluate()
        assert eng.outbox.deliver_due().delivered == 1
        (node,) = wait_for("gpu01's alert in Alertmanager",
                           lambda: am_alerts(url, 'node="gpu01"'))
        assert node["status"]["state"] == "suppressed" and node["status"]["inhibitedBy"]
        assert node["receivers"] == [{"name": "training-infra"}]  # partition train-a
        time.sleep(2.5)  # past group_wait: an uninhibited alert would have been sent
        assert hooks["training-infra"].got == [] and hooks["gpu-ops-chat"].got == []
        assert [a["labels"]["alertname"] for r in hooks["gpu-ops-pager"].got
                for a in r.json()["alerts"]] == ["FleetcareFleetWideRisk"]
        assert node["labels"]["job"] == "fleetcare"  # the sink's default job
        # another fleet's serve (scraped as job "fleet-b", its sink's job), with a node of
        # the same name, is not silenced: the job, not the node, keeps the fleets apart
        other = Store(tmp_path / "fleet-b.duckdb")
        try:
            scoring.ensure_schema(other)
            eng_b = engine(other, url, Clock(t0 + dt.timedelta(seconds=30)), job="fleet-b")
            put_scores(other, t0, {"gpu01": 0.9}, reasons={"gpu01": REASONS})
            eng_b.evaluate()
            assert eng_b.outbox.deliver_due().delivered == 1
            got = wait_for("fleet-b's alert at its receiver", lambda: [
                a for r in hooks["training-infra"].got for a in r.json()["alerts"]])
            assert [(a["labels"]["node"], a["labels"]["job"]) for a in got] == [
                ("gpu01", "fleet-b")]
            states = {a["labels"]["job"]: a["status"]["state"]
                      for a in am_alerts(url, 'node="gpu01"')}
            assert states == {"fleetcare": "suppressed", "fleet-b": "active"}
        finally:
            other.close()
