"""The embedded bus: a bounded, on-disk append log in one folder (``embedded://PATH``).

For one host (``make demo``, a single-node install) it replaces Kafka: the agent appends,
the ingest reads from its committed position, and fully consumed segments are deleted.
It survives restarts of either side; appends are fsync'd on ``flush``.

Layout of PATH::

    seg-000000000001.log   SEGMENT_MAGIC, then framed records (``framing``): length,
                           topic, key, value, and checksums of header and body
    offset.json            {"segment": N, "position": bytes} of the one consumer
    .lock                  producers append, and the consumer frees segments, under it

A torn or corrupt record never costs the records after it. The reader resynchronises on
the next whole frame and hands the bytes it skipped over as one record with
``error_code`` ``torn_record`` or ``corrupt_frame`` (ingest quarantines it): never an
exception, never a silent skip. A record whose checksums hold but whose topic byte is
unknown comes as ``unknown_topic``, a key that is not UTF-8 as ``invalid_key``. A
record not all there is an append in progress while a producer holds the lock (wait),
torn once the lock is free or a later segment exists.

Producers repair what a dead producer left: at start-up, when the last segment's tail is
not a whole frame (or the segment predates framing), the next append starts a new
segment, so nothing is ever written after a tear; an append that fails part-way (disk
full) truncates its own partial bytes.

Segments written before framing (``u32 length | u8 topic | u16 key length | key |
value``, no magic) are still read until consumed; appends never go into them. No
migration is needed: upgrade, and the old segments drain.

Bounded: when the segments hold ``max_bytes``, ``send`` raises ``BusFullError`` (the
agent counts it and keeps the batch in its own spool or drops it, loudly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from fleetcare.collectors.contract import Batch, WireFormat, encode_batch
from fleetcare.collectors.transport import (
    EVENTS_TOPIC,
    TELEMETRY_TOPIC,
    BusFullError,
    Record,
    split_batch,
)
from fleetcare.collectors.transport.framing import (
    SEGMENT_MAGIC,
    Frame,
    Incomplete,
    Item,
    Skipped,
    encode_frame,
    scan,
    scan_legacy,
)

log = logging.getLogger(__name__)

_TOPICS = (TELEMETRY_TOPIC, EVENTS_TOPIC)
UNREADABLE_TOPIC = "embedded-bus"
"""The topic of a record the reader could not read as one of ``_TOPICS``."""
MAX_KEPT_BYTES = 1 << 20
"""At most this much of a skipped (torn or corrupt) region is handed over as its bytes."""
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_SEGMENT_BYTES = 64 << 20


def _segments(root: Path) -> list[int]:
    return sorted(int(p.name[4:-4]) for p in root.glob("seg-*.log"))


def _seg_path(root: Path, n: int) -> Path:
    return root / f"seg-{n:012d}.log"


@contextlib.contextmanager
def _locked(root: Path, *, wait: bool = True) -> Iterator[bool]:
    """The bus folder's lock: producers append and the consumer frees segments under it.
    ``wait=False``: yields whether the lock was free (and is now held)."""
    with open(root / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _framed(head: bytes) -> bool | None:
    """From a segment's first bytes: True, framed; False, written before framing; None,
    not all there yet (empty, or a part of ``SEGMENT_MAGIC``)."""
    head = head[:len(SEGMENT_MAGIC)]
    if head == SEGMENT_MAGIC:
        return True
    return None if SEGMENT_MAGIC.startswith(head) else False


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(len(SEGMENT_MAGIC))


def _items(path: Path, pos: int, *, final: bool, limit: int) -> tuple[list[Item], int]:
    """The items of segment ``path`` from ``pos`` (at most ``limit``; a skipped region
    with its first ``MAX_KEPT_BYTES``), and the segment's size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        framed = _framed(f.read(len(SEGMENT_MAGIC)))
        if framed is None:  # the segment's own header is not all there
            if pos >= size:
                return [], size
            return [Skipped(pos, size, torn=True) if final else Incomplete(pos)], size
        if framed:
            pos = max(pos, len(SEGMENT_MAGIC))
        if pos >= size:
            return [], size
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as buf:
            reader = scan if framed else scan_legacy
            return [dataclasses.replace(i, data=buf[i.start:min(i.end, i.start + MAX_KEPT_BYTES)])
                    if isinstance(i, Skipped) else i
                    for i in reader(buf, pos, final=final, limit=limit)], size


class EmbeddedBus:
    """Producer side. Safe for several producer processes (appends hold a file lock)."""

    def __init__(self, path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 wire_format: WireFormat = "msgpack") -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.wire_format = wire_format
        self.sent = 0
        self.rejected = 0
        self._dirty: set[int] = set()
        self._framed: dict[int, bool] = {}  # segment -> takes appends (framed, clean tail)
        with _locked(self.root):
            self._check_tail()

    @classmethod
    def from_url(cls, url: str, **opts: object) -> EmbeddedBus:
        if not url.startswith("embedded://") or len(url) <= len("embedded://"):
            raise ValueError(f"bus URL {url!r} is not embedded://PATH (e.g. embedded://var/bus)")
        return cls(url[len("embedded://"):], **opts)  # type: ignore[arg-type]

    def _check_tail(self) -> None:
        """Start-up repair: the last segment takes appends only if it is framed and ends in
        a whole frame; else the next append starts a new segment (see the module doc)."""
        segs = _segments(self.root)
        if not segs:
            return
        n, path = segs[-1], _seg_path(self.root, segs[-1])
        framed = _framed(_head(path))
        if framed:
            torn = [i for i in _items(path, 0, final=True, limit=1 << 62)[0]
                    if isinstance(i, Skipped)]
            if torn:
                log.warning("bus.torn_tail_repaired path=%s segment=%d bytes=%d: a producer "
                            "died mid-append; new records go to a new segment (the reader "
                            "skips the tear and quarantines it)", self.root, n,
                            torn[-1].end - torn[-1].start)
            self._framed[n] = not torn
        elif framed is False:
            log.info("bus.old_segment path=%s segment=%d: written before record framing; "
                     "read until consumed, new records go to a new segment", self.root, n)
            self._framed[n] = False
        else:
            self._framed[n] = path.stat().st_size == 0

    def _takes_appends(self, n: int) -> bool:
        if n not in self._framed:  # another producer's segment: all write whole frames
            self._framed[n] = _framed(_head(_seg_path(self.root, n))) is not False
        return self._framed[n]

    def size_bytes(self) -> int:
        return sum(_seg_path(self.root, n).stat().st_size for n in _segments(self.root))

    def send(self, batch: Batch) -> None:
        for topic, part in split_batch(batch):
            value = encode_batch(part, self.wire_format)
            self._append(encode_frame(_TOPICS.index(topic), batch.node.encode(), value))
        self.sent += 1

    def _append(self, rec: bytes) -> None:
        with _locked(self.root):
            segs = _segments(self.root)
            total = sum(_seg_path(self.root, n).stat().st_size for n in segs)
            if total + len(rec) + len(SEGMENT_MAGIC) > self.max_bytes:
                self.rejected += 1
                log.error("bus.full path=%s bytes=%d limit=%d", self.root, total, self.max_bytes)
                raise BusFullError(f"embedded bus {self.root}", self.max_bytes)
            n = segs[-1] if segs else 1
            if segs and (not self._takes_appends(n)
                         or _seg_path(self.root, n).stat().st_size >= self.segment_bytes):
                n += 1
            self._write(n, rec)
            self._framed[n] = True
            self._dirty.add(n)

    def _write(self, n: int, rec: bytes) -> None:
        """Append ``rec`` to segment ``n`` (its magic first when new); a write that fails
        part-way is cut off again, so no torn record stays behind a live producer."""
        fd = os.open(_seg_path(self.root, n), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            data = memoryview((SEGMENT_MAGIC if start == 0 else b"") + rec)
            try:
                while data:
                    data = data[os.write(fd, data):]
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)

    def flush(self, timeout_s: float | None = None) -> None:
        for n in list(self._dirty):
            try:
                fd = os.open(_seg_path(self.root, n), os.O_RDONLY)
            except FileNotFoundError:
                continue  # consumed and freed meanwhile: nothing left to make durable
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty.clear()

    def close(self) -> None:
        self.flush()


class EmbeddedConsumer:
    """Consumer side: one reader; ``commit`` persists the position and frees segments."""

    def __init__(self, path: str | Path) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._offset_file = self.root / "offset.json"
        if self._offset_file.exists():
            pos = json.loads(self._offset_file.read_text())
            self._seg, self._pos = int(pos["segment"]), int(pos["position"])
        else:
            segs = _segments(self.root)
            self._seg, self._pos = (segs[0] if segs else 1), 0
        self._read_seg, self._read_pos = self._seg, self._pos

    @classmethod
    def from_url(cls, url: str) -> EmbeddedConsumer:
        return cls(EmbeddedBus.from_url(url).root)

    def poll(self, timeout_s: float = 0.0, max_records: int = 10_000) -> list[Record]:
        """Records from the read position; never raises for what it finds on disk."""
        out: list[Record] = []
        while len(out) < max_records:
            later = [n for n in _segments(self.root) if n > self._read_seg]
            path = _seg_path(self.root, self._read_seg)
            at_end = True
            if path.exists():
                at_end = self._read_from(path, max_records - len(out), out, final=bool(later))
            if not at_end:  # max_records, or an append in progress (the rest next time)
                break
            if not later:
                break
            self._read_seg, self._read_pos = later[0], 0
        return out

    def _read_from(self, path: Path, limit: int, out: list[Record], *, final: bool) -> bool:
        """Append up to ``limit`` records of ``path``; True when the whole segment is read."""
        items, size = _items(path, self._read_pos, final=final, limit=limit)
        if items and isinstance(items[-1], Incomplete):
            # a producer mid-append, or a torn record: torn if nobody holds the lock
            with _locked(self.root, wait=False) as free:
                if free:
                    items, size = _items(path, self._read_pos, final=True, limit=limit)
        for item in items:
            if isinstance(item, Incomplete):
                return False
            out.append(self._record(path, item))
            self._read_pos = item.end
        return self._read_pos >= size

    def _record(self, path: Path, item: Item) -> Record:
        seg = self._read_seg
        if isinstance(item, Frame):
            try:
                key = item.key.decode()
            except UnicodeDecodeError:
                return Record(UNREADABLE_TOPIC, item.key.decode(errors="replace"), item.value,
                              seg, item.start, error_code="invalid_key",
                              error=f"the record's key {item.key[:64]!r} is not UTF-8 text; "
                                    "keys are node names")
            if item.topic >= len(_TOPICS):
                return Record(UNREADABLE_TOPIC, key, item.value, seg, item.start,
                              error_code="unknown_topic",
                              error=f"topic byte {item.topic} is not one this reader knows "
                                    f"({', '.join(f'{i} = {t}' for i, t in enumerate(_TOPICS))})"
                                    ": a newer fleetcare wrote it; upgrade the pipeline")
            return Record(_TOPICS[item.topic], key, item.value, seg, item.start)
        assert isinstance(item, Skipped)
        length = item.end - item.start
        kept = "" if length <= MAX_KEPT_BYTES else f" (the first {MAX_KEPT_BYTES:,} kept)"
        what = ("the start of a record whose writer died mid-append" if item.torn
                else "no whole record (a checksum or header is wrong)")
        return Record(UNREADABLE_TOPIC, "", item.data, seg, item.start,
                      error_code="torn_record" if item.torn else "corrupt_frame",
                      error=f"{length:,} bytes at {path.name}:{item.start} are {what}; the "
                            f"reader skipped to the next whole record{kept}")

    def commit(self) -> None:
        self._seg, self._pos = self._read_seg, self._read_pos
        tmp = self._offset_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"segment": self._seg, "position": self._pos}))
        os.replace(tmp, self._offset_file)
        with _locked(self.root):  # a producer appending must not see a segment vanish
            for n in _segments(self.root):
                if n < self._seg:
                    _seg_path(self.root, n).unlink(missing_ok=True)

    def lag_bytes(self) -> int:
        total = 0
        for n in _segments(self.root):
            size = _seg_path(self.root, n).stat().st_size
            total += size - self._pos if n == self._seg else (size if n > self._seg else 0)
        return total

    def close(self) -> None:
        pass
