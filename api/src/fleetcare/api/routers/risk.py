"""``GET /v1/risk`` (the fleet ranked), ``GET /v1/drain-candidates`` (worth draining now),
``GET /v1/repeat-offenders`` (nodes that failed twice in 30 days) and ``GET /v1/model``
(the model behind the scores)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from fleetcare.api import queries
from fleetcare.api.routers.deps import AUTH_ERRORS, READ, Ctx, Cur, NodeFilter, invalid
from fleetcare.api.schemas import (
    DrainCandidates,
    ErrorDetail,
    ModelInfo,
    RepeatOffenders,
    RiskList,
)
from fleetcare.models import offenders
from fleetcare.models.goodput import CostModel, GoodputError

router = APIRouter()
_DEFAULT_COST = CostModel()


@router.get("/v1/risk", response_model=RiskList, tags=["risk"], dependencies=READ,
            responses=AUTH_ERRORS)
def risk(
    request: Request,
    cur: Cur,
    ctx: Ctx,
    filters: Annotated[NodeFilter, Depends()],
    limit: Annotated[int, Query(ge=1, le=10000,
                                description="Most nodes to return.")] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000,
                                 description="Nodes to skip (paging: follow `next`).")] = 0,
) -> Any:
    """The latest score of every node, highest risk first: the nodes to drain.
    Served from memory, rebuilt after each scoring run.

    Filter by node labels (`label=KEY=VALUE`, `partition=`), GPU model and minimum
    risk; page with `limit` and `offset` (the response's `next` is the next page)."""
    tables = ctx.tables(cur)
    nodes, total, scored_at = ctx.latest.risk_page(
        cur, tables, limit=limit, offset=offset, min_risk=filters.min_risk,
        labels=filters.labels, gpu_model=filters.gpu_model)
    nxt = None
    if offset + len(nodes) < total:
        url = request.url.include_query_params(offset=offset + limit, limit=limit)
        nxt = f"{url.path}?{url.query}"
    return {
        "nodes": nodes,
        "simulated": ctx.is_simulated(cur, tables),
        "scored_at": queries.iso_z(scored_at),
        "total": total,
        "next": nxt,
    }


@router.get("/v1/drain-candidates", response_model=DrainCandidates, tags=["risk"],
            dependencies=READ, responses=AUTH_ERRORS)
def drain_candidates(
    cur: Cur,
    ctx: Ctx,
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
    u0) GPU-hours) exceeds the drain cost. Highest net saving first. A repeat offender
    (2 failures in 30 days) says so, with a suggestion (burn-in or RMA); one repaired in
    the last 14 days is decided on the higher of its risk and its post-repair risk."""
    try:
        cost = CostModel(job_gpus=job_gpus, checkpoint_interval_h=checkpoint_interval_h,
                         restart_overhead_h=restart_overhead_h,
                         drain_cost_gpu_h=drain_cost_gpu_h, gpus_per_node=gpus_per_node)
    except GoodputError as exc:
        raise invalid(["query", exc.name], str(exc), exc.value) from None
    tables = queries.existing_tables(cur)
    repeat = {o.node: o for o in ctx.repeat_offenders()}
    post = offenders.post_repair_risks(list(repeat.values()), ctx.utcnow())
    # a repeat offender back from repair may pass on its post-repair risk alone
    floor = filters.min_risk or 0.0
    if not post:
        floor = max(cost.break_even_risk(), floor)
    nodes, _, scored_at = ctx.latest.risk_page(cur, tables, min_risk=floor,
                                               labels=filters.labels,
                                               gpu_model=filters.gpu_model)
    out = []
    for n in nodes:
        p = post.get(n["node"])
        if n["risk"] is None or not cost.should_drain(n["risk"], post_repair_risk=p):
            continue
        saving = cost.expected_saving_gpu_h(cost.decision_risk(n["risk"], p))
        o = repeat.get(n["node"])
        out.append({**{k: n[k] for k in ("node", "risk", "reasons", "top_gpu_uuid",
                                        "scored_at", "labels")},
                    "expected_saving_gpu_h": saving,
                    "drain_cost_gpu_h": cost.drain_cost_gpu_h,
                    "net_saving_gpu_h": saving - cost.drain_cost_gpu_h,
                    "repeat_offender": None if o is None else o.to_json(),
                    "post_repair_risk": p})
    out.sort(key=lambda c: (-c["net_saving_gpu_h"], c["node"]))
    out = out[:limit]
    return {
        "candidates": out,
        "cost_model": {**dataclasses.asdict(cost),
                       "crash_cost_gpu_h": cost.crash_cost_gpu_h(),
                       "break_even_risk": cost.break_even_risk()},
        "simulated": ctx.is_simulated(cur, tables),
        "scored_at": queries.iso_z(scored_at),
    }


@router.get("/v1/repeat-offenders", response_model=RepeatOffenders, tags=["risk"],
            dependencies=READ, responses=AUTH_ERRORS)
def repeat_offenders(
    ctx: Ctx,
    failures: Annotated[int, Query(ge=1, le=1000,
                                   description="Failures in the window that make one.")] = 2,
    days: Annotated[int, Query(ge=1, le=3650, description="The window, in days.")] = 30,
) -> Any:
    """Nodes that failed `failures` times or more in the last `days` days (incidents of
    kind failure, planned maintenance excepted), with what to do: "burn-in before large
    jobs", or "RMA / replace the GPU" when two failures blamed the same GPU or it failed 3
    times or more; and the recurrence model's 7-day risk with its reasons."""
    return {"offenders": [o.to_json() for o in ctx.repeat_offenders(failures=failures,
                                                                    days=days)],
            "at": queries.iso_z(ctx.utcnow()), "failures": failures, "days": days}


@router.get("/v1/model", response_model=ModelInfo, tags=["model"], dependencies=READ,
            responses={404: {"model": ErrorDetail, "description": "No model trained."},
                       **AUTH_ERRORS})
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
