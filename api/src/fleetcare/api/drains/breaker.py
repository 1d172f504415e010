"""The circuit breaker: at most so many real drains per hour, whatever the model says.

A model or data bug (a bad rollout, a broken collector on every node) can make the
whole fleet look risky at once; draining it would do more harm than any GPU failure.
The breaker caps real drains in a sliding window (default: one hour) at

    limit = min(max_nodes, floor(max_fraction * fleet_size)), but at least min_nodes

(defaults 10 nodes, 5 % of the fleet, at least 1). Candidates beyond the limit are
refused and audited, never drained. The breaker's state is the audit log itself
(``drain_audit`` rows with action ``drain``, result ``ok``, not dry-run), so it
survives restarts of fleetcare: restarting cannot reset the budget.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from fleetcare.api.drains.audit import AuditLog


class BreakerError(ValueError):
    """A breaker setting is out of range; ``name`` and ``value`` say which."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(f"breaker {name}={value!r} is invalid: expected {expected}.")
        self.name = name
        self.value = value


@dataclass(frozen=True)
class BreakerPolicy:
    max_fraction: float = 0.05
    max_nodes: int = 10
    min_nodes: int = 1
    window: dt.timedelta = dt.timedelta(hours=1)

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_fraction <= 1.0:
            raise BreakerError("max_fraction", self.max_fraction, "a fraction in [0, 1]")
        if self.max_nodes < 0:
            raise BreakerError("max_nodes", self.max_nodes, "an integer >= 0")
        if self.min_nodes < 0:
            raise BreakerError("min_nodes", self.min_nodes, "an integer >= 0")
        if self.window <= dt.timedelta(0):
            raise BreakerError("window", self.window, "a positive duration")

    def limit(self, fleet_size: int) -> int:
        """Drains allowed per window for a fleet of ``fleet_size`` nodes."""
        by_fraction = math.floor(self.max_fraction * max(fleet_size, 0) + 1e-9)
        return min(self.max_nodes, max(self.min_nodes, by_fraction))


@dataclass(frozen=True, slots=True)
class Budget:
    limit: int
    used: int  # real drains in the window before this run

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


class CircuitBreaker:
    """Counts real drains in the window; ``budget(now, fleet_size)`` says how many are left."""

    def __init__(self, audit: AuditLog, policy: BreakerPolicy | None = None) -> None:
        self.audit = audit
        self.policy = policy or BreakerPolicy()

    def budget(self, now: dt.datetime, fleet_size: int) -> Budget:
        used = self.audit.executed_drains_since(now - self.policy.window)
        return Budget(self.policy.limit(fleet_size), used)
