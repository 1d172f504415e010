"""The API over a real HTTP server and a real DuckDB file, asserting exact bodies."""

from __future__ import annotations

import datetime as dt
import json
import math
import socket

import pytest

from fleetcare.api.app import create_app
from fleetcare.api.server import start_server_thread
from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline.schema import SAMPLE_COLUMNS

UTC = dt.UTC


def _no_constants(name):
    raise AssertionError(f"response JSON contains {name}, which is not JSON")


def test_healthz_empty_database(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "db": "ok", "latest_telemetry": None,
                        "latest_score": None, "score_age_s": None}


def test_healthz_reports_newest_telemetry_and_score(client, store, fleet):
    fleet.node_score("n1", 0.5, ts=fleet.T0)
    fleet.node_score("n2", 0.5, ts=fleet.T0 - dt.timedelta(hours=1))
    store.insert_sample_records([GpuSample(
        ts=dt.datetime(2026, 3, 1, 12, 0, 30, 250000, tzinfo=UTC), node="n1",
        gpu_uuid="GPU-1", gpu_index=0, pci_bus_id="00000000:3B:00.0", model="H100")])
    assert client.get("/healthz").json() == {
        "status": "ok", "db": "ok", "latest_telemetry": "2026-03-01T12:00:30.250000Z",
        "latest_score": "2026-03-01T12:00:00Z", "score_age_s": 90.0,
    }


def test_healthz_without_score_tables(tmp_path, serve_app):
    from fleetcare.pipeline.store import Store

    with Store(tmp_path / "fresh.duckdb") as bare:
        c = serve_app(bare)
        assert c.get("/v1/risk").json() == {"nodes": [], "simulated": False, "scored_at": None,
                                            "total": 0, "next": None}
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/v1/model").status_code == 404
        assert c.get("/metrics").status_code == 200


def test_risk_ranks_latest_score_per_node(client, fleet):
    t0 = fleet.T0
    fleet.node_score("a", 0.9, ts=t0 - dt.timedelta(hours=1), reasons=["old"])
    fleet.node_score("a", 0.2, ts=t0, reasons=["ECC corrected errors 40x the fleet"],
                     top_gpu_uuid="GPU-a3", model_id="m2")
    fleet.node_score("b", 0.7, ts=t0 - dt.timedelta(minutes=5),
                     reasons=["XID 79 twice in 24 h", "PCIe link downtrained to x8"],
                     top_gpu_uuid="GPU-b0")
    fleet.node_score("c", 0.05, ts=t0)
    r = client.get("/v1/risk")
    assert r.status_code == 200
    assert r.json() == {
        "nodes": [
            {"node": "b", "risk": 0.7,
             "reasons": ["XID 79 twice in 24 h", "PCIe link downtrained to x8"],
             "top_gpu_uuid": "GPU-b0", "scored_at": "2026-03-01T11:55:00Z", "model_id": "m1",
             "labels": {}},
            {"node": "a", "risk": 0.2, "reasons": ["ECC corrected errors 40x the fleet"],
             "top_gpu_uuid": "GPU-a3", "scored_at": "2026-03-01T12:00:00Z", "model_id": "m2",
             "labels": {}},
            {"node": "c", "risk": 0.05, "reasons": [], "top_gpu_uuid": None,
             "scored_at": "2026-03-01T12:00:00Z", "model_id": "m1", "labels": {}},
        ],
        "simulated": False,
        "scored_at": "2026-03-01T12:00:00Z",
        "total": 3,
        "next": None,
    }


def test_risk_limit_and_min_risk(client, fleet):
    for i, risk in enumerate([0.1, 0.5, 0.3, 0.9, 0.5]):
        fleet.node_score(f"n{i}", risk)
    names = lambda r: [n["node"] for n in r.json()["nodes"]]  # noqa: E731
    assert names(client.get("/v1/risk", params={"limit": 2})) == ["n3", "n1"]
    assert names(client.get("/v1/risk", params={"min_risk": 0.5})) == ["n3", "n1", "n4"]
    assert names(client.get("/v1/risk", params={"min_risk": 0.3, "limit": 10000})) == [
        "n3", "n1", "n4", "n2"]
    assert names(client.get("/v1/risk", params={"min_risk": 1})) == []


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": 0}, "limit"),
    ({"limit": 10001}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"min_risk": 1.5}, "min_risk"),
    ({"min_risk": -0.1}, "min_risk"),
])
def test_risk_validation_names_the_field(client, params, field):
    r = client.get("/v1/risk", params=params)
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["query", field]]


def test_non_finite_risk_is_null_and_ranked_last(client, fleet, store):
    fleet.node_score("nan", math.nan)
    fleet.node_score("ok", 0.01)
    fleet.node_score("inf", math.inf)
    r = client.get("/v1/risk")
    body = json.loads(r.text, parse_constant=_no_constants)
    assert [(n["node"], n["risk"]) for n in body["nodes"]] == [
        ("ok", 0.01), ("inf", None), ("nan", None)]
    assert [n["node"] for n in client.get("/v1/risk?min_risk=0").json()["nodes"]] == ["ok"]


def test_unknown_node_is_404_with_a_hint(client):
    r = client.get("/v1/nodes/x")
    assert r.status_code == 404
    assert r.json() == {
        "detail": "node 'x' is not known to fleetcare: check the name in GET /v1/risk"}


def _sample(node, uuid, index, ts, **metrics):
    return GpuSample(ts=ts, node=node, gpu_uuid=uuid, gpu_index=index,
                     pci_bus_id=f"00000000:{index:02X}:00.0", model="NVIDIA H100 80GB HBM3",
                     **metrics)


def test_node_detail_has_gpu_scores_and_latest_telemetry(client, fleet, store):
    t0 = fleet.T0
    fleet.node_score("n1", 0.8, reasons=["GPU 1: 12 uncorrectable remapped rows"],
                     top_gpu_uuid="GPU-1")
    fleet.node_score("n2", 0.1)
    fleet.gpu_score("n1", "GPU-1", 1, 0.75, reasons=["12 uncorrectable remapped rows"])
    fleet.gpu_score("n1", "GPU-0", 0, 0.9, ts=t0 - dt.timedelta(hours=1))
    fleet.gpu_score("n1", "GPU-0", 0, 0.02, ts=t0)
    fleet.gpu_score("n2", "GPU-9", 0, 0.5)
    aware = t0.replace(tzinfo=UTC)
    store.insert_sample_records([
        _sample("n1", "GPU-0", 0, aware - dt.timedelta(seconds=10), gpu_temp_c=60.0),
        _sample("n1", "GPU-0", 0, aware + dt.timedelta(microseconds=1), gpu_temp_c=61.5,
                power_w=412.25, sm_clock_mhz=1980, ecc_corrected_volatile=3,
                retired_pages_pending=False, nvlink_up=[True, False, True],
                nvlink_crc_flit=[0, 7, 2**40], clock_event_reasons=0x20),
        _sample("n1", "GPU-1", 1, aware, remapped_rows_uncorrectable=12,
                remapped_rows_failure=True, pcie_link_width=8, pcie_link_width_max=16),
        # A GPU that reports but has no score yet is still listed.
        _sample("n1", "GPU-2", 2, aware, util_gpu_pct=100.0),
    ])
    body = client.get("/v1/nodes/n1").json()
    nulls = dict.fromkeys(SAMPLE_COLUMNS)

    def tel(uuid, index, ts, **kw):
        return {**nulls, "ts": ts, "node": "n1", "gpu_uuid": uuid, "gpu_index": index,
                "pci_bus_id": f"00000000:{index:02X}:00.0",
                "model": "NVIDIA H100 80GB HBM3", **kw}

    assert body == {
        "node": "n1", "risk": 0.8, "reasons": ["GPU 1: 12 uncorrectable remapped rows"],
        "top_gpu_uuid": "GPU-1", "scored_at": "2026-03-01T12:00:00Z", "model_id": "m1",
        "simulated": False, "labels": {},
        "gpus": [
            {"gpu_uuid": "GPU-0", "gpu_index": 0, "model": "NVIDIA H100 80GB HBM3",
             "risk": 0.02, "reasons": [], "scored_at": "2026-03-01T12:00:00Z",
             "telemetry": tel("GPU-0", 0, "2026-03-01T12:00:00.000001Z", gpu_temp_c=61.5,
                              power_w=412.25, sm_clock_mhz=1980, ecc_corrected_volatile=3,
                              retired_pages_pending=False, nvlink_up=[True, False, True],
                              nvlink_crc_flit=[0, 7, 2**40], clock_event_reasons=32)},
            {"gpu_uuid": "GPU-1", "gpu_index": 1, "model": "NVIDIA H100 80GB HBM3",
             "risk": 0.75, "reasons": ["12 uncorrectable remapped rows"],
             "scored_at": "2026-03-01T12:00:00Z",
             "telemetry": tel("GPU-1", 1, "2026-03-01T12:00:00Z",
                              remapped_rows_uncorrectable=12, remapped_rows_failure=True,
                              pcie_link_width=8, pcie_link_width_max=16)},
            {"gpu_uuid": "GPU-2", "gpu_index": 2, "model": "NVIDIA H100 80GB HBM3",
             "risk": None, "reasons": [], "scored_at": None,
             "telemetry": tel("GPU-2", 2, "2026-03-01T12:00:00Z", util_gpu_pct=100.0)},
        ],
        "nics": [],  # no InfiniBand/RoCE port data (tests/api/test_node_nics.py)
    }
    assert list(body["gpus"][0]["telemetry"]) == SAMPLE_COLUMNS


def test_node_known_from_telemetry_only(client, store, fleet):
    store.insert_sample_records([
        _sample("fresh", "GPU-x", 0, fleet.T0.replace(tzinfo=UTC))])
    body = client.get("/v1/nodes/fresh").json()
    assert (body["risk"], body["scored_at"], body["reasons"]) == (None, None, [])
    assert [g["gpu_uuid"] for g in body["gpus"]] == ["GPU-x"]


def test_model_404_then_200(client, fleet):
    r = client.get("/v1/model")
    assert r.status_code == 404
    assert "fleetcare train" in r.json()["detail"]
    fleet.model("old", created_at=fleet.T0 - dt.timedelta(days=1), is_current=False)
    assert client.get("/v1/model").status_code == 404
    fleet.model("m7", horizon_h=24.0, features=["ecc_corrected_rate_24h", "xid79_count_7d"],
                params={"num_leaves": 31}, metrics={"auc": 0.91, "brier": math.nan})
    r = client.get("/v1/model")
    assert r.status_code == 200
    assert r.json() == {
        "model_id": "m7", "created_at": "2026-03-01T12:00:00Z", "origin": "fleet",
        "current_reason": None, "horizon_h": 24.0,
        "features": ["ecc_corrected_rate_24h", "xid79_count_7d"],
        "params": {"num_leaves": 31}, "metrics": {"auc": 0.91, "brier": None},
    }


def test_metrics_exposition(client, fleet):
    assert client.get("/metrics").text == (
        "# HELP fleetcare_node_failure_risk Latest calibrated probability that the node has "
        "a failure incident within the model horizon.\n"
        "# TYPE fleetcare_node_failure_risk gauge\n"
        "# HELP fleetcare_scored_nodes Nodes with a risk score.\n"
        "# TYPE fleetcare_scored_nodes gauge\n"
        "fleetcare_scored_nodes 0\n"
        "# HELP fleetcare_alarm_threshold The node failure risk at which the model of the "
        "newest scoring run alarms (its measured operating point; absent when it names none)."
        "\n"
        "# TYPE fleetcare_alarm_threshold gauge\n"
        "# HELP fleetcare_alarm_hold_seconds How long the risk must hold at the threshold for "
        "the model's alarm (0: at once; absent when it names no threshold).\n"
        "# TYPE fleetcare_alarm_hold_seconds gauge\n"
        "# HELP fleetcare_latest_score_timestamp_seconds Unix time of the newest node score "
        "(absent before the first score).\n"
        "# TYPE fleetcare_latest_score_timestamp_seconds gauge\n"
        "# HELP fleetcare_drains_held Nodes fleetcare has drained and not given back yet, by "
        "scheduler.\n"
        "# TYPE fleetcare_drains_held gauge\n"
        "# HELP fleetcare_drains_overdue Held drains past their review time (cleared by "
        "nobody: they escalate).\n"
        "# TYPE fleetcare_drains_overdue gauge\n"
        "fleetcare_drains_overdue 0\n"
        "# HELP fleetcare_drain_actions_total Real (not dry-run) drain controller actions from "
        "the audit log, by action and result (ok, refused, error, held).\n"
        "# TYPE fleetcare_drain_actions_total counter\n"
        "# HELP fleetcare_drain_last_action_timestamp_seconds Unix time of the newest real "
        "drain controller action (absent before one).\n"
        "# TYPE fleetcare_drain_last_action_timestamp_seconds gauge\n"
        "# HELP fleetcare_latest_telemetry_timestamp_seconds Unix time of the newest "
        "telemetry sample stored (absent before the first); time() minus this is the ingest "
        "lag.\n"
        "# TYPE fleetcare_latest_telemetry_timestamp_seconds gauge\n"
        "# HELP fleetcare_alerts Open node-risk alerts of fleetcare's alert engine, by state "
        "(pending, firing).\n"
        "# TYPE fleetcare_alerts gauge\n"
        'fleetcare_alerts{state="pending"} 0\n'
        'fleetcare_alerts{state="firing"} 0\n'
        "# HELP fleetcare_alert_messages Alert messages in the outbox, by state (pending: the "
        "receiver has not taken it yet; delivered; dead: given up).\n"
        "# TYPE fleetcare_alert_messages gauge\n"
        'fleetcare_alert_messages{state="pending"} 0\n'
        'fleetcare_alert_messages{state="delivered"} 0\n'
        'fleetcare_alert_messages{state="dead"} 0\n'
    )
    fleet.node_score("gpu-a1", 0.25, ts=fleet.T0 - dt.timedelta(hours=1))
    fleet.node_score("gpu-a1", 0.125)
    fleet.node_score('we"ird\\node', 0.5, ts=fleet.T0 + dt.timedelta(microseconds=500000))
    fleet.node_score("nan-node", math.nan)
    r = client.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    lines = [ln for ln in r.text.splitlines() if not ln.startswith("#")]
    assert lines == [
        'fleetcare_node_failure_risk{node="we\\"ird\\\\node"} 0.5',
        'fleetcare_node_failure_risk{node="gpu-a1"} 0.125',
        'fleetcare_node_failure_risk{node="nan-node"} NaN',
        "fleetcare_scored_nodes 3",
        "fleetcare_latest_score_timestamp_seconds 1772366400.5",
        "fleetcare_drains_overdue 0",
        'fleetcare_alerts{state="pending"} 0',
        'fleetcare_alerts{state="firing"} 0',
        'fleetcare_alert_messages{state="pending"} 0',
        'fleetcare_alert_messages{state="delivered"} 0',
        'fleetcare_alert_messages{state="dead"} 0',
    ]


def test_metrics_show_drains_held_and_done(client, store, clock):
    from fleetcare.api.drains.audit import AuditLog, AuditRow, Drain

    now = dt.datetime.fromtimestamp(clock(), dt.UTC).replace(tzinfo=None)
    log = AuditLog(store)
    hour = dt.timedelta(hours=1)

    def row(node, action, result, *, dry_run=False, ago=hour):
        log.record(AuditRow(now - ago, node, action, "fleetcare", "why", 0.9, dry_run, result))

    row("n1", "drain", "ok", ago=30 * hour)
    row("n2", "drain", "ok")
    row("n3", "drain", "error: scontrol: exit 1")
    row("n4", "refuse", "refused: circuit breaker: 10 drain(s) per hour")
    row("n5", "drain", "dry-run", dry_run=True, ago=dt.timedelta(minutes=5))  # not counted
    for node, ago, scheduler in (("n1", 30 * hour, "slurm"), ("n2", hour, "slurm"),
                                 ("n6", 2 * hour, "kubernetes")):
        log.add(Drain(node, now - ago, now - ago + 24 * hour, 0.9, "why", scheduler, None, None))
    log.close("n6", now, "operator")
    lines = [ln for ln in client.get("/metrics").text.splitlines() if "drain" in ln
             and not ln.startswith("#")]
    assert lines == [
        'fleetcare_drains_held{scheduler="slurm"} 2',
        "fleetcare_drains_overdue 1",  # n1: drained 30 h ago, review after 24 h
        'fleetcare_drain_actions_total{action="drain",result="error"} 1',
        'fleetcare_drain_actions_total{action="drain",result="ok"} 2',
        'fleetcare_drain_actions_total{action="refuse",result="refused"} 1',
        f"fleetcare_drain_last_action_timestamp_seconds {clock() - 3600.0!r}",
    ]


def test_metrics_show_alerts_telemetry_and_the_ingest_worker(store, fleet, clock, serve_app):
    from fleetcare.api.alerts import AlertEngine, AlertsConfig, SinkConfig
    from fleetcare.api.alerts.config import Secret
    from fleetcare.collectors.agent_metrics import Family

    fleet.node_score("hot", 0.9)
    fleet.node_score("warm", 0.6)
    fleet.node_score("cool", 0.1)
    store.insert_sample_records([GpuSample(
        ts=dt.datetime(2026, 3, 1, 12, 0, 30, 250000, tzinfo=UTC), node="hot",
        gpu_uuid="GPU-1", gpu_index=0, pci_bus_id="00000000:3B:00.0", model="H100")])
    # firing at once (for 0 s); one message each, waiting for a receiver that is not there
    sink = SinkConfig("am", "alertmanager", Secret("http://127.0.0.1:9/hook"))
    AlertEngine.from_config(store, AlertsConfig(for_s=0.0, sinks=(sink,))).evaluate(clock())
    client = serve_app(store, clock=clock, ingest=lambda: [
        Family("fleetcare_ingest_samples_total", "counter", "GPU samples landed.",
               [({"worker": "serve"}, 12)])])
    text = client.get("/metrics").text
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")
             and ("alert" in ln or "telemetry" in ln or "ingest" in ln)]
    assert lines == [
        "fleetcare_latest_telemetry_timestamp_seconds 1772366430.25",
        'fleetcare_alerts{state="pending"} 0',
        'fleetcare_alerts{state="firing"} 2',
        'fleetcare_alert_messages{state="pending"} 2',
        'fleetcare_alert_messages{state="delivered"} 0',
        'fleetcare_alert_messages{state="dead"} 0',
        'fleetcare_ingest_samples_total{worker="serve"} 12',
    ]
    assert text.endswith("# TYPE fleetcare_ingest_samples_total counter\n"
                         'fleetcare_ingest_samples_total{worker="serve"} 12\n')


def test_dashboard_shows_ranked_nodes_and_simulated_banner(client, fleet, store):
    fleet.node_score("node-<b>", 0.42, reasons=["HBM errors & <rising>"])
    fleet.node_score("quiet", 0.01)
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "SIMULATED DATA" not in page.text
    assert "node-&lt;b&gt;" in page.text and "HBM errors &amp; &lt;rising&gt;" in page.text
    assert page.text.index("node-&lt;b&gt;") < page.text.index("quiet")
    assert "42.0%" in page.text
    assert '<meta http-equiv="refresh"' in page.text
    assert "<script src" not in page.text and "<link" not in page.text  # offline
    store.set_meta("data_source", "simulated")
    assert "SIMULATED DATA" in client.get("/").text
    assert client.get("/v1/risk").json()["simulated"] is True


def test_simulated_flag_can_be_forced(store, serve_app):
    c = serve_app(store, simulated=True)
    assert c.get("/v1/risk").json()["simulated"] is True
    assert "SIMULATED DATA" in c.get("/").text


def test_openapi_and_docs(client):
    docs = client.get("/docs")
    assert docs.status_code == 200
    # offline: Swagger UI comes from this server, never from a CDN
    assert "/static/swagger-ui/swagger-ui-bundle.js" in docs.text
    assert "cdn" not in docs.text.lower()
    js = client.get("/static/swagger-ui/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000
    spec = client.get("/openapi.json").json()
    assert spec["info"]["title"] == "fleetcare"
    assert spec["info"]["version"]
    assert spec["info"]["description"]
    assert {"/healthz", "/v1/risk", "/v1/nodes/{node}", "/v1/model", "/metrics"} <= set(
        spec["paths"])
    schemas = spec["components"]["schemas"]
    assert list(schemas["Telemetry"]["properties"]) == SAMPLE_COLUMNS
    assert {"RiskList", "NodeRisk", "NodeDetail", "GpuDetail", "ModelInfo"} <= set(schemas)
    risk_200 = spec["paths"]["/v1/risk"]["get"]["responses"]["200"]
    assert risk_200["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RiskList"}


def test_start_server_thread_reports_a_taken_port(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"did not start on 127.0.0.1:{port}"):
            start_server_thread(create_app(store), port=port, log_level="critical")


def test_concurrent_reads_while_the_service_writes(client, fleet, store):
    """Requests run on worker threads, each on its own cursor, while ingest writes."""
    from concurrent.futures import ThreadPoolExecutor

    fleet.node_score("n0", 0.5)

    def read(i):
        path = "/v1/risk" if i % 3 else "/v1/nodes/n0"
        return client.get(path).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = pool.map(read, range(60))
        for i in range(1, 30):
            fleet.node_score(f"n{i}", i / 100)
        assert set(statuses) == {200}
    assert len(client.get("/v1/risk", params={"limit": 1000}).json()["nodes"]) == 30


def test_a_warmed_app_does_not_build_its_spec_on_the_first_request(store, monkeypatch):
    """The first request after ``serve`` started built the whole OpenAPI spec (the API
    checks each operation's query parameters against it): 0.2-0.45 s that a scheduler's
    first call waited for. ``serve`` warms the app before it listens."""
    import http.client

    import fastapi.applications

    from fleetcare.api.server import bound_port, warm

    built: list[int] = []
    real = fastapi.applications.get_openapi
    monkeypatch.setattr(fastapi.applications, "get_openapi",
                        lambda *a, **k: built.append(1) or real(*a, **k))

    def first_request(app) -> int:
        server, thread = start_server_thread(app)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", bound_port(server), timeout=30)
            conn.request("GET", "/v1/risk?limit=5")
            status = conn.getresponse().status
            conn.close()
            return status
        finally:
            server.should_exit = True
            thread.join(10)

    cold = create_app(store, auth=False)
    assert first_request(cold) == 200 and len(built) == 1  # built by the request
    warmed = create_app(store, auth=False)
    warm(warmed)
    assert len(built) == 2
    assert first_request(warmed) == 200 and len(built) == 2  # not again
