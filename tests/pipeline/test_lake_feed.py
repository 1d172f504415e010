"""The service's incremental read of the Parquet lake (issue 11 §2): a file watermark,
late files, duplicates across workers, compaction and retention, and rollups equal to
those of the same rows landed in a DuckDB table."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest

from fleetcare.collectors.contract import SCHEMA_VERSION, Batch
from fleetcare.collectors.sim import FleetSimulator, FleetSpec, chunk_to_samples, simulate_incidents
from fleetcare.pipeline import features, lake_feed, retention, rollup
from fleetcare.pipeline.lake import LakeWriter
from fleetcare.pipeline.store import Store

H = dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def sim() -> FleetSimulator:
    spec = FleetSpec(nodes=3, seed=11, failure_scale=60)
    return FleetSimulator(spec, simulate_incidents(spec, days=2))


def batches(sim: FleetSimulator, h0: float, hours: float) -> list[Batch]:
    """One batch per node per hour of simulated history (5-minute samples)."""
    start = sim.spec.start + h0 * H
    by_key: dict[tuple[str, dt.datetime], Batch] = {}

    def part(node: str, ts: dt.datetime) -> Batch:
        hour = ts.replace(minute=0, second=0, microsecond=0)
        return by_key.setdefault((node, hour), Batch(
            schema_version=SCHEMA_VERSION, node=node, seq=len(by_key), sent_at=hour))

    for chunk in sim.history(start, start + hours * H, 300):
        for s in chunk_to_samples(chunk):
            part(s.node, s.ts).samples.append(s)
        for e in chunk.events:
            part(e.node, e.ts).events.append(e)
        for inc in chunk.incidents:
            part(inc.node, inc.ts).incidents.append(inc)
    return list(by_key.values())


def hourly(store: Store) -> list[tuple]:
    return store.cursor().execute(
        f"SELECT * FROM {rollup.TABLE} ORDER BY gpu_uuid, hour").fetchall()


def same_rows(a: list[tuple], b: list[tuple]) -> None:
    """Equal rows; floats to 1e-9 (sums in another file order round differently)."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert len(ra) == len(rb)
        for x, y in zip(ra, rb, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9), (ra, rb)
            else:
                assert x == y, (ra, rb)


def table(store: Store, name: str) -> list[tuple]:
    return store.cursor().execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall()


def write(root: Path, worker: str, data: list[Batch]) -> None:
    w = LakeWriter(root, worker_id=worker)
    w.insert_batches(data)
    w.flush()


def test_sync_reads_each_new_file_once_and_rolls_up_like_a_table(tmp_path, sim):
    root = tmp_path / "lake"
    hist = batches(sim, 20, 9)
    late = [b for b in hist if b.sent_at == sim.spec.start + 22 * H]   # held back
    day1 = [b for b in hist if b.sent_at < sim.spec.start + 26 * H]
    day2 = [b for b in hist if b.sent_at >= sim.spec.start + 26 * H]
    early = [b for b in day1 if b not in late]
    write(root, "w1", early[: len(early) // 2])
    write(root, "w2", early[len(early) // 2:])
    write(root, "w2", early[:5])                     # a redelivery after a crash: twice
    state = lake_feed.open_state(tmp_path / "state.duckdb", root)
    first = state.raw.sync(state)
    assert first.files > 0 and first.samples > 0
    assert state.raw.sync(state).files == 0          # the watermark: nothing new
    features.refresh(state)

    direct = Store(tmp_path / "direct.duckdb")
    direct.insert_batches(early)
    features.refresh(direct)
    same_rows(hourly(state), hourly(direct))
    for name in ("xid_events", "incidents"):
        assert table(state, name) == table(direct, name)
    assert state.raw.bounds(state.cursor()) == direct.raw.bounds(direct.cursor())
    node = day1[0].node
    assert (state.raw.latest_samples(state.cursor(), node=node)
            == direct.raw.latest_samples(direct.cursor(), node=node))

    # new hours, and a late file for an hour already rolled up
    write(root, "w1", day2)
    write(root, "w3", late)
    got = state.raw.sync(state)
    assert got.files > 0 and got.oldest_new_sample == (sim.spec.start + 22 * H).replace(
        tzinfo=None)
    features.refresh(state)
    direct.insert_batches(late + day2)
    features.refresh(direct)
    same_rows(hourly(state), hourly(direct))
    direct.close()
    state.close()

    again = lake_feed.open_state(tmp_path / "state.duckdb", root)  # a restart remembers
    assert again.raw.sync(again).files == 0
    again.close()


def test_compaction_and_retention_keep_the_watermark_exact(tmp_path, sim):
    root = tmp_path / "lake"
    data = batches(sim, 20, 6)
    for i in range(3):
        write(root, f"w{i}", data[i::3])
    state = lake_feed.open_state(tmp_path / "state.duckdb", root)
    state.raw.sync(state)
    features.refresh(state)
    before = hourly(state)
    files_before = len(table(state, lake_feed.FILES))

    unread = LakeWriter(root, worker_id="late")      # written after the sync: not compacted
    unread.insert_batches(data[:1])                 # a redelivered batch
    unread.flush()
    res = state.raw.compact(state, now=sim.spec.start + 40 * H)
    assert res.partitions > 0 and res.files_in > res.files_out
    assert len(table(state, lake_feed.FILES)) < files_before
    assert sum(1 for p in root.rglob("late-*.parquet")) >= 1
    synced = state.raw.sync(state)
    assert synced.files >= 1                        # only the unread file is new
    features.refresh(state)
    rollup.refresh(state, full=True)                # rebuilt from the compacted files
    same_rows(hourly(state), before)

    r = retention.apply(state, dt.timedelta(hours=3), now=sim.spec.start + 26 * H)
    assert r.cutoff == (sim.spec.start + 23 * H).replace(tzinfo=None) and r.deleted > 0
    oldest = state.cursor().execute(
        f"SELECT min(hour) FROM {lake_feed.FILES} WHERE table_name = 'telemetry'").fetchone()[0]
    assert oldest == r.cutoff
    assert not any(p.name.startswith("hour=20") for p in (root / "telemetry").rglob("hour=*"))
    same_rows(hourly(state), before)                # rollups are kept
    state.close()


def test_a_missing_lake_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="fleetcare ingest --lake"):
        lake_feed.open_state(tmp_path / "s.duckdb", tmp_path / "nope")
