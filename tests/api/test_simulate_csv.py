"""``fleetcare simulate --incidents-only --incidents-csv`` → ``fleetcare incident import
--csv``: every simulated incident survives the trip (subprocess, as a user runs it)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from fleetcare.collectors.sim import FleetSpec, plan_incidents, simulate_incidents
from fleetcare.pipeline.incident_import import CSV_COLUMNS, parse_csv, write_csv
from fleetcare.pipeline.store import Store

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETCARE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_simulated_incidents_csv_imports_every_row(tmp_path: Path) -> None:
    csv_path = tmp_path / "sim" / "incidents.csv"
    out = run("simulate", "--nodes", "40", "--days", "60", "--seed", "7", "--failure-scale", "4",
              "--incidents-only", "--incidents-csv", str(csv_path), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    expected = plan_incidents(simulate_incidents(FleetSpec(nodes=40, seed=7, failure_scale=4),
                                                 60))
    kinds = {k: sum(1 for i in expected if i.kind == k) for k in ("failure", "repair")}
    assert kinds["failure"] == doc["incidents"]["total"] and kinds["repair"] > 0
    assert doc["incidents_csv"] == {"path": str(csv_path), "rows": len(expected)}
    text = csv_path.read_text()
    assert text.splitlines()[0] == ",".join(CSV_COLUMNS)
    found = parse_csv(text, source_name=str(csv_path))
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert (got.ts, got.node, got.gpu_uuid, got.kind, got.cause, got.mode) == (
            want.ts, want.node, want.gpu_uuid, want.kind, want.cause, want.mode)
        assert got.source == "csv" and got.note is not None
        assert got.note.startswith("simulated seed=7")
        if want.xid is not None:
            assert f"xid {want.xid}" in got.note

    db = str(tmp_path / "f.duckdb")
    Store(db).close()
    out = run("incident", "import", "--csv", str(csv_path), "--db", db, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"read": len(expected), "added": len(expected),
                                      "duplicates": 0, "skipped": 0}


def test_plain_output_names_the_csv(tmp_path: Path) -> None:
    csv_path = tmp_path / "inc.csv"
    out = run("simulate", "--nodes", "8", "--days", "10", "--seed", "1", "--incidents-only",
              "--incidents-csv", str(csv_path))
    assert out.returncode == 0, out.stderr
    rows = len(csv_path.read_text().splitlines()) - 1
    assert f"wrote {rows:,} incidents (failures and repairs, simulated) to {csv_path}" in (
        out.stdout)


def test_write_csv_round_trips_awkward_notes() -> None:
    from fleetcare.collectors.contract import Incident
    from fleetcare.pipeline.incidents import parse_time

    inc = [Incident(ts=parse_time("2026-02-01T10:00:00.5Z"), node="n,1", kind="rma",
                    cause="other", source="operator", note='said "a, b"\nthen left'),
           Incident(ts=parse_time("2026-02-01T11:00:00Z"), node="n2", kind="failure",
                    cause="faulty_gpu", source="xid", gpu_uuid="GPU-2", mode="pcie", xid=79)]
    buf = io.StringIO()
    assert write_csv(inc, buf) == 2
    back = parse_csv(buf.getvalue())
    assert [(b.ts, b.node, b.kind, b.cause, b.gpu_uuid, b.mode, b.note) for b in back] == [
        (inc[0].ts, "n,1", "rma", "other", None, None, 'said "a, b"\nthen left'),
        (inc[1].ts, "n2", "failure", "faulty_gpu", "GPU-2", "pcie", "xid 79")]


def test_trace_repeats_flag_draws_the_opt_in_process(tmp_path: Path) -> None:
    from fleetcare.collectors.sim.incidents import TRACE_REPEATS

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    base = ["simulate", "--nodes", "50", "--days", "90", "--seed", "2", "--incidents-only"]
    assert run(*base, "--incidents-csv", str(a)).returncode == 0
    out = run(*base, "--trace-repeats", "--incidents-csv", str(b))
    assert out.returncode == 0, out.stderr
    want = plan_incidents(simulate_incidents(FleetSpec(nodes=50, seed=2, **TRACE_REPEATS), 90))
    got = parse_csv(b.read_text())
    assert [(g.ts, g.node, g.kind) for g in got] == [(w.ts, w.node, w.kind) for w in want]
    assert a.read_text() != b.read_text()


def test_trace_repairs_flag_draws_the_trace_repair_times(tmp_path: Path) -> None:
    from fleetcare.collectors.sim.incidents import TRACE_FAULTS

    out_csv = tmp_path / "f.csv"
    out = run("simulate", "--nodes", "50", "--days", "90", "--seed", "2", "--incidents-only",
              "--trace-repairs", "--incidents-csv", str(out_csv))
    assert out.returncode == 0, out.stderr
    want = plan_incidents(simulate_incidents(FleetSpec(nodes=50, seed=2, **TRACE_FAULTS), 90))
    got = parse_csv(out_csv.read_text())
    assert [(g.ts, g.node, g.kind) for g in got] == [(w.ts, w.node, w.kind) for w in want]
