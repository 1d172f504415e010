"""Evaluate fleetcare against the baselines on one store's future, or on another fleet.

``evaluate_store(store)``: features and labels for the whole store, the time split of
``training.Splits`` (train 60 % / calibrate 15 % / test 25 %). A fresh model is trained on
the store's own train period (``training.fit_and_evaluate``, nothing is registered): the
report measures the method on data it has not seen, whatever model is current. The
logistic baseline is fitted on the same train rows; the rules need no fitting. Every
method is measured on the same test rows, failures and node-days, with the same episode
logic (``metrics``); then the goodput simulation (``goodput_sim``) runs over the test
period with the model's drain threshold chosen on the calibration period.

``evaluate_cross(train_store, test_store)``: model and logistic trained on all of fleet
A's time (the last 20 % calibrates the model and picks the goodput threshold), measured on
fleet B's test period.

Alarms use every test row up to the end of the data and are judged over the warning
window ``EvalConfig.window_h`` (``metrics``); PR-AUC and calibration use the test rows
whose label is known. A fleet too big for one store (DuckDB has one writer; a feature
table of 10^6 GPU-hours is a few GB) can be given as a list of stores, its *shards* over
the same time: one model is trained on all of them, and every figure is over all of them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.models import baselines as B
from fleetcare.models import goodput_sim as G
from fleetcare.models import metrics as M
from fleetcare.models import training as T
from fleetcare.models.goodput import CostModel

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
METHOD_KEYS = ("pr_auc", "recall_at_budget", "false_drains_per_1000_node_days",
               "median_lead_time_h", "recall_by_mode")


class _SimKnobs(TypedDict):
    """The goodput simulation's keyword arguments the evaluation passes through."""

    horizon_h: float
    min_lead_h: float
    checkpoint_write_h: float


@dataclass(frozen=True)
class EvalConfig:
    horizon_h: float = 24.0
    window_h: float = M.WINDOW_H
    seed: int = 0
    every_s: int = 3600
    cost: CostModel = field(default_factory=CostModel)
    job_sizes: tuple[int, ...] = G.DEFAULT_JOB_SIZES
    min_lead_h: float = G.MIN_LEAD_H
    checkpoint_write_h: float = G.CHECKPOINT_WRITE_H


@dataclass
class Fleet:
    """One store's features + labels, its split and the masks of each period."""
    store: Any
    table: pa.Table
    splits: T.Splits
    last: dt.datetime
    ts: np.ndarray
    shard: str  # the prefix of its node names ("" for a fleet in one store)
    train_m: np.ndarray
    cal_m: np.ndarray
    test_m: np.ndarray  # test rows whose label is known (PR-AUC, calibration)
    alarm_m: np.ndarray  # every test row (alarms need no label)
    cal_alarm_m: np.ndarray  # every calibration row


def _np(t: dt.datetime) -> np.datetime64:
    return T._np_ts(t)


def _compact(table: pa.Table) -> pa.Table:
    """Keys, labels and the model's features as float32: a third of the memory.

    A fleet of 10^6 GPU-hours is otherwise several GB per copy. float32 holds every
    counter delta below 2^24 exactly; the model reads the values back as float64.
    """
    keep = set(T.model_features(T.feature_columns(table)))
    cols, names = [], []
    for name, col in zip(table.column_names, table.columns, strict=True):
        if name in keep:
            col = col.cast(pa.float32())
        elif name not in T.LABEL_COLUMNS and not T.is_key(name):
            continue
        cols.append(col)
        names.append(name)
    return pa.table(cols, names=names)


def load_fleet(store: Any, cfg: EvalConfig, *, whole: bool = False,
               say: Progress = lambda _m: None, shard: str = "") -> Fleet:
    """Features + labels of one store and its split. ``shard`` (e.g. ``"2/"``) is put in
    front of every node name, so that shards of one fleet never share a node."""
    from fleetcare.pipeline import features, labels

    features.refresh(store)
    lo, hi = T._telemetry_range(store)
    start = lo + T.WARMUP
    if hi <= start:
        raise T.TrainError(f"the store's telemetry ({lo} .. {hi}) is shorter than the "
                           f"{T.WARMUP} warm-up: simulate more days")
    say(f"features {start:%Y-%m-%d %H:%M} .. {hi:%Y-%m-%d %H:%M}")
    table = _compact(labels.attach_labels(store, features.gpu_features(
        store, start, hi, every_s=cfg.every_s), horizon_h=cfg.horizon_h))
    if shard:
        i = table.column_names.index("node")
        table = table.set_column(i, "node", pc.binary_join_element_wise(
            pa.scalar(shard), table.column("node").cast(pa.string()), ""))
    if whole:  # train on all of it, the last 20 % calibrates
        span = hi - start
        splits = T.Splits(start, start + span * 0.8, hi, hi)
    else:
        splits = T.Splits.of(start, hi)
    ts = T.ts_column(table)
    H = np.timedelta64(int(round(cfg.horizon_h * 3600)), "s")
    b0, b1, b2, end = (_np(splits.start), _np(splits.cal_start), _np(splits.test_start),
                       _np(splits.end))
    fit_m = ~T.aftermath(table)  # see training.aftermath; test rows keep every row
    return Fleet(store, table, splits, hi, ts, shard,
                 (ts >= b0) & (ts + H <= b1) & fit_m, (ts >= b1) & (ts + H <= b2) & fit_m,
                 (ts >= b2) & (ts + H <= _np(hi)) & (ts <= end),
                 (ts >= b2) & (ts <= end), (ts >= b1) & (ts < b2))


def failures_of(table: pa.Table, mask: np.ndarray, *, before: np.datetime64 | None = None
                ) -> list[M.Failure]:
    """Distinct (node, failure time) the rows in ``mask`` look ahead to, with their mode
    (only failures before ``before`` when given)."""
    return T._failures(table, mask, before=before)


@dataclass
class NodeScores:
    ts: np.ndarray
    node: np.ndarray
    risk: np.ndarray
    label: np.ndarray
    known: np.ndarray


def node_scores(table: pa.Table, mask: np.ndarray, p: np.ndarray,
                labeled: np.ndarray | None = None) -> NodeScores:
    """Node risk per (ts, node) of the rows in ``mask``; ``known`` marks the node rows whose
    label is known (all of ``labeled & mask``'s GPU rows; default: all)."""
    sub = table.filter(pa.array(mask))
    kmask = (np.ones(int(mask.sum()), dtype=bool) if labeled is None
             else np.asarray(labeled, dtype=bool)[mask])
    ts, node = T.ts_column(sub), T._str(sub, "node")
    g = M.node_groups(ts, node)
    return NodeScores(g.ts, g.node, g.risk(p), g.any(T._bool(sub, "node_label")), g.any(kmask))


def _rows(fleets: Sequence[Fleet], mask: str) -> pa.Table:
    """The rows of every shard selected by its mask ``mask`` ("train_m", ...), together."""
    return pa.concat_tables([f.table.filter(pa.array(getattr(f, mask))) for f in fleets])


def _fit_model(fleets: Sequence[Fleet], cfg: EvalConfig) -> Any:
    from fleetcare.models.model import FailureModel

    train, cal = _rows(fleets, "train_m"), _rows(fleets, "cal_m")
    names = T.model_features(T.feature_columns(train))
    hyper = {**T.MODEL_DEFAULTS, "monotone_increasing": T.monotone_features(names)}
    model = FailureModel(horizon_h=cfg.horizon_h, seed=cfg.seed, **hyper)
    return model.fit(train, T._bool(train, "label"), X_cal=cal, y_cal=T._bool(cal, "label"),
                     feature_names=names)


def _period(fleets: Sequence[Fleet], mask: str, every_s: int
            ) -> tuple[np.datetime64, np.datetime64]:
    ts = np.concatenate([f.ts[getattr(f, mask)] for f in fleets])
    step = np.timedelta64(every_s, "s")
    return ts.min(), ts.max() + step


def _scores(fleets: Sequence[Fleet], mask: str, predict: Callable[[pa.Table], np.ndarray],
            labeled: str | None = None) -> tuple[NodeScores, np.ndarray]:
    """Node scores of every shard's ``mask`` rows, together, and the GPU-level p."""
    parts, ps = [], []
    for f in fleets:
        m = getattr(f, mask)
        sub = f.table.filter(pa.array(m))
        p = predict(sub) if sub.num_rows else np.zeros(0)
        ps.append(p)
        parts.append(node_scores(f.table, m, p, getattr(f, labeled) if labeled else None))
    return NodeScores(*(np.concatenate([getattr(x, k) for x in parts])
                        for k in ("ts", "node", "risk", "label", "known"))), np.concatenate(ps)


def _failures(fleets: Sequence[Fleet], mask: str, *, before: np.datetime64 | None = None
              ) -> list[M.Failure]:
    return [x for f in fleets for x in failures_of(f.table, getattr(f, mask), before=before)]


def _rule(fleets: Sequence[Fleet], fn: Callable[..., B.RuleAlarms], t0: dt.datetime,
          t1: dt.datetime) -> B.RuleAlarms:
    """A rule's alarms over every shard, its node names prefixed like the shard's."""
    out = [fn(f.store, t0, t1) for f in fleets]
    return B.RuleAlarms(out[0].name, np.concatenate([r.ts for r in out]),
                        np.concatenate([np.array([f.shard + str(n) for n in r.node], dtype=object)
                                        for f, r in zip(fleets, out, strict=True)]),
                        np.concatenate([r.reason for r in out]))


def _method_metrics(s: NodeScores, failures: list[M.Failure], cfg: EvalConfig,
                    node_days: float) -> tuple[dict[str, Any], list[float]]:
    """A method's metrics and its lead times, at the operating point chosen once."""
    grace = np.timedelta64(cfg.every_s, "s")  # the first row after a failure sees it
    res = M.choose_threshold(s.ts, s.node, s.risk, failures,
                             np.timedelta64(int(round(cfg.window_h * 3600)), "s"), node_days,
                             grace=grace)
    out = M.metrics_at(res, s.ts, s.node, s.risk, s.label, failures, cfg.window_h, node_days,
                       labeled=s.known, grace=grace)
    leads = list(res.lead_times_h) if res is not None else []
    out["p10_lead_time_h"] = M.json_float(np.percentile(leads, 10)) if leads else None
    out["failures_by_mode"] = failures_by_mode(failures)
    return out, leads


def failures_by_mode(failures: Sequence[M.Failure]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in failures:
        out[f.mode] = out.get(f.mode, 0) + 1
    return dict(sorted(out.items()))


def precursor_recall(metrics: dict[str, Any], counts: dict[str, int]) -> float | None:
    """Recall at budget over the failures whose mode has precursors (mode != 'none')."""
    n = sum(c for m, c in counts.items() if m != "none")
    if not n:
        return None
    return sum((metrics["recall_by_mode"].get(m) or 0.0) * c
               for m, c in counts.items() if m != "none") / n


def _evaluate(train: Sequence[Fleet], test: Sequence[Fleet], cfg: EvalConfig, say: Progress,
              model: Any | None = None) -> dict[str, Any]:
    if model is None:
        say("training the model")
        model = _fit_model(train, cfg)
    train_rows = _rows(train, "train_m")
    names = T.model_features(T.feature_columns(train_rows))
    say("fitting the logistic baseline")
    logit = B.LogisticBaseline(seed=cfg.seed).fit(train_rows, T._bool(train_rows, "label"),
                                                   feature_names=names)
    del train_rows
    failures = _failures(test, "alarm_m")
    s_model, p = _scores(test, "alarm_m", lambda t: model.predict_proba(t)[:, 1], "test_m")
    node_days = len(s_model.ts) * cfg.every_s / 86400.0
    known = np.concatenate([f.test_m[f.alarm_m] for f in test])
    y_te = np.concatenate([T._bool(f.table, "label")[f.test_m] for f in test])
    say(f"scoring {len(p)} test rows, {len(failures)} failures")
    out_model, leads = _method_metrics(s_model, failures, cfg, node_days)
    out_model["ece"] = M.expected_calibration_error(y_te, p[known])
    out_model["gpu_pr_auc"] = M.average_precision(y_te, p[known])
    s_log, _ = _scores(test, "alarm_m", lambda t: logit.predict_proba(t)[:, 1], "test_m")
    out_log, _ = _method_metrics(s_log, failures, cfg, node_days)
    out_prior = _prior_metrics(test, failures, cfg, node_days, say)

    start, end = _period(test, "alarm_m", cfg.every_s)
    t0 = start.astype(dt.datetime).replace(tzinfo=dt.UTC)
    t1 = end.astype(dt.datetime).replace(tzinfo=dt.UTC)
    reactive = _rule(test, B.reactive_xid_from_store, t0, t1)
    dcgm = _rule(test, B.dcgm_alarms, t0, t1)
    out_rules = {r.name: B.evaluate_rule(r, failures, cfg.window_h, node_days)
                 for r in (reactive, dcgm)}

    # goodput: threshold on the expected-saving ratio, chosen on the train fleet's cal period
    cost = cfg.cost
    sim: _SimKnobs = {"horizon_h": cfg.window_h, "min_lead_h": cfg.min_lead_h,
                      "checkpoint_write_h": cfg.checkpoint_write_h}

    def jobs_of(fleets: Sequence[Fleet]) -> list[G.Job]:
        nodes = sorted({str(n) for f in fleets for n in T._str(f.table, "node")})
        return G.pack_jobs(nodes, cfg.job_sizes, gpus_per_node=cost.gpus_per_node,
                           checkpoint_interval_h=cost.checkpoint_interval_h, seed=cfg.seed)

    cal_jobs = jobs_of(train)
    s_cal, _ = _scores(train, "cal_alarm_m", lambda t: model.predict_proba(t)[:, 1])
    c0, c1 = _period(train, "cal_alarm_m", cfg.every_s)
    # a scored row reacts to a failure up to one interval after it (rules: at the XID)
    row_grace_h = max(G.REACTION_GRACE_H, cfg.every_s / 3600.0)
    thr, cal_res, _ = G.choose_goodput_threshold(
        s_cal.ts, s_cal.node, G.decision_score(s_cal.node, s_cal.risk, cal_jobs, cost),
        _failures(train, "cal_alarm_m", before=c1), cal_jobs, cost, c0, c1,
        grace_h=row_grace_h, **sim)
    jobs = jobs_of(test)
    W = np.timedelta64(int(round(cfg.window_h * 3600)), "s")
    score = G.decision_score(s_model.node, s_model.risk, jobs, cost)
    fc_eps = M.alarm_episodes(s_model.ts, s_model.node, score, thr, W) if np.isfinite(thr) else []
    runs = {
        "no_action": G.simulate_goodput(failures, [], jobs, cost, start, end, **sim),
        "reactive_xid": G.simulate_goodput(failures, reactive.episodes(cfg.window_h), jobs,
                                           cost, start, end, **sim),
        "dcgm_thresholds": G.simulate_goodput(failures, dcgm.episodes(cfg.window_h), jobs,
                                              cost, start, end, **sim),
        "fleetcare": G.simulate_goodput(failures, fc_eps, jobs, cost, start, end,
                                        grace_h=row_grace_h, **sim),
    }
    base = runs["no_action"].gpu_hours_lost
    goodput: dict[str, Any] = {}
    for k, r in runs.items():
        d = r.as_dict()
        d["gpu_hours_recovered"] = round(base - r.gpu_hours_lost, 3)
        goodput[k] = d
    goodput["fleetcare"].update({
        "threshold": M.json_float(thr) if np.isfinite(thr) else None,
        "threshold_kind": "expected saving / drain cost (cost model break-even = 1.0)",
        "calibration_gpu_hours_lost": round(cal_res.gpu_hours_lost, 3),
    })
    goodput["cost_model"] = {
        "job_sizes_gpus": list(cfg.job_sizes), "checkpoint_interval_h": cost.checkpoint_interval_h,
        "restart_overhead_h": cost.restart_overhead_h, "drain_cost_gpu_h": cost.drain_cost_gpu_h,
        "gpus_per_node": cost.gpus_per_node, "min_lead_h": cfg.min_lead_h,
        "checkpoint_write_h": cfg.checkpoint_write_h, "jobs": G.job_summary(jobs),
    }
    return {
        "simulated": True,
        "fleet": describe(test, failures, node_days),
        "model": out_model,
        "prior": out_prior,
        "baselines": {"reactive_xid": out_rules["reactive_xid"],
                      "dcgm_thresholds": out_rules["dcgm_thresholds"], "logistic": out_log},
        "goodput": goodput,
        "test_period": {"start": str(start), "end": str(end), "node_days": round(node_days, 3),
                        "failures": len(failures), "horizon_h": cfg.horizon_h,
                        "window_h": cfg.window_h, "shards": len(test)},
        "_curves": {  # for the HTML report; dropped from JSON
            "model": (s_model.label[s_model.known], s_model.risk[s_model.known]),
            "logistic": (s_log.label[s_log.known], s_log.risk[s_log.known]),
            "lead_times_h": leads,
            "node_scores": s_model, "failures": failures, "node_days": node_days,
            "alarm_rows_end": s_model.ts.max() if len(s_model.ts) else None,
            "labeled_rows_end": (s_model.ts[s_model.known].max() if s_model.known.any()
                                 else None),
        },
    }


def _prior_metrics(test: Sequence[Fleet], failures: list[M.Failure], cfg: EvalConfig,
                   node_days: float, say: Progress) -> dict[str, Any] | None:
    """The shipped fleet prior on the same test rows, at its own operating threshold
    (fixed on its validation fleets, nothing tuned here) and at the best threshold within
    the budget on these rows; None when the package ships no prior."""
    from fleetcare.models import prior
    from fleetcare.models.model import FailureModel

    try:
        blob, meta = prior.load()
    except FileNotFoundError:
        return None
    model = FailureModel.from_bytes(blob)
    if model.horizon_h != cfg.horizon_h:
        return None
    say("scoring the fleet prior")
    s, _ = _scores(test, "alarm_m", lambda t: model.predict_proba(t)[:, 1], "test_m")
    out, _ = _method_metrics(s, failures, cfg, node_days)
    grace = np.timedelta64(cfg.every_s, "s")
    W = np.timedelta64(int(round(cfg.window_h * 3600)), "s")
    fixed = M.evaluate_alarms(s.ts, s.node, s.risk, failures, float(meta["threshold"]), W,
                              grace=grace)
    at = M.metrics_at(fixed, s.ts, s.node, s.risk, s.label, failures, cfg.window_h,
                      node_days, labeled=s.known, grace=grace)
    out["model_id"] = prior.prior_id(blob)
    out["at_shipped_threshold"] = {k: at[k] for k in (
        "threshold", "recall_at_budget", "recall_ci95", "false_drains",
        "false_drains_per_1000_node_days", "median_lead_time_h", "recall_by_mode")}
    return out


def describe(test: Sequence[Fleet], failures: Sequence[M.Failure], node_days: float
             ) -> dict[str, Any]:
    """What every figure of the report stands on: the fleet, its data, its failures."""
    nodes = {str(n) for f in test for n in T._str(f.table, "node")}
    gpus = {str(g) for f in test for g in T._str(f.table, "gpu_uuid")}
    notes = [f.store.get_meta("simulation") for f in test if hasattr(f.store, "get_meta")]
    by_mode = failures_by_mode(failures)
    return {"nodes": len(nodes), "gpus": len(gpus), "test_node_days": round(node_days, 1),
            "failures": len(failures),
            "failures_with_precursors": sum(c for m, c in by_mode.items() if m != "none"),
            "simulation": [n for n in notes if n] or None}


def _shards(stores: Any | Sequence[Any]) -> list[Any]:
    return list(stores) if isinstance(stores, list | tuple) else [stores]


def _load(stores: list[Any], cfg: EvalConfig, say: Progress, *, whole: bool = False
          ) -> list[Fleet]:
    many = len(stores) > 1
    return [load_fleet(st, cfg, whole=whole, say=say, shard=f"{i}/" if many else "")
            for i, st in enumerate(stores)]


def evaluate_store(store: Any | Sequence[Any], cfg: EvalConfig | None = None, *,
                   progress: Progress | None = None) -> dict[str, Any]:
    """The report for one fleet: a fresh model on its time split vs the baselines.

    ``store`` may be a list: shards of one fleet over the same time (node names get the
    shard's index in front, ``"0/node-00001"``), trained and measured together.
    """
    cfg = cfg or EvalConfig()
    say = progress or (lambda _m: None)
    fleets = _load(_shards(store), cfg, say)
    out = _evaluate(fleets, fleets, cfg, say)
    out["setting"] = "home: trained on this fleet's train period, tested on its last 25 %"
    return out


def evaluate_cross(train_store: Any | Sequence[Any], test_store: Any | Sequence[Any],
                   cfg: EvalConfig | None = None, *,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Trained on all of fleet A's time, tested on fleet B's test period (either may be
    a list of shards, as for ``evaluate_store``)."""
    cfg = cfg or EvalConfig()
    say = progress or (lambda _m: None)
    a = _load(_shards(train_store), cfg, say, whole=True)
    b = _load(_shards(test_store), cfg, say)
    out = _evaluate(a, b, cfg, say)
    out["setting"] = ("cross-fleet: trained on all of the train fleet's time (last 20 % "
                      "calibrates), tested on the test fleet's last 25 %")
    return out


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the arrays kept for plotting."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def summary_keys() -> Sequence[str]:
    return METHOD_KEYS
