"""Explanations: LightGBM's contributions, as one plain sentence per signal."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.models.model import FailureModel
from fleetcare.models.reasons import (
    FLEET,
    explain,
    explain_reasons,
    fleet_medians,
    human,
    plural,
    sentence,
    signal,
)
from fleetcare.pipeline.features import FEATURES

from .conftest import planted_rows

H100 = "H100 80GB"
PLURAL_AFTER_ONE = re.compile(r"\b1 ([A-Za-z]+ ){0,3}(errors|XIDs|rows|pages|replays|recoveries|drops"
                              r"|failures|repairs|RMAs|GPUs|links|incidents)\b")


def _model_and_rows():
    X, y = planted_rows(4000, seed=5)
    X[:, 0] = np.where(X[:, 0] > 0, np.round(np.exp(2 * X[:, 0]) * 6), 0.0)
    names = ["ecc_corrected_24h", "gpu_temp_c", "noise_a", "noise_b"]
    model = FailureModel(n_estimators=60).fit(X[:3000], y[:3000], X_cal=X[3000:],
                                              y_cal=y[3000:], feature_names=names)
    return model, names


def test_sentence_has_plain_name_unit_window_and_fleet_median():
    assert sentence("ecc_corrected_24h", 310.0, 0.0, H100) == (
        "310 corrected ECC errors in 24 h (fleet median for H100 80GB: 0)")
    assert sentence("gpu_temp_max_6h", 91.4, 70.2, "H100") == (
        "peak GPU temperature over 6 h: 91 °C (fleet median for H100: 70 °C)")
    assert sentence("throttle_power_frac_1h", 0.5, 0.0, "H100") == (
        "power throttling 50% of the time in 1 h (fleet median for H100: 0%)")
    assert sentence("xid_bus_24h", 2.0, 0.0, None) == "2 bus XIDs in 24 h (fleet median: 0)"
    assert sentence("nvlink_recovery_7d", 12.0, 1.0, "A100") == (
        "12 NVLink recoveries in 7 days (fleet median for A100: 1)")
    assert sentence("gpu_temp_resid_24h", -3.26, 0.0, "A100") == (
        "3.3 °C cooler than GPUs of its model at the same power, over 24 h "
        "(fleet median for A100: 0 °C)")
    assert sentence("ecc_corrected_24h", float("nan"), 0.0, "H100") == (
        "corrected ECC errors in 24 h not reported")
    assert sentence("node_failure_hours_since", 30.0, 672.0, "H100") == (
        "last failure of this node 30 h ago")
    assert sentence("node_repair_hours_since", 672.0, 672.0, None) == (
        "no repair of this node in 28 days")
    assert sentence("node_nic_flaps_24h", 3.0, 0.0, "H100") == (
        "3 InfiniBand link flaps on this node in 24 h (fleet median for H100: 0)")
    assert sentence("node_nic_rate_ratio_24h", 0.5, 1.0, "H100") == (
        "an InfiniBand port of this node ran at 50% of the fastest port's rate in 24 h "
        "(a link trained down)")


def test_no_raw_feature_names_or_odd_phrasing_for_any_catalogued_feature():
    """Every feature of the catalogue reads as words: no column names, no "x below",
    no "1 incidents"."""
    for fd in FEATURES:
        for value, median in ((1.0, 0.0), (2.0, 6.5), (0.25, 0.8)):
            text = sentence(fd.name, value, median, H100)
            assert "_" not in text, f"{fd.name}: raw name in {text!r}"
            assert "below the fleet median" not in text, text
            if value == 1.0:
                assert not PLURAL_AFTER_ONE.search(text), f"plural after 1: {text!r}"


@pytest.mark.parametrize(("name", "one", "many"), [
    ("node_repairs_28d", "1 repair or RMA of this node in 28 days",
     "2 repairs or RMAs of this node in 28 days"),
    ("node_failures_28d", "1 failure of this node in 28 days",
     "2 failures of this node in 28 days"),
    ("nvlink_crc_1h", "1 NVLink CRC error in 1 h", "2 NVLink CRC errors in 1 h"),
    ("xid_memory_6h", "1 memory XID in 6 h", "2 memory XIDs in 6 h"),
    ("remapped_rows_lifetime", "1 remapped memory row in the GPU's lifetime",
     "2 remapped memory rows in the GPU's lifetime"),
])
def test_pluralisation(name, one, many):
    assert sentence(name, 1.0, None, None) == one
    assert sentence(name, 2.0, None, None) == many


def test_numbers_are_rounded_for_people():
    assert [human(v) for v in (0.0, 310.0, 1234.0, 6.23, 9.96, 87.4, 0.0341, 0.004, -0.004)] == [
        "0", "310", "1,234", "6.2", "10", "87", "0.034", "<0.01", ">-0.01"]
    assert plural(1.0, "error") == "1 error" and plural(0.0, "error") == "0 errors"
    assert sentence("pcie_replay_24h", 1234.0, 3.4999, "H100") == (
        "1,234 PCIe replays in 24 h (fleet median for H100: 3.5)")
    assert sentence("throttle_thermal_frac_24h", 0.35417, 0.00021, None) == (
        "thermal throttling 35% of the time in 24 h (fleet median: 0.021%)")


def test_signal_groups_windows_ratios_and_node_maxima():
    ecc = ["ecc_corrected_1h", "ecc_corrected_6h", "ecc_corrected_24h", "ecc_corrected_7d",
           "ecc_corrected_24h_rel", "node_max_ecc_corrected_24h", "ecc_corrected_lifetime",
           "ecc_corrected_active_hours_24h"]
    assert {signal(n) for n in ecc} == {"ecc_corrected"}
    assert {signal(n) for n in ("xid_memory_1h", "node_xid_memory_24h",
                                "xid_memory_hours_since")} == {"xid_memory"}
    assert signal("gpu_temp_max_6h") == signal("gpu_temp_mean_24h") == "gpu_temp"
    assert signal("gpu_temp_slope_6h") != signal("gpu_temp_mean_6h")
    assert signal("ecc_uncorrected_24h") != signal("ecc_corrected_24h")


def _window_model():
    """A model over three windows of one counter (all predictive) and one other signal."""
    rng = np.random.default_rng(7)
    n = 8000
    # new errors in the last hour, the 5 h before, the 18 h before: each window adds to the
    # one inside it, and recent errors weigh more, so every window carries information
    a, b, c = (np.where(rng.random(n) < 0.15, rng.poisson(10, n), 0).astype(float)
               for _ in range(3))
    pcie = np.where(rng.random(n) < 0.1, rng.poisson(20, n), 0).astype(float)
    noise = rng.normal(size=n)
    X = np.column_stack([a, a + b, a + b + c, pcie, noise])
    p = 1 / (1 + np.exp(-(0.4 * a + 0.25 * b + 0.15 * c + 0.2 * pcie - 7)))
    y = rng.random(n) < p
    names = ["ecc_corrected_1h", "ecc_corrected_6h", "ecc_corrected_24h", "pcie_replay_24h",
             "power_mean_24h"]
    model = FailureModel(n_estimators=80).fit(X[:6000], y[:6000], X_cal=X[6000:],
                                              y_cal=y[6000:], feature_names=names)
    return model, names


def test_one_reason_per_signal_from_its_strongest_window():
    model, names = _window_model()
    rows = pa.table({"model": [H100], "ecc_corrected_1h": [15.0], "ecc_corrected_6h": [60.0],
                     "ecc_corrected_24h": [300.0], "pcie_replay_24h": [80.0],
                     "power_mean_24h": [0.0]})
    contrib = model.contributions(rows)[0, :3]
    assert (contrib > 0).sum() >= 2, "the planted ECC windows should all raise the risk"
    (reasons,) = explain_reasons(model, rows, {H100: dict.fromkeys(names, 0.0)})
    sigs = [r.signal for r in reasons]
    assert len(sigs) == len(set(sigs)), f"one signal twice: {[r.text for r in reasons]}"
    ecc = [r for r in reasons if r.signal == "ecc_corrected"]
    assert len(ecc) == 1 and ecc[0].feature == names[int(np.argmax(contrib))]
    assert "pcie_replay" in sigs
    assert ecc[0].value == {"ecc_corrected_1h": 15.0, "ecc_corrected_6h": 60.0,
                            "ecc_corrected_24h": 300.0}[ecc[0].feature]
    assert ecc[0].median == 0.0 and ecc[0].gpu_model == H100
    assert "fleet median for H100 80GB: 0" in ecc[0].text


def test_a_fleet_ratio_is_shown_as_the_count_it_divides():
    rng = np.random.default_rng(3)
    n = 4000
    ecc = np.where(rng.random(n) < 0.1, rng.poisson(40, n), 0).astype(float)
    rel = ecc / 1.0
    X = np.column_stack([ecc, rel, rng.normal(size=n)])
    y = rng.random(n) < 1 / (1 + np.exp(-(0.2 * ecc - 6)))
    names = ["ecc_corrected_24h", "ecc_corrected_24h_rel", "power_mean_24h"]
    model = FailureModel(n_estimators=60).fit(X[:3000], y[:3000], X_cal=X[3000:],
                                              y_cal=y[3000:], feature_names=names)
    rows = pa.table({"model": ["A100"], "ecc_corrected_24h": [310.0],
                     "ecc_corrected_24h_rel": [310.0], "power_mean_24h": [0.0]})
    (texts,) = explain(model, rows, {"A100": {"ecc_corrected_24h": 0.0,
                                              "ecc_corrected_24h_rel": 0.0,
                                              "power_mean_24h": 0.0}})
    assert texts[0] == "310 corrected ECC errors in 24 h (fleet median for A100: 0)"
    assert sum("ECC" in t for t in texts) == 1


def test_explain_names_planted_feature_with_its_value():
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
    assert out[0][0] == "310 corrected ECC errors in 24 h (fleet median for H100: 6.9)"
    assert len(out[0]) <= 3
    assert not any("ECC" in s for s in out[1])  # ECC 0 lowers risk: never a reason


def test_fleet_medians_per_gpu_model():
    t = pa.table({"model": ["H100", "H100", "A100"], "x": [1.0, 3.0, None]})
    m = fleet_medians(t, ["x"])
    assert m[FLEET]["x"] == 2.0 and m["H100"]["x"] == 2.0 and np.isnan(m["A100"]["x"])
