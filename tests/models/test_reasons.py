"""Explanations: LightGBM's contributions, as sentences against the fleet."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from fleetcare.models.model import FailureModel
from fleetcare.models.reasons import FLEET, explain, fleet_medians, sentence
from fleetcare.pipeline.features import FeatureDef

from .conftest import planted_rows

CAT = {
    "ecc_corrected_24h": FeatureDef(
        "ecc_corrected_24h", "24h", "errors",
        "corrected (single-bit) ECC errors: reset-aware increase of the volatile counter"),
    "gpu_temp_max_6h": FeatureDef("gpu_temp_max_6h", "6h", "degC", "max GPU temperature"),
    "throttle_power_frac_1h": FeatureDef(
        "throttle_power_frac_1h", "1h", "fraction",
        "fraction of samples with a power clock-event reason (HW power brake 0x80 | SW power cap 0x4)"),
    "xid_bus_24h": FeatureDef(
        "xid_bus_24h", "24h", "events",
        "XIDs of class bus attributed to this GPU (by uuid, else PCI bus id, else index)"),
}
ECC = "corrected (single-bit) ECC errors"


def _model_and_rows():
    X, y = planted_rows(4000, seed=5)
    X[:, 0] = np.where(X[:, 0] > 0, np.round(np.exp(2 * X[:, 0]) * 6), 0.0)
    names = ["ecc_corrected_24h", "gpu_temp_c", "noise_a", "noise_b"]
    model = FailureModel(n_estimators=60).fit(X[:3000], y[:3000], X_cal=X[3000:],
                                              y_cal=y[3000:], feature_names=names)
    return model, names


def test_sentence_formats():
    assert sentence("ecc_corrected_24h", 310.0, 6.9, "H100", CAT) == (
        f"{ECC} 310/24h, 45x the fleet median for H100")
    assert sentence("ecc_corrected_24h", 12.0, 4.0, "H100", CAT) == (
        f"{ECC} 12/24h, 3x the fleet median for H100")
    assert sentence("gpu_temp_max_6h", 91.0, 70.0, "H100", CAT) == (
        "max GPU temperature over 6h 91 °C (fleet median for H100: 70 °C)")
    assert sentence("throttle_power_frac_1h", 0.5, 0.0, "H100", CAT) == (
        "fraction of samples with a power clock-event reason over 1h 50% of the time "
        "(fleet median for H100: 0%)")
    assert sentence("xid_bus_24h", 2.0, 0.0, None, CAT) == (
        "XIDs of class bus attributed to this GPU 2/24h (fleet median: 0/24h)")
    assert sentence("sm_clock_mhz", 700.0, 1980.0, "A100", {}) == (
        "sm_clock_mhz 700, 2.8x below the fleet median for A100")
    assert sentence("ecc_corrected_24h", 5.0, 0.0, "H100", CAT) == (
        f"{ECC} 5/24h (fleet median for H100: 0/24h)")
    assert sentence("gpu_temp_c", 61.0, 60.0, None, {}) == "gpu_temp_c 61 (fleet median: 60)"
    assert sentence("ecc_corrected_24h", float("nan"), 0.0, "H100", CAT) == (
        f"{ECC} not reported")


def test_explain_names_planted_feature_with_its_value(monkeypatch):
    import fleetcare.models.reasons as reasons

    monkeypatch.setattr(reasons, "_catalogue", lambda: CAT)
    model, names = _model_and_rows()
    rows = pa.table({
        "model": ["H100", "H100"],
        "ecc_corrected_24h": [310.0, 0.0], "gpu_temp_c": [0.1, 0.0],
        "noise_a": [0.0, 0.0], "noise_b": [0.0, 0.0],
    })
    meds = {"H100": {"ecc_corrected_24h": 6.9, "gpu_temp_c": 0.0, "noise_a": 0.0,
                     "noise_b": 0.0}}
    out = explain(model, rows, meds)
    assert len(out) == 2
    assert out[0][0] == f"{ECC} 310/24h, 45x the fleet median for H100"
    assert len(out[0]) <= 3
    assert not any("ECC" in s for s in out[1])  # ECC 0 lowers risk: never a reason


def test_fleet_medians_per_gpu_model():
    t = pa.table({"model": ["H100", "H100", "A100"], "x": [1.0, 3.0, None]})
    m = fleet_medians(t, ["x"])
    assert m[FLEET]["x"] == 2.0 and m["H100"]["x"] == 2.0 and np.isnan(m["A100"]["x"])
