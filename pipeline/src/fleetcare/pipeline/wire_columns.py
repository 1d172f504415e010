"""Decoding a poll's msgpack batches with the NVLink lists left as bytes, then turning
those bytes into Arrow list columns with numpy: no Python object per link.

A GPU sample carries five per-link NVLink lists (18 entries each on an H100): 90 Python
objects a sample when decoded into a ``GpuSample``, and converting them back into arrays
was the largest cost of Kafka ingest (README, issue 15 §4). ``WIRE_BATCH`` decodes the
same bytes as ``contract.Batch`` except that those five fields are ``msgspec.Raw``
(``WireSample``); ``link_columns`` then reads every list of a poll at once from one
buffer. msgpack writes a list as a header (``0x90|n`` up to 15 entries, ``0xdc`` and a
16-bit count beyond) and one item after another; an integer is one byte below 128 (and
from ``0xe0`` for -32..-1), else a type byte (``0xcc``..``0xd3``) and 1-8 big-endian
bytes; ``true`` / ``false`` are ``0xc3`` / ``0xc2``; nil is ``0xc0``. So the decoder
walks item ``k`` of every list in one numpy step, for ``k`` up to the longest list.

A list it cannot read that way (an item of another type, an integer past int64, a
32-bit list header) is *slow*: ``as_list`` decodes it strictly with msgspec, which
either gives the list (the column is then converted from Python lists, as before) or
raises what ``decode_batch`` would have raised for the whole batch; the validator then
opens that record with the strict decoder, so its rejection is exactly what it was.

``as_sample`` / ``full_batch`` give back the contract's ``GpuSample`` / ``Batch`` (the
lists decoded) for the few places that need Python values: the checks of a suspect
sample, a sink converting rows itself; ``as_list`` one list (the urgent-signal hook's
``nvlink_up``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.contract import Batch, GpuSample
from fleetcare.pipeline.schema import NVLINK_LISTS


def _mirror(name: str, struct: type[msgspec.Struct], types: dict[str, Any],
            **options: Any) -> Any:
    """A struct with ``struct``'s fields, order and defaults, ``types`` overriding some."""
    fields: list[Any] = []
    for f in msgspec.structs.fields(struct):
        typ = types.get(f.name, f.type)
        if f.required:
            fields.append((f.name, typ))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, typ, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, typ, f.default))
    return msgspec.defstruct(name, fields, **options)


WireSample: Any = _mirror("WireSample", GpuSample, dict.fromkeys(NVLINK_LISTS, msgspec.Raw),
                          kw_only=True, frozen=True, omit_defaults=True)
"""``GpuSample`` with its NVLink lists as the raw msgpack bytes (None when absent)."""
WireBatch: Any = _mirror("WireBatch", Batch, {"samples": list[WireSample]},
                         kw_only=True, frozen=True)
"""``Batch`` whose samples are ``WireSample``."""
WIRE_BATCH = msgspec.msgpack.Decoder(WireBatch)
WIRE_SAMPLE = msgspec.msgpack.Decoder(WireSample)
RawBatch: Any = _mirror("RawBatch", Batch, {"samples": list[msgspec.Raw]}, kw_only=True,
                        frozen=True)
"""``Batch`` whose samples are left as their msgpack bytes (``msgspec.Raw``), for
``wire_samples.decode`` to read into columns."""
RAW_BATCH = msgspec.msgpack.Decoder(RawBatch)
_SAMPLE = msgspec.msgpack.Decoder(GpuSample)

_LIST_TYPES = {name: (list[bool] if name == "nvlink_up" else list[int]) | None
               for name in NVLINK_LISTS}
_LIST_DECODERS = {name: msgspec.msgpack.Decoder(t) for name, t in _LIST_TYPES.items()}
_NAMES = tuple(GpuSample.__struct_fields__)
_NIL = b"\xc0"
_ENCODE = msgspec.msgpack.Encoder().encode


def as_list(name: str, value: Any) -> list[Any] | None:
    """The NVLink list ``name`` of one sample as Python values (``value`` raw or decoded).
    Raises ``msgspec.ValidationError`` / ``DecodeError`` for bytes that are not one."""
    if isinstance(value, msgspec.Raw):
        decoded: list[Any] | None = _LIST_DECODERS[name].decode(value)
        return decoded
    return value  # type: ignore[no-any-return]


def as_sample(sample: Any) -> GpuSample:
    """``sample`` as the contract's ``GpuSample`` (a ``WireSample``'s lists decoded, a
    ``msgspec.Raw`` decoded strictly)."""
    if isinstance(sample, GpuSample):
        return sample
    if isinstance(sample, msgspec.Raw):
        return _SAMPLE.decode(sample)
    values = dict(zip(_NAMES, msgspec.structs.astuple(sample), strict=True))
    for name in NVLINK_LISTS:
        values[name] = as_list(name, values[name])
    return GpuSample(**values)


def full_batch(batch: Any) -> Batch:
    """``batch`` as the contract's ``Batch`` (identity for one already)."""
    if isinstance(batch, Batch):
        return batch
    fields = {n: getattr(batch, n) for n in Batch.__struct_fields__}
    fields["samples"] = [as_sample(s) for s in batch.samples]
    return Batch(**fields)


@dataclass(frozen=True, slots=True)
class LinkColumns:
    """The NVLink lists of a poll, read from their bytes."""

    arrays: dict[str, pa.ListArray]
    """Per list name, the Arrow column (``schema.SAMPLE_SCHEMA``'s type; null: absent)."""
    counts: dict[str, np.ndarray]
    """Per list name, each sample's entry count (float64; NaN: null), for the checks."""
    values: dict[str, np.ndarray]
    """Per list name, every entry of every sample (int64; bool for ``nvlink_up``)."""

    @classmethod
    def of(cls, arrays: dict[str, pa.Array]) -> LinkColumns:
        """The NVLink columns of a poll already in Arrow (``wire_samples.decode``)."""
        out = cls({}, {}, {})
        for name in NVLINK_LISTS:
            arr = out.arrays[name] = arrays[name]
            counts = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            out.counts[name] = np.where(arr.is_null().to_numpy(zero_copy_only=False),
                                        np.nan, counts.astype(np.float64))
            out.values[name] = arr.flatten().to_numpy(zero_copy_only=False)
        return out

    def rows(self, name: str, entries: np.ndarray) -> np.ndarray:
        """The samples that hold the entries ``entries`` (a mask over ``values[name]``)."""
        counts = np.nan_to_num(self.counts[name]).astype(np.int64)
        return np.unique(np.repeat(np.arange(len(counts)), counts)[entries])


def link_columns(cols: dict[str, Sequence[Any]]) -> LinkColumns | set[int]:
    """The five NVLink columns of a poll (``cols[name][i]``: sample ``i``'s raw bytes,
    its list, or None) read at once; or, when some list cannot be read that way, the
    samples whose lists are slow (see the module docstring). A list decoded already (a
    record opened strictly, JSON) is encoded again first: a few such records must not
    send the whole poll down the slow path."""
    n = len(cols[NVLINK_LISTS[0]])
    vals: tuple[Any, ...] = ()
    for name in NVLINK_LISTS:
        vals += tuple(cols[name])
    if None in vals:
        vals = tuple(_NIL if v is None else v for v in vals)
    try:
        joined = b"".join(vals)
    except TypeError:  # some came decoded (JSON, a record opened strictly): bytes again
        vals = tuple(v if isinstance(v, msgspec.Raw | bytes) else _ENCODE(v) for v in vals)
        joined = b"".join(vals)
    buf = np.frombuffer(joined, dtype=np.uint8)
    lens = np.fromiter(map(len, vals), dtype=np.int64, count=len(vals))
    starts = np.cumsum(lens) - lens
    count, hlen, null, slow = _headers(buf, starts)
    ends = np.cumsum(count)
    split = int(ends[n - 1]) if n else 0  # nvlink_up's items first: booleans, then integers
    values = None
    if not slow.any() and np.array_equal(lens, hlen + count):  # every item one byte
        values = _bytes(buf, starts, hlen, split)
    if values is None:
        values, isbool, slow = _items(buf, starts + hlen, count, slow)
        if not isbool[:split].all() or isbool[split:].any():
            kind = np.repeat(np.arange(len(vals)) < n, count)
            slow[np.repeat(np.arange(len(vals)), count)[isbool != kind]] = True
        if slow.any():
            return {int(i) % n for i in np.flatnonzero(slow)}
    out = LinkColumns({}, {}, {})
    for j, name in enumerate(NVLINK_LISTS):
        lo, hi = j * n, (j + 1) * n
        c, nul = count[lo:hi], null[lo:hi]
        first = int(ends[lo - 1]) if lo else 0
        flat = values[first:int(ends[hi - 1]) if hi else 0]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(c, out=offsets[1:])
        boolean = name == "nvlink_up"
        flat = flat.astype(bool) if boolean else flat
        out.arrays[name] = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(flat, type=pa.bool_() if boolean else pa.int64()),
            mask=pa.array(nul) if nul.any() else None)
        out.counts[name] = np.where(nul, np.nan, c.astype(np.float64))
        out.values[name] = flat
    return out


def _headers(buf: np.ndarray, starts: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per raw value: its list's entry count and header length, whether it is nil, and
    whether it is something else (slow)."""
    h = buf[starts] if len(starts) else np.zeros(0, dtype=np.uint8)
    fix = (h & 0xF0) == 0x90
    a16 = h == 0xDC
    null = h == 0xC0
    count = np.where(fix, h & 0x0F, 0).astype(np.int64)
    hlen = np.where(a16, 3, 1).astype(np.int64)
    at = starts[a16]
    count[a16] = buf[at + 1].astype(np.int64) * 256 + buf[at + 2]
    return count, hlen, null, ~(fix | a16 | null)


_INTS = ((0xCC, 1, False), (0xCD, 2, False), (0xCE, 4, False), (0xCF, 8, False),
         (0xD0, 1, True), (0xD1, 2, True), (0xD2, 4, True), (0xD3, 8, True))


def _bytes(buf: np.ndarray, starts: np.ndarray, hlen: np.ndarray, split: int
           ) -> np.ndarray | None:
    """Every item's value (``nvlink_up``'s, the first ``split``, 0 / 1) when every item is
    one byte (the usual case: counters below 128, booleans), or None when some is not a
    boolean where ``nvlink_up``'s are or a fixint where the counters' are (``_items``
    then says which). The buffer less the list headers is the items, in order; a one-byte
    integer is its byte read as int8 (fixints 0..127, negative fixints -32..-1)."""
    item = np.ones(len(buf), dtype=bool)
    item[starts] = False
    wide = starts[hlen == 3]
    item[wide + 1] = item[wide + 2] = False
    b = buf[item]
    up, ints = b[:split], b[split:].view(np.int8)
    if not (((up | 1) == 0xC3).all() and (ints >= -32).all()):  # 0xc2 / 0xc3; 0xe0..0x7f
        return None
    values = ints.astype(np.int64) if not split else np.empty(len(b), dtype=np.int64)
    if split:
        values[:split] = up == 0xC3
        values[split:] = ints
    return values


_CODES = np.arange(256)
_BOOLEAN = (_CODES == 0xC2) | (_CODES == 0xC3)
"""Per msgpack type byte: whether it is a boolean."""
_ONE_BYTE = (_CODES < 0x80) | (_CODES >= 0xE0) | _BOOLEAN
"""Per msgpack type byte: whether it is a whole item (fixint, negative fixint, boolean)."""
_VALUE = np.where(_CODES >= 0xE0, _CODES - 256, np.where(_BOOLEAN, _CODES == 0xC3, _CODES))
"""Per msgpack type byte: the value of that one-byte item (int64)."""


def _one_byte(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one-byte items among type bytes ``b``: value, size (1, else 0), boolean."""
    return _VALUE[b], _ONE_BYTE[b].astype(np.int64), _BOOLEAN[b]


def _items(buf: np.ndarray, pos: np.ndarray, count: np.ndarray, slow: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every list's items, item ``k`` of all lists in one step: the values (int64), which
    were booleans, and the lists that hold anything else (slow)."""
    slow = slow.copy()
    count = np.where(slow, 0, count)
    first = np.cumsum(count) - count
    total = int(count.sum())
    values = np.zeros(total, dtype=np.int64)
    isbool = np.zeros(total, dtype=bool)
    pos = pos.copy()
    for k in range(int(count.max()) if len(count) else 0):
        rows = np.flatnonzero((count > k) & ~slow)  # (past a bad item a list is unread)
        at = pos[rows]
        val, size, boolean = _read(buf, at)
        slow[rows[size == 0]] = True
        values[first[rows] + k] = val
        isbool[first[rows] + k] = boolean
        pos[rows] = at + size  # (a list with a bad item is slow: not read again)
    return values, isbool, slow


def _read(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The msgpack item at each of ``at``: value, size in bytes (0: not an integer or a
    boolean, or an integer past int64) and whether it is a boolean."""
    b = buf[at]
    val, size, boolean = _one_byte(b)
    for code, width, signed in _INTS:
        m = b == code
        if not m.any():
            continue
        q = at[m] + 1
        acc = np.zeros(len(q), dtype=np.uint64)
        for i in range(width):  # a complete msgpack value: its bytes are all there
            acc = (acc << np.uint64(8)) | buf[q + i].astype(np.uint64)
        if signed:
            v = acc.view(np.int64) if width == 8 else acc.astype(np.int64)
            if width < 8:
                v = np.where(v >= 1 << (8 * width - 1), v - (1 << (8 * width)), v)
            fits = np.ones(len(q), dtype=bool)
        else:
            fits = acc < np.uint64(1 << 63)
            v = np.where(fits, acc, 0).astype(np.int64)
        val[m] = v
        size[m] = np.where(fits, 1 + width, 0)
    return val, size, boolean
