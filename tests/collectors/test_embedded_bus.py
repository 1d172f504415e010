from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, XidEvent, decode_batch
from fleetcare.collectors.transport import EVENTS_TOPIC, TELEMETRY_TOPIC, BusFullError
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def b(node: str, seq: int, events: bool = False) -> Batch:
    ev = [XidEvent(ts=T0, node=node, xid=13, message="x", source="sim")] if events else []
    return Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=T0,
                 samples=[sample(node=node)], events=ev)


def test_records_come_back_in_order_across_segments_and_restarts(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path, segment_bytes=300)
    for i in range(1, 21):
        bus.send(b(f"n{i % 3}", i, events=(i % 5 == 0)))
    bus.flush()
    assert len(list(tmp_path.glob("seg-*.log"))) > 1
    con = EmbeddedConsumer(tmp_path)
    first = con.poll(max_records=10)
    con.commit()
    # a new consumer process resumes after the committed position
    rest = EmbeddedConsumer(tmp_path).poll()
    recs = first + rest
    assert len(recs) == 24  # 20 telemetry + 4 event records
    assert [decode_batch(r.value).seq for r in recs if r.topic == TELEMETRY_TOPIC] == list(range(1, 21))
    assert [decode_batch(r.value).seq for r in recs if r.topic == EVENTS_TOPIC] == [5, 10, 15, 20]
    assert all(r.key == decode_batch(r.value).node for r in recs)


def test_uncommitted_records_are_redelivered(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path)
    bus.send(b("n", 1))
    assert len(EmbeddedConsumer(tmp_path).poll()) == 1
    assert len(EmbeddedConsumer(tmp_path).poll()) == 1  # never committed


def test_consumed_segments_are_deleted(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path, segment_bytes=200)
    for i in range(10):
        bus.send(b("n", i))
    con = EmbeddedConsumer(tmp_path)
    assert len(con.poll()) == 10
    con.commit()
    assert len(list(tmp_path.glob("seg-*.log"))) == 1
    assert con.lag_bytes() == 0


def test_partial_tail_record_is_not_read_until_complete(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path)
    bus.send(b("n", 1))
    seg = next(tmp_path.glob("seg-*.log"))
    whole = seg.read_bytes()
    seg.write_bytes(whole + whole[:10])  # a writer caught mid-append
    con = EmbeddedConsumer(tmp_path)
    assert len(con.poll()) == 1
    seg.write_bytes(whole + whole)
    assert len(con.poll()) == 1


def test_bound_is_enforced_and_reported(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path, max_bytes=500)
    with pytest.raises(BusFullError, match="is full \\(500 bytes\\)"):
        for i in range(100):
            bus.send(b("n", i))
    assert bus.rejected == 1
    assert bus.size_bytes() <= 500


def test_url_must_name_a_path() -> None:
    with pytest.raises(ValueError, match="embedded://PATH"):
        EmbeddedBus.from_url("embedded://")


def test_a_consumer_freeing_segments_never_breaks_a_producer_appending(tmp_path: Path) -> None:
    """Found by the live-equals-batch test (issue 11): a commit deleted a consumed segment
    between a producer listing the segments and sizing them (FileNotFoundError in send)."""
    import threading

    bus = EmbeddedBus(tmp_path, segment_bytes=200)
    con = EmbeddedConsumer(tmp_path)
    got: list[int] = []
    done = threading.Event()

    def consume() -> None:
        while not done.is_set() or con.lag_bytes():
            got.extend(decode_batch(r.value).seq for r in con.poll(max_records=3))
            con.commit()

    t = threading.Thread(target=consume)
    t.start()
    try:
        for i in range(1, 801):
            bus.send(b("n1", i))
            if i % 50 == 0:
                bus.flush()
    finally:
        done.set()
        t.join(30)
    assert got == list(range(1, 801))
