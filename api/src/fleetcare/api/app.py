"""The fleetcare REST API, dashboard and Prometheus metrics (FastAPI).

The service is one process: ingest, scorer and API threads share one DuckDB database,
so the app only *reads*, each request through its own ``store.cursor()`` (FastAPI runs
sync endpoints on worker threads).

Routes::

    GET /              dashboard (HTML, self-contained, auto-refresh)
    GET /healthz       liveness + freshness of telemetry and scores
    GET /v1/risk       latest score per node, highest risk first
    GET /v1/nodes/{n}  one node: score, reasons, per-GPU scores and latest telemetry
    GET /v1/model      the current model (registry row)
    GET /metrics       Prometheus text
    GET /docs          OpenAPI UI (generated from the response models)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Annotated, Any

import duckdb
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from fleetcare.api import dashboard, metrics, queries
from fleetcare.api.schemas import ErrorDetail, Health, ModelInfo, NodeDetail, RiskList
from fleetcare.api.server import bound_port, serve, start_server_thread
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


def create_app(store: Store, *, clock: Callable[[], float] = time.time,
               simulated: bool | None = None) -> FastAPI:
    """The API over ``store`` (read-only use).

    ``clock`` gives "now" in Unix seconds (the age of the newest score); ``simulated``
    forces the SIMULATED flag, else it is read per request from ``meta.data_source``.
    """
    version = _version()
    app = FastAPI(
        title="fleetcare",
        summary="Drain a GPU node before it crashes a training job.",
        description=DESCRIPTION,
        version=version,
        docs_url=None,  # served below from the packaged Swagger UI: no CDN, works offline
    )
    app.state.store = store
    _offline_docs(app)

    def is_simulated(cur: duckdb.DuckDBPyConnection, tables: set[str]) -> bool:
        return simulated if simulated is not None else queries.simulated(cur, tables)

    def age_s(ts: Any) -> float | None:
        return None if ts is None else round(clock() - queries.epoch_s(ts), 3)

    @app.exception_handler(duckdb.Error)
    def _db_error(request: Request, exc: duckdb.Error) -> JSONResponse:
        log.exception("api.db_error path=%s", request.url.path, exc_info=exc)
        return JSONResponse(status_code=503, content={
            "detail": f"the fleetcare database could not answer ({type(exc).__name__}: "
                      f"{exc}); check the service log and GET /healthz"})

    @app.get("/healthz", response_model=Health, tags=["service"],
             responses={503: {"model": Health}})
    def healthz(cur: Cur) -> Any:
        """Liveness and freshness: the newest telemetry sample and node score."""
        try:
            tables = queries.existing_tables(cur)
            tel = queries.latest_telemetry_ts(cur, tables)
            score = queries.latest_score_ts(cur, tables)
        except duckdb.Error as exc:
            body = Health(status="error", db=f"{type(exc).__name__}: {exc}",
                          latest_telemetry=None, latest_score=None)
            return JSONResponse(status_code=503, content=body.model_dump())
        return Health(status="ok", db="ok", latest_telemetry=queries.iso_z(tel),
                      latest_score=queries.iso_z(score), score_age_s=age_s(score))

    @app.get("/v1/risk", response_model=RiskList, tags=["risk"])
    def risk(
        cur: Cur,
        limit: Annotated[int, Query(ge=1, le=10000,
                                    description="Most nodes to return.")] = 100,
        min_risk: Annotated[float | None, Query(
            ge=0.0, le=1.0, description="Only nodes with risk >= this.")] = None,
    ) -> Any:
        """The latest score of every node, highest risk first: the nodes to drain."""
        tables = queries.existing_tables(cur)
        nodes = queries.ranked_nodes(cur, tables, limit=limit, min_risk=min_risk)
        return {
            "nodes": nodes,
            "simulated": is_simulated(cur, tables),
            "scored_at": queries.iso_z(queries.latest_score_ts(cur, tables)),
        }

    @app.get("/v1/nodes/{node}", response_model=NodeDetail, tags=["risk"],
             responses={404: {"model": ErrorDetail, "description": "Unknown node."}})
    def node_detail(node: str, cur: Cur) -> Any:
        """One node: its risk and reasons, and each GPU's score and latest telemetry."""
        tables = queries.existing_tables(cur)
        detail = queries.node_detail(cur, tables, node)
        if detail is None:
            raise HTTPException(
                status_code=404,
                detail=f"node {node!r} is not known to fleetcare: check the name in "
                "GET /v1/risk",
            )
        return {**detail, "simulated": is_simulated(cur, tables)}

    @app.get("/v1/model", response_model=ModelInfo, tags=["model"],
             responses={404: {"model": ErrorDetail, "description": "No model trained."}})
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
        """Latest node risks as Prometheus gauges."""
        tables = queries.existing_tables(cur)
        nodes = queries.ranked_nodes(cur, tables)
        latest = queries.latest_score_ts(cur, tables)
        text = metrics.render(nodes, None if latest is None else queries.epoch_s(latest))
        return Response(text, media_type=metrics.CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, tags=["service"])
    def home(
        cur: Cur,
        limit: Annotated[int, Query(ge=1, le=10000, description="Rows shown.")] = 200,
    ) -> HTMLResponse:
        """The dashboard: the fleet ranked by risk, with reasons."""
        tables = queries.existing_tables(cur)
        latest = queries.latest_score_ts(cur, tables)
        page = dashboard.render(
            queries.ranked_nodes(cur, tables, limit=limit),
            simulated=is_simulated(cur, tables),
            scored_at=queries.iso_z(latest),
            score_age_s=age_s(latest),
            total_nodes=queries.scored_node_count(cur, tables),
            version=version,
        )
        return HTMLResponse(page)

    return app
