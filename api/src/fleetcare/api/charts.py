"""Line charts as inline SVG, drawn on the server: no script, no library, no CDN (the
service often runs on an offline cluster), and the chart is in the page the moment it
loads.

``line_chart`` draws one GPU's hourly series against the fleet median of its GPU model
(``fleetcare.api.history``): the GPU as a solid line, the median dashed. A missing hour
breaks the line rather than drawing across the gap.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from html import escape
from typing import Any

W, H = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 26
GPU_COLOUR = "#d92d20"
MEDIAN_COLOUR = "#667085"


def _t(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _nice(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"


def _path(points: Sequence[dict[str, Any]], x: Any, y: Any) -> str:
    """SVG path data; a new sub-path after a missing value or a gap over an hour."""
    parts: list[str] = []
    prev_t: float | None = None
    for p in points:
        v = p.get("v")
        if v is None or not math.isfinite(v):
            prev_t = None
            continue
        t = _t(p["t"])
        cmd = "L" if prev_t is not None and t - prev_t <= 3600 else "M"
        parts.append(f"{cmd}{x(t):.1f},{y(v):.1f}")
        prev_t = t
    return " ".join(parts)


def line_chart(gpu: Sequence[dict[str, Any]], median: Sequence[dict[str, Any]], *,
               since: str, until: str, title: str, unit: str, gpu_name: str,
               median_name: str) -> str:
    """An ``<svg>`` of ``gpu`` against ``median`` (lists of ``{"t": iso, "v": float|None}``)
    over ``[since, until)``."""
    values = [p["v"] for p in (*gpu, *median)
              if p.get("v") is not None and math.isfinite(p["v"])]
    t0, t1 = _t(since), max(_t(until), _t(since) + 3600)
    lo = min([0.0, *values])
    hi = max([lo, *values])
    if hi - lo < 1e-6:  # flat (all 0: no error at all): a 0..1 axis
        hi = lo + 1
    pad = (hi - lo) * 0.08
    hi += pad

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * (H - TOP - BOTTOM)

    gpu_d, median_d = _path(gpu, x, y), _path(median, x, y)
    grid = "".join(
        f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
        f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(_nice(v))}</text>'
        for v in (lo, (lo + hi - pad) / 2, hi - pad))
    days = ""
    day = dt.datetime.fromtimestamp(t0, dt.UTC).replace(hour=0, minute=0, second=0,
                                                         microsecond=0)
    while day.timestamp() <= t1:
        px = x(day.timestamp())
        if day.timestamp() >= t0 and px <= W - RIGHT - 18:  # room for the label
            days += (f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                     f'class="grid"/><text x="{px:.1f}" y="{H - 8}" text-anchor="middle">'
                     f"{day:%b %d}</text>")
        day += dt.timedelta(days=1)
    empty = ("" if gpu_d or median_d else
             f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" class="muted">'
             "not reported in this period</text>")
    lines = ""
    if median_d:
        lines += (f'<path d="{median_d}" fill="none" stroke="{MEDIAN_COLOUR}" '
                  f'stroke-width="1.5" stroke-dasharray="4 3" class="median"/>')
    if gpu_d:
        lines += (f'<path d="{gpu_d}" fill="none" stroke="{GPU_COLOUR}" stroke-width="2" '
                  'class="series"/>')
    label = f"{title} ({unit}): {gpu_name} against {median_name}"
    return (
        f'<figure class="chart"><figcaption><b>{escape(title)}</b> '
        f'<span class="muted">{escape(unit)}</span> · '
        f'<span style="color:{GPU_COLOUR}">━ {escape(gpu_name)}</span> '
        f'<span style="color:{MEDIAN_COLOUR}">╌ {escape(median_name)}</span></figcaption>'
        f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(label)}">{grid}{days}{lines}{empty}</svg></figure>'
    )
