"""The one-process service loop: derive incidents, refresh, retain, score."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from pathlib import Path

import pytest

from fleetcare.api.service import Service
from fleetcare.collectors.clock import ManualClock
from fleetcare.collectors.contract import XidEvent
from fleetcare.pipeline.store import Store
from tests.collectors.test_contract import sample

T0 = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)  # long ago by the calendar, on purpose


def _fill(store: Store, hours: int) -> None:
    store.insert_sample_records(
        sample(ts=T0 + dt.timedelta(hours=h), gpu_uuid="GPU-1", ecc_corrected_volatile=h)
        for h in range(hours))


def test_rescore_derives_failures_from_fresh_fatal_xids(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    _fill(store, 3)
    store.insert_events([XidEvent(ts=T0 + dt.timedelta(hours=2), node="node-00001", xid=79,
                                  message="GPU has fallen off the bus.", source="kernel-log",
                                  gpu_uuid="GPU-1")])
    Service(store, keep_raw=None).rescore()  # no model yet: derives and refreshes only
    rows = store.cursor().execute(
        "SELECT kind, cause, source, xid FROM incidents").fetchall()
    assert rows == [("failure", "faulty_gpu", "xid", 79)]


def test_retention_is_relative_to_the_newest_data_and_hourly(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    _fill(store, 72)
    clock = ManualClock(0)
    svc = Service(store, keep_raw=dt.timedelta(days=1), clock=clock)
    svc.rescore()
    lo, n = store.cursor().execute("SELECT min(ts), count(*) FROM telemetry").fetchone()
    # newest sample T0+71h: raw rows before T0+47h are gone, although all are from 2025
    assert lo == (T0 + dt.timedelta(hours=47)).replace(tzinfo=None)
    assert n == 25
    _fill(store, 0)
    store.insert_sample_records([sample(ts=T0 + dt.timedelta(hours=80), gpu_uuid="GPU-1")])
    clock.sleep(60)
    svc.rescore()  # within the hour: retention does not run again
    assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone() == (26,)


def test_scoring_feeds_alerts_and_drains(tmp_path: Path) -> None:
    """After each scoring run: alert rules, the outbox, then the drain controller."""

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, float]] = []
            self.outbox = self
            self.cost = self        # drains: the break-even risk
            self.threshold = 0.5    # alerts: the firing threshold (current_rule)

        def current_rule(self) -> Recorder:
            return self

        def break_even_risk(self) -> float:
            return 0.004

        def evaluate(self, now: float) -> None:
            self.calls.append(("evaluate", now))

        def deliver_due(self, now: float) -> None:
            self.calls.append(("deliver", now))

        def run_once(self) -> Recorder:
            self.calls.append(("drains", 0.0))
            return self

        def to_json(self) -> dict[str, int]:
            return {}

    from fleetcare.models import registry
    from fleetcare.models.model import FailureModel
    from fleetcare.pipeline import features

    store = Store(tmp_path / "f.duckdb")
    _fill(store, 30)
    features.refresh(store)
    import numpy as np

    cols = [c for c in features.latest_features(store).column_names
            if c not in features.KEY_COLUMNS]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, len(cols)))
    y = X[:, 0] > 1.5
    registry.save(store, FailureModel(n_estimators=5).fit(X, y, feature_names=cols))
    rec = Recorder()
    svc = Service(store, keep_raw=None, alerts=rec, drains=rec,  # type: ignore[arg-type]
                  wall=lambda: 1234.5)
    assert svc.explain_floor() == 0.004  # a node the drains would take has its reasons
    svc.rescore()
    assert rec.calls == [("evaluate", 1234.5), ("deliver", 1234.5), ("drains", 0.0)]
    assert store.cursor().execute("SELECT count(*) FROM node_scores").fetchone() == (1,)


class _Failing:
    """A consumer whose poll fails once, as a broker hiccup or a bad poll would."""

    def __init__(self, inner) -> None:
        self.inner, self.polls = inner, 0

    def poll(self, timeout_s: float, max_records: int = 10_000):
        self.polls += 1
        got = self.inner.poll(timeout_s, max_records)
        if got:
            raise RuntimeError("boom: the poll failed after reading")
        return got

    def commit(self) -> None:
        self.inner.commit()

    def close(self) -> None:
        self.inner.close()


def test_an_ingest_worker_that_fails_is_replaced_and_loses_nothing(tmp_path: Path) -> None:
    """The old ingest loop kept polling past a poll that raised, so what it had read was
    neither landed nor read again. Now the worker stops, a new consumer resumes from the
    last committed position."""
    import time

    from fleetcare.collectors.contract import SCHEMA_VERSION, Batch
    from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer

    bus = EmbeddedBus(tmp_path / "bus")
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)  # what validation accepts
    for i in range(5):
        bus.send(Batch(schema_version=SCHEMA_VERSION, node="node-00001", seq=i, sent_at=recent,
                       samples=[sample(ts=recent + dt.timedelta(minutes=i), gpu_uuid="GPU-1")]))
    bus.flush()
    opened: list[object] = []

    def open_consumer():
        c = EmbeddedConsumer(tmp_path / "bus")
        c = _Failing(c) if not opened else c
        opened.append(c)
        return c

    store = Store(tmp_path / "f.duckdb")
    svc = Service(store, open_consumer=open_consumer, score_every_s=1e9, keep_raw=None,
                  ingest_poll_s=0.05, ingest_restart_s=0.05)
    svc.start()
    try:
        deadline = time.monotonic() + 20
        while store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()[0] < 5:
            assert time.monotonic() < deadline, "the samples were not landed"
            time.sleep(0.05)
    finally:
        svc.stop()
    assert svc.ingest_restarts == 1 and len(opened) == 2
    assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()[0] == 5


def test_lake_shape_reads_new_files_scores_and_compacts(tmp_path: Path) -> None:
    import numpy as np

    from fleetcare.collectors.contract import SCHEMA_VERSION, Batch
    from fleetcare.models import registry
    from fleetcare.models.model import FailureModel
    from fleetcare.pipeline import features
    from fleetcare.pipeline.lake import LakeWriter
    from fleetcare.pipeline.lake_feed import FILES, open_state

    lake = tmp_path / "lake"
    for w in ("w1", "w2"):
        writer = LakeWriter(lake, worker_id=w)
        writer.insert_batches([Batch(
            schema_version=SCHEMA_VERSION, node=f"node-{w}", seq=h, sent_at=T0,
            samples=[sample(ts=T0 + dt.timedelta(hours=h), node=f"node-{w}",
                            gpu_uuid=f"GPU-{w}")]) for h in range(5)])
        writer.flush()
    store = open_state(tmp_path / "state.duckdb", lake)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, len(features.FEATURE_NAMES)))
    registry.save(store, FailureModel(n_estimators=5).fit(
        X, X[:, 0] > 1.2, feature_names=list(features.FEATURE_NAMES)), make_current=True)
    svc = Service(store, keep_raw=None, compact_every_s=0)
    svc.rescore()
    nodes = store.cursor().execute("SELECT DISTINCT node FROM node_scores ORDER BY 1").fetchall()
    assert nodes == [("node-w1",), ("node-w2",)]
    # after scoring, the next clock hour's live-feature base is built ahead (issue 15 §2)
    from fleetcare.pipeline import live_features
    assert live_features.BASES.held(store, dt.datetime(2025, 6, 1, 5))
    assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone() == (0,)
    # 5 hourly partitions of 2025 with a file per worker each, compacted to one file each
    files = store.cursor().execute(
        f"SELECT count(*), sum(rows) FROM {FILES} WHERE table_name = 'telemetry'").fetchone()
    assert files == (5, 10)
    assert len(list((lake / "telemetry").rglob("*.parquet"))) == 5 + 1  # + _schema
    store.close()


def test_an_urgent_batch_rescores_at_once_not_at_the_next_cycle(tmp_path: Path) -> None:
    """Issue 16 §4: scoring hourly, a GSP warning (XID 119) lands and the node is rescored
    within seconds; a job's own XID (application class) does not wake the scorer."""
    import time

    from fleetcare.collectors.contract import SCHEMA_VERSION, Batch
    from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer

    bus = EmbeddedBus(tmp_path / "bus")
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    seq = iter(range(1000))

    def send(**kw) -> None:
        bus.send(Batch(schema_version=SCHEMA_VERSION, node="node-00001", seq=next(seq),
                       sent_at=recent, **kw))
        bus.flush()

    for i in range(6):
        send(samples=[sample(ts=recent + dt.timedelta(minutes=10 * i), gpu_uuid="GPU-1")])
    store = Store(tmp_path / "f.duckdb")
    svc = Service(store, open_consumer=lambda: EmbeddedConsumer(tmp_path / "bus"),
                  score_every_s=3600, keep_raw=None, ingest_poll_s=0.05, urgent_gap_s=0.5)

    def wait_for(cond, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    svc.start()
    try:
        wait_for(lambda: svc.scores >= 1, "the first cycle did not score")
        wait_for(lambda: store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()[0]
                 == 6, "the samples were not landed")
        send(events=[XidEvent(ts=recent + dt.timedelta(minutes=55), node="node-00001", xid=13,
                              message="Graphics Engine Exception", source="kernel-log")])
        wait_for(lambda: store.cursor().execute("SELECT count(*) FROM xid_events").fetchone()[0]
                 == 1, "the application XID was not landed")
        time.sleep(1.0)
        assert svc.event_rescores == 0  # a job's fault: the hourly cycle is enough
        scored = svc.scores
        send(events=[XidEvent(ts=recent + dt.timedelta(minutes=56), node="node-00001", xid=119,
                              message="Timeout waiting for RPC from GSP", source="kernel-log",
                              gpu_uuid="GPU-1")])
        wait_for(lambda: svc.scores > scored, "the GSP warning did not rescore the node")
        assert svc.event_rescores == 1
        assert "XID 119" in svc.urgent.why["node-00001"]
        from fleetcare.collectors.agent_metrics import exposition

        text = exposition(svc.families())  # what /metrics shows
        assert "fleetcare_event_rescores_total 1" in text
        assert "fleetcare_rescore_on_events 1" in text
        assert "fleetcare_ingest_samples_total" in text
    finally:
        svc.stop()


def test_rescore_runs_one_at_a_time(tmp_path: Path) -> None:
    """The scoring loop's cycles (on schedule or on an urgent batch) and a caller's own
    rescore() never overlap: two writers of the rollups conflicted in DuckDB."""
    import threading
    import time

    svc = Service(Store(tmp_path / "f.duckdb"), keep_raw=None)
    inside, seen = [0], []

    def cycle() -> None:
        inside[0] += 1
        seen.append(inside[0])
        time.sleep(0.05)
        inside[0] -= 1

    svc._rescore = cycle  # type: ignore[method-assign]
    threads = [threading.Thread(target=svc.rescore) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1, 1, 1, 1]


def test_stop_interrupts_a_scoring_run_stuck_in_a_long_query(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C on ``serve`` or the demo must not wait for a query that runs for minutes
    (the next hour's feature base on a loaded machine): after half its timeout ``stop``
    interrupts the store's running queries, and the scoring thread ends quietly."""
    store = Store(tmp_path / "f.duckdb")
    svc = Service(store, keep_raw=None, score_every_s=3600)
    running = threading.Event()

    def long_run() -> None:
        cur = store.cursor()
        running.set()
        cur.execute("SELECT count(*) FROM range(1000000000000) a WHERE a % 7 = 3").fetchall()

    svc.rescore = long_run  # type: ignore[method-assign]
    svc.start()
    assert running.wait(10)
    time.sleep(0.5)  # inside the query
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="fleetcare.api.service"):
        svc.stop(timeout_s=4.0)
    assert time.monotonic() - t0 < 4.0
    assert not any(t.is_alive() for t in svc.threads)
    assert "service.score_interrupted" in caplog.text
    assert "service.score_failed" not in caplog.text
    assert store.cursor().execute("SELECT 1").fetchone() == (1,)  # the store still works
    store.close()
