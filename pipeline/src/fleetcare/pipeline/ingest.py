"""Ingest: read batches from a bus consumer, land them in DuckDB, then commit.

Order of work per poll: decode and validate every record (``validate.Validator``: garbage
and absurd values → ``quarantine`` with a reason code, the reason and the raw bytes;
one bad record costs only itself, never its batch; never a crash and never a silent
drop), insert the good rows in bulk (idempotent by natural key), quarantine the
rejections in one statement, and only then commit the consumer's position. A crash
between insert and commit redelivers records that the natural keys then ignore.

No record can stop a poll. What nobody foresaw is isolated to the record that caused it:

- a validator that raises: the poll's records are validated again one by one, and the
  record whose validation raises is quarantined as ``unexpected_error``;
- a batch the sink refuses with a *data* error (``DATA_ERRORS``: a value Arrow or DuckDB
  cannot hold): the kept batches are inserted again one by one, and the batch that fails
  is quarantined whole as ``unstorable`` (with its message's bytes).

An *operational* failure (the database or the disk, any other exception) is not a
record's fault: it propagates, nothing is committed, and the records come again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from fleetcare.collectors.contract import Batch
from fleetcare.collectors.transport import BusConsumer, Record
from fleetcare.pipeline.gc_pause import gc_paused
from fleetcare.pipeline.poll_memory import retain_freed
from fleetcare.pipeline.record_checks import clip
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import (
    Kept,
    RecordValidator,
    Rejection,
    ValidationResult,
    Validator,
    unexpected,
)

log = logging.getLogger(__name__)

DATA_ERRORS: tuple[type[BaseException], ...] = (
    OverflowError, TypeError, ValueError, pa.ArrowException, duckdb.DataError)
"""What converting or inserting rows raises for a value it cannot hold (a record's fault);
``pa.ArrowInvalid`` is a ValueError. Anything else is operational."""


@dataclass(frozen=True, slots=True)
class IngestResult:
    records: int
    samples: int
    events: int
    incidents: int
    quarantined: int
    nics: int = 0


class Ingestor:
    """``counters``: records, samples, events, incidents, quarantined (running totals);
    ``quarantined_by_code``: quarantined records by reason code (for metrics)."""

    def __init__(self, store: Store, consumer: BusConsumer, *, max_records: int = 10_000,
                 validator: RecordValidator | None = None,
                 on_landed: Callable[[list[Batch]], None] | None = None) -> None:
        self.store = store
        self.on_landed = on_landed
        """Called with the batches just landed (before the offsets are committed), as
        they were decoded: a ``Batch`` or, from msgpack, a ``wire_columns.RawBatch``
        (its samples still their msgpack bytes: ``wire_columns.as_sample`` decodes one,
        ``full_batch`` the whole). An error in it is logged, never lost data (the rows
        are already in)."""
        self.consumer = consumer
        self.max_records = max_records
        self.validator = validator if validator is not None else Validator()
        self.counters: Counter[str] = Counter()
        self.quarantined_by_code: Counter[str] = Counter()
        retain_freed()  # (a poll's column memory reused by the next: ``poll_memory``)

    def run_once(self, timeout_s: float = 1.0) -> IngestResult:
        records = self.consumer.poll(timeout_s, self.max_records)
        if not records:
            return IngestResult(0, 0, 0, 0, 0)
        with gc_paused():  # a poll's decoded records need no cycle collector
            checked = self._validate(records)
            nics_before = getattr(self.store, "nic_rows_added", 0)
            samples, events, incidents = self._land(checked)
            nics = getattr(self.store, "nic_rows_added", 0) - nics_before
        if self.on_landed is not None and checked.kept:
            try:
                self.on_landed(checked.landing)
            except Exception:
                log.exception("ingest.on_landed_failed: the rows are landed; only the "
                              "hook's reaction to them is lost")
        self._quarantine(checked.rejections)
        self.consumer.commit()
        bad = len(checked.rejections)
        result = IngestResult(len(records), samples, events, incidents, bad, nics)
        self.counters.update(records=result.records, samples=samples, events=events,
                             incidents=incidents, quarantined=bad, nics=nics)
        self.quarantined_by_code.update(checked.codes)
        log.debug("ingest.batch records=%d samples=%d quarantined=%d", len(records), samples, bad)
        return result

    def drain(self, timeout_s: float = 0.0) -> IngestResult:
        """Ingest until the consumer has nothing more; returns the totals."""
        totals = [0, 0, 0, 0, 0, 0]
        while True:
            r = self.run_once(timeout_s)
            if r.records == 0:
                return IngestResult(*totals)
            for i, v in enumerate((r.records, r.samples, r.events, r.incidents, r.quarantined,
                                   r.nics)):
                totals[i] += v

    # -- steps -------------------------------------------------------------------------------
    def _validate(self, records: Sequence[Record]) -> ValidationResult:
        try:
            return self.validator.validate(records)
        except Exception:
            log.exception("ingest.validator_failed records=%d: validating them one by one",
                          len(records))
        result = ValidationResult()
        for rec in records:
            try:
                result.extend(self.validator.validate([rec]))
            except Exception as exc:
                result.rejections.append(unexpected(rec, exc))
        return result

    def _land(self, checked: ValidationResult) -> tuple[int, int, int]:
        """Insert the kept batches; one the sink refuses with a data error is moved to
        ``checked.rejections`` as ``unstorable``."""
        if not checked.kept:
            return 0, 0, 0
        try:
            return self.store.insert_batches(checked.landing,
                                             sample_table=checked.sample_table)
        except DATA_ERRORS as exc:
            log.warning("ingest.insert_refused batches=%d error=%s: inserting them one by one",
                        len(checked.kept), clip(str(exc)))
        totals = [0, 0, 0]
        landed: list[Kept] = []
        for kept in checked.kept:
            try:
                counts = self.store.insert_batches([kept.decoded])
            except DATA_ERRORS as exc:
                checked.rejections.append(Rejection(
                    "unstorable", f"the store refused this batch's rows "
                    f"({type(exc).__name__}: {clip(str(exc))}): a value the checks let "
                    "through; report it to the fleetcare developers with these bytes",
                    kept.source, kept.raw))
                continue
            landed.append(kept)
            totals = [t + c for t, c in zip(totals, counts, strict=True)]
        checked.kept = landed
        checked.sample_table = None
        return totals[0], totals[1], totals[2]

    def _quarantine(self, rejections: Sequence[Rejection]) -> None:
        if rejections:
            self.store.quarantine_many(rejections)
