"""The simulated fleet: its spec and the identity of every node and GPU.

Identity is a pure function of the spec: node ``i`` is ``node-{i:05d}``, GPU ``j`` of
node ``i`` has a UUID derived from (seed, node, index) and the DGX H100 PCI bus ids.
A model mix is written ``"H100:3,A100:1"`` (weights); each node gets one model.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field

import numpy as np

from fleetcare.collectors.sim.gpu_models import MODELS, GpuModel

DEFAULT_START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")  # DGX H100 GPU bus ids
MAX_NIC_PORTS = 16


@dataclass(frozen=True)
class FleetSpec:
    """What fleet to simulate. ``failure_scale`` multiplies every failure rate.

    ``repeat_branching`` / ``repeat_decay_days`` (opt-in, off by default): each failure
    brings on average ``repeat_branching`` follow-on failures of the same node, at an
    exponential time (mean ``repeat_decay_days``) of uptime after its repair: the fleet
    fails again where it failed before, as the real trace does (``incidents.py``).

    ``repair_scale`` / ``repair_sigma``: a repair takes its cause's median hours
    (``incidents.REPAIR``) times ``repair_scale``, spread lognormally with
    ``repair_sigma``; the defaults (1, 0.8) are the simulator's own guess, and
    ``incidents.TRACE_REPAIRS`` is fit on the real trace.

    ``nic_ports`` (opt-in, 0 by default): InfiniBand ports per node (a DGX H100 has 8
    compute HCAs). With ports, the fleet reports NIC port telemetry (``nics``) and a share
    of its network failures (cable/switch, NIC) shows precursors on one port; without,
    network failures show nothing, as in earlier versions (same draws).
    """

    nodes: int
    gpus_per_node: int = 8
    model: str = "H100"
    seed: int = 0
    start: dt.datetime = DEFAULT_START
    failure_scale: float = 1.0
    lemon_fraction: float = 0.012
    repeat_branching: float = 0.0
    repeat_decay_days: float = 7.0
    repair_scale: float = 1.0
    repair_sigma: float = 0.8
    nic_ports: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"FleetSpec.nodes={self.nodes}: a fleet needs at least 1 node")
        if not 1 <= self.gpus_per_node <= len(PCI_BUSES):
            raise ValueError(
                f"FleetSpec.gpus_per_node={self.gpus_per_node}: use 1..{len(PCI_BUSES)}"
            )
        if self.start.tzinfo is None:
            raise ValueError("FleetSpec.start must be timezone-aware (UTC), e.g. "
                             "datetime(2026, 1, 1, tzinfo=UTC)")
        if self.failure_scale < 0 or not 0 <= self.lemon_fraction < 1:
            raise ValueError("FleetSpec.failure_scale must be >= 0 and lemon_fraction "
                             f"in [0, 1), got {self.failure_scale}, {self.lemon_fraction}")
        if not 0 <= self.repeat_branching < 1 or self.repeat_decay_days <= 0:
            raise ValueError("FleetSpec.repeat_branching must be in [0, 1) and "
                             "repeat_decay_days > 0, got "
                             f"{self.repeat_branching}, {self.repeat_decay_days}")
        if self.repair_scale <= 0 or self.repair_sigma < 0:
            raise ValueError("FleetSpec.repair_scale must be > 0 and repair_sigma >= 0, got "
                             f"{self.repair_scale}, {self.repair_sigma}")
        if not 0 <= self.nic_ports <= MAX_NIC_PORTS:
            raise ValueError(f"FleetSpec.nic_ports={self.nic_ports}: use 0 (no NIC telemetry) "
                             f"to {MAX_NIC_PORTS} InfiniBand ports per node")
        parse_model_mix(self.model)  # validate early

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def parse_model_mix(model: str) -> list[tuple[str, float]]:
    """``"H100"`` or ``"H100:3,A100:1"`` -> [(key, weight)], weights summing to 1."""
    parts: list[tuple[str, float]] = []
    for item in model.split(","):
        key, _, weight = item.strip().partition(":")
        if key not in MODELS:
            raise ValueError(
                f"GPU model {key!r} is unknown: use one of {sorted(MODELS)} "
                "or a mix like 'H100:3,A100:1'"
            )
        parts.append((key, float(weight) if weight else 1.0))
    total = sum(w for _, w in parts)
    if total <= 0:
        raise ValueError(f"model mix {model!r} has no positive weight")
    return [(k, w / total) for k, w in parts]


def gpu_uuid(seed: int, node: int, index: int) -> str:
    return gpu_uuids(seed, node + 1, index + 1, first=(node, index))[0]


def gpu_uuids(seed: int, nodes: int, gpus_per_node: int, first: tuple[int, int] = (0, 0)
              ) -> list[str]:
    """UUIDs of GPUs ``first`` .. (nodes - 1, gpus_per_node - 1), node-major; one loop
    with no call per GPU (a 100,000-GPU layout is built in well under 0.1 s)."""
    b2 = hashlib.blake2b
    out: list[str] = []
    add = out.append
    for n in range(first[0], nodes):
        for j in range(first[1], gpus_per_node):
            h = b2(f"{seed}:{n}:{j}".encode(), digest_size=16).hexdigest()
            add(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
    return out


@dataclass(frozen=True)
class FleetLayout:
    """Identity arrays, GPUs in node-major order (global gpu id = node * gpn + index)."""

    spec: FleetSpec
    node_names: np.ndarray  # object (nodes,)
    node_model: np.ndarray  # int8 (nodes,) index into model_keys
    model_keys: tuple[str, ...]
    gpu_uuids: np.ndarray  # object (gpus,)
    pci_bus_ids: np.ndarray  # object (gpus,)
    models: tuple[GpuModel, ...] = field(default=())

    @classmethod
    def build(cls, spec: FleetSpec) -> FleetLayout:
        mix = parse_model_mix(spec.model)
        keys = tuple(k for k, _ in mix)
        if len(mix) == 1:
            node_model = np.zeros(spec.nodes, dtype=np.int8)
        else:
            rng = np.random.default_rng([spec.seed, 101])
            node_model = rng.choice(len(mix), size=spec.nodes, p=[w for _, w in mix]).astype(
                np.int8
            )
        names = np.array([f"node-{i:05d}" for i in range(spec.nodes)], dtype=object)
        gpn = spec.gpus_per_node
        uuids = np.array(gpu_uuids(spec.seed, spec.nodes, gpn), dtype=object)
        pci = np.array([f"00000000:{PCI_BUSES[j]}:00.0" for j in range(gpn)] * spec.nodes,
                       dtype=object)
        return cls(spec, names, node_model, keys, uuids, pci, tuple(MODELS[k] for k in keys))
