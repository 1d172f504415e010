"""The dashboard in a browser: sign-in, the overview, a node's page, alerts, drains and
the model registry (HTML; scope ``read``).

A browser signs in with an API token through the form (``POST /login``) and then carries
a session cookie (``fleetcare.api.sessions``); a client that sends a bearer token is let
in as on ``/v1`` routes. Without either, a browser's page load (``Accept: text/html``) is
sent to the form (303 to ``/login?next=PAGE``, and back to PAGE once signed in); any other
client gets 401 with the form. With ``auth=False`` (loopback only) there is nothing to
sign in to.
"""

from __future__ import annotations

import logging
from typing import Annotated
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from fleetcare.api import auth as _auth
from fleetcare.api import dashboard, history, page_data, pages, queries, sessions
from fleetcare.api.routers.deps import NODE_PATH, AppContext, Ctx, Cur

log = logging.getLogger(__name__)
router = APIRouter()
MAX_TOKEN_CHARS = 256


class SignInRequired(Exception):
    """A page was asked for without a session or token: answer the sign-in form."""


def page_user(request: Request, creds: _auth.Credentials) -> _auth.TokenInfo | None:
    """The token a page request is made with: its session's, else its bearer token's
    (checked as ``auth.require('read')`` checks it). None when auth is off."""
    state = request.app.state
    if not state.auth:
        return None
    sid = request.cookies.get(sessions.COOKIE)
    if sid:
        cur = state.store.cursor()
        try:
            info = sessions.lookup(cur, sid)
        finally:
            cur.close()
        if info is not None and info.allows("read"):
            return info
    if creds is not None:
        checked: _auth.TokenInfo | None = _auth.require("read")(request, creds)
        return checked
    raise SignInRequired


page_user.scope = "read"  # type: ignore[attr-defined]  # for app._route_scope
PageUser = Annotated[_auth.TokenInfo | None, Depends(page_user)]


def sign_in_page(request: Request, error: str | None = None, status: int = 401,
                 next_page: str = "/") -> HTMLResponse:
    ctx: AppContext = request.app.state.ctx
    headers = {"Cache-Control": "no-store"}
    if status == 401:  # RFC 9110: a 401 names its scheme (browsers ask nothing for Bearer)
        headers["WWW-Authenticate"] = "Bearer"
    return HTMLResponse(pages.sign_in(error=error, version=ctx.version, next_page=next_page),
                        status_code=status,
                        headers=headers)


def _signed_in(request: Request, user: _auth.TokenInfo | None) -> bool:
    return user is not None and sessions.COOKIE in request.cookies


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})


@router.get("/", response_class=HTMLResponse, tags=["service"],
            responses={401: {"description": "Not signed in: the sign-in form.",
                             "content": {"text/html": {}}},
                       403: {"description": "The bearer token's scope is too weak.",
                             "content": {"application/json": {"schema": {
                                 "$ref": "#/components/schemas/ErrorDetail"}}}}})
def home(
    request: Request,
    cur: Cur,
    ctx: Ctx,
    user: PageUser,
    limit: Annotated[int, Query(ge=1, le=10000, description="Rows shown.")] = 200,
) -> HTMLResponse:
    """The dashboard's overview (read scope; a browser signs in with a token through the
    form this page shows without a session)."""
    tables = queries.existing_tables(cur)
    latest = queries.latest_score_ts(cur, tables)
    telemetry = queries.latest_telemetry_ts(cur, tables, ctx.store.raw)
    drains = queries.drain_stats(cur, tables, ctx.utcnow())
    overview = dashboard.Overview(
        nodes=queries.ranked_nodes(cur, tables, limit=limit),
        simulated=ctx.is_simulated(cur, tables),
        scored_at=queries.iso_z(latest),
        score_age_s=ctx.age_s(latest),
        total_nodes=queries.scored_node_count(cur, tables),
        version=ctx.version,
        model=queries.current_model(cur, tables),
        bands=page_data.risk_bands(cur, tables),
        alerts_open=dict(queries.alert_stats(cur, tables)["open"]),
        firing=queries.alerts(cur, tables, state="firing", limit=20),
        drains_held=sum(int(n) for _, n in drains["held"]),
        drains_overdue=int(drains["overdue"]),
        drains_dry_run=page_data.dry_run_drains(cur, tables),
        goodput=page_data.drains_goodput(cur, tables),
        telemetry_at=queries.iso_z(telemetry),
        telemetry_age_s=ctx.age_s(telemetry),
        signed_in=_signed_in(request, user),
        offenders=[o.to_json() for o in ctx.repeat_offenders()],
    )
    return _html(dashboard.render(overview))


@router.get("/nodes/{node}", response_class=HTMLResponse, include_in_schema=False)
def node_page(
    request: Request,
    node: Annotated[str, Path(min_length=1, max_length=256, pattern=NODE_PATH)],
    cur: Cur,
    ctx: Ctx,
    user: PageUser,
) -> HTMLResponse:
    """A node: per-GPU risk and reasons, the history of the signals behind them against
    the fleet median, recent XIDs, incidents, and its drain with the audit trail."""
    tables = queries.existing_tables(cur)
    simulated = ctx.is_simulated(cur, tables)
    signed_in = _signed_in(request, user)
    detail = queries.node_detail(cur, tables, node, ctx.store.raw)
    if detail is None:
        return _html(pages.unknown_node(node, simulated=simulated, version=ctx.version,
                                        signed_in=signed_in), 404)
    wanted = pages.chart_signals(detail)
    signals = list(dict.fromkeys(s for sigs in wanted.values() for s in sigs))
    hist = history.node_history(cur, tables, node, signals) if signals else None
    return _html(pages.node(
        detail, hist, wanted, xids=page_data.node_xids(cur, tables, node),
        incidents=page_data.node_incidents(cur, tables, node),
        drain=page_data.node_drain(cur, tables, node),
        audit=page_data.drain_audit(cur, tables, node), simulated=simulated,
        version=ctx.version, signed_in=signed_in,
        nics=queries.node_nics(cur, tables, node) if ctx.has_nics(cur, tables) else [],
        network_risk=queries.node_network_risk(cur, tables, node),
        offender=next((o.to_json() for o in ctx.repeat_offenders() if o.node == node), None)))


@router.get("/alerts", response_class=HTMLResponse, include_in_schema=False)
def alerts_page(request: Request, cur: Cur, ctx: Ctx, user: PageUser) -> HTMLResponse:
    tables = queries.existing_tables(cur)
    return _html(pages.alerts(queries.alerts(cur, tables, limit=500),
                              simulated=ctx.is_simulated(cur, tables), version=ctx.version,
                              signed_in=_signed_in(request, user)))


@router.get("/drains", response_class=HTMLResponse, include_in_schema=False)
def drains_page(request: Request, cur: Cur, ctx: Ctx, user: PageUser) -> HTMLResponse:
    tables = queries.existing_tables(cur)
    return _html(pages.drains(
        queries.held_drains(cur, tables), page_data.drain_audit(cur, tables, limit=200),
        overdue=page_data.overdue_drains(cur, tables, ctx.utcnow()),
        simulated=ctx.is_simulated(cur, tables), version=ctx.version,
        signed_in=_signed_in(request, user)))


@router.get("/models", response_class=HTMLResponse, include_in_schema=False)
def models_page(request: Request, cur: Cur, ctx: Ctx, user: PageUser) -> HTMLResponse:
    tables = queries.existing_tables(cur)
    return _html(pages.models(page_data.models(cur, tables),
                              queries.current_model(cur, tables),
                              simulated=ctx.is_simulated(cur, tables), version=ctx.version,
                              signed_in=_signed_in(request, user)))


@router.get("/login", response_class=HTMLResponse, include_in_schema=False)
def login_form(
    request: Request,
    next: Annotated[str | None, Query(max_length=2048)] = None,  # noqa: A002
) -> HTMLResponse:
    return sign_in_page(request, status=200, next_page=_next(next))


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """No icon (a browser asks for one on every site; a 404 would be a console error)."""
    return Response(status_code=204)


@router.post("/login", include_in_schema=False)
async def login(request: Request) -> Response:
    """Sign in: the form's ``token`` (scope read or above) becomes a session cookie."""
    raw = (await request.body()).decode("utf-8", "replace")
    try:
        form = parse_qs(raw, max_num_fields=8)
    except ValueError:
        form = {}
    token = (form.get("token") or [""])[0].strip()
    target = _next((form.get("next") or ["/"])[0])
    if not request.app.state.auth:
        return RedirectResponse(target, status_code=303)
    if not token or len(token) > MAX_TOKEN_CHARS:
        return sign_in_page(request, "Paste a token (fc_…, at most "
                            f"{MAX_TOKEN_CHARS} characters) to sign in.", next_page=target)
    sid = await run_in_threadpool(_start_session, request, token)
    if sid is None:
        return sign_in_page(request, "That token is not valid (mistyped, revoked or from "
                            "another database): list tokens with `fleetcare tokens list "
                            "--db PATH`, create one with `fleetcare tokens create --scope "
                            "read --db PATH`.", next_page=target)
    response = RedirectResponse(target, status_code=303)
    response.headers["Set-Cookie"] = sessions.cookie_header(
        sid, secure=request.url.scheme == "https")
    return response


def _start_session(request: Request, token: str) -> str | None:
    cur = request.app.state.store.cursor()
    try:
        info = _auth.lookup(cur, token)
        if info is None or not info.allows("read"):
            return None
        sid = sessions.create(cur, info)
    finally:
        cur.close()
    log.info("api.signed_in token=%s scope=%s", info.id, info.scope)
    return sid


@router.post("/logout", include_in_schema=False)
def logout(request: Request, cur: Cur) -> Response:
    """Sign out: the session ends here and the cookie is cleared."""
    sid = request.cookies.get(sessions.COOKIE)
    if sid:
        sessions.end(cur, sid)
    response = RedirectResponse("/", status_code=303)
    response.headers["Set-Cookie"] = sessions.clear_cookie_header(
        secure=request.url.scheme == "https")
    return response


def sign_in_handler(request: Request, exc: Exception) -> Response:
    """``SignInRequired`` → a browser to the sign-in form, anyone else 401 with it (a
    browser would log the 401 of the page it shows as a console error)."""
    return sign_in_response(request)


def sign_in_response(request: Request) -> Response:
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303,
                                headers={"Cache-Control": "no-store"})
    return sign_in_page(request)


def _next(raw: str | None) -> str:
    """Where to go once signed in: a path of this site only (never another host)."""
    if (not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw
            or len(raw) > 2048 or any(ord(c) < 32 or ord(c) == 127 for c in raw)):
        return "/"
    return raw


