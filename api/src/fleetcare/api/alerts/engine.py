"""The alert engine: reads each new scoring run from ``node_scores``, steps the rule for
every node, and writes alert changes and their messages in one transaction per run.

    engine = AlertEngine.from_config(store, load_config())   # or AlertEngine(store, cfg, ...)
    engine.evaluate(now)            # after each scoring run (now: epoch s or datetime)
    engine.outbox.deliver_due(now)  # then send what is due

Table ``alerts`` (read by ``GET /v1/alerts``)::

    id VARCHAR, node VARCHAR, state VARCHAR  -- pending | firing | resolved
    risk DOUBLE, started_at TIMESTAMP, fired_at TIMESTAMP, resolved_at TIMESTAMP,
    reasons VARCHAR  -- JSON list of sentences
    updated_at TIMESTAMP, resolving_since TIMESTAMP, peak_risk DOUBLE,
    top_gpu_uuid VARCHAR, model_id VARCHAR,
    p_net DOUBLE  -- the network head's probability (the latest run's), when read

``risk`` is the latest run's; ``updated_at`` is when the engine last wrote the row. At most one pending or
firing row per node. The last evaluated run's ts is kept in ``meta`` (key
``alerts.evaluated_through``), written in the same transaction, so a restart neither
repeats nor skips a run; the first evaluation ever starts ``for_s`` before the newest run.

Routing: a firing event goes to every sink that ``wants`` it (events, min_risk, label
globs); a sink that starts wanting a still-firing alert (its risk rose past the sink's
min_risk) gets it then; with ``repeat_interval_s`` each sink is re-sent the firing event
that often. A resolved event goes to the sinks that were sent this alert's firing event and
take resolved events, so PagerDuty resolves exactly what it triggered. A sink's own
``repeat_interval`` overrides ``[alerts]``'s (alertmanager-api: 1 min, so Alertmanager
keeps the alert); repeats are due in every run, also one the firing node is missing from.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from fleetcare.api import queries
from fleetcare.api.alerts import outbox as outbox_mod
from fleetcare.api.alerts import sinks as sinks_mod
from fleetcare.api.alerts.config import AlertsConfig, SinkConfig
from fleetcare.api.alerts.outbox import Outbox, to_epoch, to_naive_utc
from fleetcare.api.alerts.rules import Alert, Rule, Score
from fleetcare.api.alerts.sinks import AlertEvent, Sink
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

CURSOR_KEY = "alerts.evaluated_through"
MAX_RUNS_PER_CALL = 1000
DDL = """
CREATE TABLE IF NOT EXISTS alerts (
  id VARCHAR NOT NULL, node VARCHAR NOT NULL, state VARCHAR NOT NULL, risk DOUBLE,
  started_at TIMESTAMP, fired_at TIMESTAMP, resolved_at TIMESTAMP, reasons VARCHAR,
  updated_at TIMESTAMP, resolving_since TIMESTAMP, peak_risk DOUBLE, top_gpu_uuid VARCHAR,
  model_id VARCHAR
);
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS p_net DOUBLE;
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
"""
_COLS = ("id", "node", "state", "risk", "started_at", "fired_at", "resolved_at", "reasons",
         "updated_at", "resolving_since", "peak_risk", "top_gpu_uuid", "model_id", "p_net")

NodeLabels = Callable[[str], Mapping[str, str]]


def ensure_schema(cur: Any) -> None:
    cur.execute(DDL).fetchall()
    outbox_mod.ensure_schema(cur)


class Point(NamedTuple):
    """A model's operating point as the alert rule takes it (``operating_point``)."""

    threshold: float
    for_s: float
    immediate: float | None
    network: float | None = None
    """The network head's own threshold on its probability (None: one for both)."""


def operating_point(metrics: Mapping[str, Any]) -> Point | None:
    """The operating point a model's registry metrics measured it at: the fleet prior's
    threshold held ``hold_h`` or its ``immediate`` risk at once, and its network head's
    own threshold (``network_head.threshold``; ``fleetcare models list`` prints them), a
    fleet model's threshold within the budget on its own held-out data at once; None when
    the metrics name no threshold or an unusable one (``queries.alarm_point``: a risk in
    (0, 1] held a finite time; logged, and the configured rule applies)."""
    if metrics.get("threshold") is None:
        return None
    named = dict(metrics)
    point = queries.alarm_point(named)
    if point is None:
        log.error("alerts.bad_operating_point threshold=%r hold_h=%r: the registry's "
                  "threshold must be a risk in (0, 1] and hold_h a number of hours >= 0; "
                  "alerting on the configured rule", metrics.get("threshold"),
                  metrics.get("hold_h"))
        return None
    threshold, for_s = point
    immediate = metrics.get("immediate")
    if not isinstance(immediate, int | float) or isinstance(immediate, bool):
        immediate = None
    head = metrics.get("network_head")
    network = queries.network_threshold(named)
    if network is None and isinstance(head, Mapping) and head.get("threshold") is not None:
        log.error("alerts.bad_network_threshold value=%r: the registry's network head "
                  "threshold must be in (0, 1]; alerting on the risk alone",
                  head.get("threshold"))
    return Point(threshold, for_s,
                 None if immediate is None else max(float(immediate), threshold), network)


class AlertEngine:
    def __init__(self, store: Store, config: AlertsConfig, *, outbox: Outbox,
                 sinks: Mapping[str, Sink] | None = None,
                 node_labels: NodeLabels | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.rule = Rule(config.threshold, config.for_s, config.resolve_threshold,
                         config.resolve_for_s, config.immediate_threshold)
        self.point_of: str | None = None
        """With ``threshold = "model"``: the model whose operating point ``rule`` holds."""
        self._point: tuple[str | None, Any] = (None, None)
        self._read: tuple[str, dict[str, Any]] | None | bool = False
        """The current model's id and metrics as ``current_rule`` last read them."""
        self.outbox = outbox
        self.sinks = dict(sinks) if sinks is not None else dict(outbox.sinks)
        self.node_labels = node_labels or (lambda node: {})
        self.clock = clock
        self._lock = outbox_mod.store_lock(store)
        ensure_schema(store.cursor())

    @classmethod
    def from_config(cls, store: Store, config: AlertsConfig, *,
                    node_labels: NodeLabels | None = None, post: outbox_mod.Post | None = None,
                    clock: Callable[[], float] = time.time,
                    rng: Callable[[], float] = random.random) -> AlertEngine:
        """The engine and its outbox (``engine.outbox``) with the configured sinks."""
        sinks = {s.name: sinks_mod.build(s) for s in config.sinks}
        box = Outbox(store, sinks, post=post or outbox_mod.urllib_post,
                     timeout_s=config.timeout_s, base_s=config.retry_base_s,
                     cap_s=config.retry_cap_s, jitter=config.retry_jitter,
                     max_age_s=config.max_age_s, rng=rng, clock=clock)
        return cls(store, config, outbox=box, sinks=sinks, node_labels=node_labels,
                   clock=clock)

    def current_rule(self) -> Rule:
        """The rule in force: the configured one, or with ``threshold = "model"`` the
        current model's operating point (``operating_point``), read again each time so a
        promoted model's point applies from its first scoring run."""
        if not self.config.from_model:
            return self.rule
        from fleetcare.models import registry

        rec = registry.current(self.store)
        read = None if rec is None else (rec.model_id, rec.metrics)  # a fresh dict per read
        if read == self._read:  # the same model and metrics: the rule already holds them
            return self.rule
        point = operating_point(rec.metrics) if rec is not None else None
        who = rec.model_id if point is not None and rec is not None else None
        if (who, point) != self._point:  # another model, or its operating point rewritten
            c = self.config
            threshold, for_s, immediate, network = point or Point(
                c.threshold, c.for_s, c.immediate_threshold)
            self.rule = Rule(threshold, for_s, min(c.resolve_threshold, threshold),
                             c.resolve_for_s, immediate, network)
            self.point_of, self._point = who, (who, point)
            log.info("alerts.operating_point model=%s threshold=%.4f for_s=%g immediate=%s "
                     "network=%s", who or "none (the configured fallback)", threshold, for_s,
                     immediate, network)
        self._read = read  # read (an unusable value logged) once per model or rewrite
        return self.rule

    # -- the loop ---------------------------------------------------------------------------
    def evaluate(self, now: float | dt.datetime | None = None) -> list[AlertEvent]:
        """Process every scoring run not evaluated yet; returns the events enqueued."""
        when = to_naive_utc(to_epoch(self.clock() if now is None else now))
        events: list[AlertEvent] = []
        with self._lock:
            cur = self.store.cursor()
            tables = {r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()")
                      .fetchall()}
            if "node_scores" not in tables:
                return []
            self.current_rule()
            row = cur.execute("SELECT value FROM meta WHERE key = ?", [CURSOR_KEY]).fetchone()
            if row is not None:
                runs = cur.execute("SELECT DISTINCT ts FROM node_scores WHERE ts > ? ORDER BY ts "
                                   f"LIMIT {MAX_RUNS_PER_CALL}",
                                   [dt.datetime.fromisoformat(row[0])]).fetchall()
            else:
                runs = cur.execute(
                    "SELECT DISTINCT ts FROM node_scores WHERE ts >= (SELECT max(ts) FROM "
                    f"node_scores) - to_microseconds(CAST(? AS BIGINT)) ORDER BY ts "
                    f"LIMIT {MAX_RUNS_PER_CALL}", [int(self.rule.for_s * 1e6)]).fetchall()
            open_alerts = self._open_alerts(cur)
            network = "node_network_scores" in tables
            for (ts,) in runs:
                with self.store.transaction() as tx:
                    open_alerts, run_events = self._run(tx, ts, open_alerts, when, network)
                    tx.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                               [CURSOR_KEY, ts.isoformat()]).fetchall()
                events.extend(run_events)
        return events

    def _open_alerts(self, cur: Any) -> dict[str, Alert]:
        rows = cur.execute(f"SELECT {', '.join(_COLS)} FROM alerts "
                           "WHERE state IN ('pending', 'firing')").fetchall()
        return {r[1]: _alert(r) for r in rows}

    def _rows(self, tx: Any, ts: dt.datetime, open_nodes: list[str],
              network: bool) -> list[tuple[Any, ...]]:
        """The run's rows the rule needs: at or above the threshold (with the network
        head's probability where the rule has a threshold on it), or of an open alert."""
        rule = self.rule
        # one row per node (two models may have scored this ts: the later id's), then
        # the rule's filter
        if not network or rule.network is None:
            return [(*r, None) for r in tx.execute(
                "SELECT * FROM (SELECT node, risk, reasons, top_gpu_uuid, model_id "
                "FROM node_scores WHERE ts = ? QUALIFY row_number() OVER "
                "(PARTITION BY node ORDER BY model_id DESC) = 1) "
                "WHERE risk >= ? OR list_contains(?::VARCHAR[], node) ORDER BY node",
                [ts, rule.threshold, open_nodes]).fetchall()]
        return tx.execute(
            "SELECT * FROM (SELECT s.node, s.risk, s.reasons, s.top_gpu_uuid, s.model_id, "
            "n.p_net FROM node_scores s LEFT JOIN node_network_scores n "
            "ON n.ts = s.ts AND n.node = s.node AND n.model_id = s.model_id "
            "WHERE s.ts = ? QUALIFY row_number() OVER "
            "(PARTITION BY s.node ORDER BY s.model_id DESC) = 1) "
            "WHERE risk >= ? OR coalesce(p_net >= ?, false) "
            "OR list_contains(?::VARCHAR[], node) ORDER BY node",
            [ts, rule.threshold, rule.network, open_nodes]).fetchall()

    def _run(self, tx: Any, ts: dt.datetime, open_alerts: dict[str, Alert],
             when: dt.datetime, network: bool = False
             ) -> tuple[dict[str, Alert], list[AlertEvent]]:
        scores: dict[str, Score] = {}
        for node, risk, reasons, gpu, model_id, p_net in self._rows(
                tx, ts, list(open_alerts), network):
            if node not in scores:
                score = Score(ts, node, float(risk), _reasons(reasons), gpu, model_id,
                              None if p_net is None else float(p_net))
                scores[node] = self._with_network_reason(score)
        still_open: dict[str, Alert] = {}
        events: list[AlertEvent] = []
        for node in sorted(set(scores) | set(open_alerts)):
            before = open_alerts.get(node)
            alert, change = self.rule.step(before, scores.get(node), ts)
            if change == "dropped" and before is not None:
                tx.execute("DELETE FROM alerts WHERE id = ?", [before.id]).fetchall()
                log.info("alerts.dropped node=%s id=%s", node, before.id)
            elif alert is not None and change != "none":
                self._save(tx, alert, when)
            if alert is not None and alert.state != "resolved":
                still_open[node] = alert
            if alert is None:
                continue
            if change == "firing":
                log.warning("alerts.firing node=%s id=%s risk=%.3f", node, alert.id, alert.risk)
                events += self._route_firing(tx, alert, ts, when)
            elif change in ("updated", "none") and alert.state == "firing":
                events += self._route_firing(tx, alert, ts, when)  # repeats, when due
            elif change == "resolved":
                log.warning("alerts.resolved node=%s id=%s risk=%.3f", node, alert.id,
                            alert.risk)
                events += self._route_resolved(tx, alert, ts, when)
        return still_open, events

    def _with_network_reason(self, score: Score) -> Score:
        """A node the network head's own threshold raises says so first (its risk alone
        is under the threshold it is alerted at)."""
        if (not self.rule.lifted(score) or score.risk >= self.rule.threshold
                or any(r.startswith("network risk") for r in score.reasons)):
            return score
        assert score.p_net is not None and self.rule.network is not None
        first = (f"network risk {score.p_net:.0%}: at or above this model's alarm threshold "
                 f"for network failures ({self.rule.network:.1%})")
        return replace(score, reasons=(first, *score.reasons))

    def _save(self, tx: Any, alert: Alert, when: dt.datetime) -> None:
        alert = replace(alert, updated_at=when)
        tx.execute("DELETE FROM alerts WHERE id = ?", [alert.id]).fetchall()
        values = [getattr(alert, c) for c in _COLS]
        values[_COLS.index("reasons")] = json.dumps(list(alert.reasons))
        tx.execute(f"INSERT INTO alerts ({', '.join(_COLS)}) VALUES "
                   f"({', '.join('?' * len(_COLS))})", values).fetchall()

    # -- routing ---------------------------------------------------------------------------------
    def _event(self, alert: Alert, status: str, ts: dt.datetime, repeat: bool) -> AlertEvent:
        assert alert.fired_at is not None
        return AlertEvent(
            event_id=f"{alert.id}:{status}:{ts:%Y%m%dT%H%M%SZ}", alert_id=alert.id,
            status=status,  # type: ignore[arg-type]
            node=alert.node, risk=alert.risk, peak_risk=alert.peak_risk,
            threshold=self.rule.threshold, started_at=alert.started_at,
            fired_at=alert.fired_at, resolved_at=alert.resolved_at, reasons=alert.reasons,
            labels=dict(self.node_labels(alert.node)), top_gpu_uuid=alert.top_gpu_uuid,
            model_id=alert.model_id, external_url=self.config.external_url, repeat=repeat,
            p_net=alert.p_net, network_threshold=self.rule.network,
            level=self.rule.alert_level(alert))

    def _sent(self, tx: Any, alert_id: str) -> dict[str, dt.datetime]:
        """Sink name -> when this alert's firing event was last enqueued for it."""
        return dict(tx.execute(
            "SELECT sink, max(created_at) FROM alert_outbox WHERE alert_id = ? AND "
            "event = 'firing' GROUP BY sink", [alert_id]).fetchall())

    def _sink_cfgs(self) -> list[SinkConfig]:
        return [s for s in self.config.sinks if s.name in self.sinks]

    def _route_firing(self, tx: Any, alert: Alert, ts: dt.datetime,
                      when: dt.datetime) -> list[AlertEvent]:
        sent = self._sent(tx, alert.id)
        out = []
        for cfg in self._sink_cfgs():
            repeat_s = (cfg.repeat_interval_s if cfg.repeat_interval_s is not None
                        else self.config.repeat_interval_s)
            last = sent.get(cfg.name)
            if last is not None and (repeat_s is None
                                     or (when - last).total_seconds() < repeat_s):
                continue
            event = self._event(alert, "firing", ts, repeat=last is not None)
            if sinks_mod.wants(cfg, event):
                self.outbox.enqueue(tx, self.sinks[cfg.name], event, when)
                out.append(event)
        return out

    def _route_resolved(self, tx: Any, alert: Alert, ts: dt.datetime,
                        when: dt.datetime) -> list[AlertEvent]:
        sent = self._sent(tx, alert.id)
        event = self._event(alert, "resolved", ts, repeat=False)
        out = []
        for cfg in self._sink_cfgs():
            if cfg.name in sent and sinks_mod.wants(cfg, event):
                self.outbox.enqueue(tx, self.sinks[cfg.name], event, when)
                out.append(event)
        return out

    # -- reading ----------------------------------------------------------------------------------
    def alerts(self, *, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Rows of ``alerts``, newest first, as JSON-ready dicts."""
        return list_alerts(self.store.cursor(), state=state, limit=limit)


def list_alerts(cur: Any, *, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    where, params = ("WHERE state = ?", [state]) if state else ("", [])
    have = {r[0] for r in cur.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'alerts'").fetchall()}
    cols = [c if c in have else f"NULL AS {c}" for c in _COLS]  # a table from before a column
    rows = cur.execute(f"SELECT {', '.join(cols)} FROM alerts {where} "
                       "ORDER BY coalesce(fired_at, started_at) DESC, node LIMIT ?",
                       [*params, int(limit)]).fetchall()
    out = []
    for r in rows:
        d = dict(zip(_COLS, r, strict=True))
        d["reasons"] = list(_reasons(d["reasons"]))
        for k in ("started_at", "fired_at", "resolved_at", "updated_at", "resolving_since"):
            d[k] = sinks_mod.rfc3339(d[k]) if d[k] is not None else None
        out.append(d)
    return out


def _reasons(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    value = json.loads(raw) if isinstance(raw, str) else raw
    return tuple(str(x) for x in (value or ()))


def _alert(row: tuple[Any, ...]) -> Alert:
    d = dict(zip(_COLS, row, strict=True))
    d["reasons"] = _reasons(d["reasons"])
    d["peak_risk"] = float(d["peak_risk"] if d["peak_risk"] is not None else d["risk"] or 0.0)
    return Alert(**d)
