"""GPU samples as ``telemetry`` stores them, summarised with numpy before DuckDB sees them.

``telemetry`` keeps per sample which NVLink lists came, the number of links, a bit per
link down and each counter's total over the links; ``telemetry_nvlink`` keeps the lists
whole for the *irregular* samples only (a link down, a counter not zero, a null entry,
lists of different lengths, more links than the mask). ``schema.stored_samples_sql`` and
``schema.IRREGULAR_SQL`` say that in SQL, and stay the definition (a database of the older
layout and the Parquet lake are read through them); ``summarise`` computes the same
values from the Arrow lists with numpy, a column at a time, so DuckDB inserts narrow rows
and looks at no list (issue 15 §4: DuckDB's list functions over five lists of 18 cost
more than the insert itself). ``tests/pipeline/test_link_summary.py`` checks that both
give the same rows. ``summarise_grid`` gives the same values straight from the
simulator's columns (``nvlink_up`` a (rows, links) array, the counters ``SparseLinks``:
their non-zero rows), with no list built but the irregular samples'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.sim.sparse_links import SparseLinks
from fleetcare.pipeline.schema import (
    LINK_SUMMARY,
    MASK_LINKS,
    NVLINK_COUNTERS,
    NVLINK_LISTS,
    SCALAR_SAMPLE_COLUMNS,
)

_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class Summarised:
    stored: pa.Table
    """``telemetry``'s columns (``schema.STORED_SAMPLE_COLUMNS``), one row per sample."""
    lists: pa.Table
    """``telemetry_nvlink``'s columns for the irregular samples (key and the five lists)."""


@dataclass(frozen=True, slots=True)
class _List:
    """One list column of a table, flattened: what every per-sample reduction reads.
    Reductions run over each sample's run of entries (``reduceat``), not per entry."""

    valid: np.ndarray  # bool per sample: the list is not null
    length: np.ndarray  # int64 per sample (0 for a null list)
    starts: np.ndarray  # int64 per sample: where its entries start in ``values``
    values: np.ndarray  # per entry, samples after one another (nulls filled)
    counted: np.ndarray  # int64 per sample: entries not null

    @classmethod
    def of(cls, column: pa.ChunkedArray, fill: object) -> _List:
        arr = column.combine_chunks()
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        length = pc.list_value_length(arr).fill_null(0).to_numpy().astype(np.int64)
        starts = np.cumsum(length) - length
        flat = arr.flatten()  # the entries of the lists that are not null, in order
        counted = length
        if flat.null_count:
            known = flat.is_valid().to_numpy(zero_copy_only=False)
            counted = _per_sample(np.add, known, length, starts)
            flat = flat.fill_null(fill)
        return cls(valid, length, starts, flat.to_numpy(zero_copy_only=False), counted)

    def per_sample(self, ufunc: np.ufunc, entries: np.ndarray) -> np.ndarray:
        """``ufunc`` reduced over each sample's entries of ``entries`` (an array per
        entry); 0 / False for a sample without entries."""
        return _per_sample(ufunc, entries, self.length, self.starts)

    def sample_of(self, entries: np.ndarray) -> np.ndarray:
        """The sample (index) that each entry index of ``entries`` belongs to."""
        return np.searchsorted(self.starts + self.length, entries, side="right")


def _per_sample(ufunc: np.ufunc, entries: np.ndarray, length: np.ndarray,
                starts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(length), dtype=np.int64 if ufunc is np.add else bool)
    some = length > 0
    if len(entries):
        out[some] = ufunc.reduceat(entries.astype(out.dtype, copy=False), starts[some])
    return out


def summarise(data: pa.Table) -> Summarised:
    """``data`` (``schema.SAMPLE_SCHEMA``) as ``telemetry`` and ``telemetry_nvlink`` store
    it: the values ``schema.stored_samples_sql`` and ``schema.IRREGULAR_SQL`` give."""
    n = data.num_rows
    lists = {name: _List.of(data.column(name), True if name == "nvlink_up" else 0)
             for name in NVLINK_LISTS}
    out: dict[str, pa.Array] = {}
    present = np.zeros(n, dtype=np.int64)
    links = np.full(n, -1, dtype=np.int64)
    longest = np.full(n, -1, dtype=np.int64)
    shortest = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    irregular = np.zeros(n, dtype=bool)
    for j, li in enumerate(lists.values()):
        present |= li.valid.astype(np.int64) << j
        first = (links < 0) & li.valid
        links[first] = li.length[first]
        longest = np.where(li.valid, np.maximum(longest, li.length), longest)
        shortest = np.where(li.valid, np.minimum(shortest, li.length), shortest)
        irregular |= li.valid & (li.counted < li.length)  # a null entry
    irregular |= (longest >= 0) & (longest != shortest)
    out["nvlink_present"] = pa.array(present)
    out["nvlink_links"] = pa.array(links, mask=links < 0)

    up = lists["nvlink_up"]
    down = ~up.values.astype(bool)  # (a null entry was filled with True)
    irregular |= up.valid & (up.per_sample(np.logical_or, down) | (up.length > MASK_LINKS))
    mask = np.zeros(n, dtype=np.int64)
    at = np.flatnonzero(down)
    if len(at):
        row = up.sample_of(at)
        position = at - up.starts[row]
        bit = position < MASK_LINKS
        np.bitwise_or.at(mask, row[bit], np.left_shift(1, position[bit]))
    out["nvlink_down_mask"] = pa.array(mask, mask=~up.valid)

    for name in NVLINK_COUNTERS:
        li = lists[name]
        values = li.values.astype(np.int64, copy=False)
        irregular |= li.valid & li.per_sample(np.logical_or, values != 0)
        total = li.per_sample(np.add, values)  # exact unless a sum passes int64:
        null = li.counted == 0  # (a null list, an empty one, or only null entries)
        top = max(-int(values.min()), int(values.max())) if len(values) else 0
        if top * int(li.length.max(initial=0)) > _INT64[1]:  # then add those exactly
            wide = li.per_sample(np.logical_or, np.abs(values.astype(np.float64)) >= 2.0**58)
            for i in np.flatnonzero(wide):
                exact = sum(int(v) for v in values[li.starts[i]:li.starts[i] + li.length[i]])
                null[i] = null[i] or not _INT64[0] <= exact <= _INT64[1]
                total[i] = exact if not null[i] else 0
        out[f"{name}_total"] = pa.array(total, mask=null)

    stored = data.select(SCALAR_SAMPLE_COLUMNS)
    for name, _ in LINK_SUMMARY:
        stored = stored.append_column(name, out[name])
    keep = data.select(["gpu_uuid", "ts", *NVLINK_LISTS])
    return Summarised(stored, keep.filter(pa.array(irregular)) if irregular.any()
                      else keep.slice(0, 0))


def summarise_grid(up: np.ndarray, counters: dict[str, SparseLinks]
                   ) -> tuple[dict[str, pa.Array], np.ndarray]:
    """``LINK_SUMMARY``'s columns and the irregular samples (bool per row) of samples whose
    five NVLink lists all came with the same number of links, none of them null: the
    links up (``up``, bool (rows, links)) and the counters (``NVLINK_COUNTERS``: their
    non-zero rows) — the values ``summarise`` gives for the same lists."""
    n, links = up.shape
    if links == 0 or links > MASK_LINKS:
        raise ValueError(f"summarise_grid: {links} links a sample; use summarise")
    down_rows = np.flatnonzero(~up.all(axis=1))
    mask = np.zeros(n, dtype=np.int64)
    if len(down_rows):
        bits = np.left_shift(np.int64(1), np.arange(links, dtype=np.int64))
        mask[down_rows] = (~up[down_rows]).astype(np.int64) @ bits
    irregular = np.zeros(n, dtype=bool)
    irregular[down_rows] = True
    out: dict[str, pa.Array] = {
        "nvlink_present": pa.array(np.full(n, (1 << len(NVLINK_LISTS)) - 1, dtype=np.int64)),
        "nvlink_links": pa.array(np.full(n, links, dtype=np.int64)),
        "nvlink_down_mask": pa.array(mask),
    }
    for name in NVLINK_COUNTERS:
        c = counters[name]
        if c.shape != (n, links):
            raise ValueError(f"summarise_grid: {name} is {c.shape}, nvlink_up {up.shape}")
        total = np.zeros(n, dtype=np.int64)
        total[c.rows] = c.values.sum(axis=1, dtype=np.int64)
        irregular[c.rows] = True
        out[f"{name}_total"] = pa.array(total)
    return out, irregular
