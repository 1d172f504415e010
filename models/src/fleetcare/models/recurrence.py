"""Repeat-failure risk from incident history alone (issue 16).

Real fleets fail again where they failed before: in a public production trace of 400 GPU
servers over 348 days (stepfun-ai/InfiniteHBD-Trace, SIGCOMM 2025), 42 % of faults are
followed by another on the same node within 30 days. That needs no telemetry, only the
incident history every customer already has (tickets, Slurm's node events): a node's
probability of failing within ``HORIZON_DAYS`` is read from what was known at time *t*:

- how often it failed (``FAILURES_IN``: 7, 30, 90 days and ever),
- how long ago it last failed and was last repaired, whether it is in repair now,
- how long its repairs took (last, median),
- what its last failure was (``CLASSES``: GPU, network, host, software, unknown).

The model is a recency-frequency logistic regression on three inputs (``INPUTS``): the
log of the days since the node's last failure (or, for a node that never failed, the days
it has been on record), whether it ever failed, and its failures per 30 days on record.
584 faults support three coefficients, not a tree ensemble: a LightGBM on all the facts
above ranked worse than the baseline on the trace's earlier part (README). ``fit`` trains
it on a daily grid of (node, t) rows labelled by "a failure in (t, t + 7 d]"; ``score``
ranks the nodes at a time; ``reasons`` says why in plain words, from the facts. The shipped model (``MODEL_FILE``) is fit on the trace's first 60 % only
(``python -m fleetcare.models.recurrence build --trace FILE``); ``evaluate`` reports it
on the last 40 % against the rule "most recent fault first" (``baseline_score``).

Incidents are rows ``(ts, node, kind, cause)``: ``kind`` ``failure`` is a failure (cause
``planned_maintenance`` excepted), ``repair`` and ``rma`` end the repair.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

HORIZON_DAYS = 7.0
FAILURES_IN = (7.0, 30.0, 90.0)
CLASSES = ("gpu", "network", "host", "software", "unknown")
CAUSE_CLASS = {
    "faulty_gpu": "gpu", "gpu_hbm3_memory": "gpu", "gpu_sram_memory": "gpu",
    "gpu_system_processor": "gpu", "gpu_thermal_interface_sensor": "gpu",
    "silent_data_corruption": "gpu", "gpu_lost": "gpu", "fatal_xid": "gpu",
    "network_switch_cable": "network", "nic": "network", "nccl_watchdog_timeout": "network",
    "software_bug": "software", "dependency": "software",
    "host_maintenance": "host", "ssd": "host", "power_supply": "host",
    "server_chassis": "host", "io_expansion_board": "host", "cpu": "host",
    "system_memory": "host", "node_down": "host",
}
"""Table 5's causes and the operator causes in five classes (anything else: unknown)."""
NOT_FAILURES = ("planned_maintenance",)
REPAIR_KINDS = ("repair", "rma")


def is_failure(kind: str, cause: str | None) -> bool:
    """An incident that counts as a failure everywhere incident history is read
    (recurrence, repeat offenders, repeat statistics): a failure not planned."""
    return kind == "failure" and cause not in NOT_FAILURES


def is_repair(kind: str) -> bool:
    """An incident that ends a failure: a repair or an RMA."""
    return kind in REPAIR_KINDS
FEATURES = (
    *(f"failures_{int(w)}d" for w in FAILURES_IN), "failures_ever",
    "days_since_failure", "days_since_repair", "in_repair", "last_repair_h",
    "median_repair_h", *(f"last_{c}" for c in CLASSES),
)
"""The facts about a node's history at a time (``features_at``): reasons are told from them."""
INPUTS = ("log_days_since_failure", "never_failed", "failures_per_30d")
"""What the model reads (``inputs``): recency and frequency, comparable between a node on
record for a month and one on record for a year."""
MIN_SPAN_DAYS = 30.0
MODEL_FILE = "recurrence_model.json"


def cause_class(cause: str) -> str:
    return CAUSE_CLASS.get(cause, "unknown")


@dataclass(frozen=True)
class History:
    """Each node's failures (time in days, class) and repairs (time in days), sorted."""

    nodes: tuple[str, ...]
    fail_t: dict[str, np.ndarray]
    fail_class: dict[str, list[str]]
    repair_t: dict[str, np.ndarray]
    origin: dt.datetime  # day 0: the start of the record

    @classmethod
    def of(cls, rows: Iterable[tuple[dt.datetime, str, str, str]],
           nodes: Iterable[str] = (), origin: dt.datetime | None = None) -> History:
        """From ``(ts, node, kind, cause)`` rows; ``nodes``: more nodes with no incident."""
        rows = sorted(rows, key=lambda r: (r[0], r[1]))
        origin = origin or (rows[0][0] if rows else dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        fails: dict[str, list[tuple[float, str]]] = {}
        reps: dict[str, list[float]] = {}
        names = set(nodes)
        for ts, node, kind, cause in rows:
            names.add(node)
            d = (ts - origin).total_seconds() / 86400.0
            if is_failure(kind, cause):
                fails.setdefault(node, []).append((d, cause_class(cause)))
            elif is_repair(kind):
                reps.setdefault(node, []).append(d)
        order = tuple(sorted(names))
        return cls(order,
                   {n: np.array([d for d, _ in fails.get(n, [])]) for n in order},
                   {n: [c for _, c in fails.get(n, [])] for n in order},
                   {n: np.array(reps.get(n, [])) for n in order}, origin)

    def day(self, ts: dt.datetime) -> float:
        return (ts - self.origin).total_seconds() / 86400.0


def features_at(h: History, t: float) -> np.ndarray:
    """(nodes, FEATURES) at day ``t``, from incidents at or before ``t`` only."""
    out = np.full((len(h.nodes), len(FEATURES)), np.nan)
    col = {f: i for i, f in enumerate(FEATURES)}
    for k, n in enumerate(h.nodes):
        ft = h.fail_t[n]
        ft = ft[ft <= t]
        rt = h.repair_t[n]
        rt = rt[rt <= t]
        for w in FAILURES_IN:
            out[k, col[f"failures_{int(w)}d"]] = np.count_nonzero(ft > t - w)
        out[k, col["failures_ever"]] = len(ft)
        for c in CLASSES:
            out[k, col[f"last_{c}"]] = 0.0
        if len(ft):
            last = ft[-1]
            out[k, col["days_since_failure"]] = t - last
            out[k, col[f"last_{h.fail_class[n][len(ft) - 1]}"]] = 1.0
            after = rt[rt >= last]
            out[k, col["in_repair"]] = 0.0 if len(after) else 1.0
            durations = [(rt[rt >= f][0] - f) * 24.0 for f in ft if (rt >= f).any()]
            if durations:
                if len(after):
                    out[k, col["last_repair_h"]] = durations[-1]
                out[k, col["median_repair_h"]] = float(np.median(durations))
        else:
            out[k, col["in_repair"]] = 0.0
        if len(rt):
            out[k, col["days_since_repair"]] = t - rt[-1]
    return out


def labels_at(h: History, t: float, horizon: float = HORIZON_DAYS) -> np.ndarray:
    """Per node: a failure in ``(t, t + horizon]``."""
    return np.array([bool(np.any((h.fail_t[n] > t) & (h.fail_t[n] <= t + horizon)))
                     for n in h.nodes])


def inputs(facts: np.ndarray, t: np.ndarray | float) -> np.ndarray:
    """The model's ``INPUTS`` from ``features_at`` rows at day(s) ``t`` since the record
    began (a span under ``MIN_SPAN_DAYS`` counts as that)."""
    span = np.maximum(np.asarray(t, dtype=np.float64), MIN_SPAN_DAYS) * np.ones(len(facts))
    since = facts[:, FEATURES.index("days_since_failure")]
    never = np.isnan(since)
    return np.column_stack([
        np.log1p(np.where(never, span, np.maximum(since, 0.0))), never.astype(np.float64),
        facts[:, FEATURES.index("failures_ever")] / span * 30.0])


def grid(h: History, t0: float, t1: float, step: float = 1.0
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(facts, y, t) over the times ``t0, t0 + step, ... <= t1`` for every node."""
    times = np.arange(t0, t1 + 1e-9, step)
    X = np.vstack([features_at(h, t) for t in times]) if len(times) else np.zeros(
        (0, len(FEATURES)))
    y = np.concatenate([labels_at(h, t) for t in times]) if len(times) else np.zeros(0, bool)
    return X, y, np.repeat(times, len(h.nodes))


@dataclass
class RecurrenceModel:
    """Logistic regression on ``INPUTS``: risk = sigmoid(intercept + coef · inputs)."""

    coef: np.ndarray
    intercept: float
    mean: np.ndarray  # of the inputs on the fit rows: contributions are relative to it
    meta: dict[str, Any]

    @property
    def model_id(self) -> str:
        text = json.dumps([np.round(self.coef, 10).tolist(), round(self.intercept, 10)])
        return "recurrence-" + hashlib.sha256(text.encode()).hexdigest()[:8]

    def predict(self, facts: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        z = self.intercept + inputs(facts, t) @ self.coef
        return 1.0 / (1.0 + np.exp(-z))

    def contributions(self, facts: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """Per row and input: coef × (input - its fit mean), in log-odds."""
        return (inputs(facts, t) - self.mean) * self.coef

    def to_json(self) -> str:
        return json.dumps({"format": 2, "inputs": list(INPUTS), "coef": self.coef.tolist(),
                           "intercept": self.intercept, "mean": self.mean.tolist(),
                           "meta": self.meta}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> RecurrenceModel:
        doc = json.loads(text)
        if doc.get("format") != 2 or doc.get("inputs") != list(INPUTS):
            raise ValueError("this recurrence model was written by another fleetcare version "
                             "(its inputs differ): rebuild it with `python -m "
                             "fleetcare.models.recurrence build --trace FILE`")
        return cls(np.asarray(doc["coef"], dtype=np.float64), float(doc["intercept"]),
                   np.asarray(doc["mean"], dtype=np.float64), doc["meta"])


def fit(facts: np.ndarray, y: np.ndarray, t: np.ndarray, meta: dict[str, Any] | None = None
        ) -> RecurrenceModel:
    from sklearn.linear_model import LogisticRegression

    if not y.any():
        raise ValueError("no failure follows any grid time: too little incident history "
                         "to fit a recurrence model")
    X = inputs(facts, t)
    lr = LogisticRegression(C=1.0, max_iter=5000).fit(X, y)
    return RecurrenceModel(lr.coef_[0].astype(np.float64), float(lr.intercept_[0]),
                           X.mean(axis=0), dict(meta or {}))


def baseline_score(facts: np.ndarray, t: np.ndarray | float = 0.0) -> np.ndarray:
    """"Most recent fault first": minus the days since the last failure; a node that never
    failed ranks last."""
    d = facts[:, FEATURES.index("days_since_failure")]
    return np.where(np.isnan(d), -1e9, -d)


# -- reasons -------------------------------------------------------------------------------------
def _ago(days: float) -> str:
    return f"{days * 24:.0f} h ago" if days < 2 else f"{days:.0f} days ago"


def reasons(x: np.ndarray, contrib: np.ndarray | None = None, top: int = 3) -> list[str]:
    """Plain words for one node's facts, what raised its risk most first (``contrib``: the
    model's ``contributions`` for the row)."""
    v = dict(zip(FEATURES, x.tolist(), strict=True))
    if not v["failures_ever"]:
        return ["no failure on record"]
    said: dict[str, str] = {}
    last = next((c for c in CLASSES if v[f"last_{c}"]), "unknown")
    said["days_since_failure"] = f"last failed {_ago(v['days_since_failure'])} ({last})"
    for w in (*FAILURES_IN, None):
        key = f"failures_{int(w)}d" if w else "failures_ever"
        n = int(v[key])
        if n >= 2:
            span = f"in the last {int(w)} days" if w else "on record"
            said.setdefault("failures", f"failed {n} times {span}")
            said[key] = said["failures"]
    if v["in_repair"]:
        said["in_repair"] = "in repair now (failed, no repair recorded since)"
    elif not np.isnan(v["days_since_repair"]):
        took = ("" if np.isnan(v["last_repair_h"])
                else f" after {v['last_repair_h']:.0f} h in repair")
        said["days_since_repair"] = f"repaired {_ago(v['days_since_repair'])}{took}"
    if not np.isnan(v["median_repair_h"]) and v["failures_ever"] >= 2:
        said["median_repair_h"] = f"its repairs take {v['median_repair_h']:.0f} h (median)"
    if contrib is None:
        order = list(said)
    else:  # recency first when it raised the risk more than frequency, else frequency
        rec, freq = float(contrib[0] + contrib[1]), float(contrib[2])
        first = ("days_since_failure",) if rec >= freq else tuple(
            k for k in said if k.startswith("failures"))
        order = [*[k for k in first if k in said], *[k for k in said if k not in first]]
    out: list[str] = []
    for k in order:
        if said[k] not in out:
            out.append(said[k])
    return out[:top]


# -- scoring a store -----------------------------------------------------------------------------
def load() -> RecurrenceModel:
    """The shipped model."""
    text = resources.files("fleetcare.models").joinpath(MODEL_FILE).read_text()
    return RecurrenceModel.from_json(text)


def store_history(store: Any, at: dt.datetime) -> History:
    """The store's incidents known at ``at`` (``ts <= at``)."""
    rows = store.cursor().execute(
        "SELECT ts, node, kind, cause FROM incidents WHERE ts <= ? ORDER BY ts, node",
        [at]).fetchall()
    rows = [(t if t.tzinfo else t.replace(tzinfo=dt.UTC), n, k, c) for t, n, k, c in rows]
    return History.of(rows)


def score(h: History, at: dt.datetime, model: RecurrenceModel, *, limit: int | None = None
          ) -> list[dict[str, Any]]:
    """Nodes ranked by ``risk_7d`` at ``at``, each with its reasons."""
    if not h.nodes:
        return []
    t = h.day(at)
    X = features_at(h, t)
    p = model.predict(X, t)
    C = model.contributions(X, t)
    order = np.lexsort((np.array(h.nodes, dtype=object), -p))
    if limit is not None:
        order = order[:limit]
    return [{"node": h.nodes[i], "risk_7d": round(float(p[i]), 4),
             "reasons": reasons(X[i], C[i])} for i in order]


# -- evaluation ----------------------------------------------------------------------------------
def evaluate(h: History, model_score: Any, t0: float, t1: float, *, alarms_per_day: int
             ) -> dict[str, Any]:
    """On the grid ``t0 .. t1 - HORIZON_DAYS`` (labels known before ``t1``): ROC-AUC over
    (node, day) rows, and per-failure recall when each day alarms on the
    ``alarms_per_day`` highest-ranked nodes (a failure is caught when its node was among
    them on one of the days in the 7 days before it), for the model and the baseline."""
    from sklearn.metrics import roc_auc_score

    X, y, t = grid(h, t0, t1 - HORIZON_DAYS)
    out: dict[str, Any] = {"rows": int(len(y)), "positive_rows": int(y.sum())}
    fails = [(n, f) for n in h.nodes for f in h.fail_t[n]
             if t0 < f <= t1 - HORIZON_DAYS + 1.0]
    out["failures"] = len(fails)
    nn = len(h.nodes)
    for name, s in (("model", model_score(X, t)),
                    ("most_recent_fault_first", baseline_score(X, t))):
        auc = float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else None
        top: set[tuple[str, float]] = set()
        for k in range(0, len(y), nn):
            day = s[k:k + nn]
            ranked = np.lexsort((np.arange(nn), -day))[:alarms_per_day]
            top |= {(h.nodes[i], float(t[k])) for i in ranked}
        caught = sum(1 for n, f in fails
                     if any((n, float(d)) in top for d in t[::nn] if f - HORIZON_DAYS <= d < f))
        out[name] = {"roc_auc": None if auc is None else round(auc, 4),
                     "recall_at_budget": round(caught / len(fails), 4) if fails else None,
                     "caught": caught}
    out["alarms_per_day"] = alarms_per_day
    out["roc_auc_difference_ci95"] = _paired_bootstrap(
        y, model_score(X, t), baseline_score(X, t), np.repeat(
            np.arange(nn)[None, :], len(y) // nn, axis=0).ravel() if nn else np.zeros(0, int))
    return out


def _paired_bootstrap(y: np.ndarray, a: np.ndarray, b: np.ndarray, node: np.ndarray,
                      rounds: int = 200, seed: int = 0) -> list[float] | None:
    """95 % interval of ROC-AUC(a) - ROC-AUC(b), resampling nodes (a node's days move
    together: they are not independent)."""
    from sklearn.metrics import roc_auc_score

    if not 0 < y.sum() < len(y):
        return None
    rng = np.random.default_rng(seed)
    nodes = np.unique(node)
    rows = [np.flatnonzero(node == n) for n in nodes]
    diffs = []
    for _ in range(rounds):
        idx = np.concatenate([rows[i] for i in rng.integers(0, len(nodes), len(nodes))])
        if 0 < y[idx].sum() < len(idx):
            diffs.append(roc_auc_score(y[idx], a[idx]) - roc_auc_score(y[idx], b[idx]))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


# -- the public trace ----------------------------------------------------------------------------
TRACE_ORIGIN = dt.datetime(2024, 3, 30, tzinfo=dt.UTC)
"""The trace's day 0 (its README: 348 days of faults starting on March 30, 2024)."""
TRACE_SERVERS = 400
"""Servers the trace was drawn from; only those with a fault appear in it."""


def trace_cause(fault_type: dict[str, str]) -> str:
    """fleetcare's cause for one of the trace's (Level, Class, Desc)."""
    cls, desc = fault_type.get("Class", ""), fault_type.get("Desc", "")
    level = fault_type.get("Level", "")
    if cls == "GPU":
        if "DBE" in desc:
            return "gpu_hbm3_memory"
        if "Temperature" in desc:
            return "gpu_thermal_interface_sensor"
        if "Silent Data Corruption" in desc:
            return "silent_data_corruption"
        return "faulty_gpu"
    return {"Parameter Plane Cable": "network_switch_cable", "NIC": "nic",
            "Power Supply": "power_supply", "Fan": "server_chassis",
            "Motherboard": "server_chassis", "Motherboard Battery": "server_chassis",
            "Riser Card": "io_expansion_board", "RAID Card": "ssd", "CPU": "cpu",
            "Unknown Error": "unknown", "System Crash": "unknown",
            }.get(cls, "software_bug" if level == "Software Failure" else "other")


def trace_incidents(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's events as incident rows (the CSV import's columns): a fault's start is
    a failure, its end the repair; the trace's own words go in the note."""
    out = []
    for e in events:
        ft = e["fault_type"]
        kind = {"fault_start": "failure", "fault_end": "repair"}[e["event_type"]]
        out.append({"ts": TRACE_ORIGIN + dt.timedelta(days=float(e["event_time"])),
                    "node": e["node_id"], "kind": kind, "cause": trace_cause(ft),
                    "note": f"{ft.get('Level', '')} / {ft.get('Class', '')} / "
                            f"{ft.get('Desc', '')}"})
    return out


def trace_history(events: Sequence[dict[str, Any]]) -> History:
    """The trace as a History of ``TRACE_SERVERS`` nodes (the never-faulty ones named
    ``quiet-NNN``: the trace lists only servers that had a fault)."""
    rows = [(r["ts"], r["node"], r["kind"], r["cause"]) for r in trace_incidents(events)]
    seen = {r[1] for r in rows}
    quiet = [f"quiet-{i:03d}" for i in range(max(0, TRACE_SERVERS - len(seen)))]
    return History.of(rows, nodes=quiet, origin=TRACE_ORIGIN)


FIT_FRACTION = 0.6
WARMUP_DAYS = 30.0
ALARMS_PER_DAY = 8
"""2 % of the trace's 400 servers flagged a day: the fixed alarm budget."""


def build(trace: Path) -> tuple[RecurrenceModel, dict[str, Any]]:
    """Fit on the trace's first ``FIT_FRACTION`` (labels inside it), report on the rest."""
    events = json.loads(Path(trace).read_text())
    h = trace_history(events)
    end = max(float(e["event_time"]) for e in events)
    split = end * FIT_FRACTION
    X, y, t_fit = grid(h, WARMUP_DAYS, split - HORIZON_DAYS)
    meta = {"data": "real: stepfun-ai/InfiniteHBD-Trace (Apache-2.0), 400 GPU servers, "
                    f"348 days; fit on days {WARMUP_DAYS:g}-{split:.0f} only",
            "fit_rows": int(len(y)), "fit_positive_rows": int(y.sum()),
            "horizon_days": HORIZON_DAYS, "split_day": round(split, 2)}
    model = fit(X, y, t_fit, meta)
    report = evaluate(h, model.predict, split, end, alarms_per_day=ALARMS_PER_DAY)
    model.meta["later_part"] = report
    return model, report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetcare.models.recurrence",
                                 description="Build the shipped recurrence model from the "
                                             "public InfiniteHBD fault trace.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fit on the trace's first 60 %%, report on the rest")
    b.add_argument("--trace", required=True, help="fault_trace.json of InfiniteHBD-Trace")
    b.add_argument("--out", default=None, help="folder to write to (default: the package)")
    args = ap.parse_args(argv)
    model, report = build(Path(args.trace))
    folder = Path(args.out) if args.out else Path(__file__).parent
    (folder / MODEL_FILE).write_text(model.to_json() + "\n")
    print(json.dumps({"model": model.model_id, "later_part": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
