"""The drain audit log and the table of drains fleetcare holds, in DuckDB.

    drain_audit (ts, node, action, actor, reason, risk, dry_run, result)
        one row per decision, executed or not: who (actor), why (reason), at what risk,
        whether it was a dry run, and what happened (result). Append-only.
    drains      (node, drained_at, review_at, risk, reason, scheduler, cleared_at,
                 cleared_by, resumed_at, resumed_by)
        the drains fleetcare made and has not given back yet (resumed_at IS NULL):
        the controller's memory between runs, so no drain is forgotten.

``action`` is one of ``ACTIONS``; ``result`` is ``ok``, ``dry-run``, ``refused: ...``
or ``error: ...``. Timestamps are naive UTC, like every table of the store.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from fleetcare.pipeline.store import Store

DDL = """
CREATE TABLE IF NOT EXISTS drain_audit (
  ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, action VARCHAR NOT NULL,
  actor VARCHAR NOT NULL, reason VARCHAR, risk DOUBLE, dry_run BOOLEAN NOT NULL,
  result VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS drains (
  node VARCHAR PRIMARY KEY, drained_at TIMESTAMP NOT NULL, review_at TIMESTAMP NOT NULL,
  risk DOUBLE, reason VARCHAR, scheduler VARCHAR NOT NULL,
  cleared_at TIMESTAMP, cleared_by VARCHAR, resumed_at TIMESTAMP, resumed_by VARCHAR
);
"""

ACTIONS = ("drain", "resume", "refuse", "skip", "clear", "escalate", "forget", "hold")
"""drain/resume: changed the scheduler; refuse: a drain the circuit breaker stopped;
skip: a node not acted on (already drained, down, unknown); clear: an operator or a
health check cleared a drained node; escalate: a drain past its review time whose risk
is still high; forget: a drain someone else already undid or took over in the
scheduler; hold: a held drain whose scheduler state could not be read."""


def naive_utc(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def ensure_schema(store: Store) -> None:
    store.cursor().execute(DDL).fetchall()


@dataclass(frozen=True, slots=True)
class AuditRow:
    ts: dt.datetime
    node: str
    action: str
    actor: str
    reason: str | None
    risk: float | None
    dry_run: bool
    result: str

    def to_json(self) -> dict[str, Any]:
        return {"ts": self.ts.isoformat() + "Z", "node": self.node, "action": self.action,
                "actor": self.actor, "reason": self.reason,
                "risk": None if self.risk is None else round(self.risk, 4),
                "dry_run": self.dry_run, "result": self.result}


@dataclass(frozen=True, slots=True)
class Drain:
    """A drain fleetcare holds (``drains`` row)."""

    node: str
    drained_at: dt.datetime
    review_at: dt.datetime
    risk: float | None
    reason: str | None
    scheduler: str
    cleared_at: dt.datetime | None
    cleared_by: str | None


def held_drains(cur: Any) -> dict[str, Drain]:
    """The drains fleetcare holds (``resumed_at IS NULL``), by node, from a cursor on a
    database that has the ``drains`` table."""
    rows = cur.execute(
        "SELECT node, drained_at, review_at, risk, reason, scheduler, cleared_at, "
        "cleared_by FROM drains WHERE resumed_at IS NULL ORDER BY node").fetchall()
    return {r[0]: Drain(*r) for r in rows}


class AuditLog:
    """Reads and writes ``drain_audit`` and ``drains``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        ensure_schema(store)

    def record(self, row: AuditRow, *, dedupe: bool = False) -> bool:
        """Append ``row``; with ``dedupe``, skip it when the node's last row says the same
        (same action, result, dry_run), so a node that stays down is not logged every run."""
        with self.store.transaction() as cur:
            if dedupe:
                last = cur.execute(
                    "SELECT action, result, dry_run FROM drain_audit WHERE node = ? "
                    "ORDER BY ts DESC LIMIT 1", [row.node]).fetchone()
                if last == (row.action, row.result, row.dry_run):
                    return False
            cur.execute("INSERT INTO drain_audit VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [naive_utc(row.ts), row.node, row.action, row.actor, row.reason,
                         row.risk, row.dry_run, row.result])
        return True

    def rows(self, *, node: str | None = None, limit: int = 100) -> list[AuditRow]:
        sql = "SELECT * FROM drain_audit"
        params: list[Any] = []
        if node:
            sql += " WHERE node = ?"
            params.append(node)
        sql += f" ORDER BY ts DESC, rowid DESC LIMIT {int(limit)}"
        return [AuditRow(*r) for r in self.store.cursor().execute(sql, params).fetchall()]

    def executed_drains_since(self, since: dt.datetime) -> int:
        """Real (not dry-run) drains that succeeded at or after ``since``."""
        row = self.store.cursor().execute(
            "SELECT count(*) FROM drain_audit WHERE action = 'drain' AND result = 'ok' "
            "AND NOT dry_run AND ts >= ?", [naive_utc(since)]).fetchone()
        return int(row[0]) if row else 0

    # -- drains ----------------------------------------------------------------------------
    def active(self) -> dict[str, Drain]:
        return held_drains(self.store.cursor())

    def add(self, drain: Drain) -> None:
        with self.store.transaction() as cur:
            cur.execute("DELETE FROM drains WHERE node = ?", [drain.node])
            cur.execute("INSERT INTO drains (node, drained_at, review_at, risk, reason, "
                        "scheduler) VALUES (?, ?, ?, ?, ?, ?)",
                        [drain.node, naive_utc(drain.drained_at), naive_utc(drain.review_at),
                         drain.risk, drain.reason, drain.scheduler])

    def clear(self, node: str, at: dt.datetime, by: str) -> None:
        self.store.cursor().execute(
            "UPDATE drains SET cleared_at = ?, cleared_by = ? WHERE node = ? "
            "AND resumed_at IS NULL", [naive_utc(at), by, node])

    def review_later(self, node: str, review_at: dt.datetime) -> None:
        self.store.cursor().execute(
            "UPDATE drains SET review_at = ? WHERE node = ? AND resumed_at IS NULL",
            [naive_utc(review_at), node])

    def close(self, node: str, at: dt.datetime, by: str) -> None:
        self.store.cursor().execute(
            "UPDATE drains SET resumed_at = ?, resumed_by = ? WHERE node = ? "
            "AND resumed_at IS NULL", [naive_utc(at), by, node])
