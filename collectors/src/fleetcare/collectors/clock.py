"""Clocks to inject: the real one is ``time.time``; these drive time by hand.

``ManualClock`` replays simulated time as fast as the machine allows (``fleetcare demo
--once``, tests); ``ScaledClock`` runs simulated time from ``origin`` at ``speed`` x the
wall clock (the live demo).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ManualClock:
    """Time that moves only when someone sleeps on it."""

    def __init__(self, t: float) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class ScaledClock:
    def __init__(self, origin: float, *, speed: float = 1.0,
                 wall: Callable[[], float] = time.monotonic) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.origin = origin
        self.speed = speed
        self.wall = wall
        self._wall0 = wall()

    def __call__(self) -> float:
        return self.origin + (self.wall() - self._wall0) * self.speed

    def wall_seconds(self, sim_seconds: float) -> float:
        return sim_seconds / self.speed
