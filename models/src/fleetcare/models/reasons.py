"""Reasons a human can check: the top contributors to a GPU's risk, as sentences.

Contributions come from LightGBM itself (``pred_contrib=True``, TreeSHAP on the margin).
The top positive contributors of a row become sentences that put the GPU's value next to
its fleet peers (same GPU model, same time), e.g.
``"HBM corrected ECC errors 310/24h, 45x the fleet median for H100"``. Labels and units
come from the feature catalogue (``fleetcare.pipeline.features.FEATURES``); a feature the
catalogue lacks is named by its column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from fleetcare.models.model import FailureModel, Matrix

FLEET = "*"  # key of fleet_medians for rows whose GPU model is unknown


def _catalogue() -> dict[str, Any]:
    try:
        from fleetcare.pipeline.features import FEATURES
    except ImportError:  # pragma: no cover - pipeline is a dependency
        return {}
    return {f.name: f for f in FEATURES}


def fleet_medians(table: pa.Table, feature_names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per GPU model (and ``"*"`` for the whole fleet): the median of each feature, NaN-aware."""
    from fleetcare.models.model import as_matrix

    X, _ = as_matrix(table, feature_names)
    out: dict[str, dict[str, float]] = {}
    groups: dict[str, np.ndarray] = {FLEET: np.ones(len(X), dtype=bool)}
    if "model" in table.column_names:
        gpu_models = np.asarray(table.column("model").to_pylist(), dtype=object)
        for m in sorted({str(v) for v in gpu_models if v is not None}):
            groups[m] = gpu_models == m
    for key, mask in groups.items():
        meds: dict[str, float] = {}
        for j, name in enumerate(feature_names):
            col = X[mask, j]
            col = col[~np.isnan(col)]
            meds[name] = float(np.median(col)) if len(col) else math.nan
        out[key] = meds
    return out


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"


def _ratio(r: float) -> str:
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}".rstrip("0").rstrip(".") + "x"


COUNT_UNITS = {"errors", "events", "replays", "pages", "rows", "recoveries", "transitions",
               "incidents"}
UNIT_TEXT = {"percent": "%", "degC": " °C", "degC/h": " °C/h", "W": " W", "h": " h",
             "as base": "", "ratio": "x", "flag": "", "fraction": ""}
MAX_LABEL = 60


def label(fd: Any) -> str:
    """A short label from a catalogue entry: the definition's first clause, else the name."""
    text = fd.definition or fd.name
    for sep in (":", ";", ", "):
        text = text.split(sep, 1)[0]
    if text.count("(") > text.count(")"):  # a cut inside a parenthesis
        text = text[: text.rindex("(")].rstrip()
    if len(text) > 40 and text.endswith(")") and " (" in text:
        text = text[: text.rindex(" (")]
    return text if 0 < len(text) <= MAX_LABEL else fd.name


def _value(value: float, unit: str, window: str) -> tuple[str, str]:
    """(the value with its unit, the unit suffix to use for the median)."""
    timed = window not in ("", "now", "28d")
    if unit in COUNT_UNITS:
        suffix = f"/{window}" if timed else f" {unit}"
        return f"{_num(value)}{suffix}", suffix
    if unit == "fraction":
        return f"{_num(100 * value)}% of the time", "%"
    if unit.startswith("/"):
        return f"{_num(value)}{unit}", unit
    suffix = UNIT_TEXT.get(unit, f" {unit}" if unit else "")
    return f"{_num(value)}{suffix}", suffix


def sentence(name: str, value: float, median: float | None, gpu_model: str | None,
             catalogue: Mapping[str, Any] | None = None) -> str:
    """One reason: the feature's label, the GPU's value and how it compares to its peers."""
    cat = _catalogue() if catalogue is None else catalogue
    fd = cat.get(name)
    text_label = label(fd) if fd is not None else name
    unit = (fd.unit or "") if fd is not None else ""
    window = (fd.window or "") if fd is not None else ""
    if unit not in COUNT_UNITS and not unit.startswith("/") and window not in ("", "now", "28d") \
            and fd is not None and text_label != fd.name:
        text_label = f"{text_label} over {window}"
    peers = f"the fleet median for {gpu_model}" if gpu_model else "the fleet median"
    if value is None or math.isnan(value):
        return f"{text_label} not reported"
    shown, suffix = _value(value, unit, window)
    text = f"{text_label} {shown}"
    if median is None or math.isnan(median):
        return text
    if median > 0 and value > 0:
        r = value / median
        if r >= 1.5:
            return f"{text}, {_ratio(r)} {peers}"
        if r <= 1 / 1.5:
            return f"{text}, {_ratio(1 / r)} below {peers}"
    med = _num(100 * median) if unit == "fraction" else _num(median)
    return f"{text} ({peers[4:]}: {med}{suffix})"


def explain(model: FailureModel, X_rows: Matrix,
            fleet_medians: Mapping[str, Any] | None = None, *, top: int = 3) -> list[list[str]]:
    """For each row, up to ``top`` sentences for the features that raise its risk most.

    ``fleet_medians`` maps GPU model → feature → median (as ``fleet_medians()`` returns;
    rows are matched by their ``model`` column, else ``"*"``), or feature → median for
    the whole fleet. Only positive contributions are reasons; a row with none gets [].
    """
    contrib = model.contributions(X_rows)[:, :-1]  # last column: the bias
    X = model.matrix(X_rows)
    names = model.feature_names_in_
    meds = fleet_medians or {}
    flat = bool(meds) and not isinstance(next(iter(meds.values())), Mapping)
    gpu_models: list[Any] = [None] * len(X)
    if isinstance(X_rows, pa.Table) and "model" in X_rows.column_names:
        gpu_models = X_rows.column("model").to_pylist()
    elif isinstance(X_rows, Mapping) and "model" in X_rows:
        gpu_models = list(X_rows["model"])
    cat = _catalogue()
    out: list[list[str]] = []
    for i in range(len(X)):
        order = sorted(range(len(names)), key=lambda j: (-contrib[i, j], j))
        gm = gpu_models[i]
        peer = meds if flat else (meds.get(gm) or meds.get(FLEET) or {}) if meds else {}
        reasons = []
        for j in order[:top]:
            if not contrib[i, j] > 0:
                break
            med = peer.get(names[j]) if peer else None
            reasons.append(sentence(names[j], float(X[i, j]), med, gm, cat))
        out.append(reasons)
    return out
