"""The Parquet lake: what scale-out ingest workers write and DuckDB reads.

Layout of a lake ``DIR`` (Hive-style partitions by the record's UTC date and hour)::

    DIR/telemetry/_schema.parquet                       no rows: the contract's columns
    DIR/telemetry/date=2026-01-01/hour=05/<worker>-<seq>.parquet
    DIR/xid_events/...   DIR/incidents/...   DIR/nic_telemetry/...
    DIR/quarantine/...   (quarantine by received_at)

Every ingest worker writes only its own files (``worker_id`` is unique per process), so
workers never coordinate. A file is written under a hidden temporary name in its final
folder, fsync'd, renamed, and the folder fsync'd: a reader sees a whole file or none.
Kafka offsets are committed only after ``LakeWriter.flush`` returned.

A crash between a rename and the offset commit makes Kafka deliver those records again,
so the same record can sit in two files. Readers never see that: ``open_lake`` gives a
DuckDB connection whose views ``lake_telemetry``, ``lake_xid_events``, ``lake_incidents``
keep one row per natural key (``schema.SAMPLE_KEY`` ...); ``lake_quarantine`` one per
(source, raw bytes), as ``Store.quarantine`` keeps them. ``*_raw`` views show every
stored row. ``compact``
rewrites a partition's files as one, without duplicates; it is safe next to running
writers and readers because the views deduplicate anyway.

    lake = LakeWriter("var/lake")
    lake.insert_batches(batches); lake.flush()          # durable here, then commit
    con = open_lake("var/lake")
    con.sql("SELECT node, count(*) FROM lake_telemetry GROUP BY node")
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import re
import secrets
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fleetcare.collectors.contract import Batch
from fleetcare.collectors.transport.spool import fsync_dir
from fleetcare.pipeline import schema
from fleetcare.pipeline.store import flatten_batches, flatten_nics, records_to_arrow, sample_rows

log = logging.getLogger(__name__)

QUARANTINE_SCHEMA = pa.schema([("received_at", pa.timestamp("us")), ("source", pa.string()),
                               ("reason", pa.string()), ("raw", pa.binary()),
                               ("code", pa.string())])
"""The columns of the DuckDB ``quarantine`` table (``schema.DDL``), in its order."""


@dataclass(frozen=True, slots=True)
class LakeTable:
    name: str
    schema: pa.Schema
    key: tuple[str, ...]  # the views and compaction keep one row per key
    time_column: str


TABLES: dict[str, LakeTable] = {t.name: t for t in (
    LakeTable("telemetry", schema.SAMPLE_SCHEMA, schema.SAMPLE_KEY, "ts"),
    LakeTable("xid_events", schema.EVENT_SCHEMA, schema.EVENT_KEY, "ts"),
    LakeTable("incidents", schema.INCIDENT_SCHEMA, schema.INCIDENT_KEY, "ts"),
    LakeTable("nic_telemetry", schema.NIC_SCHEMA, schema.NIC_KEY, "ts"),
    LakeTable("quarantine", QUARANTINE_SCHEMA, ("source", "raw"), "received_at"),
)}
SCHEMA_FILE = "_schema.parquet"
COMPRESSION = "zstd"


def new_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, so files of restarts never collide."""
    host = re.sub(r"[^A-Za-z0-9_.]+", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def write_atomic(table: pa.Table, path: Path, *, replace: bool = True) -> None:
    """Write ``table`` to ``path`` so that a reader sees the whole file or nothing.

    ``replace=False``: never replace an existing file (``FileExistsError`` instead); a
    data file is never overwritten, whatever its writer's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own: two workers starting on one lake both write _schema.parquet
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression=COMPRESSION)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # atomic, and fails if the name is taken
            tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


_HOUR_US = 3_600_000_000
_EPOCH = dt.datetime(1970, 1, 1)
_MAX_RUNS = 256


def _partitions(table: pa.Table, time_column: str) -> Iterable[tuple[str, pa.Table]]:
    """(``date=YYYY-MM-DD/hour=HH``, rows) for each hour present in ``table``, ascending,
    its rows in table order. An hour's rows are slices of ``table`` (no copy: a poll's rows
    come in runs of one hour, a few runs where the hour turns); more than ``_MAX_RUNS``
    runs (rows of many hours interleaved) are sorted by hour once instead."""
    ts = table[time_column]
    if ts.type != pa.timestamp("us"):  # (the lake's time columns are; any other is cast)
        ts = ts.cast(pa.timestamp("us"))
    hours = np.floor_divide(ts.cast(pa.int64()).to_numpy(), _HOUR_US)
    if not len(hours):
        return
    cuts = np.flatnonzero(np.diff(hours)) + 1  # where the hour changes
    if len(cuts) >= _MAX_RUNS:
        order = np.argsort(hours, kind="stable")
        table, hours = table.take(pa.array(order)), hours[order]
        cuts = np.flatnonzero(np.diff(hours)) + 1
    runs: dict[int, list[pa.Table]] = {}
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(hours)], strict=True):
        runs.setdefault(int(hours[start]), []).append(table.slice(start, end - start))
    for h in sorted(runs):
        hour = _EPOCH + dt.timedelta(hours=h)
        yield f"date={hour:%Y-%m-%d}/hour={hour:%H}", pa.concat_tables(runs[h])


class LakeWriter:
    """One worker's writer. Rows are buffered by ``insert_batches``/``quarantine`` and made
    durable by ``flush`` (the ingest worker commits offsets only after it)."""

    def __init__(self, root: str | Path, *, worker_id: str | None = None) -> None:
        self.root = Path(root)
        self.worker_id = worker_id or new_worker_id()
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.worker_id):
            raise ValueError(f"worker id {self.worker_id!r} may hold only letters, digits, "
                             "'_', '.' and '-' (it becomes part of file names)")
        self._seq = itertools.count(1)
        self._buffer: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
        self._quarantined: list[tuple[dt.datetime, str, str, bytes, str | None]] = []
        self.files_written = 0
        self.rows_written = 0
        self.nic_rows_added = 0
        """NIC samples buffered by ``insert_batches`` (as ``Store.nic_rows_added``)."""
        ensure_layout(self.root)

    # -- what the Ingestor calls (same names as Store's) --------------------------------
    def insert_batches(self, batches: Iterable[Batch], *,
                       sample_table: pa.Table | None = None) -> tuple[int, int, int]:
        """Buffer decoded batches; returns rows accepted (samples, events, incidents);
        NIC samples are buffered too and counted in ``nic_rows_added``.
        ``sample_table``: the batches' samples already converted (``store.sample_rows``)."""
        batches = list(batches)
        samples, events, incidents = flatten_batches(batches)
        nics = flatten_nics(batches)
        converted = [("telemetry", sample_rows(samples, sample_table))] if samples else []
        converted += [(name, records_to_arrow(records, TABLES[name].schema))
                      for name, records in (("xid_events", events), ("incidents", incidents),
                                            ("nic_telemetry", nics))
                      if records]
        for name, table in converted:  # all converted first: a bad value buffers nothing
            self._buffer[name].append(table)
        self.nic_rows_added += len(nics)
        return len(samples), len(events), len(incidents)

    def quarantine(self, source: str, reason: str, raw: bytes, *,
                   received_at: dt.datetime | None = None, code: str | None = None) -> None:
        """Buffer a record we could not accept (``Store.quarantine``'s signature)."""
        when = received_at or dt.datetime.now(dt.UTC)
        when = when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo else when
        self._quarantined.append((when, source, reason, raw, code))
        log.warning("ingest.quarantined source=%s code=%s reason=%s bytes=%d",
                    source, code, reason, len(raw))

    def quarantine_many(self, rows: Sequence[Any], *,
                        received_at: dt.datetime | None = None) -> int:
        """Buffer many rejections (``Store.quarantine_many``'s signature); returns them."""
        when = received_at or dt.datetime.now(dt.UTC)
        when = when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo else when
        self._quarantined.extend((when, r.source, r.reason, r.raw, r.code) for r in rows)
        if rows:
            log.warning("ingest.quarantined records=%d first=%s code=%s", len(rows),
                        rows[0].source, rows[0].code)
        return len(rows)

    # -- durability -------------------------------------------------------------------------
    @property
    def pending_rows(self) -> int:
        return (sum(t.num_rows for ts in self._buffer.values() for t in ts)
                + len(self._quarantined))

    def flush(self) -> int:
        """Write everything buffered as Parquet files (atomic, fsync'd); returns files."""
        if self._quarantined:
            cols = list(zip(*self._quarantined, strict=True))
            self._buffer["quarantine"].append(pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, QUARANTINE_SCHEMA, strict=True)],
                schema=QUARANTINE_SCHEMA))
            self._quarantined.clear()
        files = 0
        for name, tables in self._buffer.items():
            if not tables:
                continue
            data = pa.concat_tables(tables)
            for part, rows in _partitions(data, TABLES[name].time_column):
                while True:  # a restarted worker of the same id counts from 1 again
                    path = (self.root / name / part
                            / f"{self.worker_id}-{next(self._seq):08d}.parquet")
                    try:
                        write_atomic(rows, path, replace=False)
                        break
                    except FileExistsError:
                        continue
                files += 1
                self.rows_written += rows.num_rows
            tables.clear()
        self.files_written += files
        if files:
            log.debug("lake.flushed worker=%s files=%d", self.worker_id, files)
        return files

    def close(self) -> None:
        self.flush()


def ensure_layout(root: str | Path) -> None:
    """Create the table folders and their zero-row schema files (idempotent)."""
    for t in TABLES.values():
        path = Path(root) / t.name / SCHEMA_FILE
        if not path.exists():
            write_atomic(t.schema.empty_table(), path)


def _glob(root: Path, table: str) -> str:
    return str(root / table / "**" / "*.parquet").replace("'", "''")


def open_lake(root: str | Path, con: duckdb.DuckDBPyConnection | None = None
              ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection (``con``, else a new in-memory one) with the lake's views.

    ``lake_<table>`` holds one row per natural key, ``lake_<table>_raw`` every stored row.
    The views re-read the folder at each query, so new files show up without reopening.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"lake {root} does not exist: start `fleetcare ingest "
                                f"--lake {root}` first, or point at an existing lake")
    con = con or duckdb.connect()
    for t in TABLES.values():
        cols = ", ".join(t.schema.names)
        if (root / t.name / SCHEMA_FILE).exists() or any((root / t.name).glob("**/*.parquet")):
            source = (f"read_parquet('{_glob(root, t.name)}', union_by_name = true, "
                      "hive_partitioning = false)")
        else:  # a read-only lake without schema files: an empty, typed relation
            con.register(f"_lake_empty_{t.name}", t.schema.empty_table())
            source = f"_lake_empty_{t.name}"
        con.execute(f"CREATE OR REPLACE VIEW lake_{t.name}_raw AS SELECT {cols} FROM {source}")
        con.execute(f"CREATE OR REPLACE VIEW lake_{t.name} AS SELECT DISTINCT ON "
                    f"({', '.join(t.key)}) * FROM lake_{t.name}_raw")
    return con


@dataclass(frozen=True, slots=True)
class Compacted:
    """One partition rewritten: ``inputs`` (deleted) became ``output``."""

    table: str
    hour: dt.datetime
    output: Path
    inputs: tuple[Path, ...]
    rows: int


@dataclass(frozen=True, slots=True)
class CompactResult:
    partitions: int
    files_in: int
    files_out: int
    rows_in: int
    rows_out: int
    outputs: tuple[Compacted, ...] = ()


def partitions(root: str | Path, table: str) -> Iterable[tuple[dt.datetime, Path]]:
    """(hour, folder) of each ``date=/hour=`` partition of ``table``, oldest first."""
    for hour_dir in sorted((Path(root) / table).glob("date=*/hour=*")):
        day = hour_dir.parent.name.removeprefix("date=")
        try:
            yield dt.datetime.fromisoformat(
                f"{day}T{hour_dir.name.removeprefix('hour=')}:00"), hour_dir
        except ValueError:
            log.warning("lake.bad_partition path=%s: not date=YYYY-MM-DD/hour=HH, skipped",
                        hour_dir)


def data_files(folder: Path) -> list[Path]:
    """The finished Parquet files of a partition (not the hidden temporaries)."""
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))


def compact(root: str | Path, *, older_than: dt.timedelta = dt.timedelta(hours=2),
            now: dt.datetime | None = None, only: set[Path] | None = None) -> CompactResult:
    """Rewrite each partition older than ``older_than`` that has several files as one
    file without duplicate natural keys, then delete the files it read.

    ``only``: compact just these files (a reader that tracks files, such as the service's
    ``lake_feed``, passes the files it has already read, so nothing unread is folded
    into a file it would take as read). Safe next to writers (it only deletes files it
    read) and readers (the new file is in place before the old ones go, and the views
    deduplicate the overlap); a reader in the middle of a scan may still see a file
    vanish and must retry its query.
    """
    root = Path(root)
    now = now or dt.datetime.now(dt.UTC)
    cutoff = (now.astimezone(dt.UTC).replace(tzinfo=None) - older_than)
    con = duckdb.connect()
    totals = [0, 0, 0, 0, 0]
    outputs: list[Compacted] = []
    for t in TABLES.values():
        for start, hour_dir in partitions(root, t.name):
            files = [p for p in data_files(hour_dir) if only is None or p in only]
            if start + dt.timedelta(hours=1) > cutoff or len(files) < 2:
                continue
            listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
            source = f"read_parquet([{listing}], union_by_name = true)"
            cols = ", ".join(t.schema.names)
            distinct = f"DISTINCT ON ({', '.join(t.key)})"
            rows_in = con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0]
            data = con.sql(f"SELECT {distinct} {cols} FROM {source} "
                               f"ORDER BY {t.time_column}").to_arrow_table()
            data = data.cast(t.schema) if data.schema != t.schema else data
            out = hour_dir / f"compact-{new_worker_id()}.parquet"
            write_atomic(data, out)
            for p in files:
                p.unlink(missing_ok=True)
            fsync_dir(hour_dir)
            outputs.append(Compacted(t.name, start, out, tuple(files), data.num_rows))
            for i, v in enumerate((1, len(files), 1, rows_in, data.num_rows)):
                totals[i] += v
            log.info("lake.compacted partition=%s files=%d rows_in=%d rows_out=%d",
                     hour_dir.relative_to(root), len(files), rows_in, data.num_rows)
    con.close()
    partitions_n, files_in, files_out, rows_in_n, rows_out = totals
    return CompactResult(partitions_n, files_in, files_out, rows_in_n, rows_out,
                         outputs=tuple(outputs))
