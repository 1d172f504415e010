"""Raw telemetry, wherever it lives: the one owner of reads of raw GPU samples.

Raw samples have two homes, one per production shape, behind one seam (``RawTelemetry``):

- ``TableTelemetry``: the ``telemetry`` table of the store's own DuckDB file (one host:
  ``fleetcare ingest --db`` or ``serve --bus`` write it);
- ``fleetcare.pipeline.lake_feed.LakeTelemetry``: the Parquet lake that scale-out
  ``fleetcare ingest --lake`` workers write; the service's state DB keeps which files it
  has read and each GPU's newest sample.

Everything that reads raw samples (rollups, on-the-fly features, the DCGM baseline,
retention, the API's newest sample per GPU) asks ``store.raw``; nothing else names the
``telemetry`` table. A relation is SQL text usable after ``FROM``: the samples as the
``telemetry`` table stores them (``schema.STORED_SAMPLE_COLUMNS``: the contract's scalar
columns, and per sample the NVLink lists summarised: which lists were sent, the number
of links, a bit per link down, each counter's total over the links), one row per natural
key, ``lo <= ts <= hi``. Whole samples, lists included, come from ``latest_samples``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

import duckdb

from fleetcare.pipeline.schema import SAMPLE_COLUMNS, contract_samples_sql

Cursor = duckdb.DuckDBPyConnection


def naive_utc(ts: dt.datetime) -> dt.datetime:
    """A timestamp as DuckDB stores it: naive UTC."""
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def sql_ts(ts: dt.datetime) -> str:
    """A SQL TIMESTAMP literal of ``ts`` (naive UTC)."""
    return f"TIMESTAMP '{naive_utc(ts).isoformat(sep=' ')}'"


def gpu_filter(node: str | None, gpu_uuid: str | None,
               alias: str = "") -> tuple[str, list[Any]]:
    """The WHERE condition choosing one GPU, one node's GPUs, or all."""
    if gpu_uuid is not None:
        return f"{alias}gpu_uuid = ?", [gpu_uuid]
    if node is not None:
        return f"{alias}node = ?", [node]
    return "TRUE", []


class RawTelemetry(Protocol):
    """Where a store's raw samples are read from (see the module docstring)."""

    kind: str  # "table" | "lake"

    def bounds(self, cur: Cursor) -> tuple[dt.datetime | None, dt.datetime | None]:
        """(oldest, newest) sample ts held (naive UTC), (None, None) when empty."""
        ...

    def relation(self, cur: Cursor, lo: dt.datetime, hi: dt.datetime) -> str:
        """The samples with ``lo <= ts <= hi`` as a SQL relation."""
        ...

    def count_before(self, cur: Cursor, cutoff: dt.datetime | None) -> tuple[int, int]:
        """(samples before ``cutoff``, samples in all); cutoff None counts none before."""
        ...

    def delete_before(self, cur: Cursor, cutoff: dt.datetime) -> int:
        """Delete the samples before ``cutoff`` (an hour boundary); returns rows deleted.
        ``cur`` is inside the caller's transaction."""
        ...

    def latest_samples(self, cur: Cursor, *, node: str | None = None,
                       gpu_uuid: str | None = None,
                       since: dt.datetime | None = None) -> list[dict[str, Any]]:
        """The newest sample of each GPU (of ``node`` / the one ``gpu_uuid``), as dicts
        of ``SAMPLE_COLUMNS``. ``since``: the caller needs only GPUs with a sample at or
        after it, so a source may read just that stretch (the table: its zone maps skip
        older row groups, a bounded read however long raw data is kept); GPUs whose
        newest sample is older may or may not be returned."""
        ...


class TableTelemetry:
    """Raw samples in the store's ``telemetry`` table (``schema.DDL``)."""

    kind = "table"

    def bounds(self, cur: Cursor) -> tuple[dt.datetime | None, dt.datetime | None]:
        lo, hi = cur.execute("SELECT min(ts), max(ts) FROM telemetry").fetchall()[0]
        return lo, hi

    def relation(self, cur: Cursor, lo: dt.datetime, hi: dt.datetime) -> str:
        return (f"(SELECT * FROM telemetry WHERE ts >= {sql_ts(lo)} "
                f"AND ts <= {sql_ts(hi)})")

    def count_before(self, cur: Cursor, cutoff: dt.datetime | None) -> tuple[int, int]:
        total = cur.execute("SELECT count(*) FROM telemetry").fetchall()[0][0]
        if cutoff is None:
            return 0, int(total)
        n = cur.execute("SELECT count(*) FROM telemetry WHERE ts < ?", [cutoff]).fetchall()[0][0]
        return int(n), int(total)

    def delete_before(self, cur: Cursor, cutoff: dt.datetime) -> int:
        cur.execute("DELETE FROM telemetry_nvlink WHERE ts < ?", [cutoff]).fetchall()
        return int(cur.execute("DELETE FROM telemetry WHERE ts < ?", [cutoff]).fetchall()[0][0])

    def latest_samples(self, cur: Cursor, *, node: str | None = None,
                       gpu_uuid: str | None = None,
                       since: dt.datetime | None = None) -> list[dict[str, Any]]:
        where, params = gpu_filter(node, gpu_uuid)
        if since is not None:
            where += f" AND ts >= {sql_ts(since)}"
        # each GPU's newest ts from the narrow columns, then only those rows in full:
        # converting every wide row (NVLink lists) to Python cost more than the scan
        newest = cur.execute(f"SELECT gpu_uuid, max(ts) FROM telemetry WHERE {where} "
                             "GROUP BY gpu_uuid", params).fetchall()
        if not newest:
            return []
        stamps = sorted({ts for _, ts in newest})
        want = set(newest)
        t_where, _ = gpu_filter(node, gpu_uuid, alias="t.")
        found = cur.execute(
            contract_samples_sql(f"{t_where} AND list_contains(?, t.ts)",
                                 since=sql_ts(stamps[0]))
            + " ORDER BY t.gpu_index, t.gpu_uuid", params + [stamps]).fetchall()
        uuid_at, ts_at = SAMPLE_COLUMNS.index("gpu_uuid"), SAMPLE_COLUMNS.index("ts")
        rows, seen = [], set()
        for r in found:
            if (r[uuid_at], r[ts_at]) in want and r[uuid_at] not in seen:
                seen.add(r[uuid_at])
                rows.append(r)
        return [dict(zip(SAMPLE_COLUMNS, r, strict=True)) for r in rows]
