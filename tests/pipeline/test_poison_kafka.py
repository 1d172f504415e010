"""Issue 13 on the real Kafka broker: poison records between good batches.

Was: three poison records (nesting 200,000 deep, a counter of 2**64-1, a key that is not
UTF-8) made `fleetcare ingest` print `ingested 0 records … (stopped: error)` on every
restart, and inside `serve --bus` the good batches around them were neither stored nor
quarantined. Now both land every good batch and quarantine each poison record once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import duckdb
import msgspec
import pytest

from fleetcare.collectors.contract import encode_batch
from fleetcare.collectors.transport import TELEMETRY_TOPIC
from fleetcare.collectors.transport.kafka import KafkaBus
from tests.pipeline.test_ingest_worker import GPUS, make_batch, run_ingest

pytestmark = pytest.mark.kafka

NODE = "node-p"
GOOD = 4  # good batches, one before, between and after the poison records


def _stream(url: str, prefix: str, spool: Path) -> None:
    """good, deep, good, 2**64-1, good, bad key, good — on the telemetry topic."""
    from kafka import KafkaProducer

    u64 = msgspec.to_builtins(make_batch(NODE, 90))
    u64["samples"][1]["ecc_corrected_volatile"] = 2**64 - 1
    poison = [(NODE.encode(), b"\x91" * 200_000 + b"\x00"),
              (NODE.encode(), msgspec.msgpack.encode(u64)),
              (b"\xff\xfe" + NODE.encode(), encode_batch(make_batch(NODE, 91)))]
    with KafkaBus.from_url(url, spool=spool, topic_prefix=prefix, partitions=1) as bus:
        bus.send(make_batch(NODE, 1))  # creates the topics (one partition: one order)
        bus.flush(30)
    producer = KafkaProducer(bootstrap_servers=url.removeprefix("kafka://"), acks="all",
                             max_request_size=4 << 20)
    try:
        for seq, (key, value) in zip((2, 3, 4), poison, strict=True):
            producer.send(prefix + TELEMETRY_TOPIC, key=key, value=value).get(30)
            producer.send(prefix + TELEMETRY_TOPIC, key=NODE.encode(),
                          value=encode_batch(make_batch(NODE, seq))).get(30)
    finally:
        producer.close()


EXPECTED_SAMPLES = GOOD * GPUS + GPUS - 1  # the 2**64-1 batch keeps its other samples
EXPECTED_CODES = ["invalid_key", "nesting_too_deep", "sentinel_value"]


def test_fleetcare_ingest_on_kafka_lands_everything_around_poison(kafka_broker: str,
                                                                 tmp_path: Path) -> None:
    prefix = f"test-{uuid.uuid4().hex[:10]}."
    _stream(kafka_broker, prefix, tmp_path / "spool")
    db = tmp_path / "f.duckdb"
    args = ("--bus", kafka_broker, "--topic-prefix", prefix, "--group", f"g-{prefix}",
            "--db", str(db), "--exit-when-idle", "3")
    out = run_ingest(*args, timeout=120)
    assert (out["records"], out["samples"], out["quarantined"], out["reason"]) == (
        GOOD + 3, EXPECTED_SAMPLES, 3, "idle")
    with duckdb.connect(str(db), read_only=True) as con:
        codes = sorted(c for (c,) in con.execute("SELECT code FROM quarantine").fetchall())
    assert codes == EXPECTED_CODES
    assert run_ingest(*args, timeout=120)["records"] == 0  # committed past the poison


def test_serve_bus_on_kafka_stores_or_quarantines_every_record(kafka_broker: str,
                                                                tmp_path: Path) -> None:
    from fleetcare.api.service import Service
    from fleetcare.pipeline.ingest_worker import open_consumer
    from fleetcare.pipeline.store import Store

    prefix = f"test-{uuid.uuid4().hex[:10]}."
    _stream(kafka_broker, prefix, tmp_path / "spool")
    store = Store(tmp_path / "serve.duckdb")
    svc = Service(store, open_consumer=lambda: open_consumer(
        kafka_broker, group=f"g-{prefix}", topic_prefix=prefix), score_every_s=3600,
        ingest_poll_s=0.2, keep_raw=None)
    svc.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            cur = store.cursor()
            samples = cur.execute("SELECT count(*) FROM telemetry").fetchone()[0]
            bad = cur.execute("SELECT count(*) FROM quarantine").fetchone()[0]
            cur.close()
            if (samples, bad) == (EXPECTED_SAMPLES, 3):
                break
            time.sleep(0.2)
        time.sleep(1.0)  # nothing more arrives, and nothing is stored twice
        cur = store.cursor()
        assert cur.execute("SELECT count(*) FROM telemetry").fetchone()[0] == EXPECTED_SAMPLES
        assert sorted(c for (c,) in cur.execute(
            "SELECT code FROM quarantine").fetchall()) == EXPECTED_CODES
        cur.close()
        assert svc.ingest_restarts == 0
    finally:
        svc.stop()
        store.close()
