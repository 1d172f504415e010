"""Apache Kafka transport (kafka-python): ``KafkaBus`` for the agent, ``KafkaConsumerSource``
for ingest.

``KafkaBus.send`` splits a batch per topic (``split_batch``), encodes each part
(``encode_batch``, msgpack by default) and produces it keyed by node, with acks=all,
idempotence, gzip and a short linger. While the broker cannot be reached, or a send
fails, parts go to a bounded on-disk ``Spool`` instead; every later send goes behind
them, so one node's order holds. The spool is replayed in order, oldest first, when
the broker answers again (checked on ``send`` at most every ``retry_interval_s``,
and on every ``flush``). Delivery is at-least-once: a replay may repeat a part whose
acknowledgement was lost; consumers de-duplicate by ``(node, seq)``.

Counters for metrics: ``sent`` (delivered directly), ``spooled``, ``replayed``
(delivered from the spool), ``dropped`` (telemetry the spool's bound pushed out).

Errors are those of ``fleetcare.collectors.transport``: ``BusFullError`` when the
spool holds only events and incidents and is full.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from fleetcare.collectors.contract import Batch, WireFormat, encode_batch
from fleetcare.collectors.redact import mask_secrets
from fleetcare.collectors.transport import (
    EVENTS_TOPIC,
    TELEMETRY_TOPIC,
    Record,
    TransportError,
    split_batch,
)
from fleetcare.collectors.transport.spool import DEFAULT_MAX_BYTES, Spool, SpoolEntry, SpoolItem

log = logging.getLogger(__name__)

TOPICS = (TELEMETRY_TOPIC, EVENTS_TOPIC)
FETCH_DEFAULTS = {"max_partition_fetch_bytes": 4 << 20, "fetch_max_bytes": 50 << 20}
"""What ``KafkaConsumerSource`` asks a fetch for unless told otherwise (kafka-python's
defaults are 1 MiB a partition): a backlog is read in fewer round trips to the broker.
Reading 983,040 simulated samples (6 partitions, gzip) took 5.0-6.9 s with the defaults
and 3.3-3.6 s with these; 16 MiB a partition was no faster (README, issue 15 §4). The
fetch buffer stays bounded: at most ``fetch_max_bytes`` a response (the broker's own
``fetch.max.bytes`` default is 55 MiB)."""
SECURITY_KEYS = frozenset({
    "security_protocol", "ssl_context", "ssl_check_hostname", "ssl_cafile", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "ssl_crlfile", "ssl_ciphers", "sasl_mechanism",
    "sasl_plain_username", "sasl_plain_password", "sasl_kerberos_name",
    "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "sasl_oauth_token_provider",
})
"""kafka-python options passed through from ``security=`` (same names as kafka-python)."""


@dataclass(frozen=True)
class KafkaSecurityConfig:
    """A secured Kafka cluster's settings, kafka-python's names with ``kafka_`` in front:
    every config table that talks to Kafka (the agent's, the service's) inherits them."""

    kafka_security_protocol: str | None = None
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_plain_username: str | None = None
    kafka_sasl_plain_password: str | None = None

    def kafka_security(self) -> dict[str, Any]:
        """The options that are set, by kafka-python's names (``security=`` of the bus
        and the consumer)."""
        return {f.name.removeprefix("kafka_"): getattr(self, f.name)
                for f in fields(KafkaSecurityConfig) if getattr(self, f.name) is not None}


def parse_url(url: str) -> list[str]:
    """``kafka://host:port[,host:port...]`` -> bootstrap servers."""
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise ValueError(f"Kafka URL {mask_secrets(url)!r} is not of the form "
                         "kafka://HOST:PORT[,HOST:PORT]")
    if "@" in parts.netloc:
        from fleetcare.collectors.transport.factory import CREDENTIALS_IN_URL

        raise ValueError(f"Kafka URL {mask_secrets(url)!r}: {CREDENTIALS_IN_URL}")
    return [hp if ":" in hp else f"{hp}:9092" for hp in parts.netloc.split(",") if hp]


def _check_security(security: Mapping[str, Any] | None) -> dict[str, Any]:
    security = dict(security or {})
    unknown = sorted(set(security) - SECURITY_KEYS)
    if unknown:
        raise ValueError(f"unknown Kafka security option(s) {unknown}: use kafka-python's "
                         f"names, one of {sorted(SECURITY_KEYS)}")
    return security


def _reachable(servers: Sequence[str], timeout_s: float) -> bool:
    """A cheap check before (re)building a producer: does any bootstrap server accept?"""
    for hp in servers:
        host, _, port = hp.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return True
        except OSError:
            continue
    return False


class KafkaBus:
    """The ``Bus`` on Kafka, with a durable spool for when the broker is away.

    ``spool`` is a ``Spool`` or a directory for one (bounded by ``spool_max_bytes``).
    ``security`` holds kafka-python's ``security_protocol``/``ssl_*``/``sasl_*`` options;
    ``producer_config`` any other KafkaProducer option (it wins over the defaults here).
    ``topic_prefix`` is put before both topic names (one cluster, several fleets or tests).
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        spool: Spool | str | os.PathLike[str],
        spool_max_bytes: int = DEFAULT_MAX_BYTES,
        wire_format: WireFormat = "msgpack",
        compression_type: str | None = "gzip",
        linger_ms: int = 20,
        batch_size: int = 256 * 1024,
        partitions: int = 6,
        replication_factor: int = 1,
        create_topics: bool = True,
        topic_prefix: str = "",
        delivery_timeout_s: float = 30.0,
        retry_interval_s: float = 5.0,
        replay_chunk: int = 500,
        max_in_flight: int = 10_000,
        security: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(bootstrap_servers, str):
            bootstrap_servers = bootstrap_servers.split(",")
        self.bootstrap_servers = list(bootstrap_servers)
        self.spool = spool if isinstance(spool, Spool) else Spool(spool, max_bytes=spool_max_bytes)
        self.wire_format: WireFormat = wire_format
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.create_topics = create_topics
        self.topic_prefix = topic_prefix
        self.delivery_timeout_s = delivery_timeout_s
        self.retry_interval_s = retry_interval_s
        self.replay_chunk = replay_chunk
        self.max_in_flight = max_in_flight
        self._security = _check_security(security)
        request_timeout_ms = int(min(30_000, delivery_timeout_s * 1000 / 2))
        self._producer_config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": compression_type,
            "linger_ms": linger_ms,
            "batch_size": batch_size,
            "request_timeout_ms": request_timeout_ms,
            "delivery_timeout_ms": int(delivery_timeout_s * 1000),
            "max_block_ms": request_timeout_ms,
            "bootstrap_timeout_ms": request_timeout_ms,
            "reconnect_backoff_max_ms": 2000,
            "client_id": "fleetcare-agent",
            **self._security,
            **(producer_config or {}),
        }
        self._clock = clock
        self._lock = threading.RLock()
        self._producer: Any = None
        self._topics_ready = not create_topics
        self._inflight: collections.deque[tuple[SpoolItem, Any]] = collections.deque()
        self._next_retry = 0.0
        self._available = True
        self.sent = 0
        self.spooled = 0
        self.replayed = 0

    @classmethod
    def from_url(cls, url: str, **opts: Any) -> KafkaBus:
        """``KafkaBus.from_url("kafka://127.0.0.1:9092", spool="var/spool")``."""
        return cls(parse_url(url), **opts)

    @property
    def dropped(self) -> int:
        return self.spool.dropped

    @property
    def pending(self) -> int:
        """Parts not yet acknowledged by Kafka: in flight plus spooled."""
        return len(self._inflight) + len(self.spool)

    # -- the Bus protocol
    def send(self, batch: Batch) -> None:
        items = [
            SpoolItem(self.topic_prefix + topic, batch.node, encode_batch(part, self.wire_format),
                      droppable=topic != EVENTS_TOPIC)
            for topic, part in split_batch(batch)
        ]
        with self._lock:
            self._reap()
            if len(self.spool) or not self._connect():
                self._to_spool(items)
                if self._clock() >= self._next_retry:
                    self._replay(deadline=self._clock() + 1.0)
                return
            for i, item in enumerate(items):
                try:
                    future = self._producer.send(item.topic, key=item.key.encode(),
                                                 value=item.value)
                except Exception as exc:  # KafkaTimeoutError on metadata, closed, ...
                    log.warning("bus.send_failed node=%s topic=%s error=%r",
                                item.key, item.topic, exc)
                    self._fail_over(items[i:])
                    return
                self._inflight.append((item, future))
            if len(self._inflight) > self.max_in_flight:
                self._producer.flush(self.delivery_timeout_s)
                self._reap()

    def flush(self, timeout_s: float | None = None) -> None:
        """Deliver what is in flight and replay the spool, for up to ``timeout_s``.

        Whatever is not in Kafka when this returns is in the spool (durable)."""
        deadline = self._clock() + (timeout_s if timeout_s is not None else
                                    self.delivery_timeout_s * 2)
        with self._lock:
            if self._producer is not None and self._inflight:
                self._producer.flush(max(0.0, deadline - self._clock()))
            self._reap()
            if len(self.spool):
                self._replay(deadline=deadline, force=True)

    def close(self, timeout_s: float | None = 10.0) -> None:
        with self._lock:
            try:
                self.flush(timeout_s)
            finally:
                unresolved = [item for item, fut in self._inflight if not fut.succeeded()]
                self._inflight.clear()
                self._to_spool(unresolved)  # may repeat a few parts on the next run
                self._drop_producer()
                self.spool.close()

    def __enter__(self) -> KafkaBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals
    def _connect(self) -> bool:
        if self._producer is not None:
            return True
        if self._clock() < self._next_retry:
            return False
        if not _reachable(self.bootstrap_servers, timeout_s=1.0):
            self._backoff("unreachable")
            return False
        from kafka import KafkaProducer  # optional dependency: the `kafka` extra

        try:
            self._producer = KafkaProducer(**self._producer_config)
            if not self._topics_ready:
                self._ensure_topics()
        except Exception as exc:
            self._drop_producer()
            self._backoff(repr(exc))
            return False
        log.info("bus.connected servers=%s spooled_waiting=%d",
                 ",".join(self.bootstrap_servers), len(self.spool))
        self._available = True
        return True

    def _ensure_topics(self) -> None:
        from kafka.admin import KafkaAdminClient
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                 client_id="fleetcare-agent-admin",
                                 bootstrap_timeout_ms=self._producer_config["bootstrap_timeout_ms"],
                                 **self._security)
        try:
            wanted = [self.topic_prefix + t for t in TOPICS]
            missing = [t for t in wanted if t not in set(admin.list_topics())]
            if missing:
                try:
                    admin.create_topics(
                        {t: {"num_partitions": self.partitions,
                             "replication_factor": self.replication_factor} for t in missing},
                        wait_for_metadata=True)
                    log.info("bus.topics_created topics=%s partitions=%d replication=%d",
                             ",".join(missing), self.partitions, self.replication_factor)
                except TopicAlreadyExistsError:
                    pass  # another agent was faster
        finally:
            admin.close()
        self._topics_ready = True

    def _backoff(self, reason: str) -> None:
        self._next_retry = self._clock() + self.retry_interval_s
        # loud once per outage, quiet while it lasts
        level = logging.WARNING if self._available else logging.DEBUG
        self._available = False
        log.log(level, "bus.unavailable servers=%s retry_in_s=%g reason=%s",
                ",".join(self.bootstrap_servers), self.retry_interval_s, reason)

    def _drop_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)
            except Exception as exc:  # closing a broken producer must not fail the caller
                log.debug("bus.close_failed error=%r", exc)
            self._producer = None

    def _reap(self) -> None:
        """Count the delivered head of the in-flight queue; on a failure, fail over."""
        while self._inflight and self._inflight[0][1].is_done:
            item, fut = self._inflight[0]
            if fut.failed():
                log.warning("bus.send_failed node=%s topic=%s error=%r",
                            item.key, item.topic, fut.exception)
                self._fail_over([])
                return
            self._inflight.popleft()
            self.sent += 1

    def _fail_over(self, rest: Sequence[SpoolItem]) -> None:
        """Settle everything in flight, then spool what failed, in order, plus ``rest``."""
        if self._producer is not None and self._inflight:
            self._producer.flush(self.delivery_timeout_s)
        failed = []
        for item, fut in self._inflight:
            if fut.succeeded():
                self.sent += 1
            else:
                failed.append(item)
        self._inflight.clear()
        self._drop_producer()
        self._backoff("send failed")
        self._to_spool([*failed, *rest])

    def _to_spool(self, items: Iterable[SpoolItem]) -> None:
        items = list(items)
        if not items:
            return
        self.spool.append(items)  # BusFullError propagates: the caller decides
        self.spooled += len(items)
        for item in items:
            log.debug("sample.spooled node=%s topic=%s bytes=%d",
                      item.key, item.topic, len(item.value))

    def _replay(self, deadline: float, force: bool = False) -> None:
        """Send the spool oldest-first, in chunks, acknowledging the delivered prefix."""
        if force:
            self._next_retry = 0.0
        while len(self.spool) and self._clock() < deadline:
            if not self._connect():
                return
            entries = self.spool.peek(self.replay_chunk)
            futures: list[tuple[SpoolEntry, Any]] = []
            try:
                for e in entries:
                    futures.append((e, self._producer.send(
                        e.item.topic, key=e.item.key.encode(), value=e.item.value)))
            except Exception as exc:
                log.warning("spool.replay_failed error=%r", exc)
            self._producer.flush(max(1.0, min(self.delivery_timeout_s, deadline - self._clock())))
            done: list[SpoolEntry] = []
            for e, fut in futures:
                if not fut.succeeded():
                    break
                done.append(e)
            self.spool.ack(done)
            self.replayed += len(done)
            if done:
                log.info("spool.replayed batches=%d left=%d", len(done), len(self.spool))
            if len(done) < len(entries):
                self._drop_producer()
                self._backoff("replay failed")
                return


def _record(r: Any) -> Record:
    """A kafka-python ConsumerRecord as a ``Record``; never raises: a key that is not UTF-8
    comes as ``error_code="invalid_key"`` (ingest quarantines it), a null value as b""."""
    key = r.key or b""
    value = r.value if r.value is not None else b""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return Record(topic=r.topic, key=key.decode("utf-8", "replace"), value=value,
                      partition=r.partition, offset=r.offset, error_code="invalid_key",
                      error=f"the message key {key[:64]!r} is not UTF-8 text; keys are node "
                            "names")
    return Record(topic=r.topic, key=text, value=value, partition=r.partition,
                  offset=r.offset)


class KafkaConsumerSource:
    """The ``BusConsumer`` on Kafka: one member of consumer group ``group_id``.

    Offsets are committed only by ``commit()``, and then exactly up to what ``poll``
    returned (call it once the rows are durable), for the partitions this member still
    owns (``assignment()``): after a rebalance the new owner re-reads from the last
    commit, and ingest's natural keys absorb the overlap.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        group_id: str = "fleetcare-ingest",
        topics: Sequence[str] = TOPICS,
        topic_prefix: str = "",
        auto_offset_reset: str = "earliest",
        security: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
    ) -> None:
        from kafka import KafkaConsumer

        if isinstance(bootstrap_servers, str):
            bootstrap_servers = bootstrap_servers.split(",")
        self._consumer = KafkaConsumer(
            *(topic_prefix + t for t in topics),
            bootstrap_servers=list(bootstrap_servers),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=auto_offset_reset,
            client_id="fleetcare-ingest",
            **_check_security(security),
            **{**FETCH_DEFAULTS, **(consumer_config or {})},
        )
        self._positions: dict[Any, int] = {}

    @classmethod
    def from_url(cls, url: str, **opts: Any) -> KafkaConsumerSource:
        return cls(parse_url(url), **opts)

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[Record] = []
        for tp, records in polled.items():
            out.extend(_record(r) for r in records)
            if records:
                self._positions[tp] = records[-1].offset + 1
        return out

    def assignment(self) -> set[Any]:
        """The partitions this group member owns now (a rebalance changes them)."""
        return set(self._consumer.assignment())

    def commit(self) -> None:
        owned = self.assignment()
        for tp in [tp for tp in self._positions if tp not in owned]:
            del self._positions[tp]  # no longer ours: committing it would fail the commit
        if not self._positions:
            return
        from kafka.structs import OffsetAndMetadata

        try:
            self._consumer.commit({tp: OffsetAndMetadata(off, "", -1)
                                   for tp, off in self._positions.items()})
        except Exception as exc:
            raise TransportError(
                f"committing Kafka offsets failed ({exc!r}): the records will be read again "
                "after the group rebalances; ingest is idempotent, so nothing is duplicated"
            ) from exc
        self._positions.clear()

    def close(self) -> None:
        self._consumer.close(autocommit=False)
