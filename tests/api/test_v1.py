"""API v1 beyond the risk list: filters and paging, GPUs, drain candidates, incidents,
node labels, alerts. Real server, real DuckDB file, exact bodies."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline.incidents import list_incidents

UTC = dt.UTC


def names(r):
    assert r.status_code == 200, r.text
    return [n["node"] for n in r.json()["nodes"]]


@pytest.fixture
def labelled(client, fleet):
    """Five nodes over two partitions and two GPU models."""
    for node, risk, part, model in [("a1", 0.9, "train-a", "NVIDIA H100 80GB HBM3"),
                                    ("a2", 0.5, "train-a", "NVIDIA A100-SXM4-80GB"),
                                    ("b1", 0.7, "train-b", "NVIDIA H100 80GB HBM3"),
                                    ("b2", 0.1, "train-b", "NVIDIA A100-SXM4-80GB"),
                                    ("c1", 0.3, None, "NVIDIA H200")]:
        fleet.node_score(node, risk)
        fleet.gpu_score(node, f"GPU-{node}-0", 0, risk, model=model)
        if part:
            r = client.put(f"/v1/nodes/{node}/labels",
                           json={"labels": {"partition": part, "rack": f"r{node[1]}"}})
            assert r.status_code == 200
    return client


def test_risk_filters_by_partition_label_and_gpu_model(labelled):
    c = labelled
    assert names(c.get("/v1/risk")) == ["a1", "b1", "a2", "c1", "b2"]
    assert names(c.get("/v1/risk", params={"partition": "train-a"})) == ["a1", "a2"]
    assert names(c.get("/v1/risk", params={"label": "rack=r2"})) == ["a2", "b2"]
    assert names(c.get("/v1/risk", params=[("label", "rack=r1"),
                                           ("label", "partition=train-b")])) == ["b1"]
    assert names(c.get("/v1/risk", params={"gpu_model": "h100"})) == ["a1", "b1"]
    assert names(c.get("/v1/risk", params={"gpu_model": "A100", "partition": "train-b"})) == [
        "b2"]
    assert names(c.get("/v1/risk", params={"partition": "nope"})) == []
    body = c.get("/v1/risk", params={"partition": "train-a", "limit": 1}).json()
    assert body["nodes"][0]["labels"] == {"partition": "train-a", "rack": "r1"}


def test_risk_bad_label_filter_is_422_naming_the_field(labelled):
    r = labelled.get("/v1/risk", params={"label": "rack"})
    assert r.status_code == 422
    body = r.json()
    assert body["detail"][0]["loc"] == ["query", "label", 0]
    assert body["message"] == ("query parameter 'label.0': label 'rack' is not KEY=VALUE "
                               "(e.g. label=rack=r12)")


def test_risk_paging_follows_next(labelled):
    c = labelled
    seen, url, pages = [], "/v1/risk?limit=2&min_risk=0.2", 0
    while url is not None:
        body = c.get(url).json()
        assert body["total"] == 4
        seen += [n["node"] for n in body["nodes"]]
        url = body["next"]
        pages += 1
    assert seen == ["a1", "b1", "a2", "c1"] and pages == 2
    assert c.get("/v1/risk?limit=2").json()["next"] == "/v1/risk?offset=2&limit=2"
    assert c.get("/v1/risk?limit=2&offset=4").json()["next"] is None
    past = c.get("/v1/risk?offset=50").json()
    assert (past["nodes"], past["total"], past["next"]) == ([], 5, None)


def test_labels_replace_and_validate(labelled):
    c = labelled
    r = c.put("/v1/nodes/a1/labels", json={"labels": {"partition": "spare"}})
    assert r.json() == {"node": "a1", "labels": {"partition": "spare"}}
    assert c.get("/v1/nodes/a1").json()["labels"] == {"partition": "spare"}
    assert c.put("/v1/nodes/a1/labels", json={"labels": {}}).json()["labels"] == {}
    r = c.put("/v1/nodes/a1/labels", json={"labels": {"bad key": "x"}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][:2] == ["body", "labels"]
    r = c.put("/v1/nodes/a1/labels", json={"partition": "x"})
    assert r.status_code == 422 and r.json()["message"].startswith("body field 'labels'")


def test_gpu_by_uuid(client, fleet, store):
    fleet.gpu_score("n1", "GPU-7", 3, 0.4, reasons=["XID 79 twice in 24 h"])
    store.insert_sample_records([GpuSample(
        ts=fleet.T0.replace(tzinfo=UTC), node="n1", gpu_uuid="GPU-7", gpu_index=3,
        pci_bus_id="00000000:3B:00.0", model="NVIDIA H100 80GB HBM3", gpu_temp_c=71.5)])
    body = client.get("/v1/gpus/GPU-7").json()
    tel = body.pop("telemetry")
    assert body == {"gpu_uuid": "GPU-7", "node": "n1", "gpu_index": 3,
                    "model": "NVIDIA H100 80GB HBM3", "risk": 0.4,
                    "reasons": ["XID 79 twice in 24 h"], "scored_at": "2026-03-01T12:00:00Z",
                    "model_id": "m1", "simulated": False}
    assert (tel["gpu_temp_c"], tel["ts"]) == (71.5, "2026-03-01T12:00:00Z")
    r = client.get("/v1/gpus/GPU-none")
    assert r.status_code == 404 and "GPU 'GPU-none' is not known" in r.json()["detail"]


def test_drain_candidates_with_default_cost_model(client, fleet):
    # crash cost 1024 x (1/2 + 0.25) = 768 GPU-h; break-even 24 / 768 = 0.03125
    for node, risk in [("hot", 0.5), ("warm", 0.25), ("cool", 0.03125), ("cold", 0.01)]:
        fleet.node_score(node, risk, reasons=[f"{node} reason"])
    body = client.get("/v1/drain-candidates").json()
    assert body["cost_model"] == {
        "job_gpus": 1024, "checkpoint_interval_h": 1.0, "restart_overhead_h": 0.25,
        "drain_cost_gpu_h": 24.0, "gpus_per_node": 8, "crash_cost_gpu_h": 768.0,
        "break_even_risk": 0.03125}
    assert body["candidates"] == [
        {"node": "hot", "risk": 0.5, "expected_saving_gpu_h": 384.0, "drain_cost_gpu_h": 24.0,
         "net_saving_gpu_h": 360.0, "reasons": ["hot reason"], "top_gpu_uuid": None,
         "scored_at": "2026-03-01T12:00:00Z", "labels": {}, "repeat_offender": None,
         "post_repair_risk": None},
        {"node": "warm", "risk": 0.25, "expected_saving_gpu_h": 192.0,
         "drain_cost_gpu_h": 24.0, "net_saving_gpu_h": 168.0, "reasons": ["warm reason"],
         "top_gpu_uuid": None, "scored_at": "2026-03-01T12:00:00Z", "labels": {},
         "repeat_offender": None, "post_repair_risk": None},
    ]  # 'cool' breaks even exactly: saving == cost is not worth a drain


def test_drain_candidates_cost_model_from_query(client, fleet):
    fleet.node_score("hot", 0.5)
    fleet.node_score("warm", 0.25)
    r = client.get("/v1/drain-candidates",
                   params={"job_gpus": 2048, "drain_cost_gpu_h": 500})
    assert [(c["node"], c["expected_saving_gpu_h"]) for c in r.json()["candidates"]] == [
        ("hot", 768.0)]
    r = client.get("/v1/drain-candidates", params={"checkpoint_interval_h": 0})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "checkpoint_interval_h"]


def test_post_incident_stores_the_contract_record(client, store):
    report = {"ts": "2026-03-01T12:05:00+01:00", "node": "n7", "kind": "failure",
              "cause": "gpu_hbm3_memory", "gpu_uuid": "GPU-3", "xid": 48,
              "note": "DBE during allreduce"}
    r = client.post("/v1/incidents", json=report)
    assert r.status_code == 201
    stored = {"ts": "2026-03-01T11:05:00Z", "node": "n7", "kind": "failure",
              "cause": "gpu_hbm3_memory", "source": "api", "gpu_uuid": "GPU-3",
              "mode": None, "xid": 48, "note": "DBE during allreduce"}
    assert r.json() == {**stored, "created": True}
    again = client.post("/v1/incidents", json=report)
    assert again.status_code == 200 and again.json()["created"] is False
    rows = list_incidents(store)
    assert len(rows) == 1
    assert (rows[0]["node"], rows[0]["cause"], rows[0]["xid"], rows[0]["source"]) == (
        "n7", "gpu_hbm3_memory", 48, "api")


@pytest.mark.parametrize(("change", "field"), [
    ({"cause": "cosmic_rays"}, "cause"),
    ({"kind": "oops"}, "kind"),
    ({"ts": "2026-03-01T14:05:00"}, "ts"),
    ({"ts": "yesterday"}, "ts"),
    ({"node": ""}, "node"),
    ({"node": None}, "node"),
    ({"xid": -1}, "xid"),
    ({"colour": "red"}, "colour"),
])
def test_post_incident_bad_input_is_422_naming_the_field(client, change, field):
    body = {"ts": "2026-03-01T14:05:00Z", "node": "n1", "kind": "failure",
            "cause": "faulty_gpu", **change}
    r = client.post("/v1/incidents", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", field]
    assert r.json()["message"].startswith(f"body field '{field}': ")


def test_naive_time_message_says_the_fix(client):
    r = client.post("/v1/incidents", json={"ts": "2026-03-01T14:05:00", "node": "n1",
                                           "kind": "failure", "cause": "faulty_gpu"})
    assert "add 'Z' or an offset" in r.json()["message"]


def test_alerts_reads_the_alerts_table(client, store):
    assert client.get("/v1/alerts").json() == {"alerts": []}
    t = dt.datetime(2026, 3, 1, 12)
    # the columns the API reads; the alerts engine's table has more
    store.con.execute("INSERT INTO alerts (id, node, state, risk, started_at, resolved_at, "
                      "reasons) VALUES (?, ?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?, ?)",
                      ["a1", "n1", "resolved", 0.8, t, t + dt.timedelta(hours=1), '["HBM"]',
                       "a2", "n2", "firing", 0.9, t + dt.timedelta(hours=2), None, None])
    body = client.get("/v1/alerts").json()
    assert body == {"alerts": [
        {"id": "a2", "node": "n2", "state": "firing", "risk": 0.9,
         "started_at": "2026-03-01T14:00:00Z", "fired_at": None, "resolved_at": None,
         "reasons": [], "top_gpu_uuid": None, "model_id": None, "p_net": None},
        {"id": "a1", "node": "n1", "state": "resolved", "risk": 0.8,
         "started_at": "2026-03-01T12:00:00Z", "fired_at": None,
         "resolved_at": "2026-03-01T13:00:00Z", "reasons": ["HBM"], "top_gpu_uuid": None,
         "model_id": None, "p_net": None},
    ]}
    assert [a["id"] for a in client.get("/v1/alerts?state=firing").json()["alerts"]] == ["a2"]
    assert [a["id"] for a in client.get("/v1/alerts?node=n1").json()["alerts"]] == ["a1"]


def test_metrics_keeps_the_node_risk_gauge(client, fleet):
    fleet.node_score("n1", 0.25)
    text = client.get("/metrics").text
    assert 'fleetcare_node_failure_risk{node="n1"} 0.25' in text
    assert "fleetcare_node_network_risk{" not in text  # no model with a network head


def test_metrics_export_the_network_heads_risk_of_the_newest_run(client, fleet, store):
    """For Prometheus' FleetcareNodeNetworkRisk: the head's probability of each node in the
    newest run and the threshold its model names (an older run's rows are not shown)."""
    t0 = fleet.T0 - dt.timedelta(minutes=5)
    fleet.model("prior-x", metrics={"threshold": 0.74, "network_head": {"threshold": 0.052}})
    for ts, p in ((t0, 0.9), (fleet.T0, 0.081)):
        fleet.node_score("n1", 0.09, ts=ts, model_id="prior-x")
        store.con.execute("INSERT INTO node_network_scores VALUES (?, 'n1', ?, 'prior-x')",
                          [ts, p]).fetchall()
    text = client.get("/metrics").text
    assert 'fleetcare_node_network_risk{node="n1"} 0.081\n' in text
    assert "fleetcare_network_alarm_threshold 0.052\n" in text


def test_metrics_export_the_alarm_point_of_the_newest_runs_model(client, fleet, store):
    """For Prometheus' FleetcareNodeRiskHigh: the risk at which the model of the newest
    run alarms and how long it must hold (the registry's metrics); none without a point."""
    def point(text: str) -> tuple[str | None, str | None]:
        got = dict(line.split(" ") for line in text.splitlines()
                   if line.startswith(("fleetcare_alarm_threshold ",
                                       "fleetcare_alarm_hold_seconds ")))
        return got.get("fleetcare_alarm_threshold"), got.get("fleetcare_alarm_hold_seconds")

    fleet.node_score("n1", 0.25)  # model m1: not in the registry
    text = client.get("/metrics").text
    assert "# TYPE fleetcare_alarm_threshold gauge" in text and point(text) == (None, None)
    fleet.model("fleet-y", metrics={"threshold": 0.3}, is_current=False)
    fleet.model("prior-x", metrics={"threshold": 0.74, "hold_h": 1.0}, is_current=False)
    fleet.model("plain", metrics={"pr_auc": 0.3}, is_current=False)
    fleet.model("broken", metrics={"threshold": "high", "hold_h": [1]}, is_current=False)
    fleet.model("z-current", metrics={"threshold": 0.5, "hold_h": 2.0}, is_current=True)
    fleet.node_score("n1", 0.5, ts=fleet.T0 - dt.timedelta(minutes=5), model_id="fleet-y")
    fleet.node_score("n1", 0.8, ts=fleet.T0 + dt.timedelta(minutes=5), model_id="prior-x")
    assert point(client.get("/metrics").text) == ("0.74", "3600.0")
    fleet.node_score("n1", 0.5, ts=fleet.T0 + dt.timedelta(minutes=10), model_id="fleet-y")
    assert point(client.get("/metrics").text) == ("0.3", "0.0")
    for model_id, minutes in (("plain", 15), ("broken", 20)):  # no point, a bad one
        fleet.node_score("n1", 0.5, ts=fleet.T0 + dt.timedelta(minutes=minutes),
                         model_id=model_id)
        r = client.get("/metrics")
        assert r.status_code == 200 and point(r.text) == (None, None)
        assert 'fleetcare_node_failure_risk{node="n1"} 0.5' in r.text
    # two models scored the newest time (a promotion while telemetry stalled): the current
    at = fleet.T0 + dt.timedelta(minutes=25)
    fleet.node_score("n1", 0.5, ts=at, model_id="prior-x")
    fleet.node_score("n2", 0.5, ts=at, model_id="z-current")
    assert point(client.get("/metrics").text) == ("0.5", "7200.0")


def test_an_unknown_query_parameter_is_named_not_ignored(client):
    r = client.get("/v1/risk", params={"limt": "5"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "limt"]
    assert "GET /v1/risk takes: gpu_model, label, limit, min_risk, offset, partition" in (
        r.json()["message"])
    assert client.get("/v1/risk", params={"limit": "5"}).status_code == 200
    assert client.get("/healthz", params={"verbose": "1"}).status_code == 422


def test_one_meaning_of_latest_score_for_api_metrics_and_drains(client, fleet, store):
    """Issue 11: /v1/drain-candidates and the drain controller disagreed on the latest
    score. A node missing from the last three scoring runs drops out of every reader."""
    from fleetcare.api.drains import DrainController
    from tests.api.test_drains_controller import FakeDrainer

    t = fleet.T0
    fleet.node_score("gone", 0.99, ts=t)                      # stopped reporting after run 1
    for k in range(4):
        fleet.node_score("here", 0.9, ts=t + dt.timedelta(minutes=k))
    assert names(client.get("/v1/risk")) == ["here"]
    cands = client.get("/v1/drain-candidates").json()["candidates"]
    assert [n["node"] for n in cands] == ["here"]
    assert 'node="gone"' not in client.get("/metrics").text
    assert 'node="here"' in client.get("/metrics").text
    report = DrainController(store, FakeDrainer(["here", "gone"]),
                             clock=lambda: (t + dt.timedelta(minutes=5)).replace(
                                 tzinfo=UTC).timestamp()).run_once()
    assert report.by_action("drain") == ["here"] and report.fleet_size == 1
    # the node's own page still shows its last score, with its time
    detail = client.get("/v1/nodes/gone").json()
    assert detail["risk"] == 0.99 and detail["scored_at"] == t.isoformat() + "Z"


def _incidents(store, rows):
    from fleetcare.collectors.contract import Incident

    t0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)  # conftest T0
    store.insert_incidents([
        Incident(ts=t0 + dt.timedelta(days=d), node=n, kind=k,
                 cause="faulty_gpu" if k == "failure" else "repair", source="test",
                 gpu_uuid=g) for d, n, k, g in rows])


def test_repeat_offenders_endpoint_and_in_drain_candidates(client, fleet, store):
    fleet.node_score("hot", 0.5)
    fleet.node_score("back", 0.01)  # below break-even on its own
    _incidents(store, [(-20, "hot", "failure", "GPU-1"), (-3, "hot", "failure", "GPU-1"),
                       (-25, "back", "failure", None), (-6, "back", "failure", None),
                       (-5, "back", "repair", None), (-40, "once", "failure", None)])
    body = client.get("/v1/repeat-offenders").json()
    assert (body["failures"], body["days"], body["at"]) == (2, 30, "2026-03-01T12:01:30Z")
    got = {o["node"]: o for o in body["offenders"]}
    assert sorted(got) == ["back", "hot"]
    assert got["hot"]["suggestion"] == "RMA / replace the GPU"
    assert got["hot"]["why"] == "2 failures blamed GPU GPU-1"
    assert not got["hot"]["repaired_since"] and got["back"]["repaired_since"]
    assert got["back"]["suggestion"] == "burn-in before large jobs"
    assert 0 < got["back"]["risk_7d"] < 1 and got["back"]["reasons"]
    assert client.get("/v1/repeat-offenders", params={"failures": 3}).json()["offenders"] == []
    assert client.get("/v1/repeat-offenders", params={"days": 0}).status_code == 422
    cands = {c["node"]: c for c in client.get("/v1/drain-candidates").json()["candidates"]}
    assert cands["hot"]["repeat_offender"]["suggestion"] == "RMA / replace the GPU"
    assert cands["hot"]["post_repair_risk"] is None  # not repaired
    assert "back" not in cands  # post-repair risk over 24 h 0.017 < break-even 0.031
    # back from repair 5 days ago: decided on max(0.01, post-repair risk over 24 h)
    from fleetcare.models.offenders import post_repair_risk

    expect = post_repair_risk(got["back"]["risk_7d"], 24.0)
    assert 10 / 768 < expect  # a cheaper drain: break-even 0.013, between the two risks
    cands = {c["node"]: c for c in client.get(
        "/v1/drain-candidates", params={"drain_cost_gpu_h": 10}).json()["candidates"]}
    assert cands["back"]["risk"] == 0.01
    assert cands["back"]["post_repair_risk"] == pytest.approx(expect)
    assert cands["back"]["expected_saving_gpu_h"] == pytest.approx(expect * 768)
    assert list(cands) == ["hot", "back"]  # highest net saving first
