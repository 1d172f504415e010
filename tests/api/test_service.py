"""The one-process service loop: derive incidents, refresh, retain, score."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

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
    Service(store, keep_raw=None, alerts=rec, drains=rec,  # type: ignore[arg-type]
            wall=lambda: 1234.5).rescore()
    assert rec.calls == [("evaluate", 1234.5), ("deliver", 1234.5), ("drains", 0.0)]
    assert store.cursor().execute("SELECT count(*) FROM node_scores").fetchone() == (1,)
