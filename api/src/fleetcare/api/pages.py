"""The dashboard's pages besides the overview: a node (``/nodes/{node}``), alerts,
drains, the model registry, and the sign-in form. Each takes the data its route read and
returns the whole HTML page (``fleetcare.api.html`` frames it).
"""

from __future__ import annotations

from html import escape
from typing import Any

from fleetcare.api import charts, html
from fleetcare.api.dashboard import QUALITY, model_line, quality
from fleetcare.api.history import BY_NAME, DEFAULT_SIGNALS, Signal, signals_for_reason

MAX_CHART_GPUS = 4
"""GPUs of a node whose reasons get charts (the riskiest first)."""


def chart_signals(detail: dict[str, Any]) -> dict[str, list[Signal]]:
    """Per GPU UUID, the signals to chart: those its reasons are about (one chart per
    signal), for its riskiest ``MAX_CHART_GPUS`` GPUs with reasons; when no reason names a
    signal, ``DEFAULT_SIGNALS`` for the node's top GPU."""
    gpus = sorted(detail["gpus"], key=lambda g: -(g["risk"] or 0.0))
    out: dict[str, list[Signal]] = {}
    for g in gpus:
        if len(out) == MAX_CHART_GPUS:
            break
        sigs = [s for r in g["reasons"] if (s := signals_for_reason(r)) is not None]
        if sigs:
            out[g["gpu_uuid"]] = list(dict.fromkeys(sigs))
    if not out and gpus:
        top = detail.get("top_gpu_uuid") or gpus[0]["gpu_uuid"]
        out[top] = [BY_NAME[n] for n in DEFAULT_SIGNALS]
    return out


def _gpu_name(g: dict[str, Any]) -> str:
    return f"GPU {g['gpu_index']}" if g.get("gpu_index") is not None else g["gpu_uuid"]


def _charts(detail: dict[str, Any], history: dict[str, Any] | None,
            wanted: dict[str, list[Signal]]) -> str:
    if history is None:
        return ('<p class="muted">No hourly history for this node yet (the rollups are '
                "built as telemetry arrives).</p>")
    by_uuid = {g["gpu_uuid"]: g for g in history["gpus"]}
    medians = {m["model"]: m["series"] for m in history["fleet_median"]}
    info = {g["gpu_uuid"]: g for g in detail["gpus"]}
    out = []
    for uuid, sigs in wanted.items():
        g = info.get(uuid) or by_uuid.get(uuid) or {"gpu_uuid": uuid, "gpu_index": None}
        series = by_uuid.get(uuid, {}).get("series", {})
        model = g.get("model") or by_uuid.get(uuid, {}).get("model")
        med = medians.get(model, {})
        figs = "".join(charts.line_chart(
            series.get(s.name, []), med.get(s.name, []), since=history["since"],
            until=history["until"], title=s.label, unit=s.unit, gpu_name=_gpu_name(g),
            median_name=f"fleet median, {model}" if model else "fleet median") for s in sigs)
        reasons = html.reasons_list(g.get("reasons") or [])
        out.append(f'<div class="gpu"><h3>{escape(_gpu_name(g))} <span class="muted">'
                   f'{escape(uuid)} · {escape(model or "")} · risk '
                   f'{html.pct(g.get("risk"))}</span></h3>{reasons}'
                   f'<div class="charts">{figs}</div></div>')
    span = f"{html.when(history['since'])} to {html.when(history['until'])}"
    return f'<p class="muted">Hourly, {span}.</p>{"".join(out)}'


def _network_risk_line(r: dict[str, Any] | None) -> str:
    if r is None or r["p_net"] is None:
        return ""
    t = r["threshold"]
    alarm = (f"; at or above {html.pct(t)} it alerts on its own under "
             f'[alerts] threshold = "model", the default' if t is not None else "")
    over = " <b>(alerting level)</b>" if t is not None and r["p_net"] >= t else ""
    return (f'<p id="network-risk">Network failure risk <b>{html.pct(r["p_net"])}</b>{over} '
            f"within 72 h from these ports (the model's network head, scored "
            f"{html.when(r['ts'])}{alarm}).</p>")


def node(detail: dict[str, Any], history: dict[str, Any] | None,
         wanted: dict[str, list[Signal]], *, xids: list[dict[str, Any]],
         incidents: list[dict[str, Any]], drain: dict[str, Any] | None,
         audit: list[dict[str, Any]], simulated: bool, version: str,
         signed_in: bool, offender: dict[str, Any] | None = None,
         nics: list[dict[str, Any]] | None = None,
         network_risk: dict[str, Any] | None = None) -> str:
    """The page of one node; ``offender``: its ``Offender.to_json()`` when it is one;
    ``nics``: its InfiniBand/RoCE ports (``queries.node_nics``; the section shows only
    for a node that has some), ``network_risk`` the network head's probability of a
    network failure from them (``queries.node_network_risk``)."""
    labels = ", ".join(f"{escape(k)}={escape(v)}" for k, v in detail["labels"].items())
    gpu_rows = [
        f"<tr><td class=\"num\">{escape(str(g['gpu_index']))}</td><td>{escape(g['gpu_uuid'])}"
        f"</td><td>{escape(g.get('model') or '')}</td>{html.risk_cell(g['risk'])}"
        f"<td>{html.reasons_list(g['reasons'])}</td></tr>" for g in detail["gpus"]]
    xid_rows = [
        f"<tr><td>{html.when(x['ts'])}</td><td class=\"num\">{escape(str(x['xid']))}</td>"
        f"<td>{escape(str(x['gpu_index']) if x['gpu_index'] is not None else '')}</td>"
        f"<td>{escape(x['message'] or '')}</td><td>{escape(x['source'] or '')}</td></tr>"
        for x in xids]
    inc_rows = [
        f"<tr><td>{html.when(i['ts'])}</td><td>{escape(i['kind'])}</td>"
        f"<td>{escape(i['cause'])}</td><td>{escape(i['mode'] or '')}</td>"
        f"<td>{escape(i['gpu_uuid'] or '')}</td><td>{escape(i['note'] or '')}</td></tr>"
        for i in incidents]
    nic_rows = [
        f"<tr><td>{escape(n['device'])}/{n['port']}</td><td>{escape(n['state'] or '?')}"
        f"{' · ' + escape(n['phys_state']) if n['phys_state'] else ''}</td>"
        f"<td class=\"num\">{html.num(n['rate_gbps'])}</td>"
        f"<td class=\"num\">{html.num(n['flaps_24h'])}</td>"
        f"<td class=\"num\">{html.num(n['symbol_error_24h'])}</td>"
        f"<td>{escape(', '.join(n['saturated'])) or '-'}</td>"
        f"<td>{html.when(n['ts'])}</td></tr>" for n in nics or []]
    nic_part = ("<h2>Network ports</h2>" + _network_risk_line(network_risk) + html.table(
        ["Port", "State", "Gb/s", "Flaps 24 h", "Symbol errors 24 h", "Saturated counters",
         "Sampled"], nic_rows, "") if nic_rows else "")
    if drain is None:
        drain_state = "<p>Not drained by fleetcare.</p>"
    else:
        cleared = (f"; cleared by {escape(drain['cleared_by'] or '?')} at "
                   f"{html.when(drain['cleared_at'])}" if drain["cleared_at"] else "")
        drain_state = (f"<p><b>Drained</b> by fleetcare in {escape(drain['scheduler'])} at "
                       f"{html.when(drain['drained_at'])} (risk {html.pct(drain['risk'])}: "
                       f"{escape(drain['reason'] or '')}); review at "
                       f"{html.when(drain['review_at'])}{cleared}.</p>")
    body = (
        f"<p>Failure risk <b>{html.pct(detail['risk'])}</b>, scored "
        f"{html.when(detail['scored_at'])} by {escape(detail['model_id'] or 'no model')}"
        f"{'; labels ' + labels if labels else ''}.</p>"
        f"<h2>Reasons</h2>{html.reasons_list(detail['reasons'])}"
        f"<h2>Signal history against the fleet</h2>{_charts(detail, history, wanted)}"
        f"<h2>GPUs</h2>"
        + html.table(["#", "UUID", "Model", "Risk", "Reasons"], gpu_rows, "No GPU reported.")
        + nic_part
        + "<h2>Recent XIDs</h2>"
        + html.table(["Time", "XID", "GPU", "Message", "Source"], xid_rows,
                     "No XID recorded for this node.")
        + f"<h2>Repeat failures</h2>{offender_line(offender)}"
        + "<h2>Incidents</h2>"
        + html.table(["Time", "Kind", "Cause", "Mode", "GPU", "Note"], inc_rows,
                     "No incident recorded for this node.")
        + f"<h2>Drain</h2>{drain_state}<h3>Audit trail</h3>" + _audit_table(audit)
    )
    return html.page(f"node {detail['node']}", body, simulated=simulated, version=version,
                     signed_in=signed_in)


def offender_line(o: dict[str, Any] | None) -> str:
    """One line: is the node a repeat offender, and what to do (``models.offenders``)."""
    if o is None:
        return "<p>Not a repeat offender: fewer than 2 failures in the last 30 days.</p>"
    repaired = (f"repaired {html.when(o['repaired_at'])}" if o["repaired_since"]
                else "no repair recorded since")
    return (f"<p class=\"offender\"><b>Repeat offender</b>: {o['failures']} failures in "
            f"{o['window_days']} days, the last {html.when(o['last_failure_ts'])} "
            f"({escape(o['last_cause'])}), {repaired}; recurrence risk "
            f"{html.pct(o['risk_7d'])} in 7 days. Suggested: <b>{escape(o['suggestion'])}"
            f"</b> ({escape(o['why'])}).</p>")


def unknown_node(node: str, *, simulated: bool, version: str, signed_in: bool) -> str:
    body = (f"<p>Node <b>{escape(node)}</b> is not known to fleetcare: check the name on "
            '<a href="/">the overview</a>.</p>')
    return html.page("unknown node", body, simulated=simulated, version=version,
                     signed_in=signed_in)


def _audit_table(audit: list[dict[str, Any]]) -> str:
    rows = [f"<tr><td>{html.when(a['ts'])}</td><td>{html.node_link(a['node'])}</td>"
            f"<td>{escape(a['action'])}{' (dry run)' if a['dry_run'] else ''}</td>"
            f"<td>{escape(a['actor'])}</td>{html.risk_cell(a['risk'])}"
            f"<td>{escape(a['reason'] or '')}</td><td>{escape(a['result'])}</td></tr>"
            for a in audit]
    return html.table(["Time", "Node", "Action", "Actor", "Risk", "Reason", "Result"], rows,
                      "The drain controller has recorded nothing here.")


def alerts(items: list[dict[str, Any]], *, simulated: bool, version: str,
           signed_in: bool) -> str:
    rows = [f"<tr><td>{escape(a['state'] or '')}</td><td>{html.node_link(a['node'])}</td>"
            f"{html.risk_cell(a['risk'])}<td>{html.when(a['started_at'])}</td>"
            f"<td>{html.when(a['fired_at'])}</td><td>{html.when(a['resolved_at'])}</td>"
            f"<td>{html.reasons_list(a['reasons'])}</td></tr>" for a in items]
    body = html.table(["State", "Node", "Risk", "Started", "Fired", "Resolved", "Reasons"],
                      rows, "No alert raised (the alerts engine runs in fleetcare serve).")
    return html.page("alerts", body, simulated=simulated, version=version,
                     signed_in=signed_in, refresh_s=30)


def drains(held: list[dict[str, Any]], audit: list[dict[str, Any]], *, overdue: int,
           simulated: bool, version: str, signed_in: bool) -> str:
    rows = [f"<tr><td>{html.node_link(d['node'])}</td><td>{escape(d['scheduler'])}</td>"
            f"<td>{html.when(d['drained_at'])}</td><td>{html.when(d['review_at'])}</td>"
            f"{html.risk_cell(d['risk'])}<td>{escape(d['reason'] or '')}</td>"
            f"<td>{escape(d['cleared_by'] or '')}</td></tr>" for d in held]
    body = (f"<p>{len(held)} drain(s) held, {overdue} past their review time.</p>"
            + html.table(["Node", "Scheduler", "Drained", "Review at", "Risk", "Reason",
                          "Cleared by"], rows, "fleetcare holds no drain.")
            + "<h2>Audit trail</h2>" + _audit_table(audit))
    return html.page("drains", body, simulated=simulated, version=version,
                     signed_in=signed_in, refresh_s=30)


def models(items: list[dict[str, Any]], current: dict[str, Any] | None, *, simulated: bool,
           version: str, signed_in: bool) -> str:
    rows = []
    for m in items:
        cells = "".join(f'<td class="num">{html.fmt(m["metrics"].get(k))}</td>'
                        for k, _ in QUALITY)
        rows.append(f"<tr><td>{escape(m['model_id'])}{' <b>(current)</b>' if m['is_current'] else ''}"
                    f"</td><td>{escape(m['origin'])}</td><td>{html.when(m['created_at'])}</td>"
                    f"<td class=\"num\">{html.fmt(m['horizon_h'])}</td>{cells}"
                    f"<td>{escape(m['current_reason'] or '')}</td></tr>")
    body = (model_line(current) + quality(current.get("metrics") if current else None)
            + "<h2>Registry</h2>"
            + html.table(["Model", "Origin", "Created", "Horizon (h)",
                          *(label for _, label in QUALITY), "Why current"], rows,
                         "No model registered: `fleetcare train`."))
    return html.page("model registry", body, simulated=simulated, version=version,
                     signed_in=signed_in)


def sign_in(*, error: str | None, version: str, next_page: str = "/") -> str:
    """The sign-in form (``POST /login``, field ``token``)."""
    err = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    body = (
        '<form class="signin" method="post" action="/login">'
        "<h2>Sign in</h2>"
        "<p>Paste an API token of scope <b>read</b> or above. An operator creates one "
        "with <code>fleetcare tokens create --scope read --db PATH</code> (or "
        "<code>POST /v1/tokens</code>).</p>"
        f'{err}<p><label for="token">Token</label><br>'
        '<input type="password" id="token" name="token" autocomplete="off" required '
        'maxlength="256" placeholder="fc_…"></p>'
        f'<input type="hidden" name="next" value="{escape(next_page)}">'
        '<button type="submit">Sign in</button></form>')
    return html.page("sign in", body, simulated=False, version=version, signed_in=False)
