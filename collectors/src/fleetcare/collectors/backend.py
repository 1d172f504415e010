"""The seam between the agent and whatever reads the GPUs.

Every source of telemetry — NVML, the kernel log, a dcgm-exporter endpoint, the fleet
simulator, the InfiniBand ports of ``/sys/class/infiniband`` — is a ``GpuBackend``: the agent calls ``poll(now)`` once per tick and gets a
``Reading``. A backend turns driver errors into values (null counters, XID/lost-GPU
events); it raises only when it cannot work at all (``BackendError``).

Exceptions::

    BackendError          (.backend)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from fleetcare.collectors.contract import GpuSample, Incident, NicSample, XidEvent


class BackendError(Exception):
    """A backend that cannot start or read at all; says which and how to fix it."""

    def __init__(self, backend: str, message: str) -> None:
        super().__init__(f"{backend}: {message}")
        self.backend = backend


@dataclass(slots=True)
class Reading:
    """What one backend saw in one tick. Backends that see no samples leave it empty."""

    samples: list[GpuSample] = field(default_factory=list)
    events: list[XidEvent] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    nics: list[NicSample] = field(default_factory=list)

    def extend(self, other: Reading) -> None:
        self.samples.extend(other.samples)
        self.events.extend(other.events)
        self.incidents.extend(other.incidents)
        self.nics.extend(other.nics)


@runtime_checkable
class GpuBackend(Protocol):
    """A source of GPU telemetry. ``poll`` must not block for longer than a tick."""

    name: str

    def poll(self, now: dt.datetime) -> Reading:
        """Samples for every GPU at ``now`` plus events seen since the last poll."""
        ...

    def close(self) -> None:
        """Release driver handles, threads and files."""
        ...
