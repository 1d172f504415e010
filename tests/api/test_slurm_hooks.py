"""deploy/slurm/fleetcare-healthcheck and fleetcare-prolog on the real Slurm test cluster
(deploy/slurm: slurmctld + gpu01..gpu04 on this host), asking a real fleetcare API on
loopback (auth on, a read token from a file) about their node. Run as Slurm would run
them: the script itself (its shebang, the system python3), settings from a config file,
the node from SLURMD_NODENAME. Every node is resumed afterwards."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_drains_slurm import cluster, sh, slurm_conf, states  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("cluster")]  # every node idle

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "slurm" / "fleetcare-healthcheck"
PROLOG = ROOT / "deploy" / "slurm" / "fleetcare-prolog"
HBM = ["GPU 3: HBM uncorrectable ECC errors 40x the fleet median", "GPU 3: 2 rows remapped"]
IDLE = ("idle", "none")


def hook(script: Path, node: str, config: Path,
         **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCARE_")}
    environ.update(SLURMD_NODENAME=node, FLEETCARE_HOOK_CONFIG=str(config), **env)
    started = time.monotonic()
    res = subprocess.run([str(script)], env=environ, capture_output=True, text=True,
                         timeout=60)
    return res, time.monotonic() - started


def write_config(tmp_path: Path, api: str, token: str, **extra: str) -> Path:
    (tmp_path / "token").write_text(token + "\n")
    config = tmp_path / "slurm-hooks.conf"
    lines = [f"FLEETCARE_API={api}", f"FLEETCARE_TOKEN_FILE={tmp_path / 'token'}",
             "FLEETCARE_DRAIN_THRESHOLD=0.5  # drain at or above"]
    config.write_text("\n".join(lines + [f"{k}={v}" for k, v in extra.items()]) + "\n")
    return config


@pytest.fixture
def resumed() -> Iterator[list[str]]:
    """Nodes a test drained, resumed in any case when it ends."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        if "drain" in states().get(node, ("", ""))[0]:
            sh("scontrol", "update", f"NodeName={node}", "State=RESUME")


@pytest.fixture
def api(store, fleet, serve_app, tokens, tmp_path: Path) -> Path:
    """A fleetcare API (auth on) holding fresh and stale scores; the hooks' config file."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    fleet.node_score("gpu01", 0.95, ts=now, reasons=HBM)
    fleet.node_score("gpu02", 0.91, ts=now, reasons=HBM)
    fleet.node_score("gpu03", 0.05, ts=now)
    fleet.node_score("gpu04", 0.97, ts=now - dt.timedelta(hours=3), reasons=HBM)  # stale
    client = serve_app(store, auth=True)
    return write_config(tmp_path, str(client.base_url), tokens("read"))


def test_healthcheck_drains_its_node_above_the_threshold_and_only_then(
        api: Path, resumed: list[str]) -> None:
    resumed.append("gpu02")
    res, _ = hook(HEALTHCHECK, "gpu02", api)
    reason = ("fleetcare: risk 0.91 (healthcheck), GPU 3: HBM uncorrectable ECC errors 40x "
              "the fleet median; GPU 3: 2 rows remapped")
    assert (res.returncode, res.stdout, res.stderr) == (
        0, f"fleetcare-healthcheck: gpu02 risk 0.91 >= 0.50: drained ({reason})\n", "")
    show = sh("scontrol", "show", "node", "gpu02")
    assert "State=IDLE+DRAIN " in show and f"Reason={reason} [" in show
    assert states() == {"gpu01": IDLE, "gpu02": ("drained", reason), "gpu03": IDLE,
                        "gpu04": IDLE}
    # again: left as it is (a drained node's reason is never overwritten)
    res, _ = hook(HEALTHCHECK, "gpu02", api)
    assert (res.returncode, res.stdout) == (0, (
        "fleetcare-healthcheck: gpu02 risk 0.91 >= 0.50, but Slurm already shows it "
        "IDLE+DRAIN: left as it is\n"))
    # low risk: nothing; a high but stale score: nothing either
    res, _ = hook(HEALTHCHECK, "gpu03", api)
    assert (res.returncode, res.stdout) == (0, "fleetcare-healthcheck: gpu03 risk 0.05 < "
                                               "0.50: ok\n")
    res, _ = hook(HEALTHCHECK, "gpu04", api)
    assert res.returncode == 0 and res.stdout == ""
    assert "gpu04's score is stale" in res.stderr and "not acting on old news" in res.stderr
    assert states() == {"gpu01": IDLE, "gpu02": ("drained", reason), "gpu03": IDLE,
                        "gpu04": IDLE}


def test_healthcheck_does_nothing_and_exits_0_quickly_when_the_api_is_down(
        tmp_path: Path, resumed: list[str]) -> None:
    resumed.append("gpu01")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once this closes
    res, took = hook(HEALTHCHECK, "gpu01",
                     write_config(tmp_path, f"http://127.0.0.1:{closed}", "t0ken"))
    assert res.returncode == 0 and took < 3, took
    assert "did not answer (URLError: <urlopen error [Errno 111] Connection refused>)" in (
        res.stderr)
    # an API that accepts the connection and never answers: cut at the timeout
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        res, took = hook(HEALTHCHECK, "gpu01", write_config(
            tmp_path, f"http://127.0.0.1:{port}", "t0ken", FLEETCARE_TIMEOUT="1"))
    assert res.returncode == 0 and 1 <= took < 4, took
    assert "did not answer (TimeoutError: timed out)" in res.stderr
    assert states() == dict.fromkeys(("gpu01", "gpu02", "gpu03", "gpu04"), IDLE)


def test_prolog_drains_and_lets_the_job_start_unless_told_to_refuse_it(
        api: Path, tmp_path: Path, resumed: list[str]) -> None:
    resumed.extend(["gpu01", "gpu02"])
    res, _ = hook(PROLOG, "gpu01", api)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("fleetcare-prolog: gpu01 risk 0.95 >= 0.50: drained "
                                 "(fleetcare: risk 0.95 (prolog), GPU 3: HBM")
    res, _ = hook(PROLOG, "gpu02", api, FLEETCARE_PROLOG_REFUSE="1")
    assert res.returncode == 1, res.stderr  # Slurm requeues the job
    assert {n: s for n, (s, _) in states().items()} == {
        "gpu01": "drained", "gpu02": "drained", "gpu03": "idle", "gpu04": "idle"}
    assert states()["gpu02"][1].startswith("fleetcare: risk 0.91 (prolog), GPU 3: HBM")
    # the API down: the job starts (fail open), even with refuse set
    (tmp_path / "down").mkdir()
    res, took = hook(PROLOG, "gpu03", write_config(tmp_path / "down", "http://127.0.0.1:9",
                                                   "t0ken"), FLEETCARE_PROLOG_REFUSE="1")
    assert res.returncode == 0 and took < 3 and "did not answer" in res.stderr
    assert states()["gpu03"] == IDLE
