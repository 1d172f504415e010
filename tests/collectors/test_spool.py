"""The on-disk spool, without Kafka: order, durability, the bound, what gets dropped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fleetcare.collectors.transport import EVENTS_TOPIC, TELEMETRY_TOPIC, BusFullError
from fleetcare.collectors.transport.spool import Spool, SpoolItem


def tel(node: str, i: int, size: int = 100) -> SpoolItem:
    return SpoolItem(TELEMETRY_TOPIC, node, f"{node}:{i}:".encode().ljust(size, b"."))


def ev(node: str, i: int, size: int = 100) -> SpoolItem:
    return SpoolItem(EVENTS_TOPIC, node, f"{node}:{i}:".encode().ljust(size, b"!"),
                     droppable=False)


def values(spool: Spool) -> list[bytes]:
    return [e.item.value.split(b":", 2)[0] + b":" + e.item.value.split(b":", 2)[1]
            for e in spool.peek(len(spool))]


def test_fifo_across_lanes_and_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([tel("a", 0), ev("a", 0)])
    spool.append([tel("b", 0)])
    spool.append([ev("b", 1), tel("a", 1)])
    assert len(spool) == 5
    assert values(spool) == [b"a:0", b"a:0", b"b:0", b"b:1", b"a:1"]
    first = spool.peek(3)
    assert [e.item.topic for e in first] == [TELEMETRY_TOPIC, EVENTS_TOPIC, TELEMETRY_TOPIC]
    assert [e.item.key for e in first] == ["a", "a", "b"]
    spool.ack(first)
    assert values(spool) == [b"b:1", b"a:1"]
    spool.ack(spool.peek(10))
    assert len(spool) == 0
    assert spool.size_bytes == 0


def test_survives_reopen_with_acknowledged_prefix(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=300)
    for i in range(10):
        spool.append([tel("n1", i), ev("n1", i)] if i % 3 == 0 else [tel("n1", i)])
    spool.ack(spool.peek(4))  # t0 e0 t1 t2
    spool.close()

    again = Spool(tmp_path, segment_bytes=300)
    assert len(again) == 10
    assert values(again) == [b"n1:3", b"n1:3", *[f"n1:{i}".encode() for i in range(4, 6)],
                             b"n1:6", b"n1:6", *[f"n1:{i}".encode() for i in range(7, 10)],
                             b"n1:9"]
    # new appends go behind what was there
    again.append([tel("n1", 10)])
    assert values(again)[-1] == b"n1:10"
    again.close()


def test_torn_tail_is_cut_off_on_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([tel("a", 0)])
    spool.append([tel("a", 1)])
    spool.close()
    seg = sorted((tmp_path / "telemetry").glob("*.seg"))[-1]
    raw = seg.read_bytes()
    seg.write_bytes(raw[:-7])  # a crash in the middle of the last write
    again = Spool(tmp_path)
    assert values(again) == [b"a:0"]
    again.append([tel("a", 2)])
    again.close()
    assert values(Spool(tmp_path)) == [b"a:0", b"a:2"]


def test_bound_drops_oldest_telemetry_first_never_events(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a telemetry record is 100 bytes of value + 40 of framing, topic and key on disk
    spool = Spool(tmp_path, max_bytes=2000, segment_bytes=300)
    spool.append([ev("a", 0)])
    for i in range(20):
        with caplog.at_level(logging.WARNING, logger="fleetcare.collectors.transport.spool"):
            spool.append([tel("a", i)])
        assert spool.size_bytes <= 2000
    got = values(spool)
    assert got[0] == b"a:0"  # the event is still first
    kept = [int(v.split(b":")[1]) for v in got[1:]]
    assert kept == list(range(20 - len(kept), 20))  # the newest telemetry, in order
    assert spool.dropped == 20 - len(kept)
    assert spool.dropped > 0
    drops = [r.getMessage() for r in caplog.records if r.getMessage().startswith("spool.dropped")]
    assert drops and all("node=a" in m for m in drops)
    assert sum(int(m.split("batches=")[1].split()[0]) for m in drops) == spool.dropped


def test_events_are_refused_not_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1000, segment_bytes=300)
    spool.append([tel("a", 0)])
    for i in range(7):
        spool.append([ev("a", i)])
    # 7 events = 959 bytes on disk; the telemetry record went to make room
    assert spool.dropped == 1
    with pytest.raises(BusFullError) as exc:
        spool.append([ev("a", 7)])
    assert exc.value.limit_bytes == 1000
    with pytest.raises(BusFullError):
        spool.append([tel("a", 1)])
    assert len(spool) == 7
    assert all(not e.item.droppable for e in spool.peek(10))
    # acknowledging events frees room again
    spool.ack(spool.peek(3))
    spool.append([ev("a", 7)])
    assert values(spool)[-1] == b"a:7"


def test_append_is_all_or_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=500, segment_bytes=300)
    with pytest.raises(BusFullError):
        spool.append([ev("a", i) for i in range(5)])
    assert len(spool) == 0
    assert spool.size_bytes == 0


def test_drop_of_peeked_entries_is_harmless(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1000, segment_bytes=300)
    spool.append([tel("a", 0), tel("a", 1)])
    inflight = spool.peek(2)
    for i in range(2, 9):
        spool.append([tel("a", i)])  # pushes a:0 and a:1 out
    assert spool.dropped >= 2
    spool.ack(inflight)  # no-op for entries already dropped
    assert values(spool)[-1] == b"a:8"
    assert len(spool) == 9 - spool.dropped
