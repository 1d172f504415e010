"""Reasons a human can check: the signals that raise a GPU's risk most, as sentences.

Contributions come from LightGBM itself (``pred_contrib=True``, TreeSHAP on the margin).
Features are grouped into *signals* (``signal()``): the 1 h, 6 h, 24 h and 7 d windows of
one counter, its fleet-relative ratio, its lifetime value and its node maximum are one
signal. Each signal gives at most one reason, from its strongest contributor, e.g.
``"310 corrected ECC errors in 24 h (fleet median for H100 80GB: 0)"``: a plain name,
the value rounded for people with its unit, and the fleet median of the same GPU model
at the same time. ``sentence()`` is the one function that writes a reason; scoring stores
its sentences and the API, dashboard, alerts, Slack and drains show them as stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.models.model import FailureModel, Matrix

FLEET = "*"  # key of fleet_medians for rows whose GPU model is unknown


def _catalogue() -> dict[str, Any]:
    try:
        from fleetcare.pipeline.features import FEATURES
    except ImportError:  # pragma: no cover - pipeline is a dependency
        return {}
    return {f.name: f for f in FEATURES}


class _GroupMedians(Mapping[str, float]):
    """The median of each feature over one group's rows (NaN-aware), computed when first
    read: reasons show a few features' medians, and a fleet has ~200 of them."""

    def __init__(self, columns: _Columns, mask: np.ndarray | None) -> None:
        self._columns = columns
        self._mask = mask
        self._done: dict[str, float] = {}

    def __getitem__(self, name: str) -> float:
        if name not in self._done:
            col = self._columns[name]
            if self._mask is not None:
                col = col[self._mask]
            col = col[~np.isnan(col)]
            self._done[name] = float(np.median(col)) if len(col) else math.nan
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns.names)

    def __len__(self) -> int:
        return len(self._columns.names)


class _Columns:
    """Feature columns of a table as float64 arrays (nulls → NaN), converted when used."""

    def __init__(self, table: pa.Table, names: Sequence[str]) -> None:
        self.table = table
        self.names = list(names)
        self._known = set(self.names)
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._known:
            raise KeyError(name)
        if name not in self._arrays:
            if name in self.table.column_names:
                col = pc.fill_null(self.table.column(name), math.nan)
                self._arrays[name] = np.asarray(col.to_numpy(zero_copy_only=False),
                                                dtype=np.float64)
            else:
                self._arrays[name] = np.full(self.table.num_rows, math.nan)
        return self._arrays[name]


def fleet_medians(table: pa.Table, feature_names: Sequence[str]) -> dict[str, Mapping[str, float]]:
    """Per GPU model (and ``"*"`` for the whole fleet): the median of each feature, NaN-aware.

    Each median is computed when first read (a read-only mapping per group)."""
    columns = _Columns(table, feature_names)
    out: dict[str, Mapping[str, float]] = {FLEET: _GroupMedians(columns, None)}
    if "model" in table.column_names:
        enc = pc.dictionary_encode(table.column("model").cast(pa.string())).combine_chunks()
        codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False)
        names = enc.dictionary.to_pylist()
        for code in sorted(range(len(names)), key=lambda c: names[c]):
            out[names[code]] = _GroupMedians(columns, codes == code)
    return out


# --- numbers for people -------------------------------------------------------------

def human(v: float) -> str:
    """A number as people read it: whole numbers with thousands separators, two
    significant digits below 10, never scientific notation (``310``, ``1,234``, ``6.2``,
    ``0.034``, ``<0.01``)."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 9.95 or float(v).is_integer():
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    if a < 0.01:
        return "<0.01" if v > 0 else ">-0.01"
    return f"{v:.2g}"


def plural(n: float, one: str, many: str | None = None) -> str:
    """``"1 error"``, ``"2 errors"``, ``"0 errors"``, ``"1.5 errors"`` (number rounded by
    ``human``)."""
    shown = human(n)
    return f"{shown} {one if shown == '1' else (many or one + 's')}"


# --- signals and their plain names ---------------------------------------------------

WINDOW_TEXT = {"1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 days", "28d": "28 days"}
WINDOW_HOURS = {"1h": 1, "6h": 6, "24h": 24, "7d": 168, "28d": 672}

COUNTS: dict[str, tuple[str, str]] = {
    # signal → (one, many)
    "ecc_corrected": ("corrected ECC error", "corrected ECC errors"),
    "ecc_uncorrected": ("uncorrected ECC error", "uncorrected ECC errors"),
    "remapped_rows": ("remapped memory row", "remapped memory rows"),
    "retired_pages": ("retired memory page", "retired memory pages"),
    "pcie_replay": ("PCIe replay", "PCIe replays"),
    "nvlink_crc": ("NVLink CRC error", "NVLink CRC errors"),
    "nvlink_replay": ("NVLink replay", "NVLink replays"),
    "nvlink_recovery": ("NVLink recovery", "NVLink recoveries"),
    "nvlink_flaps": ("NVLink link drop", "NVLink link drops"),
    "nvlink_links_down": ("NVLink link down now", "NVLink links down now"),
    "nvlink_links": ("NVLink link reported", "NVLink links reported"),
    "gpu_failures": ("failure of this GPU", "failures of this GPU"),
    "node_failures": ("failure of this node", "failures of this node"),
    "node_repairs": ("repair or RMA of this node", "repairs or RMAs of this node"),
    "node_gpus_with_errors": ("GPU of this node with errors", "GPUs of this node with errors"),
    "node_gpus": ("GPU scored on this node", "GPUs scored on this node"),
    "node_nic_flaps": ("InfiniBand link flap on this node", "InfiniBand link flaps on this node"),
    "node_nic_link_errors": ("InfiniBand link error on this node",
                             "InfiniBand link errors on this node"),
    "node_nic_rcv_errors": ("InfiniBand receive error on this node",
                            "InfiniBand receive errors on this node"),
}
FRACTIONS = {
    "pcie_width_down": "PCIe link below full width",
    "pcie_gen_down": "PCIe link below full speed",
    "throttle_thermal": "thermal throttling",
    "throttle_power": "power throttling",
    "throttle_hw_slowdown": "hardware slowdown",
}
LEVELS = {
    # feature stem → (plain name, unit shown)
    "gpu_temp_mean": ("mean GPU temperature", " °C"),
    "gpu_temp_max": ("peak GPU temperature", " °C"),
    "gpu_temp_std": ("GPU temperature spread (std. dev.)", " °C"),
    "mem_temp_mean": ("mean memory temperature", " °C"),
    "mem_temp_max": ("peak memory temperature", " °C"),
    "power_mean": ("mean power draw", " W"),
    "util_mean": ("mean GPU utilisation", "%"),
}
FLAGS = {
    "remapped_rows_pending_now": "row remapping pending a GPU reset",
    "remapped_rows_failure_now": "row remapping failed (RMA condition)",
    "retired_pages_pending_now": "page retirement pending a GPU reset",
    "pcie_width_down_now": "PCIe link below full width now",
    "pcie_gen_down_now": "PCIe link below full speed now",
}
_SIGNAL_ALIASES = {"gpu_temp_mean": "gpu_temp", "gpu_temp_max": "gpu_temp",
                   "gpu_temp": "gpu_temp", "mem_temp_mean": "mem_temp",
                   "mem_temp_max": "mem_temp"}
_WINDOW = re.compile(r"_(1h|6h|24h|7d|28d)$")
_XID = re.compile(r"^(node_)?xid_([a-z]+)")


def signal(name: str) -> str:
    """The signal a feature measures: its windows, fleet ratio, lifetime value, node
    maximum and persistence count are one signal (``ecc_corrected_24h_rel`` →
    ``ecc_corrected``; ``gpu_temp_max_6h`` → ``gpu_temp``; ``node_xid_memory_24h`` →
    ``xid_memory``)."""
    s = name.removeprefix("node_max_").removesuffix("_rel")
    m = _XID.match(s)
    if m:
        return f"xid_{m.group(2)}"
    s = _WINDOW.sub("", s)
    for suffix in ("_lifetime", "_now", "_frac", "_active_hours"):
        s = s.removesuffix(suffix)
    return _SIGNAL_ALIASES.get(s, s)


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason: the feature behind it, its signal, the GPU's value, the fleet median
    it is compared with (same GPU model, same time), the contribution to the risk (log
    odds) and the sentence."""

    feature: str
    signal: str
    value: float
    median: float | None
    gpu_model: str | None
    contribution: float
    text: str


def _peers(median: float | None, gpu_model: str | None, shown: str | None) -> str:
    if median is None or shown is None or (isinstance(median, float) and math.isnan(median)):
        return ""
    who = f"fleet median for {gpu_model}" if gpu_model else "fleet median"
    return f" ({who}: {shown})"


def _label(fd: Any, name: str) -> str:
    """A feature the tables above lack: its catalogue definition's first clause, else its
    column name in words."""
    text = (fd.definition if fd is not None else "") or ""
    for sep in (":", ";", ", "):
        text = text.split(sep, 1)[0]
    if text.count("(") > text.count(")"):
        text = text[: text.rindex("(")].rstrip()
    return text if 0 < len(text) <= 60 else name.replace("_", " ")


def sentence(name: str, value: float, median: float | None, gpu_model: str | None,
             catalogue: Mapping[str, Any] | None = None) -> str:
    """One reason in plain words: what, how much (with its unit, rounded), over which
    window, and the fleet median it is compared with."""
    if value is None or math.isnan(value):
        return f"{_subject(name, catalogue)} not reported"
    if name.startswith("node_max_"):
        base = name.removeprefix("node_max_")
        base_w = _WINDOW.search(base)
        if signal(base) in COUNTS and base_w:
            one, many = COUNTS[signal(base)]
            return (f"{plural(value, one, many)} in {WINDOW_TEXT[base_w.group(1)]}"
                    " on this node's worst GPU"
                    + _peers(median, gpu_model, None if median is None else human(median)))
        return "this node's worst GPU: " + sentence(base, value, median, gpu_model, catalogue)
    if name.endswith("_rel"):
        base = name.removesuffix("_rel")
        what = _subject(base, catalogue)
        return f"{what} at {human(value)}x the fleet median" + (
            f" for {gpu_model}" if gpu_model else "")
    w_match = _WINDOW.search(name)
    w = w_match.group(1) if w_match else ""
    stem = _WINDOW.sub("", name)
    in_w = f" in {WINDOW_TEXT[w]}" if w else ""
    sig = signal(name)

    if stem.endswith("_active_hours") and w:
        base = stem.removesuffix("_active_hours")
        many = COUNTS.get(base, (base, base))[1]
        return (f"new {many} in {human(value)} of the last {WINDOW_HOURS[w]} hours"
                + _peers(median, gpu_model, None if median is None else human(median)))
    if stem.endswith("_lifetime"):
        one, many = COUNTS.get(sig, (sig.replace("_", " "), sig.replace("_", " ")))
        return (f"{plural(value, one, many)} in the GPU's lifetime"
                + _peers(median, gpu_model, None if median is None else human(median)))
    if name in ("node_failure_hours_since", "node_repair_hours_since"):
        what = "failure" if name == "node_failure_hours_since" else "repair"
        cap = WINDOW_HOURS["28d"]
        if value >= cap:
            return f"no {what} of this node in 28 days"
        return f"last {what} of this node {human(value)} h ago" + _peers(
            median, gpu_model, None if median is None or median >= cap else f"{human(median)} h")
    m = _XID.match(name)
    if m and name.endswith("_hours_since"):
        cls = m.group(2)
        cap = WINDOW_HOURS["28d"]
        if value >= cap:
            return f"no {cls} XID in 28 days"
        return f"last {cls} XID {human(value)} h ago" + _peers(
            median, gpu_model, None if median is None or median >= cap else f"{human(median)} h")
    if m and w:
        where = " on this node" if m.group(1) else ""
        return (f"{plural(value, f'{m.group(2)} XID')}{where}{in_w}"
                + _peers(median, gpu_model, None if median is None else human(median)))
    if sig in COUNTS:
        one, many = COUNTS[sig]
        return (f"{plural(value, one, many)}{in_w}"
                + _peers(median, gpu_model, None if median is None else human(median)))
    if name in FLAGS:
        return FLAGS[name] if value >= 0.5 else f"not {FLAGS[name]}"
    if sig in FRACTIONS:
        pct = lambda v: f"{human(100 * v)}%"  # noqa: E731
        return (f"{FRACTIONS[sig]} {pct(value)} of the time{in_w}"
                + _peers(median, gpu_model, None if median is None else pct(median)))
    if stem in LEVELS:
        what, unit = LEVELS[stem]
        over = f" over {WINDOW_TEXT[w]}" if w else ""
        return (f"{what}{over}: {human(value)}{unit}"
                + _peers(median, gpu_model, None if median is None else f"{human(median)}{unit}"))
    if stem == "node_nic_rate_ratio":
        if value >= 1:
            return f"every InfiniBand port of this node at full rate{in_w}"
        return (f"an InfiniBand port of this node ran at {human(100 * value)}% of the "
                f"fastest port's rate{in_w} (a link trained down)")
    if name == "gpu_temp_now":
        return f"GPU temperature now: {human(value)} °C" + _peers(
            median, gpu_model, None if median is None else f"{human(median)} °C")
    if stem == "gpu_temp_slope":
        way = "rising" if value >= 0 else "falling"
        return f"GPU temperature {way} {human(abs(value))} °C/h over {WINDOW_TEXT[w]}" + _peers(
            median, gpu_model, None if median is None else f"{human(median)} °C/h")
    if stem == "gpu_temp_resid":
        way = "hotter" if value >= 0 else "cooler"
        return (f"{human(abs(value))} °C {way} than GPUs of its model at the same power"
                f", over {WINDOW_TEXT[w]}"
                + _peers(median, gpu_model, None if median is None else f"{human(median)} °C"))
    if name == "hours_since_sample":
        return f"last sample {human(value)} h ago" + _peers(
            median, gpu_model, None if median is None else f"{human(median)} h")
    cat = _catalogue() if catalogue is None else catalogue
    return (f"{_label(cat.get(name), name)}{in_w}: {human(value)}"
            + _peers(median, gpu_model, None if median is None else human(median)))


def _subject(name: str, catalogue: Mapping[str, Any] | None) -> str:
    """What a feature counts, without a value (for 'not reported' and ratios)."""
    base = name.removeprefix("node_max_").removesuffix("_rel")
    w_match = _WINDOW.search(base)
    in_w = f" in {WINDOW_TEXT[w_match.group(1)]}" if w_match else ""
    sig = signal(base)
    stem = _WINDOW.sub("", base)
    if sig in COUNTS:
        return COUNTS[sig][1] + in_w
    m = _XID.match(base)
    if m:
        return f"{m.group(2)} XIDs" + in_w
    if sig in FRACTIONS:
        return FRACTIONS[sig] + in_w
    if stem in LEVELS:
        return LEVELS[stem][0] + in_w
    cat = _catalogue() if catalogue is None else catalogue
    return _label(cat.get(base), base) + in_w


def _comparable(name: str, names: Sequence[str]) -> str:
    """The feature whose value and median a reason shows: a fleet ratio is shown as the
    count it divides (310 errors against a median of 0 says more than '311x')."""
    if name.endswith("_rel") and name.removesuffix("_rel") in names:
        return name.removesuffix("_rel")
    return name


def explain_reasons(model: FailureModel, X_rows: Matrix,
                    fleet_medians: Mapping[str, Any] | None = None, *,
                    top: int = 3) -> list[list[Reason]]:
    """For each row, up to ``top`` reasons: one per signal, for the signals that raise its
    risk most, each from the signal's strongest contributing feature.

    ``fleet_medians`` maps GPU model → feature → median (as ``fleet_medians()`` returns;
    rows are matched by their ``model`` column, else ``"*"``), or feature → median for
    the whole fleet. Only positive contributions are reasons; a row with none gets [].
    """
    contrib = model.contributions(X_rows)[:, :-1]  # last column: the bias
    X = model.matrix(X_rows)
    names = list(model.feature_names_in_)
    col = {n: j for j, n in enumerate(names)}
    meds = fleet_medians or {}
    flat = bool(meds) and not isinstance(next(iter(meds.values())), Mapping)
    gpu_models: list[Any] = [None] * len(X)
    if isinstance(X_rows, pa.Table) and "model" in X_rows.column_names:
        gpu_models = X_rows.column("model").to_pylist()
    elif isinstance(X_rows, Mapping) and "model" in X_rows:
        gpu_models = list(X_rows["model"])
    cat = _catalogue()
    signals = [signal(n) for n in names]
    out: list[list[Reason]] = []
    for i in range(len(X)):
        order = sorted(range(len(names)), key=lambda j: (-contrib[i, j], j))
        gm = gpu_models[i]
        peer = meds if flat else (meds.get(gm) or meds.get(FLEET) or {}) if meds else {}
        reasons: list[Reason] = []
        seen: set[str] = set()
        for j in order:
            if len(reasons) >= top or not contrib[i, j] > 0:
                break
            if signals[j] in seen:
                continue
            seen.add(signals[j])
            shown = _comparable(names[j], names)
            value = float(X[i, col[shown]])
            med = peer.get(shown) if peer else None
            med = None if med is None else float(med)
            reasons.append(Reason(names[j], signals[j], value, med, gm, float(contrib[i, j]),
                                  sentence(shown, value, med, gm, cat)))
        out.append(reasons)
    return out


def explain(model: FailureModel, X_rows: Matrix,
            fleet_medians: Mapping[str, Any] | None = None, *, top: int = 3) -> list[list[str]]:
    """For each row, the sentences of ``explain_reasons`` (one reason per signal)."""
    return [[r.text for r in row]
            for row in explain_reasons(model, X_rows, fleet_medians, top=top)]
