"""Fixtures for the API tests: a real DuckDB file, a manual clock, a real HTTP server.

The score and model tables are created by their owners in fleetcare.models (the real
schema); ``Fleet`` writes rows into them as the scorer and the registry do.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.models import registry, scoring
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)
"""A naive UTC instant, as DuckDB TIMESTAMP columns hold them."""


class ManualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Any) -> Iterator[Store]:
    s = Store(tmp_path / "fleet.duckdb")
    scoring.ensure_schema(s)
    registry.ensure_schema(s)
    yield s
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0.replace(tzinfo=dt.UTC).timestamp() + 90.0)


@pytest.fixture
def serve_app() -> Iterator[Callable[..., httpx.Client]]:
    """``serve_app(store, **create_app_kwargs)`` -> an httpx client of a live server.

    Auth is off unless ``auth=True`` is passed: these fixtures test the data; auth has
    its own tests (test_auth.py)."""
    running = []

    def start(store: Store, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("auth", False)
        kwargs.setdefault("freshness_s", 0.0)  # these tests write, then read at once
        server, thread = start_server_thread(create_app(store, **kwargs))
        client = httpx.Client(base_url=f"http://127.0.0.1:{bound_port(server)}", timeout=10)
        running.append((server, thread, client))
        return client

    yield start
    for server, thread, client in running:
        client.close()
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


@pytest.fixture
def client(store: Store, clock: ManualClock,
           serve_app: Callable[..., httpx.Client]) -> httpx.Client:
    return serve_app(store, clock=clock)


class Fleet:
    """Inserts score and model rows the way fleetcare.models writes them."""

    T0 = T0

    def __init__(self, store: Store) -> None:
        self.store = store

    def node_score(self, node: str, risk: float, *, ts: dt.datetime = T0,
                   reasons: list[str] | None = None, top_gpu_uuid: str | None = None,
                   model_id: str = "m1") -> None:
        self.store.con.execute(
            "INSERT INTO node_scores VALUES (?, ?, ?, ?, ?, ?)",
            [ts, node, risk, json.dumps(reasons or []), top_gpu_uuid, model_id],
        ).fetchall()

    def gpu_score(self, node: str, gpu_uuid: str, gpu_index: int, risk: float, *,
                  ts: dt.datetime = T0, reasons: list[str] | None = None,
                  model: str = "NVIDIA H100 80GB HBM3", model_id: str = "m1") -> None:
        self.store.con.execute(
            "INSERT INTO gpu_scores VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [ts, node, gpu_uuid, gpu_index, model, risk, json.dumps(reasons or []),
             model_id],
        ).fetchall()

    def model(self, model_id: str, *, created_at: dt.datetime = T0, horizon_h: float = 24.0,
              features: Any = None, params: Any = None, metrics: Any = None,
              is_current: bool = True) -> None:
        self.store.con.execute(
            "INSERT INTO models (model_id, created_at, horizon_h, features, params, metrics, "
            "blob, is_current) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [model_id, created_at, horizon_h, json.dumps(features), json.dumps(params),
             json.dumps(metrics), b"", is_current],
        ).fetchall()


@pytest.fixture
def fleet(store: Store) -> Fleet:
    return Fleet(store)


@pytest.fixture
def tokens(store: Store) -> Callable[..., str]:
    """``tokens(scope, name=None)`` -> a new bearer token of ``scope`` in ``store``."""
    from fleetcare.api import auth

    def make(scope: str, name: str | None = None) -> str:
        cur = store.cursor()
        try:
            return auth.create_token(cur, scope, name=name)[0]
        finally:
            cur.close()

    return make
