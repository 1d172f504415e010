"""A poll's GPU samples decoded from their msgpack bytes straight into Arrow columns.

msgspec decodes a sample into a Python object per field (a datetime, four strings, 30
numbers and five lists), and the screen then turned those back into columns: ~5 µs a
sample, the largest share of Kafka ingest (README, issue 15 §4). ``decode(raws)`` walks
every sample's msgpack map in one compiled loop (numba) and writes each field into its
column: no Python object per value.

It decodes only what it is sure of, exactly as ``msgspec`` decodes a ``GpuSample``:

- a map (fixmap or map16) whose keys are field names (fixstr), each at most once, every
  required field present and not nil;
- integers (every msgpack width up to int64) for integer fields; floats (32/64 bit) or
  integers for float fields; booleans for boolean fields; ASCII strings for string fields;
  the msgpack timestamp extension (32, 64 or 96 bit, whole microseconds, from 1970 on) or
  RFC 3339 text (``YYYY-MM-DDTHH:MM:SS``, 1-6 fraction digits, ``Z`` or ``±HH:MM``) for
  ``ts``; lists of integers / booleans (fixarray or array16) for the NVLink lists; nil
  for an optional field.

Anything else (an unknown key, a duplicate, a string temperature, a counter past int64, a
non-ASCII name, another form of ``ts``, nanoseconds) leaves the sample *undecided*: the caller
decodes it with msgspec, which keeps or refuses it with its own words, so no sample is
decoded differently here and no reason changes. ``tests/pipeline/test_wire_samples.py``
holds the columns equal to msgspec + Arrow for random samples, every msgpack width and
random byte mutations.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline.schema import SAMPLE_SCHEMA

INT, FLOAT, BOOL, STR, TS, INT_LIST, BOOL_LIST = range(7)
_KINDS = {pa.int64(): INT, pa.float64(): FLOAT, pa.bool_(): BOOL, pa.string(): STR,
          pa.timestamp("us"): TS, pa.list_(pa.int64()): INT_LIST,
          pa.list_(pa.bool_()): BOOL_LIST}
FIELDS = tuple(f.name for f in SAMPLE_SCHEMA)
KIND = np.array([_KINDS[f.type] for f in SAMPLE_SCHEMA], dtype=np.int8)
_SPANS = np.isin(KIND, (STR, INT_LIST, BOOL_LIST))
SLOT = np.zeros(len(FIELDS), dtype=np.int64)
SLOT[~_SPANS] = np.arange(int((~_SPANS).sum()))
SLOT[_SPANS] = np.arange(int(_SPANS.sum()))
"""Per field, its row of ``num`` (a number) or of ``size`` (a string, a list)."""
_STRS, _LISTS = KIND == STR, np.isin(KIND, (INT_LIST, BOOL_LIST))
STORE = np.zeros(len(FIELDS), dtype=np.int64)
STORE[_STRS] = np.arange(int(_STRS.sum()))
STORE[_LISTS] = np.arange(int(_LISTS.sum()))
"""Per string / list field, its row of the string bytes / list items written."""
_REQUIRED = {f.name for f in msgspec.structs.fields(GpuSample) if f.required}
REQUIRED = np.array([name in _REQUIRED for name in FIELDS], dtype=np.bool_)
_NAME_BYTES = [name.encode() for name in FIELDS]
NAMES = np.frombuffer(b"".join(_NAME_BYTES), dtype=np.uint8)
NAME_AT = np.cumsum([0] + [len(b) for b in _NAME_BYTES]).astype(np.int64)
MAX_LIST = 4096
"""Longer NVLink lists are left to msgspec (the screen rejects more than 18 anyway)."""
FIRST_SECOND, END_SECOND = 0, 253_402_300_800
"""Timestamps decoded here: 1970-01-01 up to the end of 9999 (``datetime``'s)."""

_PAD = bytes(64)
F64, F32, AN_INT = range(3)
"""What a float field's number holds: float64 bits, float32 bits, an integer."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """What ``decode`` made of a poll's samples."""

    rows: np.ndarray
    """The indices (into ``raws``) of the samples decoded, in order."""
    arrays: dict[str, pa.Array]
    """Per ``schema.SAMPLE_SCHEMA`` field, the column of those samples."""
    undecided: np.ndarray
    """The indices of the others, for msgspec."""


def decode(raws: Sequence[Any]) -> Decoded:
    """``raws`` (each one sample's msgpack bytes, e.g. ``msgspec.Raw``) as columns."""
    from fleetcare.pipeline import wire_kernels  # (numba: imported, compiled, on first use)

    lens = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    # one copy of the bytes (``join(...) + pad`` made two: a page fault every 4 KiB each)
    buf = np.frombuffer(b"".join([*raws, _PAD]), dtype=np.uint8)  # (reads past the end)
    ends = np.cumsum(lens)
    starts = ends - lens
    n, spans = len(raws), int(_SPANS.sum())
    ok = np.zeros(n, dtype=np.bool_)
    present = np.zeros((len(FIELDS), n), dtype=np.bool_)
    num = _pooled((len(FIELDS) - spans, n), np.int64)  # (read where present)
    code = np.empty((len(FIELDS) - spans, n), dtype=np.int8)
    size = np.zeros((spans, n), dtype=np.int64)
    strs = _pooled((int(_STRS.sum()), 48 * n + 64), np.uint8)
    items = _pooled((int(_LISTS.sum()), 18 * n + 64), np.int64)
    str_end = np.zeros(len(strs), dtype=np.int64)
    item_end = np.zeros(len(items), dtype=np.int64)
    first = 0
    while n:
        first = wire_kernels.walk(buf, starts, ends, NAMES, NAME_AT, KIND, REQUIRED, SLOT, STORE,
                      MAX_LIST, first, ok, present, num, code, size, strs, str_end, items,
                      item_end)
        if first < 0:
            break
        strs, items = _wider(strs), _wider(items)  # (rare: long strings, many links)
    rows = np.flatnonzero(ok)
    every = len(rows) == n
    arrays: dict[str, pa.Array] = {}
    for f, name in enumerate(FIELDS):
        kind, row = int(KIND[f]), SLOT[f]
        valid = present[f] if every else present[f, rows]
        if kind == STR:
            end = int(str_end[STORE[f]])
            arrays[name] = _strings(valid, size[row] if every else size[row, rows],
                                    strs[STORE[f], :end])
        elif kind in (INT_LIST, BOOL_LIST):
            end = int(item_end[STORE[f]])
            arrays[name] = _lists(valid, size[row] if every else size[row, rows],
                                  items[STORE[f], :end], kind == BOOL_LIST)
        else:
            arrays[name] = _numbers(kind, valid, num[row] if every else num[row, rows],
                                    code[row] if every else code[row, rows])
    return Decoded(rows, arrays, np.flatnonzero(~ok))


@functools.cache
def prepare() -> None:
    """Load (or, the first time on a machine, compile: a few seconds) the compiled loop,
    so a service pays it when it starts, not on its first poll."""
    import datetime as dt

    sample = GpuSample(ts=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), node="n", gpu_uuid="u",
                       gpu_index=0, pci_bus_id="p", model="m", nvlink_up=[True],
                       nvlink_crc_flit=[0])
    decode([msgspec.msgpack.encode(sample)])


def _pooled(shape: tuple[int, int], dtype: Any) -> np.ndarray:
    """An uninitialised array in Arrow's memory pool, for what the columns keep (numbers,
    string bytes, list items). The pool keeps freed memory for the next poll; numpy's
    large arrays are fresh pages each time (a page fault every 4 KiB of them: ~0.3 s
    for a poll's 90 MB here while a sink still holds the previous poll's)."""
    count = shape[0] * shape[1]
    buf = pa.allocate_buffer(max(count * np.dtype(dtype).itemsize, 1))
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _wider(rows: np.ndarray) -> np.ndarray:
    """``rows`` with twice the room, what they hold kept."""
    out = _pooled((rows.shape[0], 2 * rows.shape[1]), rows.dtype)
    out[:, :rows.shape[1]] = rows
    return out


def _numbers(kind: int, valid: np.ndarray, num: np.ndarray, code: np.ndarray) -> pa.Array:
    """A number column (integers, booleans, timestamps, floats) from what ``_walk`` wrote."""
    mask = None if valid.all() else ~valid
    if kind == INT:
        return pa.array(num, type=pa.int64(), mask=mask)
    if kind == BOOL:
        return pa.array(num.astype(np.bool_), type=pa.bool_(), mask=mask)
    if kind == TS:
        return pa.array(num.view("datetime64[us]"), type=pa.timestamp("us"), mask=mask)
    values = num.view(np.float64)
    f32, ints = code == F32, code == AN_INT
    if mask is not None:
        f32 &= valid
        ints &= valid
    if f32.any() or ints.any():
        values = values.copy()
        values[f32] = num[f32].astype(np.uint32).view(np.float32)
        values[ints] = num[ints].astype(np.float64)
    return pa.array(values, type=pa.float64(), mask=mask)


def _offsets(sizes: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _strings(valid: np.ndarray, sizes: np.ndarray, data: np.ndarray) -> pa.Array:
    """A string column (strings are required: ``valid`` is all true where decoded)."""
    offsets = _offsets(np.where(valid, sizes, 0))
    return pa.StringArray.from_buffers(len(sizes), pa.py_buffer(offsets),
                                       pa.py_buffer(np.ascontiguousarray(data)))


def _lists(valid: np.ndarray, sizes: np.ndarray, items: np.ndarray, boolean: bool
           ) -> pa.Array:
    """A list column: each sample's count of the items, one list after another."""
    offsets = _offsets(np.where(valid, sizes, 0))
    values = pa.array(items.astype(np.bool_) if boolean else items)
    mask = None if valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)
