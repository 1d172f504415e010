"""What in a landed batch should rescore its node now, not at the next scoring cycle.

GSP and SRAM failures show their precursors 1–3 h ahead (XID 119/120, a first
uncorrectable error); a node scored every few minutes on a big fleet can miss most of that
lead. ``UrgentSignals.observe(batches)`` returns the nodes whose batches carry

- an XID the catalogue rates ``warning`` or ``fatal`` (``xid.DEFAULT_CATALOG``, with the
  site's overrides when given), except class ``application`` (a job's own faults: XID 13,
  31, 43 arrive all day on a busy fleet and say nothing about the hardware);
- a *new* uncorrectable error on a GPU: its volatile or aggregate uncorrectable ECC count,
  uncorrectable remapped rows or DBE-retired pages higher than the last value seen for
  that GPU, or a row-remap failure newly set. The first sample of a GPU only sets the
  baseline (a driver's counters from before the service started are not news);
- a link going down: an NVLink of a GPU that was up in its previous sample and is not, or
  an InfiniBand/RoCE port leaving ``ACTIVE``.

The service (``fleetcare serve``) rescores at once when ``observe`` names a node, at
most every ``min_gap_s``. State is per GPU / port in memory (a restart re-learns it from
the next samples). Not thread-safe: one ingest thread calls it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from fleetcare.collectors.contract import Batch, GpuSample
from fleetcare.collectors.xid import DEFAULT_CATALOG, XidCatalog
from fleetcare.pipeline.wire_columns import as_list

_UE_FIELDS = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
              "remapped_rows_uncorrectable", "retired_pages_dbe")


_READ = ("ts", "node", "gpu_uuid", "gpu_index", *_UE_FIELDS, "remapped_rows_failure",
         "nvlink_up")
_Seen: Any = msgspec.defstruct("_Seen", [
    (f.name, f.type) if f.required else (f.name, f.type, f.default)
    for f in msgspec.structs.fields(GpuSample) if f.name in _READ], frozen=True)
"""The fields of a ``GpuSample`` that ``observe`` reads (a sample that came as its
msgpack bytes is decoded into this: msgspec skips the rest)."""
_SEEN = msgspec.msgpack.Decoder(_Seen)


def _seen(sample: Any) -> Any:
    """A sample as ``observe`` reads it (``msgspec.Raw``: the validator kept it, so it
    decodes)."""
    return _SEEN.decode(sample) if isinstance(sample, msgspec.Raw) else sample
URGENT_SEVERITIES = ("warning", "fatal")


def urgent_xid(catalog: XidCatalog, xid: int) -> bool:
    """Whether an XID rescores its node at once (module doc)."""
    info = catalog.lookup(xid)
    return info.severity in URGENT_SEVERITIES and info.xid_class != "application"


class UrgentSignals:
    """Remembers each GPU's uncorrectable counts and link states between batches."""

    def __init__(self, catalog: XidCatalog = DEFAULT_CATALOG) -> None:
        self.catalog = catalog
        self._ue: dict[str, tuple[int, ...]] = {}
        self._links: dict[str, tuple[bool, ...]] = {}
        self._remap_failed: dict[str, bool] = {}
        self._ports: dict[tuple[str, str, int], str | None] = {}
        self.why: dict[str, str] = {}
        """The last reason each node was named (for logs)."""

    def observe(self, batches: Iterable[Batch]) -> set[str]:
        """The nodes whose batches hold something urgent (module doc). ``batches``: as
        ingest decoded them (``Batch``, or ``wire_columns.RawBatch`` from msgpack)."""
        urgent: set[str] = set()

        def name(node: str, why: str) -> None:
            urgent.add(node)
            self.why[node] = why

        for b in batches:
            for e in b.events:
                if e.xid is not None and urgent_xid(self.catalog, e.xid):
                    info = self.catalog.lookup(e.xid)
                    name(e.node, f"XID {e.xid} ({info.name}, {info.severity})")
            for s in sorted(map(_seen, b.samples), key=lambda s: s.ts):
                why = self._sample(s)
                if why:
                    name(s.node, why)
            for n in sorted(b.nics, key=lambda n: n.ts):
                key = (n.node, n.device, n.port)
                before = self._ports.get(key)
                self._ports[key] = n.state
                if before == "ACTIVE" and n.state is not None and n.state != "ACTIVE":
                    name(n.node, f"{n.device} port {n.port} left ACTIVE ({n.state})")
        return urgent

    def _sample(self, s: Any) -> str | None:
        why = None
        ue = tuple(int(getattr(s, f) or 0) for f in _UE_FIELDS)
        before = self._ue.get(s.gpu_uuid)
        if before is not None and any(a > b for a, b in zip(ue, before, strict=True)):
            why = f"new uncorrectable error on GPU {s.gpu_index}"
        # a counter that went down (driver reload) re-baselines
        self._ue[s.gpu_uuid] = ue
        failed = bool(s.remapped_rows_failure)
        if failed and self._remap_failed.get(s.gpu_uuid) is False:
            why = why or f"row remapping failed on GPU {s.gpu_index}"
        self._remap_failed[s.gpu_uuid] = failed
        links = as_list("nvlink_up", s.nvlink_up)  # (a WireSample's are bytes)
        if links is not None:
            up = tuple(bool(x) for x in links)
            prev = self._links.get(s.gpu_uuid)
            if prev is not None and len(prev) == len(up):
                down = [i for i, (a, b) in enumerate(zip(prev, up, strict=True)) if a and not b]
                if down:
                    why = why or f"NVLink {down[0]} of GPU {s.gpu_index} went down"
            self._links[s.gpu_uuid] = up
        return why
