"""Ingest: read batches from a bus consumer, land them in DuckDB, then commit.

Order of work per poll: decode and validate every record (``validate.Validator``: garbage
and absurd values → ``quarantine`` with a reason code, the reason and the raw bytes;
one bad record costs only itself, never its batch; never a crash and never a silent
drop), insert the good rows in bulk
(idempotent by natural key), and only then commit the consumer's position. A crash
between insert and commit redelivers records that the natural keys then ignore.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from fleetcare.collectors.transport import BusConsumer
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import RecordValidator, Validator

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestResult:
    records: int
    samples: int
    events: int
    incidents: int
    quarantined: int


class Ingestor:
    """``counters``: records, samples, events, incidents, quarantined (running totals);
    ``quarantined_by_code``: quarantined records by reason code (for metrics)."""

    def __init__(self, store: Store, consumer: BusConsumer, *, max_records: int = 10_000,
                 validator: RecordValidator | None = None) -> None:
        self.store = store
        self.consumer = consumer
        self.max_records = max_records
        self.validator = validator if validator is not None else Validator()
        self.counters: Counter[str] = Counter()
        self.quarantined_by_code: Counter[str] = Counter()

    def run_once(self, timeout_s: float = 1.0) -> IngestResult:
        records = self.consumer.poll(timeout_s, self.max_records)
        if not records:
            return IngestResult(0, 0, 0, 0, 0)
        checked = self.validator.validate(records)
        for rej in checked.rejections:
            self.store.quarantine(rej.source, rej.reason, rej.raw, code=rej.code)
        bad = len(checked.rejections)
        samples, events, incidents = self.store.insert_batches(checked.batches)
        self.consumer.commit()
        result = IngestResult(len(records), samples, events, incidents, bad)
        self.counters.update(records=result.records, samples=samples, events=events,
                             incidents=incidents, quarantined=bad)
        self.quarantined_by_code.update(checked.codes)
        log.debug("ingest.batch records=%d samples=%d quarantined=%d", len(records), samples, bad)
        return result

    def drain(self, timeout_s: float = 0.0) -> IngestResult:
        """Ingest until the consumer has nothing more; returns the totals."""
        totals = [0, 0, 0, 0, 0]
        while True:
            r = self.run_once(timeout_s)
            if r.records == 0:
                return IngestResult(*totals)
            for i, v in enumerate((r.records, r.samples, r.events, r.incidents, r.quarantined)):
                totals[i] += v
