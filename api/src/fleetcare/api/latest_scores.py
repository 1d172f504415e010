"""The latest scores and the node labels, held in memory: what ``GET /v1/risk``, ``GET
/v1/drain-candidates`` and the score part of ``GET /v1/nodes/{node}`` serve, instead of
a window query over the score tables per request.

A ``Snapshot`` is built from ``fleetcare.models.scoring.read_latest`` (the scorer's one
meaning of *latest*, nodes and GPUs, read in one transaction with the score tables'
version), ranked as ``queries.risk_page`` ranks, and published by one reference
assignment: a reader holds the old complete snapshot or the new one, never a mix, and
takes no lock.

It is rebuilt

- right after each scoring run of this process commits (``scoring.on_written``), in the
  scorer's thread, so requests do not pay for it;
- when a request finds ``scoring.scores_version`` (one cheap query: rows of both score
  tables, newest ts) differs from the snapshot's, checked at most every ``check_s``
  (1 s; every request with 0): a write made some other way (a fixture, a repair by hand)
  is seen within a second. Only a rewrite of the same rows in place by something other
  than the scorer goes unseen;
- on first use (the service's start).

The node labels (``node_labels``, the API's own table) are held the same way, checked
(at most every ``check_s``) against ``queries.labels_version`` (rows, newest update, and this process's
count of ``set_labels`` calls). The GPU-model filter reads ``gpu_scores`` per request, as
before (its meaning is any GPU the node has had scored, not only the latest).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
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
    risk first, unscorable (null risk) last, then by node; and each node's GPUs' latest
    scores (``queries.node_detail`` shape, without telemetry)."""

    version: tuple[int, int, dt.datetime | None]
    ranked: tuple[dict[str, Any], ...]
    by_node: dict[str, dict[str, Any]]
    gpus: GpuScores

    @property
    def scored_at(self) -> dt.datetime | None:
        """The newest scoring run's ts (``queries.latest_score_ts``)."""
        return self.version[2]


def build(cur: Cursor) -> Snapshot:
    """A snapshot of the latest scores, read on ``cur`` (no transaction open)."""
    latest = scoring.read_latest(cur)
    n = latest.nodes.to_pydict()
    rows = [queries.node_risk(r) for r in zip(
        n["node"], n["risk"], n["reasons"], n["top_gpu_uuid"], n["ts"], n["model_id"],
        strict=True)]
    rows.sort(key=lambda r: (r["risk"] is None, -(r["risk"] or 0.0), r["node"]))
    return Snapshot(version=latest.version, ranked=tuple(rows),
                    by_node={r["node"]: r for r in rows}, gpus=GpuScores(latest.gpus))


class GpuScores:
    """Each node's GPUs' latest scores (``queries.gpu_score`` dicts), built for a node when
    it is asked for, from the Arrow table: building all of them (16,384 GPUs, a JSON parse
    of reasons each) held the interpreter ~0.1 s after every scoring run, and the ~10^5
    objects they were made of lengthened every full pass of the garbage collector."""

    def __init__(self, table: Any) -> None:
        import numpy as np
        import pyarrow.compute as pc

        order = pc.sort_indices(table, [("node", "ascending")]).to_numpy()
        self._table = table.take(order) if table.num_rows else table
        nodes = self._table.column("node").to_numpy(zero_copy_only=False)
        self._span: dict[str, tuple[int, int]] = {}
        if len(nodes):
            starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])
            ends = np.r_[starts[1:], len(nodes)]
            self._span = {str(nodes[a]): (int(a), int(b))
                          for a, b in zip(starts, ends, strict=True)}

    def get(self, node: str, default: tuple[dict[str, Any], ...] = ()
            ) -> tuple[dict[str, Any], ...]:
        span = self._span.get(node)
        if span is None:
            return default
        rows = self._table.slice(span[0], span[1] - span[0]).to_pylist()
        return tuple(queries.gpu_score(r["gpu_uuid"], r["gpu_index"], r["model"], r["risk"],
                                       r["reasons"], r["ts"]) for r in rows)

    def __contains__(self, node: object) -> bool:
        return node in self._span

    def __len__(self) -> int:
        return len(self._span)


@dataclass(frozen=True, slots=True)
class Labels:
    version: tuple[Any, ...]
    by_node: dict[str, dict[str, str]]


class LatestScores:
    """The app's in-memory latest scores and labels (see the module docstring)."""

    def __init__(self, *, check_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot: Snapshot | None = None
        self._labels: Labels | None = None
        self._building = threading.Lock()
        self.builds = 0
        self.check_s = check_s
        """Seconds a checked snapshot (and the labels) is served without checking again:
        the version queries cost more than the rest of a request."""
        self.clock = clock
        self._scores_checked = -math.inf
        self._labels_checked = -math.inf

    def _due(self, last: float) -> bool:
        return self.check_s <= 0 or self.clock() - last >= self.check_s

    @property
    def snapshot(self) -> Snapshot | None:
        """The snapshot as it is, unchecked (None before the first build)."""
        return self._snapshot

    def attach(self, store: Store) -> None:
        """Rebuild after each scoring run this process writes to ``store``."""
        scoring.on_written(store, self._after_scoring)

    def _after_scoring(self, store: Store) -> None:
        cur = store.cursor()
        try:
            # always: a run rescoring the same ts (no new telemetry since the last) rewrites
            # its rows in place, which leaves the version as it was
            self.refresh(cur, force=True)
        finally:
            cur.close()

    def refresh(self, cur: Cursor, *, force: bool = False) -> Snapshot:
        """Rebuild unless the snapshot is current (``force``: rebuild); returns the
        current one."""
        with self._building:
            snap = self._snapshot
            if (not force and snap is not None
                    and snap.version == scoring.scores_version(cur)):
                return snap
            snap = build(cur)
            self._snapshot = snap  # the swap: one reference assignment
            self._scores_checked = self.clock()
            self.builds += 1
            log.debug("api.latest_scores_built nodes=%d version=%s", len(snap.ranked),
                      snap.version)
            return snap

    def current(self, cur: Cursor) -> Snapshot:
        """The snapshot, checked against the score tables (one cheap query, no lock) when
        the last check is ``check_s`` old."""
        snap = self._snapshot
        if snap is not None and not self._due(self._scores_checked):
            return snap
        if snap is not None and snap.version == scoring.scores_version(cur):
            self._scores_checked = self.clock()
            return snap
        return self.refresh(cur)

    def labels(self, cur: Cursor, tables: set[str]) -> dict[str, dict[str, str]]:
        """Every node's labels ({node: {key: value}}), checked at most every ``check_s``
        (and at once after this process's ``queries.set_labels``)."""
        if "node_labels" not in tables:
            return {}
        held = self._labels
        if (held is not None and not self._due(self._labels_checked)
                and held.version[-1] == queries.labels_written()):
            return held.by_node
        version = queries.labels_version(cur)
        if held is None or held.version != version:
            held = Labels(version, queries.all_labels(cur))
            self._labels = held
        self._labels_checked = self.clock()
        return held.by_node

    def risk_page(self, cur: Cursor, tables: set[str], *, limit: int | None = None,
                  offset: int = 0, min_risk: float | None = None,
                  labels: Sequence[tuple[str, str]] | None = None,
                  gpu_model: str | None = None
                  ) -> tuple[list[dict[str, Any]], int, dt.datetime | None]:
        """``queries.risk_page`` from memory: the same page, the same total, and the
        newest scoring run's ts."""
        if "node_scores" not in tables:
            return [], 0, None
        snap = self.current(cur)
        held = self.labels(cur, tables)
        allowed: set[str] | None = None
        if labels:
            if "node_labels" not in tables:
                return [], 0, snap.scored_at
            allowed = {node for node, have in held.items()
                       if all(have.get(k) == v for k, v in labels)}
        if gpu_model is not None:
            if "gpu_scores" not in tables:
                return [], 0, snap.scored_at
            found = queries.nodes_with_gpu_model(cur, gpu_model)
            allowed = found if allowed is None else allowed & found
        rows: Sequence[dict[str, Any]] = snap.ranked
        if min_risk is not None or allowed is not None:  # else: the ranking as it is
            rows = [r for r in snap.ranked
                    if (min_risk is None or (r["risk"] is not None and r["risk"] >= min_risk))
                    and (allowed is None or r["node"] in allowed)]
        page = rows if limit is None else rows[offset:offset + limit]
        # new dicts: the snapshot's own are shared by every reader
        nodes = [{**r, "labels": dict(held.get(r["node"], {}))} for r in page]
        return nodes, len(rows), snap.scored_at
