"""The service's view of the Parquet lake: read new files incrementally, keep raw there.

Scale-out shape: any number of ``fleetcare ingest --lake DIR`` workers write Parquet
(``fleetcare.pipeline.lake``); one ``fleetcare serve --lake DIR --db STATE`` reads it.
The state DB holds rollups, scores, models, incidents, XID events, quarantine, alerts,
drains and tokens; raw samples stay in the lake. ``LakeTelemetry`` is the store's
``raw`` (``fleetcare.pipeline.telemetry.RawTelemetry``) and owns two state tables:

    lake_files            every lake file the service has read: its table, hour, rows,
                          min/max ts. The file watermark: ``sync`` reads only files not
                          in it (no whole-lake scan or dedupe per query).
    lake_latest_samples   each GPU's newest sample (the API's node and GPU pages)

``sync(store)`` lists the partitions, and for each new file: telemetry lowers the rollup's
dirty mark to the file's oldest sample (``rollup.refresh`` then re-rolls from there, late
files included) and updates the newest samples; XID events, incidents and quarantine
rows are copied into the state DB (idempotent by natural key). Rollups read the raw rows
of the hours they rebuild from the files of those hours (one row per natural key: a
worker that crashed before committing writes a record twice).

``compact(store)`` rewrites read partitions older than two hours as one file each and
``delete_before`` (retention) deletes read partitions; both keep ``lake_files`` exact.

    store = open_state("var/state.duckdb", "var/lake")
    store.raw.sync(store); features.refresh(store); scoring.score(store)
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline import lake, schema
from fleetcare.pipeline.store import Quarantined, Store
from fleetcare.pipeline.telemetry import Cursor, gpu_filter, naive_utc, sql_ts

log = logging.getLogger(__name__)

FILES = "lake_files"
LATEST = "lake_latest_samples"
DDL = f"""
CREATE TABLE IF NOT EXISTS {FILES} (
  table_name VARCHAR NOT NULL, path VARCHAR NOT NULL, hour TIMESTAMP NOT NULL,
  rows BIGINT NOT NULL, min_ts TIMESTAMP, max_ts TIMESTAMP, seen_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS {LATEST} (
  {schema.columns_ddl(GpuSample)}
);
"""
SAMPLE_COLS = ", ".join(schema.SAMPLE_COLUMNS)


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one ``sync`` read: new files per table and rows copied into the state DB."""

    files: int
    samples: int
    events: int
    incidents: int
    quarantined: int
    oldest_new_sample: dt.datetime | None
    nics: int = 0


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _listing(paths: list[Path]) -> str:
    return "[" + ", ".join(_quote(p) for p in paths) + "]"


class LakeTelemetry:
    """Raw samples in the lake at ``root`` (see the module docstring)."""

    kind = "lake"

    def __init__(self, root: str | Path, *, create: bool = False) -> None:
        self.root = Path(root)
        if create:
            lake.ensure_layout(self.root)  # the service may start before any worker
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"lake {self.root} does not exist: start `fleetcare ingest --lake "
                f"{self.root}` workers first, or point --lake at their folder")
        self._known: set[str] | None = None

    def ensure_tables(self, cur: Cursor) -> None:
        cur.execute(DDL).fetchall()

    # -- reading new files ------------------------------------------------------------------
    def _known_paths(self, store: Store) -> set[str]:
        if self._known is None:
            self._known = {r[0] for r in store.cursor().execute(
                f"SELECT path FROM {FILES}").fetchall()}
        return self._known

    def new_files(self, store: Store) -> dict[str, list[tuple[dt.datetime, Path]]]:
        """{table: [(partition hour, file)]} of the files not read yet, oldest first."""
        known = self._known_paths(store)
        out: dict[str, list[tuple[dt.datetime, Path]]] = {}
        for table in lake.TABLES:
            for hour, folder in lake.partitions(self.root, table):
                for f in lake.data_files(folder):
                    if str(f.relative_to(self.root)) not in known:
                        out.setdefault(table, []).append((hour, f))
        return out

    def sync(self, store: Store, *, max_files: int = 5_000) -> SyncResult:
        """Read the files written since the last sync (at most ``max_files`` a call)."""
        new = self.new_files(store)
        counts = dict.fromkeys(("files", "samples", "events", "incidents", "quarantined",
                                "nics"), 0)
        oldest: dt.datetime | None = None
        budget = max_files
        for table in ("incidents", "xid_events", "quarantine", "nic_telemetry", "telemetry"):
            files = new.get(table, [])[:budget]
            if not files:
                continue
            budget -= len(files)
            stats = self._file_stats(store, table, [f for _, f in files])
            if table == "telemetry":
                lo = min((s[1] for s in stats.values() if s[1] is not None), default=None)
                if lo is not None:
                    store.mark_dirty(lo)  # before the files count as read: a crash re-reads
                    oldest = lo if oldest is None else min(oldest, lo)
                self._update_latest(store, [f for _, f in files])
                counts["samples"] += sum(s[0] for s in stats.values())
            else:
                counts[{"xid_events": "events", "incidents": "incidents",
                        "quarantine": "quarantined", "nic_telemetry": "nics"}[table]] += self._copy(
                    store, table, [f for _, f in files])
            self._remember(store, table, [(h, f, *stats[str(f)]) for h, f in files])
            counts["files"] += len(files)
        if counts["files"]:
            log.info("lake.synced files=%d samples=%d events=%d incidents=%d quarantined=%d "
                     "nics=%d", *counts.values())
        return SyncResult(**counts, oldest_new_sample=oldest)

    def _file_stats(self, store: Store, table: str, files: list[Path]
                    ) -> dict[str, tuple[int, dt.datetime | None, dt.datetime | None]]:
        """{path: (rows, min time, max time)} of each file, from one scan of its time column."""
        col = lake.TABLES[table].time_column
        rows = store.cursor().execute(
            f"SELECT filename, count(*), min({col}), max({col}) FROM read_parquet("
            f"{_listing(files)}, filename = true, union_by_name = true) GROUP BY filename"
        ).fetchall()
        got = {r[0]: (int(r[1]), r[2], r[3]) for r in rows}
        return {str(f): got.get(str(f), (0, None, None)) for f in files}

    def _copy(self, store: Store, table: str, files: list[Path]) -> int:
        """Copy the rows of ``files`` into the state DB's table; returns rows added."""
        t = lake.TABLES[table]
        data = store.cursor().sql(
            f"SELECT {', '.join(t.schema.names)} FROM read_parquet({_listing(files)}, "
            "union_by_name = true)").to_arrow_table()
        data = data.cast(t.schema) if data.schema != t.schema else data
        if table == "quarantine":
            return store.quarantine_many([
                Quarantined(r["source"], r["reason"], r["raw"], r["code"], r["received_at"])
                for r in data.to_pylist()])
        return store.insert_table(table, data)

    def _update_latest(self, store: Store, files: list[Path]) -> None:
        """Each GPU's newest sample, where the new files hold a newer one."""
        with store._lock, store.transaction() as cur:
            cur.execute(
                f"CREATE OR REPLACE TEMP TABLE _lake_new_latest AS SELECT DISTINCT ON "
                f"(gpu_uuid) {SAMPLE_COLS} FROM read_parquet({_listing(files)}, "
                "union_by_name = true) ORDER BY gpu_uuid, ts DESC").fetchall()
            cur.execute(f"DELETE FROM {LATEST} WHERE gpu_uuid IN (SELECT n.gpu_uuid FROM "
                        f"_lake_new_latest n JOIN {LATEST} l ON l.gpu_uuid = n.gpu_uuid "
                        "WHERE l.ts < n.ts)").fetchall()
            cur.execute(f"INSERT INTO {LATEST} SELECT n.* FROM _lake_new_latest n WHERE NOT "
                        f"EXISTS (SELECT 1 FROM {LATEST} l WHERE l.gpu_uuid = n.gpu_uuid)"
                        ).fetchall()
            cur.execute("DROP TABLE _lake_new_latest").fetchall()

    def _remember(self, store: Store, table: str, rows: list[tuple[Any, ...]]) -> None:
        now = naive_utc(dt.datetime.now(dt.UTC))
        known = self._known_paths(store)
        with store._lock:
            store.cursor().executemany(
                f"INSERT INTO {FILES} VALUES (?, ?, ?, ?, ?, ?, ?)",
                [[table, str(f.relative_to(self.root)), hour, n, lo, hi, now]
                 for hour, f, n, lo, hi in rows])
        known.update(str(r[1].relative_to(self.root)) for r in rows)

    def _forget(self, cur: Cursor, paths: list[str]) -> None:
        if paths:
            cur.execute(f"DELETE FROM {FILES} WHERE list_contains(?, path)", [paths]).fetchall()
            if self._known is not None:
                self._known.difference_update(paths)

    # -- RawTelemetry ---------------------------------------------------------------------------
    def bounds(self, cur: Cursor) -> tuple[dt.datetime | None, dt.datetime | None]:
        lo, hi = cur.execute(f"SELECT min(min_ts), max(max_ts) FROM {FILES} "
                             "WHERE table_name = 'telemetry'").fetchall()[0]
        return lo, hi

    def relation(self, cur: Cursor, lo: dt.datetime, hi: dt.datetime) -> str:
        paths = [self.root / r[0] for r in cur.execute(
            f"SELECT path FROM {FILES} WHERE table_name = 'telemetry' AND hour >= ? "
            "AND hour <= ? ORDER BY path",
            [naive_utc(lo).replace(minute=0, second=0, microsecond=0), naive_utc(hi)]
        ).fetchall()]
        if not paths:
            return "(SELECT * FROM telemetry WHERE FALSE)"
        files = (f"(SELECT {SAMPLE_COLS} FROM read_parquet({_listing(paths)}, "
                 f"union_by_name = true) WHERE ts >= {sql_ts(lo)} AND ts <= {sql_ts(hi)} "
                 "QUALIFY row_number() OVER (PARTITION BY gpu_uuid, ts) = 1)")
        return f"({schema.stored_samples_sql(files)})"  # the lake keeps the lists

    def count_before(self, cur: Cursor, cutoff: dt.datetime | None) -> tuple[int, int]:
        before, total = cur.execute(
            f"SELECT coalesce(sum(rows) FILTER (WHERE hour < ?), 0), coalesce(sum(rows), 0) "
            f"FROM {FILES} WHERE table_name = 'telemetry'", [cutoff]).fetchall()[0]
        return int(before), int(total)

    def delete_before(self, cur: Cursor, cutoff: dt.datetime) -> int:
        """Delete the read files of every table's partitions before ``cutoff`` (the other
        tables' rows are in the state DB); unread files stay for the next sync."""
        rows = cur.execute(f"SELECT path, table_name, rows FROM {FILES} WHERE hour < ?",
                           [cutoff]).fetchall()
        for path, _, _ in rows:
            (self.root / path).unlink(missing_ok=True)
        self._forget(cur, [r[0] for r in rows])
        for table in lake.TABLES:
            for hour, folder in lake.partitions(self.root, table):
                if hour < cutoff:
                    _remove_if_empty(folder)
        return sum(r[2] for r in rows if r[1] == "telemetry")

    def latest_samples(self, cur: Cursor, *, node: str | None = None,
                       gpu_uuid: str | None = None,
                       since: dt.datetime | None = None) -> list[dict[str, Any]]:
        # one row per GPU already: ``since`` would save nothing, every GPU is returned
        where, params = gpu_filter(node, gpu_uuid)
        rows = cur.execute(f"SELECT {SAMPLE_COLS} FROM {LATEST} WHERE {where} "
                           "ORDER BY gpu_index, gpu_uuid", params).fetchall()
        return [dict(zip(schema.SAMPLE_COLUMNS, r, strict=True)) for r in rows]

    # -- compaction -----------------------------------------------------------------------------
    def compact(self, store: Store, *, older_than: dt.timedelta = dt.timedelta(hours=2),
                now: dt.datetime | None = None) -> lake.CompactResult:
        """Compact the partitions this service has read; ``lake_files`` follows."""
        known = {self.root / p for p in self._known_paths(store)}
        result = lake.compact(self.root, older_than=older_than, now=now, only=known)
        if not result.outputs:
            return result
        with store._lock, store.transaction() as cur:
            for c in result.outputs:
                old = [str(p.relative_to(self.root)) for p in c.inputs]
                lo, hi = cur.execute(
                    f"SELECT min(min_ts), max(max_ts) FROM {FILES} WHERE list_contains(?, path)",
                    [old]).fetchall()[0]
                self._forget(cur, old)
                cur.execute(f"INSERT INTO {FILES} VALUES (?, ?, ?, ?, ?, ?, ?)",
                            [c.table, str(c.output.relative_to(self.root)), c.hour, c.rows,
                             lo, hi, naive_utc(dt.datetime.now(dt.UTC))]).fetchall()
        self._known_paths(store).update(str(c.output.relative_to(self.root))
                                        for c in result.outputs)
        return result


def _remove_if_empty(folder: Path) -> None:
    """Remove an hour folder, and its date folder, once they hold no file."""
    for d in (folder, folder.parent):
        try:
            os.rmdir(d)
        except OSError:
            return


def open_state(db: str | Path, lake_root: str | Path, *, read_only: bool = False,
               create: bool = False) -> Store:
    """The service's state DB over the lake at ``lake_root`` (``store.raw`` reads it);
    ``create`` makes the lake's folders when they are missing."""
    raw = LakeTelemetry(lake_root, create=create)
    store = Store(db, read_only=read_only, raw=raw)
    if not read_only:
        try:
            raw.ensure_tables(store.cursor())
        except duckdb.Error:
            store.close()
            raise
    return store
