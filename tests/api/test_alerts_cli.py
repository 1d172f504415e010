"""``fleetcare alerts list|test-sink|deliver`` against a real database and receivers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleetcare.api.alerts import AlertEngine, verify_signature
from fleetcare.api.cli import main
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store
from tests.api import test_alerts_helpers as helpers
from tests.api.test_alerts_helpers import T0, Clock, minutes, put_scores

receivers = helpers.receivers  # fixture


def write_config(tmp_path: Path, url: str, kind: str = "alertmanager") -> str:
    path = tmp_path / "fleetcare.toml"
    path.write_text(f'[alerts]\nfor = "0"\nresolve_for = "0"\n\n'
                    f'[[alerts.sinks]]\nname = "ops"\nkind = "{kind}"\nurl = "{url}"\n')
    return str(path)


def make_db(tmp_path: Path, cfg_path: str) -> str:
    from fleetcare.api.alerts import load_config

    db = str(tmp_path / "fleet.duckdb")
    store = Store(db)
    scoring.ensure_schema(store)
    eng = AlertEngine.from_config(store, load_config(cfg_path, {}), clock=Clock())
    put_scores(store, T0, {"gpu01": 0.9, "gpu02": 0.8, "gpu03": 0.1})
    eng.evaluate(T0)
    put_scores(store, T0 + minutes(1), {"gpu01": 0.9, "gpu02": 0.1, "gpu03": 0.1})
    eng.evaluate(T0 + minutes(1))
    store.close()
    return db


def test_list_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = make_db(tmp_path, write_config(tmp_path, "http://127.0.0.1:9/x"))
    assert main(["alerts", "list", "--db", db, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(a["node"], a["state"], a["risk"], a["fired_at"], a["resolved_at"])
            for a in out["alerts"]] == [
        ("gpu01", "firing", 0.9, "2026-03-01T12:00:00Z", None),
        ("gpu02", "resolved", 0.1, "2026-03-01T12:00:00Z", "2026-03-01T12:01:00Z")]
    assert out["outbox"] == {"pending": 3, "delivered": 0, "dead": 0}
    assert main(["alerts", "list", "--db", db, "--json", "--state", "firing"]) == 0
    assert [a["node"] for a in json.loads(capsys.readouterr().out)["alerts"]] == ["gpu01"]


def test_list_on_a_database_without_alerts(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "empty.duckdb")
    Store(db).close()
    assert main(["alerts", "list", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "alerts": [], "outbox": {"pending": 0, "delivered": 0, "dead": 0}}


def test_deliver(tmp_path: Path, receivers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    recv = receivers()
    cfg = write_config(tmp_path, recv.url())
    db = make_db(tmp_path, cfg)
    assert main(["--config", cfg, "alerts", "deliver", "--db", db, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"delivered": 3, "retried": 0, "dead": 0,
                   "outbox": {"pending": 0, "delivered": 3, "dead": 0}}
    assert [(r.json()["alerts"][0]["labels"]["node"], r.json()["status"]) for r in recv.got] \
        == [("gpu01", "firing"), ("gpu02", "firing"), ("gpu02", "resolved")]


def test_test_sink_signs_and_reports(tmp_path: Path, receivers: Any,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    recv = receivers()
    cfg = write_config(tmp_path, recv.url("/secret-path"), kind="hmac")
    monkeypatch.setenv("FLEETCARE_ALERTS_OPS_SECRET", "k3y")
    assert main(["--config", cfg, "alerts", "test-sink", "ops", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"sink": "ops", "kind": "hmac", "url": f"http://127.0.0.1:{recv.port}/…",
                   "status": 200, "ok": True, "error": None}
    (got,) = recv.got
    assert got.json()["alert"]["node"] == "fleetcare-test"
    assert verify_signature("k3y", got.headers["X-Fleetcare-Timestamp"], got.body,
                            got.headers["X-Fleetcare-Signature"], time.time())


def test_test_sink_failure_exits_1(tmp_path: Path, receivers: Any,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    recv = receivers()
    recv.fail_next = 1
    cfg = write_config(tmp_path, recv.url("/secret-path"))
    assert main(["--config", cfg, "alerts", "test-sink", "ops"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 500" in err and "secret-path" not in err
    assert main(["--config", cfg, "alerts", "test-sink", "nope"]) == 1
    assert "configured: ops" in capsys.readouterr().err


def test_test_sink_with_the_model_s_point_shows_the_prior_s_threshold(
        tmp_path: Path, receivers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``threshold = "model"`` (the default) the made-up alert carries the shipped
    prior's operating threshold, not the fallback numbers no model alerts at."""
    from fleetcare.models import prior

    recv = receivers()
    path = tmp_path / "model.toml"
    path.write_text(f'[alerts]\nthreshold = "model"\n\n[[alerts.sinks]]\nname = "ops"\n'
                    f'kind = "hmac"\nurl = "{recv.url()}"\n')
    monkeypatch.setenv("FLEETCARE_ALERTS_OPS_SECRET", "k3y")
    assert main(["--config", str(path), "alerts", "test-sink", "ops", "--json"]) == 0
    (got,) = recv.got
    assert got.json()["alert"]["threshold"] == prior.load()[1]["threshold"]


def test_list_reads_an_alerts_table_from_before_p_net(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``alerts list`` opens the database read-only, so the engine's ALTER never ran on a
    table an older version made: the new column reads as null."""
    db = str(tmp_path / "old.duckdb")
    store = Store(db)
    store.cursor().execute(
        "CREATE TABLE alerts (id VARCHAR NOT NULL, node VARCHAR NOT NULL, state VARCHAR NOT "
        "NULL, risk DOUBLE, started_at TIMESTAMP, fired_at TIMESTAMP, resolved_at TIMESTAMP, "
        "reasons VARCHAR, updated_at TIMESTAMP, resolving_since TIMESTAMP, peak_risk DOUBLE, "
        "top_gpu_uuid VARCHAR, model_id VARCHAR)").fetchall()
    store.cursor().execute("INSERT INTO alerts (id, node, state, risk, started_at, reasons) "
                           "VALUES ('a1', 'gpu01', 'firing', 0.9, ?, '[]')", [T0]).fetchall()
    store.close()
    assert main(["alerts", "list", "--db", db, "--json"]) == 0
    (alert,) = json.loads(capsys.readouterr().out)["alerts"]
    assert (alert["id"], alert["p_net"]) == ("a1", None)
