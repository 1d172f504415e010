"""Durations as people type them: ``45s``, ``10m``, ``24h``, ``90d`` (or plain seconds).

One syntax for every command and config key: a number with ``s``, ``m``, ``h``, ``d`` or
``w``. A bare number is seconds, except where a flag documented another unit before
units were accepted (``fleetcare drain --checkpoint-interval 2`` is 2 hours), and where a
bare number would be a trap (a 24-*second* prediction horizon): there it is refused
with the fix (``bare=None``). ``duration_type`` is the argparse ``type=`` for all of them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str | float | int, *, bare: str | None = "s") -> float:
    """Seconds in ``text``; raises ValueError naming the accepted forms.

    ``bare``: the unit of a number written without one (``"s"``, ``"h"``, ...), or None
    to refuse it."""
    if isinstance(text, int | float):
        if bare is None:
            raise ValueError(f"duration {text!r} has no unit: write it with s, m, h, d or w "
                             "(e.g. 30m, 24h)")
        seconds = float(text) * _UNITS[bare]
    else:
        m = _RE.match(text)
        if not m:
            raise ValueError(
                f"duration {text!r} is not understood: use a number with s, m, h, d or w "
                "(e.g. 45s, 10m, 24h, 90d)"
            )
        unit = m.group(2) or bare
        if unit is None:
            raise ValueError(f"duration {text!r} has no unit: write it with s, m, h, d or w "
                             f"(e.g. {m.group(1)}h or {m.group(1)}m)")
        seconds = float(m.group(1)) * _UNITS[unit]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds


def duration_type(*, bare: str | None = "s", per: str = "s") -> Callable[[str], float]:
    """An argparse ``type=``: the duration in units of ``per`` (seconds by default, hours
    with ``per="h"``); a bare number is in ``bare`` (None: refused). Errors are argparse's
    one line naming the flag."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, bare=bare) / _UNITS[per]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "duration"
    return parse
