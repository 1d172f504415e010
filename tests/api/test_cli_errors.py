"""Issue 13: every expected failure of the CLI is one line on stderr — what is wrong and how
to fix it — with exit 1 (operational) or 2 (usage), never a traceback. Each case runs as a
user would, in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcare.pipeline.store import Quarantined, Store

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]
AGENT = [sys.executable, "-m", "fleetcare.collectors.cli"]


def run(*args: str, cmd: list[str] = FLEETCARE, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def one_line(out: subprocess.CompletedProcess[str], code: int, prefix: str) -> str:
    """The single stderr line of a failed command (no traceback), checked."""
    assert out.returncode == code, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-errors")
    Store(d / "empty.duckdb").close()
    out = run("simulate", "--nodes", "2", "--days", "4", "--seed", "1", "--failure-scale", "0",
              "--interval", "30m", "--db", str(d / "healthy.duckdb"), "--json")
    assert out.returncode == 0, out.stderr
    (d / "notes.duckdb").write_text("these are my notes, not a database\n")
    with Store(d / "quarantine.duckdb") as store:
        store.quarantine_many([Quarantined(f"fleetcare.telemetry/0@{i}", "not a batch", b"x",
                                           "undecodable") for i in range(3000)])
    return {p.stem: p for p in d.glob("*.duckdb")}


def test_train_on_an_empty_database(dbs: dict[str, Path]) -> None:
    line = one_line(run("train", "--db", str(dbs["empty"])), 1, "fleetcare train: ")
    assert "no telemetry to train on" in line and "fleetcare simulate --db" in line


def test_train_on_a_database_without_failures(dbs: dict[str, Path]) -> None:
    """Issue 12 and 13: how many failures it saw, about how many it needs, who scores."""
    line = one_line(run("train", "--db", str(dbs["healthy"])), 1, "fleetcare train: ")
    assert line.startswith("fleetcare train: 0 failures in this fleet's history (0 in the "
                           "training period, 0 in calibration): a model of its own needs "
                           "about 30 in training")
    assert "the fleet prior" in line


def test_score_without_a_model_of_its_own_uses_the_fleet_prior(dbs: dict[str, Path]) -> None:
    """Was (issue 13): a traceback whose hint named Python functions. Since issue 12 a
    fleet without a model of its own is scored by the fleet prior, and says so; the
    one-line error for an installation without a prior is in tests/models/test_prior.py."""
    out = run("score", "--db", str(dbs["healthy"]), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["origin"] == "prior" and doc["model_id"].startswith("prior-")
    text = run("score", "--db", str(dbs["healthy"]))
    assert f"scored with {doc['model_id']} (prior: fleet prior:" in text.stdout
    # and which operating point its figures were measured at (issue 12: the hold)
    listed = run("models", "list", "--db", str(dbs["healthy"]))
    assert listed.returncode == 0, listed.stderr
    assert "* its operating point: risk 0.740 held 1 h, or 0.93 at once" in listed.stdout


@pytest.mark.parametrize("command", [
    ["train"], ["score"], ["quarantine", "list"], ["models", "list"], ["tokens", "list"],
    ["alerts", "list"], ["incident", "list"], ["serve", "--port", "0"],
    ["ingest", "--bus", "embedded://{tmp}/bus", "--exit-when-idle", "0.1"],
], ids=lambda c: " ".join(c[:2]))
def test_a_db_that_is_not_duckdb(dbs: dict[str, Path], command: list[str],
                                 tmp_path: Path) -> None:
    """Was: a 21-line double traceback whose hint blamed a second writing process."""
    args = [a.format(tmp=tmp_path) for a in command]
    line = one_line(run(*args, "--db", str(dbs["notes"]), timeout=120), 1,
                    f"fleetcare {command[0]}: ")
    assert f"{dbs['notes']}: is not a DuckDB database" in line
    assert "writing process" not in line


def test_serve_on_a_port_that_is_not_one(dbs: dict[str, Path]) -> None:
    line = one_line(run("serve", "--db", str(dbs["healthy"]), "--port", "99999"), 2,
                    "fleetcare serve: error: argument --port: 99999 is not a port")
    assert line.endswith("use 1..65535 (0 picks a free one)")


def test_serve_with_a_background_priority_out_of_range(dbs: dict[str, Path]) -> None:
    line = one_line(run("serve", "--db", str(dbs["healthy"]), "--port", "0",
                        env={"FLEETCARE_CLI_BACKGROUND_NICE": "25"}), 2,
                    "fleetcare serve: error: background_nice 25 ")
    assert "FLEETCARE_CLI_BACKGROUND_NICE" in line and "use 0" in line


def test_serve_on_a_port_in_use(dbs: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(run("serve", "--db", str(dbs["healthy"]), "--port", str(port)), 1,
                        "fleetcare serve: ")
    assert f"cannot listen on 127.0.0.1:{port}" in line and "pick another --port" in line


def test_quarantine_list_into_head_ends_quietly(dbs: dict[str, Path]) -> None:
    """Was: BrokenPipeError tracebacks once `head` had its lines."""
    # all 3000 rows: far more than a pipe buffer holds, so the command is still writing when
    # the reader goes (with the default 100 rows it could finish first and exit 0: a race)
    proc = subprocess.Popen([*FLEETCARE, "quarantine", "list", "--db", str(dbs["quarantine"]),
                             "--limit", "3000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 1
    assert first.startswith(b"received_at") and err == ""


def test_parse_dcgm_on_lower_cased_and_on_foreign_pages(tmp_path: Path) -> None:
    """Was: a page whose metric names a relabelling pipeline lower-cased printed nothing and
    exited 0. Lower-cased names are read now; a page with no DCGM field is one line, exit 1."""
    lower = tmp_path / "lower.txt"
    lower.write_text('dcgm_fi_dev_gpu_temp{gpu="0",UUID="GPU-1",Hostname="n1"} 41\n')
    out = run("parse-dcgm", str(lower), cmd=AGENT)
    assert out.returncode == 0 and json.loads(out.stdout)["gpu_temp_c"] == 41.0
    foreign = tmp_path / "foreign.txt"
    foreign.write_text('gpu_temperature_celsius{gpu="0",UUID="GPU-1"} 41\n')
    line = one_line(run("parse-dcgm", str(foreign), cmd=AGENT), 1, "parse-dcgm: ")
    assert "no DCGM field fleetcare maps among 1 series" in line


def test_credentials_in_urls_never_printed(tmp_path: Path) -> None:
    line = one_line(run("ingest", "--bus", "kafka://user:s3cret@127.0.0.1:9", "--db",
                        str(tmp_path / "f.duckdb")), 2, "fleetcare ingest: error: ")
    assert "kafka://user:****@127.0.0.1:9" in line and "s3cret" not in line
    line = one_line(run("backfill", "--prometheus", "http://user:s3cret@127.0.0.1:9/?token=t0k3n",
                        "--since", "1h", "--db", str(tmp_path / "b.duckdb")), 1,
                    "fleetcare backfill: ")
    assert "http://user:****@127.0.0.1:9" in line
    assert "s3cret" not in line and "t0k3n" not in line


def test_a_bad_log_level_is_a_usage_error(dbs: dict[str, Path]) -> None:
    one_line(run("--log-level", "loud", "score", "--db", str(dbs["healthy"])), 2,
             "fleetcare: error: --log-level 'loud' is not one of debug, info, warning, error")


def test_a_duckdb_memory_limit_that_is_not_a_size(dbs: dict[str, Path]) -> None:
    line = one_line(run("train", "--db", str(dbs["healthy"]),
                        env={"FLEETCARE_CLI_DUCKDB_MEMORY": "lots"}), 1, "fleetcare train: ")
    assert "DuckDB memory limit 'lots' is not a size" in line and "4GB" in line
