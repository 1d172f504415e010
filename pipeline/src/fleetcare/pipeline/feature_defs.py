"""The feature catalogue: every feature column's name, window, unit and definition.

Windowed features are aggregates of ``telemetry_hourly`` columns (see ``rollup``); each is
written once here as a SQL template over an aggregator ``A(fn, expr, w)``, which
``features`` renders either as a window function (training grid) or as a filtered
aggregate (live scoring). Features that need joins (XID time-since-last, node XIDs,
lemon history) and fleet-relative ones are defined here too and assembled in
``features``.

Fill values: counts and deltas are 0 when the counter exists and nothing happened; a
counter the GPU does not support gives NaN (LightGBM treats it as missing). Fractions
and means over a window with no usable samples are NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WINDOWS: dict[str, int] = {"1h": 1, "6h": 6, "24h": 24, "7d": 168}
"""Window name → hours."""

LEMON_DAYS = 28
SINCE_CAP_H = 24 * LEMON_DAYS
"""Hours-since-last-XID when there was none within the cap."""

REL_EPS = 1.0
"""Added to the fleet median in fleet-relative ratios of counts (so 0 / 0 is 0, 5 / 0 is 5)."""
REL_EPS_FRAC = 0.01
"""Added to the fleet median in fleet-relative ratios of fractions."""


@dataclass(frozen=True, slots=True)
class FeatureDef:
    name: str
    window: str        # "1h", "6h", "24h", "7d", "28d", "now"
    unit: str
    definition: str


try:  # the catalogue of the collectors team
    from fleetcare.collectors.xid import CLASSES as _CLASSES
    from fleetcare.collectors.xid import DEFAULT_CATALOG as _CATALOG

    XID_CLASSES: tuple[str, ...] = tuple(_CLASSES)

    def xid_class(xid: int | None) -> str:
        return "other" if xid is None else _CATALOG.lookup(xid).xid_class

except ImportError:  # pragma: no cover - fallback until fleetcare.collectors.xid lands
    XID_CLASSES = ("application", "memory", "link", "bus", "firmware", "other")
    _LOCAL = {
        **dict.fromkeys((13, 31, 43, 45, 68, 69), "application"),
        **dict.fromkeys((48, 63, 64, 92, 94, 95, 140), "memory"),
        74: "link", 121: "link", 79: "bus", 32: "bus",
        **dict.fromkeys((62, 119, 120, 143), "firmware"),
    }

    def xid_class(xid: int | None) -> str:
        return _LOCAL.get(xid, "other") if xid is not None else "other"


Agg = Callable[[str, str, str], str]


def _sum(A: Agg, expr: str, w: str) -> str:
    return A("sum", expr, w)


def _frac(A: Agg, num: str, den: str, w: str) -> str:
    return f"{A('sum', num, w)} / nullif({A('sum', den, w)}, 0)"


def _mean(A: Agg, s: str, n: str, w: str) -> str:
    return _frac(A, s, n, w)


def _std(A: Agg, w: str) -> str:
    n, s, q = (A("sum", c, w) for c in ("gpu_temp_n", "gpu_temp_sum", "gpu_temp_sumsq"))
    return (f"CASE WHEN {n} > 1 THEN sqrt(greatest(({q} - {s} * {s} / {n}) / ({n} - 1), 0)) "
            "END")


# (name stem, unit, definition, sql(A, w)) for every window in WINDOWS
_WINDOWED: list[tuple[str, str, str, Callable[[Agg, str], str]]] = [
    ("ecc_corrected", "errors",
     "corrected (single-bit) ECC errors: reset-aware increase of the volatile counter "
     "(the aggregate one where volatile is unsupported)",
     lambda A, w: _sum(A, "ecc_c", w)),
    ("ecc_uncorrected", "errors",
     "uncorrected (double-bit) ECC errors, as ecc_corrected",
     lambda A, w: _sum(A, "ecc_u", w)),
    ("remapped_rows", "rows",
     "new remapped rows (correctable + uncorrectable); NaN before Ampere",
     lambda A, w: _sum(A, "remap", w)),
    ("retired_pages", "pages",
     "new retired pages (SBE + DBE); NaN on Ampere and later",
     lambda A, w: _sum(A, "retired", w)),
    ("pcie_replay", "replays", "PCIe replay counter increase",
     lambda A, w: _sum(A, "pcie_replay", w)),
    ("nvlink_crc", "errors", "NVLink CRC flit + CRC data errors, summed over links",
     lambda A, w: _sum(A, "nvl_crc", w)),
    ("nvlink_replay", "replays", "NVLink replay errors, summed over links",
     lambda A, w: _sum(A, "nvl_replay", w)),
    ("nvlink_recovery", "recoveries", "NVLink recovery errors, summed over links",
     lambda A, w: _sum(A, "nvl_recovery", w)),
    ("nvlink_flaps", "transitions",
     "NVLink up->down transitions between consecutive samples, over all links",
     lambda A, w: _sum(A, "nvlink_flaps", w)),
    ("pcie_width_down_frac", "fraction",
     "fraction of samples with PCIe link width below its max (downtrained link)",
     lambda A, w: _frac(A, "pcie_width_down_n", "pcie_n", w)),
    ("pcie_gen_down_frac", "fraction",
     "fraction of samples with PCIe link gen below its max (also normal at idle: "
     "power saving)",
     lambda A, w: _frac(A, "pcie_gen_down_n", "pcie_n", w)),
    ("throttle_thermal_frac", "fraction",
     "fraction of samples with a thermal slowdown clock-event reason (SW 0x20 | HW 0x40)",
     lambda A, w: _frac(A, "thr_thermal_n", "thr_n", w)),
    ("throttle_power_frac", "fraction",
     "fraction of samples with a power clock-event reason (HW power brake 0x80 | SW "
     "power cap 0x4)",
     lambda A, w: _frac(A, "thr_power_n", "thr_n", w)),
    ("throttle_hw_slowdown_frac", "fraction",
     "fraction of samples with the HW slowdown clock-event reason (0x8)",
     lambda A, w: _frac(A, "thr_hw_n", "thr_n", w)),
    ("gpu_temp_mean", "degC", "mean GPU temperature",
     lambda A, w: _mean(A, "gpu_temp_sum", "gpu_temp_n", w)),
    ("gpu_temp_max", "degC", "max GPU temperature",
     lambda A, w: A("max", "gpu_temp_max", w)),
    ("gpu_temp_std", "degC", "standard deviation of the GPU temperature samples",
     _std),
    ("mem_temp_mean", "degC", "mean memory (HBM) temperature",
     lambda A, w: _mean(A, "mem_temp_sum", "mem_temp_n", w)),
    ("mem_temp_max", "degC", "max memory (HBM) temperature",
     lambda A, w: A("max", "mem_temp_max", w)),
    ("power_mean", "W", "mean power draw",
     lambda A, w: _mean(A, "power_sum", "power_n", w)),
    ("util_mean", "percent", "mean GPU utilisation",
     lambda A, w: _mean(A, "util_sum", "util_n", w)),
]

# persistence: (name stem, hourly rollup column, what) counted in hours with an increase
ACTIVE_WINDOWS = ("6h", "24h")
_ACTIVE: list[tuple[str, str, str]] = [
    ("ecc_corrected", "ecc_c", "corrected ECC error"),
    ("pcie_replay", "pcie_replay", "PCIe replay"),
    ("nvlink_crc", "nvl_crc", "NVLink CRC error"),
]

_XID_DEF = ("XIDs of class {cls} attributed to this GPU (by uuid, else PCI bus id, else "
            "index on the node)")

_NOW: list[tuple[str, str, str, str]] = [
    # (name, unit, definition, SQL over the last sample: arg_max(expr, last hour))
    ("remapped_rows_pending_now", "flag", "row remapping pending a GPU reset (1/0)",
     "remapped_rows_pending_last::INT"),
    ("remapped_rows_failure_now", "flag", "row remapping failed: RMA condition (1/0)",
     "remapped_rows_failure_last::INT"),
    ("retired_pages_pending_now", "flag", "page retirement pending (1/0; pre-Ampere)",
     "retired_pages_pending_last::INT"),
    ("nvlink_links_down_now", "links", "NVLink links reported down at the last sample",
     "nvlink_down_last"),
    ("nvlink_links_now", "links", "NVLink links reported at the last sample",
     "nvlink_links"),
    ("pcie_width_down_now", "flag", "PCIe link width below max at the last sample (1/0)",
     "pcie_width_down_last::INT"),
    ("pcie_gen_down_now", "flag", "PCIe link gen below max at the last sample (1/0)",
     "pcie_gen_down_last::INT"),
    ("gpu_temp_now", "degC", "GPU temperature at the last sample", "gpu_temp_last"),
    ("ecc_corrected_lifetime", "errors",
     "aggregate (lifetime) corrected ECC counter at the last sample",
     "ecc_corrected_aggregate_last"),
    ("ecc_uncorrected_lifetime", "errors",
     "aggregate (lifetime) uncorrected ECC counter at the last sample",
     "ecc_uncorrected_aggregate_last"),
    ("remapped_rows_lifetime", "rows",
     "remapped rows (correctable + uncorrectable) at the last sample",
     "remapped_rows_correctable_last + remapped_rows_uncorrectable_last"),
    ("retired_pages_lifetime", "pages", "retired pages (SBE + DBE) at the last sample",
     "retired_pages_sbe_last + retired_pages_dbe_last"),
]

REL_BASES: list[tuple[str, float]] = [
    ("ecc_corrected_24h", REL_EPS), ("ecc_uncorrected_24h", REL_EPS),
    ("remapped_rows_24h", REL_EPS), ("pcie_replay_24h", REL_EPS),
    ("nvlink_crc_24h", REL_EPS), ("nvlink_recovery_24h", REL_EPS),
    ("xid_memory_24h", REL_EPS), ("throttle_thermal_frac_24h", REL_EPS_FRAC),
]
NODE_MAX_BASES = ["ecc_corrected_24h", "ecc_uncorrected_24h", "pcie_replay_24h",
                  "nvlink_crc_24h", "gpu_temp_resid_24h"]
ERROR_BASES_24H = ["ecc_corrected_24h", "ecc_uncorrected_24h", "remapped_rows_24h",
                   "retired_pages_24h", "pcie_replay_24h", "nvlink_crc_24h",
                   "nvlink_recovery_24h", "nvlink_flaps_24h"]
"""A GPU 'has errors' (node_gpus_with_errors_24h) when one of these, or a non-application
XID, is above 0 over 24 h."""
NIC_LINK_ERRORS = ("symbol_error", "link_error_recovery", "local_link_integrity_errors")
NIC_RCV_ERRORS = ("port_rcv_errors", "port_rcv_remote_physical_errors",
                  "excessive_buffer_overrun_errors")
"""The InfiniBand port counters behind ``node_nic_link_errors_24h`` (the physical link:
a degrading cable or transceiver) and ``node_nic_rcv_errors_24h`` (what the port received
badly or could not buffer). Transmit discards are left out: congestion, not a fault."""
NIC_FEATURES: list[tuple[str, str, str]] = [
    ("node_nic_flaps_24h", "flaps",
     "InfiniBand link flaps on this node's ports (a port leaving ACTIVE, or link_downed "
     "rising)"),
    ("node_nic_link_errors_24h", "errors",
     "InfiniBand link errors on this node's ports: " + " + ".join(NIC_LINK_ERRORS)),
    ("node_nic_rcv_errors_24h", "errors",
     "InfiniBand receive errors on this node's ports: " + " + ".join(NIC_RCV_ERRORS)),
    ("node_nic_rate_ratio_24h", "ratio",
     "lowest rate any of this node's InfiniBand ports ran at over the highest (below 1: a "
     "link trained down)"),
]
"""Node features from the NIC port rollup (``nic_rollup``), the same for every GPU of the
node; NaN on a node none of whose ports reported in the period scored (the grid's whole
span, live the last 25 hours)."""


def windowed_sql(A: Agg) -> list[tuple[str, str]]:
    """(column, SQL) of every windowed telemetry and per-GPU XID feature."""
    out = []
    for w in WINDOWS:
        for stem, _, _, sql in _WINDOWED:
            out.append((f"{stem}_{w}", sql(A, w)))
        for cls in XID_CLASSES:
            out.append((f"xid_{cls}_{w}", A("sum", f"coalesce(xid_{cls}, 0)", w)))
    for w in ("6h", "24h"):
        out.append((f"gpu_temp_slope_{w}", A("regr_slope", "temp_h, xh", w)))
    for w in ACTIVE_WINDOWS:
        for stem, col, _ in _ACTIVE:
            out.append((f"{stem}_active_hours_{w}", A("sum", f"(coalesce({col}, 0) > 0)::INT", w)))
    return out


def now_sql() -> list[tuple[str, str]]:
    return [(name, expr) for name, _, _, expr in _NOW]


def _catalogue() -> list[FeatureDef]:
    out: list[FeatureDef] = []
    for w in WINDOWS:
        for stem, unit, definition, _ in _WINDOWED:
            out.append(FeatureDef(f"{stem}_{w}", w, unit, definition))
        for cls in XID_CLASSES:
            out.append(FeatureDef(f"xid_{cls}_{w}", w, "events", _XID_DEF.format(cls=cls)))
    for w in ("6h", "24h"):
        out.append(FeatureDef(
            f"gpu_temp_slope_{w}", w, "degC/h",
            "least-squares slope of the hourly mean GPU temperature against time"))
    for w in ACTIVE_WINDOWS:
        for stem, _, what in _ACTIVE:
            out.append(FeatureDef(
                f"{stem}_active_hours_{w}", w, "hours",
                f"hours of the window with at least one new {what}: a fault keeps erring "
                "hour after hour, a one-off burst does not"))
    for name, unit, definition, _ in _NOW:
        out.append(FeatureDef(name, "now", unit, definition + "; NaN if unsupported"))
    out.append(FeatureDef(
        "hours_since_sample", "now", "h",
        "hours between the scoring time and this GPU's newest sample"))
    for cls in XID_CLASSES:
        out.append(FeatureDef(
            f"xid_{cls}_hours_since", "28d", "h",
            f"hours since this GPU's last XID of class {cls}, {SINCE_CAP_H} if none in "
            f"{LEMON_DAYS} days"))
    for cls in XID_CLASSES:
        out.append(FeatureDef(
            f"node_xid_{cls}_24h", "24h", "events",
            f"XIDs of class {cls} on this GPU's node, any GPU or none named"))
    out += [
        FeatureDef("gpu_failures_28d", "28d", "incidents",
                   f"failure incidents blamed on this GPU in the previous {LEMON_DAYS} days"),
        FeatureDef("node_failures_28d", "28d", "incidents",
                   f"failure incidents of this node in the previous {LEMON_DAYS} days"),
        FeatureDef("node_repairs_28d", "28d", "incidents",
                   f"repair and RMA incidents of this node in the previous {LEMON_DAYS} "
                   "days"),
        FeatureDef("node_failure_hours_since", "28d", "h",
                   f"hours since this node's last failure incident, {SINCE_CAP_H} if none "
                   f"in {LEMON_DAYS} days (a node fails again soon after a failure more "
                   "often than a node that has not failed: the recurrence model's signal)"),
        FeatureDef("node_repair_hours_since", "28d", "h",
                   f"hours since this node's last repair or RMA, {SINCE_CAP_H} if none in "
                   f"{LEMON_DAYS} days"),
    ]
    for w in ("1h", "24h"):
        out.append(FeatureDef(
            f"gpu_temp_resid_{w}", w, "degC",
            f"gpu_temp_mean_{w} minus the temperature predicted from power_mean_{w} by a "
            "least-squares line fitted over all scored GPUs of the same model at the same "
            "time (minus their mean temperature if the fit is undefined)"))
    for base, eps in REL_BASES:
        out.append(FeatureDef(
            f"{base}_rel", base.rsplit("_", 1)[1], "ratio",
            f"{base} / (median of {base} over the scored GPUs of the same model at the same "
            f"time + {eps:g}): fleet-relative"))
    for base in NODE_MAX_BASES:
        out.append(FeatureDef(f"node_max_{base}", base.rsplit("_", 1)[1], "as base",
                              f"max of {base} over the scored GPUs of this node"))
    out += [
        FeatureDef("node_gpus_with_errors_24h", "24h", "GPUs",
                   "GPUs of this node with any of " + ", ".join(ERROR_BASES_24H)
                   + " or a non-application XID above 0"),
        FeatureDef("node_gpus", "now", "GPUs", "scored GPUs of this node"),
    ]
    for name, unit, definition in NIC_FEATURES:
        out.append(FeatureDef(name, "24h", unit, definition + "; NaN when no port of the "
                              "node reported"))
    return out


FEATURES: list[FeatureDef] = _catalogue()
