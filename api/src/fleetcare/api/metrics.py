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


def _family(name: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], Any]]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{label_text}}} {format_value(value)}" if label_text
                     else f"{name} {format_value(value)}")
    return "\n".join(lines) + "\n"


def render(nodes: list[dict[str, Any]], latest_score_s: float | None) -> str:
    """The exposition for ``nodes`` (``queries.ranked_nodes`` rows) and the newest score."""
    return "".join([
        _family(
            "fleetcare_node_failure_risk",
            "Latest calibrated probability that the node has a failure incident within "
            "the model horizon.",
            (({"node": n["node"]}, n["risk"]) for n in nodes),
        ),
        _family("fleetcare_scored_nodes", "Nodes with a risk score.", [({}, len(nodes))]),
        _family(
            "fleetcare_latest_score_timestamp_seconds",
            "Unix time of the newest node score (absent before the first score).",
            [] if latest_score_s is None else [({}, latest_score_s)],
        ),
    ])
