"""Counter deltas under resets, gaps, duplicates, out-of-order and late data (issue 4 §3).

Every scenario asserts exact feature values and, where it applies, that the incremental
rollup equals a rollup of the same rows inserted in order in one go.
"""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np
import pytest

from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline import features, rollup
from fleetcare.pipeline.store import DIRTY_SINCE_KEY, Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def sample(minutes: float, ecc: int | None, gpu: str = "G0", **kw: object) -> GpuSample:
    return GpuSample(ts=at(minutes), node="n1", gpu_uuid=gpu, gpu_index=0,
                     pci_bus_id="00000000:10:00.0", model="H100",
                     ecc_corrected_volatile=ecc, **kw)  # type: ignore[arg-type]


def hour_of(h: int, start: int, step: int = 1, gpu: str = "G0") -> list[GpuSample]:
    """Samples every 10 min in hour ``h``, the counter rising by ``step`` from ``start``."""
    return [sample(60 * h + 10 * i, start + step * i, gpu) for i in range(6)]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "a.duckdb") as s:
        yield s


@pytest.fixture
def other(tmp_path):
    with Store(tmp_path / "b.duckdb") as s:
        yield s


def feats(store: Store, minutes: float, gpu: str = "G0") -> dict:
    rows = [r for r in features.gpu_features(store, at(minutes), at(minutes)).to_pylist()
            if r["gpu_uuid"] == gpu]
    assert len(rows) == 1, rows
    return rows[0]


def hourly(store: Store) -> list[tuple]:
    return store.cursor().execute(
        f"SELECT * FROM {rollup.TABLE} ORDER BY gpu_uuid, hour").fetchall()


def same_features(a: Store, b: Store, minutes: float) -> None:
    ta = features.gpu_features(a, at(minutes), at(minutes))
    tb = features.gpu_features(b, at(minutes), at(minutes))
    assert nan_free(ta.to_pylist()) == nan_free(tb.to_pylist())


def nan_free(rows: list[dict]) -> list[dict]:
    """Rows with NaN replaced by a marker, so == compares them exactly."""
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in rows]


def test_late_hour_after_its_successor_was_rolled_up(store, other):
    # In order: hour 9 (100..105), hour 10 (105..110) -> 5 + 1 + 5 = 11 increases in 24 h.
    other.insert_sample_records(hour_of(9, 100) + hour_of(10, 105))
    features.refresh(other)
    # Late: hour 10 arrives and is rolled up; hour 9 arrives afterwards.
    store.insert_sample_records(hour_of(10, 105))
    features.refresh(store)
    assert feats(store, 11 * 60)["ecc_corrected_24h"] == 5.0   # first sample ever: 0
    store.insert_sample_records(hour_of(9, 100))
    assert store.get_meta(DIRTY_SINCE_KEY) == at(9 * 60).replace(tzinfo=None).isoformat()
    features.refresh(store)
    assert store.get_meta(DIRTY_SINCE_KEY) is None
    assert hourly(store) == hourly(other)
    r = feats(store, 11 * 60)
    assert (r["ecc_corrected_24h"], r["ecc_corrected_1h"]) == (10.0, 5.0)
    same_features(store, other, 11 * 60)


def test_late_rows_inside_an_already_rolled_hour(store, other):
    rows = hour_of(9, 100) + hour_of(10, 106)
    other.insert_sample_records(rows)
    features.refresh(other)
    store.insert_sample_records(rows[::2])          # every other sample first
    features.refresh(store)
    store.insert_sample_records(rows[1::2])         # the rest, late and interleaved
    features.refresh(store)
    assert hourly(store) == hourly(other)
    assert feats(store, 11 * 60)["ecc_corrected_24h"] == 11.0


def test_out_of_order_within_a_batch(store, other):
    rows = hour_of(9, 100) + hour_of(10, 105)
    other.insert_sample_records(rows)
    shuffled = rows[:]
    random.Random(4).shuffle(shuffled)
    store.insert_sample_records(shuffled)
    features.refresh(store)
    features.refresh(other)
    assert hourly(store) == hourly(other)
    assert feats(store, 11 * 60)["ecc_corrected_24h"] == 10.0


def test_reset_mid_window(store):
    # 100, 104, 108 | reset | 0, 3, 9: (4 + 4) + 0 (the reset sample's value) + 3 + 6 = 17.
    values = [100, 104, 108, 0, 3, 9]
    store.insert_sample_records(sample(10 * i, v) for i, v in enumerate(values))
    features.refresh(store)
    assert feats(store, 60)["ecc_corrected_1h"] == 17.0


def test_reset_to_a_nonzero_value_counts_the_new_value(store):
    # A reset followed by errors before the first sample: 50 -> 2 means 2 since the reset.
    store.insert_sample_records(sample(10 * i, v) for i, v in enumerate([40, 50, 2, 7]))
    features.refresh(store)
    assert feats(store, 60)["ecc_corrected_1h"] == 10.0 + 2 + 5


def test_reset_between_two_refreshes(store):
    store.insert_sample_records(hour_of(0, 200))              # 200..205
    features.refresh(store)
    store.insert_sample_records(hour_of(1, 1))                # reset: 1..6
    features.refresh(store)
    r = feats(store, 120)
    assert (r["ecc_corrected_1h"], r["ecc_corrected_24h"]) == (1.0 + 5, 5.0 + 6)


def test_five_hour_gap(store, other):
    # Hour 0: 10..15; node down for hours 1-5 (no samples); hour 6: 30..35.
    # The 15 accrued across the gap land in hour 6: 5 + 15 + 5 = 25.
    store.insert_sample_records(hour_of(0, 10))
    features.refresh(store)
    with pytest.raises(AssertionError):          # stale during the gap: no row
        feats(store, 4 * 60)
    store.insert_sample_records(hour_of(6, 30))
    features.refresh(store)
    r = feats(store, 7 * 60)
    assert (r["ecc_corrected_1h"], r["ecc_corrected_6h"], r["ecc_corrected_24h"]) == (
        20.0, 20.0, 25.0)
    assert r["hours_since_sample"] == pytest.approx(10 / 60)
    other.insert_sample_records(hour_of(0, 10) + hour_of(6, 30))
    features.refresh(other)
    assert hourly(store) == hourly(other)


def test_gap_with_a_reset_inside_it(store):
    store.insert_sample_records(hour_of(0, 10))               # 10..15
    store.insert_sample_records(hour_of(6, 3))                # rebooted during the gap
    features.refresh(store)
    assert feats(store, 7 * 60)["ecc_corrected_24h"] == 5.0 + 3 + 5


def test_duplicates_are_dropped_at_insert(store):
    rows = hour_of(0, 0)
    assert store.insert_sample_records(rows) == 6
    assert store.insert_sample_records(rows) == 0                      # redelivered batch
    assert store.insert_sample_records(rows[:2] + [sample(100, 9)]) == 1  # mixed
    # Same key, different value: the first copy wins, the second is a duplicate.
    assert store.insert_sample_records([sample(10, 999)]) == 0
    features.refresh(store)
    assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()[0] == 7
    r = feats(store, 120)
    assert r["ecc_corrected_24h"] == 9.0


def test_duplicates_inside_one_batch(store):
    rows = hour_of(0, 0)
    assert store.insert_sample_records(rows + rows[::-1]) == 6
    features.refresh(store)
    assert feats(store, 60)["ecc_corrected_1h"] == 5.0


def test_null_reads_are_skipped(store):
    # 10, null (failed read), 14, null, 20 -> 4 + 6 = 10; null is not a reset to 0.
    store.insert_sample_records(sample(10 * i, v) for i, v in enumerate([10, None, 14, None, 20]))
    features.refresh(store)
    assert feats(store, 60)["ecc_corrected_1h"] == 10.0


def test_nvlink_counters_reset_together(store):
    # Two links; GPU reset zeroes both: (1+1) + (2+2) + reset (0+1) = 7.
    crc = [[5, 5], [6, 6], [8, 8], [0, 1]]
    store.insert_sample_records(
        sample(10 * i, 0, nvlink_crc_flit=c, nvlink_crc_data=[0, 0])
        for i, c in enumerate(crc))
    features.refresh(store)
    assert feats(store, 60)["nvlink_crc_1h"] == 7.0


def test_columnar_late_insert_marks_dirty_too(store, other):
    rows = hour_of(9, 100) + hour_of(10, 105)
    other.insert_sample_records(rows)
    features.refresh(other)
    store.insert_sample_records(rows[6:])
    features.refresh(store)
    late = rows[:6]
    store.insert_sample_columns({
        "ts": np.array([r.ts.replace(tzinfo=None) for r in late], "datetime64[us]"),
        "node": np.array([r.node for r in late], object),
        "gpu_uuid": np.array([r.gpu_uuid for r in late], object),
        "gpu_index": np.array([r.gpu_index for r in late]),
        "pci_bus_id": np.array([r.pci_bus_id for r in late], object),
        "model": np.array([r.model for r in late], object),
        "ecc_corrected_volatile": np.array([r.ecc_corrected_volatile for r in late]),
    })
    features.refresh(store)
    assert hourly(store) == hourly(other)


def test_failed_refresh_keeps_the_dirty_mark(store, monkeypatch):
    store.insert_sample_records(hour_of(10, 105))
    features.refresh(store)
    store.insert_sample_records(hour_of(9, 100))

    def boom(lo: str, hi: str, raw: str = "telemetry", **kw: object) -> str:
        return "SELECT * FROM no_such_table"

    monkeypatch.setattr(rollup, "rollup_sql", boom)
    with pytest.raises(Exception, match="no_such_table"):
        features.refresh(store)
    monkeypatch.undo()
    assert rollup.dirty_since(store.cursor()) == at(9 * 60).replace(tzinfo=None)
    features.refresh(store)
    assert rollup.dirty_since(store.cursor()) is None
    assert feats(store, 11 * 60)["ecc_corrected_24h"] == 10.0


def test_a_first_sample_after_a_long_gap_re_baselines(store, other):
    """Issue 11: after more than ``rollup.LONG_GAP`` without samples (agent or node away)
    the first sample counts 0, risen or dropped; the samples after it count as usual."""
    store.insert_sample_records(hour_of(0, 10))                 # 10..15
    store.insert_sample_records(hour_of(8, 400))                # 7 h later: 400..405
    features.refresh(store)
    r = feats(store, 9 * 60)
    assert (r["ecc_corrected_1h"], r["ecc_corrected_24h"]) == (5.0, 10.0)
    other.insert_sample_records(hour_of(0, 10) + hour_of(8, 3))  # dropped across it
    features.refresh(other)
    assert feats(other, 9 * 60)["ecc_corrected_24h"] == 10.0
    # the baseline comes from an earlier refresh's rollup row as well
    late = Store(store.path.replace("a.duckdb", "c.duckdb"))
    late.insert_sample_records(hour_of(0, 10))
    features.refresh(late)
    late.insert_sample_records(hour_of(8, 400))
    features.refresh(late)
    assert hourly(late) == hourly(store)
    late.close()
