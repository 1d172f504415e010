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
from fleetcare.models import dataset, network_head, thermal_ramp
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
    """One store's fit rows (``dataset.FitRows``: training and calibration rows, healthy
    ones sampled with weights when the fleet is large, every calibration-period row kept
    for the goodput threshold), its split, and how to read its test period again
    (``test_rows``): nothing per row of the whole fleet stays in memory."""
    store: Any
    splits: T.Splits
    last: dt.datetime
    shard: str  # the prefix of its node names ("" for a fleet in one store)
    fit: dataset.FitRows
    test_from: dt.datetime  # the first scoring time of the test period (on the grid)
    chunk: dt.timedelta
    horizon_h: float
    every_s: int

    def test_rows(self, predictors: dict[str, dataset.Predict]) -> dataset.Scored:
        """The test period's rows (every one up to the end: alarms need no label), scored
        by each predictor a chunk at a time; keys and labels kept, features not."""
        if self.test_from > self.splits.end:
            return dataset.score((), predictors)
        tables = dataset.chunks(
            self.store, dataset.lead_in(self.test_from, self.every_s, floor=self.splits.start),
            self.splits.end, every_s=self.every_s, horizon_h=self.horizon_h, chunk=self.chunk)
        return dataset.score((_prefixed(t, self.shard) for t in tables), predictors,
                             keep=_within(self.test_from, self.splits.end))

    def known(self, keys: pa.Table) -> np.ndarray:
        """Rows of ``keys`` whose label is known (their horizon ends inside the data)."""
        H = np.timedelta64(int(round(self.horizon_h * 3600)), "s")
        return np.asarray(_ts(keys) + H <= _np(self.last), dtype=bool)


def _np(t: dt.datetime) -> np.datetime64:
    return T._np_ts(t)


def _ts(keys: pa.Table) -> np.ndarray:
    return T.ts_column(keys) if keys.num_rows else np.zeros(0, "datetime64[us]")


def _prefixed(table: pa.Table, shard: str) -> pa.Table:
    """``table`` with ``shard`` in front of every node name."""
    if not shard or table.num_rows == 0:
        return table
    i = table.column_names.index("node")
    return table.set_column(i, "node", pc.binary_join_element_wise(
        pa.scalar(shard), table.column("node").cast(pa.string()), ""))


def _grid(store: Any, cfg: EvalConfig) -> tuple[dt.datetime, dt.datetime, int]:
    """(first scoring time, newest telemetry, grid times) of a store."""
    lo, hi = T._telemetry_range(store)
    start = lo + T.WARMUP
    if hi <= start:
        raise T.TrainError(f"the store's telemetry ({lo} .. {hi}) is shorter than the "
                           f"{T.WARMUP} warm-up: simulate more days")
    return start, hi, int((hi - start) / dt.timedelta(seconds=cfg.every_s)) + 1


def _split(store: Any, cfg: EvalConfig, whole: bool
           ) -> tuple[dt.datetime, dt.datetime, T.Splits]:
    """(first scoring time, last telemetry, the time split) of one store; ``whole``:
    train on all of it, the last 20 % calibrates."""
    start, hi, _n = _grid(store, cfg)
    if whole:
        return start, hi, T.Splits(start, start + (hi - start) * 0.8, hi, hi)
    return start, hi, T.Splits.of(start, hi)


def load_fleet(store: Any, cfg: EvalConfig, *, whole: bool = False,
               say: Progress = lambda _m: None, shard: str = "",
               negatives: float | None = None) -> Fleet:
    """Fit rows of one store and its split (``Fleet``). ``shard`` (e.g. ``"2/"``) is put in
    front of every node name, so that shards of one fleet never share a node;
    ``negatives``: the share of healthy rows fits keep (default: ``dataset.negatives_for``
    this store's rows)."""
    from fleetcare.pipeline import features

    features.refresh(store)
    start, hi, splits = _split(store, cfg, whole)
    g = dataset.grid(store, start, splits.test_start, cfg.every_s)
    if negatives is None:
        negatives = g.negatives()
    failures = [M.Failure(shard + f.node, f.ts, f.mode) for f in dataset.fleet_failures(store)]
    say(f"features {start:%Y-%m-%d %H:%M} .. {hi:%Y-%m-%d %H:%M} ({g.gpus} GPUs, "
        f"{g.chunk} at a time)")
    tables = (_prefixed(t, shard) for t in dataset.chunks(
        store, start, g.fit_end, every_s=cfg.every_s, horizon_h=cfg.horizon_h,
        chunk=g.chunk, say=say))
    H = np.timedelta64(int(round(cfg.horizon_h * 3600)), "s")
    fit = dataset.fit_rows(tables, cal_start=_np(splits.cal_start),
                           test_start=_np(splits.test_start), horizon=H, failures=failures,
                           negatives=negatives, seed=cfg.seed, start=_np(start), keep_cal=True)
    return Fleet(store, splits, hi, shard, fit, g.test_from, g.chunk, cfg.horizon_h,
                 cfg.every_s)


def failures_of(table: pa.Table, mask: np.ndarray | None = None, *,
                before: np.datetime64 | None = None) -> list[M.Failure]:
    """Distinct (node, failure time) the rows in ``mask`` (default: all) look ahead to, with
    their mode (only failures before ``before`` when given)."""
    if table.num_rows == 0 or "node_label" not in table.column_names:
        return []
    if mask is None:
        mask = np.ones(table.num_rows, dtype=bool)
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


def _joined(parts: Sequence[NodeScores]) -> NodeScores:
    return NodeScores(*(np.concatenate([getattr(x, k) for x in parts])
                        for k in ("ts", "node", "risk", "label", "known")))


def _weights(t: pa.Table, *, sampled: bool) -> np.ndarray | None:
    """The rows' weights when healthy rows were sampled (else None: all weigh 1)."""
    return t.column(dataset.WEIGHT).to_numpy() if sampled else None


def _fit_model(fleets: Sequence[Fleet], cfg: EvalConfig) -> Any:
    fit = dataset.FitRows(dataset._concat([f.fit.train for f in fleets]),
                          dataset._concat([f.fit.cal for f in fleets]),
                          min(f.fit.negatives for f in fleets))
    return T.fit_model(fit, horizon_h=cfg.horizon_h, seed=cfg.seed)


@dataclass
class TestPeriod:
    """Every test fleet's scored rows together (node names carry the shard)."""
    keys: pa.Table
    p: dict[str, np.ndarray]
    known: np.ndarray
    failures: list[M.Failure]

    def scores(self, name: str) -> NodeScores:
        ones = np.ones(self.keys.num_rows, dtype=bool)
        return node_scores(self.keys, ones, self.p[name], self.known)

    def period(self, every_s: int) -> tuple[np.datetime64, np.datetime64]:
        ts = _ts(self.keys)
        return ts.min(), ts.max() + np.timedelta64(every_s, "s")


def _test_period(fleets: Sequence[Fleet], predictors: dict[str, dataset.Predict]
                 ) -> TestPeriod:
    parts = [f.test_rows(predictors) for f in fleets]
    return TestPeriod(
        dataset._concat([x.keys for x in parts]),
        {k: np.concatenate([x.p[k] for x in parts]) for k in predictors},
        np.concatenate([f.known(x.keys) for f, x in zip(fleets, parts, strict=True)]),
        [y for x in parts for y in failures_of(x.keys)])


def _cal_scores(fleets: Sequence[Fleet], predict: dataset.Predict
                ) -> tuple[NodeScores, pa.Table]:
    """Node scores over every calibration-period row of the fleets, and those rows' keys."""
    parts, keys = [], []
    for f in fleets:
        spill = f.fit.cal_all
        if spill is None or spill.num_rows == 0:
            continue
        s = dataset.score(spill.tables(), {"p": predict}, keep=_within(f.splits.cal_start))
        if s.num_rows == 0:  # lead rows only: no calibration period to speak of
            continue
        ones = np.ones(s.num_rows, dtype=bool)
        parts.append(node_scores(s.keys, ones, s.p["p"]))
        keys.append(s.keys)
    return _joined(parts), dataset._concat(keys)


def _within(start: dt.datetime, end: dt.datetime | None = None
            ) -> Callable[[pa.Table], np.ndarray]:
    """A pass's ``keep``: rows from ``start`` (the rows before give the rule's lags) up
    to ``end`` when given."""
    first, last = _np(start), None if end is None else _np(end)

    def keep(t: pa.Table) -> np.ndarray:
        ts = T.ts_column(t)
        return (ts >= first) if last is None else (ts >= first) & (ts <= last)

    return keep


def _spans(fleets: Sequence[Fleet], period: str
           ) -> list[tuple[Any, dt.datetime, dt.datetime, str]]:
    return [(f.store, *((f.test_from, f.splits.end) if period == "test"
                        else (f.splits.cal_start, f.splits.test_start)), f.shard)
            for f in fleets]


def _with_head(s: NodeScores, head: Any, fleets: Sequence[Fleet], period: str
               ) -> tuple[NodeScores, np.ndarray | None]:
    """``s`` with each node's risk combined with the network head's (none: as it is), over
    the fleets' ``test`` or ``cal`` period, and the head's probability at each row (None
    without a head)."""
    if head is None:
        return s, None
    p = (network_head.lookup(head, _spans(fleets, period))(s.ts, s.node) if len(s.ts)
         else np.zeros(0))
    return NodeScores(s.ts, s.node, network_head.combine(s.risk, p), s.label, s.known), p


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
        model.network_head_ = network_head.fit(  # labelled over W, as training does
            [network_head.Period(f.store, f.splits.start, f.splits.test_start, f.shard)
             for f in train],
            horizon_h=cfg.window_h, seed=cfg.seed)
    head = model.network_head_
    negatives = min(f.fit.negatives for f in train)
    train_rows = dataset._concat([f.fit.train for f in train])
    names = T.model_features(T.feature_columns(train_rows.drop_columns([dataset.WEIGHT])))
    thinned = train_rows.num_rows > dataset.BASELINE_ROWS
    train_rows = dataset.thin(train_rows, dataset.BASELINE_ROWS, seed=cfg.seed)
    say(f"fitting the logistic baseline on {train_rows.num_rows} rows")
    logit = B.LogisticBaseline(seed=cfg.seed).fit(
        train_rows, T._bool(train_rows, "label"), feature_names=names,
        sample_weight=_weights(train_rows, sampled=thinned or negatives < 1))
    del train_rows
    for f in train:  # fitted: the rows are not held while the test period is read
        f.fit.train, f.fit.cal = f.fit.train.slice(0, 0), f.fit.cal.slice(0, 0)
    predictors: dict[str, dataset.Predict] = {  # fleetcare's with its thermal-ramp rule
        "model": thermal_ramp.predictor(model),
        "logistic": lambda t: logit.predict_proba(t)[:, 1]}
    shipped = _shipped_prior(cfg)
    if shipped is not None:
        predictors["prior"] = thermal_ramp.predictor(shipped[0])
    say("scoring the test period" + (" (model, logistic, fleet prior)" if shipped else ""))
    tp = _test_period(test, predictors)
    failures = tp.failures
    s_model, _ = _with_head(tp.scores("model"), head, test, "test")
    p = tp.p["model"]
    node_days = len(s_model.ts) * cfg.every_s / 86400.0
    y_te = T._bool(tp.keys, "label")[tp.known] if tp.keys.num_rows else np.zeros(0, bool)
    say(f"scored {len(p)} test rows, {len(failures)} failures")
    out_model, leads = _method_metrics(s_model, failures, cfg, node_days)
    out_model["ece"] = M.expected_calibration_error(y_te, p[tp.known])
    out_model["gpu_pr_auc"] = M.average_precision(y_te, p[tp.known])
    out_model["network_head"] = T.head_summary(head)
    s_log = tp.scores("logistic")
    out_log, _ = _method_metrics(s_log, failures, cfg, node_days)
    out_prior = None
    if shipped is not None:
        s_prior, p_net = _with_head(tp.scores("prior"), shipped[0].network_head_, test, "test")
        out_prior = _prior_metrics(s_prior, shipped, failures, cfg, node_days, p_net=p_net)

    start, end = tp.period(cfg.every_s)
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

    def jobs_of(keys: pa.Table) -> list[G.Job]:
        nodes = sorted({str(n) for n in T._str(keys, "node")}) if keys.num_rows else []
        return G.pack_jobs(nodes, cfg.job_sizes, gpus_per_node=cost.gpus_per_node,
                           checkpoint_interval_h=cost.checkpoint_interval_h, seed=cfg.seed)

    s_cal, cal_keys = _cal_scores(train, thermal_ramp.predictor(model))  # a pass of its own
    s_cal, _ = _with_head(s_cal, head, train, "cal")
    cal_jobs = jobs_of(cal_keys)
    c0 = s_cal.ts.min() if len(s_cal.ts) else start
    c1 = (s_cal.ts.max() if len(s_cal.ts) else start) + np.timedelta64(cfg.every_s, "s")
    # a scored row reacts to a failure up to one interval after it (rules: at the XID)
    row_grace_h = max(G.REACTION_GRACE_H, cfg.every_s / 3600.0)
    thr, cal_res, _ = G.choose_goodput_threshold(
        s_cal.ts, s_cal.node, G.decision_score(s_cal.node, s_cal.risk, cal_jobs, cost),
        failures_of(cal_keys, before=c1), cal_jobs, cost, c0, c1,
        grace_h=row_grace_h, **sim)
    jobs = jobs_of(tp.keys)
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
        "fleet": describe(test, tp.keys, failures, node_days),
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


def _shipped_prior(cfg: EvalConfig) -> tuple[Any, dict[str, Any], bytes] | None:
    """The package's fleet prior (model, meta, bytes) when it predicts at this horizon."""
    from fleetcare.models import prior
    from fleetcare.models.model import FailureModel

    try:
        blob, meta = prior.load()
    except FileNotFoundError:
        return None
    model = FailureModel.from_bytes(blob)
    return (model, meta, blob) if model.horizon_h == cfg.horizon_h else None


def _prior_metrics(s: NodeScores, shipped: tuple[Any, dict[str, Any], bytes], failures: list[M.Failure],
                   cfg: EvalConfig, node_days: float, *, p_net: np.ndarray | None = None
                   ) -> dict[str, Any]:
    """The shipped fleet prior on the same test rows (``s``: its node risks, combined with
    its network head's ``p_net`` when it has one), at its own operating point (fixed on
    its validation fleets, nothing tuned here: the threshold, and the head's own threshold
    on ``p_net``, ``network_head.alarm_risk``) and at the best threshold within the budget
    on these rows."""
    from fleetcare.models import prior

    _model, meta, blob = shipped
    out, _ = _method_metrics(s, failures, cfg, node_days)
    grace = np.timedelta64(cfg.every_s, "s")
    W = np.timedelta64(int(round(cfg.window_h * 3600)), "s")
    threshold = float(meta["threshold"])
    head_threshold = (meta.get("network_head") or {}).get("threshold")
    alarm = network_head.alarm_risk(s.risk, np.zeros(len(s.risk)) if p_net is None else p_net,
                                    threshold, head_threshold)
    alarm = prior.alarm_score(s.ts, s.node, alarm, **prior.operating_rule(meta))
    fixed = M.evaluate_alarms(s.ts, s.node, alarm, failures, threshold, W, grace=grace)
    at = M.metrics_at(fixed, s.ts, s.node, s.risk, s.label, failures, cfg.window_h,
                      node_days, labeled=s.known, grace=grace)
    out["model_id"] = prior.prior_id(blob)
    out["at_shipped_threshold"] = {k: at[k] for k in (
        "threshold", "recall_at_budget", "recall_ci95", "false_drains",
        "false_drains_per_1000_node_days", "median_lead_time_h", "recall_by_mode",
        "detected_by_mode")}
    out["at_shipped_threshold"]["network_threshold"] = head_threshold
    return out


def describe(test: Sequence[Fleet], keys: pa.Table, failures: Sequence[M.Failure],
             node_days: float) -> dict[str, Any]:
    """What every figure of the report stands on: the fleet, its data, its failures."""
    nodes = set(pc.unique(keys.column("node")).to_pylist()) if keys.num_rows else set()
    gpus = set(pc.unique(keys.column("gpu_uuid")).to_pylist()) if keys.num_rows else set()
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
    """Every shard's ``Fleet``, healthy rows sampled at one share for all of them (the fit
    takes at most ``dataset.MAX_FIT_ROWS`` over the shards together)."""
    from fleetcare.pipeline import features

    many = len(stores) > 1
    rows = 0
    for st in stores:
        features.refresh(st)
        start, _hi, splits = _split(st, cfg, whole)
        g = dataset.grid(st, start, splits.test_start, cfg.every_s)
        rows += g.gpus * g.n_fit
    negatives = dataset.negatives_for(rows)
    return [load_fleet(st, cfg, whole=whole, say=say, shard=f"{i}/" if many else "",
                       negatives=negatives) for i, st in enumerate(stores)]


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
