"""Scoring writes gpu_scores / node_scores history; latest_* rank by risk."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.models import registry
from fleetcare.models.model import FailureModel
from fleetcare.models.scoring import (
    LATEST_RUNS,
    ScoreRetention,
    ensure_schema,
    latest_gpu_scores,
    latest_node_scores,
    prune,
    read_latest,
    score,
)

from .conftest import T0, planted_rows


def _features(at: dt.datetime, ecc: list[float]) -> pa.Table:
    n = len(ecc)
    return pa.table({
        "ts": pa.array([at.replace(tzinfo=None)] * n, pa.timestamp("us")),
        "node": [f"node-{i // 2}" for i in range(n)],
        "gpu_uuid": [f"GPU-{i}" for i in range(n)],
        "gpu_index": pa.array([i % 2 for i in range(n)], pa.int64()),
        "model": ["H100"] * n,
        "f0": ecc, "f1": [0.0] * n, "f2": [0.0] * n, "f3": [0.0] * n,
    })


def test_score_writes_history_and_latest(store):
    X, y = planted_rows(3000, seed=4)
    model = FailureModel(n_estimators=40).fit(X[:2000], y[:2000], X_cal=X[2000:], y_cal=y[2000:])
    rec = registry.save(store, model, created_at=T0)

    r1 = score(store, at=T0, features=_features(T0, [0.0, 0.0, 3.0, 0.0]))
    assert r1.ts == T0 and r1.model_id == rec.model_id
    assert r1.gpu_scores.column("gpu_uuid").to_pylist()[0] == "GPU-2"  # highest risk first
    nodes = r1.node_scores.to_pylist()
    assert [n["node"] for n in nodes] == ["node-1", "node-0"]
    p = r1.gpu_scores.column("risk").to_pylist()
    gp = dict(zip(r1.gpu_scores.column("gpu_uuid").to_pylist(), p, strict=True))
    assert nodes[0]["risk"] == pytest.approx(1 - (1 - gp["GPU-2"]) * (1 - gp["GPU-3"]))
    assert nodes[0]["top_gpu_uuid"] == "GPU-2"
    reasons = json.loads(nodes[0]["reasons"])
    assert reasons and reasons[0].startswith("GPU 0: f0: 3 (fleet median")

    t1 = T0 + dt.timedelta(minutes=5)
    score(store, at=t1, features=_features(t1, [0.0, 3.0, 0.0, 0.0]))
    score(store, at=t1, features=_features(t1, [0.0, 3.0, 0.0, 0.0]))  # same ts: replaced
    assert store.cursor().execute("SELECT count(*) FROM gpu_scores").fetchone()[0] == 8
    assert store.cursor().execute("SELECT count(*) FROM node_scores").fetchone()[0] == 4
    latest = latest_node_scores(store)
    assert latest.column("node").to_pylist() == ["node-0", "node-1"]
    assert latest.column_names == ["ts", "node", "risk", "reasons", "top_gpu_uuid", "model_id"]
    g = latest_gpu_scores(store, limit=1)
    assert g.column("gpu_uuid").to_pylist() == ["GPU-1"]
    assert g.column_names == ["ts", "node", "gpu_uuid", "gpu_index", "model", "risk",
                              "reasons", "model_id"]
    risks = latest_gpu_scores(store).column("risk").to_numpy()
    assert np.all(np.diff(risks) <= 0)


def test_only_the_riskiest_gpus_are_explained_on_large_fleets(store):
    X, y = planted_rows(3000, seed=4)
    model = FailureModel(n_estimators=40).fit(X[:2000], y[:2000], X_cal=X[2000:], y_cal=y[2000:])
    registry.save(store, model, created_at=T0)
    ecc = [0.0, 0.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0]
    full = score(store, at=T0, features=_features(T0, ecc))
    part = score(store, at=T0 + dt.timedelta(minutes=1),
                 features=_features(T0, ecc), explain_top=2)
    assert part.gpu_scores.column("risk").to_pylist() == full.gpu_scores.column("risk").to_pylist()
    explained = [json.loads(r) for r in part.gpu_scores.column("reasons").to_pylist()]
    assert [bool(r) for r in explained] == [True, True] + [False] * 6
    assert explained[:2] == [json.loads(r) for r in full.gpu_scores.column("reasons").to_pylist()[:2]]
    top_node = part.node_scores.to_pylist()[0]
    assert top_node["top_gpu_uuid"] == "GPU-2"
    assert json.loads(top_node["reasons"])[0].startswith("GPU 0: f0: 3 (fleet median")


def test_reasons_only_above_the_explain_floor(store):
    """Issue 15: GPUs at least ``explain_floor`` risky are explained, and so is the
    riskiest GPU of every node at least that risky (its reasons are the node's); the
    others get none, on any fleet size. Risks do not depend on the floor."""
    X, y = planted_rows(3000, seed=4)
    model = FailureModel(n_estimators=40).fit(X[:2000], y[:2000], X_cal=X[2000:], y_cal=y[2000:])
    registry.save(store, model, created_at=T0)
    ecc = [0.0, 0.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0]   # GPU-2 (node-1), GPU-5 (node-2) risky
    every = score(store, at=T0, features=_features(T0, ecc), explain_floor=0.0)

    def by_uuid(r):
        return dict(zip(r.gpu_scores.column("gpu_uuid").to_pylist(),
                        r.gpu_scores.to_pylist(), strict=True))

    quiet = by_uuid(every)["GPU-0"]["risk"]
    node0 = next(r["risk"] for r in every.node_scores.to_pylist() if r["node"] == "node-0")
    assert quiet < node0 < by_uuid(every)["GPU-5"]["risk"]
    floor = (quiet + node0) / 2  # above a quiet GPU, below a node of two quiet GPUs
    t1 = T0 + dt.timedelta(minutes=1)
    part = score(store, at=t1, features=_features(t1, ecc), explain_floor=floor)
    assert part.gpu_scores.column("risk").to_pylist() == every.gpu_scores.column(
        "risk").to_pylist()
    # the risky GPUs, and each quiet node's first GPU (ties go to the lower index)
    explained = {"GPU-2", "GPU-5", "GPU-0", "GPU-6"}
    for uuid, row in by_uuid(part).items():
        want = by_uuid(every)[uuid]["reasons"] if uuid in explained else "[]"
        assert row["reasons"] == want, uuid
    assert json.loads(by_uuid(part)["GPU-2"]["reasons"])
    assert [json.loads(r["reasons"]) for r in part.node_scores.to_pylist()] == [
        json.loads(r["reasons"]) for r in every.node_scores.to_pylist()]

    high = score(store, at=t1, features=_features(t1, ecc), explain_floor=node0 * 1.5)
    nodes = {r["node"]: json.loads(r["reasons"]) for r in high.node_scores.to_pylist()}
    assert nodes["node-1"] and nodes["node-2"] and nodes["node-0"] == nodes["node-3"] == []
    assert [bool(json.loads(r)) for r in high.gpu_scores.column("reasons").to_pylist()] == [
        True, True] + [False] * 6


def test_explain_floor_is_lowered_by_alert_and_drain_thresholds():
    from fleetcare.models.scoring import EXPLAIN_FLOOR, explain_floor_for

    assert explain_floor_for() == EXPLAIN_FLOOR
    assert explain_floor_for(0.5, None) == EXPLAIN_FLOOR
    assert explain_floor_for(0.5, 0.002) == 0.002


def same_as_the_views(store) -> None:
    """``read_latest`` (what the API's snapshot reads) and ``latest_*_scores`` (the
    floor read first, then the rows) give the views' rows, in their order."""
    cur = store.cursor()
    try:
        got = read_latest(cur)
        views = {t: cur.sql(f"SELECT * FROM latest_{t}_scores").to_arrow_table()
                 for t in ("node", "gpu")}
    finally:
        cur.close()
    assert got.nodes.equals(views["node"]) and got.gpus.equals(views["gpu"])
    assert latest_node_scores(store).equals(views["node"])
    assert latest_gpu_scores(store).equals(views["gpu"])
    assert latest_gpu_scores(store, limit=1).equals(views["gpu"].slice(0, 1))


def test_latest_means_newest_in_the_last_runs_and_prune_keeps_runs_and_hours(store):
    """Issue 11: one meaning of "latest" for every reader (a node missing from the last
    ``LATEST_RUNS`` runs has no latest score); pruning keeps recent runs and one per hour."""
    X, y = planted_rows(3000, seed=4)
    model = FailureModel(n_estimators=20).fit(X[:2000], y[:2000], X_cal=X[2000:], y_cal=y[2000:])
    registry.save(store, model, created_at=T0)
    ensure_schema(store)
    same_as_the_views(store)  # no score yet
    score(store, at=T0, features=_features(T0, [0.0, 0.0, 3.0, 0.0]))   # node-0, node-1
    for k in range(1, LATEST_RUNS):                                    # node-0 only
        t = T0 + dt.timedelta(minutes=k)
        score(store, at=t, features=_features(t, [0.0, 1.0]))
    assert sorted(latest_node_scores(store).column("node").to_pylist()) == ["node-0", "node-1"]
    same_as_the_views(store)
    t = T0 + dt.timedelta(minutes=LATEST_RUNS)
    score(store, at=t, features=_features(t, [0.0, 1.0]))
    assert latest_node_scores(store).column("node").to_pylist() == ["node-0"]
    assert set(latest_gpu_scores(store).column("gpu_uuid").to_pylist()) == {"GPU-0", "GPU-1"}
    same_as_the_views(store)

    # a day of runs every 10 minutes: prune keeps the last 5 runs and the first of each hour
    for k in range(1, 24 * 6):
        t = T0 + dt.timedelta(hours=1, minutes=10 * k)
        score(store, at=t, features=_features(t, [0.0, 1.0]))
    runs = lambda table="node_scores": [r[0] for r in store.cursor().execute(  # noqa: E731
        f"SELECT DISTINCT ts FROM {table} ORDER BY ts").fetchall()]
    # as a model with a network head writes its probabilities beside each run
    store.cursor().execute("INSERT INTO node_network_scores "
                           "SELECT ts, node, risk, model_id FROM node_scores").fetchall()
    # and a row of a run no longer kept (a model before the current one wrote it)
    store.cursor().execute("INSERT INTO node_network_scores VALUES (?, 'node-0', 0.1, 'old')",
                           [T0 - dt.timedelta(days=1)]).fetchall()
    before = runs()
    deleted = prune(store, ScoreRetention(keep_runs=5, keep_hourly=dt.timedelta(hours=6)))
    after = runs()
    newest = before[-1]
    window = [t for t in before if t >= newest - dt.timedelta(hours=6)]
    hourly = {min(t for t in window if t.replace(minute=0) == h)
              for h in {t.replace(minute=0) for t in window}}
    want = sorted(set(before[-5:]) | hourly)
    assert after == want and deleted > 0
    assert runs("node_network_scores") == want
    assert latest_node_scores(store).column("ts").to_pylist() == [newest]
    same_as_the_views(store)
    with pytest.raises(ValueError, match="LATEST_RUNS"):
        ScoreRetention(keep_runs=1)
