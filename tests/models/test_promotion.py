"""Promotion: a new model becomes current only if it beats the current one, or forced."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from fleetcare.models import promotion, registry
from fleetcare.models.model import FailureModel
from fleetcare.models.promotion import consider
from fleetcare.models.training import train

from .conftest import T0
from .test_train_e2e import DAYS, _plant


def _blind_model() -> FailureModel:
    """A model of a feature the store does not have: one constant score for every row."""
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(2000, 1)), rng.random(2000) < 0.05
    return FailureModel(seed=0, n_estimators=10).fit(
        X[:1500], y[:1500], X_cal=X[1500:], y_cal=y[1500:], feature_names=["not_a_feature"])


@pytest.fixture
def trained(store):
    """A store with planted failures, a trained (current) model and a blind one saved
    later on the same ranges (not current)."""
    _plant(store)
    good = train(store, horizon_h=24, seed=0, params={"n_estimators": 60}, min_failures=1,
                 created_at=T0 + dt.timedelta(days=DAYS))
    rec = good.record
    blind = registry.save(store, _blind_model(), metrics={}, train_range=rec.train_range,
                          cal_range=rec.cal_range, test_range=rec.test_range,
                          created_at=T0 + dt.timedelta(days=DAYS, hours=1))
    return store, rec, blind


def test_train_registers_without_promoting_unless_first(trained):
    store, good, blind = trained
    assert good.is_current and not blind.is_current
    d = consider(store, good.model_id)  # what `fleetcare train` asks after training
    assert d.promoted and d.reason == f"{good.model_id} is already the current model"
    assert d.new_metrics is None and d.current_metrics is None


def test_worse_model_is_not_promoted_better_one_is(trained):
    store, good, blind = trained
    d = consider(store, blind.model_id)
    assert not d.promoted
    assert registry.current(store).model_id == good.model_id
    # both models measured on the new model's test period, with training's metric code
    t0, t1 = blind.test_range
    assert d.period == (t0, t1)
    assert d.current_metrics["pr_auc"] > d.new_metrics["pr_auc"]
    assert d.current_metrics["n_failures"] == d.new_metrics["n_failures"] >= 2
    assert d.reason.startswith(
        f"{blind.model_id} does not beat current {good.model_id} on its held-out period "
        f"{t0:%Y-%m-%d %H:%M}..{t1:%Y-%m-%d %H:%M} UTC: pr_auc ")
    assert " < " in d.reason
    # the current model's own registered test metrics are what it scores again here
    assert d.current_metrics["pr_auc"] == pytest.approx(good.metrics["pr_auc"])

    forced = consider(store, blind.model_id, force=True)
    assert forced.promoted and forced.new_metrics is None
    assert forced.reason == (f"{blind.model_id} replaces {good.model_id} because promotion "
                             "was forced (--force); the models were not compared")
    assert registry.current(store).model_id == blind.model_id

    back = consider(store, good.model_id)  # the better model wins the comparison
    assert back.promoted and back.previous_model_id == blind.model_id
    assert back.reason.startswith(f"{good.model_id} beats current {blind.model_id}")
    assert registry.current(store).model_id == good.model_id
    js = back.as_json()
    assert js["promoted"] is True and js["previous_model_id"] == blind.model_id
    assert set(js["new_metrics"]) >= {"pr_auc", "recall_at_budget"}


def test_first_model_and_horizon_mismatch(store):
    _plant(store)
    lone = registry.save(store, _blind_model(), make_current=False)
    d = consider(store, lone.model_id)
    assert d.promoted and d.previous_model_id is None
    assert d.reason == f"{lone.model_id} is current: the registry had no current model"
    other = registry.save(store, FailureModel.from_bytes(_six_hour().to_bytes()),
                          created_at=T0 + dt.timedelta(days=1))
    d = consider(store, other.model_id)
    assert not d.promoted and "horizon 6 h" in d.reason and "--force" in d.reason
    with pytest.raises(registry.ModelNotFoundError):
        consider(store, "m-missing")


def _six_hour() -> FailureModel:
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(600, 1)), rng.random(600) < 0.1
    return FailureModel(horizon_h=6, seed=0, n_estimators=5).fit(X, y)


@pytest.mark.parametrize(("new", "cur", "won", "why"), [
    ({"pr_auc": 0.5}, {"pr_auc": 0.4}, True, "pr_auc 0.5 > 0.4"),
    ({"pr_auc": 0.4}, {"pr_auc": 0.5}, False, "pr_auc 0.4 < 0.5"),
    ({"pr_auc": 0.5, "recall_at_budget": 0.8}, {"pr_auc": 0.5, "recall_at_budget": 0.6},
     True, "pr_auc ties at 0.5, recall_at_budget 0.8 > 0.6"),
    ({"pr_auc": 0.5, "recall_at_budget": 0.6}, {"pr_auc": 0.5, "recall_at_budget": 0.6},
     False, "pr_auc ties at 0.5 and recall_at_budget 0.6 is not higher than 0.6"),
    ({"pr_auc": None}, {"pr_auc": 0.5}, False,
     "pr_auc cannot be computed on this period (no failure in it), so neither model can "
     "be shown better"),
])
def test_beats(new, cur, won, why):
    assert promotion.beats(new, cur) == (won, why)
