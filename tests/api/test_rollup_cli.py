"""``fleetcare rollup``: the rollups now, and ``--full`` rebuilding them in hour order.

A store rolled up in bulk by a version before hourly rows were written in hour order
keeps its GPU-by-GPU order (every row group spans the whole history, so an hour-range
query scans all of it) until something rebuilds it: ``rollup --full`` does, with the
same rows. Simulated data.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest

from fleetcare.api.cli import main
from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents
from fleetcare.pipeline import rollup
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def _rows(db: Path, order: str) -> list[tuple[object, ...]]:
    store = Store(db, read_only=True)
    try:
        return store.cursor().execute(f"SELECT * FROM {rollup.TABLE} ORDER BY {order}").fetchall()
    finally:
        store.close()


def _runs(db: Path) -> int:
    """How many ascending runs the hours make in storage order (1: hour-ordered)."""
    store = Store(db, read_only=True)
    try:
        hours = (store.cursor().sql(f"SELECT hour FROM {rollup.TABLE} ORDER BY rowid")
                 .to_arrow_table().column("hour").to_numpy())
    finally:
        store.close()
    return 1 + int((np.diff(hours) < np.timedelta64(0)).sum())


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["rollup", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_full_rebuilds_an_old_gpu_ordered_store_in_hour_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = FleetSpec(nodes=4, seed=5)
    sim = FleetSimulator(spec, simulate_incidents(spec, 3))
    db = tmp_path / "old.duckdb"
    store = Store(db)
    load_history(store, sim, spec.start, spec.start + dt.timedelta(days=1), interval_s=600)
    rollup.refresh(store)
    # what an older version left: the same rows, GPU by GPU
    cur = store.cursor()
    cur.execute(f"CREATE TEMP TABLE old AS SELECT * FROM {rollup.TABLE} "
                "ORDER BY gpu_uuid, hour").fetchall()
    cur.execute(f"DELETE FROM {rollup.TABLE}").fetchall()
    cur.execute(f"INSERT INTO {rollup.TABLE} SELECT * FROM old").fetchall()
    store.close()
    assert _runs(db) == 32  # one run per GPU
    before = _rows(db, "gpu_uuid, hour")

    out = _run(capsys, "--db", str(db), "--full")
    assert out["full"] is True
    assert (out["telemetry_hourly_rows"], out["hours"]) == (24 * 32, 24)
    assert out["first_hour"] == spec.start.replace(tzinfo=None).isoformat()
    assert _runs(db) == 1
    assert _rows(db, "gpu_uuid, hour") == before

    # without --full: only what arrived since, appended in hour order
    store = Store(db)
    load_history(store, sim, spec.start + dt.timedelta(days=1),
                 spec.start + dt.timedelta(days=1, hours=3), interval_s=600)
    store.close()
    out = _run(capsys, "--db", str(db))
    assert (out["full"], out["telemetry_hourly_rows"], out["hours"]) == (False, 27 * 32, 27)
    assert _runs(db) == 1


def test_an_empty_store_and_a_missing_one(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "empty.duckdb"
    Store(db).close()
    out = _run(capsys, "--db", str(db), "--full")
    assert (out["telemetry_hourly_rows"], out["first_hour"], out["nic_hourly_rows"]) == (0, None, 0)
    assert main(["rollup", "--db", str(db)]) == 0
    assert "0 GPU-hours" in capsys.readouterr().out
    assert main(["rollup", "--db", str(tmp_path / "nope.duckdb")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1
