"""Promotion: a new model replaces the current one only if it does better on new data.

The rule (``consider``):

1. No current model: the new one becomes current.
2. ``force=True``: the new one becomes current, without a comparison.
3. Otherwise both models are scored on the **newer model's held-out test period** (its
   ``test_range`` in the registry: the latest data it was not fitted or calibrated on),
   with the same features, labels (at the new model's horizon) and metric code as
   training (``training.evaluate`` → ``metrics.node_metrics``). The new model wins when

   - its node-level ``pr_auc`` is higher by more than ``TIE_TOLERANCE``, or
   - the ``pr_auc`` values tie (within ``TIE_TOLERANCE``) and its ``recall_at_budget``
     (recall at <= 1 false drain per 1,000 node-days) is higher.

   Anything else (lower, an exact tie, a metric that cannot be computed because the
   period holds no failure) keeps the current model: a replacement has to earn its place.
4. Models with different horizons answer different questions (failure within 6 h vs
   24 h); they are not compared, and only ``force`` promotes.

When the current model was fitted or calibrated on part of the new test period (it was
trained on later data than the new model), the comparison favours it; the reason says so.

The decision's ``reason`` is one sentence that names both models, the metric values and
why, e.g. ``"m-…-b beats current m-…-a on 2025-03-11..2025-03-14: pr_auc 0.71 > 0.42"``.
``training.train`` does not call this: it registers a model, which becomes current only
when the registry has none (``registry.save``); the caller (``fleetcare train``,
``fleetcare models promote``) asks ``consider`` afterwards.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fleetcare.models import registry, thermal_ramp, training
from fleetcare.models.model import FailureModel
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

PRIMARY = "pr_auc"
TIE_BREAK = "recall_at_budget"
TIE_TOLERANCE = 1e-9
EVERY_S = 3600
"""Scoring grid of the comparison, the one ``training.train`` evaluates on."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PromotionDecision:
    """What ``consider`` decided.

    ``promoted``: the new model is the current one after the call (also when it already
    was). ``new_metrics`` / ``current_metrics``: both models' metrics on the comparison
    period, ``None`` when no comparison ran. ``period``: that period (aware UTC).
    """
    promoted: bool
    reason: str
    new_metrics: dict[str, Any] | None
    current_metrics: dict[str, Any] | None
    new_model_id: str = ""
    previous_model_id: str | None = None
    period: tuple[dt.datetime, dt.datetime] | None = None

    def as_json(self) -> dict[str, Any]:
        """JSON-safe: the ``promotion`` object of ``fleetcare train/models promote --json``."""
        return {
            "model_id": self.new_model_id, "promoted": self.promoted, "reason": self.reason,
            "previous_model_id": self.previous_model_id,
            "period": [t.isoformat() for t in self.period] if self.period else None,
            "new_metrics": _summary(self.new_metrics),
            "current_metrics": _summary(self.current_metrics),
        }


def _summary(m: dict[str, Any] | None) -> dict[str, Any] | None:
    if m is None:
        return None
    keys = (PRIMARY, TIE_BREAK, "false_drains_per_1000_node_days", "median_lead_time_h",
            "n_failures", "node_days")
    return {k: m.get(k) for k in keys}


def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def beats(new: dict[str, Any], current: dict[str, Any]) -> tuple[bool, str]:
    """(new wins, why) by the rule in the module doc; ``why`` names metric and values."""
    a, b = new.get(PRIMARY), current.get(PRIMARY)
    if a is None or b is None:
        return False, (f"{PRIMARY} cannot be computed on this period (no failure in it), "
                       "so neither model can be shown better")
    if a > b + TIE_TOLERANCE:
        return True, f"{PRIMARY} {_fmt(a)} > {_fmt(b)}"
    if a < b - TIE_TOLERANCE:
        return False, f"{PRIMARY} {_fmt(a)} < {_fmt(b)}"
    ra, rb = new.get(TIE_BREAK), current.get(TIE_BREAK)
    tie = f"{PRIMARY} ties at {_fmt(a)}"
    if ra is not None and (rb is None or ra > rb + TIE_TOLERANCE):
        return True, f"{tie}, {TIE_BREAK} {_fmt(ra)} > {_fmt(rb)}"
    return False, f"{tie} and {TIE_BREAK} {_fmt(ra)} is not higher than {_fmt(rb)}"


def _np_ts(value: dt.datetime) -> np.datetime64:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return np.datetime64(value, "us")


def evaluate_on_period(store: Store, models: dict[str, FailureModel], start: dt.datetime,
                       end: dt.datetime, *, horizon_h: float, every_s: int = EVERY_S,
                       origin: dt.datetime | None = None, progress: Progress | None = None,
                       ) -> dict[str, dict[str, Any]]:
    """Held-out metrics of each model on ``[start, end]`` of the store, on the same rows.

    Scoring times are ``origin + k * every_s`` (``origin`` defaults to ``start``; pass the
    training start to land on the grid training evaluated on). Rows whose label window
    ``(ts, ts + H]`` runs past the last telemetry are left out (their label is not known
    yet), as in training.
    """
    from fleetcare.models import dataset

    say = progress or (lambda _msg: None)
    lo, hi = store.raw.bounds(store.cursor())
    if lo is None or hi is None:
        raise training.TrainError("the store has no telemetry to compare models on")
    if origin is not None and origin < start:
        steps = -(-(start - origin) // dt.timedelta(seconds=every_s))  # ceil
        start = origin + steps * dt.timedelta(seconds=every_s)
    gpus = dataset.fleet_gpus(store)
    say(f"features {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} every {every_s}s; "
        f"scoring {', '.join(models)}")
    H = np.timedelta64(int(round(horizon_h * 3600)), "s")

    def known(t: pa.Table) -> np.ndarray:  # and from start: the rows before give lags
        ts = training.ts_column(t)
        return np.asarray((ts + H <= _np_ts(hi)) & (ts >= _np_ts(start)), dtype=bool)

    scored = dataset.score(
        dataset.chunks(store, dataset.lead_in(start, every_s, floor=lo), end, every_s=every_s,
                       horizon_h=horizon_h,
                       chunk=dataset.chunk_for(gpus, every_s), say=say,
                       names=sorted({n for m in models.values() for n in m.feature_names_in_})),
        {name: thermal_ramp.predictor(model) for name, model in models.items()},
        keep=known)
    every = np.ones(scored.num_rows, dtype=bool)
    return {name: training.evaluate_scored(scored.keys, scored.p[name], every,
                                           horizon_h=horizon_h, every_s=every_s,
                                           node_adjust=_network(model, store, start, end))
            for name, model in models.items()}


def _network(model: FailureModel, store: Store, start: dt.datetime, end: dt.datetime
             ) -> training.NodeAdjust | None:
    """How a model's network head changes its node risks over ``[start, end]`` (None: it
    has none), as scoring combines them."""
    from fleetcare.models import network_head

    head = model.network_head_
    return None if head is None else network_head.adjuster(head, [(store, start, end, "")])


def consider(store: Store, new_model_id: str, *, force: bool = False,
             progress: Progress | None = None) -> PromotionDecision:
    """Promote ``new_model_id`` if it beats the current model (module doc), or if forced.

    Raises ``registry.ModelNotFoundError`` for an unknown id.
    """
    new = registry.get(store, new_model_id)
    cur = registry.current(store)
    prev = cur.model_id if cur else None

    def decide(promoted: bool, reason: str, new_m: dict[str, Any] | None = None,
               cur_m: dict[str, Any] | None = None,
               period: tuple[dt.datetime, dt.datetime] | None = None) -> PromotionDecision:
        if promoted and (cur is None or cur.model_id != new.model_id):
            registry.promote(store, new.model_id, reason=reason)
        log.info("model.promotion model=%s promoted=%s previous=%s reason=%r",
                 new.model_id, promoted, prev, reason)
        return PromotionDecision(promoted, reason, new_m, cur_m, new.model_id, prev, period)

    if cur is None:
        return decide(True, f"{new.model_id} is current: the registry had no current model")
    if cur.model_id == new.model_id:
        return decide(True, f"{new.model_id} is already the current model")
    if force:
        return decide(True, f"{new.model_id} replaces {cur.model_id} because promotion was "
                            "forced (--force); the models were not compared")
    if cur.horizon_h != new.horizon_h:
        return decide(False, f"{new.model_id} (horizon {new.horizon_h:g} h) is not compared "
                             f"with current {cur.model_id} (horizon {cur.horizon_h:g} h): "
                             "they predict different things; promote with --force")
    t0, t1 = new.test_range
    if t0 is None or t1 is None:
        return decide(False, f"{new.model_id} has no held-out test period in the registry, "
                             f"so it cannot be compared with current {cur.model_id}; "
                             "promote with --force")
    period = (t0, t1)
    where = f"{t0:%Y-%m-%d %H:%M}..{t1:%Y-%m-%d %H:%M} UTC"
    try:
        got = evaluate_on_period(
            store, {"new": registry.load(store, new.model_id),
                    "current": registry.load(store, cur.model_id)},
            t0, t1, horizon_h=new.horizon_h, origin=new.train_range[0], progress=progress)
    except (training.TrainError, ValueError) as exc:  # no telemetry, a period it cannot score
        return decide(False, f"{new.model_id} could not be compared with current "
                             f"{cur.model_id} on {where} ({type(exc).__name__}: {exc}); "
                             "promote with --force")
    won, why = beats(got["new"], got["current"])
    seen = cur.cal_range[1]
    caveat = ""
    if seen is not None and seen > t0:
        caveat = (f" (note: current {cur.model_id} was fitted/calibrated on data up to "
                  f"{seen:%Y-%m-%d %H:%M}, inside this period, which favours it)")
    verb = "beats" if won else "does not beat"
    return decide(won, f"{new.model_id} {verb} current {cur.model_id} on its held-out period "
                       f"{where}: {why}{caveat}", got["new"], got["current"], period)
