from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    Batch,
    XidEvent,
    decode_batch,
    encode_batch,
)
from fleetcare.collectors.transport import EVENTS_TOPIC, TELEMETRY_TOPIC, BusFullError, Record
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer, _locked
from fleetcare.collectors.transport.framing import encode_frame
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def b(node: str, seq: int, events: bool = False) -> Batch:
    ev = [XidEvent(ts=T0, node=node, xid=13, message="x", source="sim")] if events else []
    return Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=T0,
                 samples=[sample(node=node)], events=ev)


def seqs(records: list[Record]) -> list[int]:
    """The batch seq of each record; a record the reader could not read shows its code."""
    return [decode_batch(r.value).seq if r.error_code is None else r.error_code  # type: ignore[misc]
            for r in records]


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
    second = encode_frame(0, b"n", encode_batch(b("n", 2)))
    con = EmbeddedConsumer(tmp_path)
    with _locked(tmp_path):  # a producer caught mid-append holds the bus lock
        seg.write_bytes(whole + second[:10])
        assert seqs(con.poll()) == [1]
        seg.write_bytes(whole + second)
    assert seqs(con.poll()) == [2]


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


# -- issue 13: framing; a torn or corrupt record costs only itself ---------------------------------
ROOT = Path(__file__).resolve().parents[2]
_PRODUCER = """
import datetime as dt, os, sys, time
from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, GpuSample
from fleetcare.collectors.transport import embedded

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
def batch(seq):
    return Batch(schema_version=SCHEMA_VERSION, node="n", seq=seq, sent_at=T0, samples=[
        GpuSample(ts=T0, node="n", gpu_uuid="GPU-1", gpu_index=0, pci_bus_id="p", model="H100")])

bus = embedded.EmbeddedBus(sys.argv[1])
for seq in range(1, 4):
    bus.send(batch(seq))
real = os.write
def half_then_hang(fd, data):
    n = real(fd, bytes(data[:len(data) // 2]))
    open(sys.argv[2], "w").close()
    time.sleep(120)
    return n
embedded.os.write = half_then_hang
bus.send(batch(4))
"""


def _kill_mid_append(bus_dir: Path, tmp_path: Path) -> None:
    """Run a producer that sends seq 1..3, then SIGKILL it halfway through writing seq 4."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ready = tmp_path / "mid-append"
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, str(bus_dir), str(ready)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_a_producer_killed_mid_append_loses_nothing_after_the_tear(tmp_path: Path) -> None:
    """Was: the torn append misaligned every record after it (all quarantined as garbage).
    Now the restarted producer repairs the tail (a new segment) and the reader reports the
    tear once, as a torn record."""
    _kill_mid_append(tmp_path / "bus", tmp_path)
    restarted = EmbeddedBus(tmp_path / "bus")
    for seq in range(5, 8):
        restarted.send(b("n", seq))
    got = EmbeddedConsumer(tmp_path / "bus").poll()
    assert seqs(got) == [1, 2, 3, "torn_record", 5, 6, 7]
    torn = got[3]
    assert torn.topic == "embedded-bus" and torn.partition == 1 and torn.value
    assert "the start of a record whose writer died mid-append" in torn.error
    assert len(list((tmp_path / "bus").glob("seg-*.log"))) == 2


def test_a_live_producer_appending_after_a_tear_loses_nothing(tmp_path: Path) -> None:
    """Another producer, started before the tear, keeps appending to the same segment:
    the reader resynchronises on its first whole record."""
    live = EmbeddedBus(tmp_path / "bus")
    _kill_mid_append(tmp_path / "bus", tmp_path)
    for seq in range(5, 8):
        live.send(b("n", seq))
    assert len(list((tmp_path / "bus").glob("seg-*.log"))) == 1
    assert seqs(EmbeddedConsumer(tmp_path / "bus").poll()) == [1, 2, 3, "torn_record", 5, 6, 7]


def test_corrupt_bytes_cost_only_their_record(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path)
    for seq in range(1, 6):
        bus.send(b("n", seq))
    seg = next(tmp_path.glob("seg-*.log"))
    data = bytearray(seg.read_bytes())
    second = data.find(b"\xfc\xb5", data.find(b"\xfc\xb5") + 1)
    data[second + 40] ^= 0xFF  # a flipped byte inside the second record's body
    seg.write_bytes(bytes(data))
    got = EmbeddedConsumer(tmp_path).poll()
    assert seqs(got) == [1, "corrupt_frame", 3, 4, 5]
    assert "no whole record (a checksum or header is wrong)" in got[1].error


def test_an_append_that_fails_part_way_leaves_nothing_behind(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full in the middle of a write: the partial bytes are cut off again."""
    import errno
    import os

    from fleetcare.collectors.transport import embedded

    bus = EmbeddedBus(tmp_path)
    bus.send(b("n", 1))
    seg = next(tmp_path.glob("seg-*.log"))
    size = seg.stat().st_size
    real = os.write

    def disk_full(fd: int, data: bytes) -> int:
        real(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(embedded.os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        bus.send(b("n", 2))
    monkeypatch.undo()
    assert seg.stat().st_size == size
    bus.send(b("n", 3))
    assert seqs(EmbeddedConsumer(tmp_path).poll()) == [1, 3]


def test_unknown_topic_byte_and_non_utf8_key_are_handed_over(tmp_path: Path) -> None:
    """Was: an unknown topic byte raised IndexError and a bad key UnicodeDecodeError out of
    poll, so ingest stopped on them for good."""
    bus = EmbeddedBus(tmp_path)
    bus.send(b("n", 1))
    value = encode_batch(b("n", 2))
    bus._append(encode_frame(7, b"n", value))
    bus._append(encode_frame(0, b"\xff\xfen", value))
    bus.send(b("n", 3))
    got = EmbeddedConsumer(tmp_path).poll()
    assert seqs(got) == [1, "unknown_topic", "invalid_key", 3]
    assert got[1].value == value and "topic byte 7 is not one this reader knows" in got[1].error
    assert got[2].error.startswith("the record's key b'\\xff\\xfen' is not UTF-8")


def test_segments_written_before_framing_are_still_read(tmp_path: Path) -> None:
    """Old segments (no magic, no checksums) drain; new records go to a new segment."""
    import struct

    old = b""
    for seq, topic in ((1, 0), (2, 9), (3, 0)):
        value = encode_batch(b("n", seq))
        old += struct.pack("<IBH", len(value), topic, 1) + b"n" + value
    (tmp_path / "seg-000000000001.log").write_bytes(old)
    bus = EmbeddedBus(tmp_path)
    bus.send(b("n", 4))
    assert sorted(p.name for p in tmp_path.glob("seg-*.log")) == [
        "seg-000000000001.log", "seg-000000000002.log"]
    con = EmbeddedConsumer(tmp_path)
    assert seqs(con.poll()) == [1, "unknown_topic", 3, 4]
    con.commit()
    assert [p.name for p in tmp_path.glob("seg-*.log")] == ["seg-000000000002.log"]
