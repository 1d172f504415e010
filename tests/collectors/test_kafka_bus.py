"""KafkaBus and KafkaConsumerSource against the real broker of deploy/kafka (KRaft, loopback).

The session fixture ``kafka_broker`` (tests/conftest.py) runs ``deploy/kafka/start.sh``
itself (idempotent), so these tests also work alone: ``pytest -m kafka tests/collectors/test_kafka_bus.py``. Each test uses
its own topic prefix and consumer group, so runs never see each other's records.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    Batch,
    GpuSample,
    XidEvent,
    decode_batch,
)
from fleetcare.collectors.transport import EVENTS_TOPIC, TELEMETRY_TOPIC
from fleetcare.collectors.transport.kafka import FETCH_DEFAULTS, KafkaBus, KafkaConsumerSource
from tests.services import KAFKA_URL, kafka_script

pytestmark = pytest.mark.kafka

URL = KAFKA_URL
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _stop_this_broker() -> None:
    """stop.sh, then check the port is really closed: a broker this checkout did not
    start (another checkout's, left running) is not stopped by it, and the outage a
    test needs would silently not happen."""
    kafka_script("stop.sh")
    try:
        socket.create_connection(("127.0.0.1", 9092), timeout=1.0).close()
    except OSError:
        return
    kafka_script("start.sh")  # leave this checkout as it was
    pytest.fail("a Kafka broker this checkout did not start holds 127.0.0.1:9092 (no "
                "var/kafka/kafka.pid here), so stop.sh cannot stop it: stop it from the "
                "checkout that started it (`make kafka-stop` there) and run again")


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}."


def make_batch(node: str, seq: int, with_event: bool) -> Batch:
    ts = T0 + dt.timedelta(seconds=10 * seq)
    samples = [GpuSample(ts=ts, node=node, gpu_uuid=f"GPU-{node}-{i}", gpu_index=i,
                         pci_bus_id=f"0000:{i:02x}:00.0", model="H100", gpu_temp_c=40.0 + seq)
               for i in range(2)]
    events = [XidEvent(ts=ts, node=node, xid=79, message="GPU has fallen off the bus.",
                       source="sim", gpu_index=0)] if with_event else []
    return Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=ts,
                 samples=samples, events=events)


def consume_all(prefix: str, expected: int, timeout_s: float = 60.0,
                group: str | None = None) -> list[tuple[str, Batch]]:
    """Every record on both topics (with duplicates, in the order read)."""
    src = KafkaConsumerSource.from_url(URL, group_id=group or f"{prefix}group",
                                       topic_prefix=prefix)
    got: list[tuple[str, Batch]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for rec in src.poll(1.0):
                batch = decode_batch(rec.value)
                assert rec.key == batch.node
                got.append((rec.topic.removeprefix(prefix), batch))
            src.commit()
            if len({(t, b.node, b.seq) for t, b in got}) >= expected:
                # a little longer, to catch duplicates that would arrive late
                for rec in src.poll(1.0):
                    got.append((rec.topic.removeprefix(prefix), decode_batch(rec.value)))
                src.commit()
                break
    finally:
        src.close()
    return got


def dedupe_in_order(got: list[tuple[str, Batch]]) -> dict[tuple[str, str], list[int]]:
    """(topic, node) -> seqs in the order first seen."""
    seen: set[tuple[str, str, int]] = set()
    order: dict[tuple[str, str], list[int]] = {}
    for topic, b in got:
        if (topic, b.node, b.seq) not in seen:
            seen.add((topic, b.node, b.seq))
            order.setdefault((topic, b.node), []).append(b.seq)
    return order


@pytest.fixture
def bus(kafka_broker: str, prefix: str, tmp_path: Path) -> Iterator[KafkaBus]:
    b = KafkaBus.from_url(kafka_broker, spool=tmp_path / "spool", topic_prefix=prefix,
                          partitions=3, delivery_timeout_s=6.0, retry_interval_s=1.0)
    yield b
    b.close(timeout_s=5)


def test_every_record_exactly_once_in_node_order(bus: KafkaBus, prefix: str) -> None:
    nodes = [f"node-{i:02d}" for i in range(5)]
    for seq in range(40):
        for node in nodes:
            bus.send(make_batch(node, seq, with_event=seq % 5 == 0))
    bus.flush(30)
    assert (bus.sent, bus.spooled, bus.replayed, bus.dropped) == (200 + 40, 0, 0, 0)

    got = consume_all(prefix, expected=240)
    assert len(got) == 240  # exactly once: no duplicates at all on the happy path
    order = dedupe_in_order(got)
    for node in nodes:
        assert order[(TELEMETRY_TOPIC, node)] == list(range(40))
        assert order[(EVENTS_TOPIC, node)] == list(range(0, 40, 5))
    events = [b for t, b in got if t == EVENTS_TOPIC]
    assert all(b.samples == [] and b.events[0].xid == 79 for b in events)
    assert all(len(b.samples) == 2 and b.events == [] for t, b in got if t == TELEMETRY_TOPIC)

    # committed: the same group reads nothing more
    assert consume_all(prefix, expected=1, timeout_s=8, group=f"{prefix}group") == []


def test_the_consumer_fetches_in_large_pieces_unless_told_otherwise(kafka_broker: str,
                                                                    prefix: str) -> None:
    """kafka-python's 1 MiB a partition made a backlog read in many round trips; the
    source asks for ``FETCH_DEFAULTS``, and a setting given wins."""
    src = KafkaConsumerSource.from_url(kafka_broker, group_id=f"{prefix}g", topic_prefix=prefix)
    mine = KafkaConsumerSource.from_url(kafka_broker, group_id=f"{prefix}h", topic_prefix=prefix,
                                        consumer_config={"max_partition_fetch_bytes": 1 << 20})
    try:
        config = src._consumer.config
        assert {k: config[k] for k in FETCH_DEFAULTS} == FETCH_DEFAULTS
        assert config["max_partition_fetch_bytes"] > 1 << 20
        assert mine._consumer.config["max_partition_fetch_bytes"] == 1 << 20
        assert mine._consumer.config["fetch_max_bytes"] == FETCH_DEFAULTS["fetch_max_bytes"]
    finally:
        src.close()
        mine.close()


OUTAGE_S = 60  # the issue: "the broker stopped for 60 s mid-stream and restarted"


def test_broker_outage_spools_and_replays_in_order(bus: KafkaBus, prefix: str) -> None:
    nodes = ["gpu-a", "gpu-b", "gpu-c"]
    seq = 0

    def send_round() -> None:
        nonlocal seq
        for node in nodes:
            bus.send(make_batch(node, seq, with_event=seq % 4 == 0))
        seq += 1

    for _ in range(10):
        send_round()
    bus.flush(30)
    assert bus.spooled == 0

    _stop_this_broker()
    try:
        t_down = time.monotonic()
        while time.monotonic() - t_down < OUTAGE_S:  # the agent keeps ticking meanwhile
            send_round()
            time.sleep(0.5)
        bus.flush(3)  # cannot deliver: everything not in Kafka is in the spool now
        assert len(bus.spool) > 0
        assert bus.spooled > 0
        assert bus.pending == len(bus.spool)
    finally:
        kafka_script("start.sh")

    for _ in range(10):
        send_round()  # new batches go behind the spool
    bus.flush(60)
    assert len(bus.spool) == 0
    assert bus.pending == 0
    assert bus.dropped == 0
    assert bus.replayed > 0

    n_tel = seq * len(nodes)
    n_ev = len(range(0, seq, 4)) * len(nodes)
    assert bus.sent + bus.replayed >= n_tel + n_ev

    got = consume_all(prefix, expected=n_tel + n_ev, timeout_s=90)
    order = dedupe_in_order(got)
    assert sum(len(v) for v in order.values()) == n_tel + n_ev
    for node in nodes:
        assert order[(TELEMETRY_TOPIC, node)] == list(range(seq))
        assert order[(EVENTS_TOPIC, node)] == list(range(0, seq, 4))
