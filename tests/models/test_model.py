"""FailureModel: learns a planted signal, calibrated, deterministic, serialisable."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import roc_auc_score

from fleetcare.models.model import (
    FailureModel,
    FitError,
    ModelFormatError,
    NotFittedError,
)

from .conftest import planted_rows

NAMES = ["ecc_corrected_24h", "gpu_temp_c", "noise_a", "noise_b"]


def _fit(seed: int = 0, **params) -> tuple[FailureModel, np.ndarray, np.ndarray]:
    X, y = planted_rows(6000, seed=1)
    model = FailureModel(seed=seed, n_estimators=100, **params).fit(
        X[:3000], y[:3000], X_cal=X[3000:4500], y_cal=y[3000:4500], feature_names=NAMES)
    return model, X[4500:], y[4500:]


def test_learns_planted_signal_and_is_calibrated():
    model, X, y = _fit()
    p = model.predict_proba(X)
    assert p.shape == (len(X), 2)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert roc_auc_score(y, p[:, 1]) > 0.9
    # calibrated: mean predicted probability ~ observed failure rate on held-out rows
    assert abs(p[:, 1].mean() - y.mean()) < 0.02
    assert model.feature_names_in_ == NAMES
    assert model.n_features_in_ == 4
    assert model.calibrator_["kind"] == "isotonic"  # >= 50 positives in the cal set
    assert model.n_cal_positives_ >= 50


def test_sigmoid_when_few_calibration_positives():
    X, y = planted_rows(4000, seed=2)
    model = FailureModel(n_estimators=50).fit(X[:3000], y[:3000], X_cal=X[3000:3300],
                                              y_cal=y[3000:3300])
    assert 0 < model.n_cal_positives_ < 50
    assert model.calibrator_["kind"] == "sigmoid"
    p = model.predict_proba(X[3300:])[:, 1]
    assert abs(p.mean() - y[3300:].mean()) < 0.03


def test_prior_correction_without_calibration_set():
    X, y = planted_rows(3000, seed=3)
    model = FailureModel(n_estimators=50).fit(X, y)
    assert model.calibrator_ == {"kind": "prior", "shift": -np.log(model.scale_pos_weight_)}


def test_same_seed_same_model_byte_for_byte():
    a, X, _ = _fit(seed=7)
    b, _, _ = _fit(seed=7)
    assert a.to_bytes() == b.to_bytes()
    assert a.predict_proba(X).tobytes() == b.predict_proba(X).tobytes()
    c, _, _ = _fit(seed=8)
    assert c.to_bytes() != a.to_bytes()  # bagging and feature sampling follow the seed


def test_serialise_round_trip_identical_predictions():
    model, X, _ = _fit()
    back = FailureModel.from_bytes(model.to_bytes())
    assert back.get_params() == model.get_params()
    assert back.feature_names_in_ == NAMES
    assert back.predict_proba(X).tobytes() == model.predict_proba(X).tobytes()
    assert back.contributions(X[:5]).tobytes() == model.contributions(X[:5]).tobytes()


def test_table_input_selects_columns_by_name():
    model, X, _ = _fit()
    table = pa.table({name: X[:, j] for j, name in reversed(list(enumerate(NAMES)))}
                     | {"node": ["n"] * len(X)})
    assert model.predict_proba(table).tobytes() == model.predict_proba(X).tobytes()


def test_sklearn_conventions():
    m = FailureModel(seed=3, horizon_h=12.0)
    assert m.get_params()["seed"] == 3 and m.get_params()["horizon_h"] == 12.0
    assert not any(k.endswith("_") for k in vars(m))  # nothing fitted in __init__
    with pytest.raises(NotFittedError):
        m.predict_proba(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="unknown parameter 'depth'"):
        m.set_params(depth=3)


def test_no_positives_is_a_clear_error():
    X = np.zeros((10, 2))
    with pytest.raises(FitError, match="10 rows with 0 positives") as exc:
        FailureModel().fit(X, np.zeros(10, dtype=bool))
    assert exc.value.n_pos == 0


def test_garbage_bytes_rejected():
    with pytest.raises(ModelFormatError, match="not a FailureModel"):
        FailureModel.from_bytes(b'{"format": "other"}')
    with pytest.raises(ModelFormatError, match="cannot read"):
        FailureModel.from_bytes(b"\x00garbage")


def test_monotone_features_never_lower_the_margin():
    X, y = planted_rows(4000, seed=4)
    y = y | (X[:, 1] < -2.3)  # a few failures at *low* values of feature 1 (noise to fit)
    free = FailureModel(n_estimators=60).fit(X, y, feature_names=NAMES)
    mono = FailureModel(n_estimators=60, monotone_increasing=["gpu_temp_c"]).fit(
        X, y, feature_names=NAMES)
    assert mono.lgb_params(1.0, NAMES)["monotone_constraints"] == [0, 1, 0, 0]
    assert "monotone_constraints" not in free.lgb_params(1.0, NAMES)
    grid = np.zeros((50, 4))
    grid[:, 1] = np.linspace(-4, 4, 50)
    assert (np.diff(mono.decision_function(grid)) >= 0).all()
    assert (np.diff(free.decision_function(grid)) < 0).any()
    back = FailureModel.from_bytes(mono.to_bytes())
    assert back.monotone_increasing == ("gpu_temp_c",)
    assert back.get_params() == mono.get_params()


def test_isotonic_steps_keep_the_boosters_order():
    model, X, _ = _fit()
    assert model.calibrator_["kind"] == "isotonic"
    Xs = X[np.argsort(model.decision_function(X))]
    margin, p = model.decision_function(Xs), model.predict_proba(Xs)[:, 1]
    rising = np.diff(margin) > 0
    assert (np.diff(p)[rising] > 0).all()  # no flat step ties two GPUs the booster ranks apart
    iso = np.interp(margin, model.calibrator_["x"], model.calibrator_["y"])
    assert np.abs(p - iso).max() <= 1e-6  # and calibration is unchanged


def test_isotonic_steps_keep_the_order_of_large_margins_too():
    """The network head's boosters give margins in the hundreds, where a sigmoid is 1.0 in
    float64: the tie break of calibrators fitted now (``arctan``) still orders them,
    while a calibrator stored without one (the shipped GPU prior's) keeps the sigmoid
    and the probabilities it always gave."""
    from fleetcare.models.model import ISOTONIC_TIE_BREAK, _apply_calibrator

    model, X, _ = _fit()
    cal = model.calibrator_
    assert cal["tie_break"] == "arctan"
    margin = np.array([80.0, 150.0, 300.0, 600.0, 1200.0])
    flat = {"kind": "isotonic", "x": [0.0, 2000.0], "y": [0.2, 0.2]}  # one wide step
    p = _apply_calibrator({**flat, "tie_break": "arctan"}, margin)
    assert (np.diff(p) > 0).all() and np.abs(p - 0.2).max() <= 1e-6
    old = _apply_calibrator(flat, margin)  # as stored before the tie break was recorded
    assert old.tolist() == [(1 - ISOTONIC_TIE_BREAK) * 0.2 + ISOTONIC_TIE_BREAK] * 5
    back = FailureModel.from_bytes(model.to_bytes())
    assert back.calibrator_ == cal
    assert np.array_equal(back.predict_proba(X), model.predict_proba(X))
