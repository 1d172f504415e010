"""deploy/grafana/fleetcare.json: every PromQL query in the dashboard returns data from a
real Prometheus (Debian's) scraping a real fleetcare ``/metrics`` every second, over a
real DuckDB store holding scores, drains, alerts and telemetry landed by the real ingest
worker; the variables' ``label_values`` queries find values too.

No Grafana server runs here: none can be installed from the registries these machines
reach (deploy/grafana/README.md says why), so the dashboard's own shape is checked here:
schema version, the datasource variable on every panel and query, unique ids, panels
inside the 24-column grid without overlap, and every ``$variable`` defined.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetcare.api.alerts import AlertEngine, AlertsConfig
from fleetcare.api.drains import DrainController, NodeState
from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, GpuSample
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer
from fleetcare.pipeline.ingest_worker import IngestWorker

from . import daemons

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "fleetcare.json"
RULES = ROOT / "deploy" / "prometheus"
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
RISKS = {"n01": 0.93, "n02": 0.85, "n03": 0.61, "n04": 0.55, "n05": 0.31, "n06": 0.12,
         "n07": 0.04, "n08": 0.01}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(d) for t in p.get("targets", [])]


def variables(d: dict[str, Any], job: str) -> dict[str, str]:
    """Each variable's value in the test: job -> the scrape job, All -> its allValue."""
    out = dict(BUILTINS)
    for v in d["templating"]["list"]:
        value = v.get("current", {}).get("value")
        if v["name"] == "job":
            value = job
        elif value in (["$__all"], "$__all"):
            value = v["allValue"]
        out[v["name"]] = value if isinstance(value, str) else ""
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"${name} in {expr!r} is not a dashboard variable"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


# -- the dashboard's shape -----------------------------------------------------------------------
def test_dashboard_is_a_grafana_dashboard_over_a_prometheus_variable() -> None:
    d = load()
    assert d["schemaVersion"] >= 36 and d["uid"] == "fleetcare-overview"
    ds = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in ds] == [("datasource", "prometheus")]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for p in panels(d):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
    values = variables(d, "fleetcare")
    for title, expr in queries(d):
        assert "$" not in substitute(expr, values), title
        substitute(title, values)  # variables in titles are defined too
    topics = " ".join(expr for _, expr in queries(d))
    for metric in ("fleetcare_node_failure_risk", "fleetcare_drains_held",
                   "fleetcare_drains_overdue", "fleetcare_drain_actions_total",
                   "fleetcare_alerts", "fleetcare_latest_telemetry_timestamp_seconds",
                   "fleetcare_latest_score_timestamp_seconds", "topk("):
        assert metric in topics, f"the dashboard shows nothing of {metric}"


# -- every query against a real Prometheus ------------------------------------------------------
class InMemoryDrainer:
    """A scheduler that obeys (Slurm's own drains are tested in test_drains_slurm.py)."""

    name = "slurm"

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}

    def state(self, node: str) -> NodeState:
        return self.nodes.get(node, NodeState(node, "idle"))

    def drain(self, node: str, reason: str) -> None:
        self.nodes[node] = NodeState(node, "drained", reason, "IDLE+DRAIN")

    def resume(self, node: str, reason: str) -> None:
        self.nodes[node] = NodeState(node, "idle")


def _batches(now: dt.datetime) -> list[Batch]:
    return [Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=ts, samples=[
        GpuSample(ts=ts, node=node, gpu_uuid=f"GPU-{node}-{i}", gpu_index=i,
                  pci_bus_id=f"0000:{i:02x}:00.0", model="H100", gpu_temp_c=50.0)
        for i in range(2)])
        for seq, ts in enumerate(now.replace(tzinfo=dt.UTC) - dt.timedelta(seconds=s)
                                 for s in (30, 20, 10))
        for node in ("n01", "n02")]


def _query(url: str, expr: str) -> list[Any]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _series(url: str, selector: str) -> list[dict[str, str]]:
    q = urllib.parse.urlencode({"match[]": selector})
    with urllib.request.urlopen(f"{url}/api/v1/series?{q}", timeout=10) as r:
        return json.load(r)["data"]


def test_every_query_returns_data_from_a_real_prometheus(store, fleet, serve_app,
                                                         tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    # the runs' model, registered with its operating point (fleetcare_alarm_threshold);
    # not current, so the alert engine below keeps its configured rule
    fleet.model("m1", metrics={"threshold": 0.74, "hold_h": 1.0}, is_current=False)
    for node, risk in RISKS.items():
        fleet.node_score(node, risk, ts=now, reasons=["GPU 3: HBM ECC errors rising"])
    report = DrainController(store, InMemoryDrainer(), dry_run=False).run_once(now)
    assert report.by_action("drain") == ["n01"]  # the breaker: 1 drain per hour for 8 nodes
    assert AlertEngine.from_config(store, AlertsConfig(for_s=0.0)).evaluate(now) == []
    bus = EmbeddedBus(tmp_path / "bus")
    for b in _batches(now):
        bus.send(b)
    bus.flush()
    worker = IngestWorker(store, EmbeddedConsumer(tmp_path / "bus"), worker_id="serve",
                          poll_timeout_s=0.2, flush_interval_s=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        client = serve_app(store, ingest=worker.families)
        deadline = time.monotonic() + 20
        while worker.totals["samples"] < 12:
            assert time.monotonic() < deadline, worker.totals
            time.sleep(0.1)
        assert client.get("/healthz").json()["latest_telemetry"] is not None
        target = client.base_url.netloc.decode()
        config = (
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES / 'fleetcare-rules.yml'}', "
            f"'{RULES / 'fleetcare-risk-rules.yml'}']\n"
            "scrape_configs:\n"
            f"  - job_name: fleetcare\n    static_configs: [{{targets: ['{target}']}}]\n")
        with daemons.prometheus(config, tmp_path / "prometheus") as url:
            _check_every_query(url)
    finally:
        worker.stop()
        thread.join(10)


def _check_every_query(url: str) -> None:
    d = load()
    values = variables(d, "fleetcare")
    todo = {substitute(expr, values): title for title, expr in queries(d)}
    assert len(todo) >= 20
    # rate() and increase() over [1m] need a few scrapes, ALERTS a rule evaluation
    deadline = time.monotonic() + 30
    while True:
        todo = {e: t for e, t in todo.items() if not _query(url, e)}
        if not todo or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert todo == {}, f"queries without data: {todo}"
    # the node table shows the riskiest node first, with its risk
    top = _query(url, substitute('topk(20, fleetcare_node_failure_risk{job=~"$job", '
                                 'node=~"$node"})', values))
    assert max((float(r["value"][1]), r["metric"]["node"]) for r in top) == (0.93, "n01")
    assert _query(url, 'fleetcare_alerts{state="firing"}')[0]["value"][1] == "4"
    # the variables' label_values() queries find the job and the nodes
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert m, v["query"]
        found = {s[m.group(2)] for s in _series(url, substitute(m.group(1), values))}
        assert found == ({"fleetcare"} if v["name"] == "job" else set(RISKS)), v["name"]
