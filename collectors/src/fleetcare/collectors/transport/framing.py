"""Record framing of the embedded bus's segment files: length + checksums, resynchronising.

A segment written by this version starts with ``SEGMENT_MAGIC``; then frames::

    magic "\\xfc\\xb5" | u8 topic | u16 key length | u32 value length | u32 header crc | u32 body crc | key | value

``header crc`` is CRC-32 (zlib) of the 9 bytes before it, ``body crc`` of key + value.
A reader that meets bytes that are no whole frame (a torn append, a flipped bit, a disk
that returned zeros) skips to the next position where a frame with both checksums right
begins, and reports the bytes it skipped (``Skipped``): nothing after a bad record is lost.

Segments written before framing (no ``SEGMENT_MAGIC``) hold ``u32 value length | u8 topic
| u16 key length | key | value`` records; ``scan_legacy`` still reads them, without
resynchronisation (they have no checksum to resynchronise on).

``scan`` is pure (bytes in, items out): the consumer runs it over a segment's memory map,
the fuzz tests over mutated bytes.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

SEGMENT_MAGIC = b"FCBUS\x00\x02\n"
"""The first 8 bytes of a segment with framed records (format 2)."""
FRAME_MAGIC = b"\xfc\xb5"
_HEAD = struct.Struct("<2sBHII")  # magic, topic, key length, value length, header crc
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEAD.size + _CRC.size  # 17
LEGACY_HEAD = struct.Struct("<IBH")  # format 1: value length, topic, key length
MAX_VALUE_BYTES = 1 << 30
"""No record is larger (the bus's own bound is 1 GiB by default)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """A whole record at ``[start, end)``: topic byte, key and value bytes."""

    start: int
    end: int
    topic: int
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Skipped:
    """Bytes ``[start, end)`` that are no whole record; ``torn`` when they are the start of
    a record that was never completed (its writer died), else corrupt. ``data``: their
    first bytes, when the caller kept them (``scan`` does not)."""

    start: int
    end: int
    torn: bool
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Incomplete:
    """A record begins at ``start`` but is not all there yet (or was torn: the caller
    decides, see ``scan(final=...)``). Always the last item."""

    start: int


Item = Frame | Skipped | Incomplete
Buffer = bytes | mmap.mmap
"""What ``scan`` reads: bytes, or a segment file's memory map (both have ``find``)."""


def encode_frame(topic: int, key: bytes, value: bytes) -> bytes:
    """One framed record."""
    head = struct.pack("<2sBHI", FRAME_MAGIC, topic, len(key), len(value))
    return (head + _CRC.pack(zlib.crc32(head)) + _CRC.pack(zlib.crc32(value, zlib.crc32(key)))
            + key + value)


def _header(buf: Buffer, pos: int) -> tuple[int, int, int, int] | None:
    """(topic, key length, value length, body crc) of a valid header at ``pos``, else None."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    magic, topic, klen, vlen, hcrc = _HEAD.unpack_from(buf, pos)
    if magic != FRAME_MAGIC or vlen > MAX_VALUE_BYTES:
        return None
    if zlib.crc32(buf[pos:pos + _HEAD.size - 4]) != hcrc:
        return None
    return topic, klen, vlen, _CRC.unpack_from(buf, pos + _HEAD.size)[0]


def _frame_at(buf: Buffer, pos: int) -> Frame | Incomplete | None:
    """The whole frame at ``pos``; Incomplete when its header is right and its body runs
    past the end; None when there is no frame there."""
    head = _header(buf, pos)
    if head is None:
        return None
    topic, klen, vlen, bcrc = head
    body = pos + HEADER_SIZE
    end = body + klen + vlen
    if end > len(buf):
        return Incomplete(pos)
    if zlib.crc32(buf[body:end]) != bcrc:
        return None
    return Frame(pos, end, topic, bytes(buf[body:body + klen]), bytes(buf[body + klen:end]))


def _resync(buf: Buffer, pos: int) -> int | None:
    """The first position after ``pos`` where a frame (whole, or started) begins."""
    at = pos
    while True:
        at = buf.find(FRAME_MAGIC, at + 1)
        if at < 0:
            return None
        if _frame_at(buf, at) is not None:
            return at


def _could_be_header(buf: Buffer, pos: int) -> bool:
    """Fewer than a header's bytes left at ``pos``: could they start one?"""
    rest = buf[pos:pos + len(FRAME_MAGIC)]
    return FRAME_MAGIC.startswith(rest)


def scan(buf: Buffer, pos: int, *, final: bool, limit: int = 1 << 62
         ) -> Iterator[Item]:
    """The items of a framed segment's bytes from ``pos`` (just after ``SEGMENT_MAGIC`` or
    a frame), at most ``limit`` of them.

    ``final``: no writer is appending now (the bus lock is free, or a later segment
    exists), so a record that is not all there was torn: the bytes up to the next frame
    (or the end) are ``Skipped(torn=True)``. Otherwise it may be an append in progress:
    ``Incomplete`` ends the scan, and corrupt bytes stop short of a frame that may be
    starting at the very end.
    """
    n = len(buf)
    emitted = 0
    while pos < n and emitted < limit:
        got = _frame_at(buf, pos) if n - pos >= HEADER_SIZE else (
            Incomplete(pos) if _could_be_header(buf, pos) else None)
        if isinstance(got, Frame):
            yield got
            pos = got.end
        elif isinstance(got, Incomplete):
            if not final:
                yield got
                return
            nxt = _resync(buf, pos)
            end = n if nxt is None else nxt
            yield Skipped(pos, end, torn=True)
            pos = end
        else:
            nxt = _resync(buf, pos)
            end = n if nxt is None else nxt
            if nxt is None and not final:  # a frame may be starting in the last bytes
                end = next((at for at in range(max(pos + 1, n - HEADER_SIZE + 1), n)
                            if _could_be_header(buf, at)), n)
            # a right header whose body is cut by the next whole frame: a torn append that
            # another producer wrote after, not corrupt bytes
            head = _header(buf, pos)
            torn = (head is not None and nxt is not None
                    and nxt < pos + HEADER_SIZE + head[1] + head[2])
            yield Skipped(pos, end, torn=torn)
            pos = end
        emitted += 1


def scan_legacy(buf: Buffer, pos: int, *, final: bool, limit: int = 1 << 62
                ) -> Iterator[Item]:
    """The records of a segment written before framing (no checksum: no resync)."""
    n = len(buf)
    emitted = 0
    while pos < n and emitted < limit:
        if n - pos < LEGACY_HEAD.size:
            yield Skipped(pos, n, torn=True) if final else Incomplete(pos)
            return
        vlen, topic, klen = LEGACY_HEAD.unpack_from(buf, pos)
        body = pos + LEGACY_HEAD.size
        end = body + klen + vlen
        if end > n:
            yield Skipped(pos, n, torn=True) if final else Incomplete(pos)
            return
        yield Frame(pos, end, topic, bytes(buf[body:body + klen]), bytes(buf[body + klen:end]))
        pos = end
        emitted += 1
