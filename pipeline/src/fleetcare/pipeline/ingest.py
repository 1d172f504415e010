"""Ingest: read batches from a bus consumer, land them in DuckDB, then commit.

Order of work per poll: decode every record (garbage → ``quarantine`` with the reason
and the raw bytes, never a crash and never a silent drop), insert the good rows in bulk
(idempotent by natural key), and only then commit the consumer's position. A crash
between insert and commit redelivers records that the natural keys then ignore.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from fleetcare.collectors.contract import Batch, DecodeError, decode_batch
from fleetcare.collectors.transport import BusConsumer
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestResult:
    records: int
    samples: int
    events: int
    incidents: int
    quarantined: int


class Ingestor:
    def __init__(self, store: Store, consumer: BusConsumer, *, max_records: int = 10_000) -> None:
        self.store = store
        self.consumer = consumer
        self.max_records = max_records
        self.counters: Counter[str] = Counter()

    def run_once(self, timeout_s: float = 1.0) -> IngestResult:
        records = self.consumer.poll(timeout_s, self.max_records)
        if not records:
            return IngestResult(0, 0, 0, 0, 0)
        good: list[Batch] = []
        bad = 0
        for rec in records:
            try:
                batch = decode_batch(rec.value)
            except DecodeError as exc:
                self.store.quarantine(f"{rec.topic}/{rec.partition}@{rec.offset}",
                                      exc.reason, rec.value)
                bad += 1
                continue
            if batch.node != rec.key:
                self.store.quarantine(
                    f"{rec.topic}/{rec.partition}@{rec.offset}",
                    f"batch node {batch.node!r} does not match the message key {rec.key!r}",
                    rec.value)
                bad += 1
                continue
            good.append(batch)
        samples, events, incidents = self.store.insert_batches(good)
        self.consumer.commit()
        result = IngestResult(len(records), samples, events, incidents, bad)
        self.counters.update(records=result.records, samples=samples, events=events,
                             incidents=incidents, quarantined=bad)
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
