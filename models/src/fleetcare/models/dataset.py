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
- ``Spill``: the compact rows of a period, in memory up to ``SPILL_BYTES``, then on disk
  (one Parquet file per chunk), read back a chunk at a time; their keys and labels stay in
  memory.
- ``fit_rows(chunks, ...)`` / ``score(chunks, predictors)``: what ``training.train``,
  ``evaluation`` and ``promotion`` build from a store's chunks, so that their memory does
  not grow with the fleet: the training and calibration rows down-sampled (``sample``, with
  ``negatives_for`` keeping at most ``MAX_FIT_ROWS``), the scored period reduced at once to
  its keys, labels and each model's probability.
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
  ``hard_weight`` makes each of them count more in a fit (not in calibration): the
  ranking then pays attention to them as if look-alikes were that much more common, while
  the calibrated probabilities keep the base rate (the fleet prior uses 16).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import tempfile
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fleetcare.models import metrics as M
from fleetcare.models import training as T
from fleetcare.pipeline import temp_trend

Progress = Callable[[str], None]
CHUNK = dt.timedelta(days=8)
"""Scoring times per chunk at most: with the 7-day windows' history, ~15 days of rollups a
query."""
CHUNK_ROWS = 600_000
"""GPU rows per chunk at most (``chunk_for``): DuckDB hands back 161 float64 features a row
(~0.8 GB for this many) before they are cut to the model's float32 columns."""
MAX_FIT_ROWS = 2_500_000
"""Training + calibration rows a fit takes at most (``negatives_for``): ~1.2 GB as float32,
twice that while LightGBM bins them. Fleets below it (the benchmarks' 512 nodes x 30 days
at 4,096 GPUs: 2.1 M) keep every row."""
BASELINE_ROWS = 500_000
"""Rows the logistic baseline fits on at most (``thin``): scikit-learn's imputer, scaler and
solver each copy its float64 matrix (~0.5 GB at this size)."""
SPILL_BYTES = 512 * 2**20
"""A ``Spill`` keeps this many bytes of rows in memory, the rest on disk."""
KEEP = ("ts", "node", "gpu_uuid", "gpu_index", "model", "label", "node_label", "failure_ts",
        "failure_mode", "failure_cause")
"""The columns a scored period keeps per row (``Scored.keys``, ``Spill.keys``)."""
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


def chunk_for(gpus: int, every_s: int = 3600, *, rows: int | None = None,
              most: dt.timedelta = CHUNK) -> dt.timedelta:
    """Scoring times per chunk for a fleet of ``gpus``: at most ``rows`` (default
    ``CHUNK_ROWS``) GPU rows a chunk, at most ``most``, at least one step."""
    step = dt.timedelta(seconds=every_s)
    per = max(1, (CHUNK_ROWS if rows is None else rows) // max(gpus, 1))
    return max(step, min(most, step * per))


def fleet_gpus(store: Any) -> int:
    """GPUs in the store's hourly rollups (what a grid of scoring times has rows for)."""
    from fleetcare.pipeline import rollup

    cur = store.cursor()
    try:
        rollup.ensure_tables(cur)
        row = cur.execute(f"SELECT count(DISTINCT gpu_uuid) FROM {rollup.TABLE}").fetchone()
    finally:
        cur.close()
    return int(row[0]) if row else 0


@dataclasses.dataclass(frozen=True)
class Grid:
    """How ``train`` and ``evaluate`` read a store (``grid``): the scoring times from
    ``start`` every ``step``, the first of them in the test period (``test_from``), how
    many come before it (``n_fit``), the fleet's GPUs and the chunk they are read in."""

    start: dt.datetime
    step: dt.timedelta
    n_fit: int
    test_from: dt.datetime
    gpus: int
    chunk: dt.timedelta

    @property
    def fit_end(self) -> dt.datetime:
        """The last scoring time before the test period."""
        return self.test_from - self.step

    def negatives(self) -> float:
        """The share of healthy fit rows to keep (``negatives_for`` the fit rows)."""
        return negatives_for(self.gpus * self.n_fit)


def grid(store: Any, start: dt.datetime, test_start: dt.datetime, every_s: int) -> Grid:
    """The scoring grid of ``store`` from ``start`` with its test period at ``test_start``."""
    step = dt.timedelta(seconds=every_s)
    n_fit = -(-(test_start - start) // step)  # grid times before the test period
    gpus = fleet_gpus(store)
    return Grid(start, step, n_fit, start + n_fit * step, gpus, chunk_for(gpus, every_s))


def negatives_for(rows: int, *, most: int | None = None) -> float:
    """The share of healthy rows a fit keeps so that about ``most`` (default
    ``MAX_FIT_ROWS``) of ``rows`` remain (1: every row, for fleets up to ``most``)."""
    most = MAX_FIT_ROWS if most is None else most
    return 1.0 if rows <= most else most / rows


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
           hard: np.ndarray | None = None, hard_weight: float = 1.0) -> pa.Table:
    """The rows of ``keep`` a training set takes, with a ``weight`` column (module doc).

    ``hard_weight`` (default 1) multiplies the weight of the hard rows that are not
    positive: a fit on such rows learns as if look-alikes were that many times as common
    (what the fleet prior trains with, ``prior.HARD_WEIGHT``); calibration rows keep 1."""
    if not 0 < negatives <= 1:
        raise ValueError(f"negatives={negatives} must be in (0, 1]: the share of healthy "
                         "rows kept")
    if not hard_weight > 0:
        raise ValueError(f"hard_weight={hard_weight} must be above 0")
    positive = T._bool(table, "label") | T._bool(table, "node_label")
    whole = positive
    hard_rows = np.zeros(table.num_rows, dtype=bool)
    if hard is not None:
        hard_rows = np.asarray(hard, dtype=bool) & ~positive
        whole = whole | hard_rows
    take = keep & whole
    if negatives < 1:
        gpu = T._str(table, "gpu_uuid")
        u = _hash_uniform(gpu, T.ts_column(table), seed)
        take |= keep & ~whole & (u < negatives)
        weight = np.where(whole, 1.0, 1.0 / negatives).astype(np.float32)
    else:
        take |= keep
        weight = np.ones(table.num_rows, dtype=np.float32)
    weight[hard_rows] *= np.float32(hard_weight)
    out = table.filter(pa.array(take))
    return out.append_column(WEIGHT, pa.array(weight[take], pa.float32()))


def thin(table: pa.Table, most: int, *, seed: int = 0) -> pa.Table:
    """``table`` (``sample``'s output, with ``weight``) cut to about ``most`` rows: every
    positive and node-label row kept, the other rows sampled again by the same hash, their
    weight multiplied by the inverse of the new share."""
    if table.num_rows <= most:
        return table
    whole = T._bool(table, "label") | T._bool(table, "node_label")
    rest = int((~whole).sum())
    share = max(0.0, min(1.0, (most - int(whole.sum())) / rest)) if rest else 1.0
    u = _hash_uniform(T._str(table, "gpu_uuid"), T.ts_column(table), seed + 7)
    take = whole | (u < share)
    w = table.column(WEIGHT).to_numpy().astype(np.float32)
    w = np.where(whole, w, w / share if share > 0 else w).astype(np.float32)
    i = table.column_names.index(WEIGHT)
    out = table.set_column(i, WEIGHT, pa.array(w, pa.float32()))
    return out.filter(pa.array(take))


# -- streaming: fit rows and scored periods --------------------------------------------------
def keys_of(table: pa.Table) -> pa.Table:
    """The ``KEEP`` columns of ``table`` (those it has)."""
    return table.select([c for c in KEEP if c in table.column_names])


class Spill:
    """Compact rows of one period, kept in memory up to ``limit`` bytes and then on disk
    (one Parquet file per ``add``, in a temporary folder removed with the object)."""

    def __init__(self, limit: int = SPILL_BYTES) -> None:
        self.limit = limit
        self._held: list[pa.Table] = []
        self._files: list[Path] = []
        self._keys: list[pa.Table] = []
        self._folder: Path | None = None
        self.num_rows = 0

    def _spill_to(self) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fleetcare-rows-"))
            weakref.finalize(self, shutil.rmtree, self._folder, True)
        return self._folder

    def _write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        path = self._spill_to() / f"part-{len(self._files):05d}.parquet"
        pq.write_table(table, path, compression="lz4")
        self._files.append(path)

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.num_rows += table.num_rows
        self._keys.append(keys_of(table))
        if self._files or sum(t.nbytes for t in self._held) + table.nbytes > self.limit:
            for t in self._held:
                self._write(t)
            self._held = []
            self._write(table)
        else:
            self._held.append(table)

    @property
    def spilled(self) -> bool:
        return bool(self._files)

    @property
    def keys(self) -> pa.Table:
        """Every row's ``KEEP`` columns, in the order of ``tables``."""
        return pa.concat_tables(self._keys) if self._keys else pa.table({})

    def tables(self) -> Iterator[pa.Table]:
        """The rows, one added table at a time."""
        import pyarrow.parquet as pq

        for path in self._files:
            yield pq.read_table(path)
        yield from self._held


Predict = Callable[[pa.Table], np.ndarray]


@dataclasses.dataclass
class Scored:
    """A period's rows reduced to their keys and labels (``KEEP``) and each model's
    probability per row (``p[name]``, aligned with ``keys``)."""

    keys: pa.Table
    p: dict[str, np.ndarray]

    @property
    def num_rows(self) -> int:
        return self.keys.num_rows


LEAD = dt.timedelta(hours=temp_trend.LAGS - 1)
"""How far back a pass reads before its period (``lead_in``): the thermal-ramp rule's lags."""


def lead_in(start: dt.datetime, every_s: int, *, floor: dt.datetime | None = None
            ) -> dt.datetime:
    """Where a pass that scores from ``start`` reads rows from, so that a predictor that
    reads each GPU's earlier rows (``thermal_ramp.chunked``: ``temp_trend.LAGS - 1`` hours
    back) has them at ``start`` too: the earliest grid time ``start - k * every_s``
    within those hours, not before ``floor``. The pass then keeps only rows from
    ``start`` (``score``'s ``keep``; the others are shown to such a predictor)."""
    back = LEAD
    if floor is not None:
        if (floor.tzinfo is None) != (start.tzinfo is None):  # naive: UTC, as stored
            floor = (floor.replace(tzinfo=dt.UTC) if floor.tzinfo is None
                     else floor.astimezone(dt.UTC).replace(tzinfo=None))
        back = min(back, max(start - floor, dt.timedelta(0)))
    step = dt.timedelta(seconds=every_s)
    return start - (back // step) * step


def score(tables: Iterable[pa.Table], predictors: Mapping[str, Predict],
          keep: Callable[[pa.Table], np.ndarray] | None = None) -> Scored:
    """Every table's rows (those ``keep`` selects, default all) scored by each predictor, one
    table at a time: only keys, labels and probabilities are kept. A predictor with a
    ``see(table)`` method is shown the rows ``keep`` drops, in time order with the rows it
    scores (those before a table's first kept row before them, the rest after: ``keep``
    selects a time window): a rule over each GPU's earlier rows takes its lags from them
    (``lead_in``)."""
    keys: list[pa.Table] = []
    ps: dict[str, list[np.ndarray]] = {k: [] for k in predictors}
    seers = [see for fn in predictors.values() if (see := getattr(fn, "see", None))]

    def show(rows: pa.Table) -> None:
        if rows.num_rows:
            for see in seers:
                see(rows)

    for t in tables:
        later = None
        if keep is not None:
            mask = np.asarray(keep(t), dtype=bool)
            if seers and not mask.all():
                ts = T.ts_column(t)
                before = ~mask & (ts < ts[mask].min()) if mask.any() else ~mask
                show(t.filter(pa.array(before)))
                later = t.filter(pa.array(~mask & ~before))
            t = t.filter(pa.array(mask))
        if t.num_rows:
            keys.append(keys_of(t))
            for name, fn in predictors.items():
                ps[name].append(np.asarray(fn(t), dtype=np.float64))
        if later is not None:
            show(later)
    return Scored(pa.concat_tables(keys) if keys else pa.table({}),
                  {k: np.concatenate(v) if v else np.zeros(0) for k, v in ps.items()})


@dataclasses.dataclass
class FitRows:
    """Training and calibration rows (``sample``: weighted), and every calibration-period
    row when asked for (``cal_all``: e.g. to choose an operating threshold on)."""

    train: pa.Table
    cal: pa.Table
    negatives: float
    cal_all: Spill | None = None


def fit_rows(tables: Iterable[pa.Table], *, cal_start: np.datetime64, test_start: np.datetime64,
             horizon: np.timedelta64, failures: Sequence[M.Failure], negatives: float,
             seed: int = 0, start: np.datetime64 | None = None, keep_cal: bool = False
             ) -> FitRows:
    """Training rows ``[start, cal_start)`` and calibration rows ``[cal_start, test_start)``
    whose label window ends inside their period, minus each failure's aftermath, healthy rows
    sampled at ``negatives`` (``sample``); with ``keep_cal`` every calibration-period row too
    (aftermath and unknown labels included: alarms need no label), and the rows of the
    ``LEAD`` before it (``lead_in``: drop them when scoring)."""
    train, cal = [], []
    cal_all = Spill() if keep_cal else None
    lead = cal_start - np.timedelta64(LEAD)
    for t in tables:
        ts = T.ts_column(t)
        ok = ~aftermath(t, failures)
        lo = ts >= start if start is not None else np.ones(len(ts), dtype=bool)
        train.append(sample(t, lo & (ts + horizon <= cal_start) & ok, negatives=negatives,
                            seed=seed))
        cal.append(sample(t, (ts >= cal_start) & (ts + horizon <= test_start) & ok,
                          negatives=negatives, seed=seed + 1))
        if cal_all is not None:
            cal_all.add(t.filter(pa.array((ts >= lead) & (ts < test_start))))
    return FitRows(_concat(train), _concat(cal), negatives, cal_all)


def _concat(parts: list[pa.Table]) -> pa.Table:
    parts = [p for p in parts if p.num_rows] or parts[:1]
    return pa.concat_tables(parts, promote_options="default") if parts else pa.table({})
