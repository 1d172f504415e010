"""Bounds on what a request can make the API do: body size, strict JSON, short echoes.

``BodyLimit`` (ASGI middleware) reads a request's body before the app does:

- more than ``max_body_bytes`` (by ``Content-Length``, or counted while it streams in):
  **413**, without reading the rest;
- a JSON body holding ``NaN``, ``Infinity`` or ``-Infinity`` (Python's parser accepts
  them, JSON does not): **422** naming them. Before, they reached the 422 handler, which
  could not serialise the value it echoed: 500.

``excerpt(value)`` is what a 422 body may echo of the input: at most ``ECHO_CHARS``
characters (a 30 MB body came back as a 60 MB response), finite numbers only.

Error bodies have the API's shape: ``{"message": ..., "detail": ...}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 1 << 20
"""1 MiB: the largest body any endpoint needs is a few KiB (an incident, node labels)."""
ECHO_CHARS = 64


def excerpt(value: Any) -> Any:
    """``value`` as a 422 body may echo it: short, and always valid JSON."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, int):
        text = str(value)
        return value if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}… ({len(text):,} digits)"
    if not isinstance(value, str):
        try:
            value = json.dumps(value, default=repr)
        except ValueError:  # NaN inside, or a cycle
            value = repr(value)
    return value if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]}… ({len(value):,} characters)"


def _constant(name: str) -> Any:
    raise ValueError(name)


async def _respond(send: Send, status: int, message: str, detail: Any) -> None:
    body = json.dumps({"message": message, "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: 413 beyond ``max_body_bytes``, 422 for NaN/Infinity in JSON."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes {max_body_bytes} must be at least 1")
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> str:
        return (f"the request body is larger than {self.max_body_bytes:,} bytes, the most this "
                "server reads (the [cli] max_body_bytes setting, FLEETCARE_CLI_MAX_BODY_BYTES)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _respond(send, 413, self._too_large(), {"limit_bytes": self.max_body_bytes})
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _respond(send, 413, self._too_large(),
                               {"limit_bytes": self.max_body_bytes})
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if b"json" in headers.get(b"content-type", b"") and body:
            try:
                json.loads(body, parse_constant=_constant)
            except ValueError as exc:
                if str(exc) in ("NaN", "Infinity", "-Infinity"):
                    await _respond(
                        send, 422, f"body: {exc} is not a JSON number (RFC 8259 has no NaN "
                        "or Infinity): send a finite number, or null",
                        [{"loc": ["body"], "msg": f"{exc} is not valid JSON",
                          "type": "json_invalid"}])
                    return  # other JSON errors: the app says which, as it always did
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
