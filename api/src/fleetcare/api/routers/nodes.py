"""One node or GPU: ``GET /v1/nodes/{node}`` (score, reasons, labels, GPUs), ``GET
/v1/nodes/{node}/history`` (the hourly signal series the node page charts), ``PUT
/v1/nodes/{node}/labels`` (admin) and ``GET /v1/gpus/{uuid}``."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query

from fleetcare.api import history, queries
from fleetcare.api.routers.deps import (
    ADMIN,
    AUTH_ERRORS,
    BODY_ERRORS,
    NODE_PATH,
    READ,
    Ctx,
    Cur,
    invalid,
)
from fleetcare.api.schemas import (
    ErrorDetail,
    GpuInfo,
    NodeDetail,
    NodeHistory,
    NodeLabels,
    NodeLabelsOut,
)

router = APIRouter()
_NAMES = "|".join(s.name for s in history.SIGNALS)
_UNKNOWN_NODE = "node {node!r} is not known to fleetcare: check the name in GET /v1/risk"


@router.get("/v1/nodes/{node}", response_model=NodeDetail, tags=["risk"], dependencies=READ,
            responses={404: {"model": ErrorDetail, "description": "Unknown node."},
                       **AUTH_ERRORS})
def node_detail(node: str, cur: Cur, ctx: Ctx) -> Any:
    """One node: its risk, reasons and labels, and each GPU's score and latest
    telemetry (a scored node: the GPUs of its latest scoring runs and recent telemetry,
    bounded reads; one that stopped reporting: its last scores)."""
    tables = ctx.tables(cur)
    latest: dict[str, Any] | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    samples = None
    if "node_scores" in tables:
        snap = ctx.latest.current(cur)
        latest, gpus = snap.by_node.get(node), snap.gpus.get(node, ())
        if latest is not None:
            samples = ctx.samples.for_node(cur, node, queries.telemetry_since(latest),
                                           ctx.store.raw.kind)
    labels = ctx.latest.labels(cur, tables).get(node, {}) if "node_labels" in tables else None
    detail = queries.node_detail(cur, tables, node, ctx.store.raw, latest=latest,
                                 latest_gpus=gpus, labels=labels, samples=samples)
    if detail is None:
        raise HTTPException(status_code=404, detail=_UNKNOWN_NODE.format(node=node))
    nics = queries.node_nics(cur, tables, node) if ctx.has_nics(cur, tables) else []
    return {**detail, "nics": nics, "simulated": ctx.is_simulated(cur, tables)}


@router.get("/v1/nodes/{node}/history", response_model=NodeHistory, tags=["risk"],
            dependencies=READ,
            responses={404: {"model": ErrorDetail,
                             "description": "The node has no hourly history."},
                       **AUTH_ERRORS})
def node_history(
    node: Annotated[str, Path(min_length=1, max_length=256, pattern=NODE_PATH)],
    cur: Cur,
    ctx: Ctx,
    signals: Annotated[str | None, Query(
        min_length=1, max_length=512, pattern=f"^({_NAMES})(,({_NAMES}))*$",
        description="Comma-separated signal names (default: all): "
        + ", ".join(s.name for s in history.SIGNALS) + ".")] = None,
    since: Annotated[dt.datetime | None, Query(
        description=f"Start (ISO-8601); default {history.DEFAULT_DAYS} days before the "
        f"node's newest hour; at most {history.MAX_DAYS} days before it.")] = None,
    gpu: Annotated[str | None, Query(
        min_length=1, max_length=256, description="One GPU: its UUID or index "
        "(default: every GPU of the node).")] = None,
) -> Any:
    """The hourly history of the node's signals, per GPU, with the fleet median of each
    signal for the GPU's model (the series the node page charts). From the hourly
    rollups; an hour without samples has no point."""
    try:
        since_utc = None if since is None else (
            since.astimezone(dt.UTC).replace(tzinfo=None) if since.tzinfo else since)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00: before year 1 in UTC
        raise invalid(["query", "since"], "since is out of range: give a time after year 1",
                      str(since)) from None
    try:
        wanted = history.parse_signals(signals)
        tables = queries.existing_tables(cur)
        out = history.node_history(cur, tables, node, wanted, since=since_utc, gpu=gpu)
    except history.HistoryError as exc:
        raise invalid(["query", exc.field], str(exc), exc.value) from None
    if out is None:
        raise HTTPException(status_code=404, detail=(
            f"node {node!r} has no hourly history: check the name in GET /v1/risk (rollups "
            "are built from telemetry as it arrives)"))
    return {**out, "simulated": ctx.is_simulated(cur, tables)}


@router.put("/v1/nodes/{node}/labels", response_model=NodeLabelsOut, tags=["config"],
            dependencies=ADMIN, responses=BODY_ERRORS)
def put_labels(
    node: Annotated[str, Path(min_length=1, max_length=256, pattern=NODE_PATH)],
    body: Annotated[NodeLabels, Body()],
    cur: Cur,
    ctx: Ctx,
) -> Any:
    """Replace a node's labels (admin). A node may be labelled before it reports."""
    return {"node": node, "labels": queries.set_labels(cur, node, body.labels, ctx.utcnow())}


@router.get("/v1/gpus/{gpu_uuid}", response_model=GpuInfo, tags=["risk"], dependencies=READ,
            responses={404: {"model": ErrorDetail, "description": "Unknown GPU."},
                       **AUTH_ERRORS})
def gpu(gpu_uuid: str, cur: Cur, ctx: Ctx) -> Any:
    """One GPU by UUID: its risk and reasons, its node, and its latest telemetry."""
    tables = queries.existing_tables(cur)
    detail = queries.gpu_detail(cur, tables, gpu_uuid, ctx.store.raw)
    if detail is None:
        raise HTTPException(
            status_code=404,
            detail=f"GPU {gpu_uuid!r} is not known to fleetcare: GPU UUIDs are listed "
            "per node in GET /v1/nodes/{node}")
    return {**detail, "simulated": ctx.is_simulated(cur, tables)}
