"""The dashboard's overview page (``GET /``): the fleet by risk band, alerts firing, drains
held and overdue, the model in use and its held-out quality, goodput the drains are
expected to have saved, data freshness, repeat offenders (burn-in or RMA), and the nodes
ranked by risk, each linking to its page. Rendered on the server (``fleetcare.api.html``), refreshed by the browser every
``REFRESH_S`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any

from fleetcare.api import html

REFRESH_S = 30
QUALITY = (("pr_auc", "PR-AUC"), ("recall_at_budget", "recall at the drain budget"),
           ("false_drains_per_1000_node_days", "false drains per 1000 node-days"),
           ("median_lead_time_h", "median lead time (h)"))
"""The held-out metrics shown for a model, in this order (``fleetcare.models.metrics``)."""


@dataclass
class Overview:
    """What the overview shows (the route gathers it; ``render`` draws it)."""

    nodes: list[dict[str, Any]]
    simulated: bool
    scored_at: str | None
    score_age_s: float | None
    total_nodes: int
    version: str
    model: dict[str, Any] | None = None
    bands: dict[str, int] = field(default_factory=dict)
    alerts_open: dict[str, int] = field(default_factory=dict)
    firing: list[dict[str, Any]] = field(default_factory=list)
    drains_held: int = 0
    drains_overdue: int = 0
    drains_dry_run: int = 0
    goodput: dict[str, Any] | None = None
    telemetry_at: str | None = None
    telemetry_age_s: float | None = None
    signed_in: bool = False
    offenders: list[dict[str, Any]] = field(default_factory=list)  # Offender.to_json()


def model_line(model: dict[str, Any] | None) -> str:
    """Which model scores, and why (``queries.current_model``)."""
    if model is None:
        return "<p class=muted>No model scores yet.</p>"
    kind = ("the fleet prior shipped with fleetcare (trained on simulated fleets)"
            if model.get("origin") == "prior" else "this fleet's own model")
    why = f" — {escape(model['current_reason'])}" if model.get("current_reason") else ""
    return (f"<p>Scoring with <b>{escape(model['model_id'])}</b>, {kind}{why}.</p>")


def quality(metrics: dict[str, Any] | None) -> str:
    """The model's held-out metrics, and the baselines' when the registry recorded them."""
    metrics = metrics or {}
    if not any(k in metrics for k, _ in QUALITY):
        return '<p class="muted">No held-out metrics recorded for this model.</p>'
    found = metrics.get("baselines")
    baselines: dict[str, Any] = found if isinstance(found, dict) else {}
    head = ["Held-out (test period)", "fleetcare", *(escape(str(b)) for b in baselines)]
    rows = []
    for key, label in QUALITY:
        cells = "".join(f'<td class="num">{html.fmt(b.get(key) if isinstance(b, dict) else None)}'
                        "</td>" for b in baselines.values())
        rows.append(f'<tr><td>{label}</td><td class="num">{html.fmt(metrics.get(key))}</td>'
                    f"{cells}</tr>")
    note = ("" if baselines else '<p class="muted">The registry holds no baseline results '
            "for this model: <code>fleetcare evaluate</code> compares it with the reactive "
            "XID rules, DCGM thresholds and logistic regression.</p>")
    return html.table(head, rows, "") + note


def _row(rank: int, n: dict[str, Any]) -> str:
    return (
        f'<tr><td class="num">{rank}</td><td>{html.node_link(n["node"])}</td>'
        f"{html.risk_cell(n['risk'])}<td>{html.reasons_list(n['reasons'])}</td>"
        f"<td>{escape(n['top_gpu_uuid'] or '')}</td>"
        f"<td class=\"num\">{escape(n['scored_at'] or '')}</td>"
        f"<td>{escape(n['model_id'] or '')}</td></tr>"
    )


def offenders_table(offenders: list[dict[str, Any]]) -> str:
    """Repeat offenders (``fleetcare.models.offenders``): what to do with each."""
    rows = [
        f"<tr><td>{html.node_link(o['node'])}</td><td class=\"num\">{o['failures']}</td>"
        f"<td>{html.when(o['last_failure_ts'])} ({escape(o['last_cause'])})</td>"
        f"<td>{'repaired ' + html.when(o['repaired_at']) if o['repaired_since'] else 'no'}"
        f"</td>{html.risk_cell(o['risk_7d'])}"
        f"<td><b>{escape(o['suggestion'])}</b> ({escape(o['why'])})</td>"
        f"<td>{html.reasons_list(o['reasons'])}</td></tr>" for o in offenders]
    return html.table(["Node", "Failures in 30 days", "Last failure", "Repaired since",
                       "Recurrence risk (7 d)", "Suggestion", "Why it may fail again"],
                      rows, "No node failed twice in the last 30 days.")


def _cards(o: Overview) -> str:
    cards = [f'<div class="card {name}"><b>{o.bands.get(name, 0)}</b>risk {label}</div>'
             for name, _, label in html.BANDS]
    firing = o.alerts_open.get("firing", 0)
    cards.append(f'<div class="card{" high" if firing else ""}"><b>{firing}</b>'
                 f'<a href="/alerts">alerts firing</a> ({o.alerts_open.get("pending", 0)} '
                 "pending)</div>")
    dry = (f"; {o.drains_dry_run} node(s) a dry run would drain" if o.drains_dry_run else "")
    cards.append(f'<div class="card{" mid" if o.drains_overdue else ""}"><b>{o.drains_held}'
                 f'</b><a href="/drains">drains held</a> ({o.drains_overdue} overdue for '
                 f"review{dry})</div>")
    if o.goodput is not None:
        cards.append(f'<div class="card low"><b>{o.goodput["net_saved_gpu_h"]:,.0f}</b>'
                     f'GPU-hours expected saved by {o.goodput["drains"]} drain(s)</div>')
    else:
        cards.append('<div class="card"><b>—</b>goodput saved: no drain made yet</div>')
    return f'<div class="cards">{"".join(cards)}</div>'


def _freshness(o: Overview) -> str:
    if o.scored_at is None:
        return ("<p>No scores yet: run <code>fleetcare train</code> and start the scorer.</p>")
    tel = (f"newest telemetry {html.when(o.telemetry_at)} ({html.ago(o.telemetry_age_s)})"
           if o.telemetry_at else "no telemetry in the database")
    return (f"<p>{o.total_nodes} nodes scored; newest score {html.when(o.scored_at)} "
            f"({html.ago(o.score_age_s)}); {tel}; showing the top {len(o.nodes)}.</p>")


def render(o: Overview) -> str:
    """The overview page."""
    firing = [f"<tr><td>{html.node_link(a['node'])}</td>{html.risk_cell(a['risk'])}"
              f"<td>{html.when(a['fired_at'] or a['started_at'])}</td>"
              f"<td>{html.reasons_list(a['reasons'])}</td></tr>" for a in o.firing]
    rows = [_row(i, n) for i, n in enumerate(o.nodes, 1)]
    body = (
        f"{_cards(o)}<h2>Data freshness</h2>{_freshness(o)}"
        f"<h2>Model</h2>{model_line(o.model)}"
        f"{quality(o.model.get('metrics') if o.model else None)}"
        + (f"<h2>Alerts firing</h2>{html.table(['Node', 'Risk', 'Since', 'Reasons'], firing, '')}"
           if firing else "")
        + "<h2>Repeat offenders</h2>" + offenders_table(o.offenders)
        + "<h2>Nodes by risk</h2>"
        + html.table(["#", "Node", "Failure risk", "Reasons", "Top GPU", "Scored at (UTC)",
                      "Model"], rows, "No node is scored yet.")
    )
    return html.page(
        "which nodes to drain", body, simulated=o.simulated, version=o.version,
        signed_in=o.signed_in, refresh_s=REFRESH_S,
        subtitle="Nodes ranked by probability of a failure incident within the model "
                 f"horizon. Refreshes every {REFRESH_S} s.")
