"""Where alert events go: one ``Sink`` per receiver kind, each rendering the receiver's own
wire format.

    class Sink(Protocol):
        name: str                                   # read-only
        def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]: ...

``render`` is pure: the outbox stores what it returns and POSTs it later (maybe after a
restart). A sink that must sign at send time (the HMAC sink: its timestamp must be fresh
for the receiver's replay window) also has ``sign(headers, body, now) -> headers``, which
the outbox calls just before each attempt.

Kinds: ``AlertmanagerSink`` (webhook_config JSON, version "4": what Alertmanager sends its
receivers), ``AlertmanagerApiSink`` (API v2 ``POST /api/v2/alerts``: fleetcare's alerts
pushed into Alertmanager, so its routing, grouping, inhibition and silences apply; it
adds its credentials at send time, so they are never stored), ``SlackSink`` (incoming
webhook: text + Block Kit blocks), ``PagerDutySink`` (Events API v2 enqueue, trigger /
resolve with dedup_key), ``HmacSink`` (fleetcare JSON signed with HMAC-SHA256; receivers
check it with ``verify_signature``).
"""

from __future__ import annotations

import base64
import datetime as dt
import fnmatch
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from fleetcare.api.alerts.config import DEFAULT_JOB, SinkConfig

ALERTNAME = "FleetcareNodeFailureRisk"
USER_AGENT = "fleetcare-alerts/0.1"
JSON = "application/json"
SIGNATURE_HEADER = "X-Fleetcare-Signature"
TIMESTAMP_HEADER = "X-Fleetcare-Timestamp"
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


@dataclass(frozen=True)
class AlertEvent:
    """One notification: an alert fired (or is still firing: ``repeat``) or resolved."""

    event_id: str                       # unique per alert, status and scoring run
    alert_id: str
    status: Literal["firing", "resolved"]
    node: str
    risk: float                         # the risk of the run that caused the event
    peak_risk: float
    threshold: float
    started_at: dt.datetime             # naive UTC: first run at or above threshold
    fired_at: dt.datetime
    resolved_at: dt.datetime | None
    reasons: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)  # node="...", plus node labels
    top_gpu_uuid: str | None = None
    model_id: str | None = None
    external_url: str = "http://127.0.0.1:8000"
    repeat: bool = False
    p_net: float | None = None          # the network head's probability, when the rule reads it
    network_threshold: float | None = None  # the rule's threshold on it (None: none)
    level: float | None = None
    """What the rule compared with its thresholds (``Rule.level_of``): ``risk``, or the
    threshold for a node its network probability alarms on. Severity and a sink's
    ``min_risk`` read it (None: ``risk``)."""

    @property
    def alarm_level(self) -> float:
        return self.risk if self.level is None else self.level

    @property
    def by_network(self) -> bool:
        """The network head's probability, not the risk, holds this alert."""
        return (self.p_net is not None and self.network_threshold is not None
                and self.alarm_level > self.risk)

    @property
    def node_url(self) -> str:
        return f"{self.external_url}/v1/nodes/{self.node}"


@runtime_checkable
class Sink(Protocol):
    @property
    def name(self) -> str: ...

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]: ...


@runtime_checkable
class SigningSink(Sink, Protocol):
    def sign(self, headers: Mapping[str, str], body: bytes, now: float) -> dict[str, str]: ...


def rfc3339(ts: dt.datetime | None) -> str:
    """Go's RFC 3339 (as Alertmanager writes it): UTC, ``Z``, no trailing zero fraction."""
    if ts is None:
        return GO_ZERO_TIME
    if ts.tzinfo is not None:
        ts = ts.astimezone(dt.UTC).replace(tzinfo=None)
    text = ts.strftime("%Y-%m-%dT%H:%M:%S")
    if ts.microsecond:
        text += ("." + f"{ts.microsecond:06d}").rstrip("0")
    return text + "Z"


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _base_headers() -> dict[str, str]:
    return {"Content-Type": JSON, "User-Agent": USER_AGENT}


def network_fields(event: AlertEvent) -> dict[str, float]:
    """``p_net`` and ``network_threshold`` for a payload, when the rule read them (a model
    whose operating point has a network threshold, a node with InfiniBand ports)."""
    if event.p_net is None or event.network_threshold is None:
        return {}
    return {"p_net": round(event.p_net, 4), "network_threshold": event.network_threshold}


def summary(event: AlertEvent) -> str:
    if event.status == "firing" and event.by_network:
        assert event.p_net is not None and event.network_threshold is not None
        return (f"{event.node}: network failure risk {event.p_net:.3f} from its InfiniBand "
                f"ports (alarms at {event.network_threshold:.3f}; node failure risk "
                f"{event.risk:.2f}) since {rfc3339(event.started_at)}")
    if event.status == "firing":
        return (f"{event.node}: failure risk {event.risk:.2f} >= {event.threshold:.2f} "
                f"since {rfc3339(event.started_at)}")
    if (event.p_net is not None and event.network_threshold is not None
            and event.peak_risk < event.threshold):  # the network raised it
        return (f"{event.node}: network failure risk fell to {event.p_net:.3f} (node failure "
                f"risk {event.risk:.2f})")
    return f"{event.node}: failure risk fell to {event.risk:.2f} (peak {event.peak_risk:.2f})"


# -- Alertmanager ------------------------------------------------------------------------------
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211


def fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus' label-set fingerprint (FNV-1a 64 over sorted name, 0xff, value, 0xff),
    as Alertmanager puts in ``fingerprint``: 16 hex digits."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode("utf-8") + b"\xff":
                h ^= byte
                h = (h * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _labelset(labels: Mapping[str, str]) -> str:
    """Prometheus' LabelSet.String(): ``{a="1", b="2"}``."""
    return "{" + ", ".join(f"{k}={json.dumps(labels[k])}" for k in sorted(labels)) + "}"


@dataclass(frozen=True)
class AlertmanagerSink:
    """Alertmanager's webhook_config payload (version "4"): one group per node."""

    name: str
    url: str
    receiver: str

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]:
        labels = {"alertname": ALERTNAME, **event.labels, "node": event.node}
        annotations = {"summary": summary(event),
                       "description": "; ".join(event.reasons) or "no reasons recorded",
                       "risk": f"{event.risk:.4f}", "alert_id": event.alert_id}
        if event.top_gpu_uuid:
            annotations["top_gpu_uuid"] = event.top_gpu_uuid
        group = {"alertname": ALERTNAME, "node": event.node}
        payload = {
            "receiver": self.receiver,
            "status": event.status,
            "alerts": [{
                "status": event.status, "labels": labels, "annotations": annotations,
                "startsAt": rfc3339(event.fired_at),
                "endsAt": rfc3339(event.resolved_at if event.status == "resolved" else None),
                "generatorURL": event.node_url, "fingerprint": fingerprint(labels)}],
            "groupLabels": group,
            "commonLabels": labels,
            "commonAnnotations": annotations,
            "externalURL": event.external_url,
            "version": "4",
            "groupKey": "{}:" + _labelset(group),
            "truncatedAlerts": 0,
        }
        return self.url, _base_headers(), dumps(payload)


# -- Alertmanager API v2 ------------------------------------------------------------------------
ALERTMANAGER_API_PATH = "/api/v2/alerts"
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """A node label's key as a Prometheus label name (``rack-id`` -> ``rack_id``)."""
    name = _LABEL_NAME.sub("_", key)
    return "_" + name if not name or name[0].isdigit() else name


@dataclass(frozen=True)
class AlertmanagerApiSink:
    """Alertmanager API v2: ``POST {url}/api/v2/alerts`` with one postable alert.

    Labels (the alert's identity in Alertmanager, stable over its life): ``alertname``,
    ``node``, ``severity`` (this sink's), ``job`` (this sink's: the job Prometheus
    scrapes this serve as, so an inhibition ``equal: [job]`` between the rules' alerts
    and these stays within one fleet), and the node's labels (``partition``, ``rack``,
    ...; keys made valid label names). Annotations: summary with the risk, the reasons,
    risk, peak risk, threshold, the fleetcare alert id, model id and riskiest GPU.
    ``startsAt`` is when it fired and ``generatorURL`` the node's page. A firing alert
    has no ``endsAt``: Alertmanager keeps it for its ``resolve_timeout`` and fleetcare
    re-sends it every ``repeat_interval`` (1 min); the resolved one carries
    ``endsAt`` = when fleetcare resolved it.

    ``password`` with ``username`` is HTTP basic auth, ``password`` alone a bearer token
    (Alertmanager's ``--web.config.file`` or a proxy in front of it); both are added by
    ``sign`` at each attempt, never stored in the outbox.
    """

    name: str
    url: str
    severity: str = "warning"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    job: str = DEFAULT_JOB

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith(ALERTMANAGER_API_PATH) else base + ALERTMANAGER_API_PATH

    def labels(self, event: AlertEvent) -> dict[str, str]:
        extra = {label_name(k): str(v) for k, v in event.labels.items() if str(v)}
        return {**extra, "alertname": ALERTNAME, "node": event.node,
                "severity": self.severity, "job": self.job}

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]:
        annotations = {"summary": summary(event),
                       "description": "; ".join(event.reasons) or "no reasons recorded",
                       "risk": f"{event.risk:.4f}", "peak_risk": f"{event.peak_risk:.4f}",
                       "threshold": f"{event.threshold:.4f}", "alert_id": event.alert_id}
        if event.model_id:
            annotations["model_id"] = event.model_id
        if event.top_gpu_uuid:
            annotations["top_gpu_uuid"] = event.top_gpu_uuid
        alert: dict[str, Any] = {"labels": self.labels(event), "annotations": annotations,
                                 "startsAt": rfc3339(event.fired_at),
                                 "generatorURL": event.node_url}
        if event.status == "resolved":
            alert["endsAt"] = rfc3339(event.resolved_at)
        return self.endpoint, _base_headers(), dumps([alert])

    def sign(self, headers: Mapping[str, str], body: bytes, now: float) -> dict[str, str]:
        """The credentials, added just before each attempt."""
        if not self.password:
            return dict(headers)
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {**headers, "Authorization": f"Basic {token}"}
        return {**headers, "Authorization": f"Bearer {self.password}"}


# -- Slack ---------------------------------------------------------------------------------------
def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class SlackSink:
    """Slack incoming webhook: ``text`` (the notification fallback) and Block Kit blocks."""

    name: str
    url: str = field(repr=False)

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]:
        firing = event.status == "firing"
        tag = ("🔥 FIRING" + (" (still)" if event.repeat else "")) if firing else "✅ RESOLVED"
        title = f"{tag}: {event.node} failure risk {event.risk:.2f}"
        reasons = "\n".join(f"• {r}" for r in event.reasons[:5]) or "_no reasons recorded_"
        fields = [
            {"type": "mrkdwn", "text": f"*Node*\n{event.node}"},
            {"type": "mrkdwn", "text": f"*Risk*\n{event.risk:.2f} (peak {event.peak_risk:.2f})"},
            {"type": "mrkdwn", "text": f"*Firing since*\n{rfc3339(event.fired_at)}"},
        ]
        if not firing:
            fields.append({"type": "mrkdwn",
                           "text": f"*Resolved at*\n{rfc3339(event.resolved_at)}"})
        blocks = [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(title, 150)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(
                f"*{summary(event)}*\n{reasons}", 3000)}},
            {"type": "section", "fields": fields},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _cut(
                f"alert {event.alert_id} · <{event.node_url}|node details>", 3000)}]},
        ]
        return self.url, _base_headers(), dumps({"text": _cut(f"{title}: {summary(event)}",
                                                              3000), "blocks": blocks})


# -- PagerDuty -----------------------------------------------------------------------------------
def severity_for(risk: float) -> str:
    if risk >= 0.8:
        return "critical"
    if risk >= 0.5:
        return "error"
    if risk >= 0.2:
        return "warning"
    return "info"


@dataclass(frozen=True)
class PagerDutySink:
    """PagerDuty Events API v2: ``trigger`` on firing, ``resolve`` on resolved, one
    ``dedup_key`` per alert so PagerDuty folds repeats into one incident."""

    name: str
    url: str
    routing_key: str = field(repr=False)
    severity: str = "auto"

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]:
        body: dict[str, Any] = {"routing_key": self.routing_key,
                                "event_action": "trigger" if event.status == "firing"
                                else "resolve",
                                "dedup_key": dedup_key(event)}
        if event.status == "firing":
            details: dict[str, Any] = {"risk": round(event.risk, 4),
                                       "peak_risk": round(event.peak_risk, 4),
                                       "threshold": event.threshold,
                                       "reasons": list(event.reasons),
                                       "alert_id": event.alert_id,
                                       "started_at": rfc3339(event.started_at),
                                       "model_id": event.model_id,
                                       "labels": dict(event.labels),
                                       **network_fields(event)}
            body["payload"] = {
                "summary": _cut(summary(event), 1024),
                "source": event.node,
                "severity": (severity_for(event.alarm_level) if self.severity == "auto"
                             else self.severity),
                "timestamp": rfc3339(event.fired_at),
                "component": event.top_gpu_uuid or event.node,
                "group": event.node,
                "class": "predicted GPU failure",
                "custom_details": details,
            }
            body["client"] = "fleetcare"
            body["client_url"] = event.node_url
        return self.url, _base_headers(), dumps(body)


def dedup_key(event: AlertEvent) -> str:
    return _cut(f"fleetcare/{event.alert_id}", 255)


# -- signed JSON ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HmacSink:
    """fleetcare's own JSON, signed: ``X-Fleetcare-Timestamp: <unix seconds>`` and
    ``X-Fleetcare-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>``,
    computed at each delivery attempt (see README.md for the receiver's side)."""

    name: str
    url: str
    secret: str = field(repr=False)

    def render(self, event: AlertEvent) -> tuple[str, dict[str, str], bytes]:
        body = {"version": "1", "id": event.event_id, "type": f"alert.{event.status}",
                "repeat": event.repeat,
                "alert": {"id": event.alert_id, "node": event.node, "status": event.status,
                          "risk": event.risk, "peak_risk": event.peak_risk,
                          "threshold": event.threshold,
                          "started_at": rfc3339(event.started_at),
                          "fired_at": rfc3339(event.fired_at),
                          "resolved_at": (rfc3339(event.resolved_at)
                                          if event.resolved_at else None),
                          "reasons": list(event.reasons), "labels": dict(event.labels),
                          "top_gpu_uuid": event.top_gpu_uuid, "model_id": event.model_id,
                          "url": event.node_url, **network_fields(event)}}
        headers = {**_base_headers(), "X-Fleetcare-Event": f"alert.{event.status}",
                   "X-Fleetcare-Delivery": event.event_id}
        return self.url, headers, dumps(body)

    def sign(self, headers: Mapping[str, str], body: bytes, now: float) -> dict[str, str]:
        ts = str(int(now))
        return {**headers, TIMESTAMP_HEADER: ts,
                SIGNATURE_HEADER: "sha256=" + _mac(self.secret, ts, body)}


def _mac(secret: str, timestamp: str, body: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body,
                    hashlib.sha256).hexdigest()


def verify_signature(secret: str, timestamp: str, body: bytes, signature: str, now: float,
                     window_s: float = 300) -> bool:
    """The receiver's check (copy it): the signature is ours and the timestamp is within
    ``window_s`` seconds of ``now`` (either side), so a captured request cannot be replayed
    later. Compare in constant time; never trust the body before this returns True."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(now - sent) > window_s:
        return False
    if not signature.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body,
                        hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature[len("sha256="):])


# -- routing / construction ------------------------------------------------------------------------
def wants(cfg: SinkConfig, event: AlertEvent) -> bool:
    """Does this sink take this event? Its events list, min risk (of a firing event) and
    label globs (``node`` is always a label)."""
    if event.status not in cfg.events:
        return False
    if event.status == "firing" and event.alarm_level < cfg.min_risk:
        return False
    labels = {**event.labels, "node": event.node}
    return all(fnmatch.fnmatchcase(labels.get(k, ""), glob) for k, glob in cfg.match.items())


def build(cfg: SinkConfig) -> Sink:
    url = cfg.url.reveal()
    if cfg.kind == "alertmanager":
        return AlertmanagerSink(cfg.name, url, cfg.receiver or cfg.name)
    if cfg.kind == "alertmanager-api":
        return AlertmanagerApiSink(cfg.name, url,
                                   "warning" if cfg.severity == "auto" else cfg.severity,
                                   cfg.username, cfg.secret.reveal() if cfg.secret else None,
                                   cfg.job)
    if cfg.kind == "slack":
        return SlackSink(cfg.name, url)
    if cfg.kind == "pagerduty":
        assert cfg.routing_key is not None
        return PagerDutySink(cfg.name, url, cfg.routing_key.reveal(), cfg.severity)
    if cfg.kind == "hmac":
        assert cfg.secret is not None
        return HmacSink(cfg.name, url, cfg.secret.reveal())
    raise ValueError(f"sink {cfg.name}: unknown kind {cfg.kind!r}")
