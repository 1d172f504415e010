"""Labels: did this GPU / node fail within the horizon after time t.

- Failure incidents are the rows of ``incidents`` with kind = 'failure' (from the
  simulator's ground truth, operators, and, later, incidents derived from fatal XIDs and
  lost GPUs). Labels come from ``incidents`` only: an XID alone is never a label, and
  application XIDs (13, 31, 43, 45, ...) never become failures. Deriving failure
  incidents automatically from fatal XIDs is a separate, later piece of work.
- ``attach_labels(store, keys, horizon_h=24)``: for a table with at least
  (ts, node, gpu_uuid), returns it with added columns
    label        bool   a failure blamed on this GPU within (ts, ts + H]
    node_label   bool   any failure of this node within (ts, ts + H]
    failure_ts   timestamp|null  the first such node failure
    failure_mode varchar|null    its mode ('hbm', 'thermal', ..., 'none')
    failure_cause varchar|null   its cause (Table 5 name)
- ``failures(store, start, end)``: the failure incidents in ``[start, end)`` with their
  node, GPU, mode and cause, for lead-time and recall evaluation.

Timestamps are naive UTC, as the store keeps them; aware datetimes are converted.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from fleetcare.pipeline.store import Store

FAILURE_KIND = "failure"


def _naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def attach_labels(store: Store, keys: pa.Table, horizon_h: float = 24.0) -> pa.Table:
    if horizon_h <= 0:
        raise ValueError(f"horizon_h={horizon_h} must be a positive number of hours")
    missing = {"ts", "node", "gpu_uuid"} - set(keys.column_names)
    if missing:
        raise ValueError(f"keys lacks column(s) {sorted(missing)}; it needs ts, node, gpu_uuid")
    ts_type = keys.schema.field("ts").type
    if pa.types.is_timestamp(ts_type) and ts_type.tz is not None:
        keys = keys.set_column(keys.column_names.index("ts"), "ts",
                               keys.column("ts").cast(pa.timestamp("us", tz="UTC"))
                               .cast(pa.timestamp("us")))
    horizon_us = int(round(horizon_h * 3600 * 1e6))
    cur = store.cursor()
    try:
        cur.register("_fc_keys", pa.table({
            "_row": pa.array(range(keys.num_rows), pa.int64()),
            "ts": keys.column("ts"), "node": keys.column("node"),
            "gpu_uuid": keys.column("gpu_uuid"),
        }))
        out = cur.sql(f"""
            WITH k AS (SELECT _row, ts AS _ts, node AS _node,
                              gpu_uuid AS _gpu FROM _fc_keys),
            f AS (SELECT ts, node, gpu_uuid, mode, cause FROM incidents
                  WHERE kind = '{FAILURE_KIND}'),
            hits AS (
              SELECT k._row,
                bool_or(f.gpu_uuid IS NOT NULL AND f.gpu_uuid = k._gpu) AS label,
                min(f.ts) AS failure_ts,
                arg_min(coalesce(f.mode, 'none'), f.ts) AS failure_mode,
                arg_min(f.cause, f.ts) AS failure_cause
              FROM k JOIN f ON f.node = k._node AND f.ts > k._ts
                AND f.ts <= k._ts + to_microseconds({horizon_us})
              GROUP BY k._row
            )
            SELECT coalesce(hits.label, FALSE) AS label,
                   hits._row IS NOT NULL AS node_label,
                   hits.failure_ts, hits.failure_mode, hits.failure_cause
            FROM k LEFT JOIN hits USING (_row) ORDER BY k._row
        """).to_arrow_table()
    finally:
        cur.unregister("_fc_keys")
        cur.close()
    for name in out.column_names:
        keys = keys.append_column(name, out.column(name))
    return keys


def failures(store: Store, start: dt.datetime, end: dt.datetime) -> pa.Table:
    """Failure incidents with ``start <= ts < end``: ts, node, gpu_uuid, mode, cause, xid."""
    cur = store.cursor()
    try:
        return cur.sql(
            "SELECT ts, node, gpu_uuid, coalesce(mode, 'none') AS mode, cause, xid, source "
            f"FROM incidents WHERE kind = '{FAILURE_KIND}' "
            f"AND ts >= TIMESTAMP '{_naive(start).isoformat(sep=' ')}' "
            f"AND ts < TIMESTAMP '{_naive(end).isoformat(sep=' ')}' "
            "ORDER BY ts, node, gpu_uuid"
        ).to_arrow_table()
    finally:
        cur.close()
