"""The DuckDB store: one database file, one writing process, threads share it.

Rows go in as Arrow tables in bulk; every insert is idempotent by the record's natural
key (``schema.SAMPLE_KEY`` ...), so a redelivered batch lands once. Telemetry arrives
roughly in time order, so the duplicate check only looks at the incoming time range,
which DuckDB's zone maps prune cheaply.

Exceptions::

    StoreError            (.path)  the database cannot be opened (held by another
                                   process, not a DuckDB file, no permission)
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.collectors.contract import Batch, GpuSample, Incident, NicSample, XidEvent
from fleetcare.collectors.sim.sparse_links import Column, SparseLinks
from fleetcare.pipeline import schema
from fleetcare.pipeline.link_summary import Summarised, summarise, summarise_grid
from fleetcare.pipeline.telemetry import RawTelemetry, TableTelemetry
from fleetcare.pipeline.wire_columns import as_sample

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DIRTY_SINCE_KEY = "telemetry.dirty_since"
"""meta key: the oldest sample ts inserted since the last rollup (``rollup.refresh``)."""
NIC_DIRTY_SINCE_KEY = "nic_telemetry.dirty_since"
"""meta key: the oldest NIC sample ts inserted since the last ``nic_rollup.refresh``."""


class StoreError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True, slots=True)
class Quarantined:
    """One row for ``Store.quarantine_many`` (``validate.Rejection`` has the same fields)."""

    source: str
    reason: str
    raw: bytes
    code: str | None = None
    received_at: dt.datetime | None = None


def open_error_hint(path: str, exc: BaseException) -> str:
    """Why DuckDB could not open ``path``, and the fix, in one sentence."""
    text = " ".join(str(exc).split())
    if "not a valid DuckDB database file" in text:
        return ("is not a DuckDB database (it exists, but holds something else): point --db "
                "at a fleetcare database, or at a new path to create one")
    if "lock" in text.lower():
        return (f"cannot open the database: another process holds it ({text}). DuckDB allows "
                "one writing process per file: stop the other fleetcare process, or go "
                "through its API; to ingest while serving, let the service ingest "
                "(`fleetcare serve --bus`) or scale out with `fleetcare ingest --lake` "
                "workers and `fleetcare serve --lake`.")
    return (f"cannot open the database ({text}): check that the path is a readable and "
            "writable DuckDB file, or a new path in a writable folder")


def one_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The row of an executed statement that always returns exactly one: an aggregate
    without GROUP BY (``count(*)``, ``min``/``max``, even over an empty table) or an
    INSERT (DuckDB returns its row count)."""
    rows = result.fetchall()  # all of them: a result left unfinished blocks the cursor
    assert len(rows) == 1, f"a statement that always returns one row returned {len(rows)}"
    return rows[0]


def _incoming_stats(data: pa.Table, key: tuple[str, ...]) -> tuple[Any, Any, bool]:
    """Rows' oldest and newest ``ts`` (naive UTC, as stored) and whether two of them share
    a key (nulls equal, as DuckDB's GROUP BY has them), from the Arrow table itself: as a
    query of the registered rows it was ~4 ms of a 273-sample batch's ~16 (the embedded
    bus lands one such batch per node and minute; ``bench/bench_sample_memory.py``)."""
    span = pc.min_max(data.column("ts"))
    lo, hi = span["min"].as_py(), span["max"].as_py()
    keys = list(key)
    dups = data.select(keys).group_by(keys).aggregate([]).num_rows < data.num_rows
    return (None if lo is None else _naive_utc(lo), None if hi is None else _naive_utc(hi),
            dups)


def _mark_dirty(c: duckdb.DuckDBPyConnection, lo: dt.datetime, key: str) -> None:
    """``Store.mark_dirty`` on the cursor ``c`` (inside the caller's transaction, if any)."""
    c.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
              "SET value = excluded.value WHERE excluded.value < meta.value",
              [key, _naive_utc(lo).isoformat()]).fetchall()


def _insert_incoming(c: duckdb.DuckDBPyConnection, table: str, key: tuple[str, ...],
                     stats: tuple[Any, Any, bool], *,
                     select: Callable[[str], str] | None = None,
                     against: str | None = None, where: str = "TRUE",
                     source: str = "incoming") -> int:
    """Insert the registered ``source`` rows (default ``incoming``) whose key is not in
    ``against`` (default ``table``) yet; returns rows added. ``stats``:
    ``_incoming_stats`` of them (or of rows they are a part of); ``select``: the SELECT
    that makes a relation of incoming rows the table's (default: every column as it is);
    ``where``: only the rows it holds for are looked up and inserted."""
    lo, hi, dups = stats
    cond = " AND ".join(f"t.{k} IS NOT DISTINCT FROM n.{k}" for k in key)
    # DISTINCT ON is costly on wide rows: only pay for it when needed.
    distinct = f"DISTINCT ON ({', '.join(key)})" if dups else ""
    new = (f"(SELECT {distinct} n.* FROM {source} n WHERE ({where}) "
           f"AND NOT EXISTS (SELECT 1 FROM {against or table} t "
           f"WHERE t.ts BETWEEN ? AND ? AND {cond}))")
    rows = select(new) if select is not None else f"SELECT * FROM {new}"
    return int(one_row(c.execute(f"INSERT INTO {table} {rows}", [lo, hi]))[0])


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


def sample_rows(samples: Sequence[Any], table: pa.Table | None) -> pa.Table:
    """``samples`` as Arrow: ``table`` when it is them already (validation converts a
    poll's samples once, ``ValidationResult.sample_table``), else converted here
    (``GpuSample``, ``wire_columns.WireSample`` or a sample's msgpack bytes)."""
    if table is not None:
        if table.num_rows == len(samples) and table.schema == schema.SAMPLE_SCHEMA:
            return table
        log.error("store.sample_table_mismatch rows=%d samples=%d: converting the samples "
                  "again (a bug: report it)", table.num_rows, len(samples))
    return records_to_arrow(map(as_sample, samples), schema.SAMPLE_SCHEMA)


def flatten_nics(batches: Iterable[Batch]) -> list[NicSample]:
    """The NIC samples of many batches, in arrival order."""
    return [n for b in batches for n in b.nics]


def grid_list_array(grid: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """A 2-D array (one row per sample, one column per link) as an Arrow list column, the
    values taken as they are (no Python object per entry)."""
    n, width = grid.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * np.int32(width))
    return pa.ListArray.from_arrays(offsets, pa.array(grid.reshape(-1), type=value_type))


def columns_to_arrow(columns: Mapping[str, Column], arrow: pa.Schema) -> pa.Table:
    """Columnar numpy data (the simulator's history chunks) → Arrow, fast path.

    Missing fields become null columns; 2-D arrays and ``SparseLinks`` become list columns
    (one list per row), and so do object arrays of lists (None: a null list).
    """
    n = len(next(iter(columns.values())))
    arrays = []
    for field in arrow:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(n, type=field.type))
        elif isinstance(values, SparseLinks):
            arrays.append(grid_list_array(values.dense(), field.type.value_type))
        elif pa.types.is_list(field.type) and np.asarray(values).dtype == object:
            arrays.append(pa.array(np.asarray(values).tolist(), type=field.type))
        elif pa.types.is_list(field.type):
            arrays.append(grid_list_array(np.asarray(values), field.type.value_type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=arrow)


_SCALAR_SCHEMA = pa.schema([schema.SAMPLE_SCHEMA.field(c) for c in schema.SCALAR_SAMPLE_COLUMNS])
_LISTS_SCHEMA = pa.schema([schema.SAMPLE_SCHEMA.field(c)
                           for c in ("gpu_uuid", "ts", *schema.NVLINK_LISTS)])


def summarise_columns(columns: Mapping[str, Column]) -> Summarised | None:
    """Columnar samples as ``telemetry`` and ``telemetry_nvlink`` store them
    (``link_summary.summarise`` of ``columns_to_arrow(columns)``), the per-link counters
    read as ``SparseLinks`` and lists built only for the irregular samples; None when the
    columns are not in that form (a counter as a dense array, a list missing, no links),
    for the general path."""
    up = columns.get("nvlink_up")
    if not (isinstance(up, np.ndarray) and up.dtype == bool and up.ndim == 2
            and 0 < up.shape[1] <= schema.MASK_LINKS):
        return None
    counters: dict[str, SparseLinks] = {}
    for name in schema.NVLINK_COUNTERS:
        c = columns.get(name)
        if not (isinstance(c, SparseLinks) and c.shape == up.shape):
            return None
        counters[name] = c
    summary, irregular = summarise_grid(up, counters)
    stored = columns_to_arrow(columns, _SCALAR_SCHEMA)
    for name, _ in schema.LINK_SUMMARY:
        stored = stored.append_column(name, summary[name])
    at = np.flatnonzero(irregular)
    lists: dict[str, Column] = {name: c.take(at) for name, c in counters.items()}
    for name in ("gpu_uuid", "ts", "nvlink_up"):
        lists[name] = np.asarray(columns[name])[at]
    return Summarised(stored, columns_to_arrow(lists, _LISTS_SCHEMA))


MEMORY_LIMIT: str | None = None
"""DuckDB's ``memory_limit`` for every ``Store`` opened without one (None: DuckDB's default,
80 % of RAM). The CLI sets it from ``[cli] duckdb_memory`` / ``FLEETCARE_CLI_DUCKDB_MEMORY``;
past it DuckDB spills to its temporary directory."""


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Whether ``table`` of the current schema has ``column`` (an older layout's mark)."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = ? AND column_name = ? "
        "AND schema_name = current_schema()", [table, column]).fetchall()[0][0])


def replace_table(con: duckdb.DuckDBPyConnection, table: str, ddl: str,
                  fill: Callable[[str], Sequence[str]]) -> None:
    """Rebuild ``table`` in a new layout, in one transaction: the old one is renamed,
    ``ddl`` creates the new, the statements ``fill(old_name)`` copy the rows over, and the
    old table is dropped. Any error rolls all of it back."""
    old = f"{table}_old_layout"
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"ALTER TABLE {table} RENAME TO {old}")
        con.execute(ddl)
        for sql in fill(old):
            con.execute(sql)
        con.execute(f"DROP TABLE {old}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _convert_sample_lists(con: duckdb.DuckDBPyConnection) -> None:
    """Convert a ``telemetry`` table of the older layout to ``schema``'s: the lists
    summarised in each row, kept whole in ``telemetry_nvlink`` where they are not all up
    and zero (``schema.IRREGULAR_SQL``)."""
    n = con.execute("SELECT count(*) FROM telemetry").fetchall()[0][0]
    log.info("store.converting_telemetry rows=%d: NVLink lists become per-row totals "
             "(issue 15 §4); once per database", n)
    replace_table(con, "telemetry", schema.DDL, lambda old: [
        f"INSERT INTO telemetry {schema.stored_samples_sql(old)}",
        f"INSERT INTO telemetry_nvlink SELECT gpu_uuid, ts, "
        f"{', '.join(schema.NVLINK_LISTS)} FROM {old} WHERE {schema.IRREGULAR_SQL}"])


class Store:
    """One DuckDB database. ``cursor()`` gives a thread its own connection handle.

    ``raw`` says where raw samples are read from (``fleetcare.pipeline.telemetry``): the
    database's own ``telemetry`` table (default) or a Parquet lake
    (``fleetcare.pipeline.lake_feed.open_state``)."""

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 raw: RawTelemetry | None = None, memory_limit: str | None = None) -> None:
        self.path = str(path)
        self.read_only = read_only
        self.raw: RawTelemetry = raw if raw is not None else TableTelemetry()
        try:
            self.con = duckdb.connect(self.path, read_only=read_only)
        except (duckdb.IOException, duckdb.InvalidInputException) as exc:
            raise StoreError(self.path, open_error_hint(self.path, exc)) from None
        limit = memory_limit if memory_limit is not None else MEMORY_LIMIT
        if limit:
            try:
                self.con.execute(f"SET memory_limit = '{limit}'")
            except duckdb.Error as exc:
                self.con.close()
                raise StoreError(self.path, f"DuckDB memory limit {limit!r} is not a size "
                                 f"({exc}); give one like '4GB' ([cli] duckdb_memory, "
                                 "FLEETCARE_CLI_DUCKDB_MEMORY)") from None
        self._lock = threading.RLock()
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        self._cursors_lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = []
        self.nic_rows_added = 0
        """Rows ``insert_batches`` added to ``nic_telemetry`` (its return value predates
        NIC samples and stays three counts)."""
        if has_column(self.con, "telemetry", "nvlink_up"):  # the layout before issue 15 §4
            if read_only:
                self.con.close()
                raise StoreError(self.path, "its telemetry table is in the layout of an "
                                 "older fleetcare (NVLink lists in every row): open it once "
                                 "writable (for instance `fleetcare rollup --db PATH`) and "
                                 "it is converted")
            _convert_sample_lists(self.con)
        if not read_only:
            self.con.execute(schema.DDL)

    # -- plumbing ---------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self.con.cursor()
        with self._cursors_lock:
            self._cursors.add(cur)
        return cur

    def interrupt(self) -> None:
        """Interrupt the query each of the store's cursors runs now (it raises
        ``duckdb.InterruptException`` in its thread; an idle cursor is not affected). For
        a stop that cannot wait for a long query to end; a transaction interrupted rolls
        back."""
        with self._cursors_lock:
            live = list(self._cursors)
        for cur in (self.con, *live):
            try:
                cur.interrupt()
            except duckdb.Error:  # closed meanwhile
                pass

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the store is closed (a cache held for it lets go)."""
        self._on_close.append(callback)

    def close(self) -> None:
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("store.close_callback_failed callback=%r", callback)
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
        """Insert rows of ``data`` whose key is not in ``table`` yet (``_insert_incoming``);
        returns rows added."""
        if data.num_rows == 0:
            return 0
        with self._lock:
            c = self.cursor()
            c.register("incoming", data)
            try:
                return _insert_incoming(c, table, key, _incoming_stats(data, key))
            finally:
                c.unregister("incoming")
                c.close()

    def insert_table(self, table: str, data: pa.Table) -> int:
        """Land Arrow rows of a contract table (telemetry, xid_events, incidents) with
        the contract's schema; idempotent by the table's natural key. Returns rows added."""
        if table == "telemetry":
            return self.insert_samples(data)
        if table == "nic_telemetry":
            return self._insert_nics(data)
        keys = {"xid_events": schema.EVENT_KEY, "incidents": schema.INCIDENT_KEY,
                "nic_telemetry": schema.NIC_KEY}
        if table not in keys:
            raise ValueError(f"table {table!r} is not a contract table: use telemetry, "
                             "xid_events, incidents or nic_telemetry")
        return self._insert_new(table, data, keys[table])

    def insert_samples(self, data: pa.Table) -> int:
        """Land GPU samples (Arrow, ``schema.SAMPLE_SCHEMA``) as stored: the NVLink lists
        summarised in each row, kept whole in ``telemetry_nvlink`` only for a sample with
        a link down or a counter not zero (``schema.stored_samples_sql``, computed with
        numpy by ``link_summary.summarise``: DuckDB inserts narrow rows and reads no list;
        README: "How GPU samples are stored"). Returns samples added."""
        if not data.num_rows:
            return 0
        return self._insert_summarised(summarise(data))

    def _insert_summarised(self, rows: Summarised) -> int:
        """``insert_samples`` of samples already summarised."""
        # the mark and the rows land under one lock: a refresh takes the mark
        # (``rollup._take_dirty`` holds the lock too) before both or after both, never
        # between them, which would consume the mark of rows its snapshot lacks
        stats = _incoming_stats(rows.stored, schema.SAMPLE_KEY)  # serves both inserts
        with self._lock, self.transaction() as cur:
            # from the oldest, in the rows' own transaction: both land or neither (one
            # commit a batch)
            _mark_dirty(cur, stats[0], DIRTY_SINCE_KEY)
            cur.register("incoming", rows.stored)
            cur.register("incoming_lists", rows.lists)
            try:
                # the lists of the irregular samples new to telemetry, before the
                # samples themselves land
                if rows.lists.num_rows:
                    _insert_incoming(cur, "telemetry_nvlink", schema.SAMPLE_KEY, stats,
                                     against="telemetry", source="incoming_lists")
                return _insert_incoming(cur, "telemetry", schema.SAMPLE_KEY, stats)
            finally:
                cur.unregister("incoming")
                cur.unregister("incoming_lists")

    def mark_dirty(self, lo: dt.datetime, *, key: str = DIRTY_SINCE_KEY) -> None:
        """Lower ``key`` (default ``DIRTY_SINCE_KEY``) to ``lo``, the oldest incoming ts.

        ``rollup.refresh`` re-rolls from there, so samples that arrive after their hour was
        rolled up (late, out of order) are not missed. Written before the rows: a crash in
        between costs a needless re-roll, never a missed one (GPU samples write it in their
        own transaction: both or neither).
        """
        with self._lock:
            _mark_dirty(self.con, lo, key)

    def insert_sample_columns(self, columns: Mapping[str, Column]) -> int:
        """Land columnar samples (the simulator's ``Chunk.samples``); the same rows as
        ``insert_samples`` of them as Arrow, with no list built for a regular sample when
        the per-link counters come as ``SparseLinks`` (``summarise_columns``)."""
        rows = summarise_columns(columns)
        if rows is None:
            return self.insert_samples(columns_to_arrow(columns, schema.SAMPLE_SCHEMA))
        if not rows.stored.num_rows:
            return 0
        return self._insert_summarised(rows)

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

    def insert_nic_samples(self, nics: Iterable[NicSample]) -> int:
        """Land NIC port samples in ``nic_telemetry`` (natural key ``schema.NIC_KEY``)."""
        return self._insert_nics(records_to_arrow(nics, schema.NIC_SCHEMA))

    def insert_nic_columns(self, columns: Mapping[str, np.ndarray]) -> int:
        """Land columnar NIC port samples (the simulator's ``Chunk.nics``)."""
        return self._insert_nics(columns_to_arrow(columns, schema.NIC_SCHEMA))

    def _insert_nics(self, data: pa.Table) -> int:
        if data.num_rows:
            self.mark_dirty(pc.min(data.column("ts")).as_py(), key=NIC_DIRTY_SINCE_KEY)
        return self._insert_new("nic_telemetry", data, schema.NIC_KEY)

    def insert_batches(self, batches: Iterable[Batch], *,
                       sample_table: pa.Table | None = None) -> tuple[int, int, int]:
        """Land decoded batches; returns rows added (samples, events, incidents). NIC
        samples land in ``nic_telemetry`` too; ``nic_rows_added`` counts them.
        ``sample_table``: the batches' samples already converted (``sample_rows``).

        All rows are converted to Arrow before any is inserted, so a value Arrow cannot
        hold (``OverflowError``, ``ArrowInvalid``) fails the call before it wrote anything."""
        batches = list(batches)
        samples, events, incidents = flatten_batches(batches)
        tables = (sample_rows(samples, sample_table),
                  records_to_arrow(events, schema.EVENT_SCHEMA),
                  records_to_arrow(incidents, schema.INCIDENT_SCHEMA))
        nics = records_to_arrow(flatten_nics(batches), schema.NIC_SCHEMA)
        added = (
            self.insert_samples(tables[0]),
            self._insert_new("xid_events", tables[1], schema.EVENT_KEY),
            self._insert_new("incidents", tables[2], schema.INCIDENT_KEY),
        )
        self.nic_rows_added += self._insert_nics(nics)
        return added

    def quarantine(self, source: str, reason: str, raw: bytes, *,
                   received_at: dt.datetime | None = None, code: str | None = None) -> bool:
        """Keep a record we could not accept, with why; never drop it silently.

        ``code`` is the stable reason code (``fleetcare.pipeline.validate.CODES``). The
        same bytes from the same ``source`` (``topic/partition@offset``) are kept once:
        a redelivery after a crash before the offset commit is not a second bad record.
        Returns whether a row was added."""
        return self.quarantine_many([Quarantined(source, reason, raw, code, received_at)]) == 1

    def quarantine_many(self, rows: Sequence[Any], *,
                        received_at: dt.datetime | None = None) -> int:
        """``quarantine`` for many rows in one statement (each row has ``source``,
        ``reason``, ``raw`` and ``code``, as ``validate.Rejection`` has, and may have its
        own ``received_at``); returns rows added. Rows already kept (same source and
        bytes) and repeats are kept once."""
        if not rows:
            return 0
        when = _naive_utc(received_at or dt.datetime.now(dt.UTC))
        times = [_naive_utc(t) if (t := getattr(r, "received_at", None)) else when
                 for r in rows]
        data = pa.table({"received_at": pa.array(times, pa.timestamp("us")),
                         "source": pa.array([r.source for r in rows], pa.string()),
                         "reason": pa.array([r.reason for r in rows], pa.string()),
                         "raw": pa.array([r.raw for r in rows], pa.binary()),
                         "code": pa.array([r.code for r in rows], pa.string())})
        with self._lock:
            cur = self.cursor()
            cur.register("incoming_quarantine", data)
            try:
                added = int(one_row(cur.execute(
                    "INSERT INTO quarantine (received_at, source, reason, raw, code) "
                    "SELECT DISTINCT ON (source, raw) * FROM incoming_quarantine n "
                    "WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.source = n.source "
                    "AND q.raw IS NOT DISTINCT FROM n.raw)"))[0])
            finally:
                cur.unregister("incoming_quarantine")
                cur.close()
        codes = Counter(r.code for r in rows)
        if added:
            log.warning("ingest.quarantined records=%d codes=%s first=%s", added,
                        ",".join(f"{c}:{n}" for c, n in sorted(codes.items(), key=str)),
                        rows[0].source)
        if added < len(rows):
            log.info("ingest.quarantine_redelivered records=%d (kept once)", len(rows) - added)
        for r in rows:
            log.debug("ingest.quarantined source=%s code=%s reason=%s bytes=%d",
                      r.source, r.code, r.reason, len(r.raw))
        return added

    # -- meta -------------------------------------------------------------------
    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self.con.execute(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value]
            ).fetchall()

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self.cursor().execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else default


def held_for(held: weakref.WeakKeyDictionary[Store, _T], store: Store,
             make: Callable[[], _T]) -> _T:
    """``held[store]``, made by ``make()`` the first time: a cache kept per store, let go
    when the store closes (``Store.on_close``; or when it is collected)."""
    got = held.get(store)
    if got is None:
        got = held[store] = make()
        ref = weakref.ref(store)

        def forget() -> None:
            closed = ref()
            if closed is not None:
                held.pop(closed, None)

        store.on_close(forget)
    return got
