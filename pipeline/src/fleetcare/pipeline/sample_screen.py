"""The GPU samples of one poll as one Arrow table, and which of them may have a problem.

``RecordChecks.check`` examines one sample field by field in Python (~12 µs a sample):
most of ingest's cost, though almost every sample is clean. ``SampleScreen.screen`` turns
all samples of a poll into columns once: the Arrow table the sinks insert (so the rows
are converted once, not again by the sink) and the input of one test per column, run in
C (Arrow's ``min_max``, numpy, ``tuple ==``). Only a column that fails its test is
scanned row by row in Python, and only the rows it names go through
``RecordChecks.check``, which gives their reasons. The screen is conservative: every
sample ``check`` would find a problem in is a suspect (``tests/pipeline/
test_sample_screen.py`` checks this on random and mutated samples); a clean sample may
be a suspect too, which costs only its check. A column Arrow cannot hold (an integer
past int64: NVML's 2**64-1) is screened row by row and no table is returned; the sinks
then convert the kept samples themselves.

Samples that came as msgpack arrive as their bytes (``msgspec.Raw``) and are decoded
straight into these columns by ``wire_samples.decode`` (no Python object per value); the
few it leaves to msgspec, and samples that came as objects (JSON, a salvaged batch), are
converted from their values, and both parts put back in order. The NVLink lists of an
object are read into columns by ``wire_columns.link_columns`` (from their msgpack bytes:
a ``wire_columns.WireSample``'s as they came, a decoded list encoded again). A sample
whose bytes msgspec refuses, or whose NVLink list is not a list of integers (booleans
for ``nvlink_up``), is named in ``Screened.undecodable`` so the validator opens that
record with the strict decoder (which says why).

Each test mirrors a check of ``record_checks`` (the field groups come from its
``SHAPES``, so a field added to the contract is screened like it is checked):

- strings: length; ``node`` equal to its batch's node; ``gpu_uuid`` not blank;
- ``ts`` within ``Limits.max_future_s`` ahead of / ``Limits.max_age_s`` behind ``now``;
- integers: below ``DCGM_INT64_BLANK``, within their ``Limits`` range, counters and
  the clock-event mask not negative, PCIe widths of ``Limits.pcie_widths``;
- floats: finite, below ``DCGM_FP64_BLANK``, within range;
- pairs: ``fb_used_mib <= fb_total_mib``, PCIe gen/width not above their maxima;
- NVLink lists: entries below the blank and not negative, at most ``Limits.max_nvlinks``
  entries, the lists of one sample of one length.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.contract import DCGM_FP64_BLANK, DCGM_INT64_BLANK, GpuSample
from fleetcare.pipeline import wire_samples
from fleetcare.pipeline.limits import Limits
from fleetcare.pipeline.record_checks import COUNTERS, RANGED, SHAPES, TEXT_FIELDS
from fleetcare.pipeline.schema import NVLINK_LISTS, SAMPLE_SCHEMA
from fleetcare.pipeline.store import grid_list_array
from fleetcare.pipeline.wire_columns import WIRE_SAMPLE, LinkColumns, as_list, link_columns

Column = Sequence[Any]
_SHAPE = SHAPES["samples"]
_NAMES = list(GpuSample.__struct_fields__)
_PAIRS = (("fb_used_mib", "fb_total_mib"), ("pcie_link_gen", "pcie_link_gen_max"),
          ("pcie_link_width", "pcie_link_width_max"))
_WIDTHS = ("pcie_link_width", "pcie_link_width_max")
_NOT_NEGATIVE = frozenset(COUNTERS) | {"clock_event_reasons"}


@dataclass(frozen=True, slots=True)
class Screened:
    suspects: set[int]
    """Indices of the samples that may have a problem; every other sample has none."""
    table: pa.Table | None
    """All samples (``schema.SAMPLE_SCHEMA``, in order); None when a column did not fit."""
    undecodable: set[int] = dataclass_field(default_factory=set)
    """Indices of the samples whose bytes the strict decoder refuses (a field of the
    wrong type, an NVLink list that is not one): the record is to be opened again with it;
    the suspects do not hold for them and their rows of the table are nulls (the table
    may be None then)."""


def _rows(col: Column, bad: Callable[[Any], bool]) -> set[int]:
    """The rows whose non-null value ``bad`` flags (the slow scan of a failed column)."""
    return {i for i, v in enumerate(col) if v is not None and bad(v)}


def _bad_links(values: list[Any], *, top: int, counters: bool) -> bool:
    """An NVLink list with too many entries, or (counters) one blank or negative."""
    return len(values) > top or (counters and bool(values) and (
        max(values) >= DCGM_INT64_BLANK or min(values) < 0))


def _min_max(arr: pa.Array) -> tuple[Any, Any]:
    mm = pc.min_max(arr)
    return mm["min"].as_py(), mm["max"].as_py()


def _list_array(col: Column, typ: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """A list column as Arrow, and as a 2-D numpy array when it is one (every row a list
    of one length: numpy converts that 4x faster than Arrow does lists of lists)."""
    try:
        grid = np.array(col, dtype=np.bool_ if typ.value_type == pa.bool_() else np.int64)
    except (ValueError, TypeError, OverflowError):
        grid = None
    if grid is None or grid.ndim != 2:
        return pa.array(col, type=typ), None
    return grid_list_array(grid, typ.value_type), grid


class SampleScreen:
    """The column tests of one ``Limits`` (see the module docstring)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._bounds = {name: getattr(limits, attr) for name, _, attr, _ in RANGED}

    def screen(self, samples: Sequence[Any], nodes: Sequence[str], now: float) -> Screened:
        """Screen ``samples`` (``nodes[i]``: the node of the batch sample ``i`` came in):
        each a ``msgspec.Raw`` of its msgpack bytes, a ``GpuSample`` or a ``WireSample``."""
        if not samples:
            return Screened(set(), SAMPLE_SCHEMA.empty_table())
        got = _columns(samples)
        if isinstance(got, set):
            return Screened(set(), None, got)
        (arrays, cols, links, unfit), undecodable = got
        out = self._strings(arrays, nodes) | self._times(arrays["ts"], now)
        for _, name in _SHAPE.ints:
            out |= self._ints(name, arrays.get(name), cols)
        for _, name in _SHAPE.floats:
            out |= self._floats(name, arrays[name])
        for a, b in _PAIRS:
            out |= self._pair(arrays.get(a), arrays.get(b), cols, a, b)
        if links is None:  # (only samples that came as objects: ``cols`` holds them)
            assert cols is not None
            out |= self._nvlink(cols, arrays, unfit)
        else:
            out |= self._wire_nvlink(links, arrays)
        table = None
        if not unfit:
            try:
                table = pa.Table.from_arrays([arrays[f.name] for f in SAMPLE_SCHEMA],
                                             schema=SAMPLE_SCHEMA)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                table = None  # the sinks convert the kept samples (and say why it fails)
        return Screened(out - undecodable, table, undecodable)

    # -- one test per group of columns ------------------------------------------------------
    def _strings(self, arrays: Mapping[str, pa.Array], nodes: Sequence[str]) -> set[int]:
        out: set[int] = set()
        for _, name in _SHAPE.strs:
            top = self.limits.max_text_len if name in TEXT_FIELDS else self.limits.max_name_len
            lengths = pc.utf8_length(arrays[name])
            if (pc.max(lengths).as_py() or 0) > top:
                out |= _flagged(pc.greater(lengths, top))
        differ = pc.not_equal(arrays["node"], pa.array(nodes, pa.string()))
        if pc.any(differ).as_py():
            out |= _flagged(differ)
        uuid = arrays["gpu_uuid"]
        # of those, exactly as ``RecordChecks`` does: ``str.strip``
        out |= {i for i in _maybe_blank(uuid) if not uuid[i].as_py().strip()}
        return out

    def _times(self, ts: pa.Array, now: float) -> set[int]:
        """Rows too far ahead or behind (within a millisecond of a limit too: the checks
        decide those on the datetime itself)."""
        lim = self.limits
        us = ts.cast(pa.int64()).to_numpy(zero_copy_only=False)
        age = now - us / 1e6
        bad = (-age > lim.max_future_s - 1e-3) | (age > lim.max_age_s - 1e-3)
        return set(np.flatnonzero(bad).tolist())

    def _int_ok(self, name: str) -> Callable[[int], bool]:
        """The test of one integer value of field ``name`` (True: no problem)."""
        lo = 0 if name in _NOT_NEGATIVE else None
        bounds = self._bounds.get(name)
        widths = self.limits.pcie_widths if name in _WIDTHS else None

        def ok(v: int) -> bool:
            if v >= DCGM_INT64_BLANK or (lo is not None and v < lo):
                return False
            if bounds is not None and not bounds[0] <= v <= bounds[1]:
                return False
            return widths is None or v in widths
        return ok

    def _ints(self, name: str, arr: pa.Array | None, cols: Mapping[str, Column] | None
              ) -> set[int]:
        """``arr`` None: the column did not fit int64 (``cols`` has its Python values)."""
        ok = self._int_ok(name)
        if arr is None:
            assert cols is not None
            return _rows(cols[name], lambda v: not ok(v))
        if arr.null_count == len(arr):
            return set()
        lo, hi = _min_max(arr)
        # each condition is an interval, so min and max decide it; widths are a set
        if ok(lo) and ok(hi) and (name not in _WIDTHS
                                  or all(map(ok, pc.unique(arr.drop_null()).to_pylist()))):
            return set()
        return _rows(arr.to_pylist(), lambda v: not ok(v))

    def _floats(self, name: str, arr: pa.Array) -> set[int]:
        bounds = self._bounds.get(name)

        def bad(v: float) -> bool:
            return (not math.isfinite(v) or v >= DCGM_FP64_BLANK
                    or (bounds is not None and not bounds[0] <= v <= bounds[1]))
        if arr.null_count == len(arr):
            return set()
        if pc.all(pc.is_finite(arr)).as_py():  # then min and max decide the rest
            lo, hi = _min_max(arr)
            if hi < DCGM_FP64_BLANK and (bounds is None or bounds[0] <= lo and hi <= bounds[1]):
                return set()
        return _rows(arr.to_pylist(), bad)

    @staticmethod
    def _pair(cur: pa.Array | None, top: pa.Array | None, cols: Mapping[str, Column] | None,
              a: str, b: str) -> set[int]:
        """Rows with ``cur > top`` (both present)."""
        if cur is None or top is None:  # past int64: compared in Python
            assert cols is not None
            return {i for i, (x, y) in enumerate(zip(cols[a], cols[b], strict=True))
                    if x is not None and y is not None and x > y}
        return _flagged(pc.greater(cur, top))

    def _wire_nvlink(self, links: LinkColumns, arrays: dict[str, pa.Array]) -> set[int]:
        """``_nvlink`` on lists read from their bytes (``wire_columns.link_columns``)."""
        out: set[int] = set()
        top = self.limits.max_nvlinks
        lengths = []
        for name in NVLINK_LISTS:
            arrays[name] = links.arrays[name]
            counts = links.counts[name]
            lengths.append(counts)
            out.update(np.flatnonzero(counts > top).tolist())  # (NaN > top is False)
            values = links.values[name]
            if name != "nvlink_up" and len(values):
                bad = (values < 0) | (values >= DCGM_INT64_BLANK)
                if bad.any():
                    out.update(links.rows(name, bad).tolist())
        return out | _unequal(lengths)

    def _nvlink(self, cols: Mapping[str, Column], arrays: dict[str, pa.Array],
                unfit: set[str]) -> set[int]:
        out: set[int] = set()
        top = self.limits.max_nvlinks
        lengths = []  # per list, each row's length (NaN: null)
        for name in NVLINK_LISTS:
            col = cols[name]
            try:
                arr, grid = _list_array(col, SAMPLE_SCHEMA.field(name).type)
            except (OverflowError, pa.ArrowException):  # past int64
                arr, grid = None, None
                unfit.add(name)
            if grid is not None:  # one width, no nulls
                arrays[name] = arr
                lengths.append(np.full(len(col), grid.shape[1], dtype=np.float64))
                clean = grid.shape[1] <= top and (
                    name == "nvlink_up" or grid.size == 0
                    or (int(grid.min()) >= 0 and int(grid.max()) < DCGM_INT64_BLANK))
            elif arr is not None:
                arrays[name] = arr
                counts = pc.list_value_length(arr)
                lengths.append(counts.to_numpy(zero_copy_only=False).astype(np.float64))
                flat = pc.list_flatten(arr)
                clean = (pc.max(counts).as_py() or 0) <= top and (
                    name == "nvlink_up" or len(flat) == 0
                    or (pc.min(flat).as_py() >= 0 and pc.max(flat).as_py() < DCGM_INT64_BLANK))
            else:
                lengths.append(np.array([np.nan if v is None else len(v) for v in col]))
                clean = False
            if not clean:
                out |= _rows(col, functools.partial(_bad_links, top=top,
                                                    counters=name != "nvlink_up"))
        return out | _unequal(lengths)


def _unequal(lengths: list[np.ndarray]) -> set[int]:
    """The samples whose NVLink lists are of different lengths (``lengths``: per list,
    each sample's length; NaN: null, which no length differs from)."""
    grid_of = np.vstack(lengths)
    longest, shortest = np.fmax.reduce(grid_of, axis=0), np.fmin.reduce(grid_of, axis=0)
    return set(np.flatnonzero(longest > shortest).tolist())  # (NaN > NaN is False)


def _flagged(mask: pa.Array) -> set[int]:
    """The rows where the boolean column ``mask`` is true (null: not)."""
    values = mask.fill_null(False).to_numpy(zero_copy_only=False)
    return set(np.flatnonzero(values).tolist())


def _maybe_blank(strings: pa.Array) -> set[int]:
    """The rows of a string column that may be all whitespace: empty, or starting with a
    character up to space (every ASCII whitespace) or past ASCII (the others)."""
    first = pc.utf8_slice_codeunits(strings, 0, 1)
    return _flagged(pc.or_(pc.less_equal(first, " "), pc.greater_equal(first, "\u0080")))


Columns = tuple[dict[str, pa.Array], Mapping[str, Column] | None, LinkColumns | None, set[str]]
"""A poll's samples as columns: the Arrow arrays (a column past int64 missing), the
Python values (only when the samples came as objects), the NVLink lists as read from
their bytes (None: ``_nvlink`` converts them), the columns that did not fit."""


def _columns(samples: Sequence[Any]) -> tuple[Columns, set[int]] | set[int]:
    """The samples as columns (``Columns``) and the samples whose bytes are not a sample
    (to be opened strictly: their rows are nulls), or, rarely, only those. Raw msgpack
    samples are decoded straight into columns (``wire_samples``); the few it leaves
    undecided, and the samples that came as objects, are converted as objects, and the
    parts put back in order."""
    raw = np.fromiter((isinstance(s, msgspec.Raw) for s in samples), dtype=np.bool_,
                      count=len(samples))
    if not raw.any():
        whole = _object_columns(samples)
        return whole if isinstance(whole, set) else (whole, set())
    raw_at = np.flatnonzero(raw)
    fast = wire_samples.decode([samples[int(i)] for i in raw_at])
    fast_rows = raw_at[fast.rows]
    if len(fast_rows) == len(samples):
        return (fast.arrays, None, LinkColumns.of(fast.arrays), set()), set()
    slow_rows = np.setdiff1d(np.arange(len(samples)), fast_rows)
    objects, undecodable = _as_objects([samples[i] for i in slow_rows])
    while True:  # (a list that is not one: that sample is undecodable too, the rest again)
        good = [i for i in range(len(objects)) if i not in undecodable]
        slow = _object_columns([objects[i] for i in good]) if good else _empty()
        if not isinstance(slow, set):
            break
        undecodable |= {good[i] for i in slow}
    arrays, _, links, unfit = slow
    bad_rows = slow_rows[sorted(undecodable)]
    if unfit or links is None:  # a value past int64 (rare): every sample as an object
        if len(bad_rows):
            return {int(i) for i in bad_rows}
        every, _ = _as_objects(samples)
        whole = _object_columns(every)
        return whole if isinstance(whole, set) else (whole, set())
    order = np.argsort(np.concatenate([fast_rows, slow_rows[good], bad_rows]), kind="stable")
    merged = {f.name: pa.concat_arrays([fast.arrays[f.name], arrays[f.name],
                                        pa.nulls(len(bad_rows), f.type)]).take(order)
              for f in SAMPLE_SCHEMA}
    return (merged, None, LinkColumns.of(merged), set()), {int(i) for i in bad_rows}


def _empty() -> Columns:
    """The columns of no sample."""
    arrays = {f.name: pa.array([], f.type) for f in SAMPLE_SCHEMA}
    return arrays, None, LinkColumns.of(arrays), set()


def _as_objects(samples: Sequence[Any]) -> tuple[list[Any], set[int]]:
    """Each sample as an object (a ``msgspec.Raw`` decoded as a ``WireSample``), and the
    ones whose bytes do not decode (the validator opens their records strictly)."""
    out: list[Any] = []
    bad: set[int] = set()
    for i, s in enumerate(samples):
        if isinstance(s, msgspec.Raw):
            try:
                s = WIRE_SAMPLE.decode(s)
            except (msgspec.DecodeError, msgspec.ValidationError):
                bad.add(i)
        out.append(s)
    return out, bad


def _object_columns(samples: Sequence[Any]) -> Columns | set[int]:
    """Decoded samples as columns (``Columns``), or the samples with an NVLink list that
    is not one."""
    cols: dict[str, Column] = dict(zip(
        _NAMES, zip(*map(msgspec.structs.astuple, samples), strict=True), strict=True))
    undecodable: set[int] = set()
    links = _links(cols, undecodable)
    if undecodable:
        return undecodable
    arrays: dict[str, pa.Array] = {}
    unfit: set[str] = set()
    for f in SAMPLE_SCHEMA:
        if f.name in NVLINK_LISTS:
            if links is not None:
                arrays[f.name] = links.arrays[f.name]
            continue  # (``_nvlink`` converts Python lists)
        try:
            arrays[f.name] = pa.array(cols[f.name], type=f.type)
        except (OverflowError, pa.ArrowException):  # past int64: a sentinel, surely
            unfit.add(f.name)
    return arrays, cols, links, unfit


def _links(cols: dict[str, Column], undecodable: set[int]) -> LinkColumns | None:
    """The NVLink lists read from their bytes (``link_columns``); None when some list
    cannot be read so: ``cols`` then holds them all as Python lists, decoded here, and
    ``undecodable`` gets the samples whose bytes are not such a list. Rare: a counter past
    int64, an item of the wrong type."""
    got = link_columns(cols)
    if isinstance(got, LinkColumns):
        return got
    for name in NVLINK_LISTS:
        col = list(cols[name])
        for i, value in enumerate(col):
            try:
                col[i] = as_list(name, value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                col[i] = None
                undecodable.add(i)
        cols[name] = col
    return None
