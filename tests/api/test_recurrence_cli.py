"""``fleetcare recurrence`` run as a user would (subprocess): incidents imported from a
CSV, nodes ranked by the risk of failing again, only what was known at --at."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]
CSV = """ts,node,gpu_uuid,kind,cause,mode,note
2026-01-05T00:00:00Z,lemon,,failure,gpu_hbm3_memory,,DBE
2026-01-06T00:00:00Z,lemon,,repair,gpu_hbm3_memory,,swapped
2026-01-25T00:00:00Z,lemon,,failure,faulty_gpu,,"GPU lost, again"
2026-01-26T00:00:00Z,lemon,,repair,faulty_gpu,,reseated
2025-10-01T00:00:00Z,old,,failure,nic,,link down
2025-10-01T12:00:00Z,old,,repair,nic,,
2026-01-20T00:00:00Z,fixed,,repair,other,,firmware update; no failure on record
2026-02-10T00:00:00Z,future,,failure,unknown,,after --at
"""


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETCARE, *args], capture_output=True, text=True, timeout=120,
                          input=stdin, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_recurrence_ranks_repeat_offenders_from_imported_history(tmp_path: Path) -> None:
    # a new customer's first step: tickets into a database that does not exist yet
    db = str(tmp_path / "new" / "f.duckdb")
    out = run("incident", "import", "--csv", "-", "--db", db, "--json", stdin=CSV)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["added"] == 8
    assert out.stderr.strip() == f"fleetcare incident: created database {db}"
    again = run("incident", "import", "--csv", "-", "--db", db, "--json", stdin=CSV)
    assert json.loads(again.stdout)["duplicates"] == 8 and "created" not in again.stderr
    out = run("recurrence", "--db", db, "--at", "2026-02-01T00:00:00Z", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["at"] == "2026-02-01T00:00:00Z" and doc["model"]["id"].startswith("recurrence-")
    assert "real" in doc["model"]["data"]
    by = {n["node"]: n for n in doc["nodes"]}
    assert set(by) == {"lemon", "old", "fixed"}  # "future" was not known at --at
    assert doc["nodes"][0]["node"] == "lemon"  # twice in 30 days, a week ago
    assert by["lemon"]["risk_7d"] > max(by["old"]["risk_7d"], by["fixed"]["risk_7d"])
    assert by["lemon"]["reasons"][0] == "last failed 7 days ago (gpu)"
    assert "failed 2 times in the last 30 days" in by["lemon"]["reasons"]
    assert by["old"]["reasons"][0] == "last failed 123 days ago (network)"
    assert by["fixed"]["reasons"] == ["no failure on record"]  # a repair is not a failure
    text = run("recurrence", "--db", db, "--at", "2026-02-01T00:00:00Z", "--limit", "1")
    assert text.returncode == 0 and text.stdout.splitlines()[0].startswith("lemon")
    assert "risk of a failure within 7 days" in text.stdout


def test_recurrence_errors_are_one_line(tmp_path: Path) -> None:
    missing = run("recurrence", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode != 0 and "does not exist" in missing.stderr
    assert "fleetcare incident import --csv FILE --db" in missing.stderr
    assert not (tmp_path / "none.duckdb").exists()
    bad_csv = run("incident", "import", "--csv", "-", "--db", str(tmp_path / "none.duckdb"),
                  stdin="ts,node\n2026-01-05T00:00:00Z,a\n")
    assert bad_csv.returncode == 1 and "nothing imported" in bad_csv.stderr
    assert "Traceback" not in bad_csv.stderr
    assert not (tmp_path / "none.duckdb").exists()  # a refused import creates nothing
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    db = str(tmp_path / "f.duckdb")
    assert run("simulate", "--db", db, "--nodes", "1", "--days", "1").returncode == 0
    bad = run("recurrence", "--db", db, "--at", "yesterday-ish")
    assert bad.returncode != 0 and "--at" in bad.stderr and "ISO-8601" in bad.stderr
    assert "Traceback" not in bad.stderr
