"""Prometheus text exposition (format 0.0.4) of the latest scores, written by hand.

Hand-written because the values are read from DuckDB per scrape (nothing to keep in
process); the format rules that matter are label escaping and float spelling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float | int | None) -> str:
    """A sample value as Prometheus spells it: repr for floats, NaN/+Inf/-Inf."""
    if value is None:
        return "NaN"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _family(name: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], Any]],
            kind: str = "gauge") -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{label_text}}} {format_value(value)}" if label_text
                     else f"{name} {format_value(value)}")
    return "\n".join(lines) + "\n"


def render(nodes: list[dict[str, Any]], latest_score_s: float | None,
           drains: Mapping[str, Any] | None = None, *,
           latest_telemetry_s: float | None = None,
           alerts: Mapping[str, Any] | None = None, extra: str = "",
           network: tuple[list[tuple[str, float]], float | None] | None = None,
           alarm: tuple[float, float] | None = None) -> str:
    """The exposition for ``nodes`` (``queries.ranked_nodes`` rows), the newest score, the
    drain controller's state (``queries.drain_stats``; omitted when None), the newest
    telemetry sample, the alerts (``queries.alert_stats``; omitted when None), the network
    head's risks and threshold (``queries.network_risks``; omitted when None), the scoring
    model's operating point (risk threshold, hold in seconds; absent when None) and
    ``extra``, text already in the format (the ingest worker's counters)."""
    return "".join([
        _family(
            "fleetcare_node_failure_risk",
            "Latest calibrated probability that the node has a failure incident within "
            "the model horizon.",
            (({"node": n["node"]}, n["risk"]) for n in nodes),
        ),
        _family("fleetcare_scored_nodes", "Nodes with a risk score.", [({}, len(nodes))]),
        _family("fleetcare_alarm_threshold",
                "The node failure risk at which the model of the newest scoring run alarms "
                "(its measured operating point; absent when it names none).",
                [] if alarm is None else [({}, alarm[0])]),
        _family("fleetcare_alarm_hold_seconds",
                "How long the risk must hold at the threshold for the model's alarm "
                "(0: at once; absent when it names no threshold).",
                [] if alarm is None else [({}, alarm[1])]),
        _family(
            "fleetcare_latest_score_timestamp_seconds",
            "Unix time of the newest node score (absent before the first score).",
            [] if latest_score_s is None else [({}, latest_score_s)],
        ),
        *(_drain_families(drains) if drains is not None else []),
        _family(
            "fleetcare_latest_telemetry_timestamp_seconds",
            "Unix time of the newest telemetry sample stored (absent before the first); "
            "time() minus this is the ingest lag.",
            [] if latest_telemetry_s is None else [({}, latest_telemetry_s)],
        ),
        *(_alert_families(alerts) if alerts is not None else []),
        *(_network_families(*network) if network is not None else []),
        extra,
    ])


def _network_families(risks: list[tuple[str, float]], threshold: float | None) -> list[str]:
    return [
        _family("fleetcare_node_network_risk",
                "Latest probability of a network failure of the node (InfiniBand cable, "
                "switch or NIC) within 72 h from its ports, by the scoring model's network "
                "head (absent without one).",
                (({"node": n}, p) for n, p in risks)),
        _family("fleetcare_network_alarm_threshold",
                "The network head probability at which the scoring model alarms on its "
                "own (the fleet prior's operating point; absent when the model has none).",
                [] if threshold is None else [({}, threshold)]),
    ]


def _alert_families(a: Mapping[str, Any]) -> list[str]:
    return [
        _family("fleetcare_alerts",
                "Open node-risk alerts of fleetcare's alert engine, by state (pending, "
                "firing).",
                (({"state": str(s)}, int(n)) for s, n in a.get("open", []))),
        _family("fleetcare_alert_messages",
                "Alert messages in the outbox, by state (pending: the receiver has not "
                "taken it yet; delivered; dead: given up).",
                (({"state": str(s)}, int(n)) for s, n in a.get("messages", []))),
    ]


def _drain_families(d: Mapping[str, Any]) -> list[str]:
    last = d.get("last_action")
    return [
        _family("fleetcare_drains_held",
                "Nodes fleetcare has drained and not given back yet, by scheduler.",
                (({"scheduler": str(s)}, int(n)) for s, n in d.get("held", []))),
        _family("fleetcare_drains_overdue",
                "Held drains past their review time (cleared by nobody: they escalate).",
                [({}, int(d.get("overdue", 0)))]),
        _family("fleetcare_drain_actions_total",
                "Real (not dry-run) drain controller actions from the audit log, by action "
                "and result (ok, refused, error, held).",
                (({"action": str(a), "result": str(r)}, int(n))
                 for a, r, n in d.get("actions", [])), kind="counter"),
        _family("fleetcare_drain_last_action_timestamp_seconds",
                "Unix time of the newest real drain controller action (absent before one).",
                [] if last is None else [({}, float(last))]),
    ]
