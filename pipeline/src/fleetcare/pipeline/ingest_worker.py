"""The ingest daemon loop: poll a bus, land rows, commit, until idle, told, or signalled.

``IngestWorker(sink, consumer)`` drives the existing ``Ingestor`` (decode → quarantine →
insert → commit) over either sink:

- a ``Store`` (DuckDB, one host): each poll is inserted (idempotent by natural key) and
  committed at once, exactly as ``Ingestor.run_once`` does.
- a ``LakeWriter`` (Parquet, scale-out): rows are buffered across polls and written
  (atomic, fsync'd files) every ``flush_interval_s`` / ``flush_rows`` / idle poll; the
  offsets are committed only after that write. Each worker of one consumer group writes
  its own files; readers deduplicate by natural key (``fleetcare.pipeline.lake``).

Either way a crash never loses a row (nothing is committed before it is durable) and
never shows one twice (natural keys). A failed write stops the worker (exit 1, nothing
more committed: the supervisor restarts it and the records come again); a failed
commit is logged and counted, since the rows are durable and a redelivery is harmless.

Stopping: ``stop()`` (SIGTERM/SIGINT through ``handle_signals``) ends the loop after the
current poll, flushes, commits and returns; ``idle_exit_s`` ends it once no record arrived
for that long (counted from the first partition assignment, so joining a consumer group
is not idleness); ``max_records`` after that many records.

    worker = IngestWorker(store, open_consumer("kafka://127.0.0.1:9092"), idle_exit_s=30)
    with handle_signals(worker):
        summary = worker.run()
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from fleetcare.collectors.agent_metrics import Family, exposition
from fleetcare.collectors.contract import Batch
from fleetcare.collectors.signals import on_signals
from fleetcare.collectors.transport import BusConsumer, Record, TransportError
from fleetcare.collectors.transport.factory import bus_scheme
from fleetcare.collectors.transport.kafka import KafkaConsumerSource, parse_url
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.validate import RecordValidator

log = logging.getLogger(__name__)

DEFAULT_GROUP = "fleetcare-ingest"


class BufferedSink(Protocol):
    """A sink whose accepted rows become durable only on ``flush`` (the lake)."""

    @property
    def pending_rows(self) -> int: ...

    def flush(self) -> int: ...


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """What one run did. ``reason``: idle | max-records | signal | error."""

    records: int
    samples: int
    events: int
    incidents: int
    quarantined: int
    reason: str
    seconds: float
    commits: int
    commit_failures: int
    nics: int = 0  # NIC port samples landed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def open_consumer(bus_url: str, *, group: str = DEFAULT_GROUP, topic_prefix: str = "",
                  instance_id: str | None = None, security: dict[str, Any] | None = None,
                  **consumer_config: Any) -> BusConsumer:
    """The consumer for ``embedded://PATH`` or ``kafka://HOST:PORT`` (one group member);
    ``security``: kafka-python's ``security_protocol`` / ``ssl_*`` / ``sasl_*`` options."""
    if bus_scheme(bus_url) == "embedded":
        from fleetcare.collectors.transport.embedded import EmbeddedConsumer

        return EmbeddedConsumer.from_url(bus_url)
    if instance_id:
        consumer_config["group_instance_id"] = instance_id
    return KafkaConsumerSource(parse_url(bus_url), group_id=group, topic_prefix=topic_prefix,
                               security=security, consumer_config=consumer_config)


class _CommitGate:
    """Wraps the consumer the ``Ingestor`` sees: counts what was polled, and holds the
    Ingestor's commit until the sink is durable (``deferred``) or passes it on."""

    def __init__(self, inner: BusConsumer, *, deferred: bool) -> None:
        self.inner = inner
        self.deferred = deferred
        self.uncommitted = False
        self.commits = 0
        self.commit_failures = 0

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        records = self.inner.poll(timeout_s, max_records)
        if records:
            self.uncommitted = True
        return records

    def commit(self) -> None:
        if not self.deferred:
            self.commit_now()

    def commit_now(self) -> None:
        if not self.uncommitted:
            return
        try:
            self.inner.commit()
        except TransportError as exc:
            self.commit_failures += 1
            log.warning("ingest.commit_failed error=%s", exc)
        else:
            self.commits += 1
        self.uncommitted = False

    def close(self) -> None:
        self.inner.close()


class IngestWorker:
    """One ingest process's loop (see the module docstring)."""

    def __init__(
        self,
        sink: Any,
        consumer: BusConsumer,
        *,
        max_batch: int = 10_000,
        poll_timeout_s: float = 1.0,
        idle_exit_s: float | None = None,
        max_records: int | None = None,
        flush_interval_s: float = 5.0,
        flush_rows: int = 500_000,
        join_grace_s: float = 30.0,
        progress_every_s: float = 10.0,
        worker_id: str = "",
        validator: RecordValidator | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_landed: Callable[[list[Batch]], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch} must be at least 1")
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records {max_records} must be at least 1")
        self.sink = sink
        self.buffered = hasattr(sink, "pending_rows") and hasattr(sink, "flush")
        self.gate = _CommitGate(consumer, deferred=self.buffered)
        self.ingestor = Ingestor(sink, self.gate, max_records=max_batch,  # type: ignore[arg-type]
                                 validator=validator, on_landed=on_landed)
        self.max_batch = max_batch
        self.poll_timeout_s = poll_timeout_s
        self.idle_exit_s = idle_exit_s
        self.max_records = max_records
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self.join_grace_s = join_grace_s
        self.progress_every_s = progress_every_s
        self.worker_id = worker_id
        self._clock = clock
        self._stop_reason: str | None = None
        self.totals = dict.fromkeys(("records", "samples", "events", "incidents",
                                     "quarantined", "nics"), 0)
        self.started_at = clock()
        self.last_record_at: float | None = None
        self.ready_at: float | None = None

    def stop(self, reason: str = "signal") -> None:
        """Finish the current poll, make it durable, commit, return from ``run``."""
        self._stop_reason = self._stop_reason or reason

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> WorkerSummary:
        self.started_at = self._clock()
        last_flush = last_progress = self.started_at
        try:
            while self._stop_reason is None:
                timeout = self._next_timeout()
                if self._stop_reason is not None:
                    break
                remaining = (self.max_records - self.totals["records"]
                             if self.max_records is not None else self.max_batch)
                self.ingestor.max_records = min(self.max_batch, remaining)
                try:
                    r = self.ingestor.run_once(timeout)
                except Exception:
                    log.exception("ingest.failed worker=%s: stopping without committing the "
                                  "records not yet durable; they will be read again",
                                  self.worker_id)
                    self._stop_reason = "error"
                    break
                now = self._clock()
                self._mark_ready(now)
                if r.records:
                    self.last_record_at = now
                    for k, v in zip(self.totals, (r.records, r.samples, r.events, r.incidents,
                                                  r.quarantined, r.nics), strict=True):
                        self.totals[k] += v
                if self.max_records is not None and self.totals["records"] >= self.max_records:
                    self.stop("max-records")
                if self.buffered and (r.records == 0 or self._stop_reason is not None
                                      or now - last_flush >= self.flush_interval_s
                                      or self.sink.pending_rows >= self.flush_rows):
                    self._flush_and_commit()
                    last_flush = now
                if now - last_progress >= self.progress_every_s:
                    self._log_progress(now)
                    last_progress = now
            if self._stop_reason != "error":
                self._flush_and_commit()
        finally:
            self.gate.close()
        summary = WorkerSummary(**self.totals, reason=self._stop_reason or "signal",
                                seconds=round(self._clock() - self.started_at, 3),
                                commits=self.gate.commits,
                                commit_failures=self.gate.commit_failures)
        log.info("ingest.stopped worker=%s reason=%s records=%d samples=%d quarantined=%d",
                 self.worker_id, summary.reason, summary.records, summary.samples,
                 summary.quarantined)
        return summary

    def _flush_and_commit(self) -> None:
        if self.buffered:
            self.sink.flush()  # an error here propagates: nothing is committed
        self.gate.commit_now()

    def _mark_ready(self, now: float) -> None:
        if self.ready_at is not None:
            return
        assignment = getattr(self.gate.inner, "assignment", None)
        if assignment is None or assignment():
            self.ready_at = now

    def _idle_since(self) -> float:
        """When the idle clock started: the last record, else the first assignment, else
        the start plus ``join_grace_s`` (a member that never gets a partition)."""
        if self.last_record_at is not None:
            return self.last_record_at
        if self.ready_at is not None:
            return self.ready_at
        return self.started_at + self.join_grace_s

    def _next_timeout(self) -> float:
        if self.idle_exit_s is None:
            return self.poll_timeout_s
        left = self._idle_since() + self.idle_exit_s - self._clock()
        if left <= 0:
            self.stop("idle")
        return min(self.poll_timeout_s, max(0.05, left))

    def _log_progress(self, now: float) -> None:
        elapsed = max(1e-9, now - self.started_at)
        log.info("ingest.progress worker=%s records=%d samples=%d events=%d quarantined=%d "
                 "samples_per_s=%.0f commit_failures=%d", self.worker_id,
                 self.totals["records"], self.totals["samples"], self.totals["events"],
                 self.totals["quarantined"], self.totals["samples"] / elapsed,
                 self.gate.commit_failures)

    # -- metrics ----------------------------------------------------------------------------
    def families(self) -> list[Family]:
        labels = {"worker": self.worker_id} if self.worker_id else {}
        fams = [Family(f"fleetcare_ingest_{k}_total", "counter", help_, [(labels, self.totals[k])])
                for k, help_ in (
                    ("records", "Bus records (one node's batch part each) read and handled."),
                    ("samples", "GPU samples landed (DuckDB: new rows; lake: rows written)."),
                    ("events", "XID events landed."),
                    ("incidents", "Incidents landed."),
                    ("quarantined", "Records kept in quarantine instead of landed."),
                    ("nics", "InfiniBand/RoCE port samples landed (DuckDB: new rows; lake: "
                             "rows written)."))]
        by_code = getattr(self.ingestor, "quarantined_by_code", None) or {}
        if by_code:
            fams.append(Family("fleetcare_ingest_quarantined_by_code_total", "counter",
                               "Quarantined records by reason code.",
                               [({**labels, "code": c}, n) for c, n in sorted(by_code.items())]))
        fams.append(Family("fleetcare_ingest_commits_total", "counter",
                           "Offset commits done after the rows were durable.",
                           [(labels, self.gate.commits)]))
        fams.append(Family("fleetcare_ingest_commit_failures_total", "counter",
                           "Offset commits that failed (records will be read again).",
                           [(labels, self.gate.commit_failures)]))
        if self.last_record_at is not None:
            fams.append(Family("fleetcare_ingest_last_record_age_seconds", "gauge",
                               "Seconds since the last record arrived.",
                               [(labels, round(self._clock() - self.last_record_at, 3))]))
        return fams

    def render(self) -> str:
        """Prometheus text exposition of the counters (``serve_metrics`` calls this)."""
        return exposition(self.families())


@contextmanager
def handle_signals(worker: IngestWorker,
                   signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """While inside, SIGTERM/SIGINT ask ``worker`` to stop cleanly (exit 0 after commit)."""

    def handler(signum: int, frame: object) -> None:
        log.info("ingest.signal signal=%s: finishing the current batch", signal.Signals(signum).name)
        worker.stop("signal")

    with on_signals(handler, signals):
        yield
