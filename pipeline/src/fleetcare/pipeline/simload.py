"""Load simulated history into the store in bulk (the columnar fast path).

The simulator yields columnar chunks; they go to DuckDB as Arrow tables without ever
becoming per-sample objects. The store is marked ``data_source = simulated`` so every
report and the dashboard can say so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline.store import Store

Progress = Callable[[int, int], None]
"""Called with (ticks done, ticks in all) after each chunk."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    samples: int
    events: int
    incidents: int
    nic_samples: int = 0


def mark_simulated(store: Store, note: str) -> None:
    store.set_meta("data_source", "simulated")
    store.set_meta("simulation", note)


def load_history(store: Store, sim: FleetSimulator, start: dt.datetime, end: dt.datetime, *,
                 interval_s: float = 60.0, progress: Progress | None = None) -> LoadResult:
    """Write telemetry, XID events and incidents (and NIC port samples, for a fleet with
    NIC ports) for [start, end) into ``store``."""
    ticks = max(1, int((end - start).total_seconds() // interval_s))
    done = samples = events = incidents = nics = 0
    for chunk in sim.history(start, end, interval_s=interval_s):
        n = len(chunk.samples["ts"])
        samples += store.insert_sample_columns(chunk.samples)
        events += store.insert_events(chunk.events)
        incidents += store.insert_incidents(chunk.incidents)
        if chunk.nics is not None:
            nics += store.insert_nic_columns(chunk.nics)
        if progress is not None and n:
            last = np.asarray(chunk.samples["ts"]).max().astype("datetime64[us]").astype(dt.datetime)
            done = int((last.replace(tzinfo=dt.UTC) - start).total_seconds() // interval_s) + 1
            progress(min(done, ticks), ticks)
    return LoadResult(samples, events, incidents, nics)


def load_network(store: Store, sim: FleetSimulator, start: dt.datetime, end: dt.datetime, *,
                 interval_s: float = 60.0) -> LoadResult:
    """Write only NIC port samples and incidents for [start, end) into ``store`` (no GPU
    telemetry: ``FleetSimulator.network_history``), for a model of network failures."""
    incidents = nics = 0
    for cols, found in sim.network_history(start, end, interval_s=interval_s):
        nics += store.insert_nic_columns(cols)
        incidents += store.insert_incidents(found)
    return LoadResult(0, 0, incidents, nics)
