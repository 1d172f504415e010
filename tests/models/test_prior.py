"""The fleet prior (issue 12): a reproducible build, shipped with the package, installed
in every store that has no model, replaced only by a fleet model that beats it."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from fleetcare.models import prior, promotion, registry
from fleetcare.models.model import FailureModel
from fleetcare.models.prior import SimFleet
from fleetcare.pipeline.store import Store

TINY_TRAIN = (SimFleet("ta", 12, 8, 91, "H100", 40), SimFleet("tb", 12, 8, 93, "A100", 40))
TINY_VALIDATION = (SimFleet("va", 12, 8, 92, "H200", 40),)
TINY_X4 = (SimFleet("vb", 12, 8, 92, "H200", 160),)
TINY_NET = (SimFleet("na", 32, 20, 71, "H100", 100, 8),)
TINY_NET_VALIDATION = (SimFleet("nv", 32, 20, 72, "H100", 100, 8),)
TINY_NET_X4 = (SimFleet("nx", 32, 20, 73, "H100", 400, 8),)
NET = {"network_fleets": TINY_NET, "network_validation": TINY_NET_VALIDATION,
       "network_validation_x4": TINY_NET_X4}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    work = tmp_path_factory.mktemp("prior")
    model, meta = prior.build(work, train_fleets=TINY_TRAIN, validation_fleets=TINY_VALIDATION,
                              validation_x4=TINY_X4, **NET)
    return work, model, meta


def test_build_is_reproducible_and_describes_itself(tiny, tmp_path):
    work, model, meta = tiny
    again, meta2 = prior.build(work, train_fleets=TINY_TRAIN, validation_fleets=TINY_VALIDATION,
                               validation_x4=TINY_X4, **NET)
    assert again.to_bytes() == model.to_bytes()        # same code, same stores, same bytes
    assert {f["name"] for f in meta["train_fleets"]} == {"ta", "tb"}
    assert meta["validation_fleets"][0]["seed"] == 92
    assert meta["features"] == list(model.feature_names_in_)
    assert not any(f.startswith("nvlink_flaps") for f in meta["features"])
    assert meta["train_positives"] > 0 and meta["negatives"] == prior.NEGATIVES
    assert meta["hard_negatives"] == prior.HARD_NEGATIVES
    assert meta["hard_weight"] == prior.HARD_WEIGHT
    # the operating threshold holds a quarter of the budget on the validation fleets
    v = meta["validation"]
    assert meta["operating_budget"] == prior.OPERATING_BUDGET
    assert v["false_drains_allowed"] == int(v["node_days"] * prior.OPERATING_BUDGET / 1000)
    assert v["false_drains"] is None or v["false_drains"] <= v["false_drains_allowed"]
    # ... and the x4 fleets' share of it: the higher of the two thresholds operates
    x4 = meta["validation_x4"]
    assert meta["x4_budget"] == prior.X4_BUDGET
    assert x4["false_drains_allowed"] == int(x4["node_days"] * prior.X4_BUDGET / 1000)
    assert meta["threshold"] == max(t for t in (v["threshold"], x4["threshold"])
                                    if t is not None)
    assert meta["validation_x4_fleets"][0]["failure_scale"] == 160
    assert meta["validation_scores"] == meta["validation_x4_scores"] == "hourly"
    assert "simulated" in meta["data"]
    # a network head rides along, described by the fleets it saw and checked on others
    assert model.network_head_ is not None and "network_head" in json.loads(model.to_bytes())
    net = meta["network_head"]
    assert [f["name"] for f in net["train_fleets"]] == ["na"]
    assert net["train_fleets"][0]["nic_ports"] == 8 and "simulated" in net["data"]
    assert net["features"] == list(model.network_head_.feature_names_in_)
    assert net["train_positives"] == model.network_head_.n_train_positives_ > 0
    # ... with an operating threshold of its own: the lowest holding its share of the
    # budget on its validation fleets at published rates and x4
    assert (net["budget"], net["x4_budget"]) == (prior.NETWORK_BUDGET, prior.NETWORK_X4_BUDGET)
    assert net["threshold"] is not None and 0.0 < net["threshold"] <= 1.0
    for key, budget in (("validation", prior.NETWORK_BUDGET),
                        ("validation_x4", prior.NETWORK_X4_BUDGET)):
        v = net[key]
        assert v["threshold"] == net["threshold"]
        assert set(v["detected_by_mode"]) <= {"link", "nic"} and v["detected_by_mode"]
        assert 0.0 <= v["network_recall"] <= 1.0 and v["false_drains"] is not None
        allowed = int(v["node_days"] * budget / 1000)
        assert v["false_drains"] <= allowed
    path = prior.write(model, meta, tmp_path)
    assert FailureModel.from_bytes(path.read_bytes()).to_bytes() == model.to_bytes()
    assert (tmp_path / prior.META_FILE).exists()


def test_a_store_without_a_model_gets_the_prior_once(tiny, tmp_path):
    _, model, meta = tiny
    shipped = lambda: (model.to_bytes(), meta)  # noqa: E731
    store = Store(tmp_path / "f.duckdb")
    rec = prior.ensure_current(store, shipped)
    assert rec is not None and rec.is_current and rec.origin == "prior"
    assert rec.model_id == prior.prior_id(model.to_bytes())
    assert rec.current_reason == prior.REASON_PRIOR
    assert rec.metrics["threshold"] == meta["threshold"]
    assert prior.ensure_current(store, shipped).model_id == rec.model_id
    assert [r.model_id for r in registry.list_models(store)] == [rec.model_id]
    # a store with a model of its own keeps it
    other = Store(tmp_path / "g.duckdb")
    mine = registry.save(other, model, metrics={})
    assert prior.ensure_current(other, shipped).model_id == mine.model_id
    assert registry.list_models(other)[0].origin == "fleet"

    def missing() -> tuple[bytes, dict]:
        raise FileNotFoundError("no prior in this build")

    assert prior.ensure_current(Store(tmp_path / "h.duckdb"), missing) is None


def test_a_store_that_installed_the_prior_gets_its_rechosen_threshold(tiny, tmp_path):
    """`prior threshold` re-chooses the threshold of the same model: a store that
    installed it before reports the new one (written back; read-only: in the record)."""
    _, model, meta = tiny
    old_meta = {**meta, "threshold": 0.123}
    path = tmp_path / "f.duckdb"
    with Store(path) as store:
        assert prior.ensure_current(store, lambda: (model.to_bytes(), old_meta)
                                    ).metrics["threshold"] == 0.123
    with Store(path, read_only=True) as store:
        rec = prior.ensure_current(store, lambda: (model.to_bytes(), meta))
        assert rec.metrics["threshold"] == meta["threshold"]
        assert registry.get(store, rec.model_id).metrics["threshold"] == 0.123
    with Store(path) as store:
        rec = prior.ensure_current(store, lambda: (model.to_bytes(), meta))
        assert rec.metrics["threshold"] == meta["threshold"] != 0.123
        assert registry.get(store, rec.model_id).metrics["threshold"] == meta["threshold"]
        assert [r.model_id for r in registry.list_models(store)] == [rec.model_id]
        # install (as `fleetcare models` does for a store that has a model of its own)
        registry.set_metrics(store, rec.model_id, {"threshold": 0.5})
        assert prior.install(store, lambda: (model.to_bytes(), meta)
                             ).metrics["threshold"] == meta["threshold"]
        with pytest.raises(registry.ModelNotFoundError):
            registry.set_metrics(store, "nope", {})
        # unreadable shipped files: the installed prior scores on as registered
        assert prior.ensure_current(store, lambda: (model.to_bytes(), {"no": "threshold"})
                                    ).model_id == rec.model_id

        def corrupt() -> tuple[bytes, dict]:
            raise ValueError("Expecting value: line 1 column 1 (char 0)")

        assert prior.ensure_current(store, corrupt).metrics["threshold"] == meta["threshold"]
    with Store(tmp_path / "new.duckdb") as store, pytest.raises(ValueError):
        prior.ensure_current(store, corrupt)          # nothing to score with: say why


def test_a_fleet_model_replaces_the_prior_only_by_beating_it(tiny, tmp_path):
    """Scored on the fleet model's held-out period: a blind model stays a candidate, and
    the reason of the current model stays the prior's."""
    work, model, meta = tiny
    store = prior.open_fleet(work, TINY_VALIDATION[0])
    try:
        rec = prior.install(store, lambda: (model.to_bytes(), meta))
        rng = np.random.default_rng(3)
        X = rng.normal(size=(2000, 1))
        blind = FailureModel(n_estimators=5).fit(X, rng.random(2000) < 0.05,
                                                 feature_names=["not_a_feature"])
        lo, hi = store.raw.bounds(store.cursor())
        lo, hi = lo.replace(tzinfo=dt.UTC), hi.replace(tzinfo=dt.UTC)
        cand = registry.save(store, blind, train_range=(lo, lo + (hi - lo) / 2),
                             cal_range=(lo + (hi - lo) / 2, lo + (hi - lo) * 0.6),
                             test_range=(lo + (hi - lo) * 0.6, hi))
        d = promotion.consider(store, cand.model_id)
        assert not d.promoted and "does not beat current " + rec.model_id in d.reason
        cur = registry.current(store)
        assert cur.model_id == rec.model_id and cur.current_reason == prior.REASON_PRIOR
        assert promotion.consider(store, cand.model_id, force=True).promoted
        assert "forced" in registry.current(store).current_reason
    finally:
        store.close()


def test_validation_scores_add_a_score_a_minute_after_each_urgent_signal(tiny, monkeypatch):
    from fleetcare.models import event_replay as R

    work, model, _ = tiny
    fleet = TINY_X4[0]
    hourly = prior.score_fleet(prior.fleet_rows(work, fleet), model)
    assert prior.validation_scores(work, TINY_X4, model).scores.ts.size == hourly.scores.ts.size
    both = prior.validation_scores(work, TINY_X4, model, events=True)
    with prior.open_fleet(work, fleet) as store:
        events = R.triggers(store, hourly.scores.ts.min())
    assert len(events) >= 5, "the fleet needs urgent signals to replay"
    extra = len(both.scores.ts) - len(hourly.scores.ts)
    assert 0 < extra <= len(events)
    off_hour = both.scores.ts[both.scores.ts.astype("datetime64[h]") != both.scores.ts]
    assert len(off_hour) == extra
    want = {(t + R.DELAY, f"{fleet.name}/{n}") for t, n in events}
    got = set(zip(off_hour.tolist(), both.scores.node[-extra:].tolist(), strict=True))
    assert {(np.datetime64(t, "us"), n) for t, n in got} <= want
    assert both.node_days == hourly.node_days and len(both.failures) == len(hourly.failures)
    # kept beside the store: the next validation reads them instead of replaying
    assert prior.event_scores_path(work, fleet, model).exists()

    def replay(*a, **k):
        raise AssertionError("replayed again instead of reading the kept event scores")

    monkeypatch.setattr(R, "event_scores", replay)
    again = prior.validation_scores(work, TINY_X4, model, events=True)
    for k in ("ts", "node", "risk", "label", "known"):
        np.testing.assert_array_equal(getattr(again.scores, k), getattr(both.scores, k))
        assert getattr(again.scores, k).dtype == getattr(both.scores, k).dtype
    # ... but not ones made by other code (or from another simulation of the store)
    monkeypatch.setattr(prior, "_replay_code", lambda: "other code")
    with pytest.raises(AssertionError, match="replayed again"):
        prior.validation_scores(work, TINY_X4, model, events=True)


def test_the_operating_threshold_holds_the_x4_share_of_the_budget(tiny):
    work, model, meta = tiny
    low = prior.operating_threshold(work, model, {"validation": {"threshold": 0.0}}, TINY_X4)
    x4 = low["validation_x4"]
    assert low["threshold"] == x4["threshold"] > 0.0       # raised to what x4 needs
    at = low["validation_x4_at_threshold"]
    assert at["false_drains"] is None or at["false_drains"] <= x4["false_drains_allowed"]
    high = prior.operating_threshold(work, model, {"validation": {"threshold": 1.5}}, TINY_X4,
                                     events=True)
    assert high["threshold"] == 1.5                        # never lowered
    assert high["validation_x4_scores"] == "hourly and events"


@pytest.mark.parametrize("min_gain", [0.0, 2.0])
def test_the_hold_is_chosen_on_the_x4_validation_fleets_for_the_best_recall(
        tiny, monkeypatch, min_gain):
    """Every hold and immediate risk is tried with its own lowest threshold within the x4
    budget; the pair catching the most precursor failures operates (a tie: the first
    tried, i.e. the shorter hold), at the threshold it needs — a hold only when it adds
    ``HOLD_MIN_GAIN`` (2.0: never)."""
    work, model, meta = tiny
    monkeypatch.setattr(prior, "HOLD_MIN_GAIN", min_gain)
    got = prior.operating_threshold(work, model, {"validation": {"threshold": 0.0}}, TINY_X4)
    tried = got["validation_x4_rules_tried"]
    assert len(tried) == 1 + (len(prior.HOLDS_H) - 1) * len(prior.IMMEDIATE)
    assert tried[0]["hold_h"] == 0.0 and tried[0]["immediate"] is None
    recall = [t["precursor_recall_at_budget"] or 0.0 for t in tried]
    first_best = tried[recall.index(max(recall))] if min_gain == 0.0 else tried[0]
    assert (got["hold_h"], got["immediate"]) == (first_best["hold_h"], first_best["immediate"])
    assert got["threshold"] == first_best["threshold"]
    assert got["validation_x4"]["precursor_recall_at_budget"] == (
        max(recall) if min_gain == 0.0 else recall[0])
    # what the meta says is what the figures at the operating point were judged with
    again = prior.metrics_of(prior.validation_scores(work, TINY_X4, model),
                             threshold=got["threshold"], **prior.operating_rule(got))
    assert again["false_drains"] == got["validation_x4_at_threshold"]["false_drains"]


def test_alarm_score_is_the_risk_without_a_hold_and_waits_with_one():
    t0 = np.datetime64("2026-01-01T00:00", "us")
    s = (t0 + np.arange(3) * np.timedelta64(1, "h"), np.array(["n"] * 3, dtype=object),
         np.array([0.9, 0.9, 0.2]))
    assert prior.alarm_score(*s).tolist() == [0.9, 0.9, 0.2]
    assert prior.operating_rule({}) == {"hold_h": 0.0, "immediate": None}
    assert prior.alarm_score(*s, 1.0).tolist() == [-1.0, 0.9, 0.2]
    assert prior.alarm_score(*s, 1.0, 0.85).tolist() == [0.9, 0.9, 0.2]


def test_threshold_command_rewrites_only_the_meta(tiny, tmp_path, monkeypatch, capsys):
    import json

    work, model, meta = tiny
    monkeypatch.setattr(prior, "load", lambda: (model.to_bytes(), meta))
    monkeypatch.setattr(prior, "VALIDATION_X4_FLEETS", TINY_X4)
    assert prior.main(["threshold", "--workdir", str(work), "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / prior.META_FILE).read_text())
    assert written["threshold"] == out["threshold"] == meta["threshold"]
    assert written["features"] == meta["features"] and "threshold_s" in written
    assert not (tmp_path / prior.MODEL_FILE).exists()
    assert out["prior_id"] == prior.prior_id(model.to_bytes())


def test_head_command_ships_a_head_beside_the_unchanged_gpu_model(tiny, tmp_path, monkeypatch,
                                                                  capsys):
    """``prior head`` adds a network head to the shipped prior: its GPU booster,
    calibration and threshold stay, and the meta says what the head is."""
    work, model, meta = tiny
    bare = FailureModel.from_bytes(model.to_bytes())
    bare.network_head_ = None
    gpu_meta = {k: v for k, v in meta.items() if k != "network_head"}
    monkeypatch.setattr(prior, "load", lambda: (bare.to_bytes(), gpu_meta))
    monkeypatch.setattr(prior, "NETWORK_TRAIN_FLEETS", TINY_NET)
    monkeypatch.setattr(prior, "NETWORK_VALIDATION_FLEETS", TINY_NET_VALIDATION)
    monkeypatch.setattr(prior, "NETWORK_VALIDATION_X4_FLEETS", TINY_NET_X4)
    assert prior.main(["head", "--workdir", str(work), "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    shipped = FailureModel.from_bytes((tmp_path / prior.MODEL_FILE).read_bytes())
    written = json.loads((tmp_path / prior.META_FILE).read_text())
    assert shipped.network_head_ is not None
    assert shipped.network_head_.to_bytes() == model.network_head_.to_bytes()  # as build fits
    gpu_only = FailureModel.from_bytes(shipped.to_bytes())
    gpu_only.network_head_ = None
    assert gpu_only.to_bytes() == bare.to_bytes()
    assert written["threshold"] == meta["threshold"] and written["features"] == meta["features"]
    assert written["network_head"]["validation"] == meta["network_head"]["validation"]
    assert out["prior_id"] == prior.prior_id(shipped.to_bytes()) != prior.prior_id(bare.to_bytes())


def test_a_prior_with_a_head_scores_a_new_fleet_with_ports_for_network_failures(tiny, tmp_path):
    """A new fleet whose nodes report InfiniBand ports has no model of its own: the prior
    scores it, and a node's risk takes in the head's probability of a network failure."""
    from fleetcare.collectors.sim import FleetSimulator, simulate_incidents
    from fleetcare.models import network_head, scoring
    from fleetcare.pipeline import features
    from fleetcare.pipeline.simload import load_history

    _, model, meta = tiny
    spec = SimFleet("new", 16, 6, 87, "H100", 100, 8).spec()
    store = Store(tmp_path / "new.duckdb")
    load_history(store, FleetSimulator(spec, simulate_incidents(spec, 6)), spec.start,
                 spec.start + dt.timedelta(days=6), interval_s=600)
    features.refresh(store)
    rec = prior.ensure_current(store, lambda: (model.to_bytes(), meta))
    assert rec is not None and rec.origin == "prior"
    fails = store.cursor().execute(
        "SELECT node, ts FROM incidents WHERE kind = 'failure' AND mode IN ('link', 'nic') "
        "AND ts > ? ORDER BY ts", [(spec.start + dt.timedelta(days=2)).replace(tzinfo=None)]
    ).fetchall()
    assert fails
    checked = 0
    for node, ts in fails:
        at = (ts - dt.timedelta(hours=2)).replace(tzinfo=dt.UTC)
        res = scoring.score(store, at=at, model=rec.model_id)  # (not the package's prior)
        rows = [r for r in res.node_scores.to_pylist() if r["node"] == node]
        if not rows:
            continue  # down for an earlier repair
        _, p = network_head.predict_latest(model.network_head_, store, at, nodes=[node])
        gpus = res.gpu_scores.filter(
            res.gpu_scores.column("node").to_numpy(zero_copy_only=False) == node)
        r_gpu = 1.0 - np.prod(1.0 - gpus.column("risk").to_numpy())
        assert rows[0]["risk"] == pytest.approx(1 - (1 - r_gpu) * (1 - p[0]), rel=1e-9)
        # the head's own probability is kept beside, for its own threshold (alerts)
        kept = dict(store.cursor().execute(
            "SELECT node, p_net FROM node_network_scores WHERE ts = ? AND model_id = ?",
            [res.ts.replace(tzinfo=None), rec.model_id]).fetchall())
        assert kept == dict(zip(res.network_scores.column("node").to_pylist(),
                                res.network_scores.column("p_net").to_pylist(), strict=True))
        assert kept[node] == pytest.approx(p[0], rel=1e-9)
        checked += p[0] > 0
    assert checked >= 1


def test_an_upgraded_package_moves_a_store_from_the_older_prior_to_its_own(tiny, tmp_path):
    """A store scored by the prior an earlier fleetcare shipped moves to the one shipped
    now (a prior is the package's default); a store with a model of its own keeps it."""
    _, model, meta = tiny
    old = FailureModel.from_bytes(model.to_bytes())
    old.network_head_ = None  # the prior shipped before: no network head
    old_id, new_id = prior.prior_id(old.to_bytes()), prior.prior_id(model.to_bytes())
    path = tmp_path / "f.duckdb"
    with Store(path) as store:
        assert prior.ensure_current(store, lambda: (old.to_bytes(), meta)).model_id == old_id
    with Store(path, read_only=True) as store:  # nothing written: the older one scores
        assert prior.ensure_current(store, lambda: (model.to_bytes(), meta)).model_id == old_id
    with Store(path) as store:
        rec = prior.ensure_current(store, lambda: (model.to_bytes(), meta))
        assert rec.model_id == new_id and rec.is_current and rec.origin == "prior"
        assert old_id in rec.current_reason and "replaced" in rec.current_reason
        assert registry.current(store).model_id == new_id
        assert registry.load(store, new_id).network_head_ is not None
        assert rec.metrics["network_head"]["validation"] == meta["network_head"]["validation"]
        assert {r.model_id for r in registry.list_models(store)} == {old_id, new_id}
        assert prior.ensure_current(store, lambda: (model.to_bytes(), meta)).model_id == new_id
        # and back again (a downgrade): the registered record is promoted, not duplicated
        assert prior.ensure_current(store, lambda: (old.to_bytes(), meta)).model_id == old_id
        assert len(registry.list_models(store)) == 2
    other = tmp_path / "g.duckdb"
    with Store(other) as store:
        mine = registry.save(store, old, metrics={})
        assert prior.ensure_current(store, lambda: (model.to_bytes(), meta)).model_id == \
            mine.model_id
