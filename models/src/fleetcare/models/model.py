"""The fleet-wide failure model: LightGBM, calibrated on a held-out period, serialisable.

``FailureModel`` follows scikit-learn's conventions: ``__init__`` only stores
hyperparameters, ``fit`` returns ``self``, fitted attributes end in ``_`` and
``predict_proba`` is calibrated. Training is deterministic: the same data and ``seed``
give the same booster, byte for byte (``deterministic=True``, row-wise histograms, a
fixed thread count).

Calibration maps the booster's raw margin to a probability, fitted on a calibration
period the booster never saw:

- ``isotonic``  when the calibration set has at least ``min_isotonic_positives``
                positives (non-parametric, needs data);
- ``sigmoid``   Platt scaling otherwise (two parameters, safe with few positives);
- ``prior``     when the calibration set is missing or has one class only: the margin
                is shifted by ``-log(scale_pos_weight)``, undoing the class weighting.

``monotone_increasing`` names features whose rise may never lower the margin (LightGBM
monotone constraints): error counters, where "more errors, less risk" can only be a
fit to noise when a training set holds a few dozen failures.

Exceptions::

    ModelError                 base class
     ├── NotFittedError        predict / explain / serialise before fit
     ├── FitError     (.n_pos) the training data cannot make a model (no positives, ...)
     └── ModelFormatError      bytes that are not a serialised FailureModel
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import lightgbm as lgb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FORMAT = "fleetcare.FailureModel/1"


class ModelError(Exception):
    pass


class NotFittedError(ModelError):
    def __init__(self) -> None:
        super().__init__("this FailureModel is not fitted yet: call fit(X, y, X_cal=, y_cal=) first")


class FitError(ModelError):
    def __init__(self, message: str, *, n_pos: int = 0, n_rows: int = 0) -> None:
        super().__init__(message)
        self.n_pos = n_pos
        self.n_rows = n_rows


class ModelFormatError(ModelError):
    pass


# -- inputs ---------------------------------------------------------------------------
Matrix: TypeAlias = "pa.Table | np.ndarray | Mapping[str, Any]"


def as_matrix(X: Matrix, feature_names: Sequence[str] | None = None, *,
              dtype: Any = np.float64) -> tuple[np.ndarray, list[str]]:
    """A float64 (or ``dtype``) matrix (nulls → NaN) and its column names.

    ``X`` is an Arrow table or a mapping of columns (columns picked by ``feature_names``
    when given, absent ones become all-NaN), or a 2-D array (columns in order).
    """
    if isinstance(X, pa.Table | Mapping):
        cols = list(feature_names) if feature_names is not None else list(
            X.column_names if isinstance(X, pa.Table) else X.keys()
        )
        n = X.num_rows if isinstance(X, pa.Table) else len(next(iter(X.values()), []))
        out = np.full((n, len(cols)), np.nan, dtype=dtype)
        present = X.column_names if isinstance(X, pa.Table) else list(X.keys())
        for j, name in enumerate(cols):
            if name not in present:
                continue
            col = X.column(name) if isinstance(X, pa.Table) else X[name]
            if isinstance(col, pa.ChunkedArray | pa.Array):
                col = pc.fill_null(col, math.nan).to_numpy(zero_copy_only=False)
            out[:, j] = np.asarray(col, dtype=dtype)
        return out, cols
    arr = np.asarray(X, dtype=dtype)
    if arr.ndim != 2:
        raise ValueError(f"X must be 2-D (rows x features), got shape {arr.shape}")
    names = list(feature_names) if feature_names is not None else [f"f{i}" for i in range(arr.shape[1])]
    if len(names) != arr.shape[1]:
        raise ValueError(f"{len(names)} feature names for {arr.shape[1]} columns")
    return arr, names


def _as_labels(y: Any) -> np.ndarray:
    if isinstance(y, pa.ChunkedArray | pa.Array):
        y = pc.fill_null(y, False).to_numpy(zero_copy_only=False)
    return np.asarray(y).astype(bool)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


# -- calibration ------------------------------------------------------------------------
def _fit_calibrator(margin: np.ndarray, y: np.ndarray, *, spw: float, method: str,
                    min_isotonic_positives: int,
                    weight: np.ndarray | None = None) -> dict[str, Any]:
    n_pos = int(y.sum())
    if len(y) == 0 or n_pos == 0 or n_pos == len(y):
        return {"kind": "prior", "shift": -math.log(spw)}
    kind = method
    if kind == "auto":
        kind = "isotonic" if n_pos >= min_isotonic_positives else "sigmoid"
    if kind == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        iso.fit(margin, y.astype(np.float64), sample_weight=weight)
        return {"kind": "isotonic", "x": [float(v) for v in iso.X_thresholds_],
                "y": [float(v) for v in iso.y_thresholds_], "tie_break": "arctan"}
    if kind == "sigmoid":
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(C=1e6, solver="lbfgs", max_iter=1000)
        lr.fit(margin.reshape(-1, 1), y, sample_weight=weight)
        return {"kind": "sigmoid", "a": float(lr.coef_[0, 0]), "b": float(lr.intercept_[0])}
    raise ValueError(f"calibration={method!r}: use 'auto', 'isotonic' or 'sigmoid'")


ISOTONIC_TIE_BREAK = 1e-6
"""Weight of a strictly increasing function of the margin mixed into isotonic
probabilities: isotonic steps are flat (with a few failures in the calibration set the
top step is P = 1 over a wide range of margins), which would tie GPUs the booster ranks
apart; this keeps the map strictly increasing and moves no probability by more than 1e-6.

The function is the calibrator's ``tie_break``: ``arctan`` (``atan(m) / pi + 1/2``) for
calibrators fitted now; ``sigmoid`` for those fitted before it was recorded (the shipped
prior's GPU model among them), whose probabilities stay what they were. The sigmoid is 1.0
in float64 beyond a margin of ~37, and the network head's boosters (weighted healthy rows)
give margins in the hundreds: its top calibration steps tied thousands of node-hours, so
no threshold could hold a small false-drain budget between them."""


def _tie_break(kind: str, margin: np.ndarray) -> np.ndarray:
    if kind == "arctan":
        return np.arctan(margin) / math.pi + 0.5
    if kind == "sigmoid":
        return _sigmoid(margin)
    raise ModelFormatError(f"unknown isotonic tie_break {kind!r}")


def _apply_calibrator(cal: Mapping[str, Any], margin: np.ndarray) -> np.ndarray:
    kind = cal["kind"]
    if kind == "isotonic":
        iso = np.interp(margin, np.asarray(cal["x"]), np.asarray(cal["y"]))
        return ((1.0 - ISOTONIC_TIE_BREAK) * iso
                + ISOTONIC_TIE_BREAK * _tie_break(cal.get("tie_break", "sigmoid"), margin))
    if kind == "sigmoid":
        return _sigmoid(cal["a"] * margin + cal["b"])
    if kind == "prior":
        return _sigmoid(margin + cal["shift"])
    raise ModelFormatError(f"unknown calibrator kind {kind!r}")


# -- the model --------------------------------------------------------------------------
class FailureModel:
    """P(failure within ``horizon_h``) per GPU from its features; LightGBM + calibration."""

    network_head_: FailureModel | None = None
    """A node-level model of network failures (``network_head``), when one was fitted
    (set by ``training``; a class default, as nothing is fitted in ``__init__``): a node's
    risk combines it with its GPUs' (``network_head.combine``)."""

    def __init__(self, *, horizon_h: float = 24.0, seed: int = 0, n_estimators: int = 200,
                 num_leaves: int = 31, learning_rate: float = 0.05,
                 min_child_samples: int = 10, feature_fraction: float = 0.9,
                 bagging_fraction: float = 0.8, lambda_l2: float = 1.0,
                 scale_pos_weight: float | None = None, max_pos_weight: float = 100.0,
                 calibration: str = "auto", min_isotonic_positives: int = 50,
                 monotone_increasing: Sequence[str] = (), num_threads: int = 2) -> None:
        self.horizon_h = horizon_h
        self.seed = seed
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples
        self.feature_fraction = feature_fraction
        self.bagging_fraction = bagging_fraction
        self.lambda_l2 = lambda_l2
        self.scale_pos_weight = scale_pos_weight
        self.max_pos_weight = max_pos_weight
        self.calibration = calibration
        self.min_isotonic_positives = min_isotonic_positives
        self.monotone_increasing = tuple(monotone_increasing)
        self.num_threads = num_threads

    _PARAM_NAMES = ("horizon_h", "seed", "n_estimators", "num_leaves", "learning_rate",
                    "min_child_samples", "feature_fraction", "bagging_fraction", "lambda_l2",
                    "scale_pos_weight", "max_pos_weight", "calibration",
                    "min_isotonic_positives", "monotone_increasing", "num_threads")

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._PARAM_NAMES}

    def set_params(self, **params: Any) -> FailureModel:
        for name, value in params.items():
            if name not in self._PARAM_NAMES:
                raise ValueError(f"unknown parameter {name!r}; valid: {', '.join(self._PARAM_NAMES)}")
            setattr(self, name, tuple(value) if name == "monotone_increasing" else value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"FailureModel({args})"

    def lgb_params(self, spw: float, feature_names: Sequence[str] = ()) -> dict[str, Any]:
        """The LightGBM parameters used (deterministic for a given seed).

        Features named in ``monotone_increasing`` get LightGBM's monotone constraint +1:
        the margin never falls when such a feature rises (more errors, never less risk).
        """
        up = set(self.monotone_increasing)
        extra: dict[str, Any] = {}
        if up & set(feature_names):
            extra = {"monotone_constraints": [1 if n in up else 0 for n in feature_names],
                     "monotone_constraints_method": "advanced"}
        return {
            "objective": "binary",
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_child_samples": self.min_child_samples,
            "min_sum_hessian_in_leaf": 1e-3,
            "feature_fraction": self.feature_fraction,
            "bagging_fraction": self.bagging_fraction,
            "bagging_freq": 1 if self.bagging_fraction < 1.0 else 0,
            "lambda_l2": self.lambda_l2,
            "scale_pos_weight": spw,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "num_threads": self.num_threads,
            "verbosity": -1,
            **extra,
        }

    def fit(self, X: Matrix, y: Any, *, X_cal: Matrix | None = None, y_cal: Any = None,
            feature_names: Sequence[str] | None = None, sample_weight: Any = None,
            cal_weight: Any = None) -> FailureModel:
        """Fit the booster on ``X``/``y`` and the calibrator on ``X_cal``/``y_cal``.

        ``sample_weight`` / ``cal_weight``: row weights, e.g. 1 / share for healthy rows
        kept by down-sampling (``dataset.sample``), so both see the true base rate."""
        Xm, names = as_matrix(X, feature_names, dtype=np.float32)
        yv = _as_labels(y)
        if len(yv) != Xm.shape[0]:
            raise ValueError(f"X has {Xm.shape[0]} rows but y has {len(yv)}")
        n_pos = int(yv.sum())
        if n_pos == 0 or n_pos == len(yv):
            raise FitError(
                f"cannot fit a failure model on {len(yv)} rows with {n_pos} positives: the "
                "training period needs both failures and healthy rows; train on a longer "
                "range or a larger fleet, or record the failures it had (`fleetcare "
                "incident add`).", n_pos=n_pos, n_rows=len(yv))
        spw = self.scale_pos_weight
        if spw is None:
            spw = min((len(yv) - n_pos) / n_pos, self.max_pos_weight)
        spw = max(float(spw), 1.0)
        params = self.lgb_params(spw, names)
        wv = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        data = lgb.Dataset(Xm, label=yv.astype(np.float64), weight=wv, feature_name=names,
                           params={"verbosity": -1}, free_raw_data=True)
        booster = lgb.train(params, data, num_boost_round=self.n_estimators)
        self.booster_ = booster
        self.feature_names_in_ = names
        self.n_features_in_ = len(names)
        self.classes_ = np.array([False, True])
        self.scale_pos_weight_ = spw
        self.n_train_positives_ = n_pos
        del Xm, data
        if X_cal is not None and y_cal is not None:
            Xc, _ = as_matrix(X_cal, names, dtype=np.float32) if not isinstance(
                X_cal, np.ndarray) else (np.asarray(X_cal, dtype=np.float32), names)
            yc = _as_labels(y_cal)
            margin = np.asarray(booster.predict(Xc, raw_score=True, num_threads=self.num_threads))
        else:
            yc = np.zeros(0, dtype=bool)
            margin = np.zeros(0)
        self.n_cal_positives_ = int(yc.sum())
        cw = None if cal_weight is None or not len(yc) else np.asarray(cal_weight, np.float64)
        self.calibrator_ = _fit_calibrator(
            margin, yc, spw=spw, method=self.calibration,
            min_isotonic_positives=self.min_isotonic_positives, weight=cw)
        return self

    def calibrate_margins(self, margin: np.ndarray, y: Any, *, weight: Any = None
                          ) -> FailureModel:
        """Fit the calibrator on margins given (e.g. out-of-fold margins of boosters like
        this one, fitted without those rows: ``network_head``), in place; ``weight``: row
        weights, as ``fit``'s ``cal_weight``."""
        self._check()
        yv = _as_labels(y)
        w = None if weight is None else np.asarray(weight, dtype=np.float64)
        self.calibrator_ = _fit_calibrator(np.asarray(margin, dtype=np.float64), yv,
                                           spw=self.scale_pos_weight_, method=self.calibration,
                                           min_isotonic_positives=self.min_isotonic_positives,
                                           weight=w)
        self.n_cal_positives_ = int(yv.sum())
        return self

    def recalibrate(self, X_cal: Matrix, y_cal: Any, *, cal_weight: Any = None
                    ) -> FailureModel:
        """A copy with the same booster and a calibrator fitted on ``X_cal``/``y_cal``
        (e.g. the fleet prior recalibrated on one fleet's own recent data)."""
        self._check()
        out = FailureModel.from_bytes(self.to_bytes())
        yc = _as_labels(y_cal)
        margin = out.decision_function(X_cal)
        cw = None if cal_weight is None else np.asarray(cal_weight, dtype=np.float64)
        out.calibrator_ = _fit_calibrator(margin, yc, spw=out.scale_pos_weight_,
                                          method=out.calibration,
                                          min_isotonic_positives=out.min_isotonic_positives,
                                          weight=cw)
        out.n_cal_positives_ = int(yc.sum())
        return out

    # -- prediction ---------------------------------------------------------------------
    def _check(self) -> None:
        if not hasattr(self, "booster_"):
            raise NotFittedError()

    def matrix(self, X: Matrix) -> np.ndarray:
        """``X`` as the booster's input matrix (columns by name for tables), float32 as in
        training: a value rounds the same way whether it is trained on or scored."""
        self._check()
        if isinstance(X, np.ndarray):
            Xm = np.asarray(X, dtype=np.float32)
            if Xm.ndim != 2 or Xm.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has shape {Xm.shape}; this model takes {self.n_features_in_} features "
                    f"({', '.join(self.feature_names_in_[:5])}, ...)")
            return Xm
        return as_matrix(X, self.feature_names_in_, dtype=np.float32)[0]

    def decision_function(self, X: Matrix) -> np.ndarray:
        """The booster's raw margin (log-odds under the class weighting)."""
        Xm = self.matrix(X)
        if Xm.shape[0] == 0:
            return np.zeros(0)
        return np.asarray(self.booster_.predict(Xm, raw_score=True, num_threads=self.num_threads))

    def predict_proba(self, X: Matrix) -> np.ndarray:
        """Calibrated probabilities, shape (n, 2): [P(no failure), P(failure within H)]."""
        margin = self.decision_function(X)
        p = np.clip(_apply_calibrator(self.calibrator_, margin), 0.0, 1.0)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Matrix) -> np.ndarray:
        return self.predict_proba(X)[:, 1] >= 0.5

    def contributions(self, X: Matrix) -> np.ndarray:
        """LightGBM's own per-feature contributions to the margin (SHAP), (n, n_features + 1)."""
        Xm = self.matrix(X)
        if Xm.shape[0] == 0:
            return np.zeros((0, self.n_features_in_ + 1))
        return np.asarray(self.booster_.predict(Xm, pred_contrib=True, num_threads=self.num_threads))

    # -- serialisation --------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        self._check()
        doc = {
            "format": FORMAT,
            "params": self.get_params(),
            "feature_names": self.feature_names_in_,
            "scale_pos_weight": self.scale_pos_weight_,
            "n_train_positives": self.n_train_positives_,
            "n_cal_positives": self.n_cal_positives_,
            "calibrator": self.calibrator_,
            "booster": self.booster_.model_to_string(),
        }
        head = self.network_head_
        if head is not None:  # a node-level network model (``network_head``) rides along
            doc["network_head"] = json.loads(head.to_bytes())
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> FailureModel:
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ModelFormatError(
                    f"format {doc.get('format')!r} is not {FORMAT!r}: not a FailureModel, or "
                    "written by a newer fleetcare; upgrade fleetcare-models")
            params = dict(doc["params"])
            params["monotone_increasing"] = tuple(params.get("monotone_increasing", ()))
            model = cls(**params)
            model.booster_ = lgb.Booster(model_str=doc["booster"])
            model.feature_names_in_ = list(doc["feature_names"])
            model.n_features_in_ = len(model.feature_names_in_)
            model.classes_ = np.array([False, True])
            model.scale_pos_weight_ = float(doc["scale_pos_weight"])
            model.n_train_positives_ = int(doc["n_train_positives"])
            model.n_cal_positives_ = int(doc["n_cal_positives"])
            model.calibrator_ = dict(doc["calibrator"])
            head = doc.get("network_head")
            model.network_head_ = (None if head is None
                                   else cls.from_bytes(json.dumps(head).encode()))
        except ModelFormatError:
            raise
        except (ValueError, KeyError, TypeError, lgb.basic.LightGBMError) as exc:
            raise ModelFormatError(f"cannot read a FailureModel from {len(raw)} bytes: {exc}") from exc
        return model
