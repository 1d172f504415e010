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


@contextlib.contextmanager
def service_lock(folder: Path, service: str) -> Iterator[None]:
    with open(folder / f"fleetcare-{service}.lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def kafka_script(name: str) -> None:
    """deploy/kafka/start.sh or stop.sh (both idempotent); a failure fails the test."""
    proc = subprocess.run([str(ROOT / "deploy" / "kafka" / name)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        pytest.fail(f"deploy/kafka/{name} failed (exit {proc.returncode}):\n{proc.stderr}")
