"""What fleetcare accepts: the plausible range of every checked value, the bounds of
strings and batches, and the incident causes beyond Llama 3's Table 5.

One source for everything that takes records or incidents in: ingest validation
(``fleetcare.pipeline.validate``), ``POST /v1/incidents`` (same time bounds) and the API's
request models (same string lengths). The ranges are deliberately wide: they catch what
no GPU can report (10,000 °C), not what is merely unusual.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetcare.collectors.contract import CAUSES


@dataclass(frozen=True, slots=True)
class Limits:
    """The plausible range of every checked value (inclusive), and size bounds."""

    temp_c: tuple[float, float] = (-40.0, 200.0)
    power_w: tuple[float, float] = (0.0, 5000.0)
    util_pct: tuple[float, float] = (0.0, 100.0)
    clock_mhz: tuple[int, int] = (0, 10_000)
    fb_mib: tuple[int, int] = (0, 16 * 1024 * 1024)
    pcie_gen: tuple[int, int] = (1, 7)
    pcie_widths: frozenset[int] = frozenset({1, 2, 4, 8, 16, 32})
    max_nvlinks: int = 18
    gpu_index: tuple[int, int] = (0, 64)
    xid: tuple[int, int] = (0, 1000)
    max_future_s: float = 600.0
    max_age_s: float = 400 * 86400.0
    max_name_len: int = 256
    """Characters of a name or identifier: node, gpu_uuid, pci_bus_id, model, cause, ..."""
    max_text_len: int = 4096
    """Characters of free text: an XID message, an incident note."""
    nic_port: tuple[int, int] = (0, 255)
    """InfiniBand port numbers are 8-bit (0 is a switch's management port)."""
    nic_rate_gbps: tuple[float, float] = (0.0, 100_000.0)
    max_hw_counters: int = 512
    """Entries of a NIC sample's hw_counters lists (mlx5 has a few dozen)."""
    max_batch_records: int = 4096
    """Samples (and events, and incidents) in one batch: a node has at most 64 GPUs, so
    this is 64 ticks of a full node; more is a broken or hostile producer."""


OPERATOR_CAUSES: dict[str, str] = {
    "unknown": "an operator recorded a failure before it was diagnosed",
    "node_down": "a node went down (Slurm node event) with no finer cause",
    "gpu_lost": "a GPU fell off the bus / was lost (derived automatically)",
    "fatal_xid": "a fatal XID ended the job (derived automatically, before diagnosis)",
    "planned_maintenance": "a planned drain or maintenance window",
    "other": "anything else an operator wants to record, explained in the note",
}
"""Incident causes beyond Llama 3's Table 5 (``contract.CAUSES``)."""

KNOWN_CAUSES: frozenset[str] = frozenset(CAUSES) | frozenset(OPERATOR_CAUSES)
