"""Evaluation at node level, in the terms an operator pays for: drains and missed failures.

- Node risk at time t: ``1 - prod(1 - p_gpu)`` over the node's GPUs at t.
- Alarms are judged over a *warning window* W (``WINDOW_H``, 72 h by default), which is
  not the model's label horizon H (24 h: what its probability means). An alarm claims
  "this node is failing"; a GPU whose HBM errors ramp for two days before the
  uncorrectable error is rightly drained 40 h early, and judging that drain by a 24 h
  horizon would call it false. W bounds how early a claim may be and still count.
- An *alarm episode* starts at the first node score >= threshold; the node is then
  drained for W, and further alarms within ``(start, start + W]`` belong to the same
  episode. An episode with no failure of that node within ``(start, start + W]`` is a
  *false drain* (also when W runs past the end of the data: unproven counts as false),
  unless it starts within a *grace* after a failure of its node: the row that first sees a
  failure (its terminal XID, its lost GPU) scores high because the node has already
  failed, and a node that is down is not drained. That is a *reaction* (lead 0, not a
  drain), as for the reactive rules (``baselines.evaluate_rule``); ``evaluation`` sets the
  grace to one scoring interval, the time until the first row after the failure.
- A failure at f is *detected* when an episode of its node starts in ``[f - W, f)``;
  its lead time is ``f - start``.
- A random alarm is credited by chance with probability about r·W (r: the node failure
  rate): 1 % at Llama 3's 3.8 failures per 1,000 node-days and W = 72 h.
- The operating threshold is the lowest one whose false drains stay within the budget
  (default 1 per 1,000 node-days): it maximises recall under the budget. The budget is a
  whole number of drains: on a test of fewer than 1,000 node-days it allows none. When
  no threshold fits, the operating point is "alarm on nothing" (0 false drains, recall
  0), and ``strictest_false_drains`` says how many false drains even the single highest
  score brings (the evidence that the budget, not the search, made recall 0).

With few failures these numbers are noisy; every function returns ``None`` where a
metric is undefined (no positives, no failures) and never NaN, so results are JSON-safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOP_CANDIDATES = 2000
"""The highest distinct scores all tried as thresholds (quantiles below them)."""
WINDOW_H = 72.0
"""Default warning window W in hours (see the module docstring)."""


def json_float(x: Any) -> float | None:
    """A float for JSON, or None for NaN / inf / None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class NodeGroups:
    """GPU rows grouped per (ts, node), sorted by node then ts: the one sort that
    ``risk`` and ``any`` share (``node_groups``)."""

    order: np.ndarray  # GPU rows in (node, ts) order
    starts: np.ndarray  # where each (ts, node) group starts in that order
    ts: np.ndarray  # per group
    node: np.ndarray  # per group

    def risk(self, p_gpu: np.ndarray) -> np.ndarray:
        """Per group: ``1 - prod(1 - p)`` over its GPUs."""
        if len(self.order) == 0:
            return np.zeros(0)
        with np.errstate(divide="ignore"):
            logq = np.log1p(-np.clip(np.asarray(p_gpu, dtype=np.float64)[self.order], 0.0, 1.0))
        return 1.0 - np.exp(np.add.reduceat(logq, self.starts))

    def any(self, flag: np.ndarray) -> np.ndarray:
        """Per group: is ``flag`` true on any of its GPU rows."""
        if len(self.order) == 0:
            return np.zeros(0, dtype=bool)
        return np.logical_or.reduceat(np.asarray(flag, dtype=bool)[self.order], self.starts)


def node_groups(ts: np.ndarray, node: np.ndarray) -> NodeGroups:
    """The (ts, node) groups of GPU rows, sorted by node, then ts."""
    node = np.asarray(node, dtype=object)
    ts = np.asarray(ts)
    keys = np.array([f"{n}\x00" for n in node], dtype=object)
    order = np.lexsort((ts, keys))
    ts_s, node_s = ts[order], node[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (node_s[1:] != node_s[:-1]) | (ts_s[1:] != ts_s[:-1])
    starts = np.flatnonzero(new)
    return NodeGroups(order, starts, ts_s[starts], node_s[starts])


def node_risk(ts: np.ndarray, node: np.ndarray, p_gpu: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (ts, node): ``1 - prod(1 - p)``; returns (ts, node, risk) sorted by node, ts."""
    g = node_groups(ts, node)
    return g.ts, g.node, g.risk(p_gpu)


def held_risk(ts: np.ndarray, node: np.ndarray, risk: np.ndarray, hold: np.timedelta64
              ) -> np.ndarray:
    """Per scoring, the risk its node has held for ``hold``: the lowest of the node's risks
    at its scorings from its latest scoring at or before ``t - hold`` through ``t`` (all of
    a ts's rows), or -1 where it has none that early (not scored long enough to say).
    At a threshold ``x`` this is the alert rule's ``for`` (``Rule.for_s``): a node alarms
    at the scoring where its risk has been at ``x`` or above at every scoring for at least
    ``hold``, whatever minutes the scorings fall on. A zero ``hold`` returns the risks.
    Rows in any order; the result is in theirs."""
    risk = np.asarray(risk, dtype=np.float64)
    n = len(risk)
    if hold <= np.timedelta64(0, "s") or n == 0:
        return risk.copy()
    ts = np.asarray(ts).astype("datetime64[us]")
    _, code = np.unique(np.asarray(node, dtype=object).astype(str), return_inverse=True)
    order = np.lexsort((ts, code))
    t = (ts[order] - ts.min()).astype(np.int64)  # microseconds since the first scoring
    h = int(hold / np.timedelta64(1, "us"))
    span = int(t.max()) + h + 1
    c = code[order].astype(np.int64)
    key = c * span + t  # each node's scorings, in time order
    start = np.searchsorted(key, key - h, side="right") - 1  # its latest at or before t - h
    held = (start >= 0) & (c[np.maximum(start, 0)] == c)
    first = np.searchsorted(key, key[np.maximum(start, 0)], side="left")  # all of that ts
    first = np.where(held, first, np.arange(n))
    last = np.searchsorted(key, key, side="right") - 1  # and all of t's
    r = risk[order]
    low = r[last]
    reach = last - first
    for k in range(1, int(reach.max()) + 1):
        rows = np.flatnonzero(reach >= k)
        low[rows] = np.minimum(low[rows], r[last[rows] - k])
    out = np.empty(n)
    out[order] = np.where(held, low, -1.0)
    return out


def two_tier(ts: np.ndarray, node: np.ndarray, risk: np.ndarray, hold: np.timedelta64,
             immediate: float) -> np.ndarray:
    """The alarm score of a two-tier rule: the risk where it is at least ``immediate``,
    elsewhere the risk held for ``hold`` (``held_risk``). At a threshold ``x <= immediate``
    a node alarms when its risk reaches ``immediate`` or has stayed at ``x`` or above for
    ``hold``; above ``immediate`` the score is the risk. ``immediate=inf`` waits always,
    a zero ``hold`` is the risk itself."""
    risk = np.asarray(risk, dtype=np.float64)
    return np.where(risk >= immediate, risk, held_risk(ts, node, risk, hold))


@dataclass(frozen=True, slots=True)
class Failure:
    node: str
    ts: np.datetime64
    mode: str = "unknown"


@dataclass(frozen=True, slots=True)
class AlarmResult:
    threshold: float
    episodes: list[tuple[str, np.datetime64]]
    false_drains: int
    detected: list[bool]
    lead_times_h: list[float]  # one per detected failure, in failure order
    failures: list[Failure] = field(default_factory=list)


def alarm_episodes(ts: np.ndarray, node: np.ndarray, score: np.ndarray, threshold: float,
                   window: np.timedelta64) -> list[tuple[str, np.datetime64]]:
    """(node, start) of each alarm episode: first score >= threshold, then W of drain."""
    node = np.asarray(node, dtype=object)
    hit = np.flatnonzero(np.asarray(score) >= threshold)
    if len(hit) == 0:
        return []
    sub_ts, sub_node = np.asarray(ts)[hit], node[hit]
    order = np.lexsort((sub_ts, np.array([str(n) for n in sub_node], dtype=object)))
    out: list[tuple[str, np.datetime64]] = []
    last: dict[str, np.datetime64] = {}
    for k in order:
        n, t = str(sub_node[k]), sub_ts[k]
        start = last.get(n)
        if start is not None and t <= start + window:
            continue
        last[n] = t
        out.append((n, t))
    return out


def evaluate_alarms(ts: np.ndarray, node: np.ndarray, score: np.ndarray,
                    failures: Sequence[Failure], threshold: float,
                    window: np.timedelta64, *, grace: np.timedelta64 | None = None
                    ) -> AlarmResult:
    """Episodes at ``threshold``, their false drains, and which failures they detect.

    An episode starting within ``grace`` (default none) at or after a failure of its
    node reacts to it: not a false drain (see the module docstring).
    """
    episodes = alarm_episodes(ts, node, score, threshold, window)
    by_node: dict[str, list[np.datetime64]] = {}
    for n, t in episodes:
        by_node.setdefault(n, []).append(t)
    fail_by_node: dict[str, list[np.datetime64]] = {}
    for f in failures:
        fail_by_node.setdefault(f.node, []).append(f.ts)
    false_drains = sum(
        1 for n, s in episodes
        if not any(s < f <= s + window or (grace is not None and s - grace <= f <= s)
                   for f in fail_by_node.get(n, ()))
    )
    detected, leads = [], []
    for f in failures:
        starts = [s for s in by_node.get(f.node, ()) if f.ts - window <= s < f.ts]
        detected.append(bool(starts))
        if starts:
            leads.append(float((f.ts - min(starts)) / np.timedelta64(1, "s")) / 3600.0)
    return AlarmResult(threshold, episodes, false_drains, detected, leads, list(failures))


def _candidates(score: np.ndarray, max_candidates: int, top: int = TOP_CANDIDATES
                ) -> np.ndarray:
    """Thresholds to try, strictest first: every one of the ``top`` highest distinct
    scores (where a budget of a few false drains sits), then quantiles of the rest."""
    u = np.unique(score[np.isfinite(score)])[::-1]
    if len(u) <= top + max_candidates:
        return u
    rest = np.unique(np.quantile(u[top:], np.linspace(0.0, 1.0, max_candidates)))[::-1]
    return np.concatenate([u[:top], rest])


def choose_threshold(ts: np.ndarray, node: np.ndarray, score: np.ndarray,
                     failures: Sequence[Failure], window: np.timedelta64, node_days: float,
                     *, false_drain_budget: float = 1.0, max_candidates: int = 400,
                     grace: np.timedelta64 | None = None) -> AlarmResult | None:
    """The lowest threshold with false drains <= budget per 1,000 node-days (best recall).

    Among thresholds within the budget, the one with the highest recall wins, ties to the
    higher threshold. None when no threshold fits (or there are no scores).
    """
    score = np.asarray(score, dtype=np.float64)
    if len(score) == 0 or node_days <= 0:
        return None
    allowed = false_drain_budget * node_days / 1000.0
    best: AlarmResult | None = None
    for thr in _candidates(score, max_candidates):
        res = evaluate_alarms(ts, node, score, failures, float(thr), window, grace=grace)
        if res.false_drains > allowed:
            # False drains grow (almost) monotonically as the threshold falls: far past
            # the budget, looser thresholds will not come back under it.
            if res.false_drains > 2 * allowed + 5:
                break
            continue
        if best is None or sum(res.detected) > sum(best.detected):
            best = res
    if best is None:  # not even the strictest threshold fits: alarm on nothing
        return None
    return best


def average_precision(y: np.ndarray, score: np.ndarray) -> float | None:
    y = np.asarray(y, dtype=bool)
    if len(y) == 0 or y.all() or not y.any():
        return None
    from sklearn.metrics import average_precision_score

    return json_float(average_precision_score(y, score))


def roc_auc(y: np.ndarray, score: np.ndarray) -> float | None:
    y = np.asarray(y, dtype=bool)
    if len(y) == 0 or y.all() or not y.any():
        return None
    from sklearn.metrics import roc_auc_score

    return json_float(roc_auc_score(y, score))


def expected_calibration_error(y: np.ndarray, p: np.ndarray, *, bins: int = 10) -> float | None:
    """Weighted mean |observed rate - mean predicted| over equal-width probability bins."""
    y = np.asarray(y, dtype=np.float64)
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    if len(y) == 0:
        return None
    idx = np.minimum((p * bins).astype(int), bins - 1)
    err = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            err += m.sum() * abs(y[m].mean() - p[m].mean())
    return json_float(err / len(y))


def node_metrics(ts: np.ndarray, node: np.ndarray, risk: np.ndarray, node_label: np.ndarray,
                 failures: Sequence[Failure], window_h: float, node_days: float,
                 *, false_drain_budget: float = 1.0, labeled: np.ndarray | None = None,
                 grace: np.timedelta64 | None = None) -> dict[str, Any]:
    """pr_auc, recall_at_budget, false drains, lead time and recall per failure mode.

    Alarms are judged over the warning window ``window_h``; one starting within ``grace``
    after a failure of its node reacts to it (``evaluate_alarms``). ``labeled`` marks the
    rows whose label is known (their horizon ends inside the data): PR-AUC uses only
    those, while alarms use every row (default: all rows are labeled).
    """
    window = np.timedelta64(int(round(window_h * 3600)), "s")
    res = choose_threshold(ts, node, risk, failures, window, node_days,
                           false_drain_budget=false_drain_budget, grace=grace)
    return metrics_at(res, ts, node, risk, node_label, failures, window_h, node_days,
                      false_drain_budget=false_drain_budget, labeled=labeled, grace=grace)


def metrics_at(res: AlarmResult | None, ts: np.ndarray, node: np.ndarray, risk: np.ndarray,
               node_label: np.ndarray, failures: Sequence[Failure], window_h: float,
               node_days: float, *, false_drain_budget: float = 1.0,
               labeled: np.ndarray | None = None, grace: np.timedelta64 | None = None
               ) -> dict[str, Any]:
    """``node_metrics`` at an operating point already chosen by ``choose_threshold``."""
    window = np.timedelta64(int(round(window_h * 3600)), "s")
    n_fail = len(failures)
    lab = np.ones(len(risk), dtype=bool) if labeled is None else np.asarray(labeled, bool)
    out: dict[str, Any] = {
        "pr_auc": average_precision(np.asarray(node_label)[lab], np.asarray(risk)[lab]),
        "node_roc_auc": roc_auc(np.asarray(node_label)[lab], np.asarray(risk)[lab]),
        "n_failures": n_fail,
        "node_days": json_float(node_days),
        "threshold": None,
        "recall_at_budget": None,
        "false_drains": None,
        "false_drains_per_1000_node_days": None,
        "false_drains_allowed": int(math.floor(false_drain_budget * node_days / 1000.0 + 1e-9)),
        "strictest_false_drains": None,
        "median_lead_time_h": None,
        "window_h": json_float(window_h),
        "recall_by_mode": {},
        "detected": 0 if n_fail else None,
        "recall_ci95": None,
        "detected_by_mode": {},
    }
    modes = sorted({f.mode for f in failures})
    for m in modes:
        out["detected_by_mode"][m] = [0, sum(1 for f in failures if f.mode == m)]
    if res is None:
        out["recall_by_mode"] = {m: (0.0 if n_fail else None) for m in modes}
        if n_fail:
            out["recall_at_budget"] = 0.0
            out["recall_ci95"] = wilson(0, n_fail)
        finite = np.asarray(risk, dtype=np.float64)
        finite = finite[np.isfinite(finite)]
        if len(finite) and node_days > 0:
            out["false_drains"] = 0
            out["false_drains_per_1000_node_days"] = 0.0
            out["strictest_false_drains"] = evaluate_alarms(
                ts, node, risk, failures, float(finite.max()), window, grace=grace).false_drains
        return out
    out["threshold"] = json_float(res.threshold)
    out["false_drains"] = res.false_drains
    out["false_drains_per_1000_node_days"] = (
        json_float(1000.0 * res.false_drains / node_days) if node_days > 0 else None)
    if n_fail:
        out["recall_at_budget"] = json_float(sum(res.detected) / n_fail)
        out["detected"] = int(sum(res.detected))
        out["recall_ci95"] = wilson(int(sum(res.detected)), n_fail)
    if res.lead_times_h:
        out["median_lead_time_h"] = json_float(np.median(res.lead_times_h))
    for m in modes:
        hits = [d for f, d in zip(failures, res.detected, strict=True) if f.mode == m]
        out["recall_by_mode"][m] = json_float(sum(hits) / len(hits))
        out["detected_by_mode"][m] = [int(sum(hits)), len(hits)]
    return out


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """The Wilson score interval of a proportion k / n (95 % by default): with 24
    failures one detection more or less moves recall by 0.04, and the interval says how
    far the truth may be from the figure."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]
