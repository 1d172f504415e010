"""The SQL behind the API. Every function takes a DuckDB cursor and returns plain
JSON-ready values (ISO 'Z' timestamps, no NaN), so the HTTP layer stays thin.

Tables written by other components may not exist yet (a fresh database before the first
``fleetcare train``): readers treat a missing table as empty, never as an error.

The API owns one table and writes it: ``node_labels`` (``PUT /v1/nodes/{node}/labels``,
``set_labels``). Labels are operator configuration, not telemetry: ``partition`` is the
Slurm partition / Kubernetes node pool that ``GET /v1/risk?partition=`` filters on.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from fleetcare.api.drains import audit
from fleetcare.pipeline.telemetry import RawTelemetry, TableTelemetry

log = logging.getLogger(__name__)

Cursor = duckdb.DuckDBPyConnection

# Each node's latest score as fleetcare.models.scoring defines it (its view); risk made
# NULL when not finite (JSON has no NaN).
_LATEST_NODE_SCORES = """
SELECT node, CASE WHEN isfinite(risk) THEN risk END AS risk, reasons, top_gpu_uuid,
       ts, model_id
FROM latest_node_scores
"""


LABELS_DDL = """
CREATE TABLE IF NOT EXISTS node_labels (
  node VARCHAR NOT NULL, key VARCHAR NOT NULL, value VARCHAR NOT NULL,
  updated_at TIMESTAMP NOT NULL, PRIMARY KEY (node, key)
);
"""

ALERT_COLUMNS = ("id", "node", "state", "risk", "started_at", "fired_at", "resolved_at",
                 "reasons", "top_gpu_uuid", "model_id", "p_net")
"""The columns of the alerts engine's ``alerts`` table the API shows (a missing one
reads as null)."""
ALERTS_DDL = """
CREATE TABLE IF NOT EXISTS alerts (
  id VARCHAR, node VARCHAR, state VARCHAR, risk DOUBLE, started_at TIMESTAMP,
  resolved_at TIMESTAMP, reasons VARCHAR
);
"""
"""Fallback only, when ``fleetcare.api.alerts`` is not installed: the engine's own DDL
(``fleetcare.api.alerts.engine.ensure_schema``) is used when it is."""


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


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


_FINITE_JSON = json.JSONDecoder(parse_constant=lambda _: None, parse_float=_finite_float)
"""Reads JSON with every non-finite number (``NaN``, ``Infinity``, ``1e999``) as None
while parsing: the same as ``finite(json.loads(...))`` without walking the result after
(a snapshot of 2,048 nodes' reasons spent ~4 ms on the walk)."""


def parse_json(raw: str | None, *, what: str) -> Any:
    """A JSON column's value (NaN becomes null); unparseable text is returned as is."""
    if raw is None:
        return None
    try:
        return _FINITE_JSON.decode(raw)
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


def latest_telemetry_ts(cur: Cursor, tables: set[str],
                        raw: RawTelemetry | None = None) -> dt.datetime | None:
    """The newest raw sample's ts (``raw``: where samples live; default the table)."""
    source = _raw(raw, tables)
    return None if source is None else source.bounds(cur)[1]


def _raw(raw: RawTelemetry | None, tables: set[str]) -> RawTelemetry | None:
    """Where raw samples are read (the store's ``raw``, default its table); None when
    that is a table that does not exist yet."""
    source = raw or TableTelemetry()
    return None if source.kind == "table" and "telemetry" not in tables else source


def latest_score_ts(cur: Cursor, tables: set[str]) -> dt.datetime | None:
    return _one(cur, "SELECT max(ts) FROM node_scores") if "node_scores" in tables else None


def scored_node_count(cur: Cursor, tables: set[str]) -> int:
    if "node_scores" not in tables:
        return 0
    return int(_one(cur, "SELECT count(*) FROM latest_node_scores"))


def node_risk(row: tuple[Any, ...]) -> dict[str, Any]:
    """(node, risk, reasons JSON, top GPU, ts, model id) as the API's JSON."""
    node, risk, reasons_raw, top_gpu, ts, model_id = row
    return {
        "node": node,
        "risk": finite(risk),
        "reasons": reasons(reasons_raw),
        "top_gpu_uuid": top_gpu,
        "scored_at": iso_z(ts),
        "model_id": model_id,
    }


def nodes_with_gpu_model(cur: Cursor, gpu_model: str) -> set[str]:
    """The nodes with a scored GPU whose model contains ``gpu_model``, case-insensitive
    (``gpu_scores`` must exist)."""
    return {r[0] for r in cur.execute(_WITH_GPU_MODEL, [gpu_model]).fetchall()}


_LABELLED = "SELECT node FROM node_labels WHERE key = ? AND value = ?"
_WITH_GPU_MODEL = ("SELECT DISTINCT node FROM gpu_scores "
                   "WHERE contains(lower(model), lower(?))")


def _risk_filter(tables: set[str], *, min_risk: float | None,
                 labels: list[tuple[str, str]], gpu_model: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) over the latest node scores."""
    conds: list[str] = ["TRUE"]
    params: list[Any] = []
    if min_risk is not None:
        conds.append("risk >= ?")
        params.append(min_risk)
    for key, value in labels:
        if "node_labels" not in tables:
            return "FALSE", []
        conds.append(f"node IN ({_LABELLED})")
        params += [key, value]
    if gpu_model is not None:
        if "gpu_scores" not in tables:
            return "FALSE", []
        conds.append(f"node IN ({_WITH_GPU_MODEL})")
        params.append(gpu_model)
    return " AND ".join(conds), params


def risk_page(cur: Cursor, tables: set[str], *, limit: int | None = None, offset: int = 0,
              min_risk: float | None = None, labels: list[tuple[str, str]] | None = None,
              gpu_model: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """One page of the latest node scores, highest risk first (unscorable nodes last),
    and how many nodes match in all, read from the score tables (the API serves the same
    from memory: ``latest_scores.LatestScores.risk_page``).

    ``labels``: (key, value) pairs the node must all carry; ``gpu_model``: the node has a
    GPU whose model contains this text (case-insensitive: 'h100' matches 'NVIDIA H100
    80GB HBM3').
    """
    if "node_scores" not in tables:
        return [], 0
    where, params = _risk_filter(tables, min_risk=min_risk, labels=labels or [],
                                 gpu_model=gpu_model)
    page = "" if limit is None else "LIMIT ? OFFSET ?"
    rows = cur.execute(
        f"""SELECT *, count(*) OVER () FROM ({_LATEST_NODE_SCORES})
        WHERE {where}
        ORDER BY risk DESC NULLS LAST, node
        {page}""",
        params + ([] if limit is None else [limit, offset]),
    ).fetchall()
    if rows:
        total = int(rows[0][-1])
    elif offset:
        total = int(_one(cur, f"SELECT count(*) FROM ({_LATEST_NODE_SCORES}) WHERE {where}",
                         params))
    else:
        total = 0
    nodes = [node_risk(r[:-1]) for r in rows]
    attach_labels(cur, tables, nodes)
    return nodes, total


def ranked_nodes(cur: Cursor, tables: set[str], *, limit: int | None = None,
                 min_risk: float | None = None) -> list[dict[str, Any]]:
    """The latest score of each node, highest risk first (unscorable nodes last)."""
    return risk_page(cur, tables, limit=limit, min_risk=min_risk)[0]


# -- labels ------------------------------------------------------------------------------------
def node_labels(cur: Cursor, tables: set[str], nodes: list[str]) -> dict[str, dict[str, str]]:
    """{node: {key: value}} for ``nodes`` (nodes without labels are absent)."""
    if "node_labels" not in tables or not nodes:
        return {}
    out: dict[str, dict[str, str]] = {}
    rows = cur.execute("SELECT node, key, value FROM node_labels "
                       "WHERE list_contains(?, node) ORDER BY node, key", [nodes]).fetchall()
    for node, key, value in rows:
        out.setdefault(node, {})[key] = value
    return out


_labels_set = 0
"""How many times this process has called ``set_labels`` (part of ``labels_version``)."""


def labels_version(cur: Cursor) -> tuple[Any, ...]:
    """Changes with every write to ``node_labels``: rows and newest update, and this
    process's count of ``set_labels`` calls (a replace keeps both when the clock stands
    still). Only a rewrite in place by something else goes unseen."""
    rows, newest = cur.execute("SELECT count(*), max(updated_at) FROM node_labels").fetchall()[0]
    return int(rows), newest, _labels_set


def labels_written() -> int:
    """This process's count of ``set_labels`` calls (the last part of ``labels_version``)."""
    return _labels_set


def all_labels(cur: Cursor) -> dict[str, dict[str, str]]:
    """{node: {key: value}} of every labelled node (``node_labels`` must exist)."""
    out: dict[str, dict[str, str]] = {}
    for node, key, value in cur.execute(
            "SELECT node, key, value FROM node_labels ORDER BY node, key").fetchall():
        out.setdefault(node, {})[key] = value
    return out


def labels_reader(store: Any) -> Callable[[str], dict[str, str]]:
    """``node -> its labels``, read from ``store`` at each call: the alert engine's
    ``node_labels`` (a node's partition reaches alerts, and Alertmanager's routes)."""

    def read(node: str) -> dict[str, str]:
        cur = store.cursor()
        try:
            return node_labels(cur, existing_tables(cur), [node]).get(node, {})
        finally:
            cur.close()

    return read


def attach_labels(cur: Cursor, tables: set[str], rows: list[dict[str, Any]]) -> None:
    """Set ``row["labels"]`` on each row (a node's label map, {} when it has none)."""
    found = node_labels(cur, tables, [r["node"] for r in rows])
    for r in rows:
        r["labels"] = found.get(r["node"], {})


def set_labels(cur: Cursor, node: str, labels: dict[str, str],
               now: dt.datetime) -> dict[str, str]:
    """Replace the node's labels with ``labels`` (an empty map removes them all)."""
    cur.execute(LABELS_DDL)
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute("DELETE FROM node_labels WHERE node = ?", [node])
        if labels:
            cur.executemany("INSERT INTO node_labels VALUES (?, ?, ?, ?)",
                            [[node, k, v, now] for k, v in sorted(labels.items())])
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    global _labels_set
    _labels_set += 1
    return node_labels(cur, {"node_labels"}, [node]).get(node, {})


def _latest_samples(cur: Cursor, tables: set[str], raw: RawTelemetry | None,
                    since: dt.datetime | None = None, **which: str) -> list[dict[str, Any]]:
    """The newest sample of each GPU chosen by ``which`` (node= / gpu_uuid=), JSON-ready
    (``since``: see ``RawTelemetry.latest_samples``)."""
    source = _raw(raw, tables)
    out: list[dict[str, Any]] = []
    for sample in ([] if source is None else source.latest_samples(cur, since=since,
                                                                   **which)):
        sample = finite(sample)
        sample["ts"] = iso_z(sample["ts"])
        out.append(sample)
    return out


TELEMETRY_WINDOW = dt.timedelta(minutes=10)
"""How far before a scored node's latest score ``node_detail`` looks for its GPUs'
newest samples (agents report every minute; a score's ts is its newest sample's) before
reading all of the node's telemetry (see ``node_detail``)."""


def gpu_score(uuid: str, index: Any, model: Any, risk: Any, reasons_raw: Any,
              ts: Any) -> dict[str, Any]:
    """A GPU's score row as ``node_detail``'s JSON (no telemetry yet)."""
    return {"gpu_uuid": uuid, "gpu_index": index, "model": model, "risk": finite(risk),
            "reasons": reasons(reasons_raw), "scored_at": iso_z(ts), "telemetry": None}


def telemetry_since(latest: dict[str, Any]) -> dt.datetime:
    """From when ``node_detail`` reads a scored node's GPUs' newest samples: its latest
    score's ts minus ``TELEMETRY_WINDOW``."""
    return dt.datetime.fromisoformat(latest["scored_at"].removesuffix("Z")) - TELEMETRY_WINDOW


def node_detail(cur: Cursor, tables: set[str], node: str,
                raw: RawTelemetry | None = None, *, latest: dict[str, Any] | None = None,
                latest_gpus: Sequence[dict[str, Any]] = (),
                labels: dict[str, str] | None = None,
                samples: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The node's latest score and its GPUs (score + latest telemetry); None if unknown.

    ``latest``, ``latest_gpus``: the node's latest score and its GPUs' (the scorer's
    meaning, held by ``latest_scores.Snapshot``), when it has one; then the only read is
    its GPUs' newest samples from ``TELEMETRY_WINDOW`` before the node's score on, bounded
    (all of the node's telemetry only when a scored GPU has no sample there), and a GPU
    in neither is left out: it left the node. Without ``latest`` (a node that stopped
    reporting, or an unknown one) the node's whole history is read: its newest score and
    each GPU's, however old. ``labels``: the node's labels, if already known.
    ``samples``: with ``latest``, the GPUs' newest samples since then, if already known
    (``latest_samples.LatestSamples``: no read at all).
    """
    score = None
    gpus: dict[str, dict[str, Any]] = {}
    since = None
    if latest is not None:
        score = dict(latest)
        gpus = {g["gpu_uuid"]: dict(g) for g in latest_gpus}
        since = telemetry_since(latest)
    else:
        samples = None
        if "node_scores" in tables:
            row = cur.execute(
                "SELECT node, CASE WHEN isfinite(risk) THEN risk END, reasons, top_gpu_uuid, "
                "ts, model_id FROM node_scores WHERE node = ? ORDER BY ts DESC LIMIT 1",
                [node],
            ).fetchone()
            score = node_risk(row) if row else None
        if "gpu_scores" in tables:
            rows = cur.execute(
                """SELECT gpu_uuid, gpu_index, model, risk, reasons, ts
                FROM gpu_scores WHERE node = ?
                QUALIFY row_number() OVER (PARTITION BY gpu_uuid ORDER BY ts DESC) = 1""",
                [node],
            ).fetchall()
            for row in rows:
                gpus[row[0]] = gpu_score(*row)
    if samples is None:
        samples = _latest_samples(cur, tables, raw, since, node=node)
    recent = {s["gpu_uuid"] for s in samples}
    if since is not None and not set(gpus) <= recent:  # a scored GPU went quiet
        samples = [s for s in _latest_samples(cur, tables, raw, node=node)
                   if s["gpu_uuid"] in gpus or s["gpu_uuid"] in recent]
    for sample in samples:
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
    if labels is None:
        labels = node_labels(cur, tables, [node]).get(node, {})
    return {**score, "labels": dict(labels), "gpus": ordered}


NIC_WINDOW = dt.timedelta(hours=1)
"""How far before the node's newest NIC sample ``node_nics`` looks for each port's newest."""


def node_nics(cur: Cursor, tables: set[str], node: str) -> list[dict[str, Any]]:
    """Each InfiniBand/RoCE port of ``node``: its newest sample (state, rate, counters,
    the ones that saturated) and, from ``nic_hourly``, its flaps and link_downed and
    symbol-error increases over the 24 h before that sample. Bounded reads: the node's
    newest NIC ts, then its samples of the hour before it (a port silent for longer is
    left out), then 24 rollup hours."""
    if "nic_telemetry" not in tables:
        return []
    newest = cur.execute("SELECT max(ts) FROM nic_telemetry WHERE node = ?",
                         [node]).fetchall()[0][0]
    if newest is None:
        return []
    from fleetcare.pipeline.nic_rollup import COUNTERS

    cols = ["device", "port", "ts", "link_layer", "state", "phys_state", "rate_gbps",
            "saturated", *COUNTERS]
    rows = cur.execute(
        f"SELECT {', '.join(cols)} FROM nic_telemetry WHERE node = ? AND ts >= ? "
        "QUALIFY row_number() OVER (PARTITION BY device, port ORDER BY ts DESC) = 1 "
        "ORDER BY device, port", [node, newest - NIC_WINDOW]).fetchall()
    day: dict[tuple[str, int], tuple[Any, ...]] = {}
    if "nic_hourly" in tables:
        day = {(d, p): tuple(rest) for d, p, *rest in cur.execute(
            "SELECT device, port, sum(flaps), sum(link_downed_inc), sum(symbol_error_inc) "
            "FROM nic_hourly WHERE node = ? AND hour > ? GROUP BY device, port",
            [node, newest - dt.timedelta(hours=24)]).fetchall()}
    out = []
    for r in rows:
        item = dict(zip(cols, r, strict=True))
        flaps, downed, symbol = day.get((item["device"], item["port"]), (None, None, None))
        out.append({
            "device": item["device"], "port": item["port"], "ts": iso_z(item["ts"]),
            "link_layer": item["link_layer"], "state": item["state"],
            "phys_state": item["phys_state"], "rate_gbps": finite(item["rate_gbps"]),
            "counters": {c: item[c] for c in COUNTERS},
            "saturated": list(item["saturated"] or []),
            "flaps_24h": None if flaps is None else int(flaps),
            "link_downed_24h": None if downed is None else int(downed),
            "symbol_error_24h": None if symbol is None else int(symbol),
        })
    return out


def network_threshold(metrics: Any) -> float | None:
    """A model's network head threshold from its registry metrics (``network_head.
    threshold``), as the alert engine reads it: a number in (0, 1], else None."""
    head = metrics.get("network_head") if isinstance(metrics, dict) else None
    value = head.get("threshold") if isinstance(head, dict) else None
    if isinstance(value, int | float) and 0.0 < value <= 1.0:
        return float(value)
    return None


def _model_metrics(cur: Cursor, tables: set[str], model_id: str) -> Any:
    """Registered model ``model_id``'s metrics (None: unknown model)."""
    if "models" not in tables:
        return None
    got = cur.execute("SELECT metrics FROM models WHERE model_id = ?", [model_id]).fetchone()
    return parse_json(got[0], what="models.metrics") if got else None


def _model_network_threshold(cur: Cursor, tables: set[str], model_id: str) -> float | None:
    """``network_threshold`` of registered model ``model_id`` (None: unknown model)."""
    return network_threshold(_model_metrics(cur, tables, model_id))


def newest_run_metrics(cur: Cursor, tables: set[str], newest: dt.datetime | None
                       ) -> dict[str, Any] | None:
    """The registry metrics of the model that made the newest scoring run, at ``newest``
    (``latest_score_ts``; None: no run) — None also for a model the registry does not
    hold; where two models scored that time (a promotion while telemetry stalled), the
    current one's, else the first by id."""
    if newest is None or "node_scores" not in tables or "models" not in tables:
        return None
    row = cur.execute(
        "SELECT s.model_id FROM (SELECT DISTINCT model_id FROM node_scores WHERE ts = ?) s "
        "LEFT JOIN models m USING (model_id) "
        "ORDER BY coalesce(m.is_current, false) DESC, s.model_id LIMIT 1",
        [newest]).fetchone()
    got = _model_metrics(cur, tables, row[0]) if row else None
    return got if isinstance(got, dict) else None


def alarm_point(metrics: dict[str, Any] | None) -> tuple[float, float] | None:
    """The (risk threshold, hold in seconds) a model's registry metrics name as its
    operating point (``threshold``, ``hold_h``), or None: none named, or not a risk in
    (0, 1] with a finite hold >= 0. ``/metrics`` exports it; the alert engine's
    ``operating_point`` reads the same two through it."""
    if metrics is None:
        return None
    threshold, hold_h = metrics.get("threshold"), metrics.get("hold_h") or 0.0
    if (not isinstance(threshold, int | float) or isinstance(threshold, bool)
            or not isinstance(hold_h, int | float) or isinstance(hold_h, bool)):
        return None
    if not (0.0 < threshold <= 1.0 and math.isfinite(hold_h) and hold_h >= 0.0):
        return None
    return float(threshold), float(hold_h) * 3600.0


def network_risks(cur: Cursor, tables: set[str], newest: dt.datetime | None
                  ) -> tuple[list[tuple[str, float]], float | None]:
    """The network head's probability of each node in the newest scoring run, at
    ``newest`` (``latest_score_ts``; none when that run's model has no head), and the
    threshold its model alarms at (None: none)."""
    if newest is None or "node_network_scores" not in tables:
        return [], None
    rows = cur.execute(
        "SELECT node, p_net, model_id FROM node_network_scores "
        "WHERE ts = ? AND isfinite(p_net) ORDER BY node", [newest]).fetchall()
    if not rows:
        return [], None
    return ([(str(n), float(p)) for n, p, _ in rows],
            _model_network_threshold(cur, tables, rows[0][2]))


def node_network_risk(cur: Cursor, tables: set[str], node: str) -> dict[str, Any] | None:
    """The network head's newest probability for ``node`` (``node_network_scores``) and
    the threshold its model alarms at (``metrics.network_head.threshold``; None: one
    threshold for both heads); None when no model with a head scored the node."""
    if "node_network_scores" not in tables:
        return None
    row = cur.execute("SELECT ts, p_net, model_id FROM node_network_scores WHERE node = ? "
                      "ORDER BY ts DESC LIMIT 1", [node]).fetchone()
    if row is None:
        return None
    ts, p_net, model_id = row
    return {"ts": iso_z(ts), "p_net": finite(p_net), "model_id": model_id,
            "threshold": _model_network_threshold(cur, tables, model_id)}


def gpu_detail(cur: Cursor, tables: set[str], gpu_uuid: str,
               raw: RawTelemetry | None = None) -> dict[str, Any] | None:
    """One GPU: its latest score and latest sample, and its node; None if unknown."""
    out: dict[str, Any] | None = None
    if "gpu_scores" in tables:
        row = cur.execute(
            """SELECT node, gpu_index, model, CASE WHEN isfinite(risk) THEN risk END,
                      reasons, ts, model_id
            FROM gpu_scores WHERE gpu_uuid = ? ORDER BY ts DESC LIMIT 1""", [gpu_uuid],
        ).fetchone()
        if row is not None:
            node, index, model, risk, reasons_raw, ts, model_id = row
            out = {"gpu_uuid": gpu_uuid, "node": node, "gpu_index": index, "model": model,
                   "risk": risk, "reasons": reasons(reasons_raw), "scored_at": iso_z(ts),
                   "model_id": model_id, "telemetry": None}
    for sample in _latest_samples(cur, tables, raw, gpu_uuid=gpu_uuid):
        if out is None:
            out = {"gpu_uuid": gpu_uuid, "node": sample["node"],
                   "gpu_index": sample["gpu_index"], "model": sample["model"],
                   "risk": None, "reasons": [], "scored_at": None, "model_id": None}
        out["telemetry"] = sample
    return out


def alerts(cur: Cursor, tables: set[str], *, state: str | None = None,
           node: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Alerts, newest first, from the alerts engine's ``alerts`` table.

    Only the columns of ``ALERT_COLUMNS`` are read, so the engine may add its own.
    """
    if "alerts" not in tables:
        return []
    have = table_columns(cur, "alerts")
    cols = [c if c in have else f"NULL AS {c}" for c in ALERT_COLUMNS]
    conds, params = ["TRUE"], []
    for col, val in (("state", state), ("node", node)):
        if val is not None and col in have:
            conds.append(f"{col} = ?")
            params.append(val)
    order = "started_at DESC NULLS LAST, " if "started_at" in have else ""
    order += "id" if "id" in have else "1"
    rows = cur.execute(f"SELECT {', '.join(cols)} FROM alerts WHERE {' AND '.join(conds)} "
                       f"ORDER BY {order} LIMIT ?", params + [limit]).fetchall()
    out = []
    for row in rows:
        a = dict(zip(ALERT_COLUMNS, row, strict=True))
        out.append({
            "id": None if a["id"] is None else str(a["id"]),
            "node": a["node"], "state": a["state"], "risk": finite(a["risk"]),
            "started_at": iso_z(a["started_at"]), "fired_at": iso_z(a["fired_at"]),
            "resolved_at": iso_z(a["resolved_at"]),
            "top_gpu_uuid": a["top_gpu_uuid"], "model_id": a["model_id"],
            "p_net": finite(a["p_net"]),
            "reasons": reasons(a["reasons"]) if isinstance(a["reasons"], str | None)
            else [str(r) for r in a["reasons"]],
        })
    return out


def held_drains(cur: Cursor, tables: set[str]) -> list[dict[str, Any]]:
    """The ``drains`` rows fleetcare still holds (not resumed), by node."""
    if "drains" not in tables:
        return []
    return [{"node": d.node, "scheduler": d.scheduler, "drained_at": iso_z(d.drained_at),
             "review_at": iso_z(d.review_at), "risk": finite(d.risk), "reason": d.reason,
             "cleared_at": iso_z(d.cleared_at), "cleared_by": d.cleared_by}
            for d in audit.held_drains(cur).values()]


def drain_stats(cur: Cursor, tables: set[str], now: dt.datetime) -> dict[str, Any]:
    """What the drain controller holds and has done (``drains`` / ``drain_audit``).

    ``held``: (scheduler, count) of the drains fleetcare holds; ``overdue``: how many of
    them are past their review time at ``now`` (naive UTC); ``actions``: (action, result
    class, count) of real, not dry-run, audit rows, the result class being the result up
    to its colon (``ok``, ``refused``, ``error``, ``held``); ``last_action``: the newest
    real audit row's time.
    """
    out: dict[str, Any] = {"held": [], "overdue": 0, "actions": [], "last_action": None}
    if "drains" in tables:
        out["held"] = cur.execute(
            "SELECT scheduler, count(*) FROM drains WHERE resumed_at IS NULL "
            "GROUP BY scheduler ORDER BY scheduler").fetchall()
        out["overdue"] = int(_one(cur, "SELECT count(*) FROM drains WHERE resumed_at IS NULL "
                                  "AND review_at <= ?", [now]))
    if "drain_audit" in tables:
        out["actions"] = cur.execute(
            "SELECT action, split_part(result, ':', 1), count(*) FROM drain_audit "
            "WHERE NOT dry_run GROUP BY ALL ORDER BY 1, 2").fetchall()
        out["last_action"] = _one(cur, "SELECT max(ts) FROM drain_audit WHERE NOT dry_run")
    return out


ALERT_STATES = ("pending", "firing")
MESSAGE_STATES = ("pending", "delivered", "dead")


def alert_stats(cur: Cursor, tables: set[str]) -> dict[str, list[tuple[str, int]]]:
    """Open alerts by state (``pending``, ``firing``) and alert messages in the outbox by
    state (``pending``: not yet taken by the receiver, ``delivered``, ``dead``: given up).
    Every state is listed, 0 when none, so a dashboard sees 0 rather than no data."""
    open_ = dict.fromkeys(ALERT_STATES, 0)
    messages = dict.fromkeys(MESSAGE_STATES, 0)
    if "alerts" in tables:
        for state, n in cur.execute("SELECT state, count(*) FROM alerts WHERE state IN "
                                    "('pending', 'firing') GROUP BY state").fetchall():
            open_[state] = int(n)
    if "alert_outbox" in tables:
        for state, n in cur.execute("SELECT state, count(*) FROM alert_outbox "
                                    "GROUP BY state").fetchall():
            messages[state] = int(n)
    return {"open": list(open_.items()), "messages": list(messages.items())}



MODEL_PROVENANCE = ("origin", "current_reason")
"""Registry columns a store made before the fleet prior (issue 12) may lack."""


def table_columns(cur: Cursor, table: str) -> set[str]:
    """The columns ``table`` has in this database (one made by an older version may lack
    some)."""
    return {r[0] for r in cur.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
        "AND schema_name = current_schema() AND database_name = current_database()",
        [table]).fetchall()}


def select_columns(cur: Cursor, table: str, columns: Sequence[str]) -> list[str]:
    """``columns`` of ``table`` as select items, ``NULL AS c`` for each one it lacks."""
    have = table_columns(cur, table)
    return [c if c in have else f"NULL AS {c}" for c in columns]


def current_model(cur: Cursor, tables: set[str]) -> dict[str, Any] | None:
    """The registry row flagged ``is_current`` (newest if several); None if none."""
    if "models" not in tables:
        return None
    extra = ", ".join(select_columns(cur, "models", MODEL_PROVENANCE))
    row = cur.execute(
        f"""SELECT model_id, created_at, horizon_h, features, params, metrics, {extra}
        FROM models WHERE is_current ORDER BY created_at DESC NULLS LAST LIMIT 1"""
    ).fetchone()
    if row is None:
        return None
    model_id, created_at, horizon_h, features, params, metrics, origin, reason = row
    return {
        "model_id": model_id,
        "created_at": iso_z(created_at),
        "origin": origin or "fleet",
        "current_reason": reason,
        "horizon_h": finite(horizon_h),
        "features": parse_json(features, what="models.features"),
        "params": parse_json(params, what="models.params"),
        "metrics": parse_json(metrics, what="models.metrics"),
    }
