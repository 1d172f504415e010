"""Readers first: the service's background threads run below the API's in CPU priority."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fleetcare.api import priority
from fleetcare.api.app import create_app
from fleetcare.api.latest_samples import LatestSamples
from fleetcare.api.server import start_server_thread
from fleetcare.api.service import Service
from fleetcare.collectors.transport.embedded import EmbeddedConsumer
from fleetcare.pipeline.store import Store

pytestmark = pytest.mark.skipif(not priority.supported(),
                                reason="threads have their own nice value on Linux only")


def _process_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def _in_thread(fn):  # type: ignore[no-untyped-def]
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_a_thread_lowers_its_own_priority_and_no_other() -> None:
    base = _process_nice()

    def lower_twice() -> tuple[object, object, int]:
        first = priority.lower_this_thread(3)
        return first, priority.lower_this_thread(3), priority.thread_nice()

    assert _in_thread(lower_twice) == (min(19, base + 3),) * 3  # twice: still 3 below
    assert priority.thread_nice() == base == _process_nice()  # the caller's is untouched
    assert _in_thread(lambda: (priority.lower_this_thread(0), priority.thread_nice())) == (
        None, base)
    assert _in_thread(lambda: priority.lower_this_thread(40 if base < 0 else 19)) == 19


@pytest.mark.parametrize("by", [-1, 20])
def test_a_step_outside_0_to_19_says_what_is_allowed(by: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use 0 .* to 19"):
        priority.lower_this_thread(by)
    with pytest.raises(ValueError, match="background_nice"):
        Service(Store(tmp_path / "f.duckdb"), background_nice=by)


def test_the_service_loops_run_below_the_api(tmp_path: Path) -> None:
    """Ingest and scoring (and alerts, drains, retention: the scoring loop runs them) lower
    their own thread's priority before their first step."""
    base = _process_nice()
    seen: dict[str, int] = {}
    scored = threading.Event()
    store = Store(tmp_path / "f.duckdb")

    def open_consumer() -> EmbeddedConsumer:
        seen["ingest"] = priority.thread_nice()
        return EmbeddedConsumer(tmp_path / "bus")

    def rescore() -> None:
        seen["score"] = priority.thread_nice()
        scored.set()

    svc = Service(store, open_consumer=open_consumer, score_every_s=1e9, keep_raw=None,
                  ingest_poll_s=0.05, background_nice=7)
    svc.rescore = rescore  # type: ignore[method-assign]
    svc.start()
    try:
        assert scored.wait(10)
        deadline = time.monotonic() + 10
        while "ingest" not in seen:
            assert time.monotonic() < deadline, "the ingest loop did not open its consumer"
            time.sleep(0.02)
    finally:
        svc.stop()
        store.close()
    assert seen == {"ingest": min(19, base + 7), "score": min(19, base + 7)}
    assert priority.thread_nice() == base


def test_the_sample_keeper_runs_below_the_api_and_the_server_does_not(
        tmp_path: Path) -> None:
    """``create_app(keep_fresh=True)``: the node pages' sample memory is refreshed by a
    niced thread; the server's thread (and the request workers it starts) keep the
    process's priority."""
    from tests.collectors.test_contract import sample

    base = _process_nice()
    store = Store(tmp_path / "f.duckdb")
    store.insert_sample_records([sample(gpu_uuid="GPU-1")])
    app = create_app(store, auth=False, keep_fresh=True, background_nice=5)
    samples: LatestSamples = app.state.ctx.samples
    server, thread = start_server_thread(app)
    try:
        keeper = samples._keeper
        assert keeper is not None and keeper.native_id is not None
        deadline = time.monotonic() + 10
        while priority.thread_nice(keeper.native_id) != min(19, base + 5):
            assert time.monotonic() < deadline, "the keeper did not lower its priority"
            time.sleep(0.02)
        assert thread.native_id is not None
        assert priority.thread_nice(thread.native_id) == base
    finally:
        server.should_exit = True
        thread.join(10)
        samples.stop()
        store.close()


def _native_threads() -> set[int]:
    """Every thread of this process (Linux: /proc/self/task)."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def _python_threads() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def test_a_niced_call_runs_below_its_caller_and_returns_or_raises_as_it() -> None:
    base = _process_nice()
    assert priority.niced_call(priority.thread_nice, 4) == min(19, base + 4)
    assert priority.thread_nice() == base
    with pytest.raises(KeyError, match="nope"):
        priority.niced_call(lambda: {}["nope"], 4)
    with pytest.raises(ValueError, match="use 0 .* to 19"):
        priority.niced_call(priority.thread_nice, 20)


def test_duckdbs_workers_start_at_the_priority_of_the_thread_that_opens_the_database(
        tmp_path: Path) -> None:
    """What ``serve`` relies on: DuckDB starts its workers with the database, at the
    opening thread's priority; opened from the caller's thread they are not niced."""
    base = _process_nice()
    for by, path in ((0, tmp_path / "plain.duckdb"), (6, tmp_path / "niced.duckdb")):
        before = _native_threads()
        store = priority.niced_call(lambda p=path: Store(p), by) if by else Store(path)
        try:
            workers = _native_threads() - before - _python_threads()
            assert workers, "DuckDB started no worker thread"
            assert {priority.thread_nice(t) for t in workers} == {min(19, base + by)}
        finally:
            store.close()


def test_serve_opens_its_database_so_that_duckdbs_workers_run_below_the_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetcare.api import server
    from fleetcare.api.cli import main

    base = _process_nice()
    db = tmp_path / "f.duckdb"
    Store(db).close()  # exists, and no connection keeps its database (and workers) open
    seen: dict[str, set[int]] = {}

    def fake_serve(app, host: str, port: int, **kwargs: object) -> None:  # type: ignore[no-untyped-def]
        workers = _native_threads() - before - _python_threads()
        seen["nice"] = {priority.thread_nice(t) for t in workers}

    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setenv("FLEETCARE_CLI_BACKGROUND_NICE", "7")
    before = _native_threads()
    assert main(["serve", "--db", str(db), "--no-auth", "--port", "0"]) == 0
    assert seen["nice"] == {min(19, base + 7)}, "a thread serve started is not niced"
