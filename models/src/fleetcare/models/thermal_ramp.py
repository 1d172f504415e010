"""A rule beside the model for failing cooling: a GPU whose temperature, at the same
power, has risen hour after hour for twelve hours.

The booster reads each hour's temperature residual but not its shape over the day, and
ranks a thermal precursor (a ramp, ``collectors`` ``sim/telemetry.py``: ~18 degC over a
lead of a day) with GPUs that simply run hot or stepped up once; at the prior's
operating point it caught 1 of 35 thermal failures on its x4 validation fleets. A GPU
whose residual is at least ``RESID_C`` above its peers and rose by ``SLOPE_C_H`` per hour
over the newest six hours and by ``SLOPE_PREV_C_H`` over the six before
(``pipeline.temp_trend``) gets at least ``RISK`` (its node's risk follows), with a reason
in plain words; the alert rule's hold then applies as to any risk.

Fixed on the prior's x4 **validation** fleets only (their cached hourly rows, 45,248
node-days, 36 thermal failures; README), before any fleet of the pool was scored with
it: of the combinations tried (residual 5 / 8 / 10 degC, slopes 0.2-0.8 / 0.1-0.5),
the one catching the most thermal failures within 0.11 extra false drains per 1,000
node-days (half of what the model's alarms leave of the 0.8 there) alone and held an
hour: 21 of 36, 4 false episodes (0.09 per 1,000 node-days). ``RISK`` is the share of
the node-hours it held on that had the node fail within 24 h there (0.905): a
probability, like the model's, over the same horizon.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np
import pyarrow as pa

from fleetcare.pipeline import temp_trend
from fleetcare.pipeline.store import Store

__all__ = ["RESID_C", "RISK", "SLOPE_C_H", "SLOPE_PREV_C_H", "Ramp", "chunked", "grid", "raised",
           "live", "predictor", "reason"]

log = logging.getLogger(__name__)

RESID_C = 5.0
SLOPE_C_H = 0.5
SLOPE_PREV_C_H = 0.25
RISK = 0.90


class Ramp:
    """The rule's verdict on a feature table's rows: ``hit`` (bool per row) and the
    trend behind it (``slope_6h``, ``slope_prev_6h``, NaN where not computed)."""

    def __init__(self, resid: np.ndarray, slope_6h: np.ndarray, slope_prev_6h: np.ndarray
                 ) -> None:
        self.resid = resid
        self.slope_6h = slope_6h
        self.slope_prev_6h = slope_prev_6h
        with np.errstate(invalid="ignore"):
            self.hit = ((resid >= RESID_C) & (slope_6h >= SLOPE_C_H)
                        & (slope_prev_6h >= SLOPE_PREV_C_H))

    def risk(self, p: np.ndarray) -> np.ndarray:
        """``p`` with every hit row raised to at least ``RISK``."""
        return raised(p, self.hit)


def raised(p: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """The model's probabilities ``p`` with the rows ``hit`` raised to at least ``RISK``."""
    return np.where(hit, np.maximum(p, RISK), p)


def _resid(table: pa.Table) -> np.ndarray:
    if "gpu_temp_resid_1h" not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return np.asarray(table.column("gpu_temp_resid_1h").to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def grid(table: pa.Table) -> Ramp:
    """The rule over a training grid's hourly rows (``temp_trend.grid_trend``)."""
    resid = _resid(table)
    if "gpu_uuid" not in table.column_names or not np.isfinite(resid).any():
        nan = np.full(table.num_rows, np.nan)
        return Ramp(resid, nan, nan)
    s6, s6b = temp_trend.grid_trend(table)
    return Ramp(resid, s6, s6b)


def chunked(predict: Callable[[pa.Table], np.ndarray]) -> Callable[[pa.Table], np.ndarray]:
    """``predict`` with the rule's floor, for a grid's rows that come as consecutive time
    chunks (``dataset.score``: ``train``, ``evaluate``, the promotion check): each chunk's
    lags reach into the rows of the chunks before it (the last ``temp_trend.LAGS`` hours
    are kept), and into the rows ``dataset.score`` passes over (its ``see``: a pass
    starts ``dataset.lead_in`` before its period, so the period's first hours have
    their lags too). Make one per pass over the rows."""
    return _Chunked(predict)


class _Chunked:
    def __init__(self, predict: Callable[[pa.Table], np.ndarray]) -> None:
        self._predict = predict
        self._tail: list[pa.Table] = []

    @staticmethod
    def _narrow(table: pa.Table) -> pa.Table | None:
        if "gpu_uuid" not in table.column_names or "gpu_temp_resid_1h" not in table.column_names:
            return None
        return pa.table({
            "ts": table.column("ts").cast(pa.timestamp("us")),
            "gpu_uuid": table.column("gpu_uuid").cast(pa.string()),
            "gpu_temp_resid_1h": table.column("gpu_temp_resid_1h").cast(pa.float64())})

    def _remember(self, both: pa.Table, cur: pa.Table) -> None:
        # the rows this chunk's successors may lag into; another shard's or pass's chunk
        # may start earlier than the one before, so the cut is this chunk's own newest row
        keep = np.timedelta64(temp_trend.LAGS * 3600, "s")
        ts = both.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
        newest = cur.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]").max()
        self._tail[:] = [both.filter(pa.array(ts > newest - keep))]

    def see(self, table: pa.Table) -> None:
        """Rows not scored, held as the lags of the rows after them."""
        cur = self._narrow(table) if table.num_rows else None
        if cur is not None:
            self._remember(pa.concat_tables([*self._tail, cur]), cur)

    def __call__(self, table: pa.Table) -> np.ndarray:
        p = self._predict(table)
        if table.num_rows == 0:
            return p
        cur = self._narrow(table)
        if cur is None:
            log.warning("thermal_ramp.no_residual: rows without gpu_uuid or gpu_temp_resid_1h "
                        "are scored without the thermal-ramp rule that scoring applies")
            return p
        both = pa.concat_tables([*self._tail, cur])
        hit = grid(both).hit[both.num_rows - cur.num_rows:]
        self._remember(both, cur)
        return raised(p, hit)


class Classifier(Protocol):
    """What ``predictor`` needs of a model: scikit-learn's ``predict_proba``."""

    def predict_proba(self, table: pa.Table) -> np.ndarray: ...


def predictor(model: Classifier) -> Callable[[pa.Table], np.ndarray]:
    """``model``'s failure probabilities as scoring gives them, with the rule beside it,
    for a grid's rows in consecutive time chunks (``chunked``; one per pass)."""
    return chunked(lambda t: model.predict_proba(t)[:, 1])


def live(store: Store, table: pa.Table) -> Ramp:
    """The rule over a live feature table (``latest_features``): the trend is read only
    for rows at least ``RESID_C`` above their peers now."""
    resid = _resid(table)
    s6 = np.full(table.num_rows, np.nan)
    s6b = np.full(table.num_rows, np.nan)
    with np.errstate(invalid="ignore"):
        rows = np.flatnonzero(resid >= RESID_C)
    if len(rows):
        s6[rows], s6b[rows] = temp_trend.latest_trend(store, table, rows)
    return Ramp(resid, s6, s6b)


def reason(ramp: Ramp, row: int) -> str:
    """The plain-words reason of a hit row."""
    return (f"temperature rising at the same power: {ramp.resid[row]:.0f} °C above what its "
            f"power predicts, up {ramp.slope_6h[row]:.1f} °C/h over the last 6 h and "
            f"{ramp.slope_prev_6h[row]:.1f} °C/h the 6 h before (failing cooling ramps; a "
            f"GPU that runs hot does not)")
