"""The hourly rollup is stored in hour order, so an hour-range query reads only its hours.

DuckDB skips a row group when its min/max of ``hour`` lies outside the query's range
(zone maps). A bulk rollup (the first refresh of a loaded history, ``full=True``, a GPU's
late samples re-rolled) came out in the hash aggregate's order — GPU by GPU — so every
row group spanned the whole history and a live feature build for one node scanned the
whole table (0.6x the time per call once sorted, on a 512-node x 45-day store). The
rows are read here in storage order (``rowid``) and must be in hour order; rows an
appending refresh or a re-roll adds, in hour order after those already stored.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.pipeline import rollup
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def _hours_in_storage_order(store: Store) -> np.ndarray:
    return (store.cursor().sql(f"SELECT hour FROM {rollup.TABLE} ORDER BY rowid")
            .to_arrow_table().column("hour").to_numpy())


def _sim() -> FleetSimulator:
    spec = FleetSpec(nodes=6, seed=3)
    return FleetSimulator(spec, simulate_incidents(spec, 4))


def _runs(hours: np.ndarray) -> int:
    """How many ascending runs the hours make in storage order."""
    return 1 + int((np.diff(hours) < np.timedelta64(0)).sum())


def test_a_bulk_rollup_is_stored_in_hour_order(tmp_path: Path) -> None:
    sim = _sim()
    store = Store(tmp_path / "bulk.duckdb")
    load_history(store, sim, sim.spec.start, sim.spec.start + dt.timedelta(days=3),
                 interval_s=600)
    rollup.refresh(store)
    hours = _hours_in_storage_order(store)
    assert len(np.unique(hours)) == 72 and len(hours) == 72 * 48
    assert _runs(hours) == 1
    rollup.refresh(store, full=True)
    assert _runs(_hours_in_storage_order(store)) == 1


@pytest.mark.parametrize("case", ["new_node_backlog", "late_samples"])
def test_appended_and_rerolled_rows_are_inserted_in_hour_order(tmp_path: Path,
                                                               case: str) -> None:
    """A node's samples land after the rest was rolled up: all of them (a new node with
    two days of backlog: the appending path) or its middle 44 hours (late samples: its
    hours are re-rolled). Each insert is one run in hour order after the first refresh's."""
    sim = _sim()
    spec = sim.spec
    store = Store(tmp_path / f"{case}.duckdb")
    node = sim.layout.node_names[2]
    t0 = np.datetime64(spec.start.replace(tzinfo=None), "us")
    lo, hi = (0, 48) if case == "new_node_backlog" else (2, 46)
    held = []
    for chunk in sim.history(spec.start, spec.start + dt.timedelta(days=2), interval_s=600):
        h = (chunk.samples["ts"] - t0) // np.timedelta64(1, "h")
        mine = (chunk.samples["node"] == node) & (h >= lo) & (h < hi)
        store.insert_sample_columns({k: v[~mine] for k, v in chunk.samples.items()})
        held.append({k: v[mine] for k, v in chunk.samples.items()})
    rollup.refresh(store)
    assert _runs(_hours_in_storage_order(store)) == 1
    for cols in held:
        store.insert_sample_columns(cols)
    rollup.refresh(store)
    hours = _hours_in_storage_order(store)
    assert len(hours) == 48 * 48 and len(np.unique(hours)) == 48
    assert _runs(hours) == 2
