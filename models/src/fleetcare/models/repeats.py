"""How failures repeat on the same node: numbers to compare a fleet (or the simulator)
with a real trace (issue 16).

``repeat_stats(rows, servers, span_days)`` reads incident rows ``(ts, node, kind,
cause)`` (the recurrence module's rows: ``failure`` is a failure unless its cause is
``planned_maintenance``; ``repair`` / ``rma`` end the oldest open failure of the node) in
the window ``[start, start + span_days)`` and returns:

- ``repeat_7d`` / ``repeat_30d``: the share of failures followed by another failure of
  the same node within 7 / 30 days. Only failures with a whole 30 days of the window
  after them are counted (``eligible_failures``), for both shares, so that a failure near
  the window's end does not look like one that never repeated.
- ``top10_share``: the share of the window's failures on the 10 % most-failing nodes of
  ``servers`` nodes (never-failing nodes included: they are the fleet's other nodes).
- ``repair_h_median`` / ``repair_h_p90``: hours from a failure to the repair that ends
  it, over the window's failures whose repair is in the rows (a repair may fall after the
  window's end; a failure never repaired is left out).
- ``failures_per_1000_node_days``: failures / (servers × span_days) × 1000.

Rows outside the window are ignored for counting and repeats (a window's numbers read
only its own failures), except repairs of the window's failures.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from fleetcare.models.recurrence import is_failure, is_repair

Row = tuple[dt.datetime, str, str, str]
WINDOWS_DAYS = (7.0, 30.0)
TOP_FRACTION = 0.10


def _repair_hours(rows: list[Row]) -> dict[tuple[str, dt.datetime], float]:
    """(node, failure ts) -> hours until the repair that closes it (oldest open first)."""
    open_: dict[str, list[dt.datetime]] = {}
    out: dict[tuple[str, dt.datetime], float] = {}
    for ts, node, kind, cause in rows:
        if is_failure(kind, cause):
            open_.setdefault(node, []).append(ts)
        elif is_repair(kind) and open_.get(node):
            began = open_[node].pop(0)
            out[(node, began)] = (ts - began).total_seconds() / 3600.0
    return out


def repeat_stats(rows: Iterable[Row], servers: int, span_days: float, *,
                 start: dt.datetime | None = None) -> dict[str, Any]:
    """Repeat-failure numbers of ``servers`` nodes over ``span_days`` from ``start``
    (default: the first row's time). See the module docstring for each number."""
    if servers < 1 or span_days <= 0:
        raise ValueError(f"servers={servers}, span_days={span_days}: both must be positive")
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    if start is None:
        start = rows[0][0] if rows else dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=span_days)
    repairs = _repair_hours(rows)
    fails: dict[str, list[float]] = {}
    hours: list[float] = []
    for ts, node, kind, cause in rows:
        if is_failure(kind, cause) and start <= ts < end:
            fails.setdefault(node, []).append((ts - start).total_seconds() / 86400.0)
            if (node, ts) in repairs:
                hours.append(repairs[(node, ts)])
    if len(fails) > servers:
        raise ValueError(f"servers={servers}, but {len(fails)} nodes failed in the window: "
                         "give the fleet's size")
    total = sum(len(v) for v in fails.values())
    horizon = max(WINDOWS_DAYS)
    eligible = 0
    repeated = dict.fromkeys(WINDOWS_DAYS, 0)
    for t in fails.values():
        arr = np.asarray(t)
        for i, f in enumerate(arr):
            if f > span_days - horizon:
                continue
            eligible += 1
            gap = arr[i + 1] - f if i + 1 < len(arr) else math.inf
            for w in WINDOWS_DAYS:
                repeated[w] += bool(gap <= w)
    per_node = sorted((len(v) for v in fails.values()), reverse=True)
    top_n = max(1, round(TOP_FRACTION * servers))
    top = sum(per_node[:top_n])

    def share(n: int, d: int) -> float | None:
        return round(n / d, 4) if d else None

    return {
        "servers": servers, "span_days": round(span_days, 2), "failures": total,
        "nodes_failed": len(fails), "eligible_failures": eligible,
        **{f"repeat_{int(w)}d": share(repeated[w], eligible) for w in WINDOWS_DAYS},
        "top10_share": share(top, total),
        "repairs_timed": len(hours),
        "repair_h_median": round(float(np.median(hours)), 2) if hours else None,
        "repair_h_p90": round(float(np.percentile(hours, 90)), 2) if hours else None,
        "failures_per_1000_node_days": round(total / (servers * span_days) * 1000.0, 3),
    }
