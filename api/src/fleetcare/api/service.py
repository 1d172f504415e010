"""The single-host service: ingest, scorer and API as threads of one process.

DuckDB allows one writing process per database file, so everything that writes lives
here and shares one ``Store``; other processes read through the API.

    svc = Service(store, consumer=EmbeddedConsumer("var/bus"), score_every_s=60)
    svc.start()        # ingest + scoring threads
    ...
    svc.stop()

Both loops log exceptions and keep running (a daemon never dies of one bad poll).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable

from fleetcare.api.alerts import AlertEngine
from fleetcare.api.drains import DrainController
from fleetcare.collectors.transport import BusConsumer
from fleetcare.models import registry, scoring
from fleetcare.pipeline import features, incidents, retention
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import RecordValidator

log = logging.getLogger(__name__)


class Service:
    def __init__(self, store: Store, *, consumer: BusConsumer | None = None,
                 score_every_s: float = 60.0, ingest_idle_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 validator: RecordValidator | None = None,
                 keep_raw: dt.timedelta | None = retention.DEFAULT_KEEP_RAW,
                 retention_every_s: float = 3600.0,
                 alerts: AlertEngine | None = None,
                 drains: DrainController | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.ingestor = (Ingestor(store, consumer, validator=validator)
                         if consumer is not None else None)
        self.score_every_s = score_every_s
        self.ingest_idle_s = ingest_idle_s
        self.clock = clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.keep_raw = keep_raw
        self.retention_every_s = retention_every_s
        self._retained_at: float | None = None
        self.alerts = alerts
        self.drains = drains
        self.wall = wall
        self.scores = 0
        self.on_scored: Callable[[], None] | None = None

    def _newest_telemetry(self) -> dt.datetime | None:
        newest = self.store.raw.bounds(self.store.cursor())[1]
        return newest.replace(tzinfo=dt.UTC) if newest is not None else None

    def rescore(self) -> None:
        """Derive failures from fresh fatal XIDs, bring features up to date, score every
        GPU and node once, and (hourly) drop raw telemetry that is rolled up and old."""
        newest = self._newest_telemetry()
        if newest is not None:
            incidents.derive_from_xids(self.store, since=newest - dt.timedelta(hours=6))
        features.refresh(self.store)
        if (self.keep_raw is not None and newest is not None
                and (self._retained_at is None
                     or self.clock() - self._retained_at >= self.retention_every_s)):
            # relative to the newest data, not the wall clock: replayed or simulated
            # history is never deleted for being old by the calendar
            retention.apply(self.store, self.keep_raw, now=newest)
            self._retained_at = self.clock()
        if registry.current(self.store) is not None:
            scoring.score(self.store)
            self.scores += 1
            if self.alerts is not None:
                # the rule works on scoring times; the outbox's retries on the wall clock
                self.alerts.evaluate(self.wall())
                self.alerts.outbox.deliver_due(self.wall())
            if self.drains is not None:
                report = self.drains.run_once()
                log.info("service.drains %s", report.to_json())
            if self.on_scored is not None:
                self.on_scored()

    def _ingest_loop(self) -> None:
        assert self.ingestor is not None
        while not self._stop.is_set():
            try:
                r = self.ingestor.run_once(self.ingest_idle_s)
            except Exception:
                log.exception("service.ingest_failed")
                r = None
            if r is None or r.records == 0:
                self._stop.wait(self.ingest_idle_s)

    def _score_loop(self) -> None:
        next_at = self.clock()
        while not self._stop.is_set():
            if self.clock() >= next_at:
                try:
                    self.rescore()
                except Exception:
                    log.exception("service.score_failed")
                next_at += self.score_every_s
            self._stop.wait(max(0.0, min(1.0, next_at - self.clock())))

    def start(self) -> None:
        loops = [self._score_loop] + ([self._ingest_loop] if self.ingestor else [])
        for loop in loops:
            t = threading.Thread(target=loop, name=f"fleetcare-{loop.__name__[1:]}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
