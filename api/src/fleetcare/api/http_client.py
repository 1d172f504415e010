"""The CLI's calls to a running ``fleetcare serve`` (``--api URL``): JSON over HTTP with a
bearer token, errors that say what to do. Used where the server holds the database
(DuckDB has one writer), e.g. ``fleetcare drain clear --api`` and ``fleetcare tokens --api``.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from fleetcare.collectors.redact import mask_secrets

TOKEN_ENV = "FLEETCARE_TOKEN"


class ApiCallError(ValueError):
    """The server could not be reached or refused the call; the message says why."""


def add_api_arguments(p: argparse.ArgumentParser) -> None:
    """``--api URL`` and ``--token`` for a command that can work through a running server."""
    p.add_argument("--api", default=None, metavar="URL",
                   help="work through a running `fleetcare serve` (e.g. http://host:8000) "
                        "instead of the database it holds")
    p.add_argument("--token", default=None,
                   help=f"admin bearer token for --api (default: ${TOKEN_ENV})")


def quote(part: str) -> str:
    """One path segment, escaped."""
    return urllib.parse.quote(part, safe="")


def call(api: str, method: str, path: str, *, body: dict[str, Any] | None = None,
         token: str | None = None, timeout_s: float = 30.0) -> Any:
    """``method path`` on the server at ``api``; the decoded JSON answer.

    ``token`` defaults to ``$FLEETCARE_TOKEN``. Raises ``ApiCallError`` naming the URL,
    the HTTP status and the server's ``detail``.
    """
    token = token or os.environ.get(TOKEN_ENV)
    url = api.rstrip("/") + path
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
            detail = doc.get("message") or doc.get("detail")
        except (ValueError, AttributeError):
            detail = None
        hint = (f" (an admin token: --token or {TOKEN_ENV}; `fleetcare tokens create "
                "--scope admin` while the server is stopped)" if exc.code in (401, 403)
                else "")
        raise ApiCallError(mask_secrets(f"{method} {url}: HTTP {exc.code}: "
                                        f"{detail or exc.reason}{hint}")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ApiCallError(mask_secrets(f"cannot reach {api}: {getattr(exc, 'reason', exc)}; "
                                        "is `fleetcare serve` running there?")) from None
