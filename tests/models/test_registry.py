"""Registry: save / load / current / list_models / promote in the store's DuckDB."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetcare.models import registry
from fleetcare.models.model import FailureModel
from fleetcare.models.registry import ModelNotFoundError

from .conftest import T0, planted_rows


def _model(seed: int) -> FailureModel:
    X, y = planted_rows(800, seed=seed, base_rate_logit=-3.0)
    return FailureModel(seed=seed, n_estimators=10).fit(X[:600], y[:600], X_cal=X[600:],
                                                        y_cal=y[600:])


def test_save_load_current_list_promote(store):
    assert registry.current(store) is None and registry.list_models(store) == []
    a = _model(0)
    ranges = dict(train_range=(T0, T0 + dt.timedelta(days=6)),
                  cal_range=(T0 + dt.timedelta(days=6), T0 + dt.timedelta(days=7)),
                  test_range=(T0 + dt.timedelta(days=7), T0 + dt.timedelta(days=10)))
    ra = registry.save(store, a, metrics={"pr_auc": 0.5, "recall_at_budget": None},
                       created_at=T0 + dt.timedelta(days=10), **ranges)
    assert ra.model_id.startswith("m-20250311T000000-") and len(ra.model_id) == 26
    assert ra.is_current  # the first model becomes current
    assert ra.train_range == ranges["train_range"] and ra.test_range == ranges["test_range"]
    assert ra.features == ["f0", "f1", "f2", "f3"]
    assert ra.params["seed"] == 0 and ra.metrics == {"pr_auc": 0.5, "recall_at_budget": None}
    assert ra.horizon_h == 24.0 and ra.created_at == T0 + dt.timedelta(days=10)

    X, _ = planted_rows(50, seed=9)
    loaded = registry.load(store, ra.model_id)
    assert loaded.predict_proba(X).tobytes() == a.predict_proba(X).tobytes()

    rb = registry.save(store, _model(1), created_at=T0 + dt.timedelta(days=11))
    assert not rb.is_current  # a later model waits for promote
    assert registry.current(store).model_id == ra.model_id
    assert [r.model_id for r in registry.list_models(store)] == [rb.model_id, ra.model_id]

    assert registry.promote(store, rb.model_id).is_current
    assert registry.current(store).model_id == rb.model_id
    assert [r.is_current for r in registry.list_models(store)] == [True, False]


def test_unknown_model(store):
    with pytest.raises(ModelNotFoundError, match="no model 'm-x'") as exc:
        registry.load(store, "m-x")
    assert exc.value.model_id == "m-x"
    with pytest.raises(ModelNotFoundError):
        registry.promote(store, "m-x")
    assert registry.current(store) is None
