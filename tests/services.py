"""The real services the suite shares (a Kafka broker, a Slurm cluster), and the locks
that keep test modules on different pytest-xdist workers from breaking each other's use
of them: one module at a time uses the broker (one of them stops it for an outage, and the
others were written against a broker that serves one test at a time, as in a sequential
run), and one module at a time drains Slurm nodes. The locks are ``flock`` on files in the
run's temporary root, which every worker of one run shares."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KAFKA_URL = "kafka://127.0.0.1:9092"


_HELD: dict[str, int] = {}
"""Services whose lock this process holds, and how many times it took it: a module holds
its lock when a session fixture (kafka_broker, first asked for by one of its tests) asks
for it again, and a second ``flock`` on a new descriptor would wait for the first."""


@contextlib.contextmanager
def service_lock(folder: Path, service: str) -> Iterator[None]:
    if _HELD.get(service):
        _HELD[service] += 1
        try:
            yield
        finally:
            _HELD[service] -= 1
        return
    with open(folder / f"fleetcare-{service}.lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _HELD[service] = 1
        try:
            yield
        finally:
            _HELD[service] = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def kafka_script(name: str) -> None:
    """deploy/kafka/start.sh or stop.sh (both idempotent); a failure fails the test."""
    proc = subprocess.run([str(ROOT / "deploy" / "kafka" / name)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        pytest.fail(f"deploy/kafka/{name} failed (exit {proc.returncode}):\n{proc.stderr}")
