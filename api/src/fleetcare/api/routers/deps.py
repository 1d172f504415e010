"""What the routers share: the per-request cursor, the scope dependencies, the documented
auth errors, the app's context (clock, SIMULATED flag, drain controller, ingest metrics,
the in-memory latest scores) and the 422 helpers.

``AppContext`` replaces the closure ``create_app`` used to be: ``create_app`` builds one
and keeps it in ``app.state.ctx``; endpoints receive it through the ``Ctx`` dependency.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

import duckdb
from fastapi import Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import Field

from fleetcare.api import auth as _auth
from fleetcare.api import queries
from fleetcare.api.latest_samples import LatestSamples
from fleetcare.api.latest_scores import LatestScores
from fleetcare.api.schemas import ErrorDetail
from fleetcare.collectors.agent_metrics import Family
from fleetcare.pipeline.store import Store


@dataclass(frozen=True)
class AppContext:
    """What ``create_app`` was given, for the endpoints."""

    store: Store
    version: str
    clock: Callable[[], float]
    simulated: bool | None = None
    drains: Any = None
    ingest: Callable[[], Iterable[Family]] | None = None
    latest: LatestScores = field(default_factory=LatestScores)
    samples: LatestSamples = field(default_factory=LatestSamples)
    _held: dict[str, tuple[float, Any]] = field(default_factory=dict)

    def _cached(self, key: str, read: Callable[[], Any]) -> Any:
        """``read()``, reused for ``latest.check_s`` seconds (what changes rarely: the
        tables that exist, the SIMULATED flag; each was a query per request)."""
        now = time.monotonic()
        held = self._held.get(key)
        if held is not None and now - held[0] < self.latest.check_s:
            return held[1]
        value = read()
        self._held[key] = (now, value)
        return value

    def tables(self, cur: duckdb.DuckDBPyConnection) -> set[str]:
        """``queries.existing_tables``, checked at most every ``latest.check_s``."""
        return set(self._cached("tables", lambda: queries.existing_tables(cur)))

    def has_nics(self, cur: duckdb.DuckDBPyConnection, tables: set[str]) -> bool:
        """Any InfiniBand/RoCE port sample stored (checked at most every
        ``latest.check_s``): a fleet without them pays nothing for the node page's ports."""
        if "nic_telemetry" not in tables:
            return False
        return bool(self._cached("has_nics", lambda: cur.execute(
            "SELECT EXISTS (SELECT 1 FROM nic_telemetry)").fetchall()[0][0]))

    def is_simulated(self, cur: duckdb.DuckDBPyConnection, tables: set[str]) -> bool:
        """The SIMULATED flag: forced by ``create_app(simulated=)``, else ``meta``'s
        (checked at most every ``latest.check_s``)."""
        if self.simulated is not None:
            return self.simulated
        return bool(self._cached("simulated", lambda: queries.simulated(cur, tables)))

    def age_s(self, ts: Any) -> float | None:
        return None if ts is None else round(self.clock() - queries.epoch_s(ts), 3)

    def utcnow(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC).replace(tzinfo=None)

    def repeat_offenders(self, *, failures: int = 2, days: int = 30) -> list[Any]:
        """``offenders.repeat_offenders`` now, scored by the shipped recurrence model."""
        from fleetcare.models import offenders

        return offenders.repeat_offenders(self.store, self.utcnow(), failures=failures,
                                          days=days, model=_recurrence_model())


_RECURRENCE: list[Any] = []


def _recurrence_model() -> Any:
    """The shipped recurrence model, read once per process."""
    if not _RECURRENCE:
        from fleetcare.models import recurrence

        _RECURRENCE.append(recurrence.load())
    return _RECURRENCE[0]


async def _context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def _cursor(request: Request) -> AsyncIterator[duckdb.DuckDBPyConnection]:
    """A DuckDB cursor of its own for each request (requests run on worker threads).
    Opened and closed on the event loop: both are quick calls, and a sync dependency
    would cost two hand-offs to the thread pool per request (as ``_context`` and
    ``app._known_query_parameters`` are async for the same reason)."""
    cur = request.app.state.store.cursor()
    try:
        yield cur
    finally:
        cur.close()


Cur = Annotated[duckdb.DuckDBPyConnection, Depends(_cursor)]
Ctx = Annotated[AppContext, Depends(_context)]
READ = [Depends(_auth.require("read"))]
WRITE = [Depends(_auth.require("write"))]
ADMIN = [Depends(_auth.require("admin"))]
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "No bearer token, or not a valid one."},
    403: {"model": ErrorDetail, "description": "The token's scope is too weak."},
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: {"model": ErrorDetail, "description": "The body could not be read as JSON."},
}
NODE_PATH = r"^[^\x00-\x1f\x7f]+$"
"""A node name in a path: no control characters."""


def invalid(loc: list[str | int], msg: str, value: Any = None) -> RequestValidationError:
    """A 422 in FastAPI's own shape, for checks made in the endpoint."""
    return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error",
                                    "input": value}])


def _labels(label: list[str], partition: str | None) -> list[tuple[str, str]]:
    pairs = []
    for i, raw in enumerate(label):
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise invalid(["query", "label", i], f"label {raw!r} is not KEY=VALUE "
                          "(e.g. label=rack=r12)", raw)
        pairs.append((key, value))
    if partition is not None:
        pairs.append(("partition", partition))
    return pairs


class NodeFilter:
    """The node filters shared by /v1/risk and /v1/drain-candidates."""

    def __init__(
        self,
        label: Annotated[list[Annotated[str, Field(  # pattern checked by _labels: its message
            max_length=512, json_schema_extra={"pattern": "^[^=]+="})]], Query(
            max_length=16, description="KEY=VALUE the node's labels must contain "
            "(repeat for several, all must match), e.g. label=rack=r12.")] = [],  # noqa: B006
        partition: Annotated[str | None, Query(
            min_length=1, max_length=256,
            description="Shorthand for label=partition=VALUE.")] = None,
        gpu_model: Annotated[str | None, Query(
            min_length=1, max_length=256, description="Nodes with a GPU of this model: "
            "case-insensitive substring, e.g. H100.")] = None,
        min_risk: Annotated[float | None, Query(
            ge=0.0, le=1.0, description="Only nodes with risk >= this.")] = None,
    ) -> None:
        self.labels = _labels(label, partition)
        self.gpu_model = gpu_model
        self.min_risk = min_risk
