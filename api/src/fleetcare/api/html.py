"""The dashboard's page frame and small formatters: one stylesheet inline, no external
JS, CSS or fonts (the service may run on an offline cluster), every value escaped.

``page()`` wraps a page body in the frame: the SIMULATED DATA banner when the data comes
from the simulator, the navigation, and a sign-out button when signed in.
"""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import Any
from urllib.parse import quote

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1f24;
background:#f6f7f9}
header{padding:12px 24px;background:#1b1f24;color:#fff;display:flex;align-items:center;
gap:24px;flex-wrap:wrap}
header h1{margin:0;font-size:19px}
header nav a{color:#d0d5dd;margin-right:14px}
header form{margin-left:auto}
header p{margin:4px 0 0;color:#b8c0cc;font-size:13px}
.sim{background:#b42318;color:#fff;font-weight:700;text-align:center;padding:10px;
letter-spacing:.08em}
main{padding:16px 24px;max-width:1400px}
h2{font-size:17px;margin:22px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}
th,td{padding:7px 10px;border-bottom:1px solid #e4e7ec;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{display:inline-block;height:10px;background:#d92d20;vertical-align:middle;margin-right:6px}
.low .bar{background:#12b76a}.mid .bar{background:#f79009}
ul{margin:0;padding-left:18px}
.muted{color:#667085}
a{color:#175cd3;text-decoration:none}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e4e7ec;border-radius:6px;padding:10px 14px;
min-width:150px}
.card b{display:block;font-size:22px}
.card.high b{color:#b42318}.card.mid b{color:#b54708}.card.low b{color:#027a48}
.charts{display:flex;flex-wrap:wrap;gap:10px}
figure.chart{margin:0;background:#fff;border:1px solid #e4e7ec;border-radius:6px;padding:6px}
figure.chart figcaption{font-size:13px;margin:0 0 2px 4px}
svg text{font-size:11px;fill:#667085}
svg .grid{stroke:#eaecf0;stroke-width:1}
.gpu{background:#fff;border:1px solid #e4e7ec;border-radius:6px;padding:8px 14px;
margin:10px 0}
form.signin{background:#fff;border:1px solid #e4e7ec;border-radius:6px;padding:18px;
max-width:520px}
input[type=password]{width:100%;padding:7px;font-size:14px;box-sizing:border-box}
button{padding:6px 14px;font-size:14px;cursor:pointer}
.error{color:#b42318;font-weight:600}
"""

BANDS = (("high", 0.5, "≥ 50%"), ("mid", 0.1, "10–50%"), ("low", 0.0, "< 10%"))
"""Risk bands: name, lower bound, label."""


def band(risk: float | None) -> str:
    if risk is None:
        return "unscored"
    return next(name for name, lo, _ in BANDS if risk >= lo)


def risk_cell(risk: float | None) -> str:
    if risk is None:
        return '<td class="num muted">n/a</td>'
    width = max(1, round(risk * 80))
    return (f'<td class="num {band(risk)}"><span class="bar" style="width:{width}px"></span>'
            f"{pct(risk)}</td>")


def pct(risk: float | None) -> str:
    """A probability for people: 42.0%, 0.3%, < 0.1%."""
    if risk is None:
        return "n/a"
    if 0 < risk < 0.001:
        return "&lt; 0.1%"
    return f"{risk * 100:.1f}%"


def num(value: float | int | None) -> str:
    """A count or a rate for a table cell: ``400``, ``12.5``, ``—`` when unknown."""
    if value is None:
        return '<span class="muted">—</span>'
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def when(iso: str | None) -> str:
    """An ISO 'Z' time as ``2026-01-12 17:00 UTC``."""
    if not iso:
        return '<span class="muted">—</span>'
    t = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return f"{t:%Y-%m-%d %H:%M} UTC"


def ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = abs(seconds)
    text = (f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200
            else f"{s / 3600:.0f} h" if s < 172800 else f"{s / 86400:.0f} days")
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def node_link(node: str) -> str:
    return f'<a href="/nodes/{escape(quote(node, safe=""))}">{escape(node)}</a>'


def reasons_list(reasons: list[str]) -> str:
    if not reasons:
        return '<span class="muted">none</span>'
    return "<ul>" + "".join(f"<li>{escape(r)}</li>" for r in reasons) + "</ul>"


def table(headers: list[str], rows: list[str], empty: str) -> str:
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{h}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def simulated_banner(simulated: bool) -> str:
    return ('<div class="sim" role="alert">SIMULATED DATA: these nodes and failures come '
            "from the fleetcare simulator, not from a real fleet</div>" if simulated else "")


def page(title: str, body: str, *, simulated: bool, version: str, signed_in: bool,
         refresh_s: int | None = None, subtitle: str = "") -> str:
    """A whole HTML page."""
    refresh = (f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else "")
    signout = ('<form method="post" action="/logout"><button type="submit">Sign out</button>'
               "</form>" if signed_in else "")
    nav = ('<nav><a href="/">Overview</a><a href="/alerts">Alerts</a>'
           '<a href="/drains">Drains</a><a href="/models">Models</a>'
           '<a href="/docs">API</a><a href="/metrics">Metrics</a></nav>')
    sub = f"<p>{subtitle}</p>" if subtitle else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">{refresh}
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>fleetcare: {escape(title)}</title><style>{CSS}</style></head>
<body>{simulated_banner(simulated)}
<header><div><h1>fleetcare: {escape(title)}</h1>{sub}</div>{nav}{signout}</header>
<main>{body}
<p class="muted">fleetcare {escape(version)}</p></main>
</body></html>
"""


def fmt(value: Any) -> str:
    """A metric for people: 3 significant digits, n/a for None."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3g}"
