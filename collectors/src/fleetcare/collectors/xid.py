"""The XID catalogue: what each NVIDIA XID means for the fleet, as data.

One row per XID from DESIGN.md's table (the NVIDIA XID catalog, abridged): its class
(``application`` / ``memory`` / ``link`` / ``bus`` / ``firmware`` / ``other``), severity
(``info`` / ``warning`` / ``fatal``), whether it is a failure *label* (``fatal``) and the
recommended action. An XID not in the table is class ``other``, severity ``warning``.

Sites override rows from config with ``XidCatalog.with_overrides``::

    catalog = DEFAULT_CATALOG.with_overrides({94: {"fatal": True}, 31: {"severity": "info"}})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

XidClass = Literal["application", "memory", "link", "bus", "firmware", "other"]
Severity = Literal["info", "warning", "fatal"]

CLASSES: tuple[str, ...] = ("application", "memory", "link", "bus", "firmware", "other")
SEVERITIES: tuple[str, ...] = ("info", "warning", "fatal")


@dataclass(frozen=True, slots=True)
class XidInfo:
    """What one XID means. ``fatal`` marks XIDs that count as failure incidents (labels)."""

    xid: int
    name: str
    xid_class: XidClass
    severity: Severity
    fatal: bool
    action: str


# (name, class, severity, fatal-for-labels, action). Source: DESIGN.md "XID → action".
# 94 (contained ECC) is not a label; 95 (uncontained) is. 63 row remap is informational,
# 64 remap *failure* is fatal.
_TABLE: dict[int, tuple[str, str, str, bool, str]] = {
    13: ("Graphics engine exception", "application", "warning", False,
         "Restart the application; the GPU is healthy unless it repeats without code changes."),
    31: ("GPU memory page fault", "application", "warning", False,
         "Restart the application; debug its memory accesses. GPU healthy."),
    32: ("Invalid or corrupted push buffer stream (PBDMA)", "bus", "warning", False,
         "Check PCIe link quality (replay counter, AER, downtraining); reseat if it repeats."),
    43: ("GPU stopped processing", "application", "warning", False,
         "Restart the application; GPU healthy."),
    45: ("Preemptive cleanup, due to previous errors", "application", "info", False,
         "Follows another error or a killed process; look at the XID before it."),
    48: ("Double-bit ECC error", "memory", "fatal", True,
         "Drain; reset the GPU or reboot the node. RMA if it repeats."),
    62: ("Internal micro-controller halt", "firmware", "fatal", True,
         "Drain; reset the GPU."),
    63: ("Row remapping recorded", "memory", "info", False,
         "Ignore; the remap takes effect at the next GPU reset."),
    64: ("Row remapping failure", "memory", "fatal", True,
         "Drain; reset the GPU and open an RMA."),
    68: ("NVDEC0 exception", "application", "warning", False,
         "Restart the application; GPU healthy."),
    69: ("Graphics engine class error", "application", "warning", False,
         "Restart the application; GPU healthy."),
    74: ("NVLink error", "link", "fatal", True,
         "Drain; reset the GPU or reboot the node. Call the vendor if it repeats."),
    79: ("GPU has fallen off the bus", "bus", "fatal", True,
         "Drain and reboot the node; check power, PCIe riser and slot if it repeats."),
    92: ("High single-bit ECC error rate", "memory", "warning", False,
         "Watch the ECC and remap counters; plan a reset."),
    94: ("Contained ECC error", "memory", "warning", False,
         "Restart the affected application; the GPU keeps running."),
    95: ("Uncontained ECC error", "memory", "fatal", True,
         "Drain; reset the GPU."),
    109: ("Context switch timeout", "other", "warning", False,
          "Reset the GPU if it repeats."),
    119: ("GSP RPC timeout", "firmware", "fatal", True,
          "Drain; reset the GPU, power-cycle the node if it persists."),
    120: ("GSP error", "firmware", "fatal", True,
          "Drain; reset the GPU, power-cycle the node if it persists."),
    121: ("C2C link corrected error", "link", "info", False,
          "Ignore."),
    140: ("Unrecovered ECC error", "memory", "fatal", True,
          "Drain; reset the GPU."),
    143: ("GPU initialization error", "firmware", "fatal", True,
          "Drain; reset the GPU."),
    154: ("GPU recovery action changed", "other", "warning", False,
          "Follow the recovery action the driver names (reset, reboot, drain)."),
}


def _row(xid: int, row: tuple[str, str, str, bool, str]) -> XidInfo:
    name, cls, sev, fatal, action = row
    return XidInfo(xid, name, cls, sev, fatal, action)  # type: ignore[arg-type]


class XidCatalog:
    """XID → ``XidInfo``. Immutable; ``with_overrides`` returns a new catalogue."""

    def __init__(self, rows: Mapping[int, XidInfo]) -> None:
        self._rows = dict(rows)

    def lookup(self, xid: int) -> XidInfo:
        """The row for ``xid``; an unknown XID is class ``other``, severity ``warning``."""
        info = self._rows.get(xid)
        if info is not None:
            return info
        return XidInfo(xid, f"XID {xid}", "other", "warning", False,
                       "Unknown XID: look it up in NVIDIA's XID catalog.")

    def fatal_xids(self) -> frozenset[int]:
        """The XIDs that count as failure incidents (labels)."""
        return frozenset(x for x, info in self._rows.items() if info.fatal)

    def __contains__(self, xid: object) -> bool:
        return xid in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def with_overrides(self, overrides: Mapping[int | str, Mapping[str, Any]]) -> XidCatalog:
        """A catalogue with some rows changed or added, e.g. from a site's TOML config.

        Keys are XIDs (ints or digit strings, as TOML tables give them); values map any of
        ``name``, ``class`` (or ``xid_class``), ``severity``, ``fatal``, ``action``.
        Raises ``ValueError`` naming the XID, the field and the allowed values.
        """
        rows = dict(self._rows)
        for key, fields in overrides.items():
            try:
                xid = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"XID override key {key!r} is not an integer XID") from None
            base = self.lookup(xid)
            changes: dict[str, Any] = {}
            for field, value in fields.items():
                if field in ("class", "xid_class"):
                    if value not in CLASSES:
                        raise ValueError(f"XID {xid}: class {value!r} is not one of {CLASSES}")
                    changes["xid_class"] = value
                elif field == "severity":
                    if value not in SEVERITIES:
                        raise ValueError(
                            f"XID {xid}: severity {value!r} is not one of {SEVERITIES}")
                    changes["severity"] = value
                elif field == "fatal":
                    if not isinstance(value, bool):
                        raise ValueError(f"XID {xid}: fatal must be true or false, not {value!r}")
                    changes["fatal"] = value
                elif field in ("name", "action"):
                    changes[field] = str(value)
                else:
                    raise ValueError(
                        f"XID {xid}: unknown field {field!r}; use name, class, severity, "
                        "fatal or action")
            rows[xid] = replace(base, **changes)
        return XidCatalog(rows)


DEFAULT_CATALOG = XidCatalog({xid: _row(xid, row) for xid, row in _TABLE.items()})
"""The catalogue of DESIGN.md. Fatal for labels: 48, 62, 64, 74, 79, 95, 119, 120, 140, 143."""


def lookup(xid: int) -> XidInfo:
    """``DEFAULT_CATALOG.lookup(xid)``."""
    return DEFAULT_CATALOG.lookup(xid)
