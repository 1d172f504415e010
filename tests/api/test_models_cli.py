"""`fleetcare models list|show|promote` as a user runs it: subprocesses on a simulated store.

One small simulated fleet (24 nodes x 12 days, failure rate x20, 10-minute samples),
trained twice with different seeds: the first model becomes current, the second waits
for ``promote``, which compares both on the second model's held-out period.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetcare.models.promotion import beats

pytestmark = pytest.mark.slow

LIST_KEYS = {"model_id", "created_at", "is_current", "origin", "current_reason", "horizon_h",
             "train_range", "cal_range", "test_range", "n_features", "pr_auc",
             "recall_at_budget"}


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetcare.api.cli", *argv],
                          capture_output=True, text=True, timeout=300)


def ok_json(*argv: str) -> Any:
    p = cli(*argv, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(db, first model id, second model id)."""
    db = str(tmp_path_factory.mktemp("models") / "fleet.duckdb")
    p = cli("simulate", "--nodes", "24", "--days", "12", "--seed", "5", "--failure-scale",
            "20", "--interval", "10m", "--db", db)
    assert p.returncode == 0, p.stderr
    first = ok_json("train", "--db", db, "--seed", "0", "--min-failures", "5")["model_id"]
    second = ok_json("train", "--db", db, "--seed", "1", "--no-promote",
                     "--min-failures", "5")["model_id"]
    assert first != second
    return db, first, second


def test_list_and_show(fleet: tuple[str, str, str]) -> None:
    db, first, second = fleet
    doc = ok_json("models", "list", "--db", db)
    assert doc["current"] == first  # --no-promote: registered, not compared
    assert [m["model_id"] for m in doc["models"]] == [second, first]  # newest first
    assert [m["is_current"] for m in doc["models"]] == [False, True]
    for m in doc["models"]:
        assert set(m) == LIST_KEYS and m["horizon_h"] == 24.0
        assert all(len(r) == 2 and r[0] < r[1] for r in
                   (m["train_range"], m["cal_range"], m["test_range"]))
        assert m["train_range"][1] == m["cal_range"][0]
        assert m["cal_range"][1] == m["test_range"][0]
    shown = ok_json("models", "show", second, "--db", db)
    assert set(shown) == LIST_KEYS | {"features", "params", "metrics"}
    assert {k: shown[k] for k in LIST_KEYS} == doc["models"][0]
    assert len(shown["features"]) == shown["n_features"] > 0
    assert shown["params"]["seed"] == 1 and shown["metrics"]["pr_auc"] == shown["pr_auc"]

    text = cli("models", "list", "--db", db)
    assert text.returncode == 0 and f"* {first}" in text.stdout and f"  {second}" in text.stdout
    import re

    shown_text = cli("models", "show", second, "--db", db)
    assert shown_text.returncode == 0, shown_text.stderr
    metrics = shown_text.stdout.split("held-out metrics:\n", 1)[1]
    assert "pr_auc" in metrics
    assert not re.findall(r"\d+\.\d{4,}", metrics), f"unrounded metrics: {metrics}"
    helped = cli("models", "list", "--help")
    assert helped.returncode == 0 and '"current"' in helped.stdout


def test_unknown_model_and_missing_db(fleet: tuple[str, str, str], tmp_path: Path) -> None:
    db, _, _ = fleet
    for action in ("show", "promote"):
        p = cli("models", action, "m-nope", "--db", db)
        assert p.returncode == 1 and p.stdout == ""
        assert "fleetcare models: no model 'm-nope' in the registry" in p.stderr
    p = cli("models", "list", "--db", str(tmp_path / "absent.duckdb"))
    assert p.returncode == 1 and "does not exist" in p.stderr


def test_promote_compares_then_force(fleet: tuple[str, str, str]) -> None:
    db, first, second = fleet
    p = cli("models", "promote", second, "--db", db, "--json")
    d = json.loads(p.stdout)
    assert set(d) == {"model_id", "promoted", "reason", "previous_model_id", "period",
                      "new_metrics", "current_metrics"}
    assert d["model_id"] == second and d["previous_model_id"] == first
    won, why = beats(d["new_metrics"], d["current_metrics"])
    assert d["promoted"] is won and p.returncode == (0 if won else 1)
    assert d["reason"].endswith(why) and (" beats " in d["reason"]) is won
    # compared on the second model's test period, the same rows for both models
    test_range = ok_json("models", "show", second, "--db", db)["test_range"]
    assert d["period"] == test_range
    assert d["new_metrics"]["n_failures"] == d["current_metrics"]["n_failures"]
    assert d["new_metrics"]["node_days"] == d["current_metrics"]["node_days"]
    assert ok_json("models", "list", "--db", db)["current"] == (second if won else first)

    loser = first if won else second
    p = cli("models", "promote", loser, "--db", db)
    assert p.returncode == 1  # the other way round it cannot win (no exact tie here)
    assert " does not beat current " in p.stdout and "--force" in p.stderr
    forced = ok_json("models", "promote", loser, "--db", db, "--force")
    assert forced["promoted"] is True and "forced (--force)" in forced["reason"]
    assert forced["new_metrics"] is None
    assert ok_json("models", "list", "--db", db)["current"] == loser


def test_list_says_what_the_priors_network_head_does(tmp_path: Path) -> None:
    """A new fleet with InfiniBand ports is scored by the shipped prior, whose network head
    has its own operating threshold: ``models list`` says so, with its validation."""
    from fleetcare.models import prior

    db = str(tmp_path / "ports.duckdb")
    p = cli("simulate", "--nodes", "4", "--days", "2", "--nic-ports", "8", "--db", db)
    assert p.returncode == 0, p.stderr
    assert cli("score", "--db", db).returncode == 0
    _, meta = prior.load()
    head = meta["network_head"]
    text = cli("models", "list", "--db", db)
    assert text.returncode == 0, text.stderr
    line = next(ln for ln in text.stdout.splitlines() if "network head" in ln)
    assert f"P {head['threshold']:.4f}" in line and 'threshold = "model" fire there' in line
    from fleetcare.pipeline.store import Store

    store = Store(db, read_only=True)
    try:  # the CLI's scoring run kept the head's probability of every node with ports
        nodes = store.cursor().execute(
            "SELECT count(DISTINCT node) FROM node_network_scores").fetchall()[0][0]
    finally:
        store.close()
    assert nodes == 4
    caught = sum(c for c, _ in head["validation"]["detected_by_mode"].values())
    assert f"{caught} of " in line
    doc = ok_json("models", "show", ok_json("models", "list", "--db", db)["current"], "--db", db)
    assert doc["metrics"]["network_head"]["threshold"] == head["threshold"]
