"""Feature rows in time chunks (issue 12, 15): the same rows as one query, compact,
aftermath across chunk boundaries, deterministic weighted down-sampling."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.models import dataset
from fleetcare.models import training as T
from fleetcare.pipeline import features, labels
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store

DAYS = 6


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    spec = FleetSpec(nodes=8, seed=31, failure_scale=60)
    store = Store(tmp_path_factory.mktemp("ds") / "f.duckdb")
    sim = FleetSimulator(spec, simulate_incidents(spec, DAYS))
    load_history(store, sim, spec.start, spec.start + dt.timedelta(days=DAYS), interval_s=600)
    features.refresh(store)
    yield store, spec
    store.close()


def same_tables(got: pa.Table, want: pa.Table) -> None:
    """Equal schema and values; NaN (not available) equals NaN."""
    assert got.schema == want.schema and got.num_rows == want.num_rows
    for name in got.column_names:
        a, b = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        if pa.types.is_floating(a.type):
            assert np.array_equal(a.to_numpy(zero_copy_only=False),
                                  b.to_numpy(zero_copy_only=False), equal_nan=True), name
        else:
            assert a.equals(b), name


def test_chunks_are_the_rows_of_one_query_compact(fleet):
    store, spec = fleet
    start, end = spec.start + dt.timedelta(days=1), spec.start + dt.timedelta(days=DAYS)
    parts = list(dataset.chunks(store, start, end, chunk=dt.timedelta(hours=30)))
    assert len(parts) == 5  # 121 scoring times in chunks of 30
    got = pa.concat_tables(parts)
    whole = dataset.compact(labels.attach_labels(store, features.gpu_features(store, start, end)))
    same_tables(got, whole)
    names = T.model_features(T.feature_columns(whole))
    assert [c for c in got.column_names if c in names] == names
    assert all(got.schema.field(n).type == pa.float32() for n in names)
    assert not set(got.column_names) - set(names) - set(T.LABEL_COLUMNS) - {
        "ts", "node", "gpu_uuid", "gpu_index", "model"}


def test_aftermath_from_the_fleets_failures_matches_training_rule(fleet):
    store, spec = fleet
    start, end = spec.start + dt.timedelta(days=1), spec.start + dt.timedelta(days=DAYS)
    table = dataset.load(store, start, end)
    failures = dataset.fleet_failures(store)
    assert failures
    mine = dataset.aftermath(table, failures)
    theirs = T.aftermath(table)  # from the table's own labels: same failures seen ahead
    # every row the labels-based rule marks is marked; extra rows only after failures the
    # table's first rows could not look ahead to (before its start)
    assert (theirs <= mine).all()
    extra = mine & ~theirs
    if extra.any():
        ts = T.ts_column(table)[extra]
        assert ts.min() <= np.datetime64(start.replace(tzinfo=None), "us") + np.timedelta64(
            int(T.AFTERMATH_H * 3600), "s")


def test_sample_keeps_every_positive_and_weights_the_rest(fleet):
    store, spec = fleet
    table = dataset.load(store, spec.start + dt.timedelta(days=1),
                         spec.start + dt.timedelta(days=DAYS))
    keep = np.ones(table.num_rows, dtype=bool)
    a = dataset.sample(table, keep, negatives=0.1, seed=3)
    b = dataset.sample(table, keep, negatives=0.1, seed=3)
    same_tables(a, b)  # deterministic
    pos = T._bool(table, "label") | T._bool(table, "node_label")
    whole = T._bool(a, "label") | T._bool(a, "node_label")
    assert whole.sum() == pos.sum()
    w = a.column(dataset.WEIGHT).to_numpy()
    assert set(np.unique(w[whole])) == {1.0} and set(np.unique(w[~whole])) == {np.float32(10)}
    # the weighted count of healthy rows estimates the true one
    assert w[~whole].sum() == pytest.approx((~pos).sum(), rel=0.1)
    none = dataset.sample(table, np.zeros(table.num_rows, dtype=bool), negatives=0.1)
    assert none.num_rows == 0
    with pytest.raises(ValueError, match="negatives=0"):
        dataset.sample(table, keep, negatives=0)


def test_hard_negatives_are_kept_whole_and_the_weights_still_estimate_the_fleet(fleet):
    store, spec = fleet
    table = dataset.load(store, spec.start + dt.timedelta(days=1),
                         spec.start + dt.timedelta(days=DAYS))
    keep = np.ones(table.num_rows, dtype=bool)
    pos = T._bool(table, "label") | T._bool(table, "node_label")
    # a score that singles out the hottest healthy GPUs (a continuous one: a real cut)
    p = np.nan_to_num(table.column("gpu_temp_resid_24h").to_numpy(zero_copy_only=False),
                      nan=-1.0)
    hard = dataset.hard_negatives(p, keep & ~pos, 0.05)
    assert not (hard & pos).any()
    cut = np.quantile(p[~pos], 0.95)
    assert (p[hard] >= cut).all() and not (p[~pos & ~hard] >= cut).any()
    assert hard.sum() == pytest.approx(0.05 * (~pos).sum(), rel=0.2)
    a = dataset.sample(table, keep, negatives=0.1, seed=3, hard=hard)
    plain = dataset.sample(table, keep, negatives=0.1, seed=3)
    w = a.column(dataset.WEIGHT).to_numpy()
    is_whole = w == 1.0
    assert is_whole.sum() == pos.sum() + hard.sum()  # every hard row, once, weight 1
    assert a.num_rows > plain.num_rows
    healthy = ~(T._bool(a, "label") | T._bool(a, "node_label"))
    # stratified: the hard rows at weight 1 plus the sampled rest at 1 / 0.1 still
    # estimate the number of healthy rows
    assert w[healthy].sum() == pytest.approx((~pos).sum(), rel=0.1)
    # hard_weight: the hard healthy rows count that many times, nothing else moves
    heavy = dataset.sample(table, keep, negatives=0.1, seed=3, hard=hard, hard_weight=16.0)
    hw = heavy.column(dataset.WEIGHT).to_numpy()
    assert heavy.num_rows == a.num_rows
    assert (hw == 16.0).sum() == hard.sum() and (hw == 1.0).sum() == pos.sum()
    assert (hw[w == 10.0] == 10.0).all()
    with pytest.raises(ValueError, match="hard_weight"):
        dataset.sample(table, keep, negatives=0.1, hard=hard, hard_weight=0.0)
    assert not dataset.hard_negatives(p, keep & ~pos, 0.0).any()
    assert not dataset.hard_negatives(p, np.zeros(len(p), dtype=bool), 0.05).any()


def test_spill_keeps_rows_in_memory_then_on_disk_in_order():
    import gc

    import pyarrow as pa

    from fleetcare.models.dataset import Spill

    def part(k: int) -> pa.Table:
        return pa.table({"ts": pa.array([k * 10 + i for i in range(10)], pa.timestamp("us")),
                         "node": [f"n{k}"] * 10, "x": pa.array([float(k)] * 10, pa.float32())})

    small = Spill(limit=10**9)
    for k in range(3):
        small.add(part(k))
    assert not small.spilled and small.num_rows == 30
    big = Spill(limit=part(0).nbytes + 1)  # the second table goes over: all to disk
    for k in range(4):
        big.add(part(k))
    big.add(part(9).slice(0, 0))  # empty: ignored
    assert big.spilled and big.num_rows == 40
    got = pa.concat_tables(list(big.tables()))
    assert got.equals(pa.concat_tables([part(k) for k in range(4)]))
    assert big.keys.column_names == ["ts", "node"]  # the KEEP columns it has
    assert big.keys.equals(got.select(["ts", "node"]))
    folder = big._folder
    assert folder is not None and any(folder.iterdir())
    del big
    gc.collect()
    assert not folder.exists()  # the temporary files go with the object


def test_thin_keeps_every_positive_and_reweights_the_rest():
    import numpy as np
    import pyarrow as pa

    from fleetcare.models.dataset import thin

    n = 10_000
    rng = np.random.default_rng(0)
    label = rng.random(n) < 0.01
    t = pa.table({"ts": pa.array(np.arange(n) * 3_600_000_000, pa.timestamp("us")),
                  "gpu_uuid": [f"GPU-{i % 97}" for i in range(n)],
                  "label": label, "node_label": label,
                  "weight": pa.array(np.full(n, 2.0), pa.float32())})
    assert thin(t, n) is t
    out = thin(t, 2_000)
    y = out.column("label").to_numpy(zero_copy_only=False)
    assert int(y.sum()) == int(label.sum())  # every positive
    assert 1_500 < out.num_rows < 2_500
    w = out.column("weight").to_numpy()
    assert set(np.unique(w[y])) == {2.0}
    # the healthy rows' weights still add up to the healthy rows they stand for
    assert abs(w[~y].sum() - 2.0 * int((~label).sum())) / (2.0 * (~label).sum()) < 0.05
