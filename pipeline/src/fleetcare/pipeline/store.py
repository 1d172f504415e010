"""The DuckDB store: one database file, one writing process, threads share it.

Rows go in as Arrow tables in bulk; every insert is idempotent by the record's natural
key (``schema.SAMPLE_KEY`` ...), so a redelivered batch lands once. Telemetry arrives
roughly in time order, so the duplicate check only looks at the incoming time range,
which DuckDB's zone maps prune cheaply.

Exceptions::

    StoreError            (.path)  the database cannot be opened (locked, not DuckDB)
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.contract import Batch, GpuSample, Incident, XidEvent
from fleetcare.pipeline import schema
from fleetcare.pipeline.telemetry import RawTelemetry, TableTelemetry

log = logging.getLogger(__name__)

DIRTY_SINCE_KEY = "telemetry.dirty_since"
"""meta key: the oldest sample ts inserted since the last rollup (``rollup.refresh``)."""


class StoreError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def one_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The row of an executed statement that always returns exactly one: an aggregate
    without GROUP BY (``count(*)``, ``min``/``max``, even over an empty table) or an
    INSERT (DuckDB returns its row count)."""
    row = result.fetchone()
    assert row is not None, "a statement that always returns one row returned none"
    return row


def _naive_utc(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def records_to_arrow(records: Iterable[msgspec.Struct], arrow: pa.Schema) -> pa.Table:
    """Contract structs → an Arrow table with the contract's schema (live data).

    Rows are transposed to columns in C (``astuple``, ``zip``); Arrow converts aware
    datetimes to naive UTC for the contract's naive timestamp columns.
    """
    rows = [msgspec.structs.astuple(rec) for rec in records]
    if not rows:
        return arrow.empty_table()
    columns = list(zip(*rows, strict=True))
    if len(columns) != len(arrow):
        raise ValueError(f"records have {len(columns)} fields, the schema {len(arrow)}")
    return pa.Table.from_arrays([pa.array(col, type=field.type)
                                 for col, field in zip(columns, arrow, strict=True)],
                                schema=arrow)


def flatten_batches(
        batches: Iterable[Batch]) -> tuple[list[GpuSample], list[XidEvent], list[Incident]]:
    """The samples, events and incidents of many batches, each kind in arrival order."""
    samples: list[GpuSample] = []
    events: list[XidEvent] = []
    incidents: list[Incident] = []
    for b in batches:
        samples.extend(b.samples)
        events.extend(b.events)
        incidents.extend(b.incidents)
    return samples, events, incidents


def columns_to_arrow(columns: Mapping[str, np.ndarray], arrow: pa.Schema) -> pa.Table:
    """Columnar numpy data (the simulator's history chunks) → Arrow, fast path.

    Missing fields become null columns; 2-D arrays become list columns (one list per row).
    """
    n = len(next(iter(columns.values())))
    arrays = []
    for field in arrow:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(n, type=field.type))
        elif pa.types.is_list(field.type):
            values = np.asarray(values)
            width = values.shape[1]
            flat = pa.array(values.reshape(-1), type=field.type.value_type)
            offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32))
            arrays.append(pa.ListArray.from_arrays(offsets, flat))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=arrow)


class Store:
    """One DuckDB database. ``cursor()`` gives a thread its own connection handle.

    ``raw`` says where raw samples are read from (``fleetcare.pipeline.telemetry``): the
    database's own ``telemetry`` table (default) or a Parquet lake
    (``fleetcare.pipeline.lake_feed.open_state``)."""

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 raw: RawTelemetry | None = None) -> None:
        self.path = str(path)
        self.raw: RawTelemetry = raw if raw is not None else TableTelemetry()
        try:
            self.con = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as exc:
            raise StoreError(
                self.path,
                f"cannot open the database ({exc}). DuckDB allows one writing process per "
                "file: stop the other fleetcare process, or go through its API; to ingest "
                "while serving, let the service ingest (`fleetcare serve --bus`) or scale "
                "out with `fleetcare ingest --lake` workers and `fleetcare serve --lake`.",
            ) from exc
        self._lock = threading.RLock()
        if not read_only:
            self.con.execute(schema.DDL)

    # -- plumbing ---------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()

    def close(self) -> None:
        self.con.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN … COMMIT; any exception rolls back and propagates."""
        cur = self.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            yield cur
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inserts ------------------------------------------------------------------
    def _insert_new(self, table: str, data: pa.Table, key: tuple[str, ...]) -> int:
        """Insert rows of ``data`` whose key is not in ``table`` yet; returns rows added."""
        if data.num_rows == 0:
            return 0
        cond = " AND ".join(f"t.{k} IS NOT DISTINCT FROM n.{k}" for k in key)
        with self._lock:
            cur = self.cursor()
            cur.register("incoming", data)
            try:
                lo, hi = one_row(cur.execute("SELECT min(ts), max(ts) FROM incoming"))
                keys = ", ".join(key)
                dups = one_row(cur.execute(
                    f"SELECT count(*) FROM (SELECT {keys} FROM incoming GROUP BY ALL "
                    "HAVING count(*) > 1)"
                ))[0]
                # DISTINCT ON is costly on wide rows: only pay for it when needed.
                distinct = f"DISTINCT ON ({keys})" if dups else ""
                added = one_row(cur.execute(
                    f"""INSERT INTO {table}
                    SELECT {distinct} n.* FROM incoming n
                    WHERE NOT EXISTS (SELECT 1 FROM {table} t
                                      WHERE t.ts BETWEEN ? AND ? AND {cond})""",
                    [lo, hi],
                ))[0]
            finally:
                cur.unregister("incoming")
                cur.close()
        return int(added)

    def insert_table(self, table: str, data: pa.Table) -> int:
        """Land Arrow rows of a contract table (telemetry, xid_events, incidents) with
        the contract's schema; idempotent by the table's natural key. Returns rows added."""
        if table == "telemetry":
            return self.insert_samples(data)
        keys = {"xid_events": schema.EVENT_KEY, "incidents": schema.INCIDENT_KEY}
        if table not in keys:
            raise ValueError(f"table {table!r} is not a contract table: use telemetry, "
                             "xid_events or incidents")
        return self._insert_new(table, data, keys[table])

    def insert_samples(self, data: pa.Table) -> int:
        if data.num_rows:
            self.mark_dirty(pc.min(data.column("ts")).as_py())
        return self._insert_new("telemetry", data, schema.SAMPLE_KEY)

    def mark_dirty(self, lo: dt.datetime) -> None:
        """Lower ``DIRTY_SINCE_KEY`` to ``lo``, the oldest incoming sample's ts.

        ``rollup.refresh`` re-rolls from there, so samples that arrive after their hour was
        rolled up (late, out of order) are not missed. Written before the rows: a crash in
        between costs a needless re-roll, never a missed one.
        """
        lo = _naive_utc(lo)
        with self._lock:
            self.con.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value WHERE excluded.value < meta.value",
                [DIRTY_SINCE_KEY, lo.isoformat()],
            ).fetchall()

    def insert_sample_columns(self, columns: Mapping[str, np.ndarray]) -> int:
        return self.insert_samples(columns_to_arrow(columns, schema.SAMPLE_SCHEMA))

    def insert_sample_records(self, samples: Iterable[GpuSample]) -> int:
        return self.insert_samples(records_to_arrow(samples, schema.SAMPLE_SCHEMA))

    def insert_events(self, events: Iterable[XidEvent]) -> int:
        return self._insert_new(
            "xid_events", records_to_arrow(events, schema.EVENT_SCHEMA), schema.EVENT_KEY
        )

    def insert_incidents(self, incidents: Iterable[Incident]) -> int:
        return self._insert_new(
            "incidents", records_to_arrow(incidents, schema.INCIDENT_SCHEMA),
            schema.INCIDENT_KEY,
        )

    def insert_batches(self, batches: Iterable[Batch]) -> tuple[int, int, int]:
        """Land decoded batches; returns rows added (samples, events, incidents)."""
        samples, events, incidents = flatten_batches(batches)
        return (
            self.insert_sample_records(samples),
            self.insert_events(events),
            self.insert_incidents(incidents),
        )

    def quarantine(self, source: str, reason: str, raw: bytes, *,
                   received_at: dt.datetime | None = None, code: str | None = None) -> bool:
        """Keep a record we could not accept, with why; never drop it silently.

        ``code`` is the stable reason code (``fleetcare.pipeline.validate.CODES``). The
        same bytes from the same ``source`` (``topic/partition@offset``) are kept once:
        a redelivery after a crash before the offset commit is not a second bad record.
        Returns whether a row was added."""
        when = _naive_utc(received_at or dt.datetime.now(dt.UTC))
        with self._lock:
            added = self.con.execute(
                "INSERT INTO quarantine (received_at, source, reason, raw, code) "
                "SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM quarantine "
                "WHERE source = ? AND raw IS NOT DISTINCT FROM ?) RETURNING 1",
                [when, source, reason, raw, code, source, raw]
            ).fetchall()
        if not added:
            log.info("ingest.quarantine_redelivered source=%s code=%s (kept once)", source, code)
            return False
        log.warning("ingest.quarantined source=%s code=%s reason=%s bytes=%d",
                    source, code, reason, len(raw))
        return True

    # -- meta -------------------------------------------------------------------
    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self.con.execute(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value]
            ).fetchall()

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self.cursor().execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else default
