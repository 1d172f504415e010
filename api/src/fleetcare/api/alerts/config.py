"""Alert configuration: ``[alerts]`` and ``[[alerts.sinks]]`` in the TOML file, secrets
from the environment.

    [alerts]
    threshold = 0.5            # fire when risk >= 0.5 ...
    for = "10m"                # ... in every scoring run for 10 minutes
    immediate_threshold = 0.9  # ... or at once when risk >= 0.9 (optional; default never)
    # or: threshold = "model"  # the scoring model's own operating point, followed when
    #                          # another model is promoted (its threshold, hold and
    #                          # immediate risk; without `for` / `immediate_threshold`);
    #                          # the default when none of those three keys is set
    resolve_threshold = 0.3    # resolve when risk < 0.3 ...
    resolve_for = "15m"        # ... for 15 minutes (hysteresis)
    repeat_interval = "4h"     # re-notify a still-firing alert (optional; default never)
    external_url = "http://fleetcare.example:8000"

    [[alerts.sinks]]
    name = "ops-slack"
    kind = "slack"             # alertmanager | alertmanager-api | slack | pagerduty | hmac
    events = ["firing", "resolved"]
    min_risk = 0.7
    match = { node = "gpu-a*" }   # label globs; every one must match
    repeat_interval = "4h"     # this sink's re-notification (default: [alerts]'s)

    [[alerts.sinks]]
    name = "am"
    kind = "alertmanager-api"  # push into Alertmanager: POST {url}/api/v2/alerts
    url = "http://alertmanager:9093"
    severity = "warning"       # the alert's severity label (auto: warning)
    username = "fleetcare"     # basic auth, password in FLEETCARE_ALERTS_AM_SECRET
    job = "fleetcare"          # the alert's job label: Prometheus' scrape job of this
                               # serve, so inhibitions `equal: [job]` keep fleets apart
    # repeat_interval defaults to 1m: Alertmanager resolves an alert not re-sent
    # within its resolve_timeout (5m)

Secrets never need to be in the file: ``FLEETCARE_ALERTS_<NAME>_URL``,
``FLEETCARE_ALERTS_<NAME>_ROUTING_KEY`` and ``FLEETCARE_ALERTS_<NAME>_SECRET`` (NAME is the
sink name in upper case, other characters as ``_``) override the sink's ``url``,
``routing_key`` and ``secret`` (hmac: the shared secret; alertmanager-api: the basic-auth
password with ``username``, else a bearer token); ``FLEETCARE_ALERTS_THRESHOLD`` etc. override ``[alerts]``
keys. Secrets are ``Secret`` values: they print as ``********``.

Errors are ``fleetcare.collectors.config.ConfigError`` (.key, .value), naming the key, the
value and what is accepted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetcare.collectors.config import ConfigError, read_section
from fleetcare.collectors.durations import parse_duration

KINDS = ("alertmanager", "alertmanager-api", "slack", "pagerduty", "hmac")
EVENTS = ("firing", "resolved")
DEFAULT_JOB = "fleetcare"
"""alertmanager-api sinks' ``job`` label unless configured: the scrape job name of
deploy/prometheus/README.md's example, so a pushed alert and the rules' alerts of one
fleet share it."""
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
ENV_PREFIX = "FLEETCARE_ALERTS_"
MODEL = "model"
"""``[alerts] threshold = "model"``: alert at the scoring model's operating point."""
ALERTMANAGER_API_REPEAT_S = 60.0
"""alertmanager-api sinks re-send a firing alert this often unless configured: Alertmanager
resolves an alert it has not heard of for its resolve_timeout (5 min by default)."""


class Secret:
    """A string that is masked when printed or logged (``str()`` and ``repr()``)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    def __str__(self) -> str:
        return "********"

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class SinkConfig:
    name: str
    kind: str
    url: Secret
    events: tuple[str, ...] = EVENTS
    min_risk: float = 0.0
    match: Mapping[str, str] = field(default_factory=dict)
    routing_key: Secret | None = None      # pagerduty
    secret: Secret | None = None           # hmac
    severity: str = "auto"                 # pagerduty: auto (by risk) or a fixed severity
    receiver: str | None = None            # alertmanager: the receiver name sent
    username: str | None = None            # alertmanager-api: basic auth (secret: password)
    repeat_interval_s: float | None = None  # None: [alerts] repeat_interval
    job: str = DEFAULT_JOB                  # alertmanager-api: the alert's job label

    def describe(self) -> dict[str, Any]:
        """For printing: every secret masked, the URL shown up to its host."""
        return {"name": self.name, "kind": self.kind, "url": mask_url(self.url.reveal()),
                "events": list(self.events), "min_risk": self.min_risk,
                "match": dict(self.match),
                "routing_key": str(self.routing_key) if self.routing_key else None,
                "secret": str(self.secret) if self.secret else None,
                "username": self.username, "repeat_interval_s": self.repeat_interval_s,
                **({"job": self.job} if self.kind == "alertmanager-api" else {})}


@dataclass(frozen=True)
class AlertsConfig:
    threshold: float = 0.5
    for_s: float = 600.0
    immediate_threshold: float | None = None
    resolve_threshold: float = 0.3
    resolve_for_s: float = 900.0
    repeat_interval_s: float | None = None
    external_url: str = "http://127.0.0.1:8000"
    # delivery
    timeout_s: float = 10.0
    retry_base_s: float = 10.0
    retry_cap_s: float = 600.0
    retry_jitter: float = 0.1
    max_age_s: float = 86400.0
    sinks: tuple[SinkConfig, ...] = ()
    from_model: bool = False
    """``threshold = "model"`` (``parse``'s default when none of ``threshold``, ``for`` and
    ``immediate_threshold`` is set): threshold, ``for`` and the immediate risk are the
    scoring model's operating point (``engine.operating_point``), read again at every
    evaluation; the values above apply only while no model names one."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.resolve_threshold <= self.threshold <= 1.0:
            raise ConfigError("[alerts] resolve_threshold", self.resolve_threshold,
                              f"must be between 0 and threshold ({self.threshold}), and "
                              "threshold at most 1: resolving above the firing threshold "
                              "would make alerts flap")
        if self.immediate_threshold is not None and not (
                self.threshold <= self.immediate_threshold <= 1.0):
            raise ConfigError("[alerts] immediate_threshold", self.immediate_threshold,
                              f"must be between threshold ({self.threshold}) and 1: it "
                              "fires an alert at once that threshold would fire after `for`")
        names = [s.name for s in self.sinks]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError("[[alerts.sinks]] name", sorted(dup)[0],
                              "is used by more than one sink; give each sink its own name")

    def sink(self, name: str) -> SinkConfig:
        for s in self.sinks:
            if s.name == name:
                return s
        raise ConfigError("sink", name, "no [[alerts.sinks]] entry has this name; configured: "
                          + (", ".join(s.name for s in self.sinks) or "none"))


def mask_url(url: str) -> str:
    """``https://hooks.slack.com/services/T0/B0/xyz`` -> ``https://hooks.slack.com/…``:
    scheme, host and port only (Slack and others put the secret in the path)."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "********"
    if not parts.scheme or not parts.hostname:
        return "********"
    rest = "/…" if parts.path not in ("", "/") or parts.query else ""
    return f"{parts.scheme}://{parts.hostname}{port}{rest}"


def env_name(sink: str) -> str:
    """The environment prefix of a sink's secrets: ``ops-slack`` -> ``FLEETCARE_ALERTS_OPS_SLACK_``."""
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", sink.upper()) + "_"


_TOP = {"threshold": "threshold", "for": "for_s", "immediate_threshold": "immediate_threshold",
        "resolve_threshold": "resolve_threshold",
        "resolve_for": "resolve_for_s", "repeat_interval": "repeat_interval_s",
        "external_url": "external_url", "timeout": "timeout_s", "retry_base": "retry_base_s",
        "retry_cap": "retry_cap_s", "retry_jitter": "retry_jitter", "max_age": "max_age_s"}
_DURATIONS = {"for", "resolve_for", "repeat_interval", "timeout", "retry_base", "retry_cap",
              "max_age"}
_SINK_KEYS = {"name", "kind", "url", "events", "min_risk", "match", "routing_key", "secret",
              "severity", "receiver", "username", "repeat_interval", "job"}
_SEVERITIES = ("auto", "critical", "error", "warning", "info")


def _duration(key: str, raw: Any, *, zero_ok: bool) -> float:
    if zero_ok and raw in (0, "0", "0s"):
        return 0.0
    try:
        return parse_duration(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(key, raw, str(exc)) from None


def _float(key: str, raw: Any, lo: float, hi: float, also: str = "") -> float:
    expected = f"expected a number between {lo} and {hi}" + (f", {also}" if also else "")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(key, raw, expected) from None
    if not lo <= value <= hi:
        raise ConfigError(key, raw, expected)
    return value


def parse(table: Mapping[str, Any], env: Mapping[str, str] | None = None) -> AlertsConfig:
    """Build the config from the ``[alerts]`` table (a dict) and the environment."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    raw_top = {k: v for k, v in table.items() if k != "sinks"}
    for key in _TOP:
        var = ENV_PREFIX + key.upper()
        if var in env:
            raw_top[key] = env[var]
    if not {"threshold", "for", "immediate_threshold"} & set(raw_top):
        raw_top["threshold"] = MODEL  # nothing says when to fire: as the model measured
    if str(raw_top.get("threshold", "")).strip().lower() == MODEL:
        given = sorted(k for k in ("for", "immediate_threshold") if k in raw_top)
        if given:
            raise ConfigError(f"[alerts] {given[0]}", raw_top[given[0]],
                              'comes from the model with threshold = "model"; remove it, '
                              "or give threshold a number")
        del raw_top["threshold"]
        values["from_model"] = True
    for key, raw in raw_top.items():
        name = f"[alerts] {key}"
        if key not in _TOP:
            raise ConfigError(name, raw, "unknown key; known keys: "
                              + ", ".join(sorted([*_TOP, "sinks"])))
        if key == "repeat_interval" and raw in ("", "never", None):
            values[_TOP[key]] = None
        elif key in _DURATIONS:
            values[_TOP[key]] = _duration(name, raw, zero_ok=key in ("for", "resolve_for"))
        elif key == "external_url":
            values[_TOP[key]] = str(raw).rstrip("/")
        elif key == "threshold":
            values[_TOP[key]] = _float(name, raw, 0.0, 1.0, also='or "model"')
        else:
            values[_TOP[key]] = _float(name, raw, 0.0, 1.0)
    sinks = table.get("sinks", [])
    if not isinstance(sinks, list):
        raise ConfigError("[alerts] sinks", sinks, "write each sink as an [[alerts.sinks]] table")
    values["sinks"] = tuple(_sink(i, s, env) for i, s in enumerate(sinks))
    return AlertsConfig(**values)


def _sink(i: int, raw: Mapping[str, Any], env: Mapping[str, str]) -> SinkConfig:
    where = f"[[alerts.sinks]] #{i + 1}"
    if not isinstance(raw, Mapping):
        raise ConfigError(where, raw, "expected a table")
    unknown = set(raw) - _SINK_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{where} {key}", raw[key],
                          "unknown key; known keys: " + ", ".join(sorted(_SINK_KEYS)))
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} name", name, "every sink needs a name (e.g. \"ops-slack\")")
    where = f"[[alerts.sinks]] {name}"
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where} kind", kind, "expected one of " + ", ".join(KINDS))
    prefix = env_name(name)
    url = env.get(prefix + "URL", raw.get("url"))
    if not url and kind == "pagerduty":
        url = PAGERDUTY_URL
    if not url or not re.match(r"^https?://", str(url)):
        raise ConfigError(f"{where} url", str(Secret(url)) if url else url,
                          f"expected an http(s) URL; set url in the file or {prefix}URL")
    routing_key = env.get(prefix + "ROUTING_KEY", raw.get("routing_key"))
    secret = env.get(prefix + "SECRET", raw.get("secret"))
    if kind == "pagerduty" and not routing_key:
        raise ConfigError(f"{where} routing_key", None, "a PagerDuty sink needs the Events v2 "
                          f"integration's routing key: set {prefix}ROUTING_KEY")
    if kind == "hmac" and not secret:
        raise ConfigError(f"{where} secret", None, "a signed JSON sink needs a shared secret: "
                          f"set {prefix}SECRET")
    events = raw.get("events", list(EVENTS))
    if (not isinstance(events, list) or not events
            or any(e not in EVENTS for e in events)):
        raise ConfigError(f"{where} events", events,
                          "expected a non-empty list of " + ", ".join(f'"{e}"' for e in EVENTS))
    match = raw.get("match", {})
    if not isinstance(match, Mapping) or not all(isinstance(v, str) for v in match.values()):
        raise ConfigError(f"{where} match", match,
                          "expected a table of label = \"glob\" (e.g. { node = \"gpu-a*\" })")
    severity = raw.get("severity", "auto")
    if severity not in _SEVERITIES:
        raise ConfigError(f"{where} severity", severity,
                          "expected one of " + ", ".join(_SEVERITIES))
    username = raw.get("username")
    if username is not None and (kind != "alertmanager-api" or not isinstance(username, str)
                                 or not username or ":" in username):
        raise ConfigError(f"{where} username", username,
                          "only alertmanager-api sinks take a username (basic auth), a "
                          "non-empty string without ':'; its password goes in "
                          f"{prefix}SECRET")
    if username is not None and not secret:
        raise ConfigError(f"{where} secret", None, f"basic auth as {username!r} needs its "
                          f"password: set {prefix}SECRET")
    job = raw.get("job", DEFAULT_JOB)
    if "job" in raw and kind != "alertmanager-api":
        raise ConfigError(f"{where} job", job, "only alertmanager-api sinks take a job label "
                          "(the other kinds send no Prometheus labels): remove it")
    if not isinstance(job, str) or not job.strip():
        raise ConfigError(f"{where} job", job, "expected the job Prometheus scrapes this "
                          f"serve as, a non-empty string (default {DEFAULT_JOB!r})")
    repeat = raw.get("repeat_interval")
    if repeat is None and kind == "alertmanager-api":
        repeat_s: float | None = ALERTMANAGER_API_REPEAT_S
    elif repeat in (None, "", "never"):
        repeat_s = None
    else:
        repeat_s = _duration(f"{where} repeat_interval", repeat, zero_ok=False)
    return SinkConfig(
        name=name, kind=kind, url=Secret(str(url)), events=tuple(events),
        min_risk=_float(f"{where} min_risk", raw.get("min_risk", 0.0), 0.0, 1.0),
        match=dict(match), routing_key=Secret(str(routing_key)) if routing_key else None,
        secret=Secret(str(secret)) if secret else None, severity=severity,
        receiver=raw.get("receiver"), username=username, repeat_interval_s=repeat_s,
        job=job)


def load(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> AlertsConfig:
    """Read ``[alerts]`` from the TOML file (``path`` or ``$FLEETCARE_CONFIG``; none: defaults,
    no sinks) and the environment."""
    env = os.environ if env is None else env
    table = read_section("alerts", path=path, env=env)
    return parse(table, env)
