"""``fleetcare incident`` and ``fleetcare retention`` run as a user would (subprocess)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from fleetcare.collectors.contract import XidEvent
from fleetcare.pipeline.store import Store

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]
FIXTURES = Path(__file__).parents[1] / "pipeline" / "fixtures" / "slurm"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETCARE, *args], capture_output=True, text=True, timeout=120,
                          input=stdin, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_incident_commands(tmp_path: Path) -> None:
    db = str(tmp_path / "f.duckdb")
    with Store(db) as s:
        s.insert_events([XidEvent(ts=dt.datetime(2025, 3, 1, tzinfo=dt.UTC), node="n9", xid=48,
                                  message="DBE", source="kernel-log", gpu_uuid="G9")])
    out = run("incident", "add", "n1", "--gpu", "GPU-1", "--cause", "gpu_hbm3_memory",
              "--at", "2025-03-01T10:00:00Z", "--note", "DBE seen by ops", "--db", db, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["added"] == 1
    bad = run("incident", "add", "n1", "--cause", "gremlins", "--at", "now", "--db", db)
    assert bad.returncode == 1
    assert "cause 'gremlins' is unknown; valid causes: faulty_gpu" in bad.stderr
    out = run("incident", "import", "--slurm-events", "-", "--db", db, "--json",
              stdin=(FIXTURES / "sacctmgr_show_event.txt").read_text())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"read": 5, "added": 5, "duplicates": 0, "skipped": 2}
    out = run("incident", "import", "--slurm-events", str(FIXTURES / "sacctmgr_show_event_P.txt"),
              "--db", db, "--json")
    assert json.loads(out.stdout)["duplicates"] == 5          # same events, other format
    csv = tmp_path / "inc.csv"
    csv.write_text("ts,node,gpu_uuid,kind,cause,mode,note\n"
                   "2025-03-02T00:00:00Z,n1,GPU-1,rma,gpu_hbm3_memory,,RMA opened\n"
                   "bad,n1,,failure,faulty_gpu,,\n")
    out = run("incident", "import", "--csv", str(csv), "--db", db)
    assert out.returncode == 1
    assert "line 3: time 'bad' is not ISO-8601" in out.stderr
    assert "nothing imported" in out.stderr
    out = run("incident", "derive", "--db", db, "--json")
    assert json.loads(out.stdout) == {"added": 1}
    out = run("incident", "list", "--db", db, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 7
    assert {r["source"] for r in rows} == {"operator", "slurm", "xid"}
    op = next(r for r in rows if r["source"] == "operator")
    assert op == {"ts": "2025-03-01T10:00:00Z", "node": "n1", "kind": "failure",
                  "cause": "gpu_hbm3_memory", "source": "operator", "gpu_uuid": "GPU-1",
                  "mode": None, "xid": None, "note": "DBE seen by ops"}


def test_retention_command(tmp_path: Path) -> None:
    db = str(tmp_path / "f.duckdb")
    Store(db).close()
    out = run("retention", "apply", "--db", db, "--keep-raw", "30d", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["deleted"], doc["dry_run"], doc["held_back_by"]) == (0, True, "rollup")
    out = run("retention", "apply", "--db", db, "--keep-raw", "soon")
    assert out.returncode == 1 and "--keep-raw" in out.stderr
