"""The fleet service: ingest, scorer, alerts, drains and API as threads of one process.

DuckDB allows one writing process per database file, so everything that writes lives
here and shares one ``Store``; other processes read through the API. Two shapes:

- one host: ``open_consumer`` (``embedded://`` or ``kafka://``, one consumer group) feeds
  an ``IngestWorker``, the same loop as ``fleetcare ingest`` (offsets committed only
  after the rows are durable), into the store's own telemetry table;
- scale-out: ``fleetcare ingest --lake`` workers write Parquet and the store reads the
  lake (``store.raw`` is a ``lake_feed.LakeTelemetry``): each scoring cycle first reads
  the lake files written since the last one, and compaction runs on a schedule.

    svc = Service(store, open_consumer=lambda: open_consumer("kafka://127.0.0.1:9092"))
    svc.start()        # ingest + scoring threads
    ...
    svc.stop()

A batch that lands something urgent — a warning or fatal XID, a new uncorrectable error, a
link going down (``pipeline.urgent``) — wakes the scorer at once instead of at the next
cycle, at most every ``urgent_gap_s``: a GSP or SRAM precursor 1–3 h before the failure is
scored within seconds even when the fleet is rescored every few minutes.

Both loops run below the API's threads in CPU priority (``priority``: readers first) and log
exceptions and keep running (a daemon never dies of one bad poll). An
ingest worker that stops on an error is replaced by a new one on a new consumer, which
resumes from the last committed position: nothing it had read but not landed is lost.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable

from fleetcare.api import priority
from fleetcare.api.alerts import AlertEngine
from fleetcare.api.drains import DrainController
from fleetcare.collectors.agent_metrics import Family
from fleetcare.collectors.contract import Batch
from fleetcare.collectors.transport import BusConsumer
from fleetcare.models import prior, scoring
from fleetcare.pipeline import features, incidents, live_features, retention
from fleetcare.pipeline.ingest_worker import IngestWorker
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.urgent import UrgentSignals
from fleetcare.pipeline.validate import RecordValidator

log = logging.getLogger(__name__)


class Service:
    def __init__(self, store: Store, *, open_consumer: Callable[[], BusConsumer] | None = None,
                 score_every_s: float = 60.0, ingest_poll_s: float = 0.5,
                 ingest_restart_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 validator: RecordValidator | None = None,
                 keep_raw: dt.timedelta | None = retention.DEFAULT_KEEP_RAW,
                 retention_every_s: float = 3600.0,
                 compact_every_s: float = 3600.0,
                 keep_scores: scoring.ScoreRetention | None = None,
                 alerts: AlertEngine | None = None,
                 drains: DrainController | None = None,
                 wall: Callable[[], float] = time.time,
                 urgent_gap_s: float = 5.0,
                 urgent: UrgentSignals | None = None,
                 rescore_on_events: bool = True,
                 background_nice: int = priority.BACKGROUND_NICE) -> None:
        self.store = store
        self.background_nice = priority.checked(background_nice)
        self.open_consumer = open_consumer
        self.score_every_s = score_every_s
        self.ingest_poll_s = ingest_poll_s
        self.ingest_restart_s = ingest_restart_s
        self.validator = validator
        self.clock = clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.keep_raw = keep_raw
        self.retention_every_s = retention_every_s
        self.compact_every_s = compact_every_s
        self.keep_scores = keep_scores or scoring.ScoreRetention()
        self._retained_at: float | None = None
        self._compacted_at: float | None = None
        self.alerts = alerts
        self.drains = drains
        self.wall = wall
        self.scores = 0
        self.worker: IngestWorker | None = None
        self.ingest_restarts = 0
        self.on_scored: Callable[[], None] | None = None
        self.urgent = urgent if urgent is not None else UrgentSignals()
        self.urgent_gap_s = urgent_gap_s
        self.rescore_on_events = rescore_on_events
        self._rescoring = threading.Lock()
        self._wake = threading.Event()
        self._urgent_lock = threading.Lock()
        self._urgent_nodes: set[str] = set()
        self.event_rescores = 0
        """Scoring cycles started early by an urgent batch (``pipeline.urgent``)."""

    @property
    def lake(self) -> bool:
        return self.store.raw.kind == "lake"

    def _newest_telemetry(self) -> dt.datetime | None:
        newest = self.store.raw.bounds(self.store.cursor())[1]
        return newest.replace(tzinfo=dt.UTC) if newest is not None else None

    def _due(self, last: float | None, every_s: float) -> bool:
        return last is None or self.clock() - last >= every_s

    def rescore(self) -> None:
        """Read new lake files (lake shape), derive failures from fresh fatal XIDs, bring
        rollups up to date, score every GPU and node once, then alerts and drains, then
        build the next hour's live-feature base if not held (``live_features``); on
        their schedules, drop raw telemetry that is rolled up and old, prune old scores
        and compact the lake. One at a time: a call while another runs waits for it."""
        with self._rescoring:
            self._rescore()

    def _rescore(self) -> None:
        if self.lake:
            self.store.raw.sync(self.store)  # type: ignore[attr-defined]
        newest = self._newest_telemetry()
        if newest is not None:
            incidents.derive_from_xids(self.store, since=newest - dt.timedelta(hours=6))
        features.refresh(self.store)
        if (self.keep_raw is not None and newest is not None
                and self._due(self._retained_at, self.retention_every_s)):
            # relative to the newest data, not the wall clock: replayed or simulated
            # history is never deleted for being old by the calendar
            retention.apply(self.store, self.keep_raw, now=newest)
            scoring.prune(self.store, self.keep_scores)
            self._retained_at = self.clock()
        if prior.ensure_current(self.store) is not None:  # the fleet prior until a fleet model
            scoring.score(self.store, explain_floor=self.explain_floor())
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
            # the next clock hour's live-feature base, while nothing waits on it
            live_features.prepare_next(self.store)
        if self.lake and self._due(self._compacted_at, self.compact_every_s):
            self.store.raw.compact(self.store)  # type: ignore[attr-defined]
            self._compacted_at = self.clock()

    def explain_floor(self) -> float:
        """Reasons are written above ``scoring.EXPLAIN_FLOOR``, or above the alert
        threshold or the drains' break-even risk when lower: every node an alert or a
        drain names has its reasons."""
        return scoring.explain_floor_for(
            self.alerts.current_rule().threshold if self.alerts is not None else None,
            self.drains.cost.break_even_risk() if self.drains is not None else None)

    def families(self) -> list[Family]:
        """Prometheus families of the running service: the ingest worker's counters and
        event scoring (``/metrics``)."""
        fams = list(self.worker.families()) if self.worker is not None else []
        fams.append(Family("fleetcare_event_rescores_total", "counter",
                           "Scoring cycles started early because a batch landed an urgent "
                           "signal (warning/fatal XID, new uncorrectable error, link down).",
                           [({}, self.event_rescores)]))
        fams.append(Family("fleetcare_rescore_on_events", "gauge",
                           "1 when urgent signals rescore at once (serve's default), 0 with "
                           "--no-event-rescore.", [({}, int(self.rescore_on_events))]))
        return fams

    def on_landed(self, batches: list[Batch]) -> None:
        """The ingest worker's hook: wake the scorer for nodes with urgent news."""
        if not self.rescore_on_events:
            return
        nodes = self.urgent.observe(batches)
        if nodes:
            with self._urgent_lock:
                self._urgent_nodes |= nodes
            self._wake.set()

    def _take_urgent(self) -> set[str]:
        with self._urgent_lock:
            nodes, self._urgent_nodes = self._urgent_nodes, set()
        self._wake.clear()
        return nodes

    def _ingest_loop(self) -> None:
        assert self.open_consumer is not None
        while not self._stop.is_set():
            try:
                self.worker = IngestWorker(self.store, self.open_consumer(),
                                           poll_timeout_s=self.ingest_poll_s,
                                           validator=self.validator, worker_id="serve",
                                           on_landed=self.on_landed)
                if self._stop.is_set():  # stop() came while the consumer was opening
                    self.worker.stop()
                summary = self.worker.run()
            except Exception:
                log.exception("service.ingest_failed: opening the bus failed; retrying in "
                              "%.0f s", self.ingest_restart_s)
            else:
                if summary.reason != "error":
                    return
                log.error("service.ingest_restarting in %.0f s: the worker stopped on an "
                          "error; a new consumer resumes from the last committed position",
                          self.ingest_restart_s)
            self.ingest_restarts += 1
            self._stop.wait(self.ingest_restart_s)

    def _score_loop(self) -> None:
        next_at = self.clock()
        started: float | None = None
        while not self._stop.is_set():
            now = self.clock()
            early = (self._wake.is_set() and now < next_at
                     and (started is None or now - started >= self.urgent_gap_s))
            if now >= next_at or early:
                nodes = self._take_urgent()
                if early:
                    self.event_rescores += 1
                    log.info("service.rescore_on_event nodes=%s why=%s", ",".join(sorted(nodes)),
                             "; ".join(self.urgent.why.get(n, "") for n in sorted(nodes)[:5]))
                started = now
                try:
                    self.rescore()
                except Exception:
                    if self._stop.is_set():  # stop() interrupted the run's query
                        log.info("service.score_interrupted: stopping")
                        return
                    log.exception("service.score_failed")
                if not early:
                    # the next cycle a whole period after this one started, none in a burst
                    next_at = max(next_at + self.score_every_s, self.clock())
            wait = max(0.0, min(1.0, next_at - self.clock()))
            if self._wake.is_set():  # woken within the gap: sleep out the rest of it
                gap_left = (started or 0.0) + self.urgent_gap_s - self.clock()
                self._stop.wait(max(0.0, min(wait, gap_left)))
            else:
                self._wake.wait(wait)

    def start(self) -> None:
        loops = [self._score_loop] + ([self._ingest_loop] if self.open_consumer else [])
        for loop in loops:
            t = threading.Thread(target=self._background, args=(loop,),
                                 name=f"fleetcare-{loop.__name__[1:]}", daemon=True)
            t.start()
            self._threads.append(t)

    def _background(self, loop: Callable[[], None]) -> None:
        """A loop at ``background_nice`` below the API's priority (``priority``)."""
        priority.lower_this_thread(self.background_nice)
        loop()

    @property
    def threads(self) -> list[threading.Thread]:
        """The ingest and scoring threads ``start`` began."""
        return list(self._threads)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop ingest and scoring; waits at most ``timeout_s`` in all for their threads.
        A scoring run still in a DuckDB query after half of it (a base build of the next
        hour's features takes minutes on a loaded machine) has its query interrupted
        (``Store.interrupt``): nothing it writes is half done, and the next start scores
        afresh."""
        self._stop.set()
        self._wake.set()
        if self.worker is not None:
            self.worker.stop()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - timeout_s / 2 - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            log.info("service.stop interrupting the store's running queries")
            self.store.interrupt()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
