"""Live features = the week's full hours held as a base + the partial hour merged in.

The reference is one aggregate over every hour up to ``at`` (how live features were
computed before the split, issue 15 §2): the split must give the same rows at any
``at``, keep its base while only the partial hour moves, and rebuild it when anything
it read changes (late telemetry re-rolled into a past hour, a late XID, a new hour).
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from fleetcare.collectors.contract import XidEvent
from fleetcare.pipeline import features, live_features, rollup
from fleetcare.pipeline.feature_defs import LEMON_DAYS, WINDOWS, now_sql, windowed_sql
from fleetcare.pipeline.store import Store

from .test_features import _history, _same, at, sample


def _one_pass(store: Store, when: dt.datetime) -> object:
    """Live features in one filtered aggregate per GPU over all hours (the reference)."""
    cur = store.cursor()
    source = features._source(store, cur, rollup._ts(when), exact=True)
    at_sql = features._lit(rollup._ts(when))
    hf = f"date_trunc('hour', {at_sql})"

    def agg(fn: str, expr: str, w: str) -> str:
        keep = f"hour >= {hf} - INTERVAL {WINDOWS[w]} HOUR"
        if fn.startswith("regr_"):
            y, x = expr.split(", ")
            return f"{fn}(CASE WHEN {keep} THEN {y} END, {x})"
        return f"{fn}(CASE WHEN {keep} THEN {expr} END)"

    feats = ",\n".join(f"{sql} AS {name}" for name, sql in windowed_sql(agg))
    now = ",\n".join(f"arg_max({sql}, hour) AS {name}" for name, sql in now_sql())
    lo = f"{hf} - INTERVAL {features._LOOKBACK_H} HOUR"
    stale = int(features.STALE_AFTER.total_seconds())
    tele = f"""
src AS (SELECT * FROM {source} WHERE hour >= {lo} AND hour <= {hf}),
{features._xev(f"{lo} - INTERVAL {LEMON_DAYS * 24 - features._LOOKBACK_H} HOUR",
               f"e.ts <= {at_sql}")},
h AS (
  SELECT s.* EXCLUDE (gpu_uuid, hour), x.* EXCLUDE (gpu_uuid, hour),
    coalesce(s.gpu_uuid, x.gpu_uuid) AS gpu_uuid, coalesce(s.hour, x.hour) AS hour
  FROM src s FULL OUTER JOIN (SELECT * FROM xb WHERE hour >= {lo}) x
    ON x.gpu_uuid = s.gpu_uuid AND x.hour = s.hour
),
h2 AS (SELECT *, {features._DERIVED} FROM h),
tele AS (
  SELECT {at_sql} AS ts, {at_sql} AS te, gpu_uuid, arg_max(node, hour) AS node,
    arg_max(gpu_index, hour) AS gpu_index, arg_max(model, hour) AS model,
    max(last_ts) AS last_seen, {feats}, {now}
  FROM h2 GROUP BY gpu_uuid HAVING max(last_ts) >= {at_sql} - INTERVAL {stale} SECOND
)"""
    try:
        features._register_xmap(cur)
        return features._finish(cur.sql("WITH " + tele + features._tail(None)).to_arrow_table())
    finally:
        cur.close()


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "f.duckdb") as s:
        yield s


@pytest.mark.parametrize("minutes", [5, 61, 455, 539, 599, 600])
def test_split_equals_one_pass(store, minutes):
    _history(store, 10)
    features.refresh(store, until=at(minutes))
    live = features.latest_features(store, at(minutes))
    assert live.num_rows == 3
    _same(live, _one_pass(store, at(minutes)))


def test_base_held_within_the_hour_rebuilt_when_what_it_read_changes(store):
    _history(store, 8)              # samples every 10 min to 7:50
    builds = live_features.BASES.builds

    def live(minutes: float) -> object:
        features.refresh(store)
        got = features.latest_features(store, at(minutes))
        _same(got, _one_pass(store, at(minutes)))
        return got

    def built() -> int:
        return live_features.BASES.builds - builds

    live(470)
    assert built() == 1
    # more of the same hour: the base is kept, the newest hours move
    store.insert_sample_records([sample(475, gpu=f"G{g}", index=g, node=f"n{g % 2}",
                                        gpu_temp_c=90.0, ecc_corrected_volatile=500)
                                 for g in range(3)])
    after = live(476)
    assert built() == 1
    assert after.column("gpu_temp_max_1h").to_pylist() == [90.0] * 3
    # late telemetry of the hour just ended is part of the newest hours: base kept
    store.insert_sample_records([sample(395, gpu="G0", gpu_temp_c=97.0)])
    assert live(477).column("gpu_temp_max_1h").to_pylist()[0] == 97.0
    assert built() == 1
    # older late telemetry (an agent's spool replayed) is re-rolled: base rebuilt
    store.insert_sample_records([sample(305, gpu="G0", gpu_temp_c=99.0)])
    assert live(478).column("gpu_temp_max_24h").to_pylist()[0] == 99.0
    assert built() == 2
    # a late XID: in the newest hours, kept; older, rebuilt
    store.insert_events([XidEvent(ts=at(m), node="n0", xid=79, message="fell off the bus",
                                  source="sim", gpu_uuid="G0") for m in (400,)])
    live(479)
    assert built() == 2
    store.insert_events([XidEvent(ts=at(250), node="n0", xid=79, message="fell off the bus",
                                  source="sim", gpu_uuid="G0")])
    live(479)
    assert built() == 3
    # the next hour's base, prepared ahead, serves its first call
    assert live_features.prepare_next(store) is True
    assert live_features.prepare_next(store) is False       # held
    assert built() == 4
    store.insert_sample_records([sample(m, gpu=f"G{g}", index=g, node=f"n{g % 2}")
                                 for g in range(3) for m in (480, 485)])
    live(482)
    live(486)
    assert built() == 4


def test_a_gpu_seen_only_this_hour_and_one_gone_quiet(store):
    _history(store, 3)
    store.insert_sample_records([sample(m, gpu="NEW", index=7, node="n9") for m in (185, 190)])
    # XIDs named by PCI bus or index only, in past hours and in this one
    store.insert_events([
        XidEvent(ts=at(m), node=node, xid=xid, message="x", source="kernel-log", **kw)
        for m, node, xid, kw in [(70, "n0", 48, {"pci_bus_id": "0000:10:00.0"}),
                                 (186, "n9", 79, {"pci_bus_id": "0000:17:00.0"}),
                                 (187, "n1", 31, {"gpu_index": 1})]])
    features.refresh(store)
    live = features.latest_features(store, at(191))
    _same(live, _one_pass(store, at(191)))
    assert "NEW" in live.column("gpu_uuid").to_pylist()


@pytest.mark.parametrize("minutes", [61, 455, 599])
def test_some_nodes_only_equal_the_full_build(store, minutes):
    """``nodes=``: those nodes' rows exactly as the fleet's build gives them, compared with
    the whole fleet's GPUs (medians, temperature fit), not with their own."""
    _history(store, 10)
    store.insert_sample_records([sample(m, gpu="NEW", index=7, node="n9", gpu_temp_c=70.0,
                                        ecc_corrected_volatile=m) for m in (545, 590)])
    features.refresh(store, until=at(minutes))
    full = features.latest_features(store, at(minutes))
    for nodes in (["n0"], ["n1"], ["n1", "n9"], ["nowhere"]):
        mine = features.latest_features(store, at(minutes), nodes=nodes)
        want = full.filter(pc.is_in(full.column("node"), pa.array(nodes)))
        assert mine.num_rows == want.num_rows
        _same(mine, want)


def _moving_fleet(store: Store, hours: int = 30) -> None:
    """Six GPUs of one model on three nodes (an even count: a median between two values),
    counters with differing parities, G5 moved from n2 to n0 after 20 h, XIDs named by
    PCI bus only, one GPU gone quiet."""
    recs = []
    for g in range(6):
        for m in range(0, 60 * hours, 20):
            node = f"n{g % 3}" if not (g == 5 and m >= 20 * 60) else "n0"
            if g == 4 and m > 60 * hours - 120:
                continue                                   # stale by the end
            recs.append(sample(m, gpu=f"G{g}", index=g, node=node,
                               ecc_corrected_volatile=(m // 20) * (g + 1) % 251,
                               pcie_replay_count=(m // 20) * (g % 2),
                               gpu_temp_c=45.0 + g + (m % 60) / 10, power_w=250.0 + 7 * g))
    store.insert_sample_records(recs)
    store.insert_events([
        XidEvent(ts=at(m), node=node, xid=xid, message="x", source="kernel-log",
                 pci_bus_id=f"0000:{0x10 + g:02x}:00.0")
        for m, node, g, xid in [(300, "n2", 5, 48), (1500, "n0", 5, 63), (1700, "n1", 1, 79)]])


@pytest.mark.parametrize("minutes", [1199, 1330, 1790])
def test_some_nodes_only_with_moved_gpus_and_even_counts(store, minutes):
    _moving_fleet(store)
    features.refresh(store, until=at(minutes))
    full = features.latest_features(store, at(minutes))
    for nodes in (["n0"], ["n1"], ["n2"], ["n0", "n2"]):
        mine = features.latest_features(store, at(minutes), nodes=nodes)
        want = full.filter(pc.is_in(full.column("node"), pa.array(nodes)))
        assert mine.num_rows == want.num_rows > 0
        _same(mine, want)
    with pytest.raises(TypeError, match="list of node names"):
        features.latest_features(store, at(minutes), nodes="n0")


def test_the_live_median_of_an_even_count_keeps_its_half(store):
    """The full live build equals one aggregate over all hours with six GPUs of a model
    (the base's sums came back as decimals, whose median of an even count dropped the .5
    that the one aggregate and the training grid keep)."""
    _moving_fleet(store)
    features.refresh(store)
    when = at(1675)
    ref = _one_pass(store, when)
    rows = ref.to_pylist()
    assert len(rows) == 6
    med = [r["pcie_replay_24h"] / r["pcie_replay_24h_rel"] - 1.0
           for r in rows if r["pcie_replay_24h_rel"]]
    assert med and all(abs(m - round(m)) == pytest.approx(0.5) for m in med)  # between two
    _same(features.latest_features(store, when), ref)
