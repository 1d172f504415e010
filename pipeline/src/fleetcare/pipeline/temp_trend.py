"""How a GPU's temperature, corrected for its power, moved over the last twelve hours.

A cooling fault (a fan or pump failing, a cold plate clogging, paste drying out) heats
the GPU a little more every hour at the same power; a GPU that simply runs hot sits
above its peers at every hour, and one that heated up once (a neighbour's exhaust, a
fan curve changed) is a step. The hour's residual (``gpu_temp_resid_1h``: the GPU's mean
temperature of the hour minus what its power predicts, from a line fitted over the GPUs
of its model at the same time) tells neither from the ramp. The trend is two
least-squares slopes of that hourly residual against time, in degC per hour: over the
newest six hours (``slope_6h``, lags 0-5) and over the six before (``slope_prev_6h``,
lags 6-11). A ramp rises in both; a step rises in at most one. NaN where an hour is
missing.

The same numbers two ways:

- ``grid_trend(table)``: from a training grid's hourly rows (``features.gpu_features``),
  where each GPU has its residual at every hour: lag ``k`` is its row ``k`` hours before.
- ``latest_trend(store, table, gpus)``: live, for rows of ``latest_features``: lag 0 is
  the row's own ``gpu_temp_resid_1h``; lag ``k`` (1-11) is the residual of the full
  hour ``[T - (k+1) h, T - k h)`` (``T``: the hour of the scoring time), fitted over the
  hour's GPUs of each model as the grid's peer fit is (those that reported in the hour's
  last ``STALE_AFTER``). On the hour both agree exactly
  (``tests/pipeline/test_temp_trend.py``). Off the hour, lag 0 is the row's own window
  ``[T - 1 h, at]``, as every live feature's: a ramp's newest slope reads up to ~7 %
  steeper at the end of an hour than on it.

The live read keeps each hour's residuals of the whole fleet (``HOURS``, per store, the
``LAGS`` hours read last, let go when the store closes; ~5 MB an hour at 100,000 GPUs):
the peer fit needs every GPU of the hour anyway, and the hours before ``T - 1 h`` change
only when telemetry is rolled up into them again. Each call checks every hour it reads
by a fingerprint of its hourly rows (count, samples, newest sample) and computes only
the hours that are new or changed: on the hour, one; within it, none (0.47 -> 0.015 s a
scoring at 100,000 GPUs, README). Kept or not, the numbers are the same (``tests/pipeline/test_temp_trend.py``).
"""

from __future__ import annotations

import datetime as dt
import threading
import weakref
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.pipeline import rollup
from fleetcare.pipeline.store import Store, held_for

__all__ = ["HOURS", "LAGS", "grid_trend", "latest_trend", "slopes"]

LAGS = 12
_W = 2.5 - np.arange(6)  # lag 0 is the newest: time runs backwards in the lags
_SXX = float((_W ** 2).sum())


def slopes(lagged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slope_6h, slope_prev_6h) of residuals given as ``(LAGS, n)``, lag 0 first."""
    return ((_W[:, None] * lagged[0:6]).sum(0) / _SXX,
            (_W[:, None] * lagged[6:12]).sum(0) / _SXX)


def _ts(table: pa.Table) -> np.ndarray:
    return table.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")


def _resid(table: pa.Table) -> np.ndarray:
    col = table.column("gpu_temp_resid_1h").to_numpy(zero_copy_only=False)
    return np.asarray(col, dtype=np.float64)


def grid_trend(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (slope_6h, slope_prev_6h) from the same GPU's rows exactly 1-11 hours
    before it (``ts``, ``gpu_uuid``, ``gpu_temp_resid_1h``; any grid spacing, rows in any
    order); NaN where one of them is missing."""
    n = table.num_rows
    gpu = table.column("gpu_uuid").combine_chunks().dictionary_encode()
    code = np.asarray(gpu.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    ts = _ts(table).astype("datetime64[s]").astype(np.int64)  # a grid's times: seconds
    lo = int(ts.min()) if n else 0
    key = code * (int(ts.max()) - lo + 1 + LAGS * 3600 if n else 1) + (ts - lo)
    order = np.argsort(key, kind="stable")
    keys = key[order]
    r = _resid(table)[order]
    lagged = np.full((LAGS, n), np.nan)
    lagged[0] = r
    for k in range(1, LAGS):
        want = keys - k * 3600
        at = np.minimum(np.searchsorted(keys, want), max(n - 1, 0))
        same = keys[at] == want if n else np.zeros(0, dtype=bool)
        lagged[k] = np.where(same, r[at], np.nan)
    s6, s6b = slopes(lagged)
    out6, outb = np.empty(n), np.empty(n)
    out6[order], outb[order] = s6, s6b
    return out6, outb


def _hourly_sql(source: str, lo: str, hi: str, hours: str, stale_s: int) -> str:
    """Every GPU's residual of the full hours ``hours`` (a SQL list of timestamps, all in
    ``[lo, hi]``: the range lets DuckDB skip the row groups of other hours), each
    hour's line fitted over the GPUs of the same model the grid scores at the hour's end
    (``features``' peer fit: those that reported within ``stale_s`` before it)."""
    return f"""
WITH h AS (
  SELECT gpu_uuid, hour, arg_max(model, gpu_temp_n) AS model,
    sum(gpu_temp_sum) / nullif(sum(gpu_temp_n), 0) AS t,
    sum(power_sum) / nullif(sum(power_n), 0) AS p
  FROM {source} WHERE hour >= {lo} AND hour <= {hi} AND hour IN ({hours})
  GROUP BY gpu_uuid, hour
  HAVING max(last_ts) >= hour + INTERVAL 1 HOUR - INTERVAL {stale_s} SECOND
),
fit AS (
  SELECT hour, model, regr_slope(t, p) AS b, regr_intercept(t, p) AS a, avg(t) AS m
  FROM h GROUP BY hour, model
)
SELECT h.gpu_uuid, h.hour,
  h.t - coalesce(CASE WHEN isfinite(fit.a + fit.b * h.p) THEN fit.a + fit.b * h.p END,
                 fit.m) AS r
FROM h JOIN fit ON fit.hour = h.hour AND fit.model IS NOT DISTINCT FROM h.model"""


_Hour = tuple[tuple[object, ...], pa.Array, np.ndarray]  # fingerprint, gpu_uuid, residual


class _Hours:
    """Each store's hourly residuals of every GPU by hour (at most ``keep`` hours, the
    least recently read dropped first), reused while the hour's rows are unchanged;
    ``built`` counts the hours computed."""

    def __init__(self, keep: int = LAGS) -> None:
        self._held: weakref.WeakKeyDictionary[Store, dict[dt.datetime, _Hour]] = (
            weakref.WeakKeyDictionary())
        self._keep = keep
        self._lock = threading.Lock()
        self.built = 0

    def held(self, store: Store) -> int:
        """How many hours are held for ``store``."""
        with self._lock:
            return len(self._held.get(store, {}))

    def get(self, store: Store, cur: duckdb.DuckDBPyConnection, source: str,
            lo: dt.datetime, hi: dt.datetime, stale_s: int) -> dict[dt.datetime, _Hour]:
        """The residuals of the hours in ``[lo, hi)`` that have rows."""
        from fleetcare.pipeline import features as f

        prints = {rollup._ts(h): tuple(k) for h, *k in cur.execute(
            f"SELECT hour, count(*), sum(n), max(last_ts) FROM {source} "
            f"WHERE hour >= {f._lit(lo)} AND hour < {f._lit(hi)} GROUP BY hour").fetchall()}
        with self._lock:
            mine = held_for(self._held, store, dict)
            out = {h: mine[h] for h in prints if h in mine and mine[h][0] == prints[h]}
        todo = sorted(set(prints) - set(out))
        if todo:
            hours = ", ".join(f._lit(h) for h in todo)
            got = cur.sql(_hourly_sql(source, f._lit(todo[0]), f._lit(todo[-1]), hours,
                                      stale_s)).to_arrow_table()
            hour_col = got.column("hour")
            for h in todo:
                one = got.filter(pc.equal(hour_col, pa.scalar(h, hour_col.type)))
                out[h] = (prints[h], one.column("gpu_uuid").combine_chunks(),
                          np.asarray(one.column("r").to_numpy(zero_copy_only=False),
                                     dtype=np.float64))
        with self._lock:
            mine = held_for(self._held, store, dict)
            for h in sorted(out):  # read now: the most recently used
                mine.pop(h, None)
                mine[h] = out[h]
            for old in list(mine)[:max(len(mine) - self._keep, 0)]:
                del mine[old]
            self.built += len(todo)
        return out


HOURS = _Hours()


def latest_trend(store: Store, table: pa.Table, gpus: Sequence[int] | np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(slope_6h, slope_prev_6h) of rows ``gpus`` (positions) of ``table``, a live
    feature table scored at one time (``features.latest_features``); NaN where an hour
    is missing. Reads the hourly rollup (``rollup.telemetry_hourly``, as far as built;
    the rest rolled up on the fly, as ``latest_features`` does): only full hours before
    ``T - 1 h``, which live features too take as complete (each hour's residuals kept in
    ``HOURS``)."""
    from fleetcare.pipeline import features as f

    rows = np.asarray(gpus, dtype=np.int64)
    if len(rows) == 0:
        return np.zeros(0), np.zeros(0)
    at = _ts(table)[rows].max().astype(dt.datetime)
    top = rollup.hour_floor(at)
    lagged = np.full((LAGS, len(rows)), np.nan)
    lagged[0] = _resid(table)[rows]
    uuids = table.column("gpu_uuid").take(pa.array(rows)).cast(pa.string()).combine_chunks()
    cur = store.cursor()
    try:
        # only the full hours before T - 1 h: the stored rollup once it reaches there
        source = f._source(store, cur, top - dt.timedelta(hours=1), exact=False)
        held = HOURS.get(store, cur, source, top - dt.timedelta(hours=LAGS),
                         top - dt.timedelta(hours=1), int(f.STALE_AFTER.total_seconds()))
    finally:
        cur.close()
    for hour, (_, hour_gpus, r) in held.items():
        lag = (top - hour) // dt.timedelta(hours=1) - 1
        if not 1 <= lag < LAGS or len(r) == 0:
            continue
        at_row = pc.fill_null(pc.index_in(uuids, value_set=hour_gpus), -1).to_numpy()
        found = at_row >= 0
        lagged[lag, found] = r[at_row[found]]
    return slopes(lagged)
