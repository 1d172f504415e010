"""Retention drops raw telemetry only when rolled up; features do not change (issue 4 §7)."""

from __future__ import annotations

import datetime as dt
import math

import msgspec
import pytest

from fleetcare.collectors.contract import GpuSample, Incident
from fleetcare.pipeline import features, retention, rollup
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def samples(first_h: int, hours: int, gpu: str = "G0") -> list[GpuSample]:
    return [GpuSample(ts=at(60 * first_h + 20 * i), node="n1", gpu_uuid=gpu, gpu_index=0,
                      pci_bus_id="00000000:10:00.0", model="H100", gpu_temp_c=50.0 + i % 7,
                      power_w=300.0, ecc_corrected_volatile=i // 2, pcie_replay_count=i)
            for i in range(3 * hours)]


def nan_free(table) -> list[dict]:
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in table.to_pylist()]


def raw_count(store: Store) -> int:
    return store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()[0]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "f.duckdb") as s:
        yield s


def test_features_from_rollups_are_unchanged_after_raw_rows_are_dropped(store):
    store.insert_sample_records(samples(0, 72))           # 3 days, 216 rows
    store.insert_incidents([Incident(ts=at(600), node="n1", kind="failure",
                                     cause="faulty_gpu", source="sim", gpu_uuid="G0")])
    features.refresh(store)
    before = nan_free(features.gpu_features(store, at(24 * 60), at(72 * 60)))
    latest = nan_free(features.latest_features(store))
    res = retention.apply(store, DAY, now=at(72 * 60))
    assert res.cutoff == at(48 * 60).replace(tzinfo=None)
    assert (res.deleted, res.kept, res.held_back_by) == (144, 72, None)
    assert raw_count(store) == 72
    assert nan_free(features.gpu_features(store, at(24 * 60), at(72 * 60))) == before
    assert nan_free(features.latest_features(store)) == latest
    # A full rebuild must not wipe the rollups whose raw rows are gone.
    features.refresh(store)
    rollup.refresh(store, full=True)
    assert nan_free(features.gpu_features(store, at(24 * 60), at(72 * 60))) == before
    assert store.cursor().execute("SELECT count(*) FROM incidents").fetchone()[0] == 1


def test_never_deletes_rows_that_are_not_rolled_up(store):
    store.insert_sample_records(samples(0, 48))
    res = retention.apply(store, DAY, now=at(72 * 60))     # no rollup yet
    assert (res.cutoff, res.deleted, res.held_back_by) == (None, 0, "rollup")
    features.refresh(store, until=at(10 * 60 + 30))          # rolled up to 10:30 only
    res = retention.apply(store, DAY, now=at(72 * 60))
    assert res.cutoff == at(10 * 60).replace(tzinfo=None)    # the watermark's hour stays
    assert res.held_back_by == "rollup"
    assert store.cursor().execute("SELECT min(ts) FROM telemetry").fetchone()[0] == (
        at(10 * 60).replace(tzinfo=None))


def test_late_data_waiting_for_a_rollup_holds_retention_back(store):
    store.insert_sample_records(samples(24, 48))
    features.refresh(store)
    store.insert_sample_records(samples(5, 2, gpu="G1"))    # late, not rolled up yet
    res = retention.apply(store, DAY, now=at(72 * 60))
    assert (res.cutoff, res.held_back_by) == (at(5 * 60).replace(tzinfo=None), "late-data")
    assert res.deleted == 0


def test_dry_run_deletes_nothing_and_samples_older_than_the_cut_are_ignored(store):
    store.insert_sample_records(samples(0, 72))
    features.refresh(store)
    res = retention.apply(store, DAY, now=at(72 * 60), dry_run=True)
    assert (res.deleted, res.kept, raw_count(store)) == (144, 216, 216)
    retention.apply(store, DAY, now=at(72 * 60))
    before = store.cursor().execute(f"SELECT * FROM {rollup.TABLE} ORDER BY hour").fetchall()
    store.insert_sample_records(samples(3, 1, gpu="G9"))     # far too late: raw is gone
    features.refresh(store)
    after = store.cursor().execute(f"SELECT * FROM {rollup.TABLE} ORDER BY hour").fetchall()
    assert after == before
    with pytest.raises(ValueError, match="must be positive"):
        retention.apply(store, dt.timedelta(0))


def test_per_link_rows_go_with_their_samples(store):
    """A sample's NVLink lists kept whole (a counter not zero) are dropped with it."""
    store.insert_sample_records([
        msgspec.structs.replace(s, nvlink_up=[True, True], nvlink_crc_flit=[0, i],
                                nvlink_crc_data=[0, 0], nvlink_replay=[0, 0],
                                nvlink_recovery=[0, 0])
        for i, s in enumerate(samples(0, 72), start=1)])
    features.refresh(store)
    res = retention.apply(store, DAY, now=at(72 * 60))
    assert (res.deleted, raw_count(store)) == (144, 72)
    cur = store.cursor()
    assert cur.execute("SELECT count(*), min(ts) FROM telemetry_nvlink").fetchone() == (
        72, at(48 * 60).replace(tzinfo=None))
