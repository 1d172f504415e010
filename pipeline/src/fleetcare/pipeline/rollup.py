"""Hourly rollups of telemetry, built incrementally: the base every feature is read from.

``telemetry_hourly`` holds one row per GPU per clock hour (``hour`` = the hour's start,
covering samples with ``hour <= ts < hour + 1 h``). Every column is *mergeable*: counts,
sums, sums of squares, maxima, and the last value of each counter, so a window of any
number of hours is an exact aggregate of hourly rows.

Counters are cumulative and reset to 0 on a driver reload or GPU reset. An hour's
``<counter>_inc`` is the reset-aware sum of step increases: for each sample, ``value -
previous`` when the value did not drop, else ``value`` (a drop is a reset and the new
value is what accrued since). The previous value of an hour's first sample is the last
value of the GPU's newest earlier rollup row (looked up over ``BASELINE_LOOKBACK``); the
very first sample of a GPU contributes 0 (we cannot know when its count accrued). A null
sample (counter unsupported, or a failed read) is skipped: the next sample is compared
with the last non-null one. NVLink counters are summed over the links first and the sum
is treated as one counter (a driver reload or GPU reset zeroes every link together;
per-link lambdas cost 3x the whole rollup). ``<counter>_inc`` is null for an hour where
the counter is unsupported.

``refresh(store, until)`` rolls up only what arrived since the previous refresh. The
store lowers a *dirty since* mark (``store.DIRTY_SINCE_KEY``) to the oldest sample of
every insert, and the watermark (the newest ``until`` rolled up, kept in ``meta``) says
how far the rollups go: the unrolled samples are those newer than the watermark and
those inserted since (at or after the dirty mark). Per GPU, samples newer than its
newest rolled-up sample are *appended*: rolled up alone, with the GPU's state at that
sample as baseline, and merged into its last hourly row (every column is mergeable):
a cycle reads the new samples, not the hour so far. Telemetry that arrives late,
timestamped at or before a GPU's newest rolled-up sample (a spool replayed after a
broker outage, a node's samples out of order), is not missed: when the dirty mark is
at or before the watermark, each GPU's raw samples since the mark's hour are counted
against its hourly rows, and a GPU with more has its hours re-rolled from the first
such hour, so the result equals an in-order rollup (``tests/pipeline/
test_rollup_append.py``). The mark moves to ``PENDING_KEY`` while a refresh runs and is
cleared in the refresh's own transaction: a crash or error mid-refresh keeps it. The
first refresh, an ``until`` before the watermark and ``full=True`` re-roll every hour
from the oldest one concerned. Every insert is sorted by hour, so the table stays in
hour order and DuckDB's zone maps skip the row groups outside a query's hours
(``tests/pipeline/test_rollup_order.py``); a store rolled up in bulk before that keeps
its order until its next ``full=True`` refresh.

Counter semantics, case by case (``tests/pipeline/test_counter_semantics.py``):

- reset (a drop): the new value is what accrued since the reset;
- gap (no samples for hours): the increase across the gap lands in the first hour after
  it (a drop across the gap is a reset); hours without samples have no row;
- long gap (more than ``LONG_GAP``: the agent or the node was away): the first sample
  after it re-baselines and counts 0, risen or dropped. What accrued across it cannot be
  placed in time, and counting it as the first hour's errors would read a day of
  history as one bad hour;
- duplicate (same gpu_uuid, ts): dropped at insert by the natural key, the first copy wins;
- out of order / late: rows are ordered by ts inside a re-roll, and late rows re-roll
  their hours and every later one.

Raw telemetry before ``RAW_FROM_KEY`` (set by ``retention``) is gone: hours before it are
never rebuilt, and late samples older than it are ignored (logged).
"""

from __future__ import annotations

import datetime as dt
import logging

import duckdb

from fleetcare.pipeline.schema import MASK_LINKS, NVLINK_COUNTERS, down_mask_sql
from fleetcare.pipeline.store import DIRTY_SINCE_KEY, Store, has_column, replace_table

log = logging.getLogger(__name__)

TABLE = "telemetry_hourly"
WATERMARK_KEY = "features.rollup_until"
PENDING_KEY = "features.rollup_pending_from"
"""meta key: the dirty mark a running refresh took over (kept if it fails)."""
RAW_FROM_KEY = "telemetry.raw_complete_from"
"""meta key: the hour from which raw telemetry is complete (``retention`` sets it)."""
LONG_GAP = dt.timedelta(hours=6)
"""A first sample more than this after the previous one re-baselines (counts 0)."""
BASELINE_LOOKBACK = dt.timedelta(days=7)
"""How far back the previous value of a counter is looked for (older: first sample = 0)."""

SCALAR_COUNTERS = (
    "ecc_corrected_volatile", "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate", "ecc_uncorrected_aggregate",
    "retired_pages_sbe", "retired_pages_dbe",
    "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "pcie_replay_count",
)
LINK_COUNTERS = NVLINK_COUNTERS
FLAGS = ("remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending")

# nvmlClocksEventReason* bits
THERMAL_BITS = 0x20 | 0x40      # SW thermal slowdown | HW thermal slowdown
POWER_BITS = 0x80 | 0x4         # HW power brake | SW power cap
HW_SLOWDOWN_BITS = 0x8

DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
  hour TIMESTAMP NOT NULL,
  gpu_uuid VARCHAR NOT NULL,
  node VARCHAR, gpu_index BIGINT, pci_bus_id VARCHAR, model VARCHAR,
  n BIGINT, first_ts TIMESTAMP, last_ts TIMESTAMP,
  {", ".join(f"{c}_inc BIGINT, {c}_last BIGINT" for c in SCALAR_COUNTERS)},
  {", ".join(f"{c}_inc BIGINT, {c}_last BIGINT" for c in LINK_COUNTERS)},
  nvlink_down_mask_last BIGINT, nvlink_up_links_last BIGINT,
  nvlink_flaps BIGINT, nvlink_down_last BIGINT, nvlink_links BIGINT,
  {", ".join(f"{f}_last BOOLEAN" for f in FLAGS)},
  pcie_n BIGINT, pcie_width_down_n BIGINT, pcie_gen_down_n BIGINT,
  pcie_width_down_last BOOLEAN, pcie_gen_down_last BOOLEAN,
  gpu_temp_n BIGINT, gpu_temp_sum DOUBLE, gpu_temp_sumsq DOUBLE, gpu_temp_max DOUBLE,
  gpu_temp_last DOUBLE,
  mem_temp_n BIGINT, mem_temp_sum DOUBLE, mem_temp_max DOUBLE,
  power_n BIGINT, power_sum DOUBLE, util_n BIGINT, util_sum DOUBLE,
  thr_n BIGINT, thr_thermal_n BIGINT, thr_power_n BIGINT, thr_hw_n BIGINT
);
"""

_STATE_COLS = (
    [f"{c}_last" for c in SCALAR_COUNTERS]
    + [f"{c}_last" for c in LINK_COUNTERS]
    + ["nvlink_down_mask_last", "nvlink_up_links_last"]
)
_BASE_STATE = ", ".join(f"arg_max({c}, hour) AS {c[:-5]}" for c in _STATE_COLS)
"""Each counter's newest non-null value over a GPU's hourly rows: its state for the next
sample's increase."""


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    if has_column(con, TABLE, "nvlink_up_last"):
        # hourly rows of the layout before issue 15 §4 (each GPU's last NVLink up list):
        # the list becomes the mask of links down and the number of links
        replace_table(con, TABLE, DDL, lambda old: [
            f"INSERT INTO {TABLE} BY NAME SELECT * EXCLUDE (nvlink_up_last), "
            f"{down_mask_sql('nvlink_up_last')} AS nvlink_down_mask_last, "
            f"len(nvlink_up_last) AS nvlink_up_links_last FROM {old}"])
    con.execute(DDL).fetchall()


def _ts(value: dt.datetime) -> dt.datetime:
    """A timestamp as DuckDB stores it: naive UTC."""
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


def hour_floor(value: dt.datetime) -> dt.datetime:
    return value.replace(minute=0, second=0, microsecond=0)


def _inc(cur: str, prev: str) -> str:
    return (f"CASE WHEN {cur} IS NULL THEN NULL WHEN {prev} IS NULL THEN 0 "
            f"WHEN long_gap THEN 0 "
            f"WHEN {cur} >= {prev} THEN {cur} - {prev} ELSE {cur} END")


def rollup_sql(lo: str, hi: str, raw: str = "telemetry", *, base: str | None = None) -> str:
    """SELECT of hourly rows from raw telemetry with ``lo <= ts <= hi``.

    ``lo`` / ``hi`` are SQL expressions (parameters or literals); ``lo`` must be on an hour
    boundary. ``raw`` is the relation of raw samples (``store.raw.relation``). Baselines
    come from ``telemetry_hourly`` rows before ``lo``. Appending (``base``: a relation of
    each GPU's state at its newest rolled sample, ``_append_base``), ``raw`` holds only
    samples newer than every rolled-up sample of their GPU, and the result is the part of
    each hour those samples add (``merge_sql``).
    """
    raw_cols = ", ".join(
        [c for c in SCALAR_COUNTERS] + [f"{c}_total AS {c}" for c in LINK_COUNTERS]
        + ["nvlink_down_mask",
           "CASE WHEN nvlink_present & 1 = 1 THEN nvlink_links END AS nvlink_up_links"])
    prevs = ",\n      ".join(
        f"lag({c[:-5]} IGNORE NULLS) OVER w AS {c[:-5]}_prev" for c in _STATE_COLS
    )
    incs = ",\n  ".join(
        [f"sum({_inc(c, c + '_prev')}) AS {c}_inc, arg_max({c}, ts) AS {c}_last"
         for c in SCALAR_COUNTERS]
        + [f"sum({_inc(c, c + '_prev')}) AS {c}_inc, arg_max({c}, ts) AS {c}_last"
           for c in LINK_COUNTERS]
    )
    # links up at the previous sample and down at this one, of the links both have
    flaps = ("CASE WHEN nvlink_down_mask IS NULL THEN NULL "
             "WHEN nvlink_down_mask_prev IS NULL THEN 0 ELSE "
             "bit_count(nvlink_down_mask & ~nvlink_down_mask_prev & ((1::BIGINT << least("
             f"nvlink_up_links, nvlink_up_links_prev, {MASK_LINKS})) - 1)) END")
    flags = ", ".join(f"arg_max({f}, ts) AS {f}_last" for f in FLAGS)
    base_sql = f"SELECT *, TRUE AS is_base FROM {base}" if base else f"""
  SELECT gpu_uuid, max(last_ts) AS ts, {_BASE_STATE}, TRUE AS is_base
  FROM {TABLE}
  WHERE hour < {lo}
    AND hour >= {lo} - INTERVAL {int(BASELINE_LOOKBACK.total_seconds())} SECOND
  GROUP BY gpu_uuid"""
    return f"""
WITH fresh AS (
  SELECT ts, gpu_uuid, node, gpu_index, pci_bus_id, model, {raw_cols},
         {", ".join(FLAGS)}, pcie_link_width, pcie_link_width_max, pcie_link_gen,
         pcie_link_gen_max, gpu_temp_c, mem_temp_c, power_w, util_gpu_pct,
         clock_event_reasons, FALSE AS is_base
  FROM {raw} WHERE ts >= {lo} AND ts <= {hi}
),
base AS ({base_sql}),
raw AS (
  SELECT * FROM fresh
  UNION ALL BY NAME
  SELECT * FROM base
),
d AS (
  SELECT *,
      {prevs},
      ts - lag(ts) OVER w > INTERVAL {int(LONG_GAP.total_seconds())} SECOND AS long_gap,
      pcie_link_width < pcie_link_width_max AS width_down,
      pcie_link_gen < pcie_link_gen_max AS gen_down
  FROM raw
  WINDOW w AS (PARTITION BY gpu_uuid ORDER BY ts)
)
SELECT date_trunc('hour', ts) AS hour, gpu_uuid,
  arg_max(node, ts) AS node, arg_max(gpu_index, ts) AS gpu_index,
  arg_max(pci_bus_id, ts) AS pci_bus_id, arg_max(model, ts) AS model,
  count(*) AS n, min(ts) AS first_ts, max(ts) AS last_ts,
  {incs},
  arg_max(nvlink_down_mask, ts) AS nvlink_down_mask_last,
  arg_max(nvlink_up_links, ts) AS nvlink_up_links_last,
  sum({flaps}) AS nvlink_flaps,
  arg_max(bit_count(nvlink_down_mask), ts) AS nvlink_down_last,
  arg_max(nvlink_up_links, ts) AS nvlink_links,
  {flags},
  count(width_down) AS pcie_n, count_if(width_down) AS pcie_width_down_n,
  count_if(gen_down) AS pcie_gen_down_n,
  arg_max(width_down, ts) AS pcie_width_down_last, arg_max(gen_down, ts) AS pcie_gen_down_last,
  count(gpu_temp_c) AS gpu_temp_n, sum(gpu_temp_c) AS gpu_temp_sum,
  sum(gpu_temp_c * gpu_temp_c) AS gpu_temp_sumsq, max(gpu_temp_c) AS gpu_temp_max,
  arg_max(gpu_temp_c, ts) AS gpu_temp_last,
  count(mem_temp_c) AS mem_temp_n, sum(mem_temp_c) AS mem_temp_sum,
  max(mem_temp_c) AS mem_temp_max,
  count(power_w) AS power_n, sum(power_w) AS power_sum,
  count(util_gpu_pct) AS util_n, sum(util_gpu_pct) AS util_sum,
  count(clock_event_reasons) AS thr_n,
  count_if((clock_event_reasons & {THERMAL_BITS}) <> 0) AS thr_thermal_n,
  count_if((clock_event_reasons & {POWER_BITS}) <> 0) AS thr_power_n,
  count_if((clock_event_reasons & {HW_SLOWDOWN_BITS}) <> 0) AS thr_hw_n
FROM d WHERE NOT is_base
GROUP BY ALL
"""


_LAST_OF_HOUR = ("node", "gpu_index", "pci_bus_id", "model", "nvlink_links")
_SUMMED = ("n", "nvlink_flaps")


def _merge(col: str) -> str:
    """Column ``col`` of one GPU-hour from two parts of it, ``h`` (all its samples
    before those of ``p``; absent: all null) and ``p``: the value a rollup of all their
    samples gives (every column is mergeable)."""
    h, p = f"h.{col}", f"p.{col}"
    if col in _LAST_OF_HOUR or col.endswith("_last"):
        return f"coalesce({p}, {h})"  # the later part's value unless it has none
    if col.endswith("_max") or col == "last_ts":
        return f"greatest({h}, {p})"  # greatest and least skip nulls
    if col == "first_ts":
        return f"least({h}, {p})"
    if col in _SUMMED or col.endswith(("_inc", "_n", "_sum", "_sumsq")):
        # null only when both parts are null, as a sum over the samples
        return f"CASE WHEN {h} IS NULL THEN {p} WHEN {p} IS NULL THEN {h} ELSE {h} + {p} END"
    raise ValueError(f"{TABLE}.{col}: no merge rule; add one to rollup._merge")


def merge_sql(part: str, columns: list[str], lo: str) -> str:
    """SELECT of the rows of ``part`` (``TABLE``'s columns, one per GPU-hour, each after
    every sample rolled up for that GPU-hour) merged with the rolled-up rows of the same
    GPU-hour (hours from ``lo`` on)."""
    cols = ", ".join(f"{_merge(c)} AS {c}" for c in columns if c not in ("hour", "gpu_uuid"))
    return (f"SELECT p.hour, p.gpu_uuid, {cols} FROM {part} p "
            f"LEFT JOIN (SELECT * FROM {TABLE} WHERE hour >= {lo}) h "
            "ON h.hour = p.hour AND h.gpu_uuid = p.gpu_uuid")


def watermark(con: duckdb.DuckDBPyConnection) -> dt.datetime | None:
    return _meta_ts(con, WATERMARK_KEY)


def _meta_ts(con: duckdb.DuckDBPyConnection, key: str) -> dt.datetime | None:
    # every row read: a result left open makes DuckDB refuse the connection's next
    # register() or relation until it is fetched
    rows = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()
    return dt.datetime.fromisoformat(rows[0][0]) if rows else None


def dirty_since(con: duckdb.DuckDBPyConnection) -> dt.datetime | None:
    """The oldest sample ts not rolled up yet beyond the watermark's hour (None: none)."""
    marks = [m for m in (_meta_ts(con, DIRTY_SINCE_KEY), _meta_ts(con, PENDING_KEY)) if m]
    return min(marks, default=None)


def _take_dirty(store: Store) -> dt.datetime | None:
    """Move the store's dirty mark into ``PENDING_KEY``; returns the pending mark."""
    with store._lock, store.transaction() as cur:
        dirty = _meta_ts(cur, DIRTY_SINCE_KEY)
        pending = _meta_ts(cur, PENDING_KEY)
        marks = [m for m in (dirty, pending) if m is not None]
        if not marks:
            return None
        low = min(marks)
        cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [PENDING_KEY, low.isoformat()]).fetchall()
        cur.execute("DELETE FROM meta WHERE key = ?", [DIRTY_SINCE_KEY]).fetchall()
        return low


def _in_hour_order(select: str) -> str:
    """``select``'s rows sorted by hour, as a bulk insert should store them: DuckDB skips
    the row groups whose ``hour`` range misses a query's (zone maps), and a hash
    aggregate's output, GPU by GPU, would put every hour in every row group."""
    return f"SELECT * FROM ({select}) ORDER BY hour"


def refresh(store: Store, *, until: dt.datetime | None = None, full: bool = False) -> None:
    """Roll telemetry up to ``until`` (default: the newest sample) into ``telemetry_hourly``.

    Rolls up only the samples that arrived since the last refresh (``_append``), and
    re-rolls the hours of a GPU that got late samples; ``full=True`` rebuilds every hour
    that still has raw telemetry.
    """
    pending = _take_dirty(store)
    cur = store.cursor()
    try:
        ensure_tables(cur)
        oldest, newest = store.raw.bounds(cur)
        if until is None:
            if newest is None:
                return
            hi = newest
        else:
            hi = _ts(until)
        mark = None if full else watermark(cur)
        raw_from = _meta_ts(cur, RAW_FROM_KEY)
        if mark is not None and hi >= mark:
            since = min(mark, pending or mark)
            if raw_from is None or hour_floor(since) >= raw_from:
                _append(store, cur, hour_floor(since), mark, hi,
                        check=pending is not None and pending <= mark)
                return
        if mark is None:
            if oldest is None:
                return
            lo = hour_floor(min(oldest, hi))
        else:
            lo = hour_floor(min(mark, hi, pending or mark))
        if raw_from is not None and lo < raw_from:
            log.warning("features.rollup_too_late from=%s raw_complete_from=%s: samples "
                        "older than the retained raw telemetry are ignored", lo, raw_from)
            lo = raw_from
        cur.execute("BEGIN TRANSACTION").fetchall()
        try:
            cur.execute(f"DELETE FROM {TABLE} WHERE hour >= ?", [lo]).fetchall()
            raw = store.raw.relation(cur, lo, hi)
            added = cur.execute(
                f"INSERT INTO {TABLE} BY NAME {_in_hour_order(rollup_sql('$lo', '$hi', raw))}",
                {"lo": lo, "hi": hi}).fetchall()[0][0]
            _commit_mark(cur, hi)
        except BaseException:
            cur.execute("ROLLBACK").fetchall()
            raise
        log.info("features.rollup from=%s until=%s rows=%d", lo, hi, added)
    finally:
        cur.close()


def _commit_mark(cur: duckdb.DuckDBPyConnection, hi: dt.datetime) -> None:
    cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [WATERMARK_KEY, hi.isoformat()]).fetchall()
    cur.execute("DELETE FROM meta WHERE key = ?", [PENDING_KEY]).fetchall()
    cur.execute("COMMIT").fetchall()


def _append(store: Store, cur: duckdb.DuckDBPyConnection, lo: dt.datetime,
            mark: dt.datetime, hi: dt.datetime, *, check: bool) -> None:
    """Roll up the samples that arrived since the last refresh, in one transaction.

    Unrolled samples are those newer than the watermark ``mark`` and those inserted
    since the last refresh, which are all at or after the dirty mark; ``lo`` is the hour
    of the older of the two. Per GPU, the samples newer than its newest rolled-up one
    are *appended*: rolled up alone, with the GPU's state at that sample as baseline,
    and merged into the GPU's last hourly row (``merge_sql``): the rows a re-roll of the
    hour would give. With ``check`` (the dirty mark is at or before ``mark``), a GPU
    whose raw samples at or before its newest rolled one outnumber its rolled-up
    samples got late samples: its hours from the first such hour on are re-rolled, as
    ``refresh`` always did. Without it, no sample at or before ``mark`` is new.
    """
    lo_s, hi_s = _sql_ts(lo), _sql_ts(hi)
    raw = store.raw.relation(cur, lo, hi)
    cur.execute("BEGIN TRANSACTION").fetchall()
    try:
        if check:
            # each GPU's newest rolled sample since lo, and its first hour whose raw
            # samples up to that one are not all rolled up (late samples)
            cur.execute(f"""
                CREATE OR REPLACE TEMP TABLE _fc_rolled AS
                SELECT gpu_uuid, max(last_ts) AS upto FROM {TABLE}
                WHERE hour >= {lo_s} GROUP BY gpu_uuid""").fetchall()
            cur.execute(f"""
                CREATE OR REPLACE TEMP TABLE _fc_late AS
                WITH r AS (
                  SELECT t.gpu_uuid, date_trunc('hour', t.ts) AS hour, count(*) AS n
                  FROM {raw} t JOIN _fc_rolled s ON s.gpu_uuid = t.gpu_uuid
                  WHERE t.ts <= s.upto GROUP BY ALL),
                h AS (SELECT gpu_uuid, hour, n FROM {TABLE} WHERE hour >= {lo_s})
                SELECT gpu_uuid, min(hour) AS hour
                FROM r FULL OUTER JOIN h USING (gpu_uuid, hour)
                WHERE r.n IS DISTINCT FROM h.n GROUP BY gpu_uuid""").fetchall()
            late = cur.execute("SELECT count(*), min(hour) FROM _fc_late").fetchall()[0]
            fresh = (f"(SELECT t.* FROM {raw} t LEFT JOIN _fc_rolled s "
                     "ON s.gpu_uuid = t.gpu_uuid WHERE (s.upto IS NULL OR t.ts > s.upto) "
                     "AND t.gpu_uuid NOT IN (SELECT gpu_uuid FROM _fc_late))")
        else:
            late = (0, None)
            fresh = f"(SELECT * FROM {raw} WHERE ts > {_sql_ts(mark)})"
        _append_base(cur, fresh, lo_s)
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _fc_part AS "
                    f"{rollup_sql(lo_s, hi_s, fresh, base='_fc_base')}"
                    ).fetchall()
        cols = [r[0] for r in cur.execute(f"DESCRIBE {TABLE}").fetchall()]
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _fc_merged AS "
                    f"{merge_sql('_fc_part', cols, lo_s)}").fetchall()
        cur.execute(f"DELETE FROM {TABLE} h USING _fc_part p WHERE h.hour >= {lo_s} "
                    "AND p.hour = h.hour AND p.gpu_uuid = h.gpu_uuid").fetchall()
        added = cur.execute(f"INSERT INTO {TABLE} BY NAME "
                            f"{_in_hour_order('SELECT * FROM _fc_merged')}").fetchall()[0][0]
        rerolled = 0
        if late[0]:
            # re-roll the GPUs with late samples from their first late hour on
            from_hour = late[1]
            cur.execute(f"DELETE FROM {TABLE} WHERE hour >= ? AND gpu_uuid IN "
                        "(SELECT gpu_uuid FROM _fc_late)", [from_hour]).fetchall()
            late_raw = (f"(SELECT * FROM {store.raw.relation(cur, from_hour, hi)} "
                        "WHERE gpu_uuid IN (SELECT gpu_uuid FROM _fc_late))")
            rerolled = cur.execute(
                f"INSERT INTO {TABLE} BY NAME "
                f"{_in_hour_order(rollup_sql(_sql_ts(from_hour), hi_s, late_raw))}"
            ).fetchall()[0][0]
        _commit_mark(cur, hi)
    except BaseException:
        cur.execute("ROLLBACK").fetchall()
        raise
    finally:
        for t in ("_fc_rolled", "_fc_late", "_fc_part", "_fc_merged", "_fc_gpus", "_fc_base"):
            cur.execute(f"DROP TABLE IF EXISTS {t}").fetchall()
    log.info("features.rollup_append from=%s until=%s rows=%d late_gpus=%d rerolled=%d",
             lo, hi, added, late[0], rerolled)


def _append_base(cur: duckdb.DuckDBPyConnection, fresh: str, lo_s: str) -> None:
    """``_fc_base``: each appended GPU's state at its newest rolled-up sample — its newest
    rolled sample's ts and each state column's newest non-null value over
    ``BASELINE_LOOKBACK`` before ``lo_s`` (what ``rollup_sql``'s own base computes).

    The rows from ``lo_s`` on (the watermark's hour) hold it for almost every GPU and
    column, so they are read first; only a GPU with no row since then, or a column null
    in all of them, looks further back (per column: a counter the GPU never reports,
    such as retired pages on Ampere and later, is skipped by DuckDB's column statistics
    without reading the week). Reading the week for every column took 2 s a cycle at
    100,000 GPUs.
    """
    names = [c[:-5] for c in _STATE_COLS]
    back = f"{lo_s} - INTERVAL {int(BASELINE_LOOKBACK.total_seconds())} SECOND"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE _fc_gpus AS SELECT DISTINCT gpu_uuid FROM {fresh}"
                ).fetchall()
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE _fc_base AS
        SELECT gpu_uuid, max(last_ts) AS ts, {_BASE_STATE} FROM {TABLE}
        WHERE hour >= {lo_s} AND gpu_uuid IN (SELECT gpu_uuid FROM _fc_gpus)
        GROUP BY gpu_uuid""").fetchall()
    cur.execute(f"""INSERT INTO _fc_base
        SELECT gpu_uuid, max(last_ts) AS ts, {_BASE_STATE} FROM {TABLE}
        WHERE hour >= {back} AND hour < {lo_s} AND gpu_uuid IN (
          SELECT gpu_uuid FROM _fc_gpus WHERE gpu_uuid NOT IN (SELECT gpu_uuid FROM _fc_base))
        GROUP BY gpu_uuid""").fetchall()
    nulls = cur.execute("SELECT " + ", ".join(f"count(*) FILTER (WHERE {n} IS NULL)"
                                              for n in names) + " FROM _fc_base").fetchall()[0]
    for col, name, k in zip(_STATE_COLS, names, nulls, strict=True):
        if k:
            cur.execute(f"""UPDATE _fc_base b SET {name} = o.v FROM (
                SELECT gpu_uuid, arg_max({col}, hour) AS v FROM {TABLE}
                WHERE hour >= {back} AND hour < {lo_s} AND {col} IS NOT NULL
                  AND gpu_uuid IN (SELECT gpu_uuid FROM _fc_base WHERE {name} IS NULL)
                GROUP BY gpu_uuid) o
                WHERE b.gpu_uuid = o.gpu_uuid AND b.{name} IS NULL""").fetchall()


def _sql_ts(ts: dt.datetime) -> str:
    return f"TIMESTAMP '{_ts(ts).isoformat(sep=' ')}'"
