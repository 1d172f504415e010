"""Baselines to beat, implemented as operators run them today, on the same alarm logic.

Each baseline yields per-node alarms (``RuleAlarms``: node, time, reason) or, for the
logistic regression, a per-GPU score that ``metrics.node_risk`` turns into node risk.
Alarms become episodes with ``metrics.alarm_episodes`` (drain the node for the warning window W) and are
scored with ``metrics.evaluate_alarms`` like the model (``evaluate_rule``).

Reactive XID rules (``reactive_xid_alarms``), as NVSentinel's syslog health monitor
(NVIDIA/NVSentinel, docs/configuration/syslog-health-monitor.md: checks SysLogsXIDError,
SysLogsSXIDError, SysLogsGPUFallenOff on journald), GPUd (leptonai/gpud: kernel-log XID
component, a reboot / hardware-inspection action per critical XID) and the EKS node
monitoring agent (aws/eks-node-monitoring-agent: "Accelerated Hardware - NVIDIA GPU errors
(XID codes)" set the AcceleratedHardwareReady NodeCondition that node auto repair acts on)
do it:

- drain on a fatal XID (``XidCatalog.fatal_xids()``: 48, 62, 64, 74, 79, 95, 119, 120, 140,
  143). In the data, a fatal XID *is* the failure: the rule fires at the failure, lead time
  0, and it recovers nothing of the crash. ``evaluate_rule`` counts such an alarm as a
  *reaction* (not a detection, not a false drain).
- a repeated-XID window in the style of NVSentinel's health-events analyzer: ``repeat_count``
  non-fatal XIDs of one class on one GPU within ``repeat_window_h`` drains the node. This
  is the only part of the reactive rules that can fire before a failure.

DCGM-style health thresholds (``dcgm_alarms``) on raw telemetry, as DCGM's background
health watches (``dcgmi health --set a``: memory, PCIe, NVLink, thermal; see
docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-health.html
and the thresholds in .../reference/error-thresholds.html) report them:

- memory: a new volatile double-bit (uncorrectable) ECC error (DBE > 0); retired pages
  pending; 60 or more retired pages; a row-remap failure; row remap pending;
- PCIe: more than 8 replays per minute (DCGM_FR_PCI_REPLAY_RATE);
- NVLink: a link down, or NVLink CRC / replay / recovery errors growing faster than
  ``nvlink_errors_per_min``;
- thermal: hardware or software thermal slowdown in the clock-event reasons.

A watch that fails drains the node. Thresholds are the published defaults, not tuned on
this data.

Logistic regression (``LogisticBaseline``): scikit-learn, median-imputed, standardized,
class-weighted (``class_weight="balanced"``), on the same feature columns as the model.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fleetcare.collectors.xid import DEFAULT_CATALOG, XidCatalog
from fleetcare.models import metrics as M

SW_THERMAL, HW_THERMAL = 0x20, 0x40
PCIE_REPLAYS_PER_MIN = 8.0
RETIRED_PAGES_LIMIT = 60
NVLINK_ERRORS_PER_MIN = 1.0
REPEAT_COUNT = 3
REPEAT_WINDOW_H = 24.0
REACTION_GRACE_H = 1.0 / 6


@dataclass(frozen=True, slots=True)
class RuleAlarms:
    """When a rule said "drain this node", and why (one row per firing)."""
    name: str
    ts: np.ndarray  # datetime64[us]
    node: np.ndarray  # object (str)
    reason: np.ndarray  # object (str)

    @property
    def score(self) -> np.ndarray:
        return np.ones(len(self.ts))

    def episodes(self, horizon_h: float) -> list[tuple[str, np.datetime64]]:
        H = np.timedelta64(int(round(horizon_h * 3.6e9)), "us")
        return M.alarm_episodes(self.ts, self.node, self.score, 0.5, H)


def _us(values: Sequence[Any]) -> np.ndarray:
    return np.asarray(values, dtype="datetime64[us]")


def reactive_xid_alarms(ts: Sequence[Any], node: Sequence[str], gpu: Sequence[str | None],
                        xid: Sequence[int | None], *, catalog: XidCatalog = DEFAULT_CATALOG,
                        repeat_count: int = REPEAT_COUNT,
                        repeat_window_h: float = REPEAT_WINDOW_H) -> RuleAlarms:
    """Fatal XID → alarm at its time; ``repeat_count`` XIDs of a class on a GPU in a window."""
    if repeat_count < 1:
        raise ValueError(f"repeat_count={repeat_count} must be >= 1")
    t = _us(ts)
    order = np.argsort(t, kind="stable")
    fatal = catalog.fatal_xids()
    window = np.timedelta64(int(round(repeat_window_h * 3.6e9)), "us")
    recent: dict[tuple[str, str], list[np.datetime64]] = {}
    out_t, out_n, out_r = [], [], []
    for i in order:
        x = xid[i]
        if x is None:
            continue
        x = int(x)
        if x in fatal:
            out_t.append(t[i])
            out_n.append(str(node[i]))
            out_r.append(f"fatal XID {x}")
            continue
        cls = catalog.lookup(x).xid_class
        key = (str(gpu[i] if gpu[i] is not None else node[i]), cls)
        seen = [s for s in recent.get(key, []) if t[i] - s < window] + [t[i]]
        recent[key] = seen
        if len(seen) >= repeat_count:
            out_t.append(t[i])
            out_n.append(str(node[i]))
            out_r.append(f"{len(seen)} {cls} XIDs within {repeat_window_h:g} h")
    return RuleAlarms("reactive_xid", _us(out_t), np.asarray(out_n, dtype=object),
                      np.asarray(out_r, dtype=object))


def _naive(t: dt.datetime) -> str:
    if t.tzinfo is not None:
        t = t.astimezone(dt.UTC).replace(tzinfo=None)
    return t.isoformat(sep=" ")


def reactive_xid_from_store(store: Any, start: dt.datetime, end: dt.datetime,
                            **kw: Any) -> RuleAlarms:
    """``reactive_xid_alarms`` over the store's xid_events in [start - window, end)."""
    back = dt.timedelta(hours=kw.get("repeat_window_h", REPEAT_WINDOW_H))
    cur = store.cursor()
    try:
        rows = cur.execute(
            "SELECT ts, node, gpu_uuid, xid FROM xid_events WHERE ts >= ? AND ts < ? "
            "ORDER BY ts", [_naive(start - back), _naive(end)]).fetchall()
    finally:
        cur.close()
    al = reactive_xid_alarms([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                             [r[3] for r in rows], **kw)
    keep = al.ts >= np.datetime64(_naive(start).replace(" ", "T"), "us")
    return RuleAlarms(al.name, al.ts[keep], al.node[keep], al.reason[keep])


def dcgm_sql(start: dt.datetime, end: dt.datetime, *, raw: str = "telemetry",
             pcie_replays_per_min: float = PCIE_REPLAYS_PER_MIN,
             retired_pages_limit: int = RETIRED_PAGES_LIMIT,
             nvlink_errors_per_min: float = NVLINK_ERRORS_PER_MIN) -> str:
    """The health watches as one query over raw samples (``raw``, a relation such as
    ``store.raw.relation``): (ts, node, reason) per firing."""
    nvl = ("coalesce(nvlink_crc_flit_total, 0) + coalesce(nvlink_crc_data_total, 0) + "
           "coalesce(nvlink_replay_total, 0) + coalesce(nvlink_recovery_total, 0)")
    lo = _naive(start - dt.timedelta(hours=1))
    return f"""
    WITH t AS (
      SELECT ts, node, gpu_uuid,
        greatest(ecc_uncorrected_volatile - lag(ecc_uncorrected_volatile) OVER w, 0) AS d_dbe,
        retired_pages_pending, remapped_rows_failure, remapped_rows_pending,
        coalesce(retired_pages_sbe, 0) + coalesce(retired_pages_dbe, 0) AS retired,
        greatest(pcie_replay_count - lag(pcie_replay_count) OVER w, 0) AS d_replay,
        greatest(({nvl}) - lag({nvl}) OVER w, 0) AS d_nvl,
        epoch(ts - lag(ts) OVER w) / 60.0 AS dt_min,
        nvlink_down_mask <> 0 AS link_down,
        clock_event_reasons AS reasons
      FROM {raw} WHERE ts >= TIMESTAMP '{lo}' AND ts < TIMESTAMP '{_naive(end)}'
      WINDOW w AS (PARTITION BY gpu_uuid ORDER BY ts)
    ), r AS (
      SELECT ts, node, concat_ws('; ',
        CASE WHEN d_dbe > 0 THEN 'DBE ECC error' END,
        CASE WHEN retired_pages_pending THEN 'retired pages pending' END,
        CASE WHEN retired >= {int(retired_pages_limit)} THEN 'retired pages limit' END,
        CASE WHEN remapped_rows_failure THEN 'row remap failure' END,
        CASE WHEN remapped_rows_pending THEN 'row remap pending' END,
        CASE WHEN dt_min > 0 AND d_replay / dt_min > {float(pcie_replays_per_min)}
             THEN 'PCIe replay rate' END,
        CASE WHEN link_down THEN 'NVLink down' END,
        CASE WHEN dt_min > 0 AND d_nvl / dt_min > {float(nvlink_errors_per_min)}
             THEN 'NVLink error rate' END,
        CASE WHEN (coalesce(reasons, 0) & {HW_THERMAL | SW_THERMAL}) <> 0
             THEN 'thermal violation' END) AS reason
      FROM t WHERE ts >= TIMESTAMP '{_naive(start)}'
    )
    SELECT ts, node, reason FROM r WHERE reason <> '' ORDER BY ts, node
    """


def dcgm_alarms(store: Any, start: dt.datetime, end: dt.datetime, **kw: Any) -> RuleAlarms:
    """DCGM-style health watches over the store's telemetry in [start, end)."""
    cur = store.cursor()
    try:
        raw = store.raw.relation(cur, start - dt.timedelta(hours=1), end)
        rows = cur.execute(dcgm_sql(start, end, raw=raw, **kw)).fetchall()
    finally:
        cur.close()
    return RuleAlarms("dcgm_thresholds", _us([r[0] for r in rows]),
                      np.asarray([r[1] for r in rows], dtype=object),
                      np.asarray([r[2] for r in rows], dtype=object))


def evaluate_rule(alarms: RuleAlarms, failures: Sequence[M.Failure], horizon_h: float,
                  node_days: float, *, false_drain_budget: float = 1.0,
                  grace_h: float = REACTION_GRACE_H) -> dict[str, Any]:
    """The model's metric keys for a rule (no score, so no PR-AUC and no threshold).

    Detection and lead time as ``metrics.evaluate_alarms``. An episode starting within
    ``grace_h`` after a failure of its node *reacts* to it: lead time 0, not a false drain.
    ``recall`` is the rule's recall at its one operating point; ``recall_at_budget`` is that
    recall when its false drains fit the budget, else 0 (the only way a rule without a
    score fits the budget is to alarm on nothing).
    """
    H = np.timedelta64(int(round(horizon_h * 3.6e9)), "us")
    grace = np.timedelta64(int(round(grace_h * 3.6e9)), "us")
    res = M.evaluate_alarms(alarms.ts, alarms.node, alarms.score, failures, 0.5, H)
    fails_by_node: dict[str, list[np.datetime64]] = {}
    for f in failures:
        fails_by_node.setdefault(f.node, []).append(f.ts)
    false_drains = reactions = 0
    for node, s in res.episodes:
        fs = fails_by_node.get(node, ())
        if any(s < t <= s + H for t in fs):
            continue
        if any(s - grace <= t <= s for t in fs):
            reactions += 1
        else:
            false_drains += 1
    starts: dict[str, list[np.datetime64]] = {}
    for node, s in res.episodes:
        starts.setdefault(node, []).append(s)
    leads, reacted = [], 0
    for f, det in zip(failures, res.detected, strict=True):
        ss = [s for s in starts.get(f.node, ()) if f.ts - H <= s <= f.ts + grace]
        if not ss:
            continue
        if not det:
            reacted += 1
        leads.append(max(0.0, float((f.ts - min(ss)) / np.timedelta64(1, "us")) / 3.6e9))
    n = len(failures)
    allowed = false_drain_budget * node_days / 1000.0
    recall = sum(res.detected) / n if n else None
    modes = sorted({f.mode for f in failures})
    return {
        "pr_auc": None,
        "recall_at_budget": (recall if false_drains <= allowed else 0.0) if n else None,
        "recall": M.json_float(recall),
        "false_drains": false_drains,
        "false_drains_per_1000_node_days": (M.json_float(1000.0 * false_drains / node_days)
                                            if node_days > 0 else None),
        "within_budget": bool(false_drains <= allowed),
        "median_lead_time_h": M.json_float(np.median(leads)) if leads else None,
        "p10_lead_time_h": M.json_float(np.percentile(leads, 10)) if leads else None,
        "reactions": reactions,
        "failures_reacted": reacted,
        "n_failures": n,
        "alarms": int(len(alarms.ts)),
        "recall_by_mode": {
            m: M.json_float(np.mean([d for f, d in zip(failures, res.detected, strict=True)
                                     if f.mode == m])) for m in modes},
    }


class LogisticBaseline:
    """Median-imputed, standardized, class-weighted logistic regression (scikit-learn)."""

    def __init__(self, *, C: float = 0.1, max_iter: int = 2000, seed: int = 0) -> None:
        self.C = C
        self.max_iter = max_iter
        self.seed = seed

    def _matrix(self, X: pa.Table | np.ndarray) -> np.ndarray:
        if isinstance(X, pa.Table):
            cols = [np.asarray(X.column(n).to_numpy(zero_copy_only=False), dtype=np.float64)
                    for n in self.feature_names_]
            return np.column_stack(cols) if cols else np.zeros((X.num_rows, 0))
        return np.asarray(X, dtype=np.float64)

    def fit(self, X: pa.Table | np.ndarray, y: np.ndarray,
            feature_names: Sequence[str] | None = None,
            sample_weight: np.ndarray | None = None) -> LogisticBaseline:
        """``sample_weight``: row weights (e.g. 1 / share of sampled healthy rows)."""
        from sklearn.impute import SimpleImputer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        if isinstance(X, pa.Table):
            self.feature_names_ = list(feature_names or X.column_names)
        else:
            self.feature_names_ = list(feature_names or range(np.shape(X)[1]))
        y = np.asarray(y, dtype=bool)
        if y.all() or not y.any():
            raise ValueError(f"the logistic baseline needs both classes: {int(y.sum())} "
                             f"positives in {len(y)} rows")
        A = self._matrix(X)
        A[~np.isfinite(A)] = np.nan
        self.pipeline_ = make_pipeline(
            SimpleImputer(strategy="median", keep_empty_features=True), StandardScaler(),
            LogisticRegression(C=self.C, class_weight="balanced", max_iter=self.max_iter,
                               random_state=self.seed))
        if sample_weight is None:
            self.pipeline_.fit(A, y)
        else:
            self.pipeline_.fit(A, y, logisticregression__sample_weight=np.asarray(
                sample_weight, dtype=np.float64))
        return self

    def predict_proba(self, X: pa.Table | np.ndarray) -> np.ndarray:
        A = self._matrix(X)
        A[~np.isfinite(A)] = np.nan
        return self.pipeline_.predict_proba(A)
