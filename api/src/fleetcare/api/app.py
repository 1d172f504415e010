"""The fleetcare REST API, dashboard and Prometheus metrics (FastAPI).

The service is one process: ingest, scorer and API threads share one DuckDB database,
so the app only *reads*, each request through its own ``store.cursor()`` (FastAPI runs
sync endpoints on worker threads).

The one exception: the API is the process that holds the database, so the few writes
that come from outside (incident reports, node labels) go through it.

Routes (scope needed; see ``fleetcare.api.auth``)::

    GET /                      read   dashboard (HTML, self-contained, auto-refresh)
    GET /healthz               open   liveness + freshness of telemetry and scores
    GET /metrics               open   Prometheus text (node risk, drains, alerts, ingest)
    GET /docs, /openapi.json   open   OpenAPI UI (served from the package: no CDN) and spec;
                                      no /redoc (ReDoc would load a script from a CDN)
    GET /v1/risk               read   latest score per node, highest risk first; filters
                                      (label, partition, gpu_model, min_risk) and paging
    GET /v1/nodes/{n}          read   one node: score, reasons, labels, per-GPU detail
    GET /v1/gpus/{uuid}        read   one GPU: score, reasons, latest telemetry
    GET /v1/drain-candidates   read   nodes whose expected goodput saved > drain cost
    GET /v1/drains             read   the drains fleetcare holds
    POST /v1/drains/{n}/clear  admin  an operator cleared a drained node (resume it)
    GET/POST /v1/tokens        admin  list / create API tokens (the value is shown once)
    POST /v1/tokens/{id}/revoke admin revoke a token (at once on this server)
    GET /v1/alerts             read   the alerts engine's alerts, newest first
    GET /v1/model              read   the current model (registry row)
    POST /v1/incidents         write  report a failure or repair (labels for the next model)
    PUT /v1/nodes/{n}/labels   admin  set a node's labels (partition, rack, ...)

Errors: 401 (no or unknown token, with ``WWW-Authenticate: Bearer``), 403 (naming the
scope needed), 404, 413 (a body over ``max_body_bytes``, default 1 MiB), 422 (``message``
plus ``detail[].loc`` naming each bad field, also a query parameter the endpoint does not
take, and NaN/Infinity in a JSON body; the input is echoed as a short excerpt only), 503
(the database could not answer). Every error body has a human-readable message.

Authentication comes before parameter validation: a request without a valid token gets
401 (403 for a weak scope) whatever its parameters, never a 422 that echoes them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Annotated, Any

import duckdb
import msgspec
from fastapi import Body, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import Field

from fleetcare.api import auth as _auth
from fleetcare.api import dashboard, metrics, queries
from fleetcare.api.request_bounds import DEFAULT_MAX_BODY_BYTES, BodyLimit, excerpt
from fleetcare.api.schemas import (
    AlertList,
    DrainCandidates,
    DrainClearIn,
    DrainClearOut,
    ErrorDetail,
    GpuInfo,
    Health,
    HeldDrains,
    IncidentIn,
    IncidentOut,
    ModelInfo,
    NodeDetail,
    NodeLabels,
    NodeLabelsOut,
    RiskList,
    TokenCreated,
    TokenIn,
    TokenList,
    TokenOut,
)
from fleetcare.api.server import bound_port, serve, start_server_thread
from fleetcare.collectors.agent_metrics import Family, exposition
from fleetcare.models import scoring
from fleetcare.models.goodput import CostModel, GoodputError
from fleetcare.pipeline.store import Store

__all__ = ["create_app", "serve", "start_server_thread", "bound_port"]

log = logging.getLogger(__name__)

DESCRIPTION = """\
Predictive maintenance for GPU fleets: which nodes to drain **before** they crash a
training job, with reasons a human can check.

Risks are calibrated probabilities of a failure incident within the model's horizon
(see `GET /v1/model`). Timestamps are ISO-8601 UTC ending in `Z`. Numbers are never
NaN: a value the scorer could not compute is `null`.
"""


def _cursor(request: Request) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB cursor of its own for each request (requests run on worker threads)."""
    cur = request.app.state.store.cursor()
    try:
        yield cur
    finally:
        cur.close()


Cur = Annotated[duckdb.DuckDBPyConnection, Depends(_cursor)]
READ = [Depends(_auth.require("read"))]
WRITE = [Depends(_auth.require("write"))]
ADMIN = [Depends(_auth.require("admin"))]
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "No bearer token, or not a valid one."},
    403: {"model": ErrorDetail, "description": "The token's scope is too weak."},
}
_BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    **_AUTH_ERRORS,
    400: {"model": ErrorDetail, "description": "The body could not be read as JSON."},
}
_DEFAULT_COST = CostModel()


def _invalid(loc: list[str | int], msg: str, value: Any = None) -> RequestValidationError:
    """A 422 in FastAPI's own shape, for checks made in the endpoint."""
    return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error",
                                    "input": value}])


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


def _known_query_parameters(request: Request) -> None:
    """422 for a query parameter the endpoint does not take: ``?limt=5`` silently meaning
    "no limit" is worse than an error naming the parameters it does take. The names come
    from the app's own OpenAPI spec, the contract (routes outside it are not checked)."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    path = getattr(route, "path_format", None)
    op = (request.app.openapi().get("paths", {}).get(path, {})
          .get(request.method.lower()) if path else None)
    if op is None:
        return
    known = {p["name"] for p in op.get("parameters", []) if p.get("in") == "query"}
    unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in known]
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise _invalid(["query", unknown[0]], f"unknown query parameter {unknown[0]!r}; "
                       f"{request.method} {path} takes: {takes}",
                       request.query_params.get(unknown[0]))


def _labels(label: list[str], partition: str | None) -> list[tuple[str, str]]:
    pairs = []
    for i, raw in enumerate(label):
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise _invalid(["query", "label", i], f"label {raw!r} is not KEY=VALUE "
                           "(e.g. label=rack=r12)", raw)
        pairs.append((key, value))
    if partition is not None:
        pairs.append(("partition", partition))
    return pairs


class NodeFilter:
    """The node filters shared by /v1/risk and /v1/drain-candidates."""

    def __init__(
        self,
        label: Annotated[list[Annotated[str, Field(  # pattern checked by _labels: its message
            max_length=512, json_schema_extra={"pattern": "^[^=]+="})]], Query(
            max_length=16, description="KEY=VALUE the node's labels must contain "
            "(repeat for several, all must match), e.g. label=rack=r12.")] = [],  # noqa: B006
        partition: Annotated[str | None, Query(
            min_length=1, max_length=256,
            description="Shorthand for label=partition=VALUE.")] = None,
        gpu_model: Annotated[str | None, Query(
            min_length=1, max_length=256, description="Nodes with a GPU of this model: "
            "case-insensitive substring, e.g. H100.")] = None,
        min_risk: Annotated[float | None, Query(
            ge=0.0, le=1.0, description="Only nodes with risk >= this.")] = None,
    ) -> None:
        self.labels = _labels(label, partition)
        self.gpu_model = gpu_model
        self.min_risk = min_risk


def _route_scope(route: Any) -> str | None:
    """The token scope a route requires (from its ``auth.require`` dependencies), if any."""
    stack = list(getattr(getattr(route, "dependant", None), "dependencies", []))
    while stack:
        dep = stack.pop()
        scope = getattr(dep.call, "scope", None)
        if isinstance(scope, str):
            return scope
        stack.extend(dep.dependencies)
    return None


async def _auth_error(request: Request) -> Response | None:
    """The 401/403 a request would get from its route's auth check, or None when it passes
    (or the route is open): what a validation error must not get ahead of."""
    from fastapi.exception_handlers import http_exception_handler

    scope = _route_scope(request.scope.get("route"))
    if scope is None or not request.app.state.auth:
        return None
    try:
        _auth.require(scope)(request, await _auth.BEARER(request))
    except HTTPException as exc:
        return await http_exception_handler(request, exc)
    return None


def _version() -> str:
    try:
        return metadata.version("fleetcare-api")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _offline_docs(app: FastAPI) -> None:
    """``/docs`` with Swagger UI's files from the swagger-ui-bundle package, not a CDN
    (fleet management networks are often offline)."""
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount("/static/swagger-ui", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path),
              name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url="/static/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger-ui/swagger-ui.css",
            swagger_favicon_url="/static/swagger-ui/favicon-32x32.png")


def _ensure_api_tables(store: Store, auth: bool) -> None:
    """The API's own tables (tokens, node labels), and an empty ``alerts`` table for
    ``GET /v1/alerts`` until the alerts engine creates its own."""
    cur = store.cursor()
    try:
        cur.execute(_auth.DDL)
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


def create_app(store: Store, *, auth: bool = True, clock: Callable[[], float] = time.time,
               simulated: bool | None = None, drains: Any = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               ingest: Callable[[], Iterable[Family]] | None = None) -> FastAPI:
    """The API over ``store``.

    ``drains``: the service's ``DrainController``, for ``POST /v1/drains/{node}/clear``
    (the database has one writer: while ``serve`` runs, operators clear drains here).

    ``ingest``: the running ingest worker's metric families (``serve``: the service's
    ``worker.families()``), added to ``GET /metrics``.

    ``auth``: require bearer tokens (see ``fleetcare.api.auth``); ``auth=False`` is for
    loopback-only use (``fleetcare serve --no-auth``, the demo, tests). ``clock`` gives
    "now" in Unix seconds (the age of the newest score); ``simulated`` forces the
    SIMULATED flag, else it is read per request from ``meta.data_source``.
    ``max_body_bytes``: larger request bodies get 413 (``request_bounds.BodyLimit``).
    """
    version = _version()
    app = FastAPI(
        title="fleetcare",
        summary="Drain a GPU node before it crashes a training job.",
        description=DESCRIPTION,
        version=version,
        docs_url=None,  # served below from the packaged Swagger UI: no CDN, works offline
        redoc_url=None,  # ReDoc loads its script from a CDN; clusters are offline
        dependencies=[Depends(_known_query_parameters)],
    )
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.state.store = store
    app.state.auth = auth
    app.state.token_cache = _auth.TokenCache()
    _ensure_api_tables(store, auth)
    _offline_docs(app)

    def is_simulated(cur: duckdb.DuckDBPyConnection, tables: set[str]) -> bool:
        return simulated if simulated is not None else queries.simulated(cur, tables)

    def age_s(ts: Any) -> float | None:
        return None if ts is None else round(clock() - queries.epoch_s(ts), 3)

    def utcnow() -> dt.datetime:
        return dt.datetime.fromtimestamp(clock(), dt.UTC).replace(tzinfo=None)

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

    @app.get("/healthz", response_model=Health, tags=["service"],
             responses={503: {"model": Health}})
    def healthz(cur: Cur) -> Any:
        """Liveness and freshness: the newest telemetry sample and node score (no token)."""
        try:
            tables = queries.existing_tables(cur)
            tel = queries.latest_telemetry_ts(cur, tables, store.raw)
            score = queries.latest_score_ts(cur, tables)
        except duckdb.Error as exc:
            body = Health(status="error", db=f"{type(exc).__name__}: {exc}",
                          latest_telemetry=None, latest_score=None)
            return JSONResponse(status_code=503, content=body.model_dump())
        return Health(status="ok", db="ok", latest_telemetry=queries.iso_z(tel),
                      latest_score=queries.iso_z(score), score_age_s=age_s(score))

    @app.get("/v1/risk", response_model=RiskList, tags=["risk"], dependencies=READ,
             responses=_AUTH_ERRORS)
    def risk(
        request: Request,
        cur: Cur,
        filters: Annotated[NodeFilter, Depends()],
        limit: Annotated[int, Query(ge=1, le=10000,
                                    description="Most nodes to return.")] = 100,
        offset: Annotated[int, Query(ge=0, le=10_000_000,
                                     description="Nodes to skip (paging: follow `next`).")] = 0,
    ) -> Any:
        """The latest score of every node, highest risk first: the nodes to drain.

        Filter by node labels (`label=KEY=VALUE`, `partition=`), GPU model and minimum
        risk; page with `limit` and `offset` (the response's `next` is the next page)."""
        tables = queries.existing_tables(cur)
        nodes, total = queries.risk_page(
            cur, tables, limit=limit, offset=offset, min_risk=filters.min_risk,
            labels=filters.labels, gpu_model=filters.gpu_model)
        nxt = None
        if offset + len(nodes) < total:
            url = request.url.include_query_params(offset=offset + limit, limit=limit)
            nxt = f"{url.path}?{url.query}"
        return {
            "nodes": nodes,
            "simulated": is_simulated(cur, tables),
            "scored_at": queries.iso_z(queries.latest_score_ts(cur, tables)),
            "total": total,
            "next": nxt,
        }

    @app.get("/v1/nodes/{node}", response_model=NodeDetail, tags=["risk"], dependencies=READ,
             responses={404: {"model": ErrorDetail, "description": "Unknown node."},
                        **_AUTH_ERRORS})
    def node_detail(node: str, cur: Cur) -> Any:
        """One node: its risk, reasons and labels, and each GPU's score and latest
        telemetry."""
        tables = queries.existing_tables(cur)
        detail = queries.node_detail(cur, tables, node, store.raw)
        if detail is None:
            raise HTTPException(
                status_code=404,
                detail=f"node {node!r} is not known to fleetcare: check the name in "
                "GET /v1/risk",
            )
        return {**detail, "simulated": is_simulated(cur, tables)}

    @app.put("/v1/nodes/{node}/labels", response_model=NodeLabelsOut, tags=["config"],
             dependencies=ADMIN, responses=_BODY_ERRORS)
    def put_labels(
        node: Annotated[str, Path(min_length=1, max_length=256,
                                  pattern=r"^[^\x00-\x1f\x7f]+$")],
        body: Annotated[NodeLabels, Body()],
        cur: Cur,
    ) -> Any:
        """Replace a node's labels (admin). A node may be labelled before it reports."""
        return {"node": node, "labels": queries.set_labels(cur, node, body.labels, utcnow())}

    @app.get("/v1/gpus/{gpu_uuid}", response_model=GpuInfo, tags=["risk"], dependencies=READ,
             responses={404: {"model": ErrorDetail, "description": "Unknown GPU."},
                        **_AUTH_ERRORS})
    def gpu(gpu_uuid: str, cur: Cur) -> Any:
        """One GPU by UUID: its risk and reasons, its node, and its latest telemetry."""
        tables = queries.existing_tables(cur)
        detail = queries.gpu_detail(cur, tables, gpu_uuid, store.raw)
        if detail is None:
            raise HTTPException(
                status_code=404,
                detail=f"GPU {gpu_uuid!r} is not known to fleetcare: GPU UUIDs are listed "
                "per node in GET /v1/nodes/{node}")
        return {**detail, "simulated": is_simulated(cur, tables)}

    @app.get("/v1/drain-candidates", response_model=DrainCandidates, tags=["risk"],
             dependencies=READ, responses=_AUTH_ERRORS)
    def drain_candidates(
        cur: Cur,
        filters: Annotated[NodeFilter, Depends()],
        job_gpus: Annotated[int, Query(
            ge=1, le=10_000_000, description="N: GPUs of the job a node serves.")
        ] = _DEFAULT_COST.job_gpus,
        checkpoint_interval_h: Annotated[float, Query(
            gt=0, le=10_000, description="Δ: hours between checkpoints.")
        ] = _DEFAULT_COST.checkpoint_interval_h,
        restart_overhead_h: Annotated[float, Query(
            ge=0, le=10_000, description="u0: hours to restart the job after a crash.")
        ] = _DEFAULT_COST.restart_overhead_h,
        drain_cost_gpu_h: Annotated[float, Query(
            ge=0, le=1e9, description="GPU-hours a planned drain costs (checkpoint + "
            "inspection/repair).")] = _DEFAULT_COST.drain_cost_gpu_h,
        gpus_per_node: Annotated[int, Query(ge=1, le=1024)] = _DEFAULT_COST.gpus_per_node,
        limit: Annotated[int, Query(ge=1, le=10000)] = 100,
    ) -> Any:
        """Nodes worth draining now: expected goodput saved (risk × crash cost, N·(Δ/2 +
        u0) GPU-hours) exceeds the drain cost. Highest net saving first."""
        try:
            cost = CostModel(job_gpus=job_gpus, checkpoint_interval_h=checkpoint_interval_h,
                             restart_overhead_h=restart_overhead_h,
                             drain_cost_gpu_h=drain_cost_gpu_h, gpus_per_node=gpus_per_node)
        except GoodputError as exc:
            raise _invalid(["query", exc.name], str(exc), exc.value) from None
        tables = queries.existing_tables(cur)
        floor = max(cost.break_even_risk(), filters.min_risk or 0.0)
        nodes, _ = queries.risk_page(cur, tables, min_risk=floor, labels=filters.labels,
                                     gpu_model=filters.gpu_model)
        out = []
        for n in nodes:
            if n["risk"] is None or not cost.should_drain(n["risk"]):
                continue
            saving = cost.expected_saving_gpu_h(n["risk"])
            out.append({**{k: n[k] for k in ("node", "risk", "reasons", "top_gpu_uuid",
                                            "scored_at", "labels")},
                        "expected_saving_gpu_h": saving,
                        "drain_cost_gpu_h": cost.drain_cost_gpu_h,
                        "net_saving_gpu_h": saving - cost.drain_cost_gpu_h})
            if len(out) == limit:
                break
        return {
            "candidates": out,
            "cost_model": {**dataclasses.asdict(cost),
                           "crash_cost_gpu_h": cost.crash_cost_gpu_h(),
                           "break_even_risk": cost.break_even_risk()},
            "simulated": is_simulated(cur, tables),
            "scored_at": queries.iso_z(queries.latest_score_ts(cur, tables)),
        }

    @app.post("/v1/incidents", response_model=IncidentOut, status_code=201,
              tags=["incidents"], dependencies=WRITE,
              responses={200: {"model": IncidentOut,
                               "description": "Already recorded (same natural key)."},
                         **_BODY_ERRORS})
    def report_incident(body: IncidentIn, response: Response) -> Any:
        """Report a failure or a repair (write). Stored as the data contract's Incident:
        the ground truth the next model learns from. Reporting twice is safe."""
        from fleetcare.pipeline.incidents import IncidentError, validate

        try:
            inc = validate(ts=body.ts, node=body.node, kind=body.kind, cause=body.cause,
                           source=body.source, gpu_uuid=body.gpu_uuid, mode=body.mode,
                           note=body.note, now=clock())  # ingest's time bounds
        except IncidentError as exc:
            raise _invalid(["body", exc.field], str(exc), exc.value) from None
        if body.xid is not None:
            inc = msgspec.structs.replace(inc, xid=body.xid)
        created = store.insert_incidents([inc]) == 1
        if not created:
            response.status_code = 200
        log.info("api.incident node=%s kind=%s cause=%s created=%s", inc.node, inc.kind,
                 inc.cause, created)
        return {**msgspec.structs.asdict(inc), "ts": queries.iso_z(inc.ts),
                "created": created}

    @app.get("/v1/tokens", response_model=TokenList, tags=["tokens"], dependencies=ADMIN,
             responses=_AUTH_ERRORS)
    def list_tokens(cur: Cur) -> Any:
        """Every API token, oldest first (admin); their values are never shown."""
        return {"tokens": [t.as_json() for t in _auth.list_tokens(cur)]}

    @app.post("/v1/tokens", response_model=TokenCreated, status_code=201, tags=["tokens"],
              dependencies=ADMIN, responses=_BODY_ERRORS)
    def create_token(body: TokenIn, cur: Cur) -> Any:
        """A new token (admin), returned this once: only its SHA-256 is stored. The same
        as ``fleetcare tokens create``, for while ``serve`` holds the database."""
        token, info = _auth.create_token(cur, body.scope, name=body.name)
        log.info("api.token_created id=%s scope=%s name=%s", info.id, info.scope, info.name)
        return {**info.as_json(), "token": token}

    @app.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut, tags=["tokens"],
              dependencies=ADMIN,
              responses={404: {"model": ErrorDetail, "description": "No such token."},
                         **_AUTH_ERRORS})
    def revoke_token(token_id: Annotated[str, Path(min_length=1, max_length=64)],
                     cur: Cur) -> Any:
        """Revoke a token (admin); it stops working at once on this server."""
        try:
            info = _auth.revoke_token(cur, token_id)
        except _auth.TokenError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        app.state.token_cache.clear()
        log.info("api.token_revoked id=%s scope=%s", info.id, info.scope)
        return info.as_json()

    @app.get("/v1/drains", response_model=HeldDrains, tags=["drains"], dependencies=READ,
             responses=_AUTH_ERRORS)
    def held_drains(cur: Cur) -> Any:
        """The drains fleetcare holds (made and not given back yet), by node."""
        return {"drains": queries.held_drains(cur, queries.existing_tables(cur))}

    @app.post("/v1/drains/{node}/clear", response_model=DrainClearOut, tags=["drains"],
              responses={404: {"model": ErrorDetail, "description": "Not drained by fleetcare."},
                         409: {"model": ErrorDetail,
                               "description": "This server runs no drain controller."},
                         **_BODY_ERRORS})
    def clear_drain(
        node: Annotated[str, Path(min_length=1, max_length=256,
                                  pattern=r"^[^\x00-\x1f\x7f]+$")],
        token: Annotated[_auth.TokenInfo | None, Depends(_auth.require("admin"))],
        body: Annotated[DrainClearIn, Body()] = DrainClearIn(note="", force=False),  # noqa: B008
    ) -> Any:
        """An operator clears a node fleetcare drained (admin): it is resumed now if its
        risk is below the resume threshold (or with ``force``), else once it is. The same
        as ``fleetcare drain clear``, for while ``serve`` holds the database."""
        from fleetcare.api.drains.controller import ControllerError

        if drains is None:
            raise HTTPException(status_code=409, detail=(
                "this server runs no drain controller: start it with `fleetcare serve "
                "--drain-scheduler slurm|kubernetes`, or stop it and use `fleetcare drain "
                "clear` on the database"))
        who = "api" if token is None else f"api:{token.name or token.id}"
        try:
            decisions = drains.clear(node, actor=who, note=body.note, force=body.force)
        except ControllerError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        return {"dry_run": drains.dry_run, "decisions": [d.to_json() for d in decisions]}

    @app.get("/v1/alerts", response_model=AlertList, tags=["alerts"], dependencies=READ,
             responses=_AUTH_ERRORS)
    def alerts(
        cur: Cur,
        state: Annotated[str | None, Query(min_length=1, max_length=64,
                                           description="e.g. firing, resolved")] = None,
        node: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 100,
    ) -> Any:
        """Alerts raised by the alerts engine, newest first."""
        tables = queries.existing_tables(cur)
        return {"alerts": queries.alerts(cur, tables, state=state, node=node, limit=limit)}

    @app.get("/v1/model", response_model=ModelInfo, tags=["model"], dependencies=READ,
             responses={404: {"model": ErrorDetail, "description": "No model trained."},
                        **_AUTH_ERRORS})
    def model(cur: Cur) -> Any:
        """The model behind the current scores: horizon, features, held-out metrics."""
        row = queries.current_model(cur, queries.existing_tables(cur))
        if row is None:
            raise HTTPException(
                status_code=404,
                detail="no current model: train one with `fleetcare train` (the scorer "
                "then fills GET /v1/risk)",
            )
        return row

    @app.get("/metrics", response_class=Response, tags=["service"],
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus text format 0.0.4."}})
    def prometheus(cur: Cur) -> Response:
        """Latest node risks, the drain controller's state, alerts and ingest freshness as
        Prometheus metrics (no token: scrapers)."""
        tables = queries.existing_tables(cur)
        nodes = queries.ranked_nodes(cur, tables)
        latest = queries.latest_score_ts(cur, tables)
        drains = queries.drain_stats(cur, tables, utcnow())
        if drains["last_action"] is not None:
            drains["last_action"] = queries.epoch_s(drains["last_action"])
        telemetry = queries.latest_telemetry_ts(cur, tables, store.raw)
        text = metrics.render(
            nodes, None if latest is None else queries.epoch_s(latest), drains,
            latest_telemetry_s=None if telemetry is None else queries.epoch_s(telemetry),
            alerts=queries.alert_stats(cur, tables),
            extra=exposition(ingest()) if ingest is not None else "")
        return Response(text, media_type=metrics.CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, tags=["service"], dependencies=READ,
             responses={code: {"description": r["description"], "content": {
                 "application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}}}
                 for code, r in _AUTH_ERRORS.items()})
    def home(
        cur: Cur,
        limit: Annotated[int, Query(ge=1, le=10000, description="Rows shown.")] = 200,
    ) -> HTMLResponse:
        """The dashboard: the fleet ranked by risk, with reasons (read scope: it shows
        what GET /v1/risk shows)."""
        tables = queries.existing_tables(cur)
        latest = queries.latest_score_ts(cur, tables)
        page = dashboard.render(
            queries.ranked_nodes(cur, tables, limit=limit),
            simulated=is_simulated(cur, tables),
            scored_at=queries.iso_z(latest),
            score_age_s=age_s(latest),
            total_nodes=queries.scored_node_count(cur, tables),
            version=version,
            model=queries.current_model(cur, tables),
        )
        return HTMLResponse(page)

    return app
