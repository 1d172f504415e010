"""Read-only SQL behind the API. Every function takes a DuckDB cursor and returns
plain JSON-ready values (ISO 'Z' timestamps, no NaN), so the HTTP layer stays thin.

Tables written by other components may not exist yet (a fresh database before the first
``fleetcare train``): readers treat a missing table as empty, never as an error.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from typing import Any

import duckdb

from fleetcare.pipeline.schema import SAMPLE_COLUMNS

log = logging.getLogger(__name__)

Cursor = duckdb.DuckDBPyConnection

# The score's latest row per node; risk made NULL when not finite (JSON has no NaN).
_LATEST_NODE_SCORES = """
SELECT node, CASE WHEN isfinite(risk) THEN risk END AS risk, reasons, top_gpu_uuid,
       ts, model_id
FROM node_scores
QUALIFY row_number() OVER (PARTITION BY node ORDER BY ts DESC) = 1
"""


def iso_z(ts: dt.datetime | None) -> str | None:
    """A DuckDB TIMESTAMP (naive, UTC) as ISO-8601 with 'Z' (microseconds when nonzero)."""
    if ts is None:
        return None
    if ts.tzinfo is not None:
        ts = ts.astimezone(dt.UTC).replace(tzinfo=None)
    return ts.isoformat() + "Z"


def epoch_s(ts: dt.datetime) -> float:
    """A DuckDB TIMESTAMP (naive, UTC) as Unix seconds."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.timestamp()


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value


def parse_json(raw: str | None, *, what: str) -> Any:
    """A JSON column's value (NaN becomes null); unparseable text is returned as is."""
    if raw is None:
        return None
    try:
        return finite(json.loads(raw))
    except ValueError:
        log.warning("api.bad_json column=%s value=%.80r", what, raw)
        return raw


def reasons(raw: str | None) -> list[str]:
    """The ``reasons`` column (a JSON list of sentences) as a list of strings."""
    value = parse_json(raw, what="reasons")
    if value is None:
        return []
    if isinstance(value, list):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    return [value if isinstance(value, str) else json.dumps(value)]


def existing_tables(cur: Cursor) -> set[str]:
    rows = cur.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = current_schema() "
        "AND database_name = current_database()"
    ).fetchall()
    return {r[0] for r in rows}


def _one(cur: Cursor, sql: str, params: list[Any] | None = None) -> Any:
    row = cur.execute(sql, params or []).fetchone()
    return row[0] if row else None


def simulated(cur: Cursor, tables: set[str]) -> bool:
    if "meta" not in tables:
        return False
    return _one(cur, "SELECT value FROM meta WHERE key = 'data_source'") == "simulated"


def latest_telemetry_ts(cur: Cursor, tables: set[str]) -> dt.datetime | None:
    return _one(cur, "SELECT max(ts) FROM telemetry") if "telemetry" in tables else None


def latest_score_ts(cur: Cursor, tables: set[str]) -> dt.datetime | None:
    return _one(cur, "SELECT max(ts) FROM node_scores") if "node_scores" in tables else None


def scored_node_count(cur: Cursor, tables: set[str]) -> int:
    if "node_scores" not in tables:
        return 0
    return int(_one(cur, "SELECT count(DISTINCT node) FROM node_scores"))


def _node_risk(row: tuple[Any, ...]) -> dict[str, Any]:
    node, risk, reasons_raw, top_gpu, ts, model_id = row
    return {
        "node": node,
        "risk": finite(risk),
        "reasons": reasons(reasons_raw),
        "top_gpu_uuid": top_gpu,
        "scored_at": iso_z(ts),
        "model_id": model_id,
    }


def ranked_nodes(cur: Cursor, tables: set[str], *, limit: int | None = None,
                 min_risk: float | None = None) -> list[dict[str, Any]]:
    """The latest score of each node, highest risk first (unscorable nodes last)."""
    if "node_scores" not in tables:
        return []
    rows = cur.execute(
        f"""SELECT * FROM ({_LATEST_NODE_SCORES})
        WHERE ?::DOUBLE IS NULL OR risk >= ?::DOUBLE
        ORDER BY risk DESC NULLS LAST, node
        {"" if limit is None else "LIMIT ?"}""",
        [min_risk, min_risk] + ([] if limit is None else [limit]),
    ).fetchall()
    return [_node_risk(r) for r in rows]


def node_detail(cur: Cursor, tables: set[str], node: str) -> dict[str, Any] | None:
    """The node's latest score and its GPUs (score + latest telemetry); None if unknown."""
    score = None
    if "node_scores" in tables:
        row = cur.execute(
            "SELECT node, CASE WHEN isfinite(risk) THEN risk END, reasons, top_gpu_uuid, ts, "
            "model_id FROM node_scores WHERE node = ? ORDER BY ts DESC LIMIT 1",
            [node],
        ).fetchone()
        score = _node_risk(row) if row else None

    gpus: dict[str, dict[str, Any]] = {}
    if "gpu_scores" in tables:
        rows = cur.execute(
            """SELECT gpu_uuid, gpu_index, model, CASE WHEN isfinite(risk) THEN risk END,
                      reasons, ts
            FROM gpu_scores WHERE node = ?
            QUALIFY row_number() OVER (PARTITION BY gpu_uuid ORDER BY ts DESC) = 1""",
            [node],
        ).fetchall()
        for uuid, index, model, risk, reasons_raw, ts in rows:
            gpus[uuid] = {
                "gpu_uuid": uuid, "gpu_index": index, "model": model, "risk": risk,
                "reasons": reasons(reasons_raw), "scored_at": iso_z(ts), "telemetry": None,
            }
    if "telemetry" in tables:
        cols = ", ".join(SAMPLE_COLUMNS)
        cur.execute(
            f"""SELECT {cols} FROM telemetry WHERE node = ?
            QUALIFY row_number() OVER (PARTITION BY gpu_uuid ORDER BY ts DESC) = 1""",
            [node],
        )
        for row in cur.fetchall():
            sample = dict(zip(SAMPLE_COLUMNS, row, strict=True))
            sample = finite(sample)
            sample["ts"] = iso_z(sample["ts"])
            gpu = gpus.setdefault(sample["gpu_uuid"], {
                "gpu_uuid": sample["gpu_uuid"], "gpu_index": sample["gpu_index"],
                "model": sample["model"], "risk": None, "reasons": [], "scored_at": None,
            })
            gpu["telemetry"] = sample

    if score is None and not gpus:
        return None
    if score is None:
        score = {"node": node, "risk": None, "reasons": [], "top_gpu_uuid": None,
                 "scored_at": None, "model_id": None}
    ordered = sorted(gpus.values(), key=lambda g: (
        g["gpu_index"] is None, g["gpu_index"] or 0, g["gpu_uuid"]))
    return {**score, "gpus": ordered}


def current_model(cur: Cursor, tables: set[str]) -> dict[str, Any] | None:
    """The registry row flagged ``is_current`` (newest if several); None if none."""
    if "models" not in tables:
        return None
    row = cur.execute(
        """SELECT model_id, created_at, horizon_h, features, params, metrics
        FROM models WHERE is_current ORDER BY created_at DESC NULLS LAST LIMIT 1"""
    ).fetchone()
    if row is None:
        return None
    model_id, created_at, horizon_h, features, params, metrics = row
    return {
        "model_id": model_id,
        "created_at": iso_z(created_at),
        "horizon_h": finite(horizon_h),
        "features": parse_json(features, what="models.features"),
        "params": parse_json(params, what="models.params"),
        "metrics": parse_json(metrics, what="models.metrics"),
    }
