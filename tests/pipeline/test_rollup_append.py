"""The appending refresh equals a rollup of everything at once (issue 15 §2).

Each cycle, ``rollup.refresh`` rolls up only the samples that arrived since the last one
and merges them into each GPU's last hourly row; a GPU that got samples older than its
newest rolled-up one has its hours re-rolled. A simulated fleet streams tick by tick —
across hour boundaries, with a node's samples held back and landed hours late, a node
missing from one tick and landed after it, and several ticks per refresh — and the
hourly rows, the live features and the scores then equal those of a second store that
got the same rows at once and rolled them up in one go.

Integers compare exactly. Floats (sums of temperatures and power) compare to 1e-12
relative: DuckDB sums floats in parallel in no fixed order, so a rollup of the same rows
twice differs at that level too.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.models import registry
from fleetcare.models.model import FailureModel
from fleetcare.models.scoring import score
from fleetcare.pipeline import features, rollup
from fleetcare.pipeline.store import Store

STEP = 300
Columns = dict[str, np.ndarray]


def _ticks(sim: FleetSimulator, start: dt.datetime, n: int) -> Iterator[Columns]:
    for k in range(n):
        t = start + dt.timedelta(seconds=STEP * k)
        chunks = [c.samples for c in sim.history(t, t + dt.timedelta(seconds=STEP), STEP)]
        yield {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}


def _split(cols: Columns, node: str) -> tuple[Columns, Columns]:
    """(the rows of every other node, the rows of ``node``)."""
    mine = cols["node"] == node
    return ({k: v[~mine] for k, v in cols.items()}, {k: v[mine] for k, v in cols.items()})


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12,
                                                                  abs_tol=1e-12)
    return a == b


def _assert_same_rows(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        bad = {k: (ra[k], rb[k]) for k in ra if not _same(ra[k], rb[k])}
        assert not bad, (ra.get("gpu_uuid"), ra.get("hour"), bad)


def _hourly(store: Store) -> list[dict]:
    return store.cursor().sql(
        f"SELECT * FROM {rollup.TABLE} ORDER BY gpu_uuid, hour").to_arrow_table().to_pylist()


def test_appending_refresh_equals_one_rollup_of_everything(tmp_path: Path, caplog) -> None:
    spec = FleetSpec(nodes=4, seed=11, failure_scale=30)
    sim = FleetSimulator(spec, simulate_incidents(spec, 2))
    live, once = Store(tmp_path / "live.duckdb"), Store(tmp_path / "once.duckdb")
    nodes = sorted({str(n) for n in next(_ticks(sim, spec.start, 1))["node"]})
    held, gap = nodes[1], nodes[2]
    ticks = list(_ticks(sim, spec.start + dt.timedelta(minutes=35), 40))  # 35 min .. 3 h 50
    for cols in ticks:
        once.insert_sample_columns(cols)
    features.refresh(once)

    caplog.set_level(logging.INFO, logger="fleetcare.pipeline.rollup")
    back: list[Columns] = []
    for k, cols in enumerate(ticks):
        if 3 <= k <= 8:                  # one node's spool: landed 2 hours late, below
            cols, mine = _split(cols, held)
            back.append(mine)
        if k == 30:                      # one node misses this tick's refresh ...
            cols, late_tick = _split(cols, gap)
        live.insert_sample_columns(cols)
        if k == 31:                      # ... and lands before the next one
            live.insert_sample_columns(late_tick)
        if k == 26:                      # the held samples: hours already rolled up
            for mine in back:
                live.insert_sample_columns(mine)
        if k % 4 != 2:                   # now and then two ticks in one refresh
            features.refresh(live)
    features.refresh(live)

    appends = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("features.rollup_append")]
    assert len(appends) >= 25                                     # the path ran ...
    assert any("late_gpus=8" in m for m in appends)               # ... and re-rolled
    fleet_rerolls = [r for r in caplog.records
                     if r.getMessage().startswith("features.rollup from=")]
    assert len(fleet_rerolls) == 1                                # the first one only
    _assert_same_rows(_hourly(live), _hourly(once))

    fl, fo = features.latest_features(live), features.latest_features(once)
    assert fl.num_rows == fo.num_rows == 32
    _assert_same_rows(fl.to_pylist(), fo.to_pylist())

    names = [c for c in fl.column_names if c not in features.KEY_COLUMNS]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, len(names)))
    model = FailureModel(n_estimators=10).fit(X, X[:, 0] > 1.0, feature_names=names)
    for store in (live, once):
        registry.save(store, model, make_current=True)
    sl, so = score(live, features=fl), score(once, features=fo)
    assert sl.node_scores.column("node").to_pylist() == so.node_scores.column("node").to_pylist()
    np.testing.assert_allclose(sl.node_scores.column("risk").to_numpy(),
                               so.node_scores.column("risk").to_numpy(), rtol=0, atol=1e-12)
    live.close()
    once.close()


@pytest.mark.parametrize("late_first", [False, True])
def test_appending_refresh_with_until_then_the_rest(tmp_path: Path, late_first: bool) -> None:
    """A refresh up to an earlier ``until`` leaves newer samples for the next one."""
    spec = FleetSpec(nodes=2, seed=3)
    sim = FleetSimulator(spec, simulate_incidents(spec, 1))
    live, once = Store(tmp_path / "live.duckdb"), Store(tmp_path / "once.duckdb")
    ticks = list(_ticks(sim, spec.start, 20))
    for cols in ticks:
        once.insert_sample_columns(cols)
    features.refresh(once)
    for cols in ticks[:10]:
        live.insert_sample_columns(cols)
    features.refresh(live)
    for cols in ticks[10:]:
        live.insert_sample_columns(cols)
    if late_first:
        live.insert_sample_columns(ticks[4])  # duplicates: dropped at insert, nothing late
    features.refresh(live, until=spec.start + dt.timedelta(seconds=STEP * 14))
    features.refresh(live)
    _assert_same_rows(_hourly(live), _hourly(once))
    live.close()
    once.close()


def test_append_baselines_from_older_hours_where_recent_ones_are_null(tmp_path: Path) -> None:
    """The appended GPU's state comes from the watermark's hour first; a counter null
    there (a failed read for an hour, one the GPU never reports) and a GPU back after
    hours away take theirs from further back, as a rollup of everything does."""
    from fleetcare.collectors.contract import GpuSample

    t0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)

    def s(minutes: int, gpu: str, ecc: int | None, replay: int | None = 5) -> GpuSample:
        return GpuSample(ts=t0 + dt.timedelta(minutes=minutes), node="n0", gpu_uuid=gpu,
                         gpu_index=0 if gpu == "A" else 1, pci_bus_id="0000:10:00.0",
                         model="H100", ecc_corrected_volatile=ecc, pcie_replay_count=replay)

    ticks = [
        [s(10, "A", 100), s(10, "B", 7, None)],            # hour 0
        [s(70, "A", None), s(130, "A", None)],             # A's ECC read fails for hours
        [s(190, "A", 130), s(190, "B", 9, None)],          # B back after hours away
        [s(195, "A", 140, 8), s(195, "B", 12, None)],      # B never reports replays
    ]
    with Store(tmp_path / "inc.duckdb") as inc, Store(tmp_path / "once.duckdb") as once:
        for tick in ticks:
            inc.insert_sample_records(tick)
            rollup.refresh(inc)
            once.insert_sample_records(tick)
        rollup.refresh(once, full=True)
        _assert_same_rows(_hourly(inc), _hourly(once))
        rows = {(r["gpu_uuid"], r["hour"].hour): r for r in _hourly(inc)}
        assert rows[("A", 3)]["ecc_corrected_volatile_inc"] == 40     # 100 → 130 → 140
        assert rows[("B", 3)]["ecc_corrected_volatile_inc"] == 5      # 7 → 9 → 12
        assert rows[("B", 3)]["pcie_replay_count_inc"] is None
