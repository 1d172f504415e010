"""The ``fleetcare`` CLI contract: exact commands and JSON keys, run as a user would."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleetcare.api.cli import main
from fleetcare.collectors.contract import CAUSES

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]
METRIC_KEYS = {"pr_auc", "recall_at_budget", "false_drains_per_1000_node_days", "median_lead_time_h"}


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*FLEETCARE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_incidents_only_json_contract() -> None:
    out = run("simulate", "--nodes", "2048", "--days", "54", "--seed", "3", "--incidents-only",
              "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"nodes", "gpus", "days", "incidents"}
    assert (doc["nodes"], doc["gpus"], doc["days"]) == (2048, 16384, 54)
    inc = doc["incidents"]
    assert set(inc) == {"total", "gpu_caused", "by_cause"}
    assert set(inc["by_cause"]) == set(CAUSES)
    assert sum(inc["by_cause"].values()) == inc["total"]
    assert inc["gpu_caused"] == sum(n for c, n in inc["by_cause"].items() if CAUSES[c][1])
    assert 419 * 0.85 <= inc["total"] <= 419 * 1.15


def test_usage_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--nodes", "many"])
    assert exc.value.code == 2
    assert "--nodes" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"fleetcare {version('fleetcare-api')} (api ")
    assert f"collectors {version('fleetcare-collectors')}" in out


def test_a_mistyped_command_or_choice_gets_did_you_mean(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flag, near in ((["trian"], "COMMAND", "train"),
                             (["evalute"], "COMMAND", "evaluate"),
                             (["drain", "--scheduler", "slurn"], "--scheduler", "slurm")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"argument {flag}: invalid choice: '{argv[-1]}'; did you mean '{near}'?" in err
    with pytest.raises(SystemExit):
        main(["zzzz"])
    err = capsys.readouterr().err
    assert "invalid choice: 'zzzz'" in err and "did you mean" not in err


def test_one_duration_syntax_and_bare_numbers_keep_their_documented_unit(
        capsys: pytest.CaptureFixture[str]) -> None:
    from fleetcare.api.cli import build_parser

    p = build_parser()
    d = p.parse_args(["drain", "--checkpoint-interval", "30m", "--restart-overhead", "2"])
    assert (d.checkpoint_interval, d.restart_overhead) == (0.5, 2.0)  # hours, as documented
    d = p.parse_args(["drain"])
    assert (d.checkpoint_interval, d.restart_overhead, d.review_after) == (1.0, 0.25, 86400.0)
    assert p.parse_args(["serve", "--score-every", "2m"]).score_every == 120.0
    assert p.parse_args(["simulate", "--interval", "5m"]).interval == 300.0
    with pytest.raises(SystemExit) as exc:
        main(["drain", "--checkpoint-interval", "hourly"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --checkpoint-interval: duration 'hourly'" in err
    # a bare number where seconds would be a trap is refused with the fix
    assert main(["train", "--db", "x.duckdb", "--horizon", "24"]) == 1
    assert "--horizon: duration '24' has no unit" in capsys.readouterr().err


def test_serve_logs_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.duckdb"
    assert main(["--log-level", "info", "serve", "--db", str(missing), "--no-auth",
                 "--port", "0", "--log-format", "json"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    doc = json.loads(lines[0])
    assert doc["event"] == "serve.no_auth" and doc["host"] == "127.0.0.1"
    assert doc["level"] == "warning" and doc["logger"] == "fleetcare"
    assert lines[-1].startswith("fleetcare serve: database ")


def test_operational_errors_go_to_stderr_with_exit_1(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.duckdb"
    assert main(["train", "--db", str(missing), "--json"]) == 1
    err = capsys.readouterr().err
    assert f"database {missing} does not exist" in err
    assert "fleetcare simulate --db" in err
    assert main(["simulate", "--nodes", "2", "--model", "B200", "--incidents-only"]) == 1
    assert "GPU model 'B200' is unknown" in capsys.readouterr().err


def test_an_error_nobody_foresaw_says_so_and_how_to_see_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A bug (an exception type no command raises on purpose) is not dressed up as an
    operational error: one line naming its type and the flag that shows the traceback,
    exit 1; with that flag the traceback is logged. Secrets in it stay masked."""
    from fleetcare.api.commands import models as command

    def broken(args: object, cfg: object) -> int:
        return {}["missing"]  # KeyError: a bug

    monkeypatch.setattr(command, "run", broken)
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("fleetcare models: unexpected error (KeyError: 'missing'); rerun "
                          "with --log-level debug for the traceback")
    assert main(["--log-level", "debug", "models", "list"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'return {}["missing"]' in err

    def leaky(args: object, cfg: object) -> int:
        raise RuntimeError("no answer from kafka://app:hunter2@broker:9093")

    monkeypatch.setattr(command, "run", leaky)
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert "unexpected error (RuntimeError" in err and "hunter2" not in err


def test_a_value_error_from_inside_a_library_is_a_bug_not_an_operational_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """fleetcare's own ValueErrors say what is wrong and the fix: one line, as they are.
    One raised inside a library (numpy here) means fleetcare handed it bad data — a bug:
    reported as unexpected, with the flag that shows the traceback."""
    import numpy as np

    from fleetcare.api import priority
    from fleetcare.api.commands import models as command

    def ours(args: object, cfg: object) -> int:
        priority.checked(99)  # fleetcare's own range check
        return 0

    monkeypatch.setattr(command, "run", ours)
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected" not in err and "99" in err

    def library(args: object, cfg: object) -> int:
        np.linspace(0.0, 1.0, -1)  # ValueError raised in numpy's own Python code
        return 0

    monkeypatch.setattr(command, "run", library)
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("fleetcare models: unexpected error (ValueError: ")
    assert "--log-level debug" in err


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("cli") / "fleet.duckdb"
    out = run("simulate", "--nodes", "24", "--days", "12", "--seed", "5", "--failure-scale", "20",
              "--interval", "10m", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["simulated"] is True
    # every GPU every 10 minutes, less the ticks of nodes that were down for repair
    assert 0.9 * 24 * 8 * 12 * 24 * 6 < doc["rows"]["telemetry"] <= 24 * 8 * 12 * 24 * 6
    return db


def test_simulate_writes_history(small_db: Path) -> None:
    import duckdb

    con = duckdb.connect(str(small_db), read_only=True)
    nodes, gpus, lo, hi = con.execute(
        "SELECT count(DISTINCT node), count(DISTINCT gpu_uuid), min(ts), max(ts) FROM telemetry"
    ).fetchone()
    assert (nodes, gpus) == (24, 192)
    assert (hi - lo).total_seconds() == 12 * 86400 - 600
    assert con.execute("SELECT value FROM meta WHERE key = 'data_source'").fetchone() == ("simulated",)
    assert con.execute("SELECT count(*) FROM incidents WHERE kind = 'failure'").fetchone()[0] > 0
    con.close()


def test_train_then_score_json_contract(small_db: Path) -> None:
    out = run("train", "--db", str(small_db), "--horizon", "24h", "--min-failures", "5",
              "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"model_id", "metrics"}
    assert doc["model_id"].startswith("m-")
    assert METRIC_KEYS <= set(doc["metrics"])
    out = run("score", "--db", str(small_db), "--json", "--limit", "3")
    assert out.returncode == 0, out.stderr
    top = json.loads(out.stdout)["top_risk"]
    assert len(top) == 3
    assert [r["risk"] for r in top] == sorted((r["risk"] for r in top), reverse=True)
    assert all(0.0 <= r["risk"] <= 1.0 and isinstance(r["reasons"], list) for r in top)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_answers_over_http(small_db: Path) -> None:
    if run("score", "--db", str(small_db), "--json").returncode != 0:  # needs a model
        assert run("train", "--db", str(small_db), "--min-failures", "5",
                   "--json").returncode == 0
        assert run("score", "--db", str(small_db)).returncode == 0
    port = _free_port()
    proc = subprocess.Popen([*FLEETCARE, "serve", "--db", str(small_db), "--port", str(port),
                             "--no-auth", "--no-event-rescore"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "server did not start in 60 s"
                time.sleep(0.3)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        risk = httpx.get(f"http://127.0.0.1:{port}/v1/risk?limit=5", timeout=10).json()
        assert risk["simulated"] is True
        assert len(risk["nodes"]) == 5
        node = risk["nodes"][0]["node"]
        detail = httpx.get(f"http://127.0.0.1:{port}/v1/nodes/{node}", timeout=10)
        assert detail.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/v1/nodes/nope", timeout=10).status_code == 404
        assert httpx.get(f"http://127.0.0.1:{port}/v1/model", timeout=10).status_code == 200
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert "fleetcare_rescore_on_events 0" in text  # --no-event-rescore below
        assert "fleetcare_event_rescores_total 0" in text
        # kill -USR1: every thread's stack on stderr, and the server serves on
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert "Current thread" in err and "in _score_loop" in err, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


@pytest.mark.slow
def test_demo_once_json_contract(tmp_path: Path) -> None:
    """The documented contract, with its defaults: 64 nodes x 30 days, in under 5 minutes
    (timed here only as a guard; the figure itself is measured in bench/)."""
    import duckdb

    db = tmp_path / "demo.duckdb"
    started = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    out = run("demo", "--once", "--json", "--db", str(db), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    oldest, newest = con.execute("SELECT min(ts), max(ts) FROM telemetry").fetchone()
    # issue 11: the history ends now (the live hour follows it), and the first live
    # rescore's retention kept all of it
    assert abs((oldest + dt.timedelta(days=30) - started).total_seconds()) < 120
    assert dt.timedelta(minutes=55) < newest - started < dt.timedelta(minutes=65)
    # no counter jump at the seam: the live hour shows new NVLink CRC / PCIe replay
    # errors on as few GPUs as a history hour (~1 of 480), not on hundreds
    jumps = con.execute(
        "SELECT count(*) FILTER (WHERE nvlink_crc_flit_inc + nvlink_crc_data_inc > 0), "
        "count(*) FILTER (WHERE pcie_replay_count_inc > 0) FROM telemetry_hourly "
        "WHERE hour >= ?", [started.replace(minute=0, second=0, microsecond=0)]).fetchone()
    con.close()
    assert jumps[0] <= 5 and jumps[1] <= 5, jumps
    doc = json.loads(out.stdout)
    assert {"model", "top_risk", "db"} <= set(doc)
    assert METRIC_KEYS <= set(doc["model"])
    assert doc["db"] == str(db) and db.exists()
    assert doc["simulated"] is True
    assert 1 <= len(doc["top_risk"]) <= 5
    for r in doc["top_risk"]:
        assert set(r) == {"node", "risk", "reasons"}
        assert r["node"].startswith("node-")
        assert 0.0 <= r["risk"] <= 1.0
    assert "SIMULATED" in out.stderr


@pytest.mark.slow
def test_demo_serves_live_until_interrupted(tmp_path: Path) -> None:
    """`fleetcare demo` (serving): live telemetry reaches the API; SIGINT stops it cleanly,
    also when the demo inherited SIGINT ignored, as `fleetcare demo &` from a script does
    (Python then never raises KeyboardInterrupt: the demo ran on after SIGINT, seen when
    `make test` itself ran in the background). Four days of history: too few failures for
    a model of its own, so the shipped prior scores (training has its own tests)."""
    port = _free_port()
    db = tmp_path / "live.duckdb"
    started = dt.datetime.now(dt.UTC).isoformat()[:19]
    proc = subprocess.Popen(
        [*FLEETCARE, "demo", "--db", str(db), "--nodes", "24", "--days", "4", "--seed", "5",
         "--failure-scale", "20", "--history-interval", "10m", "--port", str(port),
         "--speed", "600", "--score-every", "2s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 240
        first = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            first = first or health["latest_telemetry"]
            if health["latest_score"] and health["latest_telemetry"] > first:
                break  # live samples keep arriving after the history
            time.sleep(0.5)
        else:
            pytest.fail("the demo served no live telemetry in 240 s")
        # the history ends when the demo started; live telemetry is later
        assert health["latest_telemetry"] > started
        risk = httpx.get(f"http://127.0.0.1:{port}/v1/risk", timeout=10).json()
        assert risk["simulated"] is True
        assert 20 <= len(risk["nodes"]) <= 24  # a node down for repair reports nothing
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # show where it hangs
            proc.send_signal(signal.SIGUSR1)  # the CLI dumps every thread's stack
            time.sleep(3)
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the demo had not exited 60 s after SIGINT; its threads:\n"
                        f"{err[-8000:]}")
        assert proc.returncode == 0, err[-2000:]
        assert "top at-risk nodes (simulated)" in out
        assert "stop_incomplete" not in err, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_train_prints_progress_and_rounded_metrics(small_db: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, train says what it is doing; its metrics read as people read them,
    while --json keeps full precision (and a script's stderr gets no progress)."""
    import re
    import shutil
    import sys

    db = tmp_path / "fleet.duckdb"
    shutil.copy(small_db, db)
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["train", "--db", str(db), "--min-failures", "5", "--no-promote"]) == 0
    out, err = capsys.readouterr()
    steps = [line for line in err.splitlines() if line.startswith("train: [")]
    assert len(steps) >= 3, err
    assert "rolling up telemetry" in steps[0] and any("labels" in s for s in steps)
    metrics = out.split("held-out metrics:\n", 1)[1]
    assert "pr_auc" in metrics
    long = re.findall(r"\d+\.\d{4,}", metrics)
    assert not long, f"metrics printed with more than 3 decimals: {long}"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main(["train", "--db", str(db), "--min-failures", "5", "--no-promote",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert "train: [" not in err
    full = json.loads(out)["metrics"]
    assert any(isinstance(v, float) and len(repr(v)) > 8 for v in full.values()), full


def test_train_promotes_only_a_better_model(small_db: Path, tmp_path: Path) -> None:
    """Issue 13: this test used to hold whichever way promotion went (no worse model was
    ever offered). Now both ways are offered, with a model provably worse on the held-out
    period: one that scores every row the same (it reads a feature the store does not
    have), planted through the registry on the trained model's own ranges."""
    import shutil

    from fleetcare.models import registry
    from fleetcare.pipeline.store import Store
    from tests.models.test_promotion import _blind_model

    db = tmp_path / "fleet.duckdb"
    shutil.copy(small_db, db)  # the module's database stays as the other tests left it
    out = run("train", "--db", str(db), "--seed", "3", "--min-failures", "5", "--json")
    assert out.returncode == 0, out.stderr
    good = json.loads(out.stdout)["model_id"]
    assert set(json.loads(out.stdout)) == {"model_id", "metrics"}
    assert run("models", "promote", good, "--force", "--db", str(db)).returncode == 0
    with Store(db) as store:
        rec = registry.get(store, good)
        blind = registry.save(store, _blind_model(), train_range=rec.train_range,
                              cal_range=rec.cal_range, test_range=rec.test_range,
                              make_current=False).model_id

    def current() -> str:
        with Store(db) as store:
            cur = registry.current(store)
            assert cur is not None
            return cur.model_id

    # the worse model is offered: refused, with both models' pr_auc on the period
    out = run("models", "promote", blind, "--db", str(db), "--json")
    assert out.returncode == 1, out.stderr
    decision = json.loads(out.stdout)
    assert decision["promoted"] is False and decision["previous_model_id"] == good
    assert decision["new_metrics"]["pr_auc"] < decision["current_metrics"]["pr_auc"]
    assert decision["reason"].startswith(f"{blind} does not beat current {good}")
    assert current() == good

    # the worse model is current (forced): `fleetcare train` offers a better one, promoted
    assert run("models", "promote", blind, "--force", "--db", str(db)).returncode == 0
    out = run("train", "--db", str(db), "--seed", "3", "--min-failures", "5", "--json")
    assert out.returncode == 0, out.stderr
    new_id = json.loads(out.stdout)["model_id"]
    line = next(x for x in out.stderr.splitlines() if x.startswith("fleetcare train: "))
    assert line.startswith(f"fleetcare train: {new_id} beats current {blind}"), line
    assert current() == new_id


def test_serve_on_a_database_another_process_holds_is_one_line(tmp_path: Path) -> None:
    """Issue 11: `ingest --db` and `serve --db` side by side printed DuckDB's lock error as
    a traceback. One line now, naming the fix (ingest inside serve, or the lake)."""
    db = tmp_path / "f.duckdb"
    holder = subprocess.Popen([*FLEETCARE, "ingest", "--bus", f"embedded://{tmp_path / 'bus'}",
                               "--db", str(db)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not db.exists():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.1)
        time.sleep(1.0)
        out = run("serve", "--db", str(db), "--no-auth", "--port", str(_free_port()),
                  timeout=60)
    finally:
        holder.terminate()
        holder.communicate(timeout=60)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = [x for x in out.stderr.splitlines() if x.startswith("fleetcare serve:")]
    assert len(lines) == 1 and "one writing process" in lines[0], out.stderr
    assert "serve --bus" in lines[0]


def test_bus_and_lake_come_from_the_config_too(tmp_path: Path) -> None:
    """`[cli] bus` / FLEETCARE_CLI_BUS name the bus as the flag does; --bus and --lake
    together (flag or config) are a usage error naming both."""
    from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, GpuSample
    from fleetcare.collectors.transport.embedded import EmbeddedBus

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    bus = EmbeddedBus(tmp_path / "bus")
    bus.send(Batch(schema_version=SCHEMA_VERSION, node="n1", seq=1, sent_at=now, samples=[
        GpuSample(ts=now, node="n1", gpu_uuid="GPU-1", gpu_index=0, pci_bus_id="0000:18:00.0",
                  model="H100")]))
    bus.flush()
    env = {**os.environ, "FLEETCARE_CLI_BUS": f"embedded://{tmp_path / 'bus'}"}
    out = subprocess.run([*FLEETCARE, "ingest", "--db", str(tmp_path / "f.duckdb"),
                          "--exit-when-idle", "0.5", "--json"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["samples"] == 1
    env["FLEETCARE_CLI_LAKE"] = str(tmp_path / "lake")
    out = subprocess.run([*FLEETCARE, "serve", "--db", str(tmp_path / "s.duckdb")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--bus and --lake" in out.stderr


def test_train_with_too_few_failures_is_one_line_and_keeps_the_model(small_db: Path) -> None:
    """Issue 12: `fleetcare train` on a fleet without enough failures said nothing useful
    (a traceback ending in FitError on a new cluster). One line: how many failures it saw
    and about how many it needs; exit 1; the current model stays."""
    import duckdb

    def current() -> list[tuple[str]]:
        with duckdb.connect(str(small_db), read_only=True) as con:
            return con.execute("SELECT model_id FROM models WHERE is_current").fetchall()

    # a current model to keep, whichever tests ran before (scoring installs the prior when
    # the store has none; run alone, the module's fleet had no models table at all)
    assert run("score", "--db", str(small_db), "--json").returncode == 0
    before = current()
    assert before
    out = run("train", "--db", str(small_db), "--min-failures", "500")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("fleetcare train: ") and "needs about 500 in training" in lines[0]
    assert current() == before


def test_demo_once_decides_drains_in_dry_run(tmp_path: Path) -> None:
    """The demo runs the drain controller in dry-run over its simulated scheduler: the
    decisions are in its output and in the audit log (which the API and dashboard read),
    marked dry-run, and nothing is held as drained."""
    import duckdb

    db = tmp_path / "demo.duckdb"
    out = run("demo", "--once", "--json", "--db", str(db), "--nodes", "32", "--days", "12",
              "--failure-scale", "90", "--history-interval", "30m", "--live-minutes", "10",
              timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    drains = json.loads(out.stdout)["drains"]
    assert drains["dry_run"] is True and drains["scheduler"] == "simulated"
    assert drains["fleet_size"] >= 10
    con = duckdb.connect(str(db), read_only=True)
    audit = con.execute("SELECT node, action, dry_run, result FROM drain_audit").fetchall()
    held = con.execute("SELECT count(*) FROM drains").fetchone()[0]
    con.close()
    planned = [d for d in drains["decisions"] if d["action"] == "drain"]
    assert [(n, a) for n, a, _, _ in audit if a == "drain"] == [
        (d["node"], "drain") for d in planned]
    assert all(dry and result == "dry-run" for _, a, dry, result in audit if a == "drain")
    assert held == 0
    assert all(d["reason"].startswith("fleetcare: risk ") for d in planned)


def test_human_rounds_for_people() -> None:
    from fleetcare.api.commands.common import human

    assert [human(v) for v in (0.41234567, 37.5123, 1234.56, 1e-5, 0.0, 12, True, None,
                               float("nan"))] == [
        "0.412", "37.51", "1,235", "1.0e-05", "0.000", "12", "True", "-", "-"]
    assert human([0.123456, 2.0]) == "[0.123, 2.00]"
    assert human({"hbm": 0.8333333, "gsp": None}) == "hbm 0.833, gsp -"


def test_the_demo_says_why_its_figures_differ_from_the_readme() -> None:
    """Issue 12: a small fleet's budget allows no false drain; the prior at x8 rates."""
    from fleetcare.api.demo import why_figures_differ

    m = {"node_days": 390.2, "false_drains_allowed": 0}
    x4 = {"validation_x4_fleets": [{"failure_scale": 4}]}
    line = why_figures_differ(m, "prior", 8.0, x4)
    assert "390 node-days allow 0 false drains" in line and "x8 the published rates" in line
    assert "chosen on validation fleets at x1/x4" in line and "more look-alikes" in line
    line = why_figures_differ(m, "prior", 4.0, x4)
    assert "x4 the published rates" in line and "more look-alikes" not in line
    line = why_figures_differ(m, "prior", 8.0, {})
    assert "at x1;" in line
    line = why_figures_differ({"node_days": 1500.0, "false_drains_allowed": 1}, "fleet", 8.0)
    assert "allow 1 false drain at" in line and "published rates" not in line
