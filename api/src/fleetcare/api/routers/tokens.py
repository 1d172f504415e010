"""``/v1/tokens`` (admin): list, create and revoke API tokens while ``serve`` holds the
database (``fleetcare tokens`` does the same on a database no server holds)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request

from fleetcare.api import auth as _auth
from fleetcare.api.routers.deps import ADMIN, AUTH_ERRORS, BODY_ERRORS, Cur
from fleetcare.api.schemas import ErrorDetail, TokenCreated, TokenIn, TokenList, TokenOut

log = logging.getLogger(__name__)
router = APIRouter(tags=["tokens"])


@router.get("/v1/tokens", response_model=TokenList, dependencies=ADMIN,
            responses=AUTH_ERRORS)
def list_tokens(cur: Cur) -> Any:
    """Every API token, oldest first (admin); their values are never shown."""
    return {"tokens": [t.as_json() for t in _auth.list_tokens(cur)]}


@router.post("/v1/tokens", response_model=TokenCreated, status_code=201, dependencies=ADMIN,
             responses=BODY_ERRORS)
def create_token(body: TokenIn, cur: Cur) -> Any:
    """A new token (admin), returned this once: only its SHA-256 is stored. The same
    as ``fleetcare tokens create``, for while ``serve`` holds the database."""
    token, info = _auth.create_token(cur, body.scope, name=body.name)
    log.info("api.token_created id=%s scope=%s name=%s", info.id, info.scope, info.name)
    return {**info.as_json(), "token": token}


@router.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut, dependencies=ADMIN,
             responses={404: {"model": ErrorDetail, "description": "No such token."},
                        **AUTH_ERRORS})
def revoke_token(token_id: Annotated[str, Path(min_length=1, max_length=64)],
                 cur: Cur, request: Request) -> Any:
    """Revoke a token (admin); it stops working at once on this server, and the
    dashboard sessions signed in with it end."""
    try:
        info = _auth.revoke_token(cur, token_id)
    except _auth.TokenError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    request.app.state.token_cache.clear()
    log.info("api.token_revoked id=%s scope=%s", info.id, info.scope)
    return info.as_json()
