"""The web dashboard: one self-contained HTML page (no external JS, CSS or fonts, the
service may run on an offline cluster), rendered on the server and refreshed by the
browser every ``REFRESH_S`` seconds.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import quote

REFRESH_S = 30

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1f24;
background:#f6f7f9}
header{padding:14px 24px;background:#1b1f24;color:#fff}
header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#b8c0cc;font-size:13px}
.sim{background:#b42318;color:#fff;font-weight:700;text-align:center;padding:10px;
letter-spacing:.08em}
main{padding:16px 24px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}
th,td{padding:8px 10px;border-bottom:1px solid #e4e7ec;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{display:inline-block;height:10px;background:#d92d20;vertical-align:middle;
margin-right:6px}
.low .bar{background:#12b76a}.mid .bar{background:#f79009}
ul{margin:0;padding-left:18px}
.muted{color:#667085}
a{color:#175cd3;text-decoration:none}
"""


def _risk_cell(risk: float | None) -> str:
    if risk is None:
        return '<td class="num muted">n/a</td>'
    level = "high" if risk >= 0.5 else "mid" if risk >= 0.1 else "low"
    width = max(1, round(risk * 80))
    return (f'<td class="num {level}"><span class="bar" style="width:{width}px"></span>'
            f"{risk * 100:.1f}%</td>")


def _row(rank: int, n: dict[str, Any]) -> str:
    reasons = "".join(f"<li>{escape(r)}</li>" for r in n["reasons"])
    node = escape(n["node"])
    link = f"/v1/nodes/{quote(n['node'], safe='')}"
    return (
        f'<tr><td class="num">{rank}</td><td><a href="{escape(link)}">{node}</a></td>'
        f"{_risk_cell(n['risk'])}"
        f"<td>{f'<ul>{reasons}</ul>' if reasons else '<span class=muted>none</span>'}</td>"
        f"<td>{escape(n['top_gpu_uuid'] or '')}</td>"
        f"<td class=\"num\">{escape(n['scored_at'])}</td>"
        f"<td>{escape(n['model_id'] or '')}</td></tr>"
    )


def _model_line(model: dict[str, Any] | None) -> str:
    """Which model scores, and why (``queries.current_model``)."""
    if model is None:
        return "<p class=muted>No model scores yet.</p>"
    kind = ("the fleet prior shipped with fleetcare (trained on simulated fleets)"
            if model.get("origin") == "prior" else "this fleet's own model")
    why = f" — {escape(model['current_reason'])}" if model.get("current_reason") else ""
    return (f"<p>Scoring with <b>{escape(model['model_id'])}</b>, {kind}{why}.</p>")


def render(nodes: list[dict[str, Any]], *, simulated: bool, scored_at: str | None,
           score_age_s: float | None, total_nodes: int, version: str,
           model: dict[str, Any] | None = None) -> str:
    """The page for ``nodes`` (``queries.ranked_nodes`` rows, highest risk first)."""
    banner = (
        '<div class="sim" role="alert">SIMULATED DATA: these nodes and failures come from '
        "the fleetcare simulator, not from a real fleet</div>"
        if simulated else ""
    )
    if scored_at is None:
        status = "No scores yet: run <code>fleetcare train</code> and start the scorer."
    else:
        age = "" if score_age_s is None else f" ({score_age_s / 60:.0f} min ago)"
        status = (f"{total_nodes} nodes scored; newest score {escape(scored_at)}{age}; "
                  f"showing the top {len(nodes)}.")
    rows = "".join(_row(i, n) for i, n in enumerate(nodes, 1))
    table = (
        "<table><thead><tr><th>#</th><th>Node</th><th>Failure risk</th><th>Reasons</th>"
        "<th>Top GPU</th><th>Scored at (UTC)</th><th>Model</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if nodes else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>fleetcare: fleet risk</title><style>{_CSS}</style></head>
<body>{banner}
<header><h1>fleetcare: which nodes to drain</h1>
<p>Nodes ranked by probability of a failure incident within the model horizon.
Refreshes every {REFRESH_S} s. fleetcare {escape(version)} ·
<a href="/docs">API</a> · <a href="/metrics">metrics</a></p></header>
<main>{_model_line(model)}<p>{status}</p>{table}</main>
</body></html>
"""
