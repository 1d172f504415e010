"""The thermal-ramp rule beside the model: a GPU heating hour after hour at the same power
is raised to the rule's risk with a reason, live and on the training grid alike; a GPU that
stepped up once is not. Hand-built telemetry (``tests/pipeline/test_temp_trend.py``)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.models import prior, scoring, thermal_ramp
from fleetcare.pipeline import features
from fleetcare.pipeline.store import Store
from tests.pipeline.test_temp_trend import HOURS, T0, fleet

END = T0 + dt.timedelta(hours=HOURS - 1)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "r.duckdb") as s:
        fleet(s)
        yield s


def _hits(table, ramp) -> set[str]:
    return {g for g, h in zip(table.column("gpu_uuid").to_pylist(), ramp.hit, strict=True)
            if h}


def test_the_ramp_hits_live_and_on_the_grid_the_step_does_not(store):
    live = features.latest_features(store, END)
    ramp = thermal_ramp.live(store, live)
    assert _hits(live, ramp) == {"G5"}           # G6 stepped 12 degC: hot, not heating
    grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), END)
    ts = grid.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
    g = thermal_ramp.grid(grid)
    hit_at = {(str(t), u) for t, u, h in zip(ts, grid.column("gpu_uuid").to_pylist(), g.hit,
                                            strict=True) if h}
    assert {u for t, u in hit_at if t == str(np.datetime64(END.replace(tzinfo=None), "us"))
            } == {"G5"}
    # the hours before lack twelve hours of history, or had not risen enough yet
    assert {u for _, u in hit_at} == {"G5"}
    assert not g.hit[ts < np.datetime64((T0 + dt.timedelta(hours=11)).replace(tzinfo=None),
                                        "us")].any()
    p = np.full(live.num_rows, 0.01)
    raised = ramp.risk(p)
    assert raised[ramp.hit].tolist() == [thermal_ramp.RISK]
    assert (raised[~ramp.hit] == 0.01).all()
    assert ramp.risk(np.full(live.num_rows, 0.97))[ramp.hit].tolist() == [0.97]  # a floor


def test_scoring_raises_the_heating_gpu_and_says_why(store):
    rec = prior.ensure_current(store)
    assert rec is not None
    res = scoring.score(store, at=END, model=rec.model_id)
    gpus = {r["gpu_uuid"]: r for r in res.gpu_scores.to_pylist()}
    assert gpus["G5"]["risk"] >= thermal_ramp.RISK
    why = json.loads(gpus["G5"]["reasons"])
    assert why[0].startswith("temperature rising at the same power: ")
    assert "°C/h over the last 6 h" in why[0]
    assert not any("temperature rising" in r for r in json.loads(gpus["G6"]["reasons"]))
    nodes = {r["node"]: r for r in res.node_scores.to_pylist()}
    assert nodes["n1"]["risk"] >= thermal_ramp.RISK  # G5 is n1's GPU 1
    assert json.loads(nodes["n1"]["reasons"])[0].startswith("GPU 1: temperature rising")
    assert nodes["n0"]["risk"] < thermal_ramp.RISK


def test_chunks_see_the_hours_of_the_chunks_before(store):
    grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), END)
    ts = grid.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
    whole = thermal_ramp.grid(grid).hit
    assert whole.any()
    predict = thermal_ramp.chunked(lambda t: np.full(t.num_rows, 0.01))
    cut = np.datetime64((T0 + dt.timedelta(hours=12)).replace(tzinfo=None), "us")
    parts = [grid.filter(pa.array(ts < cut)), grid.filter(pa.array(ts >= cut))]
    got = np.concatenate([predict(p) for p in parts])
    want = np.where(np.concatenate([whole[ts < cut], whole[ts >= cut]]), thermal_ramp.RISK,
                    0.01)
    assert got.tolist() == want.tolist()
    # the last chunk alone (two hours): without the chunks before, no lag and no hit
    assert (thermal_ramp.chunked(lambda t: np.full(t.num_rows, 0.01))(parts[1]) == 0.01).all()


def test_one_predictor_over_two_shards_keeps_each_shards_lags(store, tmp_path):
    # evaluate scores shards over the same time with one predictor: the second shard's
    # chunks start earlier than the first shard's last one
    grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), END)
    node = np.array(grid.column("node").to_pylist())
    other = grid.set_column(grid.column_names.index("gpu_uuid"), "gpu_uuid",
                            pa.array([f"X-{u}" for u in grid.column("gpu_uuid").to_pylist()]))
    shards = [grid.filter(pa.array(node != "n1")), other]  # the ramp (n1) in the second
    predict = thermal_ramp.chunked(lambda t: np.zeros(t.num_rows))
    got = []
    for shard in shards:  # one chunk an hour
        s_ts = shard.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
        got.append(np.concatenate([predict(shard.filter(pa.array(s_ts == t)))
                                   for t in np.unique(s_ts)]))
    want = thermal_ramp.grid(grid).hit
    o_ts = other.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
    order = np.argsort(o_ts, kind="stable")
    assert got[1].tolist() == np.where(want[order], thermal_ramp.RISK, 0.0).tolist()
    assert (got[1] > 0).sum() == 2                 # G5 at 12:00 and 13:00
    assert not got[0].any()


def test_every_place_that_scores_a_grid_applies_the_rule(store):
    from fleetcare.models import event_replay, promotion, training
    from fleetcare.models.model import FailureModel

    model = FailureModel.from_bytes(prior.load()[0])
    grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), END)
    hit = thermal_ramp.grid(grid).hit
    assert hit.any()
    plain = model.predict_proba(grid)[:, 1]
    assert (plain[hit] < thermal_ramp.RISK).all()  # the model alone misses the ramp here
    n = grid.num_rows
    labels = grid.append_column("label", pa.array(np.zeros(n, bool))).append_column(
        "node_label", pa.array(np.zeros(n, bool)))
    seen: dict = {}
    real = training.evaluate_scored

    def spy(test, p, *a, **kw):
        seen["keys"], seen["p"] = test, p
        return real(test, p, *a, **kw)

    import unittest.mock as um
    with um.patch.object(training, "evaluate_scored", spy):
        training.evaluate(model, labels, np.ones(n, bool), horizon_h=24.0, every_s=3600,
                          feature_names=model.feature_names_in_)
    assert (seen["p"][hit] >= thermal_ramp.RISK).all()
    # the promotion check from 12:00 (its rows: those whose one-hour label is known by
    # the end, 12:00 only): the ramp's lags are the eleven hours before its period
    with um.patch.object(training, "evaluate_scored", spy):
        promotion.evaluate_on_period(store, {"m": model}, T0 + dt.timedelta(hours=12), END,
                                     horizon_h=1.0, every_s=3600)
    assert set(seen["keys"].column("ts").to_pylist()) == {
        (T0 + dt.timedelta(hours=12)).replace(tzinfo=None)}
    ramping = {(g, t) for g, t, h in zip(grid.column("gpu_uuid").to_pylist(),
                                         grid.column("ts").to_pylist(), hit, strict=True) if h}
    got = [(g, t) in ramping for g, t in zip(seen["keys"].column("gpu_uuid").to_pylist(),
                                              seen["keys"].column("ts").to_pylist(), strict=True)]
    assert any(got)
    assert (seen["p"][np.array(got)] >= thermal_ramp.RISK).all()
    rows = prior.FleetRows(prior.SimFleet("t", 3, 1, 1), labels, [],
                           np.datetime64(END.replace(tzinfo=None), "us"))
    fs = prior.score_fleet(rows, model)
    at_end = fs.scores.ts == np.datetime64(END.replace(tzinfo=None), "us")
    risk = dict(zip(fs.scores.node[at_end].tolist(), fs.scores.risk[at_end].tolist(),
                    strict=True))
    assert risk["t/n1"] >= thermal_ramp.RISK > risk["t/n0"]
    ev = event_replay.event_scores(store, [(np.datetime64(
        (END - event_replay.DELAY.astype(dt.timedelta)).replace(tzinfo=None), "us"), "n1")],
        model, [])
    assert ev.risk.tolist() and ev.risk[0] >= thermal_ramp.RISK


def test_a_pass_that_keeps_its_period_reads_the_lags_from_the_hours_before():
    # a pass scores from 12:00 (train's, evaluate's test and calibration periods, the
    # promotion check): it reads from dataset.lead_in, and the rows score drops are
    # shown to the rule, which then has the ramp's lags at 12:00
    from fleetcare.models import dataset

    noon = T0 + dt.timedelta(hours=12)
    assert dataset.lead_in(noon, 3600) == noon - dt.timedelta(hours=11)
    assert dataset.lead_in(noon, 600) == noon - dt.timedelta(hours=11)
    assert dataset.lead_in(noon, 7 * 3600) == noon - dt.timedelta(hours=7)
    assert dataset.lead_in(noon, 3600, floor=(noon - dt.timedelta(hours=3)).replace(
        tzinfo=None)) == noon - dt.timedelta(hours=3)   # not before the data's start
    assert dataset.lead_in(noon, 3600, floor=noon + dt.timedelta(hours=1)) == noon
    with Store(":memory:") as store:
        fleet(store)
        grid = features.gpu_features(store, dataset.lead_in(noon, 3600, floor=T0), END)
    assert grid.num_rows
    at_noon = np.datetime64(noon.replace(tzinfo=None), "us")
    hit = thermal_ramp.grid(grid).hit & (features_ts(grid) == at_noon)
    assert hit.any()

    def from_noon(t: pa.Table) -> np.ndarray:
        return features_ts(t) >= at_noon

    scored = dataset.score([grid], {"m": thermal_ramp.chunked(lambda t: np.zeros(t.num_rows))},
                           keep=from_noon)
    assert (features_ts(scored.keys) >= at_noon).all()
    keys = zip(scored.keys.column("gpu_uuid").to_pylist(), features_ts(scored.keys).tolist(),
               strict=True)
    by_key = dict(zip(keys, scored.p["m"].tolist(), strict=True))
    want = {(g, t) for g, t, h in zip(grid.column("gpu_uuid").to_pylist(),
                                       features_ts(grid).tolist(), hit, strict=True) if h}
    assert want and all(by_key[k] >= thermal_ramp.RISK for k in want)
    # a predictor without ``see`` is not shown them: the plain chunked rule at 12:00 alone
    alone = thermal_ramp.chunked(lambda t: np.zeros(t.num_rows))
    assert not alone(grid.filter(pa.array(from_noon(grid)))).any()


def features_ts(table: pa.Table) -> np.ndarray:
    return table.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
