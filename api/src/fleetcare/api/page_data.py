"""The reads only the dashboard's pages need (the API's own reads are in ``queries``):
risk bands, a node's XIDs, incidents and drain audit trail, the model registry, and the
goodput the drains are expected to have saved.

Like ``queries``, every function takes a cursor and the set of existing tables, and
treats a missing table as empty.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from fleetcare.api.queries import MODEL_PROVENANCE, finite, iso_z, parse_json, select_columns
from fleetcare.models.goodput import CostModel

Cursor = duckdb.DuckDBPyConnection


def risk_bands(cur: Cursor, tables: set[str]) -> dict[str, int]:
    """Nodes per risk band (``html.BANDS``) of their latest score."""
    out = {"high": 0, "mid": 0, "low": 0, "unscored": 0}
    if "node_scores" not in tables:
        return out
    rows = cur.execute(
        "SELECT CASE WHEN NOT isfinite(risk) OR risk IS NULL THEN 'unscored' "
        "WHEN risk >= 0.5 THEN 'high' WHEN risk >= 0.1 THEN 'mid' ELSE 'low' END, count(*) "
        "FROM latest_node_scores GROUP BY 1").fetchall()
    out.update({band: int(n) for band, n in rows})
    return out


def node_xids(cur: Cursor, tables: set[str], node: str, *,
              limit: int = 50) -> list[dict[str, Any]]:
    """The node's newest XID events, newest first."""
    if "xid_events" not in tables:
        return []
    rows = cur.execute(
        "SELECT ts, xid, gpu_index, gpu_uuid, pci_bus_id, message, source FROM xid_events "
        "WHERE node = ? ORDER BY ts DESC LIMIT ?", [node, limit]).fetchall()
    return [{"ts": iso_z(ts), "xid": xid, "gpu_index": idx, "gpu_uuid": uuid,
             "pci_bus_id": pci, "message": msg, "source": src}
            for ts, xid, idx, uuid, pci, msg, src in rows]


def node_incidents(cur: Cursor, tables: set[str], node: str, *,
                   limit: int = 50) -> list[dict[str, Any]]:
    """The node's newest incidents (failures, repairs, RMAs), newest first."""
    if "incidents" not in tables:
        return []
    rows = cur.execute(
        "SELECT ts, kind, cause, mode, gpu_uuid, xid, source, note FROM incidents "
        "WHERE node = ? ORDER BY ts DESC LIMIT ?", [node, limit]).fetchall()
    keys = ("ts", "kind", "cause", "mode", "gpu_uuid", "xid", "source", "note")
    return [{**dict(zip(keys, r, strict=True)), "ts": iso_z(r[0])} for r in rows]


def node_drain(cur: Cursor, tables: set[str], node: str) -> dict[str, Any] | None:
    """The drain fleetcare holds on the node (``drains`` row not resumed), or None."""
    if "drains" not in tables:
        return None
    row = cur.execute(
        "SELECT drained_at, review_at, risk, reason, scheduler, cleared_at, cleared_by "
        "FROM drains WHERE node = ? AND resumed_at IS NULL", [node]).fetchone()
    if row is None:
        return None
    drained, review, risk, reason, scheduler, cleared, by = row
    return {"drained_at": iso_z(drained), "review_at": iso_z(review), "risk": finite(risk),
            "reason": reason, "scheduler": scheduler, "cleared_at": iso_z(cleared),
            "cleared_by": by}


def drain_audit(cur: Cursor, tables: set[str], node: str | None = None, *,
                limit: int = 100) -> list[dict[str, Any]]:
    """The drain controller's audit trail (of ``node``, else of the fleet), newest first."""
    if "drain_audit" not in tables:
        return []
    cond, params = ("WHERE node = ?", [node]) if node is not None else ("", [])
    rows = cur.execute(
        f"SELECT ts, node, action, actor, reason, risk, dry_run, result FROM drain_audit "
        f"{cond} ORDER BY ts DESC LIMIT ?", [*params, limit]).fetchall()
    keys = ("ts", "node", "action", "actor", "reason", "risk", "dry_run", "result")
    return [{**dict(zip(keys, r, strict=True)), "ts": iso_z(r[0]), "risk": finite(r[5])}
            for r in rows]


def models(cur: Cursor, tables: set[str]) -> list[dict[str, Any]]:
    """Every registered model, newest first (no blobs)."""
    if "models" not in tables:
        return []
    extra = ", ".join(select_columns(cur, "models", MODEL_PROVENANCE))
    rows = cur.execute(
        f"SELECT model_id, created_at, horizon_h, is_current, metrics, {extra} FROM models "
        "ORDER BY created_at DESC").fetchall()
    return [{"model_id": mid, "created_at": iso_z(created), "horizon_h": finite(h),
             "is_current": bool(cur_), "metrics": parse_json(m, what="models.metrics") or {},
             "origin": origin or "fleet", "current_reason": reason}
            for mid, created, h, cur_, m, origin, reason in rows]


def drains_goodput(cur: Cursor, tables: set[str],
                   cost: CostModel | None = None) -> dict[str, Any] | None:
    """What the drains made (not dry-run) are expected to have saved: the sum over drains
    of risk at drain time × a crash's cost, less the drain's cost, under ``cost`` (the
    default cost model). None when no drain was made."""
    if "drains" not in tables:
        return None
    cost = cost or CostModel()
    rows = cur.execute("SELECT risk FROM drains WHERE risk IS NOT NULL AND isfinite(risk)"
                       ).fetchall()
    if not rows:
        return None
    saved = sum(cost.expected_saving_gpu_h(float(r[0])) - cost.drain_cost_gpu_h for r in rows)
    return {"drains": len(rows), "net_saved_gpu_h": saved, "cost_model": cost}


def overdue_drains(cur: Cursor, tables: set[str], now: dt.datetime) -> int:
    if "drains" not in tables:
        return 0
    return int(cur.execute("SELECT count(*) FROM drains WHERE resumed_at IS NULL AND "  # type: ignore[index]
                           "review_at <= ?", [now]).fetchone()[0])


def dry_run_drains(cur: Cursor, tables: set[str]) -> int:
    """Nodes a dry-run drain controller would have drained in the 24 h before its newest
    audit row (a dry run holds no drain, so ``drains`` does not show them)."""
    if "drain_audit" not in tables:
        return 0
    return int(cur.execute(  # type: ignore[index]
        "SELECT count(DISTINCT node) FROM drain_audit WHERE dry_run AND action = 'drain' "
        "AND ts >= (SELECT max(ts) FROM drain_audit) - INTERVAL 24 HOUR").fetchone()[0])
