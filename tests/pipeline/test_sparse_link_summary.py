"""The simulator's per-link counters as ``SparseLinks`` (their non-zero rows), and the
store's summary of them (``store.summarise_columns``): the same ``telemetry`` and
``telemetry_nvlink`` rows as the general path (``link_summary.summarise`` of the lists
as Arrow), on simulated chunks (links flapping, counters rising, nodes down, one tick and
many, 18 and 12 links) and on random grids."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.collectors.sim.sparse_links import SparseLinks
from fleetcare.pipeline import schema
from fleetcare.pipeline.link_summary import summarise
from fleetcare.pipeline.store import Store, columns_to_arrow, summarise_columns

SPEC = FleetSpec(nodes=24, seed=11, failure_scale=60, model="H100:1,A100:1")


@pytest.fixture(scope="module")
def sim() -> FleetSimulator:
    return FleetSimulator(SPEC, simulate_incidents(SPEC, days=3))


def dense(columns: dict) -> dict:
    return {k: np.asarray(v) for k, v in columns.items()}


def assert_same_summary(columns: dict) -> tuple[int, int]:
    """``summarise_columns`` equals the general path; returns (rows, irregular rows)."""
    fast = summarise_columns(columns)
    assert fast is not None
    slow = summarise(columns_to_arrow(dense(columns), schema.SAMPLE_SCHEMA))
    assert fast.stored.schema == slow.stored.schema
    assert fast.stored.equals(slow.stored)
    assert fast.lists.schema == slow.lists.schema
    assert fast.lists.equals(slow.lists)
    return fast.stored.num_rows, fast.lists.num_rows


def test_simulated_chunks_summarise_as_the_lists_do(sim):
    """Multi-tick chunks of a mixed fleet over three days (counters not zero, nodes down),
    and one-tick steps (the path a 100,000-GPU fleet takes) through links flapping."""
    rows = irregular = 0
    widths = set()
    for chunk in sim.history(SPEC.start, SPEC.start + dt.timedelta(days=3), interval_s=300):
        assert isinstance(chunk.samples["nvlink_crc_flit"], SparseLinks)
        widths.add(chunk.samples["nvlink_up"].shape[1])
        n, i = assert_same_summary(chunk.samples)
        rows, irregular = rows + n, irregular + i
    assert widths == {12, 18} and irregular > 100 and rows > 10 * irregular
    grp = sim.groups()[0]
    ep = sim.episodes
    flaps = ep.flap_t[grp.flap_sel]
    assert len(flaps)
    down = 0
    for t in np.sort(np.r_[flaps[:20], flaps[:20] + 30.0, np.arange(60.0, 7200.0, 600.0)]):
        cols = grp.step(np.array([t]), np.random.default_rng(int(t)))
        down += int((~cols["nvlink_up"]).any(axis=1).sum())
        assert_same_summary(cols)
    assert down > 0


@pytest.mark.parametrize("links", [1, 4, 12, 18, 62])
def test_random_grids_summarise_as_the_lists_do(sim, links):
    rng = np.random.default_rng(links)
    chunk = next(sim.history(SPEC.start, SPEC.start + dt.timedelta(minutes=5)))
    cols = {k: v for k, v in dense(chunk.samples).items() if v.ndim == 1}
    n = len(cols["ts"])
    up = rng.random((n, links)) > 0.02
    cols["nvlink_up"] = up
    for j, name in enumerate(schema.NVLINK_COUNTERS):
        grid = np.zeros((n, links), dtype=np.int32)
        hit = rng.random((n, links)) < 0.01 * (j + 1)
        grid[hit] = rng.choice([1, 7, 2**31 - 1, 300], size=int(hit.sum()))
        cols[name] = SparseLinks.of(grid)
    assert len(cols["nvlink_crc_flit"].rows) > 0
    assert_same_summary(cols)


def test_other_forms_take_the_general_path(sim):
    cols = next(sim.history(SPEC.start, SPEC.start + dt.timedelta(minutes=1))).samples
    assert summarise_columns(cols) is not None
    assert summarise_columns(dense(cols)) is None  # the counters as (rows, links) arrays
    assert summarise_columns({k: v for k, v in cols.items() if k != "nvlink_up"}) is None
    n = len(cols["ts"])
    wide = {**cols, "nvlink_up": np.ones((n, 63), bool),
            **{k: SparseLinks(n, 63, np.zeros(0, np.int64), np.zeros((0, 63), np.int32))
               for k in schema.NVLINK_COUNTERS}}
    assert summarise_columns(wide) is None  # past the down mask's 62 links


def test_the_store_lands_the_same_rows_either_way(sim, tmp_path):
    chunks = list(sim.history(SPEC.start, SPEC.start + dt.timedelta(days=2), interval_s=600))
    tables = {}
    for name, form in (("sparse", lambda c: c), ("dense", dense)):
        with Store(tmp_path / f"{name}.duckdb") as store:
            added = sum(store.insert_sample_columns(form(c.samples)) for c in chunks)
            again = sum(store.insert_sample_columns(form(c.samples)) for c in chunks[:3])
            assert added == sum(len(c) for c in chunks) and again == 0
            tables[name] = [store.con.execute(f"SELECT * FROM {t} ORDER BY gpu_uuid, ts")
                            .fetchall() for t in ("telemetry", "telemetry_nvlink")]
    assert tables["sparse"] == tables["dense"]
    assert len(tables["sparse"][1]) > 50


def test_sparse_links_hold_the_non_zero_rows():
    grid = np.zeros((6, 3), dtype=np.int32)
    grid[1, 2], grid[4] = 5, [1, 2, 3]
    s = SparseLinks.of(grid)
    assert s.rows.tolist() == [1, 4] and s.shape == (6, 3) and len(s) == 6
    assert np.array_equal(np.asarray(s), grid) and s.dtype == np.int32
    assert np.array_equal(np.concatenate([s, s]), np.r_[grid, grid])
    assert s.tolist() == grid.tolist()
    picked = s.take(np.array([4, 0, 1]))
    assert np.array_equal(picked.dense(), grid[[4, 0, 1]]) and picked.rows.tolist() == [0, 2]
    assert np.array_equal(s.take(grid.any(axis=1)).dense(), grid[[1, 4]])
    mask = np.array([True, False, True, False, True, True])
    assert isinstance(s[mask], SparseLinks) and np.array_equal(s[mask].dense(), grid[mask])
    assert np.array_equal(s[np.array([5, 4])].dense(), grid[[5, 4]])
    assert np.array_equal(s[1:5:2].dense(), grid[1:5:2])
    for i in (-6, -2, 0, 1, 3, 4, 5):
        assert np.array_equal(s[i], grid[i]), i
    assert s[4, 2] == 3 and np.array_equal(s[:, 2], grid[:, 2])
    with pytest.raises(IndexError):
        s[6]
    with pytest.raises(IndexError):
        s.take(np.array([True, False]))
    assert np.array_equal(s.take(np.array([-2, -5])).dense(), grid[[-2, -5]])
    for outside in ([6], [0, -7]):
        with pytest.raises(IndexError):
            s.take(np.array(outside))
    c = s.copy()
    c.values[0, 0] = 9
    assert s.values[0, 0] == 0
    with pytest.raises(ValueError, match="values of shape"):
        SparseLinks(6, 3, np.array([1]), np.zeros((2, 3), np.int32))
