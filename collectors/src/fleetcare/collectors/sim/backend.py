"""``SimBackend``: the fleet simulator as a live ``GpuBackend`` (demo, agent tests).

Each ``poll(now)`` advances the same per-GPU counter state that ``history`` uses, so
counters stay monotonic between polls whatever their spacing, and returns the XID
events and incidents in ``[previous poll, now)`` (the first poll looks back one minute),
and with NIC ports the ports' samples at ``now``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from fleetcare.collectors.backend import BackendError, Reading
from fleetcare.collectors.contract import NicSample
from fleetcare.collectors.sim.telemetry import (
    Chunk,
    FleetSimulator,
    chunk_to_samples,
    columns_to_records,
)

FIRST_LOOKBACK_S = 60.0


class SimBackend:
    name = "sim"

    def __init__(self, simulator: FleetSimulator, nodes: list[str] | None = None) -> None:
        names = simulator.layout.node_names.tolist()
        if nodes is None:
            idx = np.arange(len(names))
        else:
            pos = {n: i for i, n in enumerate(names)}
            missing = [n for n in nodes if n not in pos]
            if missing:
                raise BackendError("sim", f"nodes {missing[:3]} are not in the simulated "
                                   f"fleet (node-00000..{names[-1]})")
            idx = np.array(sorted(pos[n] for n in nodes), dtype=np.int64)
        self.sim = simulator
        self.groups = simulator.groups(idx)
        self._last: float | None = None

    def poll(self, now: dt.datetime) -> Reading:
        t = self.sim.seconds(now)
        if t < 0:
            raise BackendError("sim", f"poll at {now} is before the fleet's start "
                               f"{self.sim.spec.start}")
        if self._last is not None and t <= self._last:
            return Reading()  # a clock that went backwards or a repeated tick: nothing new
        prev = max(0.0, t - FIRST_LOOKBACK_S) if self._last is None else self._last
        reading = Reading()
        for gi, grp in enumerate(self.groups):
            rng = np.random.default_rng([self.sim.spec.seed, 10, gi, int(round(t * 1000))])
            chunk = Chunk(start=now, end=now, samples=grp.step(np.array([t]), rng))
            reading.samples.extend(chunk_to_samples(chunk))
            reading.events.extend(grp.events(prev, t, rng))
            reading.incidents.extend(grp.incidents(prev, t))
            nics = grp.nic_step(np.array([t]))
            if nics is not None:
                reading.nics.extend(columns_to_records(nics, NicSample))
        self._last = t
        return reading

    def close(self) -> None:
        self.groups = []
