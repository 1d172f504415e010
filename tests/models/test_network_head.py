"""The network head (issue 16): a node-level model of cable/switch and NIC failures that
``train`` fits beside the GPU model when the fleet has InfiniBand ports and network
failures, that travels in the model's bytes, and that scoring combines into each node's
risk with reasons in plain words. Simulated data."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.models import network_head, registry, scoring, training
from fleetcare.models.model import FailureModel
from fleetcare.pipeline import nic_features, nic_rollup
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store

H = dt.timedelta(hours=1)


def _fleet(tmp: Path, name: str, spec: FleetSpec, days: int) -> Store:
    sim = FleetSimulator(spec, simulate_incidents(spec, days))
    store = Store(tmp / f"{name}.duckdb")
    load_history(store, sim, spec.start, spec.start + days * 24 * H, interval_s=600)
    return store


@pytest.fixture(scope="module")
def nic_fleet(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """32 nodes x 20 days with 8 InfiniBand ports each, every rate x60 (network failures
    are a tenth of all: 20 here, 14 with precursors, 4 of those in the test period)."""
    return _fleet(tmp_path_factory.mktemp("net"), "nic",
                  FleetSpec(nodes=32, seed=7, failure_scale=60, nic_ports=8), 20)


@pytest.fixture(scope="module")
def trained(nic_fleet: Store) -> training.TrainResult:
    return training.train(nic_fleet, seed=0)


def test_train_fits_a_head_that_travels_in_the_models_bytes(
        nic_fleet: Store, trained: training.TrainResult) -> None:
    head = trained.model.network_head_
    assert head is not None and head.n_train_positives_ > 0
    assert trained.metrics["network_head"]["features"] == len(nic_features.FEATURE_NAMES)
    loaded = registry.load(nic_fleet, trained.model_id)
    assert loaded.network_head_ is not None
    X = np.random.default_rng(0).exponential(5.0, (50, head.n_features_in_)).astype(np.float32)
    assert np.array_equal(loaded.network_head_.predict_proba(X), head.predict_proba(X))
    # a model without one writes none and reads back without one
    bare = FailureModel.from_bytes(trained.model.to_bytes())
    bare.network_head_ = None
    assert "network_head" not in json.loads(bare.to_bytes())
    assert FailureModel.from_bytes(bare.to_bytes()).network_head_ is None


def test_scoring_combines_the_head_into_the_nodes_risk(
        nic_fleet: Store, trained: training.TrainResult) -> None:
    """Two hours before each precursor network failure of the test period the node's
    risk is its GPUs' combined with the head's, and where the head outweighs the GPUs
    the reasons say what the ports counted."""
    cur = nic_fleet.cursor()
    fails = cur.execute(
        "SELECT node, ts FROM incidents WHERE kind = 'failure' AND mode IN ('link', 'nic') "
        "AND cause IN ('network_switch_cable', 'nic') AND ts >= ? ORDER BY ts",
        [trained.record.test_range[0].replace(tzinfo=None)]).fetchall()
    assert len(fails) >= 2
    head = trained.model.network_head_
    said = 0
    for node, ts in fails:
        at = (ts - 2 * H).replace(tzinfo=dt.UTC)
        res = scoring.score(nic_fleet, at=at, model=trained.model_id)
        gpus = res.gpu_scores.filter(res.gpu_scores.column("node").to_numpy(zero_copy_only=False) == node)
        if gpus.num_rows == 0:
            continue  # the node was down then (an earlier failure's repair)
        r_gpu = 1.0 - np.prod(1.0 - gpus.column("risk").to_numpy())
        rows, p = network_head.predict_latest(head, nic_fleet, at, nodes=[node])
        assert rows.num_rows == 1
        row = [r for r in res.node_scores.to_pylist() if r["node"] == node][0]
        assert row["risk"] == pytest.approx(1.0 - (1.0 - r_gpu) * (1.0 - p[0]), rel=1e-9)
        if p[0] > r_gpu and row["risk"] >= scoring.EXPLAIN_FLOOR:
            reasons = json.loads(row["reasons"])
            assert reasons[0].startswith("network risk") and "InfiniBand" in reasons[0]
            said += 1
    assert said >= 1


def test_no_head_without_network_failures(tmp_path: Path) -> None:
    """A fleet without InfiniBand ports gets no head; its model and scores are as before."""
    store = _fleet(tmp_path, "gpu", FleetSpec(nodes=16, seed=3, failure_scale=60), 12)
    res = training.train(store, seed=0, register=False, min_failures=1)
    assert res.model.network_head_ is None and res.metrics["network_head"] is None
    spec_start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert network_head.fit([network_head.Period(store, spec_start, spec_start + 9 * 24 * H)],
                            horizon_h=72, seed=0) is None


def test_the_heads_probability_is_matched_by_time_and_node() -> None:
    t = np.array(["2026-01-01T01", "2026-01-01T01", "2026-01-01T02"], dtype="datetime64[us]")
    node = np.array(["a", "b", "a"], dtype=object)
    risk = np.array([0.5, 0.2, 0.0])
    p = network_head.probability_at(t, node, t[[2, 1]], np.array(["a", "b"], dtype=object),
                                    np.array([0.5, 0.5]))
    out = network_head.combine(risk, p)
    assert out.tolist() == [0.5, 0.6, 0.5]


def test_evaluate_scores_the_shipped_prior_with_its_head(
        nic_fleet: Store, trained: training.TrainResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evaluate`` measures the fleet prior as it scores: its node risks combined with
    the network head it ships, over the test period."""
    from fleetcare.models import evaluation

    blob = trained.model.to_bytes()
    shipped = FailureModel.from_bytes(blob)
    monkeypatch.setattr(evaluation, "_shipped_prior",
                        lambda cfg: (shipped, {"threshold": 0.5}, blob))
    heads: list[FailureModel] = []
    real = network_head.lookup

    def spy(head: FailureModel, spans: list) -> network_head.Lookup:
        heads.append(head)
        return real(head, spans)

    monkeypatch.setattr(network_head, "lookup", spy)
    got = evaluation.evaluate_store(nic_fleet)["prior"]["at_shipped_threshold"]
    assert any(h is shipped.network_head_ for h in heads)
    caught = sum(got["detected_by_mode"].get(m, [0, 0])[0] for m in ("link", "nic"))
    assert caught >= 1


def test_the_shipped_priors_head_alarms_at_its_own_threshold(
        nic_fleet: Store, trained: training.TrainResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet prior's operating point is one threshold per head (its meta's
    ``network_head.threshold``): a node alarms when its combined risk reaches the prior's
    threshold or its network probability reaches the head's. Above every risk the first
    alone catches nothing; the head's threshold then catches network failures."""
    from fleetcare.models import evaluation

    blob = trained.model.to_bytes()
    shipped = FailureModel.from_bytes(blob)

    def at_shipped(meta: dict) -> dict:
        monkeypatch.setattr(evaluation, "_shipped_prior", lambda cfg: (shipped, meta, blob))
        return evaluation.evaluate_store(nic_fleet)["prior"]["at_shipped_threshold"]

    def caught(got: dict, net: bool) -> int:
        return sum(c for m, (c, _) in got["detected_by_mode"].items()
                   if (m in network_head.MODES) == net)

    one = at_shipped({"threshold": 1.01})
    assert one["network_threshold"] is None and one["detected_by_mode"]
    assert caught(one, net=True) == caught(one, net=False) == 0 == one["false_drains"]
    per_head = at_shipped({"threshold": 1.01, "network_head": {"threshold": 0.3}})
    assert per_head["network_threshold"] == 0.3
    assert caught(per_head, net=True) >= 1


def test_alarm_risk_raises_a_row_to_the_threshold_where_the_head_reaches_its_own() -> None:
    risk = np.array([0.2, 0.95, 0.2, 0.4])
    p_net = np.array([0.05, 0.0, 0.12, 0.3])
    assert network_head.alarm_risk(risk, p_net, 0.9, 0.1).tolist() == [0.2, 0.95, 0.9, 0.9]
    assert network_head.alarm_risk(risk, p_net, 0.9, None).tolist() == risk.tolist()


def test_a_head_fitted_on_sampled_negatives_keeps_the_base_rate(nic_fleet: Store) -> None:
    """``negatives`` < 1 (the fleet prior's many node-hours) keeps a share of the rows
    without a network failure ahead, weighted back: probabilities stay at the base rate
    (unweighted, they would be about 1 / share too high)."""
    nic_rollup.refresh(nic_fleet)
    lo, hi = (t.replace(tzinfo=dt.UTC) for t in nic_fleet.cursor().execute(
        "SELECT min(ts), max(ts) FROM nic_telemetry").fetchone())
    lo = lo + 24 * H
    periods = [network_head.Period(nic_fleet, lo, hi)]
    r = network_head.rows(nic_fleet, lo, hi, horizon_h=72)
    base = r.y[~r.after].mean()
    for share in (1.0, 0.25):
        head = network_head.fit(periods, horizon_h=72, seed=0, negatives=share)
        assert head is not None
        p = head.predict_proba(r.X[~r.after])[:, 1]
        assert p.mean() == pytest.approx(base, rel=0.5), share
    with pytest.raises(ValueError, match="negatives"):
        network_head.fit(periods, horizon_h=72, seed=0, negatives=0.0)


def test_a_fleet_simulated_at_raised_rates_teaches_without_raising_the_base_rate(
        nic_fleet: Store) -> None:
    """A period weighing its failure rows ``1 / k`` (a fleet simulated with every rate
    x k, as the fleet prior's extra network fleet is) calibrates to the base rate those
    weights give, not to the raised one."""
    nic_rollup.refresh(nic_fleet)
    lo, hi = (t.replace(tzinfo=dt.UTC) for t in nic_fleet.cursor().execute(
        "SELECT min(ts), max(ts) FROM nic_telemetry").fetchone())
    lo = lo + 24 * H
    r = network_head.rows(nic_fleet, lo, hi, horizon_h=72)
    y = r.y[~r.after]
    weighted = 0.25 * y.sum() / (0.25 * y.sum() + (~y).sum())
    head = network_head.fit([network_head.Period(nic_fleet, lo, hi, weight=0.25)],
                            horizon_h=72, seed=0)
    assert head is not None
    p = head.predict_proba(r.X[~r.after])[:, 1]
    # isotonic calibration keeps the weighted mean: the failure rows weigh a quarter
    assert np.average(p, weights=np.where(y, 0.25, 1.0)) == pytest.approx(weighted, rel=0.5)
    assert p.mean() < 0.6 * y.mean()  # unweighted, it would sit at y.mean()
    with pytest.raises(ValueError, match="weight"):
        network_head.fit([network_head.Period(nic_fleet, lo, hi, weight=0.0)],
                         horizon_h=72, seed=0)


def test_nic_rows_weigh_more_in_the_boosters_only(
        nic_fleet: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nic_weight`` (the fleet prior's head: ``prior.NIC_WEIGHT``) multiplies the
    weight of the rows with a NIC failure ahead in every booster's fit, and in nothing
    else: the calibration keeps weight 1, so probabilities keep the base rate."""
    nic_rollup.refresh(nic_fleet)
    lo, hi = (t.replace(tzinfo=dt.UTC) for t in nic_fleet.cursor().execute(
        "SELECT min(ts), max(ts) FROM nic_telemetry").fetchone())
    lo = lo + 24 * H
    # this fleet's network failures are cable ones: call every other one a NIC's
    real = network_head._failures(nic_fleet)
    cables = [i for i, f in enumerate(real) if f[2] == "network_switch_cable"]
    relabelled = [(n, t, "nic") if i in cables[::2] else (n, t, c)
                  for i, (n, t, c) in enumerate(real)]
    monkeypatch.setattr(network_head, "_failures", lambda store: relabelled)
    r = network_head.rows(nic_fleet, lo, hi, horizon_h=72)
    assert r.nic.any() and (r.y & ~r.nic).any() and not (r.nic & ~r.y).any()
    fits: list[np.ndarray] = []
    cals: list[np.ndarray | None] = []
    real_fit, real_cal = FailureModel.fit, FailureModel.calibrate_margins

    def fit(self: FailureModel, X: np.ndarray, y: np.ndarray, **k: object) -> FailureModel:
        fits.append(np.asarray(k["sample_weight"]))
        return real_fit(self, X, y, **k)  # type: ignore[arg-type]

    def cal(self: FailureModel, margin: np.ndarray, y: np.ndarray, *,
            weight: np.ndarray | None = None) -> FailureModel:
        cals.append(weight)
        return real_cal(self, margin, y, weight=weight)

    monkeypatch.setattr(FailureModel, "fit", fit)
    monkeypatch.setattr(FailureModel, "calibrate_margins", cal)
    head = network_head.fit([network_head.Period(nic_fleet, lo, hi)], horizon_h=72, seed=0,
                            nic_weight=8.0)
    assert head is not None and cals == [None]  # calibration: weight 1
    whole = fits[-1]  # the shipped booster fits every row kept: outside an aftermath,
    # labels known by the period's end
    kept = ~r.after & (r.ts + np.timedelta64(72, "h") <= network_head._np(hi))
    assert len(whole) == kept.sum()
    assert set(whole[r.nic[kept]].tolist()) == {8.0}
    assert set(whole[~r.nic[kept]].tolist()) == {1.0}
    p = head.predict_proba(r.X[kept])[:, 1]
    assert p.mean() == pytest.approx(r.y[kept].mean(), rel=0.5)


def test_out_of_fold_calibration_purges_rows_that_share_a_failure_with_the_held_out_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's label looks ``horizon_h`` ahead, so the rows just before a held-out block of
    time and those just after it are labelled by the same failures as the block's own rows.
    The booster that scores a block out of fold must not fit on them (else the calibrator
    learns from margins that saw the answer): every fold's booster fits only rows at least
    ``horizon_h`` from the block it scores, on both sides."""
    horizon_h = 72.0
    hours = np.arange(0, 40 * 24, dtype=np.int64)  # 40 days, one row an hour
    ts = (np.datetime64("2026-01-01T00:00", "us")
          + hours.astype("timedelta64[h]").astype("timedelta64[us]"))
    rng = np.random.default_rng(0)
    X = np.column_stack([hours.astype(np.float32), rng.random(len(hours)).astype(np.float32)])
    y = (hours % 97) < 30  # positives in every block
    fitted: list[np.ndarray] = []
    scored: list[np.ndarray] = []
    real_fit, real_margin = FailureModel.fit, FailureModel.decision_function

    def fit(self: FailureModel, X: np.ndarray, *a: object, **k: object) -> FailureModel:
        fitted.append(np.asarray(X)[:, 0].copy())
        return real_fit(self, X, *a, **k)  # type: ignore[arg-type]

    def margin(self: FailureModel, X: np.ndarray) -> np.ndarray:
        scored.append(np.asarray(X)[:, 0].copy())
        return real_margin(self, X)

    monkeypatch.setattr(FailureModel, "fit", fit)
    monkeypatch.setattr(FailureModel, "decision_function", margin)
    network_head.fit_matrix(X, y, ts, ["hour", "noise"], horizon_h=horizon_h, seed=0)
    assert len(scored) == network_head.FOLDS and len(fitted) == network_head.FOLDS + 1
    for train, block in zip(fitted, scored, strict=False):
        lo, hi = block.min(), block.max()
        near = (train > lo - horizon_h) & (train < hi + horizon_h)
        assert not near.any(), (lo, hi, np.sort(train[near])[[0, -1]])
    assert len(fitted[-1]) == len(hours)  # the shipped booster fits every row
