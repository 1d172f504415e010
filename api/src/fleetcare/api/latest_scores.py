"""The latest score of every node, held in memory: what ``GET /v1/risk`` and ``GET
/v1/drain-candidates`` page through, instead of a window query over the score tables
per request.

A ``Snapshot`` is built from ``fleetcare.models.scoring.read_latest_nodes`` (the
scorer's one meaning of *latest*, read in one transaction with the ``node_scores``
version it reflects), ranked as ``queries.risk_page`` ranks, and published by one
reference assignment: a reader holds the old complete snapshot or the new one, never a
mix, and takes no lock.

It is rebuilt

- right after each scoring run of this process commits (``scoring.on_written``), in the
  scorer's thread, so requests do not pay for it;
- when a request finds ``scoring.scores_version`` (one cheap query: rows and newest ts of
  ``node_scores``) differs from the snapshot's: a write made some other way (a fixture,
  a repair by hand) is seen by the next request, as it was before the snapshot. Only a
  rewrite of the same rows in place by something other than the scorer goes unseen;
- on first use (the service's start).

Filters that depend on other tables (node labels, GPU models) are read from the
database per request, so they are as fresh as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import Any

import duckdb

from fleetcare.api import queries
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

Cursor = duckdb.DuckDBPyConnection


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Each node's latest score (``queries`` JSON shape without labels), ranked: highest
    risk first, unscorable (null risk) last, then by node."""

    version: tuple[int, dt.datetime | None]
    ranked: tuple[dict[str, Any], ...]
    by_node: dict[str, dict[str, Any]]
    gpu_floor: dt.datetime | None  # scoring.LatestNodes.gpu_floor

    @property
    def scored_at(self) -> dt.datetime | None:
        """The newest scoring run's ts (``queries.latest_score_ts``)."""
        return self.version[1]


def build(cur: Cursor) -> Snapshot:
    """A snapshot of the latest node scores, read on ``cur`` (no transaction open)."""
    latest = scoring.read_latest_nodes(cur)
    cols = latest.nodes.to_pydict()
    rows = [queries.node_risk((node, risk, reasons, top, ts, model_id))
            for node, risk, reasons, top, ts, model_id in zip(
                cols["node"], cols["risk"], cols["reasons"], cols["top_gpu_uuid"],
                cols["ts"], cols["model_id"], strict=True)]
    rows.sort(key=lambda r: (r["risk"] is None, -(r["risk"] or 0.0), r["node"]))
    return Snapshot(version=latest.version, ranked=tuple(rows),
                    by_node={r["node"]: r for r in rows}, gpu_floor=latest.gpu_floor)


class LatestScores:
    """The app's snapshot of the latest node scores (see the module docstring)."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._building = threading.Lock()
        self.builds = 0

    def attach(self, store: Store) -> None:
        """Rebuild after each scoring run this process writes to ``store``."""
        scoring.on_written(store, self._after_scoring)

    def _after_scoring(self, store: Store) -> None:
        cur = store.cursor()
        try:
            self.refresh(cur)
        finally:
            cur.close()

    def refresh(self, cur: Cursor) -> Snapshot:
        """Rebuild unless the snapshot is current; returns the current one."""
        with self._building:
            snap = self._snapshot
            if snap is not None and snap.version == scoring.scores_version(cur):
                return snap
            snap = build(cur)
            self._snapshot = snap  # the swap: one reference assignment
            self.builds += 1
            log.debug("api.latest_scores_built nodes=%d version=%s", len(snap.ranked),
                      snap.version)
            return snap

    def current(self, cur: Cursor) -> Snapshot:
        """The snapshot, checked against ``node_scores`` (one cheap query, no lock)."""
        snap = self._snapshot
        if snap is not None and snap.version == scoring.scores_version(cur):
            return snap
        return self.refresh(cur)

    def risk_page(self, cur: Cursor, tables: set[str], *, limit: int | None = None,
                  offset: int = 0, min_risk: float | None = None,
                  labels: list[tuple[str, str]] | None = None,
                  gpu_model: str | None = None
                  ) -> tuple[list[dict[str, Any]], int, dt.datetime | None]:
        """``queries.risk_page`` from the snapshot: the same page, the same total, and the
        newest scoring run's ts."""
        if "node_scores" not in tables:
            return [], 0, None
        snap = self.current(cur)
        allowed: set[str] | None = None
        for key, value in labels or []:
            if "node_labels" not in tables:
                return [], 0, snap.scored_at
            found = queries.labelled_nodes(cur, key, value)
            allowed = found if allowed is None else allowed & found
        if gpu_model is not None:
            if "gpu_scores" not in tables:
                return [], 0, snap.scored_at
            found = queries.nodes_with_gpu_model(cur, gpu_model)
            allowed = found if allowed is None else allowed & found
        rows = [r for r in snap.ranked
                if (min_risk is None or (r["risk"] is not None and r["risk"] >= min_risk))
                and (allowed is None or r["node"] in allowed)]
        page = rows if limit is None else rows[offset:offset + limit]
        nodes = [dict(r) for r in page]  # never hand out the snapshot's own dicts
        queries.attach_labels(cur, tables, nodes)
        return nodes, len(rows), snap.scored_at
