"""The embedded bus: a bounded, on-disk append log in one folder (``embedded://PATH``).

For one host (``make demo``, a single-node install) it replaces Kafka: the agent appends,
the ingest reads from its committed position, and fully consumed segments are deleted.
It survives restarts of either side; appends are fsync'd on ``flush``.

Layout of PATH::

    seg-000000000001.log   records: u32 length | u8 topic | u16 key length | key | value
    offset.json            {"segment": N, "position": bytes} of the one consumer

Bounded: when the segments hold ``max_bytes``, ``send`` raises ``BusFullError`` (the
agent counts it and keeps the batch in its own spool or drops it, loudly).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
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

log = logging.getLogger(__name__)

_TOPICS = (TELEMETRY_TOPIC, EVENTS_TOPIC)
_HEAD = struct.Struct("<IBH")
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_SEGMENT_BYTES = 64 << 20


def _segments(root: Path) -> list[int]:
    return sorted(int(p.name[4:-4]) for p in root.glob("seg-*.log"))


def _seg_path(root: Path, n: int) -> Path:
    return root / f"seg-{n:012d}.log"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The bus folder's lock: producers append and the consumer frees segments under it."""
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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

    @classmethod
    def from_url(cls, url: str, **opts: object) -> EmbeddedBus:
        if not url.startswith("embedded://") or len(url) <= len("embedded://"):
            raise ValueError(f"bus URL {url!r} is not embedded://PATH (e.g. embedded://var/bus)")
        return cls(url[len("embedded://"):], **opts)  # type: ignore[arg-type]

    def size_bytes(self) -> int:
        return sum(_seg_path(self.root, n).stat().st_size for n in _segments(self.root))

    def send(self, batch: Batch) -> None:
        for topic, part in split_batch(batch):
            value = encode_batch(part, self.wire_format)
            key = batch.node.encode()
            rec = _HEAD.pack(len(value), _TOPICS.index(topic), len(key)) + key + value
            self._append(rec)
        self.sent += 1

    def _append(self, rec: bytes) -> None:
        with _locked(self.root):
            segs = _segments(self.root)
            total = sum(_seg_path(self.root, n).stat().st_size for n in segs)
            if total + len(rec) > self.max_bytes:
                self.rejected += 1
                log.error("bus.full path=%s bytes=%d limit=%d", self.root, total, self.max_bytes)
                raise BusFullError(f"embedded bus {self.root}", self.max_bytes)
            n = segs[-1] if segs else 1
            if segs and _seg_path(self.root, n).stat().st_size >= self.segment_bytes:
                n += 1
            with open(_seg_path(self.root, n), "ab") as f:
                f.write(rec)
            self._dirty.add(n)

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
        out: list[Record] = []
        while len(out) < max_records:
            path = _seg_path(self.root, self._read_seg)
            got = self._read_from(path, max_records - len(out), out) if path.exists() else 0
            if got:
                continue
            later = [n for n in _segments(self.root) if n > self._read_seg]
            if not later:
                break
            self._read_seg, self._read_pos = later[0], 0
        return out

    def _read_from(self, path: Path, limit: int, out: list[Record]) -> int:
        got = 0
        with open(path, "rb") as f:
            f.seek(self._read_pos)
            while got < limit:
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    break  # end, or a record still being written
                vlen, topic, klen = _HEAD.unpack(head)
                body = f.read(klen + vlen)
                if len(body) < klen + vlen:
                    break
                out.append(Record(topic=_TOPICS[topic], key=body[:klen].decode(),
                                  value=body[klen:], partition=self._read_seg,
                                  offset=self._read_pos))
                self._read_pos += _HEAD.size + klen + vlen
                got += 1
        return got

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
