"""Readers first: the service's background threads run at a lower CPU priority than the
threads that answer requests.

``serve`` is one process (DuckDB has one writer per file): ingest, scoring and the node
pages' sample memory write and read in threads beside the API's. On a small box they share
two cores with DuckDB's own workers, and a request that arrives while a scoring run writes
waits for a core — most of the API's p99 (``bench/bench_api_load.py``). The background
threads lower their own priority when they start, by ``BACKGROUND_NICE`` niceness levels
above the process's (``[cli] background_nice``, ``FLEETCARE_CLI_BACKGROUND_NICE``; 0 keeps
them equal): when a core is free they run as fast as before; when a request wants it, the
request gets it first. Threads they start afterwards (a model's OpenMP pool) inherit it;
DuckDB's workers, started with the database, do not.

Linux keeps a nice value per thread (``setpriority(PRIO_PROCESS, tid)``, documented in
``sched(7)``), and raising one's own needs no privilege. Elsewhere the same call would
change the whole process, so it does nothing there.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

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
