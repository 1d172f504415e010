"""``DrainController``: decide from the latest node risks which nodes to drain or give
back, within the safety rails, and record every decision.

One ``run_once(now)``:

1. Reads the newest scoring run (``latest_node_scores``). Scores older than
   ``policy.max_score_age`` drain nothing (a stopped scorer must not act on old news).
2. Reviews every drain fleetcare holds (``drains`` table):
   - the scheduler shows it schedulable again, or drained with someone else's reason:
     someone took it over → ``forget`` (never resumed by us);
   - risk < ``resume_below`` **and** cleared (``clear(node)`` by an operator, or the
     ``health_check(node)`` callback returned True) → ``resume``;
   - cleared with ``force`` → ``resume`` whatever the risk (after a repair the model's
     multi-day windows still remember the old errors);
   - past its review time (``policy.review_after``, default 24 h) → ``escalate``: logged
     as a warning, audited, handed to ``on_escalate``, and reviewed again after another
     ``review_after`` — or, with ``policy.on_review="resume-if-low"``, resumed when its
     risk is below ``resume_below``. A drain is never left without someone being told.
3. Drains nodes whose risk makes ``CostModel.should_drain`` true, riskiest first (a
   repeat offender repaired in the last ``policy.post_repair_days`` is decided on the
   higher of its risk and its post-repair recurrence risk, ``offenders.post_repair_risks``;
   every decision about a repeat offender says so, with the suggestion: burn-in or RMA), but
   - never a node the scheduler shows as draining, drained, down or unknown (``skip``);
   - never more than the circuit breaker allows (``refuse``; see ``breaker``).

Dry-run (the default) asks the scheduler for states but changes nothing: no scheduler
command, no ``drains`` row. Every decision, dry or not, goes to ``drain_audit``; refusals
and skips are logged once per change (not every run).

Errors::

    ControllerError   (.node)   an operator request cannot be done (clear an unknown drain)
    DrainerError      (drainer) a scheduler call failed: audited as ``error: ...``
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetcare.api.drains.audit import AuditLog, AuditRow, Drain, naive_utc
from fleetcare.api.drains.breaker import BreakerPolicy, Budget, CircuitBreaker
from fleetcare.api.drains.drainer import (
    DRAINED,
    DRAINING,
    Drainer,
    DrainerError,
    NodeState,
    drain_reason,
)
from fleetcare.models import offenders as _offenders
from fleetcare.models.goodput import CostModel
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

ON_REVIEW = ("escalate", "resume-if-low")


class ControllerError(Exception):
    def __init__(self, node: str, message: str) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class DrainPolicy:
    """``resume_below`` None = half the cost model's break-even risk (hysteresis)."""

    resume_below: float | None = None
    review_after: dt.timedelta = dt.timedelta(hours=24)
    on_review: str = "escalate"
    max_score_age: dt.timedelta = dt.timedelta(hours=2)
    actor: str = "fleetcare"
    post_repair_days: float = _offenders.POST_REPAIR_DAYS
    risk_horizon_h: float = _offenders.DECISION_HORIZON_H

    def __post_init__(self) -> None:
        if self.on_review not in ON_REVIEW:
            raise ValueError(f"on_review={self.on_review!r} is invalid: expected one of "
                             f"{', '.join(ON_REVIEW)}.")
        if self.resume_below is not None and not 0.0 <= self.resume_below <= 1.0:
            raise ValueError(f"resume_below={self.resume_below!r} is invalid: expected a "
                             "probability in [0, 1].")
        if self.review_after <= dt.timedelta(0):
            raise ValueError(f"review_after={self.review_after} is invalid: expected > 0.")
        if not self.post_repair_days >= 0:
            raise ValueError(f"post_repair_days={self.post_repair_days!r} is invalid: "
                             "expected days >= 0.")
        if not self.risk_horizon_h > 0:
            raise ValueError(f"risk_horizon_h={self.risk_horizon_h!r} is invalid: expected "
                             "hours > 0 (the scoring model's horizon).")


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    action: str  # drain, resume, refuse, skip, clear, escalate, forget, hold
    risk: float | None
    reason: str  # why (the scheduler reason for drains)
    result: str  # ok, dry-run, refused: ..., error: ..., held: ...
    actor: str = "fleetcare"
    saving_gpu_h: float | None = None
    repeat_offender: _offenders.Offender | None = None
    post_repair_risk: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "action": self.action,
                "risk": None if self.risk is None else round(self.risk, 4),
                "expected_saving_gpu_h": (None if self.saving_gpu_h is None
                                          else round(self.saving_gpu_h, 1)),
                "reason": self.reason, "result": self.result, "actor": self.actor,
                "repeat_offender": (None if self.repeat_offender is None
                                    else self.repeat_offender.to_json()),
                "post_repair_risk": (None if self.post_repair_risk is None
                                     else round(self.post_repair_risk, 4))}


@dataclass(frozen=True)
class RunReport:
    ts: dt.datetime
    dry_run: bool
    scheduler: str
    fleet_size: int
    scores_ts: dt.datetime | None
    break_even_risk: float
    resume_below: float
    budget: Budget
    decisions: list[Decision] = field(default_factory=list)

    def by_action(self, action: str) -> list[str]:
        return [d.node for d in self.decisions if d.action == action]

    def to_json(self) -> dict[str, Any]:
        return {"ts": self.ts.isoformat() + "Z", "dry_run": self.dry_run,
                "scheduler": self.scheduler, "fleet_size": self.fleet_size,
                "scores_ts": self.scores_ts.isoformat() + "Z" if self.scores_ts else None,
                "break_even_risk": round(self.break_even_risk, 6),
                "resume_below": round(self.resume_below, 6),
                "breaker": {"limit_per_window": self.budget.limit,
                            "used_before_run": self.budget.used},
                "decisions": [d.to_json() for d in self.decisions]}


def _latest_scores(store: Store) -> tuple[dt.datetime | None, dict[str, tuple[float, list[str]]]]:
    from fleetcare.models.scoring import latest_node_scores

    out: dict[str, tuple[float, list[str]]] = {}
    ts = None
    for r in latest_node_scores(store).to_pylist():
        reasons = json.loads(r["reasons"]) if isinstance(r["reasons"], str) else r["reasons"]
        out[str(r["node"])] = (float(r["risk"]), [str(x) for x in reasons or []])
        ts = r["ts"] if ts is None or r["ts"] > ts else ts
    return ts, out


class DrainController:
    """Drains risky nodes through ``drainer``; dry-run unless ``dry_run=False``."""

    def __init__(self, store: Store, drainer: Drainer, cost_model: CostModel | None = None, *,
                 policy: DrainPolicy | None = None, breaker: BreakerPolicy | None = None,
                 dry_run: bool = True, health_check: Callable[[str], bool] | None = None,
                 on_escalate: Callable[[Decision], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.drainer = drainer
        self.cost = cost_model or CostModel()
        self.policy = policy or DrainPolicy()
        self.audit = AuditLog(store)
        self.breaker = CircuitBreaker(self.audit, breaker)
        self.dry_run = dry_run
        self.health_check = health_check
        self.on_escalate = on_escalate
        self.clock = clock
        self._recurrence: Any = None  # the shipped recurrence model, read once
        # the service loop's run_once and an operator's clear (API thread) take turns
        self._lock = threading.RLock()

    @property
    def resume_below(self) -> float:
        if self.policy.resume_below is not None:
            return self.policy.resume_below
        return self.cost.break_even_risk() / 2

    def _now(self, now: dt.datetime | None) -> dt.datetime:
        if now is None:
            return dt.datetime.fromtimestamp(self.clock(), dt.UTC).replace(tzinfo=None)
        return naive_utc(now)

    def _log(self, now: dt.datetime, d: Decision, *, dedupe: bool = False) -> Decision:
        self.audit.record(AuditRow(now, d.node, d.action, d.actor, d.reason, d.risk,
                                   self.dry_run, d.result), dedupe=dedupe)
        level = logging.WARNING if d.action in ("escalate", "refuse") else logging.INFO
        log.log(level, "drain.%s node=%s risk=%s result=%r dry_run=%s%s", d.action, d.node,
                d.risk, d.result, self.dry_run,
                "" if d.repeat_offender is None else
                f" repeat_offender={d.repeat_offender.failures}"
                f" suggestion={d.repeat_offender.suggestion!r}")
        return d

    def repeat_offenders(self, now: dt.datetime) -> dict[str, _offenders.Offender]:
        """``offenders.repeat_offenders`` at ``now``; none (logged) when it cannot be read:
        a broken incident history never stops draining."""
        try:
            if self._recurrence is None:
                from fleetcare.models import recurrence

                self._recurrence = recurrence.load()
            return {o.node: o for o in _offenders.repeat_offenders(
                self.store, now, model=self._recurrence)}
        except Exception:
            log.exception("drain.repeat_offenders_failed")
            return {}

    # -- the loop --------------------------------------------------------------------------
    def run_once(self, now: dt.datetime | None = None) -> RunReport:
        """One decision round at ``now`` (default: the clock). Never raises for one node's
        scheduler error: it is audited as ``error: ...`` and the round goes on."""
        with self._lock:
            return self._run_once(self._now(now))

    def _run_once(self, now: dt.datetime) -> RunReport:
        scores_ts, scores = _latest_scores(self.store)
        budget = self.breaker.budget(now, len(scores))
        decisions: list[Decision] = []
        active = self.audit.active()
        for node, held in active.items():
            d = self._review(node, held, scores.get(node, (None, []))[0], now)
            if d is not None:
                decisions.append(d)

        stale = scores_ts is not None and now - scores_ts > self.policy.max_score_age
        left = budget.left
        repeat = self.repeat_offenders(now)
        post = _offenders.post_repair_risks(
            list(repeat.values()), now, horizon_h=self.policy.risk_horizon_h,
            within_days=self.policy.post_repair_days)
        candidates = sorted(
            ((self.cost.decision_risk(r, post.get(n)), r, n) for n, (r, _) in scores.items()
             if n not in active and self.cost.should_drain(r, post_repair_risk=post.get(n))),
            key=lambda drn: (-drn[0], drn[2]))
        for decision_risk, risk, node in candidates:
            offender = repeat.get(node)
            said = scores[node][1]
            if offender is not None:
                said = [_offender_reason(offender, post.get(node)), *said]
            reason = drain_reason(risk, said)
            saving = self.cost.expected_saving_gpu_h(decision_risk)

            def decide(action: str, result: str, _n: str = node, _r: float = risk,
                       _why: str = reason, _s: float = saving,
                       _o: _offenders.Offender | None = offender,
                       _p: float | None = post.get(node)) -> Decision:
                return Decision(_n, action, _r, _why, result, self.policy.actor, _s, _o, _p)

            if stale:
                decisions.append(self._log(now, decide(
                    "refuse", f"refused: scores from {scores_ts} are older than "
                              f"{self.policy.max_score_age}; is the scorer running?"), dedupe=True))
                continue
            try:
                state = self.drainer.state(node)
            except DrainerError as exc:
                decisions.append(self._log(now, decide("skip", f"error: {exc}"), dedupe=True))
                continue
            if not state.schedulable:
                decisions.append(self._log(now, decide("skip", _not_schedulable(state)),
                                           dedupe=True))
                continue
            if left <= 0:
                decisions.append(self._log(now, decide(
                    "refuse", f"refused: circuit breaker: {budget.limit} drain(s) per "
                              f"{_fmt(self.breaker.policy.window)} for a fleet of "
                              f"{len(scores)} nodes, {budget.limit - left} used"), dedupe=True))
                continue
            d = self._log(now, self._drain(node, risk, reason, now, decide))
            if not d.result.startswith("error"):  # a failed drain uses no budget
                left -= 1
            decisions.append(d)
        return RunReport(now, self.dry_run, self.drainer.name, len(scores), scores_ts,
                         self.cost.break_even_risk(), self.resume_below, budget, decisions)

    def _drain(self, node: str, risk: float, reason: str,
               now: dt.datetime, decide: Callable[[str, str], Decision]) -> Decision:
        if self.dry_run:
            return decide("drain", "dry-run")
        try:
            self.drainer.drain(node, reason)
        except DrainerError as exc:
            return decide("drain", f"error: {exc}")
        self.audit.add(Drain(node, now, now + self.policy.review_after, risk, reason,
                             self.drainer.name, None, None))
        return decide("drain", "ok")

    def _review(self, node: str, held: Drain, risk: float | None,
                now: dt.datetime) -> Decision | None:
        actor = self.policy.actor
        try:
            state = self.drainer.state(node)
        except DrainerError as exc:
            return self._log(now, Decision(node, "hold", risk, "cannot read the scheduler",
                                           f"error: {exc}", actor), dedupe=True)
        taken_over = (state.state in (DRAINED, DRAINING) and state.reason is not None
                      and not state.by_fleetcare)
        if state.schedulable or taken_over:
            why = ("the scheduler shows it " + state.state if state.schedulable else
                   f"drained again with someone else's reason: {state.reason}")
            if not self.dry_run:
                self.audit.close(node, now, "external")
            return self._log(now, Decision(node, "forget", risk, why,
                                           "dry-run" if self.dry_run else "ok", actor))
        cleared_by = held.cleared_by
        if cleared_by is None and self.health_check is not None:
            try:
                if self.health_check(node):
                    cleared_by = "health-check"
                    self._log(now, Decision(node, "clear", risk, "health check passed",
                                            "ok", "health-check"), dedupe=True)
                    if not self.dry_run:
                        self.audit.clear(node, now, cleared_by)
            except Exception:  # a broken health check never resumes a node
                log.exception("drain.health_check_failed node=%s", node)
        low = risk is not None and risk < self.resume_below
        forced = bool(cleared_by and cleared_by.endswith("(force)"))
        risk_txt = "no current score" if risk is None else f"risk {risk:.3f}"
        if cleared_by and (low or forced):
            why = (f"cleared by {cleared_by}; {risk_txt}"
                   + ("" if forced else f" < resume threshold {self.resume_below:.3f}"))
            return self._log(now, self._resume(node, risk, why, cleared_by, now))
        if now >= held.review_at:
            if self.policy.on_review == "resume-if-low" and low:
                why = (f"review time passed; {risk_txt} < resume threshold "
                       f"{self.resume_below:.3f}")
                return self._log(now, self._resume(node, risk, why, f"{actor}:review", now))
            why = (f"drained since {held.drained_at:%Y-%m-%d %H:%M} UTC, review was due "
                   f"{held.review_at:%Y-%m-%d %H:%M}; {risk_txt}; "
                   + (f"cleared by {cleared_by} but risk is not below "
                      f"{self.resume_below:.3f}" if cleared_by else
                      "not cleared: inspect it, then `fleetcare drain clear "
                      f"{node}` (--force to resume whatever the risk)"))
            d = self._log(now, Decision(node, "escalate", risk, why,
                                        "dry-run" if self.dry_run else "ok", actor))
            if not self.dry_run:
                self.audit.review_later(node, now + self.policy.review_after)
                if self.on_escalate is not None:
                    try:
                        self.on_escalate(d)
                    except Exception:
                        log.exception("drain.on_escalate_failed node=%s", node)
            return d
        why = (f"cleared by {cleared_by} but {risk_txt} is not below "
               f"{self.resume_below:.3f}" if cleared_by else
               f"{risk_txt}; waiting for `fleetcare drain clear {node}` or a health check")
        return Decision(node, "hold", risk, why, f"held until {held.review_at:%Y-%m-%d %H:%M}",
                        actor)

    def _resume(self, node: str, risk: float | None, why: str, actor: str,
                now: dt.datetime) -> Decision:
        if self.dry_run:
            return Decision(node, "resume", risk, why, "dry-run", actor)
        try:
            self.drainer.resume(node, why)
        except DrainerError as exc:
            return Decision(node, "resume", risk, why, f"error: {exc}", actor)
        self.audit.close(node, now, actor)
        return Decision(node, "resume", risk, why, "ok", actor)

    # -- operators -----------------------------------------------------------------------------
    def clear(self, node: str, *, actor: str, note: str = "", force: bool = False,
              now: dt.datetime | None = None) -> list[Decision]:
        """An operator clears a drained node: it is resumed now when its risk is below
        ``resume_below`` (or with ``force``), else at a later run once it is. Recorded
        even in dry-run (it changes no scheduler); the resume itself obeys dry-run."""
        with self._lock:
            return self._clear(node, actor=actor, note=note, force=force, now=self._now(now))

    def _clear(self, node: str, *, actor: str, note: str, force: bool, now: dt.datetime
               ) -> list[Decision]:
        held = self.audit.active().get(node)
        if held is None:
            raise ControllerError(node, f"{node} is not drained by fleetcare, nothing to clear "
                                        f"(see `fleetcare drain audit --node {node}`)")
        by = f"{actor} (force)" if force else actor
        self.audit.clear(node, now, by)
        _, scores = _latest_scores(self.store)
        risk = scores.get(node, (None, []))[0]
        out = [self._log(now, Decision(node, "clear", risk, note or "cleared by an operator",
                                       "ok", by))]
        d = self._review(node, Drain(held.node, held.drained_at, held.review_at, held.risk,
                                     held.reason, held.scheduler, now, by), risk, now)
        if d is not None:
            out.append(d)
        return out


def _offender_reason(o: _offenders.Offender, post: float | None) -> str:
    """The repeat-offender part of a drain reason (short: scheduler reasons are 200 chars)."""
    back = f", post-repair risk {post:.2f}" if post is not None else ""
    return (f"repeat offender ({o.failures} failures in {o.window_days} d{back}): "
            f"{o.suggestion}")


def _not_schedulable(state: NodeState) -> str:
    why = f"refused: node is {state.state} in the scheduler ({state.raw or '?'})"
    if state.reason:
        why += f", reason: {state.reason}"
    return why


def _fmt(td: dt.timedelta) -> str:
    s = int(td.total_seconds())
    return f"{s // 3600} h" if s % 3600 == 0 else f"{s // 60} min"
