"""Readers first: the service's background threads run at a lower CPU priority than the
threads that answer requests.

``serve`` is one process (DuckDB has one writer per file): ingest, scoring and the node
pages' sample memory write and read in threads beside the API's. On a small box they share
two cores with DuckDB's own workers, and a request that arrives while a scoring run writes
waits for a core — most of the API's p99 (``bench/bench_api_load.py``). The background
threads lower their own priority when they start, by ``BACKGROUND_NICE`` niceness levels
above the process's (``[cli] background_nice``, ``FLEETCARE_CLI_BACKGROUND_NICE``; 0 keeps
them equal): when a core is free they run as fast as before; when a request wants it, the
request gets it first. Threads they start afterwards (a model's OpenMP pool) inherit it.

So do DuckDB's workers: DuckDB starts them when a database opens, and a thread starts at
its creator's priority. ``serve`` opens its store from a niced thread (``niced_call``), so
the workers — which run the parallel parts of every query: the scoring cycle's, ingest's,
the sample keeper's — are background threads too. A request's query runs on the request's
thread at the API's priority; only the parallel parts of a large one (a node's history)
wait for the niced workers when the cores are busy. Measured with ``bench/bench_api_load.py
--cpu-hog 0.7`` (a process beside it busy 0.7 of a core; the README), three pairs: the
writing phase's p99 36.0 / 30.5 / 87.4 ms with the workers niced, 226.1 / 53.8 / 334.3 ms
without.

Linux keeps a nice value per thread (``setpriority(PRIO_PROCESS, tid)``, documented in
``sched(7)``), and raising one's own needs no privilege. Elsewhere the same call would
change the whole process, so it does nothing there.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKGROUND_NICE = 10
MAX_NICE = 19  # the lowest priority a thread can have (sched(7))


def supported() -> bool:
    """Whether a thread can lower its own priority alone (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "setpriority")


def thread_nice(native_id: int | None = None) -> int:
    """The niceness of a thread (``threading.get_native_id()``; the caller's when None)."""
    return os.getpriority(os.PRIO_PROCESS, native_id or threading.get_native_id())


def checked(by: int) -> int:
    """``by`` if it is a niceness step a thread can take (0 to ``MAX_NICE``)."""
    if not 0 <= by <= MAX_NICE:
        raise ValueError(f"background_nice {by}: use 0 (background threads at the API's "
                         f"priority) to {MAX_NICE} (the lowest)")
    return by


def lower_this_thread(by: int) -> int | None:
    """Run the calling thread ``by`` niceness levels above the process's (at most
    ``MAX_NICE``); a thread already that low or lower is left as it is, so calling twice
    changes nothing. Returns the thread's niceness, or None where threads cannot be
    niced alone (not Linux) or ``by`` is 0."""
    if checked(by) == 0 or not supported():
        return None
    target = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, os.getpid()) + by)
    tid = threading.get_native_id()
    if thread_nice(tid) < target:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        except OSError as exc:  # a sandbox that forbids it: run, at the same priority
            log.warning("priority.unchanged thread=%s error=%s",
                        threading.current_thread().name, exc)
    return thread_nice(tid)


def niced_call(fn: Callable[[], T], by: int) -> T:
    """``fn()`` run on a short-lived thread ``by`` niceness levels below the caller
    (``lower_this_thread``), waited for; its result returned, its exception raised here.
    Threads ``fn`` starts keep that priority after it returns: ``serve`` opens its
    database this way so that DuckDB's workers run niced."""
    checked(by)
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        lower_this_thread(by)
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=run, name="fleetcare-niced-call")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]
