"""Repeat offenders (issue 16 §3): nodes that failed ``failures`` times or more within
``days`` days, with what to do about them, for the drain controller, the dashboard and the
API (one meaning, here).

A failure is what the recurrence model counts (``recurrence.History``): an incident of
kind ``failure`` whose cause is not ``planned_maintenance``. For each offender:
its failures in the window, the last one's time, cause and GPU, whether a repair or RMA
was recorded since, the recurrence model's ``risk_7d`` and reasons, and a suggestion:

- ``RMA_GPU`` ("RMA / replace the GPU") when two failures in the window blame the same GPU
  (``gpu_uuid``), or the node failed ``RMA_AFTER`` (3) times or more in it;
- ``BURN_IN`` ("burn-in before large jobs") otherwise: the second failure.

``post_repair_risk`` turns ``risk_7d`` into a risk over another horizon, for the goodput
decision on a repaired node (``CostModel.should_drain_after_repair``).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fleetcare.models import recurrence

BURN_IN = "burn-in before large jobs"
RMA_GPU = "RMA / replace the GPU"
RMA_AFTER = 3
"""Failures in the window at which a node is sent for RMA whatever GPU they blamed."""
POST_REPAIR_DAYS = 14.0
"""A repeat offender repaired this recently is decided on its post-repair risk."""
DECISION_HORIZON_H = 24.0
"""The main model's horizon (``dataset``'s default ``horizon_h``): the post-repair risk
is scaled to it."""


@dataclass(frozen=True)
class Offender:
    node: str
    failures: int  # in the window
    window_days: int
    last_failure_ts: dt.datetime  # UTC
    last_cause: str
    last_gpu_uuid: str | None
    repaired_since: bool  # a repair or RMA recorded after the last failure
    repaired_at: dt.datetime | None  # that repair's time
    risk_7d: float | None  # the recurrence model's; None without a model
    reasons: tuple[str, ...]
    suggestion: str  # BURN_IN or RMA_GPU
    why: str  # why that suggestion, in plain words

    def line(self) -> str:
        """One line for a log, an audit reason or a page."""
        risk = "" if self.risk_7d is None else f", recurrence risk {self.risk_7d:.0%} in 7 d"
        return (f"repeat offender: {self.failures} failures in {self.window_days} days"
                f"{risk}; suggest {self.suggestion} ({self.why})")

    def to_json(self) -> dict[str, Any]:
        def iso(ts: dt.datetime | None) -> str | None:
            return None if ts is None else ts.replace(tzinfo=None).isoformat() + "Z"

        return {"node": self.node, "failures": self.failures, "window_days": self.window_days,
                "last_failure_ts": iso(self.last_failure_ts), "last_cause": self.last_cause,
                "last_gpu_uuid": self.last_gpu_uuid, "repaired_since": self.repaired_since,
                "repaired_at": iso(self.repaired_at), "risk_7d": self.risk_7d,
                "reasons": list(self.reasons), "suggestion": self.suggestion, "why": self.why}


def _utc(ts: dt.datetime) -> dt.datetime:
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def suggest(failures: int, gpus: list[str | None]) -> tuple[str, str]:
    """(suggestion, why) for ``failures`` in the window whose blamed GPUs are ``gpus``."""
    blamed = Counter(g for g in gpus if g)
    if blamed:
        gpu, n = blamed.most_common(1)[0]
        if n >= 2:
            return RMA_GPU, f"{n} failures blamed GPU {gpu}"
    if failures >= RMA_AFTER:
        return RMA_GPU, f"{failures} failures in the window"
    return BURN_IN, f"failed again ({failures} failures in the window)"


def repeat_offenders(store: Any, at: dt.datetime, *, failures: int = 2, days: int = 30,
                     model: recurrence.RecurrenceModel | None = None,
                     use_model: bool = True) -> list[Offender]:
    """Nodes with ``failures`` or more failures in ``(at - days, at]``, most failures first,
    then highest recurrence risk, then name. ``model`` default: the shipped one
    (``use_model=False``: no risk, no reasons). Reads only incidents known at ``at``."""
    if failures < 1 or days <= 0:
        raise ValueError(f"failures={failures!r}, days={days!r} are invalid: expected "
                         "failures >= 1 and days > 0.")
    at = _utc(at)
    naive = at.replace(tzinfo=None)
    cur = store.cursor()
    try:
        if not cur.execute("SELECT count(*) FROM information_schema.tables "
                           "WHERE table_name = 'incidents'").fetchone()[0]:
            return []
        rows = cur.execute(
            "SELECT ts, node, kind, cause, gpu_uuid FROM incidents WHERE ts <= ? "
            "ORDER BY ts, node", [naive]).fetchall()
    finally:
        cur.close()
    if not rows:
        return []
    since = at - dt.timedelta(days=days)
    fails: dict[str, list[tuple[dt.datetime, str, str | None]]] = {}
    repairs: dict[str, list[dt.datetime]] = {}
    for ts, node, kind, cause, gpu in rows:
        ts = _utc(ts)
        if recurrence.is_failure(kind, cause):
            fails.setdefault(node, []).append((ts, cause, gpu))
        elif recurrence.is_repair(kind):
            repairs.setdefault(node, []).append(ts)
    picked = {n: [f for f in fs if f[0] > since] for n, fs in fails.items()}
    picked = {n: fs for n, fs in picked.items() if len(fs) >= failures}
    if not picked:
        return []
    scored: dict[str, dict[str, Any]] = {}
    if use_model:
        # the offenders' own history, on the store's time origin: each node's facts are
        # its own, so this equals scoring the whole history (tests check it)
        origin = _utc(rows[0][0])
        h = recurrence.History.of(
            [(_utc(t), n, k, c) for t, n, k, c, _ in rows if n in picked], origin=origin)
        scored = {s["node"]: s for s in recurrence.score(h, at, model or recurrence.load())}
    out = []
    for node, fs in picked.items():
        last_ts, last_cause, last_gpu = fs[-1]
        after = [r for r in repairs.get(node, []) if r >= last_ts]
        suggestion, why = suggest(len(fs), [g for _, _, g in fs])
        s = scored.get(node)
        out.append(Offender(node, len(fs), days, last_ts, last_cause, last_gpu, bool(after),
                            after[-1] if after else None, s["risk_7d"] if s else None,
                            tuple(s["reasons"]) if s else (), suggestion, why))
    out.sort(key=lambda o: (-o.failures, -(o.risk_7d or 0.0), o.node))
    return out


def post_repair_risks(found: list[Offender], now: dt.datetime, *,
                      horizon_h: float = DECISION_HORIZON_H,
                      within_days: float = POST_REPAIR_DAYS) -> dict[str, float]:
    """Per repeat offender repaired in the last ``within_days`` days (and not failed since):
    its recurrence risk over ``horizon_h`` hours, for ``CostModel.should_drain``."""
    now = _utc(now)
    return {o.node: post_repair_risk(o.risk_7d, horizon_h) for o in found
            if o.risk_7d is not None and o.repaired_at is not None
            and now - o.repaired_at <= dt.timedelta(days=within_days)}


def post_repair_risk(risk_7d: float, horizon_h: float) -> float:
    """``risk_7d`` (probability of a failure within 7 days) as the probability within
    ``horizon_h`` hours, at a constant hazard: ``1 - (1 - risk_7d) ** (h / 168)``."""
    if not 0.0 <= risk_7d <= 1.0 or horizon_h <= 0:
        raise ValueError(f"risk_7d={risk_7d!r}, horizon_h={horizon_h!r} are invalid: "
                         "expected a probability and hours > 0.")
    return 1.0 - (1.0 - risk_7d) ** (horizon_h / (recurrence.HORIZON_DAYS * 24.0))
