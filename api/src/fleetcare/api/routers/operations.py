"""What operators and the engines record: ``GET /v1/drains`` and ``POST
/v1/drains/{node}/clear`` (the drain controller), ``GET /v1/alerts`` (the alerts engine),
``POST /v1/incidents`` (failures and repairs: the next model's labels)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Response

from fleetcare.api import auth as _auth
from fleetcare.api import queries
from fleetcare.api.routers.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    NODE_PATH,
    READ,
    WRITE,
    Ctx,
    Cur,
    invalid,
)
from fleetcare.api.schemas import (
    AlertList,
    DrainClearIn,
    DrainClearOut,
    ErrorDetail,
    HeldDrains,
    IncidentIn,
    IncidentOut,
)

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/incidents", response_model=IncidentOut, status_code=201,
             tags=["incidents"], dependencies=WRITE,
             responses={200: {"model": IncidentOut,
                              "description": "Already recorded (same natural key)."},
                        **BODY_ERRORS})
def report_incident(body: IncidentIn, response: Response, ctx: Ctx) -> Any:
    """Report a failure or a repair (write). Stored as the data contract's Incident:
    the ground truth the next model learns from. Reporting twice is safe."""
    from fleetcare.pipeline.incidents import IncidentError, validate

    try:
        inc = validate(ts=body.ts, node=body.node, kind=body.kind, cause=body.cause,
                       source=body.source, gpu_uuid=body.gpu_uuid, mode=body.mode,
                       note=body.note, now=ctx.clock())  # ingest's time bounds
    except IncidentError as exc:
        raise invalid(["body", exc.field], str(exc), exc.value) from None
    if body.xid is not None:
        inc = msgspec.structs.replace(inc, xid=body.xid)
    created = ctx.store.insert_incidents([inc]) == 1
    if not created:
        response.status_code = 200
    log.info("api.incident node=%s kind=%s cause=%s created=%s", inc.node, inc.kind,
             inc.cause, created)
    return {**msgspec.structs.asdict(inc), "ts": queries.iso_z(inc.ts),
            "created": created}


@router.get("/v1/drains", response_model=HeldDrains, tags=["drains"], dependencies=READ,
            responses=AUTH_ERRORS)
def held_drains(cur: Cur) -> Any:
    """The drains fleetcare holds (made and not given back yet), by node."""
    return {"drains": queries.held_drains(cur, queries.existing_tables(cur))}


@router.post("/v1/drains/{node}/clear", response_model=DrainClearOut, tags=["drains"],
             responses={404: {"model": ErrorDetail, "description": "Not drained by fleetcare."},
                        409: {"model": ErrorDetail,
                              "description": "This server runs no drain controller."},
                        **BODY_ERRORS})
def clear_drain(
    node: Annotated[str, Path(min_length=1, max_length=256, pattern=NODE_PATH)],
    token: Annotated[_auth.TokenInfo | None, Depends(_auth.require("admin"))],
    ctx: Ctx,
    body: Annotated[DrainClearIn, Body()] = DrainClearIn(note="", force=False),  # noqa: B008
) -> Any:
    """An operator clears a node fleetcare drained (admin): it is resumed now if its
    risk is below the resume threshold (or with ``force``), else once it is. The same
    as ``fleetcare drain clear``, for while ``serve`` holds the database."""
    from fleetcare.api.drains.controller import ControllerError

    drains = ctx.drains
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


@router.get("/v1/alerts", response_model=AlertList, tags=["alerts"], dependencies=READ,
            responses=AUTH_ERRORS)
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
