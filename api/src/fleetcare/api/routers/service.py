"""``GET /healthz`` (liveness and freshness) and ``GET /metrics`` (Prometheus text); both
open, for probes and scrapers."""

from __future__ import annotations

from typing import Any

import duckdb
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from fleetcare.api import metrics, queries
from fleetcare.api.routers.deps import Ctx, Cur
from fleetcare.api.schemas import Health
from fleetcare.collectors.agent_metrics import exposition

router = APIRouter(tags=["service"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(cur: Cur, ctx: Ctx) -> Any:
    """Liveness and freshness: the newest telemetry sample and node score (no token)."""
    try:
        tables = queries.existing_tables(cur)
        tel = queries.latest_telemetry_ts(cur, tables, ctx.store.raw)
        score = queries.latest_score_ts(cur, tables)
    except duckdb.Error as exc:
        body = Health(status="error", db=f"{type(exc).__name__}: {exc}",
                      latest_telemetry=None, latest_score=None)
        return JSONResponse(status_code=503, content=body.model_dump())
    return Health(status="ok", db="ok", latest_telemetry=queries.iso_z(tel),
                  latest_score=queries.iso_z(score), score_age_s=ctx.age_s(score))


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}},
                             "description": "Prometheus text format 0.0.4."}})
def prometheus(cur: Cur, ctx: Ctx) -> Response:
    """Latest node risks, the drain controller's state, alerts and ingest freshness as
    Prometheus metrics (no token: scrapers)."""
    tables = queries.existing_tables(cur)
    nodes = queries.ranked_nodes(cur, tables)
    latest = queries.latest_score_ts(cur, tables)
    drains = queries.drain_stats(cur, tables, ctx.utcnow())
    if drains["last_action"] is not None:
        drains["last_action"] = queries.epoch_s(drains["last_action"])
    telemetry = queries.latest_telemetry_ts(cur, tables, ctx.store.raw)
    network = queries.network_risks(cur, tables, latest)  # families only with a head
    text = metrics.render(
        nodes, None if latest is None else queries.epoch_s(latest), drains,
        latest_telemetry_s=None if telemetry is None else queries.epoch_s(telemetry),
        alerts=queries.alert_stats(cur, tables),
        network=network if network[0] or network[1] is not None else None,
        alarm=queries.alarm_point(queries.newest_run_metrics(cur, tables, latest)),
        extra=exposition(ctx.ingest()) if ctx.ingest is not None else "")
    return Response(text, media_type=metrics.CONTENT_TYPE)
