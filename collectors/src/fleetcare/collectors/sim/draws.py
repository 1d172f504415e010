"""The simulator's fleet-wide draws: each GPU's fixed traits and each day's benign events.

Both are functions of the fleet (``FleetSpec``'s seed and size) alone, drawn for every
GPU of the fleet and then read by each ``Group`` for its own GPUs (that is what keeps a
GPU's values the same whichever nodes are simulated together). ``FleetDraws`` makes
them once per simulator, so the groups of a mixed fleet and every ``history`` share
them, and can start them on a helper thread ahead of need: at 100,000 GPUs they are
about a third of a history's first chunk, which meanwhile builds the identity columns
and zeroes the counters. Whoever asks first computes; later askers wait for it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, Future
from dataclasses import dataclass
from functools import partial
from threading import Lock
from typing import Any, TypeVar

import numpy as np

from fleetcare.collectors.sim.fleet import FleetSpec

DAY_S = 86400.0
# rates per GPU-second: benign corrected ECC (median 1 per 50 days, heavy tail),
# PCIe replays (1 per 100 days), NVLink CRC flits per link (1 per 500 days)
CE_MEDIAN_PER_DAY = 0.02
PCIE_PER_DAY = 0.01
NV_FLIT_PER_LINK_DAY = 0.002
MAX_LINKS = 18
"""NVLink flit events are drawn over this many links per GPU and kept on the GPU's own
links (a GPU with fewer links sees proportionally fewer)."""
KEEP_DAYS = 32
"""Benign days a ``FleetDraws`` holds, the most recently asked (~0.25 MB a day at 100,000
GPUs): a catch-up of up to a month is drawn once for all the groups of a mixed fleet;
a day evicted is drawn again, the same, if asked."""

Day = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
"""A day's benign events of the whole fleet: {kind: (fleet GPU, t seconds, link)}."""


@dataclass(frozen=True, eq=False)
class SensorTraits:
    """Each fleet GPU's fixed sensor offsets (by fleet GPU; ``rack_off`` by node)."""

    temp_off: np.ndarray  # °C over the model's temperature
    mem_off: np.ndarray  # °C, memory over GPU
    eff: np.ndarray  # power efficiency factor
    rack_off: np.ndarray  # °C, each node's rack over ambient


@dataclass(frozen=True, eq=False)
class ErrorTraits:
    """Each fleet GPU's counts before the fleet's start and benign error rates."""

    life_ce: np.ndarray  # corrected errors (aggregate counter)
    life_rr: np.ndarray  # remapped rows
    cum: dict[str, np.ndarray]  # running sums over the fleet's GPUs of each benign kind's
    # events per GPU-second: ce, pcie, nv_flit


def draw_sensor_traits(spec: FleetSpec) -> SensorTraits:
    rng = np.random.default_rng([spec.seed, 5])
    return SensorTraits(temp_off=rng.normal(0, 2.0, spec.gpus),
                        mem_off=rng.normal(0, 1.5, spec.gpus),
                        eff=rng.normal(1.0, 0.03, spec.gpus),
                        rack_off=rng.normal(0, 1.5, spec.nodes))


def draw_error_traits(spec: FleetSpec) -> ErrorTraits:
    n = spec.gpus
    rng = np.random.default_rng([spec.seed, 4])
    ce_rate = CE_MEDIAN_PER_DAY * np.exp(1.5 * rng.standard_normal(n))
    life_ce = np.where(rng.random(n) < 0.3, np.floor(np.exp(1 + 1.5 * rng.standard_normal(n))), 0)
    life_rr = (rng.random(n) < 0.03).astype(np.int64)
    rates = {
        "ce": ce_rate / DAY_S,
        "pcie": np.full(n, PCIE_PER_DAY / DAY_S),
        "nv_flit": np.full(n, NV_FLIT_PER_LINK_DAY * MAX_LINKS / DAY_S),
    }
    return ErrorTraits(life_ce=life_ce, life_rr=life_rr,
                       cum={k: np.cumsum(v) for k, v in rates.items()})


def draw_day(seed: int, day: int, cum: dict[str, np.ndarray]) -> Day:
    """The fleet's benign events of ``day``: a Poisson count per kind at the fleet's total
    rate, each event's GPU drawn in proportion to its rate (``cum``), a time in the day
    and a link of ``MAX_LINKS``; one generator seeded by (seed, day)."""
    rng = np.random.default_rng([seed, 12, day])
    out = {}
    for name, c in cum.items():
        k = rng.poisson(c[-1] * DAY_S)
        u = rng.random(k) * c[-1]
        # looked up in increasing order (each search starts where the last ended;
        # random order missed the cache at every step: 8 ms a day at 100,000 GPUs)
        order = np.argsort(u, kind="stable")
        g = np.empty(k, dtype=np.int64)
        g[order] = np.minimum(np.searchsorted(c, u[order], side="right"), len(c) - 1)
        t = day * DAY_S + rng.random(k) * DAY_S
        link = rng.integers(0, MAX_LINKS, size=k)
        out[name] = (g, t, link)
    return out


class FleetDraws:
    """``sensor()``, ``errors()`` and ``day(d)`` of one fleet, each drawn once and shared
    (thread-safe; the last ``KEEP_DAYS`` days asked are held); ``start(executor, days)``
    begins drawing the error traits and then ``days`` on ``executor`` before they are
    asked (the sensor traits, from their own generator, are left to the asker: two
    threads share the first chunk's draws). The arrays are read-only: every group and
    every history reads the same ones."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._lock = Lock()
        self._got: dict[str | int, Future[Any]] = {}  # days: least recently asked first

    def sensor(self) -> SensorTraits:
        return self._get("sensor", lambda: _frozen(draw_sensor_traits(self.spec)))

    def errors(self) -> ErrorTraits:
        return self._get("errors", self._draw_errors)

    def day(self, day: int) -> Day:
        return self._get(day, lambda: self._draw_day(day))

    def start(self, executor: Executor, days: range) -> None:
        """Draw the error traits, then ``days`` (unless drawn or under way), on
        ``executor`` in that order. Whatever the executor cancels is drawn when asked."""
        todo: list[tuple[str | int, Callable[[], Any]]] = [("errors", self._draw_errors)]
        todo += [(d, partial(self._draw_day, d)) for d in days[:KEEP_DAYS]]
        for key, make in todo:
            with self._lock:
                if self._usable(self._got.get(key)):
                    continue
            f = executor.submit(make)  # (not under the lock: an executor may run it now)
            with self._lock:
                if not self._usable(self._got.get(key)):
                    self._put(key, f)

    def _draw_errors(self) -> ErrorTraits:
        return _frozen(draw_error_traits(self.spec))

    def _draw_day(self, day: int) -> Day:
        return _frozen(draw_day(self.spec.seed, day, self.errors().cum))

    @staticmethod
    def _usable(f: Future[Any] | None) -> bool:
        """Drawn, or being drawn, or waiting to be (not cancelled, not failed)."""
        return f is not None and not (f.done() and (f.cancelled() or f.exception() is not None))

    def _get(self, key: str | int, make: Callable[[], Any]) -> Any:
        while True:
            with self._lock:
                f = self._got.get(key)
                mine = not self._usable(f)
                if mine:
                    f = Future()
                    f.set_running_or_notify_cancel()
                assert f is not None
                self._put(key, f)  # (a day asked again is the most recently asked)
            if mine:
                try:
                    f.set_result(make())
                except BaseException as e:  # its waiters see it; the next asker draws again
                    f.set_exception(e)
            try:
                return f.result()
            except CancelledError:  # queued on an executor that was shut down: draw it here
                continue

    def _put(self, key: str | int, f: Future[Any]) -> None:
        self._got.pop(key, None)
        self._got[key] = f
        days = [k for k in self._got if isinstance(k, int)]
        for d in days[:max(0, len(days) - KEEP_DAYS)]:  # the least recently asked
            del self._got[d]


_T = TypeVar("_T", SensorTraits, ErrorTraits, dict)


def _frozen(x: _T) -> _T:
    """``x`` with its arrays read-only (also in dicts and tuples), in place."""
    parts = (vars(x).values() if isinstance(x, SensorTraits | ErrorTraits) else x.values())
    for v in parts:
        for a in (v.values() if isinstance(v, dict) else v if isinstance(v, tuple) else (v,)):
            a.flags.writeable = False
    return x
