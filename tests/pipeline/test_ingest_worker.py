"""``fleetcare ingest`` end to end: the embedded bus, and the real Kafka broker with the
ingest process SIGKILLed at random points and restarted (every record exactly once).

The Kafka tests use the session fixture ``kafka_broker`` (tests/conftest.py; it runs
deploy/kafka/start.sh). Each test has its own topic prefix and consumer group.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    Batch,
    GpuSample,
    Incident,
    XidEvent,
)
from fleetcare.collectors.transport import Record
from fleetcare.collectors.transport.embedded import EmbeddedBus
from fleetcare.collectors.transport.framing import encode_frame
from fleetcare.pipeline import schema
from fleetcare.pipeline.ingest_worker import IngestWorker
from fleetcare.pipeline.store import Store

ROOT = Path(__file__).resolve().parents[2]
# Two days ago at 04:30 UTC: inside what ingest validation accepts, whatever today is.
DAY = (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)).replace(hour=0, minute=0, second=0,
                                                               microsecond=0)
T0 = DAY + dt.timedelta(hours=4, minutes=30)
DATE = f"{T0:%Y-%m-%d}"
GPUS = 4
SUMMARY_KEYS = {"records", "samples", "events", "incidents", "quarantined", "reason",
                "seconds", "commits", "commit_failures", "nics", "worker_id"}


# -- a stream with known contents ---------------------------------------------------------------
def make_batch(node: str, seq: int) -> Batch:
    """One node's tick: GPUS samples; an XID every 7th tick; an incident every 25th."""
    ts = T0 + dt.timedelta(seconds=30 * seq)
    samples = [GpuSample(ts=ts, node=node, gpu_uuid=f"GPU-{node}-{i}", gpu_index=i,
                         pci_bus_id=f"0000:{i:02x}:00.0", model="H100",
                         gpu_temp_c=40.0 + seq % 30, ecc_corrected_volatile=seq)
               for i in range(GPUS)]
    events = ([XidEvent(ts=ts, node=node, xid=79, message="GPU has fallen off the bus.",
                        source="sim", gpu_uuid=f"GPU-{node}-0")] if seq % 7 == 0 else [])
    incidents = ([Incident(ts=ts, node=node, kind="failure", cause="faulty_gpu", source="sim",
                           gpu_uuid=f"GPU-{node}-0")] if seq % 25 == 0 else [])
    return Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=ts,
                 samples=samples, events=events, incidents=incidents)


def expected(nodes: list[str], seqs: int) -> dict[str, dict[str, int]]:
    """Per table, per node: the row count the stream holds."""
    return {
        "telemetry": dict.fromkeys(nodes, GPUS * seqs),
        "xid_events": dict.fromkeys(nodes, len(range(0, seqs, 7))),
        "incidents": dict.fromkeys(nodes, len(range(0, seqs, 25))),
    }


def nodes_of(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


class Producer(threading.Thread):
    """Sends ``seqs`` ticks of ``nodes`` to Kafka over about ``seconds`` (while ingest runs)."""

    def __init__(self, url: str, prefix: str, spool: Path, nodes: list[str], seqs: int,
                 seconds: float) -> None:
        super().__init__(daemon=True)
        self.args = (url, prefix, spool)
        self.nodes, self.seqs, self.seconds = nodes, seqs, seconds
        self.error: BaseException | None = None

    def run(self) -> None:
        from fleetcare.collectors.transport.kafka import KafkaBus

        url, prefix, spool = self.args
        try:
            with KafkaBus.from_url(url, spool=spool, topic_prefix=prefix,
                                   partitions=4) as bus:
                for seq in range(self.seqs):
                    for node in self.nodes:
                        bus.send(make_batch(node, seq))
                    bus.flush(30)
                    time.sleep(self.seconds / self.seqs)
                bus.flush(30)
                assert (bus.spooled, bus.dropped) == (0, 0)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> None:
        self.join(120)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error


def committed(url: str, group: str) -> int:
    """Sum of the group's committed offsets (how far ingest has durably got)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=url.removeprefix("kafka://"),
                             client_id="fleetcare-test-admin")
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return sum(max(0, o.offset) for o in offsets.values())


# -- the CLI as a subprocess ----------------------------------------------------------------------
def ingest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetcare.api.cli", "ingest", *args]


def start_ingest(*args: str, log: Path) -> subprocess.Popen[str]:
    # info: the log says "ingest.started" (``wait_started``) and what each worker did
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FLEETCARE_CLI_LOG_LEVEL": "info"}
    return subprocess.Popen(ingest_cmd(*args), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=open(log, "a"))  # noqa: SIM115


def wait_started(log: Path, procs: list[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    """Block until ``log`` says ``ingest.started`` for each of ``procs``: from then on it
    handles SIGTERM (one signalled while still importing dies of it, with nothing read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        started = {ln.split(" pid=", 1)[1].split(" ", 1)[0] for ln in lines
                   if "ingest.started " in ln and " pid=" in ln}
        if all(str(p.pid) in started for p in procs):
            return
        for p in procs:
            assert p.poll() is None, f"ingest exited early with {p.returncode}"
        time.sleep(0.1)
    pytest.fail(f"the ingest workers did not all start within {timeout} s (see {log})")


def run_ingest(*args: str, timeout: float = 90) -> dict[str, object]:
    proc = subprocess.run(ingest_cmd(*args, "--json"), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary) == SUMMARY_KEYS
    return summary


def wait_for_progress(url: str, group: str, beyond: int, procs: list[subprocess.Popen[str]],
                      timeout: float = 40.0) -> int:
    """Block until the group's committed offsets pass ``beyond``; returns the new sum.
    A retriable broker error (the group's coordinator not available for a moment) is
    asked again until the deadline."""
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"ingest exited early with {p.returncode}"
        try:
            now = committed(url, group)
        except KafkaError as e:  # e.g. the group's coordinator moving after a SIGKILL
            if not e.retriable:
                raise
            now = beyond  # not known yet: ask again
        if now > beyond:
            return now
        time.sleep(0.2)
    pytest.fail(f"ingest made no progress past offset sum {beyond} in {timeout} s")


def sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


def assert_exactly_once(con: duckdb.DuckDBPyConnection, want: dict[str, dict[str, int]],
                        tables: dict[str, str]) -> None:
    """Per node counts equal ``want``, and no natural key appears twice."""
    keys = {"telemetry": schema.SAMPLE_KEY, "xid_events": schema.EVENT_KEY,
            "incidents": schema.INCIDENT_KEY}
    for table, per_node in want.items():
        rel = tables[table]
        got = dict(con.execute(f"SELECT node, count(*) FROM {rel} GROUP BY node").fetchall())
        assert got == per_node, table
        dups = con.execute(f"SELECT count(*) FROM (SELECT {', '.join(keys[table])} FROM {rel} "
                           "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
        assert dups == 0, table


# -- embedded bus -----------------------------------------------------------------------------------
def test_embedded_bus_into_duckdb_with_quarantine_and_json_summary(tmp_path: Path) -> None:
    nodes = nodes_of(3)
    bus = EmbeddedBus(tmp_path / "bus")
    for seq in range(30):
        for node in nodes:
            bus.send(make_batch(node, seq))
    bus.flush()
    db = tmp_path / "f.duckdb"
    first = run_ingest("--bus", f"embedded://{tmp_path / 'bus'}", "--db", str(db),
                       "--exit-when-idle", "0.5", "--batch", "7")
    # 30 ticks x 3 nodes on telemetry, plus the ticks with an XID or incident on events
    event_ticks = len({s for s in range(30) if s % 7 == 0 or s % 25 == 0})
    assert first["records"] == 3 * (30 + event_ticks)
    assert (first["samples"], first["events"], first["incidents"], first["quarantined"]) == (
        3 * 30 * GPUS, 3 * 5, 3 * 2, 0)
    assert first["reason"] == "idle"
    again = run_ingest("--bus", f"embedded://{tmp_path / 'bus'}", "--db", str(db),
                       "--exit-when-idle", "0.5")
    assert again["records"] == 0  # the position was committed
    with duckdb.connect(str(db), read_only=True) as con:
        assert_exactly_once(con, expected(nodes, 30),
                            {"telemetry": "telemetry", "xid_events": "xid_events",
                             "incidents": "incidents"})


def test_embedded_bus_into_the_lake(tmp_path: Path) -> None:
    from fleetcare.pipeline.lake import open_lake

    nodes = nodes_of(2)
    bus = EmbeddedBus(tmp_path / "bus")
    for seq in range(130):  # 65 minutes: two hour partitions
        for node in nodes:
            bus.send(make_batch(node, seq))
    bus._append(encode_frame(0, b"node-000", b"\xffjunk\x00"))  # one undecodable record
    bus.flush()
    out = run_ingest("--bus", f"embedded://{tmp_path / 'bus'}", "--lake", str(tmp_path / "lake"),
                     "--exit-when-idle", "0.5", "--worker-id", "w1")
    assert out["worker_id"] == "w1" and out["samples"] == 2 * 130 * GPUS
    assert out["quarantined"] == 1
    hours = sorted(p.relative_to(tmp_path / "lake").as_posix()
                   for p in (tmp_path / "lake" / "telemetry").glob("date=*/hour=*"))
    assert hours == [f"telemetry/date={DATE}/hour=04", f"telemetry/date={DATE}/hour=05"]
    con = open_lake(tmp_path / "lake")
    assert_exactly_once(con, expected(nodes, 130),
                        {t: f"lake_{t}" for t in ("telemetry", "xid_events", "incidents")})
    (source, raw, code), = con.execute("SELECT source, raw, code FROM lake_quarantine").fetchall()
    assert raw == b"\xffjunk\x00" and code and source.startswith("fleetcare.telemetry/")


def test_usage_errors_name_the_flag(tmp_path: Path) -> None:
    proc = subprocess.run(ingest_cmd("--bus", f"embedded://{tmp_path}", "--group", "g"),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--group applies to kafka:// buses only" in proc.stderr
    proc = subprocess.run(ingest_cmd("--bus", "nats://x", "--db", str(tmp_path / "f.duckdb")),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--bus:" in proc.stderr


# -- the worker loop, in process -------------------------------------------------------------------------
class ListConsumer:
    def __init__(self, records: list[Record]) -> None:
        self.records, self.read, self.committed, self.closed = records, 0, 0, False

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        out = self.records[self.read:self.read + max_records]
        self.read += len(out)
        return out

    def commit(self) -> None:
        self.committed = self.read

    def close(self) -> None:
        self.closed = True


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25  # every look at the clock is a quarter second later
        return self.now


def _records(n: int) -> list[Record]:
    from fleetcare.collectors.contract import encode_batch

    return [Record("fleetcare.telemetry", "node-000", encode_batch(make_batch("node-000", i)),
                   0, i) for i in range(n)]


def test_worker_stops_at_max_records_and_commits_exactly_that(tmp_path: Path) -> None:
    consumer = ListConsumer(_records(10))
    with Store(tmp_path / "f.duckdb") as store:
        summary = IngestWorker(store, consumer, max_batch=3, max_records=7).run()
    assert (summary.records, summary.samples, summary.reason) == (7, 7 * GPUS, "max-records")
    assert consumer.committed == 7 and consumer.closed


def test_worker_idle_exit_uses_the_injected_clock(tmp_path: Path) -> None:
    consumer = ListConsumer(_records(2))
    with Store(tmp_path / "f.duckdb") as store:
        summary = IngestWorker(store, consumer, idle_exit_s=2.0, clock=ManualClock()).run()
    assert (summary.records, summary.reason) == (2, "idle")
    assert 2.0 <= summary.seconds <= 4.0


def test_a_failed_write_stops_without_committing(tmp_path: Path) -> None:
    class Broken:
        def insert_batches(self, batches: object, **kw: object) -> tuple[int, int, int]:
            raise OSError("disk full")

        def quarantine(self, *a: object, **k: object) -> None:
            pass

    consumer = ListConsumer(_records(3))
    summary = IngestWorker(Broken(), consumer).run()
    assert summary.reason == "error" and consumer.committed == 0 and consumer.closed


def test_worker_prometheus_text(tmp_path: Path) -> None:
    with Store(tmp_path / "f.duckdb") as store:
        worker = IngestWorker(store, ListConsumer(_records(4)), max_records=4, worker_id="w9")
        worker.run()
    text = worker.render()
    assert 'fleetcare_ingest_records_total{worker="w9"} 4\n' in text
    assert f'fleetcare_ingest_samples_total{{worker="w9"}} {4 * GPUS}\n' in text
    assert "# TYPE fleetcare_ingest_commits_total counter\n" in text


# -- the real broker: SIGKILL five times ----------------------------------------------------------------
@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}."


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("FLEETCARE_TEST_SEED", random.randrange(1 << 30)))
    print(f"kill points seed: FLEETCARE_TEST_SEED={seed}")
    return random.Random(seed)


@pytest.mark.kafka
@pytest.mark.slow
def test_sigkill_five_times_every_record_exactly_once_in_duckdb(
        kafka_broker: str, prefix: str, tmp_path: Path, rng: random.Random) -> None:
    nodes, seqs = nodes_of(12), 150
    group = f"{prefix}ingest"
    db = tmp_path / "f.duckdb"
    common = ["--bus", kafka_broker, "--db", str(db), "--topic-prefix", prefix,
              "--group", group, "--instance-id", "ingest-0", "--batch", "40"]
    producer = Producer(kafka_broker, prefix, tmp_path / "spool", nodes, seqs, seconds=10)
    producer.start()
    progress, log = 0, tmp_path / "ingest.log"
    for _ in range(5):
        proc = start_ingest(*common, log=log)
        try:
            progress = wait_for_progress(kafka_broker, group, progress, [proc])
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            sigkill(proc)
    producer.finish()
    final = run_ingest(*common, "--exit-when-idle", "3")
    assert final["reason"] == "idle" and final["quarantined"] == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert_exactly_once(con, expected(nodes, seqs),
                            {"telemetry": "telemetry", "xid_events": "xid_events",
                             "incidents": "incidents"})


@pytest.mark.kafka
def test_sigterm_finishes_the_batch_commits_and_exits_0(
        kafka_broker: str, prefix: str, tmp_path: Path) -> None:
    nodes = nodes_of(4)
    group = f"{prefix}ingest"
    producer = Producer(kafka_broker, prefix, tmp_path / "spool", nodes, 40, seconds=0.5)
    producer.start()
    producer.finish()
    args = ["--bus", kafka_broker, "--db", str(tmp_path / "f.duckdb"), "--topic-prefix",
            prefix, "--group", group, "--json"]
    proc = start_ingest(*args, log=tmp_path / "ingest.log")
    wait_for_progress(kafka_broker, group, 0, [proc])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["reason"] == "signal"
    # what it read is committed; a second run reads exactly the rest
    assert committed(kafka_broker, group) == summary["records"]
    again = run_ingest(*args[:-1], "--exit-when-idle", "1")
    event_ticks = len({s for s in range(40) if s % 7 == 0 or s % 25 == 0})
    assert summary["records"] + again["records"] == 4 * (40 + event_ticks)
