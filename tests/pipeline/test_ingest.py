from __future__ import annotations

import datetime as dt
from pathlib import Path

from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, encode_batch
from fleetcare.collectors.transport import TELEMETRY_TOPIC, Record
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import Validator
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
AT_T0 = Validator(clock=lambda: T0.timestamp() + 3600)  # the records are an hour old


class ListConsumer:
    """A consumer over a fixed list; commit moves the committed position."""

    def __init__(self, values: list[tuple[str, bytes]]) -> None:
        self.values = values
        self.read = 0
        self.committed = 0

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        out = [Record(TELEMETRY_TOPIC, k, v, 0, i)
               for i, (k, v) in enumerate(self.values[self.read:self.read + max_records], self.read)]
        self.read += len(out)
        return out

    def commit(self) -> None:
        self.committed = self.read

    def close(self) -> None:
        pass


def good(node: str, seq: int) -> bytes:
    s = sample(node=node, gpu_uuid=f"GPU-{node}", ts=T0 + dt.timedelta(minutes=seq))
    return encode_batch(Batch(schema_version=SCHEMA_VERSION, node=node, seq=seq, sent_at=T0, samples=[s]))


def test_bad_records_are_quarantined_with_reason_and_bytes(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    values = [("a", good("a", 1)), ("a", b"\xff\xfe junk"), ("b", good("a", 2)), ("a", good("a", 3))]
    consumer = ListConsumer(values)
    r = Ingestor(store, consumer, max_records=2, validator=AT_T0).drain()
    assert (r.records, r.samples, r.quarantined) == (4, 2, 2)
    assert consumer.committed == 4
    rows = store.cursor().execute("SELECT source, reason, raw FROM quarantine ORDER BY source").fetchall()
    assert rows[0][0] == f"{TELEMETRY_TOPIC}/0@1"
    assert rows[0][1].startswith("not a fleetcare batch (msgpack)")
    assert rows[0][2] == b"\xff\xfe junk"
    assert "does not match the message key 'b'" in rows[1][1]


def test_redelivered_records_land_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    values = [("a", good("a", i)) for i in range(5)]
    Ingestor(store, ListConsumer(values), validator=AT_T0).drain()
    Ingestor(store, ListConsumer(values + [("a", good("a", 9))]), validator=AT_T0).drain()
    assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone() == (6,)


def test_redelivered_bad_records_are_quarantined_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    values = [("a", good("a", 1)), ("a", b"\xff junk"), ("a", b"\xff junk")]
    Ingestor(store, ListConsumer(values), validator=AT_T0).drain()
    # a crash before the commit: the same offsets come again, then one new bad record
    Ingestor(store, ListConsumer(values + [("a", b"\xfe other")]), validator=AT_T0).drain()
    rows = store.cursor().execute(
        "SELECT source, raw FROM quarantine ORDER BY source").fetchall()
    # the same bytes at another offset are another record: kept; a redelivery is not
    assert rows == [(f"{TELEMETRY_TOPIC}/0@1", b"\xff junk"), (f"{TELEMETRY_TOPIC}/0@2", b"\xff junk"),
                    (f"{TELEMETRY_TOPIC}/0@3", b"\xfe other")]
    assert store.quarantine(f"{TELEMETRY_TOPIC}/0@3", "again", b"\xfe other") is False
    assert store.quarantine(f"{TELEMETRY_TOPIC}/0@3", "new bytes", b"\x00") is True
