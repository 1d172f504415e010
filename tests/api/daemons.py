"""Real Prometheus-family daemons on loopback for the tests: Debian's ``prometheus`` and
``prometheus-alertmanager`` (installed by deploy/prometheus/install.sh), each with its own
config and storage under a temporary folder, on a free 127.0.0.1 port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need(*binaries: str) -> None:
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: run deploy/prometheus/install.sh")


@contextmanager
def running(cmd: list[str], url: str, log: Path, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Start ``cmd``, wait until ``url``/-/ready answers 200, yield ``url``; stop it after."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd[0]} did not become ready:\n"
                                       + log.read_text()[-3000:])
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def prometheus(config: str, d: Path) -> Iterator[str]:
    """A private Prometheus with ``config`` (YAML text), storage under ``d``."""
    need("prometheus")
    d.mkdir(parents=True, exist_ok=True)
    (d / "prometheus.yml").write_text(config)
    port = free_port()
    with running(["prometheus", f"--config.file={d / 'prometheus.yml'}",
                  f"--storage.tsdb.path={d / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{port}"],
                 f"http://127.0.0.1:{port}", d / "prometheus.log") as url:
        yield url


@contextmanager
def alertmanager(config: str, d: Path) -> Iterator[str]:
    """A private Alertmanager with ``config`` (YAML text), storage under ``d``; no cluster."""
    need("prometheus-alertmanager")
    d.mkdir(parents=True, exist_ok=True)
    (d / "alertmanager.yml").write_text(config)
    port = free_port()
    with running(["prometheus-alertmanager", f"--config.file={d / 'alertmanager.yml'}",
                  f"--storage.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                  "--cluster.listen-address=", f"--web.external-url=http://127.0.0.1:{port}"],
                 f"http://127.0.0.1:{port}", d / "alertmanager.log") as url:
        yield url
