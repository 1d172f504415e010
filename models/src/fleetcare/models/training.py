"""Train, calibrate and evaluate the failure model on the store's history, split by time.

The grid of scoring times (one row per GPU per hour, from the pipeline's features) is cut
into three consecutive periods: train (first 60 %), calibrate (next 15 %), test (last
25 %). Rows whose label window ``(ts, ts + H]`` crosses a boundary are dropped, so no
label leaks from one period into the one before, and rows whose window runs past the
end of the data are dropped because their label is not known yet. The model is fitted
on train, calibrated on cal, and measured on test at node level
(``fleetcare.models.metrics``); then it is saved in the registry.

What the model sees and how hard it may fit (``MODEL_DEFAULTS``, ``model_features``,
``monotone_features``) is set for the regime a fleet is in: a few dozen failures among
10^5 - 10^6 GPU-hours. Measured on simulated fleets (64 nodes x 30 days, two seeds, the
time split above), each of these is needed:

- Only health signals enter the model: error counters, XIDs, link and remap state,
  fleet-relative values, temperature residuals and slopes, failure history. Identity-
  like columns (lifetime counters, ``node_gpus``, ``hours_since_sample``) and operating
  levels (temperature, power, utilisation, throttle fractions, PCIe gen at idle) describe
  where a GPU sits and what it runs; with ~20 training failures the booster used them to
  memorise which GPUs failed and ranked error-free GPUs above GPUs in an NVLink CRC
  storm.
- No class re-weighting (``scale_pos_weight=1``): weighting the positives ~100x let
  single failures carve their own leaves (one PCIe replay in an hour scored as high as
  a thousand), and the calibrator undoes the weighting anyway.
- Error counters are monotone (more errors never lower the risk), and the trees are
  small with large leaves (``min_child_samples=100``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.models import metrics as M
from fleetcare.models import registry, thermal_ramp
from fleetcare.models.model import FailureModel
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

WARMUP = dt.timedelta(hours=24)
TRAIN_FRACTION = 0.60
CAL_FRACTION = 0.15
LABEL_COLUMNS = ("label", "node_label", "failure_ts", "failure_mode", "failure_cause")

AFTERMATH_H = 24.0
"""Hours after a node's failure whose rows neither train nor calibrate the model (see
``aftermath``)."""

MODEL_DEFAULTS: dict[str, Any] = {
    "n_estimators": 300, "learning_rate": 0.03, "num_leaves": 15, "min_child_samples": 100,
    "feature_fraction": 0.5, "scale_pos_weight": 1.0,
}
"""FailureModel hyperparameters of ``train`` / ``fit_and_evaluate``; ``params`` override."""

_ERROR_STEMS = ("ecc_corrected", "ecc_uncorrected", "remapped_rows", "retired_pages",
                "pcie_replay", "nvlink_crc", "nvlink_replay", "nvlink_recovery",
                "nvlink_flaps", "node_nic_flaps", "node_nic_link_errors", "node_nic_rcv_errors")
_FAULT_FLAGS = ("remapped_rows_pending_now", "remapped_rows_failure_now",
                "retired_pages_pending_now", "nvlink_links_down_now", "pcie_width_down_now",
                "node_gpus_with_errors_24h")
_IDENTITY = ("node_gpus", "hours_since_sample")
_OPERATING_STEMS = ("gpu_temp_mean", "gpu_temp_max", "gpu_temp_std", "mem_temp_mean",
                    "mem_temp_max", "power_mean", "util_mean", "throttle_thermal_frac",
                    "throttle_power_frac", "throttle_hw_slowdown_frac", "pcie_gen_down_frac")
_OPERATING_NOW = ("gpu_temp_now", "pcie_gen_down_now", "nvlink_links_now")
_SAMPLED_STEMS = ("nvlink_flaps",)
"""Counted from link states between consecutive samples: a 60 s flap is seen in every
10 s sample stream and missed by most 10 min ones, so a model trained on one sample
interval would misread another (train/serve skew). The links' recovery counters see
every flap, whatever the interval."""

Progress = Callable[[str], None]


class TrainError(Exception):
    """The store cannot give a training set (no telemetry, a range with nothing in it)."""


MIN_TRAIN_FAILURES = 30
"""Node failures a fleet's own training period needs before ``train`` fits a model on it
(below that, the fleet prior scores better: see ``models/README.md``)."""


class NotEnoughFailures(TrainError):
    """Too few failures in the fleet's history for a model of its own."""

    def __init__(self, train: int, cal: int, total: int, needed: int) -> None:
        super().__init__(
            f"{total} failures in this fleet's history ({train} in the training period, "
            f"{cal} in calibration): a model of its own needs about {needed} in training; "
            "the current model (the fleet prior until then) keeps scoring. Train again "
            "after more failures, or import past incidents (`fleetcare incident import`).")
        self.train, self.cal, self.total, self.needed = train, cal, total, needed


@dataclass(frozen=True, slots=True)
class Splits:
    """Period boundaries (aware UTC): train [start, cal_start), cal [cal_start, test_start),
    test [test_start, end]."""
    start: dt.datetime
    cal_start: dt.datetime
    test_start: dt.datetime
    end: dt.datetime

    @classmethod
    def of(cls, start: dt.datetime, end: dt.datetime) -> Splits:
        span = end - start
        return cls(start, start + span * TRAIN_FRACTION,
                   start + span * (TRAIN_FRACTION + CAL_FRACTION), end)


@dataclass(frozen=True, slots=True)
class TrainResult:
    model_id: str | None
    metrics: dict[str, Any]
    model: FailureModel
    record: registry.ModelRecord | None = None


def _np_ts(value: dt.datetime) -> np.datetime64:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return np.datetime64(value, "us")


def ts_column(table: pa.Table, name: str = "ts") -> np.ndarray:
    """A timestamp column as numpy datetime64[us] holding UTC (nulls → NaT)."""
    col = table.column(name)
    tz = getattr(col.type, "tz", None)
    col = pc.cast(col, pa.timestamp("us", tz=tz))
    nat = np.iinfo(np.int64).min  # numpy's NaT
    ints = pc.fill_null(pc.cast(col, pa.int64()), nat).to_numpy(zero_copy_only=False)
    return np.asarray(ints, dtype=np.int64).astype("datetime64[us]")


def _bool(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), False).to_numpy(zero_copy_only=False).astype(bool)


def _str(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist(), dtype=object)


def is_key(name: str) -> bool:
    """A column that identifies a feature row (``features.KEY_COLUMNS``)."""
    from fleetcare.pipeline.features import KEY_COLUMNS

    return name in KEY_COLUMNS


def feature_columns(table: pa.Table) -> list[str]:
    from fleetcare.pipeline.features import KEY_COLUMNS

    skip = set(KEY_COLUMNS) | set(LABEL_COLUMNS)
    return [c for c in table.column_names if c not in skip]


def _stem(name: str) -> str:
    """``ecc_corrected_24h_rel`` -> ``ecc_corrected``; names without a window unchanged."""
    from fleetcare.pipeline.feature_defs import WINDOWS

    base = name.removeprefix("node_max_").removesuffix("_rel")
    head, _, window = base.rpartition("_")
    return head if head and window in WINDOWS else base


def model_features(names: Sequence[str]) -> list[str]:
    """The feature columns the model is trained on: health signals, not identity or load.

    Dropped: lifetime counters, ``node_gpus``, ``hours_since_sample`` (identity-like, and
    0 on the training grid while live scoring can see stale GPUs), operating levels
    (temperatures, power, utilisation, throttle fractions, PCIe gen, link count) and
    counts that depend on the sample interval (``_SAMPLED_STEMS``). The
    thermal signal stays in ``gpu_temp_resid_*`` (vs. the fleet at the same power) and
    ``gpu_temp_slope_*``.
    """
    out = []
    for n in names:
        if n.endswith("_lifetime") or n in _IDENTITY or n in _OPERATING_NOW:
            continue
        if _stem(n) in _SAMPLED_STEMS:
            continue
        if not n.startswith("node_max_") and not n.endswith("_rel") and _stem(n) in _OPERATING_STEMS:
            continue
        out.append(n)
    return out


def monotone_features(names: Sequence[str]) -> list[str]:
    """Features whose rise may never lower the risk: error counts (also fleet-relative and
    node max), XIDs other than application ones, fault flags, downtrained-link fractions."""
    from fleetcare.pipeline.feature_defs import XID_CLASSES

    xids = {f"xid_{c}" for c in XID_CLASSES if c != "application"}
    xids |= {f"node_{x}" for x in xids}
    out = []
    for n in names:
        stem = _stem(n)
        if (stem in _ERROR_STEMS or stem in xids or n in _FAULT_FLAGS
                or stem == "pcie_width_down_frac" or stem.endswith("_active_hours")):
            out.append(n)
    return out


def _failures(table: pa.Table, mask: np.ndarray, *, before: np.datetime64 | None = None
              ) -> list[M.Failure]:
    """The node failures the rows in ``mask`` look ahead to (distinct node, time), with
    their mode (only failures before ``before`` when given)."""
    node_label = _bool(table, "node_label") & mask
    if not node_label.any():
        return []
    idx = np.flatnonzero(node_label)
    nodes = _str(table, "node")[idx]
    fts = ts_column(table, "failure_ts")[idx]
    modes = (_str(table, "failure_mode")[idx] if "failure_mode" in table.column_names
             else np.full(len(idx), None, dtype=object))
    seen: dict[tuple[str, np.datetime64], str] = {}
    for n, f, m in zip(nodes, fts, modes, strict=True):
        if np.isnat(f) or (before is not None and f >= before):
            continue
        seen.setdefault((str(n), f), str(m) if m else "unknown")
    return [M.Failure(n, f, m) for (n, f), m in sorted(seen.items())]


def failures_in(table: pa.Table) -> list[M.Failure]:
    """The node failures any row of ``table`` looks ahead to (``_failures``)."""
    if table.num_rows == 0 or "node_label" not in table.column_names:
        return []
    return _failures(table, np.ones(table.num_rows, dtype=bool))


def aftermath(table: pa.Table, hours: float = AFTERMATH_H) -> np.ndarray:
    """Rows of a node in ``(f, f + hours]`` after one of its failures ``f``.

    These rows carry the failure's own signature (its terminal XID, the uncorrectable
    errors, the lost link) in their windows while the node is down or freshly repaired,
    and their label says "no failure ahead": trained on, they teach the model that a
    failing GPU's signals mean "safe", against the precursor rows that say the opposite.
    They are kept out of training and calibration, never out of evaluation. Failures are
    the ones the table's own labels look ahead to (``_failures``).
    """
    out = np.zeros(table.num_rows, dtype=bool)
    if hours <= 0 or table.num_rows == 0:
        return out
    fails = _failures(table, np.ones(table.num_rows, dtype=bool))
    if not fails:
        return out
    ts, node = ts_column(table), _str(table, "node")
    names, inv = np.unique(node.astype(str), return_inverse=True)
    rows_of = np.split(np.argsort(inv, kind="stable"), np.cumsum(np.bincount(inv))[:-1])
    span = np.timedelta64(int(round(hours * 3600)), "s")
    for f in fails:
        k = np.searchsorted(names, f.node)
        if k == len(names) or names[k] != f.node:
            continue
        rows = rows_of[k]
        out[rows[(ts[rows] > f.ts) & (ts[rows] <= f.ts + span)]] = True
    return out


def evaluate(model: FailureModel, table: pa.Table, mask: np.ndarray, *, horizon_h: float,
             every_s: int, feature_names: Sequence[str], labeled: np.ndarray | None = None,
             window_h: float = M.WINDOW_H) -> dict[str, Any]:
    """Held-out metrics of ``model`` on the rows of ``table`` selected by ``mask``
    (``evaluate_scored``); ``labeled`` defaults to all of ``mask``."""
    labeled = mask if labeled is None else labeled & mask
    test = table.filter(pa.array(mask))
    p = model.predict_proba(test)[:, 1] if test.num_rows else np.zeros(0)
    if test.num_rows:  # the thermal-ramp rule, its lags from before the mask too
        p = thermal_ramp.raised(p, thermal_ramp.grid(table).hit[mask])
    return evaluate_scored(test, p, labeled[mask], horizon_h=horizon_h, every_s=every_s,
                           window_h=window_h)


NodeAdjust = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(ts, node, node risk) -> node risk: e.g. combined with a network head's."""


def evaluate_scored(keys: pa.Table, p: np.ndarray, labeled: np.ndarray, *, horizon_h: float,
                    every_s: int, window_h: float = M.WINDOW_H,
                    node_adjust: NodeAdjust | None = None) -> dict[str, Any]:
    """Held-out metrics of the GPU probabilities ``p`` of the rows ``keys`` (ts, node,
    labels: ``dataset.Scored``).

    Alarms use every row and are judged over ``window_h``; row-level metrics (PR-AUC,
    calibration) use only the rows in ``labeled``, those whose label horizon ends inside
    the data. ``node_adjust`` changes the node risks before they are judged (the network
    head's share, ``network_head.adjuster``).
    """
    known = np.asarray(labeled, dtype=bool)
    y = _bool(keys, "label") if keys.num_rows else np.zeros(0, dtype=bool)
    ts = ts_column(keys) if keys.num_rows else np.zeros(0, "datetime64[us]")
    node = _str(keys, "node") if keys.num_rows else np.zeros(0, dtype=object)
    g = M.node_groups(ts, node)
    # node_label per (ts, node): any GPU row of the node says so (they agree by definition)
    node_label = g.any(_bool(keys, "node_label") if keys.num_rows else y)
    node_known = g.any(known)  # depends on ts only: any GPU row = all
    node_days = len(g.ts) * every_s / 86400.0
    failures = failures_in(keys)
    risk = g.risk(p)
    if node_adjust is not None:
        risk = node_adjust(g.ts, g.node, risk)
    out = M.node_metrics(g.ts, g.node, risk, node_label, failures, window_h, node_days,
                         labeled=node_known, grace=np.timedelta64(every_s, "s"))
    y, p = y[known], np.asarray(p)[known]
    out.update({
        "horizon_h": horizon_h,
        "gpu_pr_auc": M.average_precision(y, p),
        "gpu_roc_auc": M.roc_auc(y, p),
        "ece": M.expected_calibration_error(y, p),
        "mean_predicted": M.json_float(p.mean()) if len(p) else None,
        "observed_rate": M.json_float(y.mean()) if len(y) else None,
        "test_rows": int(known.sum()),
        "test_positives": int(y.sum()),
    })
    return out


def fit_model(fit: Any, *, horizon_h: float, seed: int,
              params: dict[str, Any] | None = None) -> FailureModel:
    """The booster (``MODEL_DEFAULTS``, monotone error counters) fitted on ``fit.train`` and
    calibrated on ``fit.cal`` (``dataset.FitRows``); their ``weight`` is used when healthy
    rows were sampled."""
    from fleetcare.models import dataset

    train, cal = fit.train, fit.cal
    names = model_features(feature_columns(train.drop_columns([dataset.WEIGHT])))
    hyper: dict[str, Any] = {**MODEL_DEFAULTS, "monotone_increasing": monotone_features(names)}
    model = FailureModel(horizon_h=horizon_h, seed=seed, **{**hyper, **(params or {})})
    weighted = fit.negatives < 1
    return model.fit(train, _bool(train, "label"), X_cal=cal, y_cal=_bool(cal, "label"),
                     feature_names=names,
                     sample_weight=train.column(dataset.WEIGHT).to_numpy() if weighted else None,
                     cal_weight=cal.column(dataset.WEIGHT).to_numpy() if weighted else None)


def _fit_and_score(fit_tables: Iterable[pa.Table], test_tables: Iterable[pa.Table],
                   splits: Splits, *, failures: Sequence[M.Failure], total_failures: int,
                   negatives: float, horizon_h: float, seed: int, every_s: int,
                   label_end: dt.datetime, params: dict[str, Any] | None, say: Progress,
                   window_h: float, min_failures: int,
                   node_adjust: NodeAdjust | None = None) -> tuple[FailureModel, dict[str, Any]]:
    """The core of ``train`` and ``fit_and_evaluate``: fit rows from ``fit_tables``
    (``dataset.fit_rows``), the model, then the test period's rows from ``test_tables``
    scored one table at a time (``dataset.score``) and measured (``evaluate_scored``)."""
    from fleetcare.models import dataset

    H = np.timedelta64(int(round(horizon_h * 3600)), "s")
    b0, b1, b2 = _np_ts(splits.start), _np_ts(splits.cal_start), _np_ts(splits.test_start)
    end, last = _np_ts(splits.end), _np_ts(label_end)
    fit = dataset.fit_rows(fit_tables, cal_start=b1, test_start=b2, horizon=H,
                           failures=failures, negatives=negatives, seed=seed, start=b0)
    n_train, n_cal = len(failures_in(fit.train)), len(failures_in(fit.cal))
    if n_train < min_failures:
        raise NotEnoughFailures(n_train, n_cal, total_failures, min_failures)
    y_train = _bool(fit.train, "label")
    share = "" if negatives >= 1 else f", healthy rows sampled at {negatives:.3f}"
    say(f"fitting on {fit.train.num_rows} rows ({int(y_train.sum())} positive{share})")
    model = fit_model(fit, horizon_h=horizon_h, seed=seed, params=params)
    counts = {"train_rows": fit.train.num_rows, "train_positives": int(y_train.sum()),
              "cal_rows": fit.cal.num_rows, "cal_positives": int(_bool(fit.cal, "label").sum())}
    del fit, y_train  # ~1.5 GB at the row cap: not held while the test period is read
    say(f"calibrated ({model.calibrator_['kind']}) on {counts['cal_rows']} rows "
        f"({model.n_cal_positives_} positive); evaluating on the test period")

    def in_test(t: pa.Table) -> np.ndarray:
        ts = ts_column(t)
        return (ts >= b2) & (ts <= end)

    scored = dataset.score(test_tables, {"model": thermal_ramp.predictor(model)},
                           keep=in_test)
    ts = ts_column(scored.keys) if scored.num_rows else np.zeros(0, "datetime64[us]")
    metrics = evaluate_scored(scored.keys, scored.p["model"], np.asarray(ts + H <= last),
                              horizon_h=horizon_h, every_s=every_s, window_h=window_h,
                              node_adjust=node_adjust)
    metrics.update({
        "calibration": model.calibrator_["kind"], **counts,
        "healthy_rows_sampled": M.json_float(negatives),
    })
    return model, metrics


def fit_and_evaluate(table: pa.Table, splits: Splits, *, horizon_h: float = 24.0,
                     seed: int = 0, every_s: int = 3600, label_end: dt.datetime | None = None,
                     params: dict[str, Any] | None = None, progress: Progress | None = None,
                     window_h: float = M.WINDOW_H, min_failures: int = 1,
                     negatives: float = 1.0) -> tuple[FailureModel, dict[str, Any]]:
    """Fit on train, calibrate on cal, measure on test: ``train`` on a table in memory.

    ``NotEnoughFailures`` when the training period holds fewer than ``min_failures``.

    ``table`` holds features (``KEY_COLUMNS`` + float features) and labels
    (``labels.attach_labels``) on a time grid; the failures are those its labels look
    ahead to.
    """
    failures = failures_in(table)
    return _fit_and_score([table], [table], splits, failures=failures,
                          total_failures=len(failures), negatives=negatives,
                          horizon_h=horizon_h, seed=seed, every_s=every_s,
                          label_end=label_end or splits.end, params=params,
                          say=progress or (lambda _msg: None), window_h=window_h,
                          min_failures=min_failures)


def head_summary(head: FailureModel | None) -> dict[str, Any] | None:
    """What a model's metrics say of its network head (None: it has none)."""
    if head is None:
        return None
    return {"train_positives": head.n_train_positives_, "cal_positives": head.n_cal_positives_,
            "calibration": head.calibrator_["kind"], "features": head.n_features_in_,
            "horizon_h": head.horizon_h}


def _network_head(store: Store, splits: Splits, test_from: dt.datetime, end: dt.datetime, *,
                  window_h: float, seed: int, say: Progress
                  ) -> tuple[FailureModel | None, NodeAdjust | None]:
    """The fleet's network head (``network_head.fit``, labelled over the warning window;
    None without enough network failures) and how it adjusts the test period's node
    risks."""
    from fleetcare.models import network_head

    head = network_head.fit([network_head.Period(store, splits.start, splits.test_start)],
                            horizon_h=window_h, seed=seed)
    if head is None:
        return None, None
    say(f"network head fitted on {head.n_train_positives_} node-hours before a network "
        "failure")
    return head, network_head.adjuster(head, [(store, test_from, end, "")])


def _telemetry_range(store: Store) -> tuple[dt.datetime, dt.datetime]:
    lo, hi = store.raw.bounds(store.cursor())
    if lo is None or hi is None:
        raise TrainError("the database has no telemetry to train on: ingest some first "
                         "(`fleetcare ingest`, `fleetcare serve --bus`, `fleetcare backfill`) "
                         "or simulate a fleet (`fleetcare simulate --db PATH`)")
    return lo.replace(tzinfo=dt.UTC), hi.replace(tzinfo=dt.UTC)


def train(store: Store, *, horizon_h: float = 24.0, seed: int = 0,
          start: dt.datetime | None = None, end: dt.datetime | None = None,
          progress: Progress | None = None, every_s: int = 3600,
          params: dict[str, Any] | None = None, register: bool = True,
          created_at: dt.datetime | None = None,
          min_failures: int = MIN_TRAIN_FAILURES) -> TrainResult:
    """Build features and labels from the store, train, evaluate and register a model.

    ``start`` defaults to 24 h after the first telemetry (warm-up for the 24 h windows),
    ``end`` to the last telemetry. Raises ``TrainError`` when the store is empty,
    ``NotEnoughFailures`` (a ``TrainError``) when the training period holds fewer than
    ``min_failures`` node failures.
    """
    from fleetcare.models import dataset
    from fleetcare.pipeline import features

    say = progress or (lambda _msg: None)
    lo, hi = _telemetry_range(store)
    features.refresh(store)  # the chunks read the rollups
    start = start or lo + WARMUP
    end = end or hi
    if end <= start:
        raise TrainError(f"nothing to train on between {start} and {end}: the database "
                         f"holds telemetry from {lo} to {hi}, and the first {WARMUP} are "
                         "warm-up (features need that much history): train once it holds "
                         "more")
    splits = Splits.of(start, end)
    g = dataset.grid(store, start, splits.test_start, every_s)
    failures = dataset.fleet_failures(store)
    say(f"features {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} every {every_s}s, "
        f"{g.gpus} GPUs, labels at horizon {horizon_h} h, {g.chunk} at a time")
    fit_tables = dataset.chunks(store, start, g.fit_end, every_s=every_s,
                                horizon_h=horizon_h, chunk=g.chunk, say=say)
    test_tables = (dataset.chunks(store, dataset.lead_in(g.test_from, every_s, floor=start),
                                  end, every_s=every_s, horizon_h=horizon_h, chunk=g.chunk,
                                  say=say)
                   if g.test_from <= end else iter(()))
    head, adjust = _network_head(store, splits, g.test_from, end, window_h=M.WINDOW_H,
                                 seed=seed, say=say)
    model, metrics = _fit_and_score(fit_tables, test_tables, splits, failures=failures,
                                    total_failures=len(failures), negatives=g.negatives(),
                                    horizon_h=horizon_h, seed=seed, every_s=every_s,
                                    label_end=hi, params=params, say=say,
                                    window_h=M.WINDOW_H, min_failures=min_failures,
                                    node_adjust=adjust)
    model.network_head_ = head
    metrics["network_head"] = head_summary(head)
    log.info("model.trained rows=%d pr_auc=%s recall_at_budget=%s", metrics["train_rows"],
             metrics.get("pr_auc"), metrics.get("recall_at_budget"))
    if not register:
        return TrainResult(None, metrics, model)
    rec = registry.save(store, model, metrics=metrics,
                        train_range=(splits.start, splits.cal_start),
                        cal_range=(splits.cal_start, splits.test_start),
                        test_range=(splits.test_start, splits.end), created_at=created_at)
    say(f"saved {rec.model_id}{' (current)' if rec.is_current else ''}")
    return TrainResult(rec.model_id, metrics, model, rec)
