"""Bearer tokens with scopes for the REST API.

Scopes nest: ``admin`` ⊃ ``write`` ⊃ ``read``.

- ``read``  — schedulers and dashboards: ``GET /v1/...`` and the dashboard ``/``.
- ``write`` — operators and schedulers reporting failures: ``POST /v1/incidents``.
- ``admin`` — configuration: ``PUT /v1/nodes/{node}/labels``.

Open without a token (documented choice): ``/healthz`` (liveness probes),
``/metrics`` (Prometheus scrapers; risk gauges only, no telemetry), ``/docs``,
``/openapi.json`` and Swagger UI's static files (no fleet data).

A token is ``fc_`` + 43 url-safe characters (32 random bytes). Only its SHA-256 is
stored (table ``api_tokens``); the token itself is shown once, by
``fleetcare tokens create``. Tokens are checked against the database per request,
through a short cache (``CACHE_S``), so a token revoked in this process stops working
at once, and one revoked by another process within ``CACHE_S`` seconds.

Exceptions::

    TokenError (ValueError)   bad scope, unknown token id (.field, .value)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import duckdb
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

SCOPES = ("read", "write", "admin")
"""Each scope includes the ones before it."""
TOKEN_PREFIX = "fc_"
CACHE_S = 5.0

DDL = """
CREATE TABLE IF NOT EXISTS api_tokens (
  id VARCHAR PRIMARY KEY, name VARCHAR, scope VARCHAR NOT NULL, hash VARCHAR NOT NULL UNIQUE,
  created_at TIMESTAMP NOT NULL, revoked_at TIMESTAMP
);
"""


class TokenError(ValueError):
    """A token operation that cannot be done; says which field, the value and the fix."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class TokenInfo:
    id: str
    name: str | None
    scope: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None = None

    def allows(self, needed: str) -> bool:
        return scope_allows(self.scope, needed)

    def as_json(self) -> dict[str, Any]:
        def iso(t: dt.datetime | None) -> str | None:
            return None if t is None else t.isoformat() + "Z"

        return {"id": self.id, "name": self.name, "scope": self.scope,
                "created_at": iso(self.created_at), "revoked_at": iso(self.revoked_at)}


def scope_allows(have: str, needed: str) -> bool:
    """True when a token of scope ``have`` may call an endpoint that needs ``needed``."""
    return SCOPES.index(have) >= SCOPES.index(needed)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_table(cur: duckdb.DuckDBPyConnection) -> None:
    cur.execute(DDL)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def create_token(cur: duckdb.DuckDBPyConnection, scope: str, *, name: str | None = None,
                 now: Callable[[], dt.datetime] = _now) -> tuple[str, TokenInfo]:
    """A new token (shown once: only its hash is stored) and its stored row."""
    if scope not in SCOPES:
        raise TokenError("scope", scope, f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    ensure_table(cur)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    info = TokenInfo(id="tok_" + secrets.token_hex(6), name=name or None, scope=scope,
                     created_at=now())
    cur.execute("INSERT INTO api_tokens VALUES (?, ?, ?, ?, ?, NULL)",
                [info.id, info.name, info.scope, hash_token(token), info.created_at])
    return token, info


def _row(row: tuple[Any, ...]) -> TokenInfo:
    return TokenInfo(id=row[0], name=row[1], scope=row[2], created_at=row[3],
                     revoked_at=row[4])


def list_tokens(cur: duckdb.DuckDBPyConnection) -> list[TokenInfo]:
    """Every token, oldest first (hashes are never returned)."""
    ensure_table(cur)
    rows = cur.execute("SELECT id, name, scope, created_at, revoked_at FROM api_tokens "
                       "ORDER BY created_at, id").fetchall()
    return [_row(r) for r in rows]


def revoke_token(cur: duckdb.DuckDBPyConnection, token_id: str, *,
                 now: Callable[[], dt.datetime] = _now) -> TokenInfo:
    """Mark a token revoked (idempotent: the first revocation time is kept)."""
    ensure_table(cur)
    cur.execute("UPDATE api_tokens SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?",
                [now(), token_id])
    row = cur.execute("SELECT id, name, scope, created_at, revoked_at FROM api_tokens "
                      "WHERE id = ?", [token_id]).fetchone()
    if row is None:
        raise TokenError("id", token_id, f"no token with id {token_id!r}: see "
                         "`fleetcare tokens list --db PATH`")
    return _row(row)


def lookup(cur: duckdb.DuckDBPyConnection, token: str) -> TokenInfo | None:
    """The live (not revoked) token with this value, or None."""
    try:
        row = cur.execute("SELECT id, name, scope, created_at, revoked_at FROM api_tokens "
                          "WHERE hash = ? AND revoked_at IS NULL",
                          [hash_token(token)]).fetchone()
    except duckdb.CatalogException:  # no table: no token was ever created
        return None
    return None if row is None else _row(row)


class TokenCache:
    """Recently verified tokens (by hash) for ``CACHE_S`` seconds; bounded."""

    def __init__(self, ttl_s: float = CACHE_S, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, TokenInfo | None]] = {}

    def cached(self, token: str) -> tuple[bool, TokenInfo | None]:
        """(True, what ``get`` would answer) when the cache knows ``token``; (False, None)
        when only the database can tell."""
        hit = self._entries.get(hash_token(token))
        if hit is not None and self.clock() - hit[0] < self.ttl_s:
            return True, hit[1]
        return False, None

    def get(self, cur: duckdb.DuckDBPyConnection, token: str) -> TokenInfo | None:
        known, info = self.cached(token)
        if known:
            return info
        key, now = hash_token(token), self.clock()
        info = lookup(cur, token)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # bounded: unknown tokens cannot grow it
            self._entries[key] = (now, info)
        return info

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# -- FastAPI ------------------------------------------------------------------------------------
BEARER = HTTPBearer(
    auto_error=False, scheme_name="bearer", bearerFormat="fc_…",
    description="A token from `fleetcare tokens create --scope read|write|admin`: "
                "read ⊂ write ⊂ admin.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def require(scope: str) -> Any:
    """A FastAPI dependency: the request carries a live token of ``scope`` or above.

    401 (with ``WWW-Authenticate: Bearer``) when the token is missing or unknown, 403
    naming the scope needed when it is too weak. Does nothing when the app was created
    with ``auth=False``.
    """
    assert scope in SCOPES, scope

    def check(request: Request, creds: Credentials) -> TokenInfo | None:
        # sync on purpose: the dashboard's page_user and app._auth_error call it directly.
        # A cached token (nearly every request) opens no cursor; a miss reads one row
        state = request.app.state
        if not state.auth:
            return None
        if creds is None:
            got = request.headers.get("authorization")
            why = ("no Authorization header" if got is None else
                   "the Authorization header is not 'Bearer <token>'")
            raise HTTPException(
                status_code=401, headers={"WWW-Authenticate": "Bearer"},
                detail=f"{why}: this endpoint needs a bearer token of scope '{scope}' "
                       f"(create one with `fleetcare tokens create --scope {scope} --db PATH`)")
        known, info = state.token_cache.cached(creds.credentials)
        if not known:
            cur = state.store.cursor()
            try:
                info = state.token_cache.get(cur, creds.credentials)
            finally:
                cur.close()
        if info is None:
            raise HTTPException(
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
                detail="the bearer token is not valid (mistyped, revoked or from another "
                       "database): see `fleetcare tokens list --db PATH`")
        if not info.allows(scope):
            raise HTTPException(
                status_code=403,
                headers={"WWW-Authenticate":
                         f'Bearer error="insufficient_scope", scope="{scope}"'},
                detail=f"this endpoint needs scope '{scope}'; token {info.id} has scope "
                       f"'{info.scope}' (scopes nest: read < write < admin)")
        return info

    check.__name__ = f"require_{scope}"
    # the scope a route needs, for the app's auth-before-validation (app._route_scope)
    check.scope = scope  # type: ignore[attr-defined]
    return check


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback IP literals (127.0.0.0/8, ::1); names that
    would need DNS are not trusted."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
