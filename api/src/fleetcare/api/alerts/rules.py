"""The alert rule: risk >= threshold for N minutes fires; risk < resolve_threshold for M
minutes resolves. A pure state machine over scoring runs, no database, no clock.

One alert per node at a time (deduplicated): its life is

    (none) --risk>=threshold--> pending --still >= threshold for `for_s`--> firing
    pending --risk < threshold, or node missing from the run--> (dropped: never notified)
    firing --risk < resolve_threshold for `resolve_for_s`--> resolved
    firing --risk back >= resolve_threshold--> firing (the resolve clock restarts)

``for_s`` is measured between scoring-run timestamps: with runs every minute and
``for_s = 300`` an alert fires in the sixth consecutive run at or above the threshold.
A firing node missing from a run stays firing: a node that stopped reporting may be the
node that crashed, so silence never resolves an alert.

With ``network`` set (an operating point with a threshold of its own on the network
head's probability, as the fleet prior's: ``network_head.alarm_risk``), a node whose
``p_net`` reaches it counts as at the threshold (``level``): it pends, fires after
``for_s`` as a node at the threshold would; its alert keeps the node's own risk. The
network side has the risk side's hysteresis: a firing alert the network raised (its risk
never reached the threshold) whose ``p_net`` stays at or above ``network *
resolve_threshold / threshold`` counts as at ``resolve_threshold``, so a probability
hovering at the threshold does not fire and resolve by turns. A run without the node's
network probability (its ports stopped reporting) keeps the last one: silence never
resolves an alert.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Literal

State = Literal["pending", "firing", "resolved"]
Change = Literal["pending", "dropped", "firing", "resolved", "updated", "none"]


@dataclass(frozen=True)
class Score:
    """One node's row of one scoring run (``node_scores``)."""

    ts: dt.datetime                     # naive UTC, the scoring time
    node: str
    risk: float
    reasons: tuple[str, ...] = ()
    top_gpu_uuid: str | None = None
    model_id: str | None = None
    p_net: float | None = None
    """The network head's probability of a network failure of the node (None: the model
    has no head, the node reports no InfiniBand port, or the rule has no ``network``
    threshold, so the engine does not read it)."""


@dataclass(frozen=True)
class Alert:
    """A row of the ``alerts`` table. Times are naive UTC (DuckDB TIMESTAMP)."""

    id: str
    node: str
    state: State
    risk: float
    started_at: dt.datetime
    fired_at: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    reasons: tuple[str, ...] = ()
    updated_at: dt.datetime | None = None
    resolving_since: dt.datetime | None = None
    peak_risk: float = 0.0
    top_gpu_uuid: str | None = None
    model_id: str | None = None
    p_net: float | None = None
    """The latest run's network probability of the node (``Score.p_net``)."""


def alert_id(node: str, started_at: dt.datetime) -> str:
    """Stable and readable: ``gpu017@20260301T120000Z``."""
    return f"{node}@{started_at:%Y%m%dT%H%M%SZ}"


@dataclass(frozen=True)
class Rule:
    threshold: float = 0.5
    for_s: float = 600.0
    resolve_threshold: float = 0.3
    resolve_for_s: float = 900.0
    immediate: float | None = None
    """A risk this high fires at once, without waiting ``for_s`` (None: none does)."""
    network: float | None = None
    """A network probability this high counts as the threshold (None: only the risk
    counts; ``level``)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.resolve_threshold <= self.threshold:
            raise ValueError(f"resolve_threshold {self.resolve_threshold} must be between 0 "
                             f"and threshold {self.threshold} (hysteresis)")
        if self.immediate is not None and self.immediate < self.threshold:
            raise ValueError(f"immediate threshold {self.immediate} must be at least the "
                             f"threshold {self.threshold}")
        if self.for_s < 0 or self.resolve_for_s < 0:
            raise ValueError("for_s and resolve_for_s must be >= 0")
        if self.network is not None and not 0.0 < self.network <= 1.0:
            raise ValueError(f"network threshold {self.network} must be in (0, 1]")

    def lifted(self, score: Score) -> bool:
        """Whether the node's network probability alone reaches ``network``."""
        return (self.network is not None and score.p_net is not None
                and score.p_net >= self.network)

    def level_of(self, risk: float, p_net: float | None, *, band: bool = False) -> float:
        """What the rule compares with its thresholds: ``risk``, raised to the threshold
        where ``p_net`` reaches ``network``, and with ``band`` (a firing alert the network
        raised) to ``resolve_threshold`` where it reaches the network side's resolve
        level (hysteresis)."""
        if self.network is None or p_net is None:
            return risk
        if p_net >= self.network:
            return max(risk, self.threshold)
        ratio = self.resolve_threshold / self.threshold if self.threshold > 0 else 1.0
        if band and p_net >= self.network * ratio:
            return max(risk, self.resolve_threshold)
        return risk

    def raised_by_network(self, alert: Alert) -> bool:
        """A firing alert whose risk never reached the threshold: the network raised it."""
        return (self.network is not None and alert.state == "firing"
                and alert.peak_risk < self.threshold)

    def alert_level(self, alert: Alert) -> float:
        """The level of an alert's latest run (``level_of``, with its band)."""
        return self.level_of(alert.risk, alert.p_net, band=self.raised_by_network(alert))

    def level(self, score: Score, alert: Alert | None = None) -> float:
        """``level_of`` a node's score, with the band when its ``alert`` has one."""
        band = alert is not None and self.raised_by_network(alert)
        return self.level_of(score.risk, score.p_net, band=band)

    def step(self, alert: Alert | None, score: Score | None,
             ts: dt.datetime) -> tuple[Alert | None, Change]:
        """Apply one scoring run (at ``ts``) to a node's open alert (or None).

        ``score`` is the node's row in that run, None when the node is missing from it.
        Returns the new alert (None: no open alert) and what changed."""
        if alert is None or alert.state == "resolved":
            if score is None or self.level(score) < self.threshold:
                return None, "none"
            new = Alert(id=alert_id(score.node, ts), node=score.node, state="pending",
                        risk=score.risk, started_at=ts, reasons=score.reasons, updated_at=ts,
                        peak_risk=score.risk, top_gpu_uuid=score.top_gpu_uuid,
                        model_id=score.model_id, p_net=score.p_net)
            return self._maybe_fire(new, ts)
        if alert.state == "pending":
            if score is None or self.level(score) < self.threshold:
                return None, "dropped"
            return self._maybe_fire(self._observe(alert, score, ts), ts)
        # firing
        if score is None:
            return alert, "none"
        seen = self._observe(alert, score, ts)
        if self.level(self._with_last_p_net(score, alert), alert) >= self.resolve_threshold:
            return replace(seen, resolving_since=None), "updated"
        since = alert.resolving_since or ts
        seen = replace(seen, resolving_since=since)
        if (ts - since).total_seconds() >= self.resolve_for_s:
            return replace(seen, state="resolved", resolved_at=ts), "resolved"
        return seen, "updated"

    @staticmethod
    def _with_last_p_net(score: Score, alert: Alert) -> Score:
        """The score, with the alert's last network probability when this run has none."""
        return score if score.p_net is not None else replace(score, p_net=alert.p_net)

    def _observe(self, alert: Alert, score: Score, ts: dt.datetime) -> Alert:
        score = self._with_last_p_net(score, alert)
        # while firing, keep the reasons that made it fire unless risk is still high
        keep_reasons = alert.state == "firing" and self.level(score) < self.threshold
        return replace(alert, risk=score.risk, updated_at=ts,
                       peak_risk=max(alert.peak_risk, score.risk),
                       reasons=alert.reasons if keep_reasons else score.reasons,
                       top_gpu_uuid=score.top_gpu_uuid or alert.top_gpu_uuid,
                       model_id=score.model_id or alert.model_id, p_net=score.p_net)

    def _maybe_fire(self, alert: Alert, ts: dt.datetime) -> tuple[Alert, Change]:
        if ((ts - alert.started_at).total_seconds() >= self.for_s
                or (self.immediate is not None
                    and self.alert_level(alert) >= self.immediate)):
            return replace(alert, state="firing", fired_at=ts), "firing"
        return alert, "pending" if alert.updated_at == alert.started_at else "updated"
