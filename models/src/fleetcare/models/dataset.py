"""A fleet's feature rows for training and evaluation, built in time chunks.

A 512-node fleet over 60 days is 5.9 M GPU-hours: its 161 float64 features are 7.6 GB in
one table. Here the features are computed for a few days of scoring times at a time
(``features.gpu_features`` reads each window's history itself), labels are attached, and
each chunk is cut down at once to the keys, the labels and the model's features as
float32 (every counter delta below 2^24 is exact; the model reads float64 back).

- ``chunks(store, start, end)``: those tables, oldest first; ``load``: all in one table.
- ``aftermath(table, failures)``: the rows in the 24 h after one of their node's failures
  (``training.aftermath``'s rule), from the fleet's own failure list, so it holds across
  chunk boundaries.
- ``sample(table, keep, negatives, seed, hard)``: training rows: every positive, every
  row of a node with a failure ahead, every *hard* healthy row (``hard``: e.g. the healthy
  rows a first model scores highest, ``hard_negatives``), and a fixed share ``negatives``
  of the other rows, chosen by a hash of (GPU, time, seed) so that the same data gives the
  same rows. ``weight`` is 1 for the kept-whole rows and 1 / negatives for the sampled
  ones: the booster and the calibrator see the fleet's base rate (a stratified sample,
  each stratum weighted by the inverse of its sampling rate).
- Why keep hard negatives whole: the healthy rows that look like a precursor (a burst of
  corrected ECC that stops, a PCIe replay burst, a hot GPU: the simulator's decoys, a
  real fleet's benign noise) are a few per thousand. Sampled at 5 % with weight 20, the
  booster sees one row in twenty of them, each counting twenty times: too few to learn
  where a precursor differs from a look-alike, which is what a false drain is.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from fleetcare.models import metrics as M
from fleetcare.models import training as T

Progress = Callable[[str], None]
CHUNK = dt.timedelta(days=8)
"""Scoring times per chunk: with the 7-day windows' history, ~15 days of rollups a query."""
WEIGHT = "weight"


def compact(table: pa.Table, names: Sequence[str] | None = None) -> pa.Table:
    """Keys, labels and the model's features (``names``, default ``model_features``) as
    float32; every other column is dropped."""
    keep = set(names if names is not None else T.model_features(T.feature_columns(table)))
    cols, out_names = [], []
    for name, col in zip(table.column_names, table.columns, strict=True):
        if name in keep:
            col = col.cast(pa.float32())
        elif name not in T.LABEL_COLUMNS and not T.is_key(name) and name != WEIGHT:
            continue
        cols.append(col)
        out_names.append(name)
    return pa.table(cols, names=out_names)


def chunks(store: Any, start: dt.datetime, end: dt.datetime, *, every_s: int = 3600,
           horizon_h: float = 24.0, chunk: dt.timedelta = CHUNK,
           names: Sequence[str] | None = None, say: Progress | None = None
           ) -> Iterator[pa.Table]:
    """Compact feature + label tables for scoring times ``start, start + every_s, ... <=
    end``, a chunk of ``chunk`` at a time (every chunk starts on the grid)."""
    from fleetcare.pipeline import features, labels

    step = dt.timedelta(seconds=every_s)
    per = max(1, int(chunk / step))
    n = int((end - start) / step) + 1
    for k in range(0, n, per):
        c0 = start + k * step
        c1 = start + (min(k + per, n) - 1) * step
        if say is not None:
            say(f"features {c0:%Y-%m-%d %H:%M} .. {c1:%Y-%m-%d %H:%M}")
        feats = features.gpu_features(store, c0, c1, every_s=every_s)
        yield compact(labels.attach_labels(store, feats, horizon_h=horizon_h), names)


def load(store: Any, start: dt.datetime, end: dt.datetime, **kw: Any) -> pa.Table:
    """All of ``chunks`` in one table."""
    parts = list(chunks(store, start, end, **kw))
    return pa.concat_tables(parts) if parts else pa.table({})


def fleet_failures(store: Any) -> list[M.Failure]:
    """Every failure incident of the store: (node, ts, mode)."""
    from fleetcare.pipeline import labels

    far = dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
    f = labels.failures(store, *far)
    ts = T.ts_column(f)
    return [M.Failure(str(n), t, str(m)) for n, t, m in
            zip(f.column("node").to_pylist(), ts, f.column("mode").to_pylist(), strict=True)]


def aftermath(table: pa.Table, failures: Sequence[M.Failure],
              hours: float = T.AFTERMATH_H) -> np.ndarray:
    """Rows of a node in ``(f, f + hours]`` after one of its failures ``f``."""
    out = np.zeros(table.num_rows, dtype=bool)
    if hours <= 0 or table.num_rows == 0 or not failures:
        return out
    ts, node = T.ts_column(table), T._str(table, "node").astype(str)
    span = np.timedelta64(int(round(hours * 3600)), "s")
    by_node: dict[str, list[np.datetime64]] = {}
    for f in failures:
        by_node.setdefault(f.node, []).append(f.ts.astype("datetime64[us]"))
    for name in np.unique(node):
        fails = by_node.get(str(name))
        if not fails:
            continue
        rows = np.flatnonzero(node == name)
        for at in fails:
            out[rows[(ts[rows] > at) & (ts[rows] <= at + span)]] = True
    return out


def _hash_uniform(gpu: np.ndarray, ts: np.ndarray, seed: int) -> np.ndarray:
    """A uniform [0, 1) per (GPU, time, seed), the same on every run and machine."""
    from fleetcare.collectors.sim.telemetry import hash_uniform

    uniq, inv = np.unique(gpu.astype(str), return_inverse=True)
    codes = np.array([zlib.crc32(u.encode()) for u in uniq], dtype=np.int64)[inv]
    return hash_uniform(seed, codes, ts.astype("datetime64[s]").astype(np.int64), 17)


def hard_negatives(p: np.ndarray, candidates: np.ndarray, share: float) -> np.ndarray:
    """The ``share`` of the ``candidates`` (healthy rows) with the highest score ``p``
    (ties at the cut all kept): the rows ``sample`` keeps whole."""
    out = np.zeros(len(p), dtype=bool)
    if share <= 0 or not candidates.any():
        return out
    cut = np.quantile(np.asarray(p, dtype=np.float64)[candidates], 1.0 - min(share, 1.0))
    out[candidates] = np.asarray(p)[candidates] >= cut
    return out


def sample(table: pa.Table, keep: np.ndarray, *, negatives: float, seed: int = 0,
           hard: np.ndarray | None = None) -> pa.Table:
    """The rows of ``keep`` a training set takes, with a ``weight`` column (module doc)."""
    if not 0 < negatives <= 1:
        raise ValueError(f"negatives={negatives} must be in (0, 1]: the share of healthy "
                         "rows kept")
    whole = T._bool(table, "label") | T._bool(table, "node_label")
    if hard is not None:
        whole = whole | np.asarray(hard, dtype=bool)
    take = keep & whole
    if negatives < 1:
        gpu = T._str(table, "gpu_uuid")
        u = _hash_uniform(gpu, T.ts_column(table), seed)
        take |= keep & ~whole & (u < negatives)
        weight = np.where(whole, 1.0, 1.0 / negatives).astype(np.float32)
    else:
        take |= keep
        weight = np.ones(table.num_rows, dtype=np.float32)
    out = table.filter(pa.array(take))
    return out.append_column(WEIGHT, pa.array(weight[take], pa.float32()))
