"""Per-GPU features at scoring times, computed in DuckDB SQL.

The models and the API depend on exactly this interface:

- ``KEY_COLUMNS``: the columns that identify a row of features; every other column of a
  feature table is a float64 feature named in ``FEATURES``.
- ``refresh(store, until=None)``: bring the incremental rollups up to date (call after
  ingest; cheap when little is new).
- ``gpu_features(store, start, end, every_s=3600)``: one row per GPU per scoring time on
  a grid from ``start`` to ``end`` (aware UTC datetimes), for training and evaluation.
- ``latest_features(store, at=None)``: one row per GPU that reported within the last
  ``STALE_AFTER`` before ``at`` (default: the newest telemetry), for live scoring.
- ``FEATURES``: the catalogue (name, window, definition, unit), which also generates
  docs/features.md (``python -m fleetcare.pipeline.features > docs/features.md``).

How windows line up. Features read hourly rollups (``rollup.telemetry_hourly``). On the
training grid a scoring time ``t`` uses the hours before ``hour_floor(t)``: a window ``W``
is ``[hour_floor(t) - W, hour_floor(t))`` (for the usual hour-aligned grid, exactly the
``W`` before ``t``). Live, ``latest_features(at)`` uses the same full hours plus the
current partial hour ``[hour_floor(at), at]``, so its windows cover between ``W`` and
``W + 1 h``; at an hour boundary both agree exactly. The ``ts`` column is the scoring time
(naive UTC, as the store keeps timestamps); feature values are float64 and never null:
missing values are NaN (see ``feature_defs`` for the fill rules).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import uuid
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.pipeline import nic_rollup, rollup
from fleetcare.pipeline.feature_defs import (
    ERROR_BASES_24H,
    FEATURES,
    LEMON_DAYS,
    NIC_LINK_ERRORS,
    NIC_RCV_ERRORS,
    NODE_MAX_BASES,
    REL_BASES,
    SINCE_CAP_H,
    WINDOWS,
    XID_CLASSES,
    FeatureDef,
    now_sql,
    windowed_sql,
    xid_class,
)
from fleetcare.pipeline.store import Store, has_column

__all__ = ["FEATURES", "KEY_COLUMNS", "STALE_AFTER", "FeatureDef", "gpu_features",
           "latest_features", "refresh", "render_docs"]

log = logging.getLogger(__name__)

KEY_COLUMNS = ("ts", "node", "gpu_uuid", "gpu_index", "model")
STALE_AFTER = dt.timedelta(minutes=30)
FEATURE_NAMES = tuple(f.name for f in FEATURES)
_LOOKBACK_H = max(WINDOWS.values())


def refresh(store: Store, *, until: dt.datetime | None = None) -> None:
    """Roll up telemetry to ``until`` (default: the newest sample); see ``rollup``. NIC
    port samples are rolled up too (``nic_rollup``; the ``node_nic_*`` features read it)."""
    rollup.refresh(store, until=until)
    nic_rollup.refresh(store)


# -- SQL pieces ----------------------------------------------------------------------------

def _lit(ts: dt.datetime) -> str:
    return f"TIMESTAMP '{rollup._ts(ts).isoformat(sep=' ')}'"


def _bus(expr: str) -> str:
    """PCI bus:device of a bus id, lower case: '00000000:3B:00.0' and '0000:3b:00' → '3b:00'."""
    return f"regexp_extract(lower({expr}), '([0-9a-f]{{2}}:[0-9a-f]{{2}})(\\.[0-9a-f]+)?$', 1)"


_DERIVED = """
  coalesce(ecc_corrected_volatile_inc, ecc_corrected_aggregate_inc) AS ecc_c,
  coalesce(ecc_uncorrected_volatile_inc, ecc_uncorrected_aggregate_inc) AS ecc_u,
  remapped_rows_correctable_inc + remapped_rows_uncorrectable_inc AS remap,
  retired_pages_sbe_inc + retired_pages_dbe_inc AS retired,
  pcie_replay_count_inc AS pcie_replay,
  nvlink_crc_flit_inc + nvlink_crc_data_inc AS nvl_crc,
  nvlink_replay_inc AS nvl_replay, nvlink_recovery_inc AS nvl_recovery,
  gpu_temp_sum / nullif(gpu_temp_n, 0) AS temp_h,
  epoch(hour) / 3600.0 AS xh"""


def _xid_buckets(key: str) -> str:
    cols = ", ".join(f"count_if(cls = '{c}') AS xid_{c}" for c in XID_CLASSES)
    return f"SELECT {key}, date_trunc('hour', ts) AS hour, {cols} FROM xev GROUP BY ALL"


def _ident(rows: str = "src", name: str = "ident") -> str:
    """The CTE ``name`` (default ``ident``): each GPU's newest identity over the hourly
    ``rows``."""
    return f"""
{name} AS (
  SELECT gpu_uuid, arg_max(node, hour) AS node, arg_max(gpu_index, hour) AS gpu_index,
         arg_max({_bus('pci_bus_id')}, hour) AS bus
  FROM {rows} GROUP BY gpu_uuid
)"""


def _xev(lo: str, hi_cond: str, ident: str | None = None) -> str:
    """XID events with their GPU resolved (uuid, else PCI bus on the node, else index).

    ``ident`` is a CTE ``ident(gpu_uuid, node, gpu_index, bus)``: each GPU's newest
    identity (by default over ``src``)."""
    return f"""{ident or _ident()},
ib AS (SELECT node, bus, min(gpu_uuid) AS gpu_uuid FROM ident GROUP BY node, bus),
ii AS (SELECT node, gpu_index, min(gpu_uuid) AS gpu_uuid FROM ident GROUP BY node, gpu_index),
xev AS (
  SELECT e.ts, e.node, coalesce(e.gpu_uuid, ib.gpu_uuid, ii.gpu_uuid) AS gpu_uuid,
         coalesce(m.cls, 'other') AS cls
  FROM xid_events e
  LEFT JOIN xmap m ON m.xid = e.xid
  LEFT JOIN ib ON ib.node = e.node AND ib.bus = {_bus('e.pci_bus_id')}
  LEFT JOIN ii ON ii.node = e.node AND ii.gpu_index = e.gpu_index
  WHERE e.ts >= {lo} AND {hi_cond}
),
xb AS ({_xid_buckets('gpu_uuid')})"""


def _window_agg(fn: str, expr: str, w: str) -> str:
    return f"{fn}({expr}) OVER w_{w}"


def _tele_window(source: str, lo: str, hi: str) -> str:
    """Training grid: dense GPU x hour rows, window frames ending at hour te - 1 h."""
    windows = ", ".join(
        f"w_{w} AS (PARTITION BY gpu_uuid ORDER BY hour ROWS BETWEEN {h - 1} PRECEDING "
        "AND CURRENT ROW)" for w, h in WINDOWS.items())
    feats = ",\n    ".join(f"{sql} AS {name}" for name, sql in windowed_sql(_window_agg))
    now = ",\n    ".join(f"arg_max({sql}, hour) OVER w_7d AS {name}" for name, sql in now_sql())
    return f"""
src AS (SELECT * FROM {source} WHERE hour >= {lo} AND hour < {hi}),
{_xev(f"{lo} - INTERVAL {LEMON_DAYS * 24 - _LOOKBACK_H} HOUR", f"e.ts < {hi}")},
dense AS (
  SELECT g.gpu_uuid, r.hour FROM (SELECT DISTINCT gpu_uuid FROM src) g
  CROSS JOIN (SELECT unnest(range({lo}, {hi}, INTERVAL 1 HOUR)) AS hour) r
),
h AS (
  SELECT d.gpu_uuid, d.hour, s.* EXCLUDE (gpu_uuid, hour), x.* EXCLUDE (gpu_uuid, hour)
  FROM dense d
  LEFT JOIN src s ON s.gpu_uuid = d.gpu_uuid AND s.hour = d.hour
  LEFT JOIN xb x ON x.gpu_uuid = d.gpu_uuid AND x.hour = d.hour
),
h2 AS (SELECT *, {_DERIVED} FROM h),
w AS (
  SELECT gpu_uuid, hour + INTERVAL 1 HOUR AS te,
    arg_max(node, hour) OVER w_7d AS node, arg_max(gpu_index, hour) OVER w_7d AS gpu_index,
    arg_max(model, hour) OVER w_7d AS model, max(last_ts) OVER w_7d AS last_seen,
    {feats},
    {now}
  FROM h2
  WINDOW {windows}
),
tele AS (
  SELECT g.ts, w.* FROM grid g JOIN w ON w.te = g.te
  WHERE w.last_seen >= w.te - INTERVAL {int(STALE_AFTER.total_seconds())} SECOND
)"""


def _nic_sql(nic: str) -> str:
    """CTEs ``nic_nodes`` (nodes with NIC ports in the scored period) and ``nic`` (the
    ``node_nic_*`` features per scoring time and node) from the hourly NIC rollup ``nic``.

    A scoring time ``te`` reads the 24 hours before ``hour_ceil(te)``: on the grid (``te``
    on the hour) the 24 full hours before it, live the 23 before the current one and the
    current partial hour, as the GPU windows do. Only node-hours with something to count
    are joined (most have none)."""
    plus = " + ".join
    link = plus(f"coalesce({c}_inc, 0)" for c in NIC_LINK_ERRORS)
    rcv = plus(f"coalesce({c}_inc, 0)" for c in NIC_RCV_ERRORS)
    span = ("hour >= (SELECT min(te) FROM tele) - INTERVAL 25 HOUR "
            "AND hour <= (SELECT max(te) FROM tele)")
    return f""",
nic_nodes AS (SELECT DISTINCT node FROM {nic} WHERE {span}),
nich AS (
  SELECT node, hour, sum(flaps) AS f, sum({link}) AS le, sum({rcv}) AS re,
         min(min_rate_gbps) / nullif(max(max_rate_gbps), 0) AS rr
  FROM {nic} WHERE {span} GROUP BY node, hour
  HAVING sum(flaps) > 0 OR sum({link}) > 0 OR sum({rcv}) > 0
      OR min(min_rate_gbps) < max(max_rate_gbps)
),
nk AS (SELECT DISTINCT te, node,
         date_trunc('hour', te - INTERVAL 1 MICROSECOND) + INTERVAL 1 HOUR AS tn FROM tele),
nic AS (
  SELECT nk.te, nk.node, sum(f) AS node_nic_flaps_24h, sum(le) AS node_nic_link_errors_24h,
    sum(re) AS node_nic_rcv_errors_24h, min(rr) AS node_nic_rate_ratio_24h
  FROM nk JOIN nich ON nich.node = nk.node AND nich.hour >= nk.tn - INTERVAL 24 HOUR
                   AND nich.hour < nk.tn
  GROUP BY ALL
)"""


def _nic_select() -> str:
    def pick(name: str, empty: str) -> str:
        return (f"CASE WHEN nn.node IS NULL THEN NULL ELSE coalesce(nic.{name}, {empty}) "
                f"END AS {name}")
    return ",\n    ".join([pick("node_nic_flaps_24h", "0"),
                            pick("node_nic_link_errors_24h", "0"),
                            pick("node_nic_rcv_errors_24h", "0"),
                            pick("node_nic_rate_ratio_24h", "1.0")])


PEER_COLUMNS = (*(f"{m}_{w}" for w in ("1h", "24h") for m in ("gpu_temp_mean", "power_mean")),
                *(b for b, _ in REL_BASES))
"""The features each GPU is compared with its peers on (same model, same scoring time):
the temperature-vs-power fit and the fleet medians (``peer_stats_sql``)."""


def peer_stats_sql() -> str:
    """The peer context of one group of GPUs (one model at one scoring time), as aggregates
    over ``PEER_COLUMNS``: the temperature-vs-power fit per window (``fb``, ``fa``, ``fm``)
    and the median of each fleet-relative base (``med_``)."""
    fit = ", ".join(
        f"regr_slope(gpu_temp_mean_{w}, power_mean_{w}) AS fb_{w}, "
        f"regr_intercept(gpu_temp_mean_{w}, power_mean_{w}) AS fa_{w}, "
        f"avg(gpu_temp_mean_{w}) AS fm_{w}" for w in ("1h", "24h"))
    # DOUBLE: the live base's sums come back from Arrow as DECIMAL(38,0), whose median
    # of an even count drops the half that the training grid's median keeps
    return fit + ", " + ", ".join(f"median(CAST({b} AS DOUBLE)) AS med_{b}"
                                  for b, _ in REL_BASES)


def _tail(since_op: str | None, nic: str = nic_rollup.TABLE, peers: str | None = None) -> str:
    """Joins and fleet context shared by both modes; reads ``tele`` and ``xev``, and the
    hourly NIC rollup ``nic`` (``nic_source``).

    ``since_op`` compares a scoring time with an XID's ts on the grid (``>``: the hours
    before the scoring hour); ``None`` is live scoring, one scoring time that every XID
    of ``xev`` is at or before: each GPU's newest XID per class is then a plain
    aggregate joined once, instead of one ASOF join per class, each sorting the wide
    feature rows.

    ``peers`` (live only): a relation holding ``PEER_COLUMNS`` per GPU model, computed over
    the whole fleet (``live_features.peers_sql``), for a ``tele`` of some nodes only;
    by default the peers are ``tele``'s own GPUs.
    """
    if since_op is None:
        last = ", ".join(f"max(ts) FILTER (WHERE cls = '{c}') AS ts_{c}" for c in XID_CLASSES)
        asof = (f"LEFT JOIN (SELECT gpu_uuid, {last} FROM xev GROUP BY gpu_uuid) xl "
                "ON t.gpu_uuid = xl.gpu_uuid")
        at = {c: f"xl.ts_{c}" for c in XID_CLASSES}
    else:
        asof = "\n  ".join(
            f"ASOF LEFT JOIN (SELECT gpu_uuid, ts AS ts_{c} FROM xev WHERE cls = '{c}') a_{c} "
            f"ON t.gpu_uuid = a_{c}.gpu_uuid AND t.te {since_op} a_{c}.ts_{c}"
            for c in XID_CLASSES)
        at = {c: f"a_{c}.ts_{c}" for c in XID_CLASSES}
    since = ",\n    ".join(
        f"least({SINCE_CAP_H}, coalesce(epoch(t.te - {at[c]}) / 3600.0, {SINCE_CAP_H}))"
        f" AS xid_{c}_hours_since" for c in XID_CLASSES)
    nx_cols = ", ".join(f"sum(xid_{c}) AS node_xid_{c}_24h" for c in XID_CLASSES)
    nx_sel = ", ".join(f"coalesce(nx.node_xid_{c}_24h, 0) AS node_xid_{c}_24h"
                       for c in XID_CLASSES)
    rels = ", ".join(f"{b} / (med_{b} + {eps}) AS {b}_rel" for b, eps in REL_BASES)
    resid = ", ".join(
        f"gpu_temp_mean_{w} - coalesce(CASE WHEN isfinite(fa_{w} + fb_{w} * power_mean_{w}) "
        f"THEN fa_{w} + fb_{w} * power_mean_{w} END, fm_{w}) AS gpu_temp_resid_{w}"
        for w in ("1h", "24h"))
    node_max = ", ".join(f"max({b}) AS node_max_{b}" for b in NODE_MAX_BASES)
    err = " OR ".join(
        [f"coalesce({b}, 0) > 0" for b in ERROR_BASES_24H]
        + [f"xid_{c}_24h > 0" for c in XID_CLASSES if c != "application"])
    peer_rows = (f"SELECT te, model, {peer_stats_sql()} FROM j2 GROUP BY te, model"
                 if peers is None else
                 f"SELECT k.te, p.* FROM (SELECT DISTINCT te FROM j2) k CROSS JOIN {peers} p")
    return _nic_sql(nic) + f""",
nxb AS ({_xid_buckets('node')}),
nx AS (
  SELECT k.te, k.node, {nx_cols}
  FROM (SELECT DISTINCT te, node FROM tele) k
  JOIN nxb ON nxb.node = k.node AND nxb.hour >= date_trunc('hour', k.te) - INTERVAL 24 HOUR
          AND nxb.hour < k.te
  GROUP BY ALL
),
lem AS (
  SELECT k.te, k.gpu_uuid,
    count(*) FILTER (WHERE i.kind = 'failure') AS node_failures_28d,
    count(*) FILTER (WHERE i.kind = 'failure' AND i.gpu_uuid = k.gpu_uuid) AS gpu_failures_28d,
    count(*) FILTER (WHERE i.kind IN ('repair', 'rma')) AS node_repairs_28d,
    max(i.ts) FILTER (WHERE i.kind = 'failure') AS last_failure,
    max(i.ts) FILTER (WHERE i.kind IN ('repair', 'rma')) AS last_repair
  FROM (SELECT DISTINCT te, node, gpu_uuid FROM tele) k
  JOIN incidents i ON i.node = k.node AND i.ts >= k.te - INTERVAL {LEMON_DAYS} DAY
                  AND i.ts < k.te
  GROUP BY ALL
),
j AS (
  SELECT t.*, epoch(t.te - t.last_seen) / 3600.0 AS hours_since_sample,
    {since}
  FROM tele t
  {asof}
),
j2 AS (
  SELECT j.*, {nx_sel},
    coalesce(lem.gpu_failures_28d, 0) AS gpu_failures_28d,
    coalesce(lem.node_failures_28d, 0) AS node_failures_28d,
    coalesce(lem.node_repairs_28d, 0) AS node_repairs_28d,
    least({SINCE_CAP_H}, coalesce(epoch(j.te - lem.last_failure) / 3600.0, {SINCE_CAP_H}))
      AS node_failure_hours_since,
    least({SINCE_CAP_H}, coalesce(epoch(j.te - lem.last_repair) / 3600.0, {SINCE_CAP_H}))
      AS node_repair_hours_since,
    {_nic_select()}
  FROM j
  LEFT JOIN nx ON nx.te = j.te AND nx.node = j.node
  LEFT JOIN lem ON lem.te = j.te AND lem.gpu_uuid = j.gpu_uuid
  LEFT JOIN nic_nodes nn ON nn.node = j.node
  LEFT JOIN nic ON nic.te = j.te AND nic.node = j.node
),
peers AS ({peer_rows}),
fit AS (
  SELECT j2.*, peers.* EXCLUDE (te, model) FROM j2
  LEFT JOIN peers ON peers.te = j2.te AND peers.model IS NOT DISTINCT FROM j2.model
),
rel AS (SELECT *, {resid}, {rels} FROM fit),
nodes AS (
  SELECT te, node, {node_max},
    count_if({err}) AS node_gpus_with_errors_24h, count(*) AS node_gpus
  FROM rel GROUP BY te, node
),
final AS (
  SELECT rel.*, nodes.* EXCLUDE (te, node) FROM rel
  LEFT JOIN nodes ON nodes.te = rel.te AND nodes.node IS NOT DISTINCT FROM rel.node
)
SELECT ts, node, gpu_uuid, gpu_index, model,
  {", ".join(f"CAST({f} AS DOUBLE) AS {f}" for f in FEATURE_NAMES)}
FROM final ORDER BY ts, node, gpu_index, gpu_uuid
"""


# -- running -------------------------------------------------------------------------------

def nic_source(cur: duckdb.DuckDBPyConnection) -> str:
    """The hourly NIC rollup to read: ``nic_hourly``, or an empty relation of its shape
    when ``nic_rollup.refresh`` never ran on this store (nothing is created here: the
    store may be opened read-only)."""
    if has_column(cur, nic_rollup.TABLE, "flaps"):
        return nic_rollup.TABLE
    return f"({nic_rollup.rollup_sql('false')})"


def _register_xmap(cur: duckdb.DuckDBPyConnection) -> None:
    xids = [r[0] for r in cur.execute(
        "SELECT DISTINCT xid FROM xid_events WHERE xid IS NOT NULL").fetchall()]
    cur.register("xmap", pa.table({
        "xid": pa.array(xids, pa.int64()),
        "cls": pa.array([xid_class(x) for x in xids], pa.string()),
    }))


def _source(store: Store, cur: duckdb.DuckDBPyConnection, until: dt.datetime, *,
            exact: bool) -> str:
    """The hourly rows holding all telemetry up to ``until`` (exactly ``until`` when exact).

    Uses ``telemetry_hourly`` as far as ``refresh`` built it and rolls the rest up on the
    fly into a temporary table, without changing the stored rollups.
    """
    rollup.ensure_tables(cur)
    mark = rollup.watermark(cur)
    if mark is not None and (mark == until or (not exact and mark >= until)):
        return rollup.TABLE
    if mark is not None:
        lo = rollup.hour_floor(min(mark, until))
    else:
        oldest = store.raw.bounds(cur)[0]
        lo = rollup.hour_floor(min(oldest or until, until))
        log.warning("features.no_rollup until=%s: rolling up all telemetry on the fly; "
                    "call features.refresh(store) after ingest", until)
    tmp = f"_fc_hourly_{uuid.uuid4().hex[:12]}"
    raw = store.raw.relation(cur, lo, until)
    cur.execute(f"CREATE TEMP TABLE {tmp} AS {rollup.rollup_sql(_lit(lo), _lit(until), raw)}"
                ).fetchall()
    return (f"(SELECT * FROM {rollup.TABLE} WHERE hour < {_lit(lo)} "
            f"UNION ALL BY NAME SELECT * FROM {tmp})")


def _finish(table: pa.Table) -> pa.Table:
    """Features as float64 with NaN, never null."""
    cols = []
    for name in table.column_names:
        col = table.column(name)
        if name not in KEY_COLUMNS:
            col = pc.fill_null(col.cast(pa.float64()), np.nan)
        cols.append(col)
    return pa.table(cols, names=table.column_names)


def gpu_features(store: Store, start: dt.datetime, end: dt.datetime, *,
                 every_s: int = 3600) -> pa.Table:
    """One row per reporting GPU per scoring time ``start, start + every_s, ... <= end``.

    A scoring time ``t`` sees the data before ``hour_floor(t)`` (see the module doc).
    """
    if every_s <= 0:
        raise ValueError(f"every_s={every_s} must be a positive number of seconds")
    if end < start:
        raise ValueError(f"end {end} is before start {start}: pass start <= end")
    start_n, end_n = rollup._ts(start), rollup._ts(end)
    times = []
    t = start_n
    while t <= end_n:
        times.append(t)
        t += dt.timedelta(seconds=every_s)
    grid = pa.table({
        "ts": pa.array(times, pa.timestamp("us")),
        "te": pa.array([rollup.hour_floor(x) for x in times], pa.timestamp("us")),
    })
    lo = _lit(rollup.hour_floor(start_n) - dt.timedelta(hours=_LOOKBACK_H))
    hi = _lit(rollup.hour_floor(end_n))

    def sql(source: str) -> str:
        return "WITH " + _tele_window(source, lo, hi) + _tail(">", nic_source(cur))

    cur = store.cursor()
    try:
        source = _source(store, cur, rollup.hour_floor(end_n), exact=False)
        _register_xmap(cur)
        cur.register("grid", grid)
        return _finish(cur.sql(sql(source)).to_arrow_table())
    finally:
        cur.close()


def latest_features(store: Store, at: dt.datetime | None = None, *,
                    nodes: Sequence[str] | None = None) -> pa.Table:
    """One row per GPU that reported within ``STALE_AFTER`` before ``at`` (default: newest);
    with ``nodes``, only those nodes' rows (the same values, compared with the whole fleet).

    Computed by ``live_features``: the windows' older hours come from a per-GPU base
    built once per clock hour, the newest hours are aggregated on each call.
    """
    from fleetcare.pipeline import live_features  # it builds on this module's SQL pieces

    return live_features.latest(store, at, nodes=nodes)


# -- docs ----------------------------------------------------------------------------------

def render_docs() -> str:
    """The content of docs/features.md."""
    lines = [
        "# Feature catalogue",
        "",
        "<!-- Generated by `python -m fleetcare.pipeline.features > docs/features.md`;"
        " do not edit. -->",
        "",
        "One row per GPU per scoring time; key columns: "
        + ", ".join(f"`{k}`" for k in KEY_COLUMNS) + ". Every feature is float64; NaN "
        "means not available (a counter the GPU does not support, or no samples). Counts "
        "are 0 when the counter exists and nothing happened.",
        "",
        "Windows end at the scoring time: on the training grid a window `W` is the `W` of "
        "full hours before the hour of the scoring time; live scoring adds the current "
        "partial hour. Counters are reset-aware: a drop is a reset, the new value counts "
        "as the increase. XID classes come from `fleetcare.collectors.xid`.",
        "",
        f"{len(FEATURES)} features.",
        "",
        "| name | window | unit | definition |",
        "|---|---|---|---|",
    ]
    for f in FEATURES:
        lines.append(f"| `{f.name}` | {f.window} | {f.unit} | {f.definition} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_docs())
