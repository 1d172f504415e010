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

The NVLink lists are read into columns by ``wire_columns.link_columns`` (from their
msgpack bytes: a ``wire_columns.WireSample``'s as they came, a decoded list encoded
again) and tested on the numbers it read; a list that is not a list of integers
(booleans for ``nvlink_up``) is named in ``Screened.undecodable`` so the validator opens
that record with the strict decoder (which says why).

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
import operator
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.contract import DCGM_FP64_BLANK, DCGM_INT64_BLANK, GpuSample
from fleetcare.pipeline.limits import Limits
from fleetcare.pipeline.record_checks import COUNTERS, RANGED, SHAPES, TEXT_FIELDS
from fleetcare.pipeline.schema import NVLINK_LISTS, SAMPLE_SCHEMA
from fleetcare.pipeline.store import grid_list_array
from fleetcare.pipeline.wire_columns import LinkColumns, as_list, link_columns

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
    """Indices of the samples with an NVLink list that is not one (raw bytes that the
    strict decoder refuses): the record is to be opened again with it; the suspects and
    the table above do not hold for them."""


def _rows(col: Column, bad: Callable[[Any], bool]) -> set[int]:
    """The rows whose non-null value ``bad`` flags (the slow scan of a failed column)."""
    return {i for i, v in enumerate(col) if v is not None and bad(v)}


def _longer(value: Sized, *, top: int) -> bool:
    return len(value) > top


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

    def screen(self, samples: Sequence[GpuSample], nodes: Sequence[str],
               now: float) -> Screened:
        """Screen ``samples`` (``nodes[i]``: the node of the batch sample ``i`` came in)."""
        if not samples:
            return Screened(set(), SAMPLE_SCHEMA.empty_table())
        cols: dict[str, Column] = dict(zip(
            _NAMES, zip(*map(msgspec.structs.astuple, samples), strict=True), strict=True))
        arrays: dict[str, pa.Array] = {}
        unfit: set[str] = set()
        undecodable: set[int] = set()
        links = _links(cols, undecodable)
        out = self._strings(cols, nodes) | self._times(cols["ts"], now)
        for _, name in _SHAPE.ints:
            out |= self._ints(name, cols[name], arrays, unfit)
        for _, name in _SHAPE.floats:
            out |= self._floats(name, cols[name], arrays)
        for a, b in _PAIRS:
            out |= self._pair(cols[a], cols[b])
        out |= (self._nvlink(cols, arrays, unfit) if links is None
                else self._wire_nvlink(links, arrays))
        table = None
        if not unfit:
            try:
                table = pa.Table.from_arrays(
                    [arrays[f.name] if f.name in arrays else pa.array(cols[f.name], f.type)
                     for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                table = None  # the sinks convert the kept samples (and say why it fails)
        return Screened(out, table, undecodable)

    # -- one test per group of columns ------------------------------------------------------
    def _strings(self, cols: Mapping[str, Column], nodes: Sequence[str]) -> set[int]:
        out: set[int] = set()
        for _, name in _SHAPE.strs:
            top = self.limits.max_text_len if name in TEXT_FIELDS else self.limits.max_name_len
            col = cols[name]
            if max(map(len, filter(None, col)), default=0) > top:
                out |= _rows(col, functools.partial(_longer, top=top))
        if cols["node"] != tuple(nodes):
            out |= {i for i, (v, n) in enumerate(zip(cols["node"], nodes, strict=True))
                    if v != n}
        if not all(map(str.strip, cols["gpu_uuid"])):
            out |= _rows(cols["gpu_uuid"], lambda v: not v.strip())
        return out

    def _times(self, col: Column, now: float) -> set[int]:
        lim = self.limits

        def ok(ts: Any) -> bool:
            age = now - ts.timestamp()
            return -age <= lim.max_future_s and age <= lim.max_age_s
        if ok(min(col)) and ok(max(col)):
            return set()
        return _rows(col, lambda v: not ok(v))

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

    def _ints(self, name: str, col: Column, arrays: dict[str, pa.Array],
              unfit: set[str]) -> set[int]:
        ok = self._int_ok(name)
        try:
            arr = arrays[name] = pa.array(col, type=pa.int64())
        except (OverflowError, pa.ArrowException):  # past int64: a sentinel, surely
            unfit.add(name)
            return _rows(col, lambda v: not ok(v))
        if arr.null_count == len(arr):
            return set()
        lo, hi = _min_max(arr)
        # each condition is an interval, so min and max decide it; widths are a set
        if ok(lo) and ok(hi) and (name not in _WIDTHS
                                  or all(map(ok, pc.unique(arr.drop_null()).to_pylist()))):
            return set()
        return _rows(col, lambda v: not ok(v))

    def _floats(self, name: str, col: Column, arrays: dict[str, pa.Array]) -> set[int]:
        bounds = self._bounds.get(name)
        arr = arrays[name] = pa.array(col, type=pa.float64())

        def bad(v: float) -> bool:
            return (not math.isfinite(v) or v >= DCGM_FP64_BLANK
                    or (bounds is not None and not bounds[0] <= v <= bounds[1]))
        if arr.null_count == len(arr):
            return set()
        if pc.all(pc.is_finite(arr)).as_py():  # then min and max decide the rest
            lo, hi = _min_max(arr)
            if hi < DCGM_FP64_BLANK and (bounds is None or bounds[0] <= lo and hi <= bounds[1]):
                return set()
        return _rows(col, bad)

    @staticmethod
    def _pair(cur: Column, top: Column) -> set[int]:
        """Rows with ``cur > top`` (both present)."""
        if None not in cur and None not in top and not any(map(operator.gt, cur, top)):
            return set()
        return {i for i, (a, b) in enumerate(zip(cur, top, strict=True))
                if a is not None and b is not None and a > b}

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
