"""The fleetcare REST API, dashboard and Prometheus metrics (FastAPI): ``create_app``.

The service is one process: ingest, scorer and API threads share one DuckDB database,
so the app only *reads*, each request through its own ``store.cursor()`` (FastAPI runs
sync endpoints on worker threads; DuckDB's MVCC lets reads run while a write
transaction is open, and no reader takes the store's write lock). The latest node scores
``/v1/risk`` pages through are held in memory (``latest_scores``), rebuilt after each
scoring run.

The one exception: the API is the process that holds the database, so the few writes
that come from outside (incident reports, node labels, tokens, dashboard sessions) go
through it.

The routes live in ``fleetcare.api.routers`` (one module per area); this module builds
the app: middleware, error handlers, the API's tables, the routers. Serving it is
``fleetcare.api.server``'s job (``serve(app, ...)``), which does not import this module.

Routes (scope needed; see ``fleetcare.api.auth``)::

    GET /                      read   dashboard overview (HTML; a browser signs in first)
    GET /nodes/{n}, /alerts,   read   dashboard pages: a node with its signal history,
        /drains, /models              alerts, drains, the model registry (HTML)
    GET/POST /login            open   sign-in form: a read token -> session cookie
    POST /logout               open   end the session
    GET /healthz               open   liveness + freshness of telemetry and scores
    GET /metrics               open   Prometheus text (node risk, drains, alerts, ingest)
    GET /docs, /openapi.json   open   OpenAPI UI (Swagger UI 5, vendored: no CDN) and spec;
                                      no /redoc (ReDoc would load a script from a CDN)
    GET /v1/risk               read   latest score per node, highest risk first; filters
                                      (label, partition, gpu_model, min_risk) and paging
    GET /v1/nodes/{n}          read   one node: score, reasons, labels, per-GPU detail
    GET /v1/nodes/{n}/history  read   hourly signal series per GPU + fleet median
    GET /v1/gpus/{uuid}        read   one GPU: score, reasons, latest telemetry
    GET /v1/drain-candidates   read   nodes whose expected goodput saved > drain cost
    GET /v1/repeat-offenders   read   nodes that failed twice in 30 days: burn-in or RMA
    GET /v1/drains             read   the drains fleetcare holds
    POST /v1/drains/{n}/clear  admin  an operator cleared a drained node (resume it)
    GET/POST /v1/tokens        admin  list / create API tokens (the value is shown once)
    POST /v1/tokens/{id}/revoke admin revoke a token (at once on this server, with its
                                      dashboard sessions)
    GET /v1/alerts             read   the alerts engine's alerts, newest first
    GET /v1/model              read   the current model (registry row)
    POST /v1/incidents         write  report a failure or repair (labels for the next model)
    PUT /v1/nodes/{n}/labels   admin  set a node's labels (partition, rack, ...)

Errors: 401 (no or unknown token, with ``WWW-Authenticate: Bearer``; a dashboard page
answers its sign-in form), 403 (naming the scope needed), 404, 413 (a body over
``max_body_bytes``, default 1 MiB), 422 (``message`` plus ``detail[].loc`` naming each bad
field, also a query parameter the endpoint does not take, and NaN/Infinity in a JSON body;
the input is echoed as a short excerpt only), 503 (the database could not answer). Every
error body has a human-readable message.

Authentication comes before parameter validation: a request without a valid token gets
401 (403 for a weak scope) whatever its parameters, never a 422 that echoes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

import duckdb
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from fleetcare.api import auth as _auth
from fleetcare.api import priority, queries, sessions
from fleetcare.api.latest_samples import LatestSamples
from fleetcare.api.latest_scores import LatestScores
from fleetcare.api.request_bounds import DEFAULT_MAX_BODY_BYTES, BodyLimit, excerpt
from fleetcare.api.routers import docs, nodes, operations, risk, service, tokens, web
from fleetcare.api.routers.deps import AppContext, invalid
from fleetcare.api.server import bound_port
from fleetcare.collectors.agent_metrics import Family
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store

__all__ = ["create_app", "bound_port"]

log = logging.getLogger(__name__)

DESCRIPTION = """\
Predictive maintenance for GPU fleets: which nodes to drain **before** they crash a
training job, with reasons a human can check.

Risks are calibrated probabilities of a failure incident within the model's horizon
(see `GET /v1/model`). Timestamps are ISO-8601 UTC ending in `Z`. Numbers are never
NaN: a value the scorer could not compute is `null`.
"""


def _validation_body(exc: RequestValidationError) -> dict[str, Any]:
    items = []
    for e in exc.errors():
        item = {k: e[k] for k in ("loc", "msg", "type") if k in e}
        item["loc"] = [p if isinstance(p, int) else excerpt(str(p)) for p in item.get("loc", [])]
        if "input" in e:  # an excerpt: never the whole body, always valid JSON
            item["input"] = excerpt(e["input"])
        items.append(item)
    first = items[0] if items else {"loc": [], "msg": "invalid request"}
    where = first["loc"]
    field = ".".join(str(p) for p in where[1:]) or "request"
    kind = {"query": "query parameter", "path": "path parameter", "body": "body field",
            "header": "header"}.get(str(where[0]) if where else "", "field")
    msg = f"{kind} '{field}': {first['msg']}"
    if len(items) > 1:
        msg += f" (and {len(items) - 1} more in detail)"
    return {"message": msg, "detail": jsonable_encoder(items)}


async def _known_query_parameters(request: Request) -> None:
    """422 for a query parameter the endpoint does not take: ``?limt=5`` silently meaning
    "no limit" is worse than an error naming the parameters it does take. The names come
    from the app's own OpenAPI spec, the contract (routes outside it are not checked)."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    path = getattr(route, "path_format", None)
    known = _query_names(request.app, path, request.method.lower()) if path else None
    if known is None:
        return
    unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in known]
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise invalid(["query", unknown[0]], f"unknown query parameter {unknown[0]!r}; "
                       f"{request.method} {path} takes: {takes}",
                       request.query_params.get(unknown[0]))
    # one value for a parameter that takes one: ?gpu_model=a&gpu_model=b silently meaning
    # "b" is as bad (only list parameters, e.g. label, repeat)
    for name in dict.fromkeys(request.query_params.keys()):
        values = request.query_params.getlist(name)
        if len(values) > 1 and not known[name]:
            raise invalid(["query", name], f"query parameter {name!r} is given "
                          f"{len(values)} times; {request.method} {path} takes one value "
                          "for it", values[-1])


def _query_names(app: FastAPI, path: str, method: str) -> dict[str, bool] | None:
    """The query parameters the spec gives the operation, each with whether it takes a
    list (None: not in the spec), read from ``app.openapi()`` once per operation:
    generating the spec showed up as a fifth of the API's CPU under load."""
    cache: dict[tuple[str, str], dict[str, bool] | None] = app.state.query_names
    key = (path, method)
    if key not in cache:
        op = app.openapi().get("paths", {}).get(path, {}).get(method)
        cache[key] = None if op is None else {
            p["name"]: _is_list(p.get("schema", {}))
            for p in op.get("parameters", []) if p.get("in") == "query"}
    return cache[key]


def _is_list(schema: dict[str, Any]) -> bool:
    if schema.get("type") == "array":
        return True
    return any(_is_list(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


def _route_check(route: Any) -> Any:
    """The auth check a route depends on (``auth.require(scope)`` or the dashboard's
    ``web.page_user``: callables with a ``scope``), if any."""
    stack = list(getattr(getattr(route, "dependant", None), "dependencies", []))
    while stack:
        dep = stack.pop()
        if isinstance(getattr(dep.call, "scope", None), str):
            return dep.call
        stack.extend(dep.dependencies)
    return None


async def _auth_error(request: Request) -> Response | None:
    """The 401/403 a request would get from its route's auth check, or None when it passes
    (or the route is open): what a validation error must not get ahead of."""
    from fastapi.exception_handlers import http_exception_handler

    check = _route_check(request.scope.get("route"))
    if check is None or not request.app.state.auth:
        return None
    try:
        check(request, await _auth.BEARER(request))
    except HTTPException as exc:
        return await http_exception_handler(request, exc)
    except web.SignInRequired:
        return web.sign_in_response(request)
    return None


def _version() -> str:
    try:
        return metadata.version("fleetcare-api")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _ensure_api_tables(store: Store, auth: bool) -> None:
    """The API's own tables (tokens, node labels), and an empty ``alerts`` table for
    ``GET /v1/alerts`` until the alerts engine creates its own."""
    cur = store.cursor()
    try:
        cur.execute(_auth.DDL)
        cur.execute(sessions.DDL)
        cur.execute(queries.LABELS_DDL)
        scoring.create_schema(cur)  # the latest-score views the readers use
        try:  # the alerts engine's schema, so that it finds its own table
            from fleetcare.api.alerts.engine import ensure_schema
        except ImportError:
            cur.execute(queries.ALERTS_DDL)
        else:
            ensure_schema(cur)
        if auth and not any(t.revoked_at is None for t in _auth.list_tokens(cur)):
            log.warning("api.no_tokens: every /v1 request will get 401 until a token "
                        "exists: `fleetcare tokens create --scope read --db %s`", store.path)
    except duckdb.Error as exc:  # a read-only store: the readers treat them as empty
        log.warning("api.tables_not_created error=%s", exc)
    finally:
        cur.close()


def _start_latest_scores(store: Store, latest: LatestScores) -> None:
    """Build the in-memory latest scores now, and after each scoring run of this
    process."""
    latest.attach(store)
    cur = store.cursor()
    try:
        latest.refresh(cur)
    except duckdb.Error as exc:  # a read-only store without score tables: none to serve
        log.warning("api.latest_scores_not_built error=%s", exc)
    finally:
        cur.close()


def create_app(store: Store, *, auth: bool = True, clock: Callable[[], float] = time.time,
               simulated: bool | None = None, drains: Any = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               ingest: Callable[[], Iterable[Family]] | None = None,
               freshness_s: float = 1.0, keep_fresh: bool = False,
               background_nice: int = priority.BACKGROUND_NICE) -> FastAPI:
    """The API over ``store``.

    ``drains``: the service's ``DrainController``, for ``POST /v1/drains/{node}/clear``
    (the database has one writer: while ``serve`` runs, operators clear drains here).

    ``ingest``: the running ingest worker's metric families (``serve``: the service's
    ``worker.families()``), added to ``GET /metrics``.

    ``auth``: require bearer tokens (see ``fleetcare.api.auth``) or a dashboard session;
    ``auth=False`` is for loopback-only use (``fleetcare serve --no-auth``, the demo,
    tests). ``clock`` gives "now" in Unix seconds (the age of the newest score);
    ``simulated`` forces the SIMULATED flag, else it is read per request from
    ``meta.data_source``. ``max_body_bytes``: larger request bodies get 413
    (``request_bounds.BodyLimit``). ``freshness_s``: how long what changes rarely is
    served from memory before it is checked again (the latest scores' and labels' version,
    the tables, the SIMULATED flag, each GPU's newest sample): writes made outside this
    process show within it; 0 checks on every request (tests that write, then read).
    ``keep_fresh``: the held samples are refreshed by a thread of their own rather than by
    the request that finds them a ``freshness_s`` old (the service: ``fleetcare serve``,
    the demo; it ends when ``store`` closes), ``background_nice`` below the API's threads
    in CPU priority (``priority``).
    """
    version = _version()
    app = FastAPI(
        title="fleetcare",
        summary="Drain a GPU node before it crashes a training job.",
        description=DESCRIPTION,
        version=version,
        docs_url=None,  # served by routers.docs from the vendored Swagger UI: no CDN
        redoc_url=None,  # ReDoc loads its script from a CDN; clusters are offline
        dependencies=[Depends(_known_query_parameters)],
    )
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.state.store = store
    app.state.auth = auth
    app.state.token_cache = _auth.TokenCache()
    app.state.query_names = {}
    app.state.ctx = ctx = AppContext(store=store, version=version, clock=clock,
                                     simulated=simulated, drains=drains, ingest=ingest,
                                     latest=LatestScores(check_s=freshness_s),
                                     samples=LatestSamples(refresh_s=freshness_s))
    _ensure_api_tables(store, auth)
    _start_latest_scores(store, ctx.latest)
    if store.raw.kind == "table":
        cur = store.cursor()
        try:
            ctx.samples.warm(cur)
        finally:
            cur.close()
        if keep_fresh and freshness_s > 0:
            ctx.samples.keep(store.cursor, background_nice)
    docs.mount(app)

    @app.exception_handler(duckdb.Error)
    def _db_error(request: Request, exc: duckdb.Error) -> JSONResponse:
        log.exception("api.db_error path=%s", request.url.path, exc_info=exc)
        return JSONResponse(status_code=503, content={
            "detail": f"the fleetcare database could not answer ({type(exc).__name__}: "
                      f"{exc}); check the service log and GET /healthz"})

    @app.exception_handler(RequestValidationError)
    async def _unprocessable(request: Request, exc: RequestValidationError) -> Response:
        denied = await _auth_error(request)  # auth first: no 422 echoes an anonymous query
        if denied is not None:
            return denied
        return JSONResponse(status_code=422, content=_validation_body(exc))

    app.add_exception_handler(web.SignInRequired, web.sign_in_handler)
    for router in (service.router, risk.router, nodes.router, operations.router,
                   tokens.router, web.router):
        app.include_router(router)
    return app
