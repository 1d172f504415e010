"""Each GPU's newest sample held in memory for the node page
(``fleetcare.api.latest_samples``): the same answer as the table's own read, brought up
to date incrementally, and honest about what it cannot tell. Real DuckDB file."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from fleetcare.api import queries
from fleetcare.api.latest_samples import SLACK, SLACK_EVERY_S, WINDOW, LatestSamples
from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline.store import Store

from .conftest import T0

UTC = dt.UTC


def at(minutes: float) -> dt.datetime:
    return (T0 + dt.timedelta(minutes=minutes)).replace(tzinfo=None)


def sample(node: str, uuid: str, index: int, minutes: float, temp: float) -> GpuSample:
    return GpuSample(ts=at(minutes).replace(tzinfo=UTC), node=node, gpu_uuid=uuid,
                     gpu_index=index, pci_bus_id=f"00000000:{index:02x}:00.0",
                     model="NVIDIA H100 80GB HBM3", gpu_temp_c=temp,
                     nvlink_crc_flit=[1, 2, 3])


def from_table(store: Store, node: str, since: dt.datetime) -> list[dict]:
    cur = store.cursor()
    return queries._latest_samples(cur, {"telemetry"}, store.raw, since, node=node)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_memory_answers_what_the_table_answers_as_samples_arrive(store: Store) -> None:
    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    store.insert_sample_records([sample("n1", "GPU-a", 0, m, 60 + m) for m in range(0, 30, 5)]
                                + [sample("n1", "GPU-b", 1, m, 50 + m) for m in range(0, 30, 5)]
                                + [sample("n2", "GPU-c", 0, 3, 70.0)])
    cur = store.cursor()
    since = at(10)
    got = mem.for_node(cur, "n1", since)
    assert got == from_table(store, "n1", since) and [s["gpu_temp_c"] for s in got] == [85, 75]
    assert mem.floor == at(25) - WINDOW
    assert mem.for_node(cur, "n2", since) == from_table(store, "n2", since) == []
    assert mem.for_node(cur, "n2", at(0)) is None  # before the floor: memory cannot tell

    # new samples: not seen until the refresh interval passes, then exactly the table's
    store.insert_sample_records([sample("n1", "GPU-a", 0, 26, 99.0),
                                 sample("n2", "GPU-c", 0, 26, 71.0)])
    assert [s["gpu_temp_c"] for s in mem.for_node(cur, "n1", since)] == [85, 75]
    clock.t = 1.0
    assert mem.for_node(cur, "n1", since) == from_table(store, "n1", since)
    assert mem.for_node(cur, "n2", since) == from_table(store, "n2", since)
    assert mem.for_node(cur, "n2", since)[0]["gpu_temp_c"] == 71.0

    # a GPU moved to another node: it leaves the old node's answer
    store.insert_sample_records([sample("n2", "GPU-b", 3, 27, 40.0)])
    clock.t = 2.0
    assert [s["gpu_uuid"] for s in mem.for_node(cur, "n1", since)] == ["GPU-a"]
    assert mem.for_node(cur, "n2", since) == from_table(store, "n2", since)
    assert [s["gpu_uuid"] for s in mem.for_node(cur, "n2", since)] == ["GPU-c", "GPU-b"]

    # a late sample (behind the newest seen, within SLACK): taken at the next slack scan
    late = 27 - SLACK.total_seconds() / 60 + 0.5
    store.insert_sample_records([sample("n9", "GPU-z", 0, late, 33.0)])
    clock.t = 3.0
    assert mem.for_node(cur, "n9", since) == []
    clock.t = 2.0 + SLACK_EVERY_S
    assert mem.for_node(cur, "n9", since) == from_table(store, "n9", since) != []
    assert mem.for_node(cur, "n1", since, kind="lake") is None  # another source: not held


@pytest.mark.parametrize("keep_fresh", [False, True], ids=["by-request", "kept"])
def test_node_page_shows_a_new_sample_within_the_freshness_interval(tmp_path, serve_app,
                                                                     fleet, store,
                                                                     keep_fresh) -> None:
    """Production default: rarely changing reads are checked at most every freshness_s;
    a score or a sample written by another process shows within it (kept: the samples by
    a keeper thread, as ``serve`` runs them)."""
    fleet.node_score("n1", 0.4, ts=T0)
    store.con.execute("INSERT INTO gpu_scores VALUES (?, 'n1', 'GPU-a', 0, 'NVIDIA H100 80GB "
                      "HBM3', 0.4, '[]', 'm1')", [at(0)]).fetchall()
    store.insert_sample_records([sample("n1", "GPU-a", 0, 0, 60.0)])
    client = serve_app(store, freshness_s=0.3, keep_fresh=keep_fresh)
    page = client.get("/v1/nodes/n1").json()
    assert page["gpus"][0]["telemetry"]["gpu_temp_c"] == 60.0
    store.insert_sample_records([sample("n1", "GPU-a", 0, 1, 61.0)])
    fleet.node_score("n2", 0.9, ts=T0)
    time.sleep(0.35)
    assert client.get("/v1/nodes/n1").json()["gpus"][0]["telemetry"]["gpu_temp_c"] == 61.0
    assert [n["node"] for n in client.get("/v1/risk").json()["nodes"]] == ["n2", "n1"]


def test_samples_at_the_newest_ts_seen_show_within_the_refresh_interval(store: Store) -> None:
    """A fleet's agents report at the same second and their samples land over many polls:
    one landing after a refresh, at the newest ts already seen, is not "late" (regression:
    it waited for the next slack scan, up to SLACK_EVERY_S)."""
    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    cur = store.cursor()
    store.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    assert [s["gpu_temp_c"] for s in mem.for_node(cur, "n1", at(0))] == [60.0]
    for k, (uuid, index, temp) in enumerate([("GPU-b", 1, 61.0), ("GPU-c", 2, 62.0)], 1):
        store.insert_sample_records([sample("n1", uuid, index, 5, temp)])  # the same ts
        clock.t = float(k)  # a refresh interval, far from a slack scan
        assert mem.for_node(cur, "n1", at(0)) == from_table(store, "n1", at(0))
        assert len(mem.for_node(cur, "n1", at(0))) == k + 1
    # newer samples after ties: the newest each, and ties at the new newest ts again
    store.insert_sample_records([sample("n1", "GPU-a", 0, 6, 70.0)])
    clock.t = 3.0
    assert [s["gpu_temp_c"] for s in mem.for_node(cur, "n1", at(0))] == [70.0, 61.0, 62.0]
    store.insert_sample_records([sample("n1", "GPU-b", 1, 6, 71.0),
                                 sample("n1", "GPU-c", 2, 6, 72.0)])
    clock.t = 4.0
    assert mem.for_node(cur, "n1", at(0)) == from_table(store, "n1", at(0))
    assert [s["gpu_temp_c"] for s in mem.for_node(cur, "n1", at(0))] == [70.0, 71.0, 72.0]


class CountingCursor:
    """A cursor that counts the rows each query gives back (the rest forwarded)."""

    def __init__(self, cur) -> None:
        self.cur = cur
        self.rows: list[int] = []

    def execute(self, *args, **kwargs):
        result = self.cur.execute(*args, **kwargs)
        outer = self

        class Counted:
            def fetchall(self):
                rows = result.fetchall()
                outer.rows.append(len(rows))
                return rows

        return Counted()

    def __getattr__(self, name: str):
        return getattr(self.cur, name)


def test_a_refresh_reads_only_the_samples_that_landed_since_the_last(store: Store) -> None:
    """A fleet tick lands over many polls at one ts: a refresh reads the GPUs not held at
    that ts yet, not again every GPU already held there (regression: at 16,384 GPUs it
    re-read ~16,000 rows a second to find ~270, ~40 ms of the API's interpreter)."""
    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    cur = CountingCursor(store.cursor())
    store.insert_sample_records([sample("n1", f"GPU-{i}", i, 5, 60.0) for i in range(40)])
    assert len(mem.for_node(cur, "n1", at(0))) == 40
    for k, batch in enumerate([range(40, 43), range(43, 44)], 1):
        store.insert_sample_records([sample("n1", f"GPU-{i}", i, 5, 61.0) for i in batch])
        cur.rows.clear()
        clock.t = float(k)
        assert mem.for_node(cur, "n1", at(0)) == from_table(store, "n1", at(0))
        assert cur.rows == [len(batch), len(batch)]  # which moved; their samples
    cur.rows.clear()
    clock.t = 3.0  # nothing new: nothing read
    assert len(mem.for_node(cur, "n1", at(0))) == 44 and cur.rows == [0]


def test_readers_do_not_wait_for_the_refresher_to_write_its_json(store: Store,
                                                                 monkeypatch) -> None:
    """A slack scan can take thousands of GPUs at once (~20 µs of JSON each): readers keep
    getting the held samples meanwhile (regression: they waited on the data lock for all
    of it, ~0.3 s at 16,384 GPUs, and so did every request queued behind them)."""
    from fleetcare.api import latest_samples

    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    store.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    assert len(mem.for_node(store.cursor(), "n1", at(0))) == 1
    store.insert_sample_records([sample("n1", "GPU-a", 0, 6, 61.0)])
    writing, release = threading.Event(), threading.Event()
    real_encode = latest_samples._encode

    def slow_encode(sample):
        writing.set()
        assert release.wait(10)
        return real_encode(sample)

    monkeypatch.setattr(latest_samples, "_encode", slow_encode)
    clock.t = 1.0
    refresher = threading.Thread(target=mem.for_node, args=(store.cursor(), "n1", at(0)))
    refresher.start()
    try:
        assert writing.wait(10)
        got: list = []
        reader = threading.Thread(target=lambda: got.append(
            mem.for_node(store.cursor(), "n1", at(0))))
        reader.start()
        reader.join(2)
        assert not reader.is_alive(), "the reader waited for the refresher's JSON"
        assert [s["gpu_temp_c"] for s in got[0]] == [60.0]  # the held one meanwhile
    finally:
        release.set()
        refresher.join(10)
    assert [s["gpu_temp_c"] for s in mem.for_node(store.cursor(), "n1", at(0))] == [61.0]


def test_non_finite_values_are_null_as_the_table_read_gives_them(store: Store) -> None:
    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    cur = store.cursor()
    store.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    assert mem.for_node(cur, "n1", at(0))[0]["gpu_temp_c"] == 60.0
    for k, bad in enumerate([float("nan"), float("inf"), -float("inf")], 1):
        store.insert_sample_records([sample("n1", "GPU-a", 0, 5 + k, bad)])
        clock.t = float(k)
        got = mem.for_node(cur, "n1", at(0))
        assert got == from_table(store, "n1", at(0)) and got[0]["gpu_temp_c"] is None


def _until(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_keeper_thread_refreshes_so_that_no_request_pays(store: Store) -> None:
    clock = Clock()  # frozen: no request ever finds the memory due
    mem = LatestSamples(refresh_s=0.05, clock=clock)
    cur = store.cursor()
    store.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    mem.warm(cur)
    keeper = mem.keep(store.cursor)
    try:
        store.insert_sample_records([sample("n1", "GPU-a", 0, 6, 61.0)])
        assert _until(lambda: mem.for_node(cur, "n1", at(0))[0]["gpu_temp_c"] == 61.0)
    finally:
        mem.stop(5)
    assert not keeper.is_alive()  # stop waits for it
    # the keeper gone, requests refresh again once the memory is due
    store.insert_sample_records([sample("n1", "GPU-a", 0, 7, 62.0)])
    clock.t = 1.0
    assert mem.for_node(cur, "n1", at(0))[0]["gpu_temp_c"] == 62.0


def test_the_keeper_ends_when_the_database_closes(tmp_path) -> None:
    own = Store(tmp_path / "own.duckdb")
    own.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    mem = LatestSamples(refresh_s=0.05)
    keeper = mem.keep(own.cursor)
    assert _until(lambda: mem.refreshes >= 2)
    own.close()
    keeper.join(5)
    assert not keeper.is_alive()


def test_a_sample_stored_twice_is_held_once(store: Store) -> None:
    """A key stored twice (here a duplicated per-link row) reads as two rows: memory holds
    the GPU once, and later GPUs at the same ts still show at the next refresh
    (regression: the GPU counted twice among those held at the newest ts, so the refresh
    thought every GPU there was held and left the next one to the slack scan)."""
    clock = Clock()
    mem = LatestSamples(refresh_s=1.0, clock=clock)
    cur = store.cursor()
    store.insert_sample_records([sample("n1", "GPU-a", 0, 5, 60.0)])
    assert len(mem.for_node(cur, "n1", at(0))) == 1
    store.insert_sample_records([sample("n1", f"GPU-{g}", i, 6, 61.0)
                                 for i, g in enumerate("abc")])
    store.con.execute("INSERT INTO telemetry_nvlink SELECT * FROM telemetry_nvlink "
                      "WHERE gpu_uuid = 'GPU-a' AND ts = ?", [at(6)]).fetchall()
    clock.t = 1.0
    assert [s["gpu_uuid"] for s in mem.for_node(cur, "n1", at(0))] == ["GPU-a", "GPU-b",
                                                                        "GPU-c"]
    store.insert_sample_records([sample("n1", "GPU-d", 3, 6, 62.0)])  # at the same ts
    clock.t = 2.0  # a refresh interval, far from a slack scan
    assert [s["gpu_uuid"] for s in mem.for_node(cur, "n1", at(0))] == ["GPU-a", "GPU-b",
                                                                        "GPU-c", "GPU-d"]
