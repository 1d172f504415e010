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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from fleetcare.pipeline import rollup
from fleetcare.pipeline.store import Store

__all__ = ["LAGS", "grid_trend", "latest_trend", "slopes"]

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


def _hourly_sql(source: str, lo: str, hi: str, gpus: str, stale_s: int) -> str:
    """The residual of ``gpus``' full hours in ``[lo, hi)``, each hour's line fitted
    over the GPUs of the same model the grid scores at the hour's end (``features``'
    peer fit: those that reported within ``stale_s`` before it)."""
    return f"""
WITH h AS (
  SELECT gpu_uuid, hour, arg_max(model, gpu_temp_n) AS model,
    sum(gpu_temp_sum) / nullif(sum(gpu_temp_n), 0) AS t,
    sum(power_sum) / nullif(sum(power_n), 0) AS p
  FROM {source} WHERE hour >= {lo} AND hour < {hi}
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
FROM h JOIN fit ON fit.hour = h.hour AND fit.model IS NOT DISTINCT FROM h.model
WHERE h.gpu_uuid IN (SELECT gpu_uuid FROM {gpus})"""


def latest_trend(store: Store, table: pa.Table, gpus: Sequence[int] | np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(slope_6h, slope_prev_6h) of rows ``gpus`` (positions) of ``table``, a live
    feature table scored at one time (``features.latest_features``); NaN where an hour
    is missing. Reads the hourly rollup (``rollup.telemetry_hourly``, as far as built;
    the rest rolled up on the fly, as ``latest_features`` does): only full hours before
    ``T - 1 h``, which live features too take as complete."""
    from fleetcare.pipeline import features as f

    rows = np.asarray(gpus, dtype=np.int64)
    if len(rows) == 0:
        return np.zeros(0), np.zeros(0)
    at = _ts(table)[rows].max().astype(dt.datetime)
    top = rollup.hour_floor(at)
    lagged = np.full((LAGS, len(rows)), np.nan)
    lagged[0] = _resid(table)[rows]
    uuids = [str(u) for u in
             table.column("gpu_uuid").take(pa.array(rows)).to_pylist()]
    cur = store.cursor()
    try:
        # only the full hours before T - 1 h: the stored rollup once it reaches there
        source = f._source(store, cur, top - dt.timedelta(hours=1), exact=False)
        cur.register("fc_trend_gpus", pa.table({"gpu_uuid": pa.array(uuids, pa.string())}))
        lo = f._lit(top - dt.timedelta(hours=LAGS))
        hi = f._lit(top - dt.timedelta(hours=1))
        got = cur.sql(_hourly_sql(source, lo, hi, "fc_trend_gpus",
                                  int(f.STALE_AFTER.total_seconds()))).to_arrow_table()
    finally:
        cur.close()
    pos = {u: k for k, u in enumerate(uuids)}
    hours = got.column("hour").to_numpy(zero_copy_only=False).astype("datetime64[us]")
    lag = ((np.datetime64(top, "us") - hours) // np.timedelta64(3600, "s")).astype(int) - 1
    col = np.array([pos[u] for u in got.column("gpu_uuid").to_pylist()], dtype=np.int64)
    r = np.asarray(got.column("r").to_numpy(zero_copy_only=False), dtype=np.float64)
    ok = (lag >= 1) & (lag < LAGS)
    lagged[lag[ok], col[ok]] = r[ok]
    return slopes(lagged)
