"""Run an ASGI app (the API: ``fleetcare.api.app.create_app``) with uvicorn inside this
process (the service is one process: ingest, scorer and API threads share one DuckDB
database).

``serve(app, ...)`` blocks (the CLI's ``fleetcare serve``); ``start_server_thread(app,
...)`` runs uvicorn on a daemon thread and returns once the port accepts connections (the
demo and the tests). Stop either with ``server.should_exit = True``. This module takes
the app it serves and imports nothing of the API's (no import cycle with ``app``).

Neither configures logging handlers (uvicorn's ``log_config`` is off): the CLI does.
"""

from __future__ import annotations

import gc
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from fleetcare.collectors.signals import on_signals


def _server(app: FastAPI, host: str, port: int, log_level: str) -> uvicorn.Server:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            log_config=None, access_log=False, lifespan="off")
    return uvicorn.Server(config)


def freeze_heap() -> None:
    """Move every object alive now (modules, the app, the warmed in-memory scores and
    samples) out of the garbage collector's sight: a full collection then walks only what
    was made since. Measured with ``bench/bench_api_load.py`` at 16,384 GPUs: the
    collector's full passes over ~1 M long-lived objects were the API's p99 (100-150 ms
    stalls at 200 req/s; with the collector off, p99 under 10 ms). Objects frozen here are
    still freed by reference counting; only cyclic garbage among them would stay."""
    gc.collect()
    gc.freeze()


def warm(app: FastAPI) -> None:
    """Build now what FastAPI builds on the first request that needs it: the OpenAPI
    spec (the API checks each operation's query parameters against it) and, with it,
    each route's parameter models. It took 0.19-0.45 s of the first request after
    ``serve`` started, which a scheduler's first call would wait for."""
    app.openapi()


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, *,
          log_level: str = "info") -> None:
    """Serve the API on ``host:port`` until SIGINT/SIGTERM (blocking), then return.

    uvicorn re-raises the signal that stopped it once it has shut down; with the default
    handlers that would end the process before the caller stops its ingest and scoring
    threads and closes the database. Here the signal is answered by a handler that does
    nothing, so ``serve`` returns and the caller shuts down in order.
    """
    server = _server(app, host, port, log_level)
    warm(app)
    freeze_heap()
    if threading.current_thread() is not threading.main_thread():
        server.run()
        return
    with on_signals(_stopped):
        server.run()


def _stopped(signum: int, frame: object) -> None:
    """The signal uvicorn re-raises after its shutdown: already handled."""


def bound_port(server: uvicorn.Server) -> int:
    """The port a started server listens on (useful with ``port=0``)."""
    return int(server.servers[0].sockets[0].getsockname()[1])


def start_server_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, *,
                        log_level: str = "warning", timeout_s: float = 15.0,
                        freeze: bool = False) -> tuple[uvicorn.Server, threading.Thread]:
    """Start uvicorn on a daemon thread; return once ``host:port`` accepts connections.

    ``freeze``: ``warm`` and ``freeze_heap`` first, as ``serve`` does (benchmarks of the service; not
    tests, where objects of earlier tests would be frozen with it). ``port=0`` picks a
    free port: read it with ``bound_port(server)``. Raises
    ``RuntimeError`` when the server does not come up (port taken, bad host) in time.
    """
    server = _server(app, host, port, log_level)
    if freeze:
        warm(app)
        freeze_heap()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except (SystemExit, Exception) as exc:  # uvicorn sys.exit()s when it cannot bind
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"fleetcare-api-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            why = repr(failure[0]) if failure else "the server thread ended"
            raise RuntimeError(
                f"the fleetcare API did not start on {host}:{port} ({why}; see the "
                "uvicorn log: is the port already taken? try another port)"
            )
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(
                f"the fleetcare API did not start on {host}:{port} within {timeout_s} s"
            )
        time.sleep(0.01)
    # started is set once the sockets listen; check that a client really gets in.
    with socket.create_connection((host, bound_port(server)), timeout=timeout_s):
        pass
    return server, thread
