"""Shared pieces of the alert tests: real HTTP receivers on loopback, a manual clock, a
store with the real scoring schema, and synthetic scoring runs."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetcare.api.alerts.config import parse
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)
"""Naive UTC, as DuckDB TIMESTAMP columns hold it."""


def epoch(ts: dt.datetime) -> float:
    return ts.replace(tzinfo=dt.UTC).timestamp()


class Clock:
    def __init__(self, ts: dt.datetime = T0) -> None:
        self.now = epoch(ts)

    def __call__(self) -> float:
        return self.now

    def at(self, ts: dt.datetime) -> float:
        self.now = epoch(ts)
        return self.now


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """A real HTTP server on 127.0.0.1 that records every POST; ``fail_next`` answers the
    next N requests with ``fail_status``; ``stop()``/``start()`` make it refuse connections
    and come back on the same port."""

    def __init__(self) -> None:
        self.got: list[Received] = []
        self.fail_next = 0
        self.fail_status = 500
        self.attempts = 0
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.attempts += 1
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    status = outer.fail_status
                else:
                    outer.got.append(Received(self.path, dict(self.headers.items()), body))
                    status = 200
                reply = b'{"status":"ok"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receivers() -> Iterator[Any]:
    made: list[Receiver] = []

    def make() -> Receiver:
        r = Receiver()
        made.append(r)
        return r

    yield make
    for r in made:
        if r.server is not None:
            r.stop()


@pytest.fixture
def db(tmp_path: Any) -> Iterator[Store]:
    s = Store(tmp_path / "alerts.duckdb")
    scoring.ensure_schema(s)
    yield s
    s.close()


def put_scores(store: Store, ts: dt.datetime, risks: dict[str, float], *,
               reasons: dict[str, list[str]] | None = None, model_id: str = "m1") -> None:
    """One scoring run: ``risks`` node -> risk, as fleetcare.models.scoring writes it."""
    for node, risk in risks.items():
        store.cursor().execute(
            "INSERT INTO node_scores VALUES (?, ?, ?, ?, ?, ?)",
            [ts, node, risk, json.dumps((reasons or {}).get(node, [f"{node} reason"])),
             f"GPU-{node}-0", model_id]).fetchall()


def minutes(n: float) -> dt.timedelta:
    return dt.timedelta(minutes=n)


def config(sinks: list[dict[str, Any]] | None = None, env: dict[str, str] | None = None,
           **top: Any) -> Any:
    table: dict[str, Any] = {"threshold": 0.5, "for": "5m", "resolve_threshold": 0.3,
                             "resolve_for": "3m", "external_url": "http://fleetcare.test:8000",
                             "retry_base": "10s", "retry_cap": "5m", "retry_jitter": 0.1,
                             "max_age": "1h", "timeout": "5s", **top}
    table["sinks"] = sinks or []
    return parse(table, env or {})
