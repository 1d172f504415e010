"""The in-memory latest scores behind GET /v1/risk (``fleetcare.api.latest_scores``) and
the bounded node page: real HTTP server, real DuckDB file.

- /v1/risk from the snapshot equals the database query (``queries.risk_page``) for the
  same rows, whatever the filters, paging and ties;
- a scoring run swaps the snapshot when it commits (the scorer builds it, not the next
  request); a request while a run is being written sees the previous complete run;
- the node page of a scored node reads its GPUs' latest runs and recent telemetry only,
  and a node that stopped reporting still shows its last scores.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import httpx
import pyarrow as pa
import pytest

from fleetcare.api import queries
from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.collectors.contract import GpuSample
from fleetcare.models import registry, scoring
from fleetcare.pipeline.store import Store

from .conftest import T0

UTC = dt.UTC


def minutes(k: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=k)


def run(store: Store, ts: dt.datetime, nodes: dict[str, float], *,
        model_id: str = "m1", gpu_model: str = "NVIDIA H100 80GB HBM3") -> None:
    """One scoring run through the scorer's own write: one GPU per node."""
    names = sorted(nodes)
    gpu = pa.table({
        "ts": pa.array([ts] * len(names), pa.timestamp("us")), "node": names,
        "gpu_uuid": [f"GPU-{n}-0" for n in names], "gpu_index": pa.array([0] * len(names)),
        "model": [gpu_model] * len(names), "risk": [nodes[n] for n in names],
        "reasons": [json.dumps([f"{n} at {ts:%H:%M}"]) for n in names],
        "model_id": [model_id] * len(names)}, schema=scoring.GPU_SCHEMA)
    node = pa.table({
        "ts": pa.array([ts] * len(names), pa.timestamp("us")), "node": names,
        "risk": [nodes[n] for n in names],
        "reasons": [json.dumps([f"GPU 0: {n} at {ts:%H:%M}"]) for n in names],
        "top_gpu_uuid": [f"GPU-{n}-0" for n in names],
        "model_id": [model_id] * len(names)}, schema=scoring.NODE_SCHEMA)
    scoring.write_run(store, ts, model_id, gpu, node)


def risk(client: httpx.Client, **params: object) -> dict:
    r = client.get("/v1/risk", params=params)
    assert r.status_code == 200, r.text
    return r.json()


# -- equal to the database query ---------------------------------------------------------------
@pytest.fixture
def ranked(store, client):
    """Four runs: ties in risk, a NaN risk, a node gone after the first run, a node only
    in the newest run, labels and two GPU models."""
    run(store, minutes(0), {"gone": 0.99, "a": 0.5, "b": 0.5, "c": 0.1})
    run(store, minutes(1), {"a": 0.6, "b": 0.4, "c": 0.2, "d": 0.4},
        gpu_model="NVIDIA A100-SXM4-80GB")
    run(store, minutes(2), {"a": 0.3, "b": 0.3, "c": float("nan"), "d": 0.4})
    run(store, minutes(3), {"a": 0.3, "e": 0.3, "f": 0.0})
    for node, part in [("a", "train-a"), ("b", "train-a"), ("d", "train-b"),
                       ("gone", "train-a")]:
        r = client.put(f"/v1/nodes/{node}/labels",
                       json={"labels": {"partition": part, "rack": f"r-{node}"}})
        assert r.status_code == 200
    return client


CASES = [
    {}, {"limit": 2}, {"limit": 2, "offset": 2}, {"limit": 3, "offset": 5},
    {"offset": 50}, {"min_risk": 0.3}, {"min_risk": 0.0}, {"min_risk": 0.31, "limit": 1},
    {"partition": "train-a"}, {"label": "rack=r-d"}, {"partition": "nope"},
    {"gpu_model": "a100"}, {"gpu_model": "H100", "partition": "train-a", "limit": 1},
    {"gpu_model": "h100", "min_risk": 0.3, "offset": 1},
]


@pytest.mark.parametrize("params", CASES, ids=[json.dumps(c) for c in CASES])
def test_risk_from_memory_equals_the_database_query(ranked, store, params):
    body = risk(ranked, **params)
    labels = [("partition", params["partition"])] if "partition" in params else []
    if "label" in params:
        labels.append(tuple(params["label"].split("=", 1)))
    cur = store.cursor()
    tables = queries.existing_tables(cur)
    want, total = queries.risk_page(
        cur, tables, limit=params.get("limit", 100), offset=params.get("offset", 0),
        min_risk=params.get("min_risk"), labels=labels, gpu_model=params.get("gpu_model"))
    assert body["nodes"] == want
    assert body["total"] == total
    assert body["scored_at"] == queries.iso_z(queries.latest_score_ts(cur, tables))


def test_the_ranking_as_the_scorer_defines_latest(ranked):
    """Spelled out once: newest row per node within the last three runs, highest risk
    first, ties by node, unscorable (NaN) last; 'gone' dropped out after three runs."""
    body = risk(ranked)
    assert [(n["node"], n["risk"], n["scored_at"]) for n in body["nodes"]] == [
        ("d", 0.4, "2026-03-01T12:02:00Z"), ("a", 0.3, "2026-03-01T12:03:00Z"),
        ("b", 0.3, "2026-03-01T12:02:00Z"), ("e", 0.3, "2026-03-01T12:03:00Z"),
        ("f", 0.0, "2026-03-01T12:03:00Z"), ("c", None, "2026-03-01T12:02:00Z")]
    assert body["nodes"][0]["labels"] == {"partition": "train-b", "rack": "r-d"}
    assert body["scored_at"] == "2026-03-01T12:03:00Z"


def test_drain_candidates_from_memory_equal_the_database_query(ranked, store):
    body = ranked.get("/v1/drain-candidates", params={"drain_cost_gpu_h": 1.0}).json()
    cur = store.cursor()
    floor = body["cost_model"]["break_even_risk"]
    want, _ = queries.risk_page(cur, queries.existing_tables(cur), min_risk=floor)
    assert [c["node"] for c in body["candidates"]] == [n["node"] for n in want] != []


# -- swapped after a scoring run, never half-written -------------------------------------------
class PausingStore(Store):
    """A store whose write transactions stop before COMMIT until ``go`` is set, after
    setting ``written``: a request can be made while a scoring run is half-written."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pause = False
        self.written = threading.Event()
        self.go = threading.Event()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with super().transaction() as cur:
            yield cur
            if self.pause:
                self.written.set()
                assert self.go.wait(30), "the test never let the write commit"


@pytest.fixture
def paused(tmp_path) -> Iterator[PausingStore]:
    s = PausingStore(tmp_path / "fleet.duckdb")
    scoring.ensure_schema(s)
    registry.ensure_schema(s)
    yield s
    s.go.set()
    s.close()


def serve(store: Store, running: list) -> tuple[httpx.Client, object]:
    """A live server of a new app over ``store`` (auth off), and the app."""
    app = create_app(store, auth=False, freshness_s=0.0)
    server, thread = start_server_thread(app)
    client = httpx.Client(base_url=f"http://127.0.0.1:{bound_port(server)}", timeout=10)
    running.append((server, thread, client))
    return client, app


@pytest.fixture
def servers() -> Iterator[list]:
    running: list = []
    yield running
    for server, thread, client in running:
        client.close()
        server.should_exit = True
        thread.join(10)


def test_a_scoring_run_swaps_the_snapshot_when_it_commits(store, servers):
    run(store, minutes(0), {"a": 0.2, "b": 0.1})
    client, app = serve(store, servers)
    latest = app.state.ctx.latest
    assert risk(client)["scored_at"] == "2026-03-01T12:00:00Z"
    builds = latest.builds

    run(store, minutes(1), {"a": 0.1, "b": 0.7})
    # the scorer's thread rebuilt it as the run committed, before any request
    assert latest.builds == builds + 1
    assert latest.snapshot.scored_at == minutes(1)
    body = risk(client)
    assert [(n["node"], n["risk"]) for n in body["nodes"]] == [("b", 0.7), ("a", 0.1)]
    assert body["scored_at"] == "2026-03-01T12:01:00Z"
    assert latest.builds == builds + 1  # the request found it current


def test_rescoring_the_same_ts_swaps_the_snapshot_too(store, client):
    """No new telemetry between two runs: the second rewrites the first's rows in place
    (same ts, same row counts); the scorer's own write still swaps the snapshot."""
    run(store, minutes(0), {"a": 0.2, "b": 0.1})
    assert [n["risk"] for n in risk(client)["nodes"]] == [0.2, 0.1]
    run(store, minutes(0), {"a": 0.3, "b": 0.6})
    assert [(n["node"], n["risk"]) for n in risk(client)["nodes"]] == [("b", 0.6), ("a", 0.3)]


def test_rows_written_by_other_means_are_seen_by_the_next_request(client, fleet):
    """The behaviour before the snapshot: score rows written by hand show at once."""
    fleet.node_score("a", 0.2)
    assert [n["node"] for n in risk(client)["nodes"]] == ["a"]
    fleet.node_score("b", 0.3)
    assert [n["node"] for n in risk(client)["nodes"]] == ["b", "a"]


def test_a_request_during_a_scoring_run_sees_the_previous_complete_run(paused, servers):
    run(paused, minutes(0), {f"n{i}": 0.1 for i in range(6)})
    client, app = serve(paused, servers)
    paused.pause = True
    writer = threading.Thread(target=run, args=(paused, minutes(1),
                                                {f"n{i}": 0.9 for i in range(6)}))
    writer.start()
    assert paused.written.wait(30)  # every row of run 2 inserted, not committed
    body = risk(client)
    assert {(n["risk"], n["scored_at"]) for n in body["nodes"]} == {
        (0.1, "2026-03-01T12:00:00Z")}
    assert body["total"] == 6
    assert client.get("/v1/nodes/n3").json()["gpus"][0]["risk"] == 0.1
    # a snapshot built while the run is being written (a service starting) is run 1 too
    late, _ = serve(paused, servers)
    assert {n["risk"] for n in risk(late)["nodes"]} == {0.1}

    paused.pause = False
    paused.go.set()
    writer.join(30)
    for c in (client, late):
        body = risk(c)
        assert {(n["risk"], n["scored_at"]) for n in body["nodes"]} == {
            (0.9, "2026-03-01T12:01:00Z")}
        assert body["total"] == 6


# -- the node page ---------------------------------------------------------------------------
def sample(node: str, uuid: str, index: int, ts: dt.datetime, temp: float) -> GpuSample:
    return GpuSample(ts=ts.replace(tzinfo=UTC), node=node, gpu_uuid=uuid, gpu_index=index,
                     pci_bus_id=f"00000000:{index:02x}:00.0", model="NVIDIA H100 80GB HBM3",
                     gpu_temp_c=temp)


def gpu_rows(store: Store, ts: dt.datetime, rows: list[tuple[str, str, int, float]]) -> None:
    """gpu_scores rows (node, uuid, index, risk) at ts, as the scorer writes them."""
    for node, uuid, index, p in rows:
        store.con.execute("INSERT INTO gpu_scores VALUES (?, ?, ?, ?, 'NVIDIA H100 80GB "
                          "HBM3', ?, '[]', 'm1')", [ts, node, uuid, index, p]).fetchall()


def test_node_page_of_a_scored_node_reads_its_latest_runs_and_recent_telemetry(
        client, fleet, store):
    fleet.node_score("gone", 0.8, ts=minutes(0), reasons=["last words"])
    gpu_rows(store, minutes(0), [("gone", "GPU-g", 0, 0.8), ("live", "GPU-old", 7, 0.5),
                                 ("live", "GPU-a", 0, 0.2)])
    for k in (1, 2, 3):
        fleet.node_score("live", 0.1 * k, ts=minutes(k))
        gpu_rows(store, minutes(k), [("live", "GPU-a", 0, 0.1 * k),
                                     ("live", "GPU-quiet", 1, 0.01)])
    store.insert_sample_records([
        sample("live", "GPU-a", 0, minutes(-30), 60.0),
        sample("live", "GPU-a", 0, minutes(3), 61.0),
        sample("live", "GPU-quiet", 1, minutes(-180), 40.0),   # scored, went quiet 3 h ago
        sample("live", "GPU-old", 7, minutes(-120), 50.0),     # left the node: no latest score
        sample("gone", "GPU-g", 0, minutes(-240), 70.0)])

    live = client.get("/v1/nodes/live").json()
    assert (live["risk"], live["scored_at"]) == (pytest.approx(0.3),
                                                 "2026-03-01T12:03:00Z")
    assert [(g["gpu_uuid"], g["risk"], g["scored_at"], g["telemetry"]["gpu_temp_c"],
             g["telemetry"]["ts"]) for g in live["gpus"]] == [
        ("GPU-a", pytest.approx(0.3), "2026-03-01T12:03:00Z", 61.0, "2026-03-01T12:03:00Z"),
        ("GPU-quiet", 0.01, "2026-03-01T12:03:00Z", 40.0, "2026-03-01T09:00:00Z")]

    # stopped reporting: its last score and GPUs from its whole history, as before
    gone = client.get("/v1/nodes/gone").json()
    assert (gone["risk"], gone["reasons"], gone["scored_at"]) == (
        0.8, ["last words"], "2026-03-01T12:00:00Z")
    assert [(g["gpu_uuid"], g["risk"], g["telemetry"]["gpu_temp_c"])
            for g in gone["gpus"]] == [("GPU-g", 0.8, 70.0)]
    assert client.get("/v1/nodes/nobody").status_code == 404
