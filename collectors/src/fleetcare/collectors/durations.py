"""Durations as people type them: ``45s``, ``10m``, ``24h``, ``90d`` (or plain seconds)."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``; raises ValueError naming the accepted forms."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _RE.match(text)
        if not m:
            raise ValueError(
                f"duration {text!r} is not understood: use a number with s, m, h, d or w "
                "(e.g. 45s, 10m, 24h, 90d)"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds
