"""Dashboard sessions: a browser signs in once with an API token and gets a cookie.

The API itself keeps bearer tokens (``fleetcare.api.auth``); a browser cannot send one,
so ``POST /login`` takes a token of scope ``read`` or above from a form and answers a
session cookie. The session refers to its token by id and is checked on every request
against the ``api_tokens`` table: revoking the token ends every session signed in with
it, at once. Sessions expire after ``TTL``; ``POST /logout`` ends one.

Only the SHA-256 of the session id is stored (table ``api_sessions``, owned here), as for
tokens. The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other
site's form can post with it: the CSRF defence for ``/logout``), ``Secure`` when the
request came over TLS, and has a ``Max-Age``.

Exceptions: none of its own (an unknown or expired session is None, not an error).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable

import duckdb

from fleetcare.api import auth as _auth

COOKIE = "fleetcare_session"
TTL = dt.timedelta(hours=12)
DDL = """
CREATE TABLE IF NOT EXISTS api_sessions (
  hash VARCHAR PRIMARY KEY, token_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
  expires_at TIMESTAMP NOT NULL
);
"""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def ensure_table(cur: duckdb.DuckDBPyConnection) -> None:
    cur.execute(DDL)


def create(cur: duckdb.DuckDBPyConnection, token: _auth.TokenInfo, *,
           now: Callable[[], dt.datetime] = _now) -> str:
    """A new session for ``token`` (its id is returned, to set as the cookie); expired
    sessions are pruned on the way (the table stays bounded)."""
    ensure_table(cur)
    at = now()
    cur.execute("DELETE FROM api_sessions WHERE expires_at <= ?", [at])
    sid = secrets.token_urlsafe(32)
    cur.execute("INSERT INTO api_sessions VALUES (?, ?, ?, ?)",
                [_auth.hash_token(sid), token.id, at, at + TTL])
    return sid


def lookup(cur: duckdb.DuckDBPyConnection, sid: str, *,
           now: Callable[[], dt.datetime] = _now) -> _auth.TokenInfo | None:
    """The live token behind a live session, or None (unknown, expired, or its token
    revoked)."""
    try:
        row = cur.execute(
            "SELECT t.id, t.name, t.scope, t.created_at, t.revoked_at FROM api_sessions s "
            "JOIN api_tokens t ON t.id = s.token_id WHERE s.hash = ? AND s.expires_at > ? "
            "AND t.revoked_at IS NULL", [_auth.hash_token(sid), now()]).fetchone()
    except duckdb.CatalogException:  # no table yet: nobody signed in
        return None
    if row is None:
        return None
    return _auth.TokenInfo(id=row[0], name=row[1], scope=row[2], created_at=row[3],
                           revoked_at=row[4])


def end(cur: duckdb.DuckDBPyConnection, sid: str) -> None:
    """Forget a session (sign-out); unknown ids are ignored."""
    try:
        cur.execute("DELETE FROM api_sessions WHERE hash = ?", [_auth.hash_token(sid)])
    except duckdb.CatalogException:
        pass


def cookie_header(sid: str, *, secure: bool) -> str:
    """The ``Set-Cookie`` value of a new session."""
    return (f"{COOKIE}={sid}; Path=/; Max-Age={int(TTL.total_seconds())}; HttpOnly; "
            f"SameSite=Strict{'; Secure' if secure else ''}")


def clear_cookie_header(*, secure: bool) -> str:
    return (f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
            f"{'; Secure' if secure else ''}")
