"""`fleetcare quarantine list|stats`: the JSON contract, the filters, old databases."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import duckdb
import msgspec
import pytest

from fleetcare.api.cli import main
from fleetcare.api.commands.quarantine import PREVIEW_CHARS, parse_since, preview
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "q.duckdb"
    with Store(path) as store:
        store.quarantine("fleetcare.telemetry/0@1", "not a fleetcare batch (msgpack): x",
                         b"\xff\xfe junk", received_at=T0, code="undecodable")
        store.quarantine("fleetcare.telemetry/0@2#samples[1]",
                         "samples[1].gpu_temp_c = 10000.0 is outside the allowed range "
                         "-40..200 °C", msgspec.msgpack.encode({"gpu_temp_c": 10000.0}),
                         received_at=T0 + dt.timedelta(minutes=1),
                         code="temperature_out_of_range")
        store.quarantine("fleetcare.telemetry/0@3#samples[0]",
                         "samples[0].gpu_temp_c = -300.0 is outside the allowed range "
                         "-40..200 °C", b'{"gpu_temp_c":-300.0}',
                         received_at=T0 + dt.timedelta(minutes=2),
                         code="temperature_out_of_range")
    return str(path)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["quarantine", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_json_contract(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "list", "--db", db)
    assert doc == {
        "quarantined": [
            {"received_at": "2026-03-01T12:02:00+00:00",
             "source": "fleetcare.telemetry/0@3#samples[0]",
             "code": "temperature_out_of_range",
             "reason": "samples[0].gpu_temp_c = -300.0 is outside the allowed range "
                       "-40..200 °C",
             "raw_base64": base64.b64encode(b'{"gpu_temp_c":-300.0}').decode(),
             "raw_preview": '{"gpu_temp_c":-300.0}'},
            {"received_at": "2026-03-01T12:01:00+00:00",
             "source": "fleetcare.telemetry/0@2#samples[1]",
             "code": "temperature_out_of_range",
             "reason": "samples[1].gpu_temp_c = 10000.0 is outside the allowed range "
                       "-40..200 °C",
             "raw_base64": base64.b64encode(
                 msgspec.msgpack.encode({"gpu_temp_c": 10000.0})).decode(),
             "raw_preview": '{"gpu_temp_c":10000.0}'},
            {"received_at": "2026-03-01T12:00:00+00:00",
             "source": "fleetcare.telemetry/0@1",
             "code": "undecodable",
             "reason": "not a fleetcare batch (msgpack): x",
             "raw_base64": base64.b64encode(b"\xff\xfe junk").decode(),
             "raw_preview": "\\xff\\xfe junk"},
        ],
        "total": 3,
        "by_code": {"temperature_out_of_range": 2, "undecodable": 1},
    }


def test_limit_code_and_since_filter(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "list", "--db", db, "--limit", "1")
    assert [q["source"] for q in doc["quarantined"]] == ["fleetcare.telemetry/0@3#samples[0]"]
    assert doc["total"] == 3  # total ignores --limit
    doc = run_json(capsys, "list", "--db", db, "--code", "undecodable")
    assert [q["code"] for q in doc["quarantined"]] == ["undecodable"]
    assert (doc["total"], doc["by_code"]) == (1, {"undecodable": 1})
    doc = run_json(capsys, "list", "--db", db, "--since", "2026-03-01T12:01:00Z")
    assert doc["total"] == 2
    assert doc["by_code"] == {"temperature_out_of_range": 2}
    doc = run_json(capsys, "list", "--db", db, "--since", "1d")  # all older than a day
    assert doc == {"quarantined": [], "total": 0, "by_code": {}}


def test_stats(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, "stats", "--db", db) == {
        "total": 3, "by_code": {"temperature_out_of_range": 2, "undecodable": 1},
        "first_received_at": "2026-03-01T12:00:00+00:00",
        "last_received_at": "2026-03-01T12:02:00+00:00"}
    assert main(["quarantine", "stats", "--db", db]) == 0
    text = capsys.readouterr().out
    assert text.startswith("3 quarantined records")
    assert "temperature_out_of_range" in text


def test_table_output(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quarantine", "list", "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["received_at", "code", "source", "reason"]
    assert "undecodable" in lines[3] and "fleetcare.telemetry/0@1" in lines[3]
    assert lines[-1] == "(3 of 3 shown)"


def test_database_from_before_reason_codes(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE quarantine (received_at TIMESTAMP NOT NULL, source VARCHAR "
                "NOT NULL, reason VARCHAR NOT NULL, raw BLOB)")
    con.execute("INSERT INTO quarantine VALUES (?, 's', 'r', ?)",
                [T0.replace(tzinfo=None), b"x"])
    con.close()
    doc = run_json(capsys, "list", "--db", str(path))
    assert doc["by_code"] == {"uncoded": 1}
    assert doc["quarantined"][0]["code"] is None
    # opening it for writing adds the column; old rows keep a null code
    with Store(path) as store:
        store.quarantine("s2", "r2", b"y", received_at=T0, code="empty_batch")
    doc = run_json(capsys, "list", "--db", str(path))
    assert doc["by_code"] == {"empty_batch": 1, "uncoded": 1}


def test_empty_database_has_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    assert run_json(capsys, "list", "--db", str(path)) == {
        "quarantined": [], "total": 0, "by_code": {}}


def test_errors_exit_1_naming_the_problem(tmp_path: Path, db: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quarantine", "list", "--db", str(tmp_path / "nope.duckdb")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["quarantine", "list", "--db", db, "--since", "yesterday-ish"]) == 1
    assert "--since 'yesterday-ish'" in capsys.readouterr().err
    assert main(["quarantine", "list", "--db", db, "--limit", "-1"]) == 1
    assert "--limit -1" in capsys.readouterr().err


def test_help_shows_the_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["quarantine", "list", "--help"])
    out = capsys.readouterr().out
    for key in ("received_at", "source", "code", "reason", "raw_base64", "raw_preview",
                "total", "by_code"):
        assert f'"{key}"' in out


def test_preview_and_since_parsing() -> None:
    assert preview(msgspec.msgpack.encode({"t": float("nan")})) == '{"t":NaN}'
    long = preview(b"\x00" * 500)
    assert len(long) == PREVIEW_CHARS and long.endswith("…")
    now = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    assert parse_since("24h", now=now) == dt.datetime(2026, 3, 1)
    assert parse_since("2026-03-01T13:00:00+01:00") == dt.datetime(2026, 3, 1, 12)
    assert parse_since("2026-03-01") == dt.datetime(2026, 3, 1)
