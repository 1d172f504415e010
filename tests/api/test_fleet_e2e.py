"""The fleet service in its production shapes, end to end with real parts (issue 11 §4).

Three agent processes (sim backend, 16 nodes in all) stream into the real Kafka broker.

- one host: ``fleetcare serve --bus kafka://`` consumes in-process; ``/v1/risk`` lists all
  16 nodes with scores newer than two scoring intervals; ``serve`` is SIGKILLed mid-stream
  and restarted; at the end every sample on the topic is in the database exactly once.
- scale-out: two ``fleetcare ingest --lake`` workers (one consumer group) and ``fleetcare
  serve --lake``; one worker is SIGKILLed mid-stream (the other takes its partitions);
  the same checks, the service's rollups counting every sample once.

What "every sample" means is read back from the topic itself with a consumer group of
its own, so the agents' at-least-once redeliveries are taken into account.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import httpx
import pytest

from fleetcare.collectors.contract import decode_batch
from fleetcare.collectors.transport import TELEMETRY_TOPIC
from fleetcare.collectors.transport.kafka import KafkaConsumerSource
from tests.pipeline.test_ingest_worker import committed, sigkill
from tests.services import KAFKA_URL as URL

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
AGENTS = (("a", 6), ("b", 5), ("c", 5))  # 16 nodes
SCORE_EVERY_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    """The agents, the processes under test, and their logs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.prefix = f"e2e-{uuid.uuid4().hex[:8]}."
        self.group = f"{self.prefix}ingest"
        self.port = _free_port()
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, name: str, *args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - the process keeps it
        proc = subprocess.Popen(list(args), cwd=ROOT, env=env, text=True,
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    def agents(self) -> list[subprocess.Popen[str]]:
        return [self.spawn(f"agent-{node}", sys.executable, "-m", "fleetcare.collectors.cli",
                           "--backend", "sim", "--node", node, "--nodes", str(n),
                           "--bus", URL, "--topic-prefix", self.prefix, "--interval", "1s",
                           "--metrics-port", "0", "--spool-dir", str(self.tmp / f"spool-{node}"))
                for node, n in AGENTS]

    def fleetcare(self, name: str, *args: str) -> subprocess.Popen[str]:
        return self.spawn(name, sys.executable, "-m", "fleetcare.api.cli", *args)

    def serve(self, *source: str) -> subprocess.Popen[str]:
        return self.fleetcare("serve", "serve", "--db", str(self.tmp / "state.duckdb"), *source,
                              "--score-every", f"{SCORE_EVERY_S:g}s", "--no-auth",
                              "--port", str(self.port))

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.fixture
def fleet(tmp_path: Path, kafka_broker: str):
    f = Fleet(tmp_path)
    yield f
    f.stop_all()


def wait_fresh(fleet: Fleet, serve: subprocess.Popen[str], timeout_s: float = 120) -> None:
    """Until /v1/risk lists all 16 nodes, each scored less than two intervals ago."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        assert serve.poll() is None, fleet.log("serve")
        try:
            body = httpx.get(f"http://127.0.0.1:{fleet.port}/v1/risk?limit=100",
                             timeout=5).json()
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        now = dt.datetime.now(dt.UTC)
        ages = {n["node"]: (now - dt.datetime.fromisoformat(n["scored_at"])).total_seconds()
                for n in body["nodes"]}
        last = ages
        want = {f"{node}-{i}" for node, n in AGENTS for i in range(n)}
        if set(ages) == want and max(ages.values()) < 2 * SCORE_EVERY_S:
            assert body["total"] == 16
            return
        time.sleep(0.3)
    pytest.fail(f"/v1/risk did not list all 16 nodes fresh in {timeout_s} s: {last}\n"
                f"{fleet.log('serve')}")


def topic_keys(fleet: Fleet) -> set[tuple[str, dt.datetime]]:
    """Every (gpu_uuid, ts) the agents put on the telemetry topic, read back."""
    src = KafkaConsumerSource.from_url(URL, group_id=f"{fleet.prefix}check",
                                       topic_prefix=fleet.prefix)
    keys: set[tuple[str, dt.datetime]] = set()
    idle_since = time.monotonic()
    try:
        while time.monotonic() - idle_since < 5:
            recs = src.poll(1.0)
            if recs:
                idle_since = time.monotonic()
            for r in recs:
                if r.topic.endswith(TELEMETRY_TOPIC):
                    keys.update((s.gpu_uuid, s.ts.astimezone(dt.UTC).replace(tzinfo=None))
                                for s in decode_batch(r.value).samples)
    finally:
        src.close()
    return keys


def end_offsets(fleet: Fleet) -> int:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=URL.removeprefix("kafka://"))
    try:
        tps = [TopicPartition(t, p) for t in c.topics() if t.startswith(fleet.prefix)
               for p in c.partitions_for_topic(t) or ()]
        return sum(c.end_offsets(tps).values())
    finally:
        c.close()


def wait_caught_up(fleet: Fleet, procs: list[subprocess.Popen[str]],
                   timeout_s: float = 120) -> None:
    """Until the ingest group has committed everything on the topics."""
    end = end_offsets(fleet)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, p.args
        if committed(URL, fleet.group) >= end:
            return
        time.sleep(0.5)
    pytest.fail(f"ingest did not commit up to {end} in {timeout_s} s")


def stop_agents(agents: list[subprocess.Popen[str]]) -> None:
    for a in agents:
        a.send_signal(signal.SIGTERM)
    for a in agents:
        assert a.wait(60) == 0


def test_agents_kafka_serve_one_host_survives_sigkill(fleet: Fleet) -> None:
    agents = fleet.agents()
    source = ("--bus", URL, "--group", fleet.group, "--topic-prefix", fleet.prefix)
    serve = fleet.serve(*source)
    wait_fresh(fleet, serve)
    # a new state DB scores at once with the shipped fleet prior (issue 12), and says so
    model = httpx.get(f"http://127.0.0.1:{fleet.port}/v1/model", timeout=5).json()
    assert model["origin"] == "prior" and model["model_id"].startswith("prior-"), model
    time.sleep(3)
    sigkill(serve)                                  # mid-stream: rows landed, offsets not all
    serve = fleet.serve(*source)
    wait_fresh(fleet, serve)
    time.sleep(3)
    stop_agents(agents)
    wait_caught_up(fleet, [serve])
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(60) == 0, fleet.log("serve")

    want = topic_keys(fleet)
    con = duckdb.connect(str(fleet.tmp / "state.duckdb"), read_only=True)
    total, distinct = con.execute(
        "SELECT count(*), count(DISTINCT (gpu_uuid, ts)) FROM telemetry").fetchone()
    got = set(con.execute("SELECT gpu_uuid, ts FROM telemetry").fetchall())
    con.close()
    assert total == distinct == len(want) > 16 * 8 * 8  # 16 nodes x 8 GPUs x 8+ ticks
    assert got == want


def test_lake_workers_and_serve_lake_survive_a_worker_sigkill(fleet: Fleet) -> None:
    lake = fleet.tmp / "lake"
    agents = fleet.agents()
    worker = ("ingest", "--bus", URL, "--group", fleet.group, "--topic-prefix", fleet.prefix,
              "--lake", str(lake), "--flush-interval", "1s")
    serve = fleet.serve("--lake", str(lake))        # before any worker made the lake
    w1 = fleet.fleetcare("w1", *worker)
    w2 = fleet.fleetcare("w2", *worker)
    wait_fresh(fleet, serve)
    time.sleep(3)
    sigkill(w1)                                     # its partitions go to w2 after a rebalance
    time.sleep(2)
    wait_fresh(fleet, serve, timeout_s=180)
    stop_agents(agents)
    wait_caught_up(fleet, [w2, serve])
    time.sleep(3 * SCORE_EVERY_S)                   # a last cycle reads the last files
    w2.send_signal(signal.SIGTERM)
    serve.send_signal(signal.SIGTERM)
    assert w2.wait(60) == 0, fleet.log("w2")
    assert serve.wait(60) == 0, fleet.log("serve")

    want = topic_keys(fleet)
    from fleetcare.pipeline.lake import open_lake

    con = open_lake(lake)
    got = set(con.execute("SELECT gpu_uuid, ts FROM lake_telemetry").fetchall())
    con.close()
    assert got == want and len(want) > 16 * 8 * 8
    state = duckdb.connect(str(fleet.tmp / "state.duckdb"), read_only=True)
    # the service read every file and counted every sample once in its rollups
    assert state.execute("SELECT sum(n) FROM telemetry_hourly").fetchone()[0] == len(want)
    assert state.execute("SELECT count(*) FROM telemetry").fetchone()[0] == 0  # raw: lake
    state.close()
