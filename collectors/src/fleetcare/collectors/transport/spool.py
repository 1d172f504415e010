"""A bounded on-disk spool: where batches wait while the bus is away.

Two lanes of append-only segment files under one directory::

    SPOOL/telemetry/00000000000000000001.seg ...   droppable (samples)
    SPOOL/events/00000000000000000001.seg ...      kept (XID events, incidents)
    SPOOL/<lane>/head                              "segment offset" of the first
                                                   entry not yet acknowledged

Each record is length-prefixed and checksummed (``>II`` length and crc32 of the body:
sequence number, topic, key, value), written and fsync'd before ``append`` returns,
so the spool survives a crash or restart; a torn record at the end of a segment is cut
off on reopen. The sequence number orders entries across the two lanes, so
``peek`` hands them back in exactly the order they were appended.

The bound (``max_bytes``, default 1 GiB) counts the segment files on disk. When an
append would pass it, whole telemetry segments are dropped, oldest first; events are
never dropped: when only they remain, ``append`` raises ``BusFullError``. Every drop
is counted (``dropped``, ``dropped_bytes``) and logged as ``spool.dropped``.
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fleetcare.collectors.transport import BusFullError

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 1 << 30
TELEMETRY = "telemetry"
EVENTS = "events"
_LANES = (TELEMETRY, EVENTS)
_HEADER = struct.Struct(">II")  # body length, crc32 of body; body = seq, topic, key, value
_SEQ = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_SUFFIX = ".seg"


@dataclass(frozen=True, slots=True)
class SpoolItem:
    """One message waiting to be sent: where it goes, its key, its bytes."""

    topic: str
    key: str
    value: bytes
    droppable: bool = True
    """Telemetry is droppable when the bound is hit; events and incidents are not."""


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """A spooled item with its place in the spool (``seq`` orders all entries)."""

    seq: int
    item: SpoolItem


@dataclass(slots=True)
class _Loc:
    seq: int
    segment: int
    offset: int
    size: int  # on-disk bytes, header included
    key: str


def _encode(seq: int, item: SpoolItem) -> bytes:
    topic = item.topic.encode()
    key = item.key.encode()
    body = b"".join((_SEQ.pack(seq), _U16.pack(len(topic)), topic, _U16.pack(len(key)), key,
                     item.value))
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes, droppable: bool) -> tuple[int, SpoolItem]:
    (seq,) = _SEQ.unpack_from(body, 0)
    pos = _SEQ.size
    (n,) = _U16.unpack_from(body, pos)
    topic = body[pos + 2:pos + 2 + n].decode()
    pos += 2 + n
    (n,) = _U16.unpack_from(body, pos)
    key = body[pos + 2:pos + 2 + n].decode()
    pos += 2 + n
    return seq, SpoolItem(topic, key, body[pos:], droppable)


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside ``path`` durable (POSIX: fsync the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Lane:
    """One ordered stream of segment files, with an acknowledged-head pointer."""

    def __init__(self, path: Path, droppable: bool, segment_bytes: int, fsync: bool) -> None:
        self.path = path
        self.droppable = droppable
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        path.mkdir(parents=True, exist_ok=True)
        self.entries: collections.deque[_Loc] = collections.deque()
        self.sizes: dict[int, int] = {}  # segment id -> bytes on disk
        self.writer: BinaryIO | None = None
        self.writer_id = 0
        self._load()

    # -- recovery
    def _seg_path(self, seg: int) -> Path:
        return self.path / f"{seg:020d}{_SUFFIX}"

    def _load(self) -> None:
        head_seg, head_off = 0, 0
        head = self.path / "head"
        if head.exists():
            try:
                a, b = head.read_text().split()
                head_seg, head_off = int(a), int(b)
            except ValueError:
                log.warning("spool.head_unreadable path=%s", head)
        for seg_path in sorted(self.path.glob("*" + _SUFFIX)):
            seg = int(seg_path.stem)
            if seg < head_seg:
                seg_path.unlink()  # acknowledged, removal was interrupted
                continue
            data = seg_path.read_bytes()
            pos = 0
            while pos + _HEADER.size <= len(data):
                length, crc = _HEADER.unpack_from(data, pos)
                body = data[pos + _HEADER.size:pos + _HEADER.size + length]
                if len(body) < length or zlib.crc32(body) != crc:
                    break
                size = _HEADER.size + length
                if seg > head_seg or pos >= head_off:
                    seq, item = _decode_body(body, self.droppable)
                    self.entries.append(_Loc(seq, seg, pos, size, item.key))
                pos += size
            if pos < len(data):
                log.warning("spool.truncated path=%s kept_bytes=%d cut_bytes=%d",
                            seg_path, pos, len(data) - pos)
                with open(seg_path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
            self.sizes[seg] = pos
            self.writer_id = max(self.writer_id, seg)

    # -- state
    @property
    def size(self) -> int:
        return sum(self.sizes.values())

    @property
    def last_seq(self) -> int:
        return self.entries[-1].seq if self.entries else 0

    # -- writing
    def append(self, records: list[tuple[int, str, bytes]]) -> None:
        """Write ``(seq, key, encoded)`` records at the end, fsync'd."""
        for seq, key, raw in records:
            if self.writer is None or self.sizes.get(self.writer_id, 0) >= self.segment_bytes:
                self._roll()
            assert self.writer is not None
            offset = self.sizes[self.writer_id]
            self.writer.write(raw)
            self.sizes[self.writer_id] = offset + len(raw)
            self.entries.append(_Loc(seq, self.writer_id, offset, len(raw), key))
        if self.writer is not None:
            self.writer.flush()
            if self.fsync:
                os.fsync(self.writer.fileno())

    def _roll(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer_id += 1
        self.writer = open(self._seg_path(self.writer_id), "ab")
        self.sizes[self.writer_id] = 0
        if self.fsync:
            fsync_dir(self.path)

    # -- reading
    def read(self, loc: _Loc) -> SpoolItem:
        if self.writer is not None and loc.segment == self.writer_id:
            self.writer.flush()
        with open(self._seg_path(loc.segment), "rb") as f:
            f.seek(loc.offset + _HEADER.size)
            body = f.read(loc.size - _HEADER.size)
        return _decode_body(body, self.droppable)[1]

    # -- removing from the front
    def ack(self, n: int) -> None:
        """Forget the first ``n`` entries (sent); delete segments left empty."""
        for _ in range(n):
            self.entries.popleft()
        self._collect()

    def drop_oldest_segment(self) -> tuple[list[_Loc], int]:
        """Remove the oldest segment with its unacknowledged entries; returns them."""
        seg = min(self.sizes)
        dropped: list[_Loc] = []
        while self.entries and self.entries[0].segment == seg:
            dropped.append(self.entries.popleft())
        freed = self.sizes[seg]
        if seg == self.writer_id and self.writer is not None:
            self.writer.close()
            self.writer = None
        self._remove(seg)
        self._write_head()
        return dropped, freed

    def _collect(self) -> None:
        first = self.entries[0].segment if self.entries else None
        for seg in sorted(self.sizes):
            if first is not None and seg >= first:
                break
            if seg == self.writer_id and self.writer is not None:
                self.writer.close()
                self.writer = None
            self._remove(seg)
        self._write_head()

    def _remove(self, seg: int) -> None:
        self._seg_path(seg).unlink(missing_ok=True)
        del self.sizes[seg]

    def _write_head(self) -> None:
        if self.entries:
            seg, off = self.entries[0].segment, self.entries[0].offset
        else:
            seg, off = self.writer_id + 1, 0  # everything up to here is acknowledged
        tmp = self.path / "head.tmp"
        with open(tmp, "w") as f:
            f.write(f"{seg} {off}\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path / "head")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Spool:
    """Bounded, durable FIFO of ``SpoolItem``s (see the module docstring).

    ``append`` either stores every item of the call or none (``BusFullError``);
    ``peek(n)`` returns the oldest entries without removing them; ``ack(entries)``
    removes entries that ``peek`` returned, from the front, once they are delivered.
    Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES,
                 segment_bytes: int | None = None, fsync: bool = True) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be > 0, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(8 << 20, max_bytes // 16))
        self.dropped = 0
        """Entries dropped to stay under the bound (telemetry only)."""
        self.dropped_bytes = 0
        self._lock = threading.Lock()
        self._lanes = {
            TELEMETRY: _Lane(self.path / TELEMETRY, True, self.segment_bytes, fsync),
            EVENTS: _Lane(self.path / EVENTS, False, self.segment_bytes, fsync),
        }
        self._seq = max(lane.last_seq for lane in self._lanes.values())
        if len(self):
            log.info("spool.reopened path=%s entries=%d bytes=%d",
                     self.path, len(self), self.size_bytes)

    def __len__(self) -> int:
        return sum(len(lane.entries) for lane in self._lanes.values())

    @property
    def size_bytes(self) -> int:
        """Bytes the spool's segment files hold on disk (what the bound counts)."""
        return sum(lane.size for lane in self._lanes.values())

    def append(self, items: Sequence[SpoolItem]) -> None:
        """Store ``items`` durably, in order, behind everything already spooled.

        Drops the oldest telemetry segments when needed to stay under ``max_bytes``;
        raises ``BusFullError`` (storing nothing) when even that is not enough.
        """
        if not items:
            return
        with self._lock:
            encoded = []
            for item in items:
                self._seq += 1
                encoded.append((self._seq, item, _encode(self._seq, item)))
            need = sum(len(raw) for _, _, raw in encoded)
            self._make_room(need)
            by_lane: dict[str, list[tuple[int, str, bytes]]] = {TELEMETRY: [], EVENTS: []}
            for seq, item, raw in encoded:
                by_lane[TELEMETRY if item.droppable else EVENTS].append((seq, item.key, raw))
            for name, records in by_lane.items():
                if records:
                    self._lanes[name].append(records)

    def _make_room(self, need: int) -> None:
        tel = self._lanes[TELEMETRY]
        if need > self.max_bytes or self.size_bytes + need - tel.size > self.max_bytes:
            raise BusFullError(
                f"spool {self.path} (events and incidents, never dropped, hold "
                f"{self._lanes[EVENTS].size} bytes; {need} more requested)",
                self.max_bytes,
            )
        while self.size_bytes + need > self.max_bytes:
            dropped, freed = tel.drop_oldest_segment()
            self.dropped += len(dropped)
            self.dropped_bytes += freed
            per_node: dict[str, list[int]] = {}
            for loc in dropped:
                n = per_node.setdefault(loc.key, [0, 0])
                n[0] += 1
                n[1] += loc.size
            for node, (count, nbytes) in sorted(per_node.items()):
                log.warning("spool.dropped node=%s batches=%d bytes=%d limit_bytes=%d",
                            node, count, nbytes, self.max_bytes)

    def peek(self, n: int) -> list[SpoolEntry]:
        """The ``n`` oldest entries, in append order, without removing them."""
        with self._lock:
            tel, ev = self._lanes[TELEMETRY], self._lanes[EVENTS]
            out: list[SpoolEntry] = []
            i = j = 0
            while len(out) < n and (i < len(tel.entries) or j < len(ev.entries)):
                use_tel = j >= len(ev.entries) or (
                    i < len(tel.entries) and tel.entries[i].seq < ev.entries[j].seq)
                if use_tel:
                    loc = tel.entries[i]
                    out.append(SpoolEntry(loc.seq, tel.read(loc)))
                    i += 1
                else:
                    loc = ev.entries[j]
                    out.append(SpoolEntry(loc.seq, ev.read(loc)))
                    j += 1
            return out

    def ack(self, entries: Iterable[SpoolEntry]) -> None:
        """Remove delivered entries. They must be the oldest ones (a prefix of ``peek``);
        entries dropped meanwhile are skipped."""
        entries = list(entries)
        with self._lock:
            for lane in self._lanes.values():
                seqs = {e.seq for e in entries if e.item.droppable == lane.droppable}
                n = 0
                while n < len(lane.entries) and lane.entries[n].seq in seqs:
                    n += 1
                if n:
                    lane.ack(n)

    def close(self) -> None:
        with self._lock:
            for lane in self._lanes.values():
                lane.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
