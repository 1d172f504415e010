"""Live scoring: risk per GPU and per node now, with reasons, kept as history in DuckDB.

Tables and views (created here, IF NOT EXISTS)::

    gpu_scores   (ts TIMESTAMP, node VARCHAR, gpu_uuid VARCHAR, gpu_index BIGINT,
                  model VARCHAR, risk DOUBLE, reasons JSON, model_id VARCHAR)
    node_scores  (ts TIMESTAMP, node VARCHAR, risk DOUBLE, reasons JSON,
                  top_gpu_uuid VARCHAR, model_id VARCHAR)
    node_network_scores (ts TIMESTAMP, node VARCHAR, p_net DOUBLE, model_id VARCHAR)
    latest_gpu_scores / latest_node_scores   views: the latest score of each GPU / node
                                             (see below), highest risk first

``ts`` is the scoring time (UTC); one set of rows per scoring ts and model (scoring the
same ts again with the same model replaces its rows). ``risk`` is the calibrated
probability of a failure within the model's horizon; a node's risk is
``1 - prod(1 - p_gpu)`` and its reasons are its riskiest GPU's, prefixed ``"GPU <index>: "``.
A model with a network head (``network_head``) combines the node's probability of a
cable/switch or NIC failure in the same way; where that outweighs the GPUs, the node's
reasons say what its InfiniBand ports counted (``"network risk NN%: InfiniBand: ..."``).
The head's own probability of each node it scored is kept beside (``node_network_scores``,
same run): an operating point with a threshold of its own on it (the fleet prior's,
``network_head.alarm_risk``) alarms on it, which the combined risk alone cannot show.
``reasons`` is a JSON list of sentences.

Readers that keep the latest scores in memory (the API's ``/v1/risk`` and node pages)
read them with ``read_latest`` and learn of new rows two ways: ``on_written`` callbacks
run after each ``score`` commits, and ``scores_version`` (rows of both tables, newest ts)
changes with any other write but a rewrite of the same rows in place.

This module owns both tables: their DDL, their one meaning of *latest* and their pruning.
The latest score of a node (or GPU) is its newest row among the last ``LATEST_RUNS``
scoring runs: a node that stopped reporting drops out of the API's ``/v1/risk``, the
metrics, alerts and the drain controller after that many runs, instead of showing a risk
from last week forever. ``prune`` keeps every run of the last ``keep_runs`` and one run
an hour (the first) for ``keep_hourly``: the history pages draw, at a bounded size (a
100,000-GPU fleet scored every minute writes 144 M GPU rows a day).

Exceptions::

    ScoreError    no model to score with
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetcare.models import registry, thermal_ramp
from fleetcare.models.model import FailureModel
from fleetcare.models.reasons import explain, fleet_medians
from fleetcare.models.training import ts_column
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

LATEST_RUNS = 3
"""A node or GPU missing from this many newest scoring runs has no latest score."""


def _runs_floor(table: str) -> str:
    """The ts of the oldest of the newest ``LATEST_RUNS`` scoring runs of ``table``."""
    return (f"SELECT min(ts) FROM (SELECT DISTINCT ts FROM {table} "
            f"ORDER BY ts DESC LIMIT {LATEST_RUNS})")


_LATEST_KEY = {"gpu_scores": ("gpu_uuid", "risk DESC, node, gpu_index"),
               "node_scores": ("node", "risk DESC, node")}


def _latest_sql(table: str, floor: str) -> str:
    """Each GPU's (node's) newest row of ``table`` at or after ``floor`` (SQL: the
    ``_runs_floor`` subquery in the views, a parameter in ``read_latest``), highest risk
    first: the one meaning of *latest*."""
    key, order = _LATEST_KEY[table]
    return (f"SELECT * FROM {table} WHERE ts >= ({floor}) "
            f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY ts DESC) = 1 "
            f"ORDER BY {order}")


DDL = f"""
CREATE TABLE IF NOT EXISTS gpu_scores (
  ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL,
  gpu_index BIGINT, model VARCHAR, risk DOUBLE NOT NULL, reasons JSON NOT NULL,
  model_id VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS node_scores (
  ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, risk DOUBLE NOT NULL,
  reasons JSON NOT NULL, top_gpu_uuid VARCHAR, model_id VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS node_network_scores (
  ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, p_net DOUBLE NOT NULL,
  model_id VARCHAR NOT NULL
);
CREATE OR REPLACE VIEW latest_gpu_scores AS
  {_latest_sql("gpu_scores", _runs_floor("gpu_scores"))};
CREATE OR REPLACE VIEW latest_node_scores AS
  {_latest_sql("node_scores", _runs_floor("node_scores"))};
"""

GPU_SCHEMA = pa.schema([
    ("ts", pa.timestamp("us")), ("node", pa.string()), ("gpu_uuid", pa.string()),
    ("gpu_index", pa.int64()), ("model", pa.string()), ("risk", pa.float64()),
    ("reasons", pa.string()), ("model_id", pa.string()),
])
NODE_SCHEMA = pa.schema([
    ("ts", pa.timestamp("us")), ("node", pa.string()), ("risk", pa.float64()),
    ("reasons", pa.string()), ("top_gpu_uuid", pa.string()), ("model_id", pa.string()),
])
NETWORK_SCHEMA = pa.schema([
    ("ts", pa.timestamp("us")), ("node", pa.string()), ("p_net", pa.float64()),
    ("model_id", pa.string()),
])
TABLES = ("gpu_scores", "node_scores", "node_network_scores")
"""The tables a scoring run writes (``write_run``)."""


EXPLAIN_FLOOR = 0.01
"""Reasons are written for nodes whose risk is at least this (a 1 % chance of a failure
within the model's horizon, ~20x the median node of a simulated fleet), and for GPUs at
least this risky; the rest get none (``[]``, shown as "none"). Alert and drain
thresholds below it lower it (``explain_floor_for``), so an alerted or drained node
always has its reasons."""
EXPLAIN_TOP = 2000
"""At most this many GPUs are explained per scoring run, riskiest first (see
``_explain_riskiest``)."""


class ScoreError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class ScoreRetention:
    """What ``prune`` keeps: every run of the newest ``keep_runs``, and the first run of
    each hour for ``keep_hourly`` before the newest run."""

    keep_runs: int = 60
    keep_hourly: dt.timedelta = dt.timedelta(days=7)

    def __post_init__(self) -> None:
        if self.keep_runs < LATEST_RUNS:
            raise ValueError(f"keep_runs={self.keep_runs} must be at least LATEST_RUNS "
                             f"({LATEST_RUNS}): the latest scores are read from them")


@dataclass(frozen=True, slots=True)
class ScoreResult:
    ts: dt.datetime | None          # the scoring time (aware UTC); None when nothing scored
    model_id: str
    gpu_scores: pa.Table            # GPU_SCHEMA, highest risk first
    node_scores: pa.Table           # NODE_SCHEMA, highest risk first
    network_scores: pa.Table = field(default_factory=NETWORK_SCHEMA.empty_table)
    """NETWORK_SCHEMA: the network head's probability of each node it scored (none
    without a head)."""


_cache: dict[str, FailureModel] = {}
_cache_lock = threading.Lock()


_ready: weakref.WeakSet[Store] = weakref.WeakSet()
_listeners: weakref.WeakKeyDictionary[Store, list[Callable[[Store], None]]] = (
    weakref.WeakKeyDictionary())
_listeners_lock = threading.Lock()


def on_written(store: Store, callback: Callable[[Store], None]) -> None:
    """Call ``callback(store)`` after each scoring run written to ``store`` by this
    process has committed (in the scorer's thread; an exception is logged, the run
    stands)."""
    with _listeners_lock:
        _listeners.setdefault(store, []).append(callback)


def _written(store: Store) -> None:
    with _listeners_lock:
        callbacks = list(_listeners.get(store, ()))
    for callback in callbacks:
        try:
            callback(store)
        except Exception:
            log.exception("scoring.listener_failed callback=%r", callback)


def ensure_schema(store: Store) -> None:
    """Create the tables and views (once per Store object)."""
    if store not in _ready:
        create_schema(store.cursor())
        _ready.add(store)


def create_schema(cur: duckdb.DuckDBPyConnection) -> None:
    """The score tables and the latest-score views on a cursor (idempotent)."""
    cur.execute(DDL).fetchall()


def _model(store: Store, model_id: str) -> FailureModel:
    # model_id ends in a hash of the bytes, so a cached model never goes stale
    with _cache_lock:
        m = _cache.get(model_id)
    if m is None:
        m = registry.load(store, model_id)
        with _cache_lock:
            if len(_cache) >= 8:
                _cache.pop(next(iter(_cache)))
            _cache[model_id] = m
    return m


def _naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def explain_floor_for(*thresholds: float | None) -> float:
    """The explanation floor when alerts fire at, or drains start at, ``thresholds``:
    ``EXPLAIN_FLOOR``, lowered to the lowest of them."""
    return min([EXPLAIN_FLOOR, *(t for t in thresholds if t is not None)])


def _explained_rows(p: np.ndarray, order: np.ndarray, top_gpu: np.ndarray,
                    node_risk: np.ndarray, floor: float, top: int) -> np.ndarray:
    """Row indices (into ``p``) to explain, riskiest first: every GPU whose risk is at
    least ``floor`` and the riskiest GPU (``top_gpu``) of every node whose risk is (its
    reasons are the node's), at most ``top``."""
    want = p >= floor
    want[top_gpu[node_risk >= floor]] = True
    return order[want[order]][:top]


def _explain_riskiest(m: FailureModel, feats: pa.Table, rows: np.ndarray) -> list[list[str]]:
    """Reasons for ``rows`` only, against the fleet medians of all of ``feats``.

    LightGBM's per-feature contributions (TreeSHAP) cost about 1,000x a prediction:
    explaining all 100,000 GPUs of a large fleet took minutes, while schedulers and
    people only read the reasons of risky nodes.
    """
    if len(rows) == 0:
        return []
    sub = feats.take(pa.array(rows))
    return explain(m, sub, fleet_medians(feats, m.feature_names_in_))


NETWORK_NODES_LISTED = 64
"""Up to this many nodes, the network head reads only theirs (an event rescoring);
beyond, the whole fleet's rows in one query."""


def _with_network(m: FailureModel, store: Store, ts: dt.datetime, nodes: list[str],
                  node_risk: np.ndarray, floor: float
                  ) -> tuple[dict[int, list[str]], dict[int, float]]:
    """Combine ``node_risk`` (in place) with the model's network head, when it has one
    (``network_head``); returns reasons for the nodes whose network risk outweighs
    their GPUs' and whose risk reaches ``floor``, and the head's probability of each
    node it scored (by position in ``nodes``)."""
    head = m.network_head_
    if head is None or not nodes:
        return {}, {}
    from fleetcare.models import network_head

    t, p_net = network_head.predict_latest(
        head, store, ts, nodes=nodes if len(nodes) <= NETWORK_NODES_LISTED else None)
    pos = {n: k for k, n in enumerate(nodes)}
    rows = t.to_pylist()
    out: dict[int, list[str]] = {}
    probs: dict[int, float] = {}
    for row, p in zip(rows, p_net.tolist(), strict=True):
        k = pos.get(row["node"])
        if k is None:
            continue
        probs[k] = float(p)
        gpu_risk = float(node_risk[k])
        node_risk[k] = float(network_head.combine(np.array([gpu_risk]), np.array([p]))[0])
        if p > gpu_risk and node_risk[k] >= floor:
            out[k] = network_head.reasons(row, p)
    return out, probs


def score(store: Store, *, at: dt.datetime | None = None, model: str | None = None,
          features: pa.Table | None = None, explain_top: int = EXPLAIN_TOP,
          explain_floor: float = EXPLAIN_FLOOR) -> ScoreResult:
    """Score every live GPU at ``at`` (default: newest telemetry) with ``model`` (a model
    id; default: the current one), write the rows and return them.

    ``features`` are precomputed latest features (``KEY_COLUMNS`` + feature columns);
    by default ``fleetcare.pipeline.features.latest_features(store, at)``. Reasons are
    computed for GPUs and nodes whose risk is at least ``explain_floor``, at most the
    ``explain_top`` riskiest GPUs (``EXPLAIN_FLOOR``).
    """

    ensure_schema(store)
    if model is None:
        from fleetcare.models import prior

        rec = prior.ensure_current(store)  # a fleet with no model scores with the prior
        if rec is None:
            raise ScoreError("no model to score with, and this installation ships no fleet "
                             "prior: train one with `fleetcare train --db PATH`, or make a "
                             "registered one current with `fleetcare models promote MODEL_ID "
                             "--db PATH` (see `fleetcare models list`)")
        model = rec.model_id
    m = _model(store, model)
    if features is None:
        from fleetcare.pipeline import features as pipeline_features

        features = pipeline_features.latest_features(store, at)
    feats = features
    if feats.num_rows == 0:
        return ScoreResult(None, model, GPU_SCHEMA.empty_table(), NODE_SCHEMA.empty_table())
    n = feats.num_rows
    p = m.predict_proba(m.matrix(feats))[:, 1]   # one float32 matrix, as in training
    ramp = thermal_ramp.live(store, feats)  # failing cooling: a rule beside the model
    p = ramp.risk(p)
    ts_naive = _naive(at) if at is not None else ts_column(feats).max().astype(dt.datetime)
    node_col = feats.column("node").cast(pa.string())
    idx_col = feats.column("gpu_index").cast(pa.int64())
    gmodel_col = (feats.column("model").cast(pa.string()) if "model" in feats.column_names
                  else pa.nulls(n, pa.string()))

    # GPUs highest risk first (then node, then index; an unknown index first), stable
    keys = pa.table({"risk": pa.array(p, pa.float64()), "node": node_col, "idx": idx_col})
    order = pc.sort_indices(keys, sort_keys=[("risk", "descending", "at_end"),
                                             ("node", "ascending", "at_end"),
                                             ("idx", "ascending", "at_start")]).to_numpy()

    # node risk = 1 - prod(1 - p), summed in log space in GPU order as before
    enc = pc.dictionary_encode(node_col).combine_chunks()
    node_code = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    node_names = enc.dictionary
    with np.errstate(divide="ignore"):
        logv = np.log1p(-np.clip(p, 0.0, 1.0))
    logq = np.bincount(node_code[order], weights=logv[order], minlength=len(node_names))
    node_risk = 1.0 - np.exp(logq)
    _, first_pos = np.unique(node_code[order], return_index=True)
    top_gpu = np.empty(len(node_names), dtype=np.int64)
    top_gpu[node_code[order][first_pos]] = order[first_pos]   # each node's riskiest GPU

    explained = np.sort(_explained_rows(p, order, top_gpu, node_risk, explain_floor,
                                        explain_top))
    texts = dict(zip(explained.tolist(), _explain_riskiest(m, feats, explained), strict=True))
    for i in texts:
        if ramp.hit[i]:
            texts[i] = [thermal_ramp.reason(ramp, i), *texts[i]]
    reasons = ["[]"] * n
    for i, r in texts.items():
        reasons[i] = json.dumps(r)
    net_texts, p_net = _with_network(m, store, ts_naive, node_names.to_pylist(), node_risk,
                                     explain_floor)

    order_a = pa.array(order)
    uuid_col = feats.column("gpu_uuid").cast(pa.string())
    gpu = pa.table({
        "ts": pa.repeat(pa.scalar(ts_naive, pa.timestamp("us")), n),
        "node": node_col.take(order_a), "gpu_uuid": uuid_col.take(order_a),
        "gpu_index": idx_col.take(order_a), "model": gmodel_col.take(order_a),
        "risk": pa.array(p[order], pa.float64()),
        "reasons": pa.array(reasons, pa.string()).take(order_a),
        "model_id": pa.repeat(pa.scalar(model, pa.string()), n),
    }, schema=GPU_SCHEMA)

    n_nodes = len(node_names)
    node_order = pa.array(pc.sort_indices(
        pa.table({"risk": pa.array(node_risk, pa.float64()), "node": node_names}),
        sort_keys=[("risk", "descending"), ("node", "ascending")]))
    idxs = idx_col.to_pylist()
    node_reasons = ["[]"] * n_nodes
    for k in np.flatnonzero(np.isin(top_gpu, explained)).tolist():
        g = int(top_gpu[k])
        node_reasons[k] = json.dumps([f"GPU {idxs[g]}: {t}" for t in texts[g]])
    for k, r in net_texts.items():  # the network outweighs the node's GPUs
        node_reasons[k] = json.dumps(r)
    node = pa.table({
        "ts": pa.repeat(pa.scalar(ts_naive, pa.timestamp("us")), n_nodes),
        "node": node_names.take(node_order),
        "risk": pa.array(node_risk, pa.float64()).take(node_order),
        "reasons": pa.array(node_reasons, pa.string()).take(node_order),
        "top_gpu_uuid": uuid_col.take(pa.array(top_gpu)).take(node_order),
        "model_id": pa.repeat(pa.scalar(model, pa.string()), n_nodes),
    }, schema=NODE_SCHEMA)
    net_nodes = sorted(p_net)
    network = pa.table({
        "ts": pa.repeat(pa.scalar(ts_naive, pa.timestamp("us")), len(net_nodes)),
        "node": node_names.take(pa.array(net_nodes, pa.int64())),
        "p_net": pa.array([p_net[k] for k in net_nodes], pa.float64()),
        "model_id": pa.repeat(pa.scalar(model, pa.string()), len(net_nodes)),
    }, schema=NETWORK_SCHEMA)
    write_run(store, ts_naive, model, gpu, node, network)
    return ScoreResult(ts_naive.replace(tzinfo=dt.UTC), model, gpu, node, network)


def write_run(store: Store, ts: dt.datetime, model_id: str, gpu: pa.Table,
              node: pa.Table, network: pa.Table | None = None) -> None:
    """Write one scoring run (``GPU_SCHEMA`` / ``NODE_SCHEMA`` / ``NETWORK_SCHEMA`` rows
    at ``ts``, naive UTC) in one transaction, replacing that ts and model's rows; then the
    ``on_written`` callbacks."""
    ensure_schema(store)
    if network is None:
        network = NETWORK_SCHEMA.empty_table()
    with store.transaction() as cur:
        for table, data in zip(TABLES, (gpu, node, network), strict=True):
            cur.execute(f"DELETE FROM {table} WHERE ts = ? AND model_id = ?",
                        [ts, model_id]).fetchall()
            cur.register("incoming_scores", data)
            cur.execute(f"INSERT INTO {table} SELECT * FROM incoming_scores").fetchall()
            cur.unregister("incoming_scores")
    _written(store)


def prune(store: Store, keep: ScoreRetention | None = None) -> int:
    """Delete score rows ``keep`` does not keep (see ``ScoreRetention``); returns rows
    deleted from the three tables. The network head's rows go with the runs of
    ``node_scores`` they were written beside (and all of them once no model writes
    any)."""
    keep = keep or ScoreRetention()
    ensure_schema(store)
    deleted = 0
    with store.transaction() as cur:
        for table in ("gpu_scores", "node_scores"):
            deleted += int(cur.execute(f"""
                DELETE FROM {table} WHERE ts NOT IN (
                  SELECT ts FROM (SELECT DISTINCT ts FROM {table} ORDER BY ts DESC
                                  LIMIT {int(keep.keep_runs)})
                  UNION ALL
                  SELECT min(ts) FROM {table}
                  WHERE ts >= (SELECT max(ts) FROM {table}) - to_microseconds(?)
                  GROUP BY date_trunc('hour', ts))""",
                [int(keep.keep_hourly.total_seconds() * 1e6)]).fetchall()[0][0])
        deleted += int(cur.execute(
            "DELETE FROM node_network_scores WHERE ts NOT IN "
            "(SELECT DISTINCT ts FROM node_scores)").fetchall()[0][0])
    return deleted


def latest_gpu_scores(store: Store, *, limit: int | None = None) -> pa.Table:
    """Each GPU's latest score (``LATEST_RUNS``), highest risk first (reasons as JSON):
    the ``latest_gpu_scores`` view's rows, read as ``read_latest`` reads them."""
    return _latest_table(store, "gpu_scores", limit)


def latest_node_scores(store: Store, *, limit: int | None = None) -> pa.Table:
    """Each node's latest score (``LATEST_RUNS``), highest risk first (reasons as JSON):
    the ``latest_node_scores`` view's rows, read as ``read_latest`` reads them."""
    return _latest_table(store, "node_scores", limit)


def _latest_table(store: Store, table: str, limit: int | None) -> pa.Table:
    ensure_schema(store)
    cur = store.cursor()
    try:
        cur.execute("BEGIN TRANSACTION")  # the floor and the rows of one moment
        try:
            return _read_latest(cur, table, limit)
        finally:
            cur.execute("COMMIT")
    finally:
        cur.close()


def scores_version(cur: duckdb.DuckDBPyConnection) -> tuple[int, int, dt.datetime | None]:
    """(rows of ``node_scores``, rows of ``gpu_scores``, newest node score's ts): one
    cheap query whose answer changes with every write to the two tables except a rewrite
    of the same rows in place (``score`` announces its own runs through ``on_written``).
    The newest ts is also the newest scoring run's."""
    nodes, gpus, newest = cur.execute(
        "SELECT (SELECT count(*) FROM node_scores), (SELECT count(*) FROM gpu_scores), "
        "(SELECT max(ts) FROM node_scores)").fetchall()[0]
    return int(nodes), int(gpus), newest


@dataclass(frozen=True, slots=True)
class Latest:
    """``read_latest``: the latest scores at one moment."""

    version: tuple[int, int, dt.datetime | None]  # scores_version
    nodes: pa.Table          # latest_node_scores: NODE_SCHEMA, highest risk first
    gpus: pa.Table           # latest_gpu_scores: GPU_SCHEMA, highest risk first


def read_latest(cur: duckdb.DuckDBPyConnection) -> Latest:
    """Each node's and each GPU's latest score (``LATEST_RUNS``) and the
    ``scores_version`` they were read at, in one read transaction on ``cur`` (a cursor no
    transaction is open on): a run committing meanwhile is in all of them or in none."""
    cur.execute("BEGIN TRANSACTION")
    try:
        version = scores_version(cur)
        nodes, gpus = (_read_latest(cur, t) for t in ("node_scores", "gpu_scores"))
    finally:
        cur.execute("COMMIT")
    return Latest(version, nodes, gpus)


def _read_latest(cur: duckdb.DuckDBPyConnection, table: str,
                 limit: int | None = None) -> pa.Table:
    """The view's rows (``_latest_sql``), its floor read first and passed as a value: the
    view's subquery floor is not used to skip the older runs' row groups, so the view
    scanned every kept run (16,384 GPUs x ~60 runs: ~25 ms, half of a snapshot build,
    against ~11 ms this way)."""
    floor = cur.execute(_runs_floor(table)).fetchall()[0][0]
    sql = _latest_sql(table, "$1") + (f" LIMIT {int(limit)}" if limit else "")
    return cur.sql(sql, params=[floor]).to_arrow_table()
