"""The fleet simulator: incidents with precursors, and the telemetry they leave behind.

    spec = FleetSpec(nodes=64, seed=1)
    plan = simulate_incidents(spec, days=14)       # ground truth (fast, no telemetry)
    summarize(plan)                                # counts by cause
    sim = FleetSimulator(spec, plan)
    for chunk in sim.history(start, end):          # columnar telemetry, in time order
        chunk.samples["gpu_temp_c"], chunk.events, chunk.incidents
        np.asarray(chunk.samples["nvlink_crc_flit"])   # per-link counters: SparseLinks
    SimBackend(sim, nodes=["node-00003"])          # the same, live, as a GpuBackend
"""

from __future__ import annotations

from fleetcare.collectors.sim.fleet import FleetLayout, FleetSpec
from fleetcare.collectors.sim.gpu_models import MODELS, GpuModel
from fleetcare.collectors.sim.incidents import (
    CAUSE_NAMES,
    DECOY_KINDS,
    MODES,
    IncidentPlan,
    plan_incidents,
    simulate_incidents,
    summarize,
)

__all__ = [
    "CAUSE_NAMES", "DECOY_KINDS", "MODELS", "MODES", "FleetLayout", "FleetSpec", "GpuModel",
    "IncidentPlan", "plan_incidents", "simulate_incidents", "summarize",
]

from fleetcare.collectors.sim.backend import SimBackend  # noqa: E402
from fleetcare.collectors.sim.sparse_links import SparseLinks  # noqa: E402
from fleetcare.collectors.sim.telemetry import Chunk, FleetSimulator, chunk_to_samples  # noqa: E402

__all__ += ["Chunk", "FleetSimulator", "SimBackend", "SparseLinks", "chunk_to_samples"]
