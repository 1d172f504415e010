"""Drains against a real Slurm cluster: Debian's slurmctld + four slurmd (gpu01..gpu04)
on 127.0.0.1, started by deploy/slurm/start.sh (idempotent; installs the packages when
missing, so the first run needs root or sudo and Debian's archive)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcare.api.cli import main
from fleetcare.api.drains import BreakerPolicy, DrainController
from fleetcare.api.drains.audit import AuditLog
from fleetcare.api.drains.slurm import SlurmDrainer
from fleetcare.models.goodput import CostModel
from fleetcare.models.scoring import ensure_schema
from fleetcare.pipeline.store import Store

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
T = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
HBM = ["GPU 3: HBM uncorrectable ECC errors 40x the fleet median"]


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip("deploy/slurm/start.sh needs root (or sudo) to install and run Slurm")
    res = subprocess.run(["sh", str(ROOT / "deploy/slurm/start.sh")], capture_output=True,
                         text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"deploy/slurm/start.sh failed:\n{res.stdout}\n{res.stderr}")
    # start.sh's folder: $FLEETCARE_SLURM_DIR (a cluster another checkout started) or ours
    return str(Path(os.environ.get("FLEETCARE_SLURM_DIR", ROOT / "var/slurm")) / "slurm.conf")


def states() -> dict[str, tuple[str, str]]:
    """sinfo -N -o "%N %T %E": node → (state, reason)."""
    out = {}
    for line in sh("sinfo", "-N", "-h", "-o", "%N %T %E").splitlines():
        node, state, reason = line.split(" ", 2)
        out[node] = (state, reason)
    return out


@pytest.fixture
def cluster(slurm_conf: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every node idle before and after each test."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)

    def reset() -> None:
        for node, (state, _) in states().items():
            if "drain" in state or state.startswith("down"):
                sh("scontrol", "update", f"NodeName={node}", "State=RESUME")
        deadline = time.monotonic() + 30
        while any(s != "idle" for s, _ in states().values()):
            assert time.monotonic() < deadline, f"nodes not idle: {states()}"
            time.sleep(0.2)

    reset()
    yield
    reset()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "fleet.duckdb")
    yield s
    s.close()


def put_scores(store: Store, ts: dt.datetime, risks: dict[str, float]) -> None:
    ensure_schema(store)
    for node, risk in risks.items():
        store.cursor().execute("INSERT INTO node_scores VALUES (?, ?, ?, ?, ?, ?)",
                               [ts, node, risk, json.dumps(HBM), f"GPU-{node}-3", "m1"])


def test_fleetcare_drain_execute_shows_in_scontrol_and_sinfo(
        cluster: None, db: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put_scores(db, T, {"gpu01": 0.83, "gpu02": 0.001, "gpu03": 0.002, "gpu04": 0.001})
    db.close()
    assert main(["drain", "--db", str(tmp_path / "fleet.duckdb"), "--execute", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(d["node"], d["action"], d["result"]) for d in report["decisions"]] == [
        ("gpu01", "drain", "ok")]
    reason = "fleetcare: risk 0.83, GPU 3: HBM uncorrectable ECC errors 40x the fleet median"
    show = sh("scontrol", "show", "node", "gpu01")
    assert "State=IDLE+DRAIN " in show
    assert f"Reason={reason} [" in show  # Slurm appends [user@time]
    assert states() == {"gpu01": ("drained", reason), "gpu02": ("idle", "none"),
                        "gpu03": ("idle", "none"), "gpu04": ("idle", "none")}
    assert main(["drain", "audit", "--db", str(tmp_path / "fleet.duckdb"), "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert [(a["node"], a["action"], a["actor"], a["dry_run"], a["result"], a["reason"])
            for a in audit] == [("gpu01", "drain", "fleetcare", False, "ok", reason)]


def test_resume_after_risk_falls_and_an_operator_clears(cluster: None, db: Store) -> None:
    ctl = DrainController(db, SlurmDrainer(), CostModel(), dry_run=False)
    put_scores(db, T, {"gpu01": 0.001, "gpu02": 0.9, "gpu03": 0.001, "gpu04": 0.001})
    assert ctl.run_once(T).by_action("drain") == ["gpu02"]
    assert states()["gpu02"][0] == "drained"
    later = T + dt.timedelta(hours=2)
    put_scores(db, later, {n: 0.001 for n in NODES})
    assert ctl.run_once(later).by_action("hold") == ["gpu02"]  # risk fell, nobody cleared
    assert states()["gpu02"][0] == "drained"
    out = ctl.clear("gpu02", actor="alice", note="reseated GPU 3", now=later)
    assert [(d.action, d.result) for d in out] == [("clear", "ok"), ("resume", "ok")]
    deadline = time.monotonic() + 30
    while states()["gpu02"] != ("idle", "none"):  # Slurm pings the node back in
        assert time.monotonic() < deadline, states()
        time.sleep(0.2)
    assert [(r.action, r.actor) for r in AuditLog(db).rows(node="gpu02")] == [
        ("resume", "alice"), ("clear", "alice"), ("drain", "fleetcare")]


def test_circuit_breaker_stops_a_burst_and_survives_a_restart(cluster: None,
                                                              db: Store) -> None:
    put_scores(db, T, {"gpu01": 0.9, "gpu02": 0.8, "gpu03": 0.7, "gpu04": 0.001})
    policy = BreakerPolicy(max_nodes=1)
    r = DrainController(db, SlurmDrainer(), breaker=policy, dry_run=False).run_once(T)
    assert (r.by_action("drain"), r.by_action("refuse")) == (["gpu01"], ["gpu02", "gpu03"])
    assert "refused: circuit breaker: 1 drain(s) per 1 h" in r.decisions[1].result
    assert {n: s for n, (s, _) in states().items()} == {
        "gpu01": "drained", "gpu02": "idle", "gpu03": "idle", "gpu04": "idle"}
    refused = [(a.node, a.action, a.dry_run) for a in AuditLog(db).rows()
               if a.action == "refuse"]
    assert refused == [("gpu03", "refuse", False), ("gpu02", "refuse", False)]
    # a new controller (fleetcare restarted) still sees the hour's budget used ...
    soon = T + dt.timedelta(minutes=30)
    r = DrainController(db, SlurmDrainer(), breaker=policy, dry_run=False).run_once(soon)
    assert r.by_action("drain") == [] and states()["gpu02"][0] == "idle"
    # ... and drains the next one once the hour has passed
    later = T + dt.timedelta(minutes=61)
    put_scores(db, later, {"gpu01": 0.9, "gpu02": 0.8, "gpu03": 0.7, "gpu04": 0.001})
    r = DrainController(db, SlurmDrainer(), breaker=policy, dry_run=False).run_once(later)
    assert r.by_action("drain") == ["gpu02"] and states()["gpu02"][0] == "drained"


def test_dry_run_changes_nothing(cluster: None, db: Store, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    put_scores(db, T, {"gpu01": 0.9, "gpu02": 0.8, "gpu03": 0.001, "gpu04": 0.001})
    db.close()
    assert main(["drain", "--db", str(tmp_path / "fleet.duckdb"), "--max-per-hour", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DRY RUN: nothing changed; scheduler slurm; 4 nodes scored")
    assert "drain     gpu01" in out and "dry-run" in out
    assert {s for s, _ in states().values()} == {"idle"}
    with Store(tmp_path / "fleet.duckdb") as s:
        assert AuditLog(s).active() == {}
        # 5 % of 4 nodes rounds to 0, so the breaker allows its minimum of 1: dry runs
        # show the refusals a real run would make
        assert {(a.node, a.action, a.dry_run, a.result) for a in AuditLog(s).rows()} == {
            ("gpu01", "drain", True, "dry-run"),
            ("gpu02", "refuse", True, "refused: circuit breaker: 1 drain(s) per 1 h for a "
                                      "fleet of 4 nodes, 1 used")}


def test_never_acts_on_a_node_someone_else_drained(cluster: None, db: Store) -> None:
    sh("scontrol", "update", "NodeName=gpu04", "State=DRAIN", "Reason=bad fan, ticket 4711")
    put_scores(db, T, {"gpu01": 0.001, "gpu02": 0.001, "gpu03": 0.001, "gpu04": 0.95})
    r = DrainController(db, SlurmDrainer(), dry_run=False).run_once(T)
    assert [(d.node, d.action) for d in r.decisions] == [("gpu04", "skip")]
    assert r.decisions[0].result == ("refused: node is drained in the scheduler (IDLE+DRAIN), "
                                     "reason: bad fan, ticket 4711")
    assert states()["gpu04"] == ("drained", "bad fan, ticket 4711")


def test_scontrol_errors_are_clear(cluster: None) -> None:
    from fleetcare.api.drains import DrainerError

    d = SlurmDrainer()
    assert d.state("gpu99").state == "unknown"
    with pytest.raises(DrainerError, match=r"failed \(exit 1\).*Invalid node name.*sinfo -N"):
        d.drain("gpu99", "fleetcare: test")
    with pytest.raises(DrainerError, match="not found: install Slurm's client"):
        SlurmDrainer(scontrol="/nonexistent/scontrol").state("gpu01")
