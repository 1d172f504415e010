"""Prometheus range matrices of dcgm-exporter metrics → one Arrow table of GPU samples.

The columnar twin of ``fleetcare.collectors.dcgm_exporter.gpu_samples`` for backfill:
each series' meaning (GPU, field, link) is worked out once (``meaning``) and its points
are placed with numpy, never one Python object per point. The rules are the exporter's,
point for point (``tests/pipeline/test_prom_columns.py`` compares both on the same
matrices):

- a GPU has a sample at every timestamp where any of its series has a point;
- identity (index, bus, model, host) comes from the first of its series, in query order,
  with a point at that timestamp; no host label gives ``default_node``;
- DCGM blanks (``is_blank``) leave a field null; a field's first value wins, except that
  a whole-GPU series replaces a MIG instance's value, and MIG instances' ``fb_used_mib``
  add up;
- per-link NVLink counters form a list as long as the highest link reported at that
  timestamp, links not reported count 0, and one blank link makes the list null.

``decode_matrix(raw)`` reads a ``query_range`` answer straight into ``(labels, points)``
with msgspec (values parsed as floats in C); it returns None for anything but a clean
matrix, and the caller falls back to the checked JSON path for the error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from fleetcare.collectors.contract import DCGM_FP64_BLANK, DCGM_INT32_BLANK
from fleetcare.collectors.dcgm_exporter import SeriesMeaning, meaning
from fleetcare.pipeline import schema

__all__ = ["Matrix", "decode_matrix", "samples_table"]

Matrix = list[tuple[dict[str, str], np.ndarray]]
"""One query's series: labels (``__name__`` included) and an (n, 2) array of (t, value)."""


class _Series(msgspec.Struct):
    metric: dict[str, str] = {}
    values: list[tuple[float, float]] = []


class _Data(msgspec.Struct):
    resultType: str = ""  # noqa: N815 - Prometheus' own key
    result: list[_Series] = []


class _Doc(msgspec.Struct):
    status: str = ""
    data: _Data | None = None
    warnings: list[str] = []


_DOC = msgspec.json.Decoder(_Doc, strict=False)


def decode_matrix(raw: bytes) -> tuple[Matrix, list[str]] | None:
    """A successful matrix answer's series and warnings; None for anything else.

    Values are strings in Prometheus' JSON; msgspec parses them as floats (lax mode reads
    "NaN", "Inf", "-Inf"; Prometheus writes "+Inf", rewritten first where it stands as a
    value).
    """
    try:
        doc = _DOC.decode(raw.replace(b',"+Inf"]', b',"Inf"]'))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if doc.status != "success" or doc.data is None or doc.data.resultType != "matrix":
        return None
    out: Matrix = []
    for s in doc.data.result:
        pts = np.array(s.values, dtype=np.float64) if s.values else np.empty((0, 2))
        out.append((s.metric, pts))
    return out, doc.warnings


def _blank(v: np.ndarray) -> np.ndarray:
    """``dcgm_exporter.is_blank`` over an array."""
    with np.errstate(invalid="ignore"):
        return (~np.isfinite(v)) | (v >= DCGM_FP64_BLANK) | (
            (v >= DCGM_INT32_BLANK) & (v <= 0x7FFFFFFF))


class _Field:
    """One scalar field's values by sample row, with the exporter's precedence rules."""

    def __init__(self, n: int, fname: str) -> None:
        self.fname = fname
        self.val = np.zeros(n, np.float64)
        self.set = np.zeros(n, bool)
        self.whole = np.zeros(n, bool)   # the value came from a whole-GPU (non-MIG) series

    def add(self, rows: np.ndarray, v: np.ndarray, mig: bool) -> None:
        first = ~self.set[rows]
        replace = self.set[rows] & ~self.whole[rows] & (not mig)
        put = first | replace
        r = rows[put]
        self.val[r], self.set[r], self.whole[r] = v[put], True, not mig
        if self.fname == "fb_used_mib" and mig:
            more = self.set[rows] & ~self.whole[rows] & ~put
            r = rows[more]
            self.val[r] += v[more]


class _Links:
    """One per-link NVLink counter's values by sample row and link."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cols: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # link → (value, state)

    def add(self, rows: np.ndarray, v: np.ndarray, blank: np.ndarray, link: int) -> None:
        if link not in self.cols:
            self.cols[link] = (np.zeros(self.n, np.int64), np.zeros(self.n, np.int8))
        val, state = self.cols[link]
        val[rows] = np.where(blank, 0, v).astype(np.int64)
        state[rows] = np.where(blank, 2, 1)     # 0 absent, 1 value, 2 blank

    def arrow(self, typ: pa.DataType) -> pa.Array:
        width = max(self.cols) + 1
        val = np.zeros((self.n, width), np.int64)
        state = np.zeros((self.n, width), np.int8)
        for link, (v, s) in self.cols.items():
            val[:, link], state[:, link] = v, s
        present = state > 0
        length = np.where(present.any(axis=1),
                          width - np.argmax(present[:, ::-1], axis=1), 0)
        valid = (length > 0) & ~(state == 2).any(axis=1)
        length = np.where(valid, length, 0)
        keep = np.arange(width)[None, :] < length[:, None]
        offsets = np.zeros(self.n + 1, np.int32)
        np.cumsum(length, out=offsets[1:])
        flat = pa.array(val[keep], type=typ.value_type)
        return pa.ListArray.from_arrays(pa.array(offsets), flat,
                                        mask=pa.array(~valid))


def _slots(t: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct timestamps, and each point's index among them. Usually every series
    has a point at every step of the query's grid: then no sort is needed."""
    width = int(lengths[0])
    grid = t[:width]
    if (lengths == width).all() and (np.diff(grid) > 0).all() and np.array_equal(
            t.reshape(-1, width), np.broadcast_to(grid, (len(lengths), width))):
        return grid, np.tile(np.arange(width), len(lengths))
    times, tix = np.unique(t, return_inverse=True)
    return times, tix.reshape(-1)


class _Meanings:
    """``meaning`` per series labels, remembered: backfill asks for the same series in
    every chunk (bounded: cleared past ``limit`` entries)."""

    def __init__(self, limit: int = 200_000) -> None:
        self._held: dict[tuple[tuple[str, str], ...], SeriesMeaning | None] = {}
        self._limit = limit

    def __call__(self, metric: dict[str, str], node_label: str | None) -> SeriesMeaning | None:
        key = tuple(metric.items())
        if key in self._held:
            return self._held[key]
        labels = dict(metric)
        name = labels.pop("__name__", "")
        if node_label and node_label in labels:
            labels["Hostname"] = labels[node_label]
        if len(self._held) >= self._limit:
            self._held.clear()
        m = self._held[key] = meaning(name, labels)
        return m


_MEANINGS: dict[str | None, _Meanings] = {}


def samples_table(matrices: Sequence[Matrix], *, node_label: str | None = None,
                  default_node: str = "unknown") -> pa.Table:
    """GPU samples (``schema.SAMPLE_SCHEMA``) from several queries' matrices."""
    means = _MEANINGS.setdefault(node_label, _Meanings())
    series: list[tuple[SeriesMeaning, np.ndarray]] = []
    for matrix in matrices:
        for metric, pts in matrix:
            m = means(metric, node_label)
            if m is not None and len(pts):
                series.append((m, pts))
    target = schema.SAMPLE_SCHEMA
    if not series:
        return target.empty_table()
    # every point at once: its series, time slot, GPU, value, blank or not
    lengths = np.array([len(p) for _, p in series])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    pts = np.concatenate([p for _, p in series])
    keys: dict[str, int] = {}
    gid_of = np.array([keys.setdefault(m.key, len(keys)) for m, _ in series])
    sid = np.repeat(np.arange(len(series)), lengths)
    times, tix = _slots(pts[:, 0], lengths)
    gid = gid_of[sid]
    # one sample per (GPU, timestamp) with a point, ordered by time then GPU
    present = np.zeros((len(times), len(keys)), bool)
    present[tix, gid] = True
    n = int(present.sum())
    row_of = np.full(present.shape, -1, np.int64)
    row_of[present] = np.arange(n)
    rows = row_of[tix, gid]
    first = np.full(n, len(series), np.int64)     # the series that names each sample's GPU
    np.minimum.at(first, rows, sid)
    v_all = pts[:, 1]
    blank_all = _blank(v_all)
    fields: dict[str, _Field] = {}
    links: dict[str, _Links] = {}
    for (m, _), a, b in zip(series, starts, ends, strict=True):
        if m.kind == "field":
            # converted as the exporter does (int(v), v != 0): the field's contract type
            typ = target.field(m.fname).type
            ok = ~blank_all[a:b]
            val = v_all[a:b][ok]
            if pa.types.is_integer(typ):
                val = np.trunc(val)
            elif pa.types.is_boolean(typ):
                val = (val != 0).astype(np.float64)
            fields.setdefault(m.fname, _Field(n, m.fname)).add(rows[a:b][ok], val, m.mig)
        elif m.kind == "link":
            links.setdefault(m.fname, _Links(n)).add(rows[a:b], v_all[a:b], blank_all[a:b],
                                                     m.link)
    ident = [series[i][0] for i in first]
    t_row, _ = np.nonzero(present)
    ts_us = np.round(times[t_row] * 1e6).astype(np.int64)
    cols: dict[str, Any] = {
        "ts": pa.array(ts_us, type=target.field("ts").type),
        "node": pa.array([m.host or default_node for m in ident], pa.string()),
        "gpu_uuid": pa.array([m.key for m in ident], pa.string()),
        "gpu_index": pa.array([m.index for m in ident], pa.int64()),
        "pci_bus_id": pa.array([m.pci for m in ident], pa.string()),
        "model": pa.array([m.model for m in ident], pa.string()),
    }
    for name, f in fields.items():
        typ = target.field(name).type
        vals = f.val.astype(np.int64) if pa.types.is_integer(typ) else (
            f.val != 0 if pa.types.is_boolean(typ) else f.val)
        cols[name] = pa.array(vals, type=typ, mask=~f.set)
    for name, lk in links.items():
        cols[name] = lk.arrow(target.field(name).type)
    arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
              for f in target]
    table = pa.Table.from_arrays(arrays, schema=target)
    return table.sort_by([("ts", "ascending"), ("gpu_index", "ascending"),
                          ("gpu_uuid", "ascending")])
