"""Transports: the ``Bus`` seam the agent sends batches on, and the consumer side.

- ``embedded://PATH`` (default, one host): an on-disk, bounded append log.
- ``kafka://HOST:PORT``: Apache Kafka through kafka-python (optional extra ``kafka``).

Topics: samples travel on ``fleetcare.telemetry``, XID events and incidents on
``fleetcare.events``; the key is the node name so one node's records stay ordered.

Exceptions::

    TransportError
     ├── BusFullError        (.limit_bytes)   a bound was hit; the caller decides
     └── BusUnavailable                       the broker cannot be reached
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleetcare.collectors.contract import Batch

TELEMETRY_TOPIC = "fleetcare.telemetry"
EVENTS_TOPIC = "fleetcare.events"


class TransportError(Exception):
    """Base of transport errors."""


class BusFullError(TransportError):
    def __init__(self, what: str, limit_bytes: int) -> None:
        super().__init__(
            f"{what} is full ({limit_bytes} bytes): consume it, or raise its bound"
        )
        self.limit_bytes = limit_bytes


class BusUnavailable(TransportError):
    """The bus cannot be reached right now (the agent spools meanwhile)."""


READ_ERRORS: dict[str, str] = {
    "corrupt_frame": "embedded bus: bytes that are no whole record (checksum or header "
                     "wrong); the reader skipped to the next whole record",
    "torn_record": "embedded bus: a record whose writer died mid-append (never completed)",
    "unknown_topic": "embedded bus: an intact record with a topic byte this reader does not "
                     "know (written by a newer fleetcare)",
    "invalid_key": "the message key is not UTF-8 text (a node name)",
}
"""What a consumer could not read, as ``Record.error_code``: the record is handed over
(never raised, never skipped silently) and ingest quarantines it with this code."""


@dataclass(frozen=True, slots=True)
class Record:
    """One message read from a bus: the encoded batch plus where it came from.

    ``error_code`` (one of ``READ_ERRORS``) and ``error`` are set when the consumer could
    not read the message as a record; ``value`` then holds the bytes it found there."""

    topic: str
    key: str
    value: bytes
    partition: int
    offset: int
    error_code: str | None = None
    error: str = ""


class Bus(Protocol):
    """Where the agent sends batches. ``send`` must not lose a batch it accepted."""

    def send(self, batch: Batch) -> None: ...

    def flush(self, timeout_s: float | None = None) -> None: ...

    def close(self) -> None: ...


class BusConsumer(Protocol):
    """Reads records; ``commit`` acknowledges everything returned so far (call it only
    after the rows are durable)."""

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]: ...

    def commit(self) -> None: ...

    def close(self) -> None: ...


def split_batch(batch: Batch) -> list[tuple[str, Batch]]:
    """The per-topic parts of a batch: samples and NIC samples to telemetry,
    events+incidents to events (each part at the lowest version that holds it)."""
    parts: list[tuple[str, Batch]] = []
    if batch.samples or batch.nics:
        parts.append((TELEMETRY_TOPIC, Batch(
            schema_version=batch.schema_version if batch.nics else 1, node=batch.node,
            seq=batch.seq, sent_at=batch.sent_at, samples=batch.samples, nics=batch.nics)))
    if batch.events or batch.incidents:
        parts.append((EVENTS_TOPIC, Batch(
            schema_version=min(batch.schema_version, 1), node=batch.node, seq=batch.seq,
            sent_at=batch.sent_at, events=batch.events, incidents=batch.incidents)))
    return parts

from fleetcare.collectors.transport.factory import open_bus as open_bus  # noqa: E402  (needs the names above)
