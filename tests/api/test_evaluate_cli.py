"""``fleetcare evaluate``: the --json contract, cross-fleet and the HTML report."""

from __future__ import annotations

import json

import pytest

from fleetcare.api.cli import main

METHOD = {"pr_auc", "recall_at_budget", "false_drains_per_1000_node_days",
          "median_lead_time_h", "recall_by_mode"}
GOODPUT = {"gpu_hours_lost", "interruptions_avoided", "false_drains", "ettr"}


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    d = tmp_path_factory.mktemp("evaluate")
    a, b = str(d / "a.duckdb"), str(d / "b.duckdb")
    assert main(["simulate", "--nodes", "24", "--days", "12", "--seed", "5",
                 "--failure-scale", "20", "--interval", "10m", "--db", a]) == 0
    assert main(["simulate", "--nodes", "24", "--days", "12", "--seed", "6",
                 "--model", "H100:1,A100:1", "--failure-scale", "40", "--interval", "10m",
                 "--db", b]) == 0
    return a, b


def _check_contract(out, test_scale="20"):
    assert out["simulated"] is True
    assert METHOD <= set(out["model"])
    # what every figure stands on (issue 12): the fleet, its data and its failures
    f = out["fleet"]
    assert f["failures"] == out["model"]["n_failures"] == out["test_period"]["failures"]
    assert 0 <= f["failures_with_precursors"] <= f["failures"] and f["nodes"] > 0
    assert f["simulation"] and f"failure_scale={test_scale}" in f["simulation"][0]
    m = out["model"]
    if m["n_failures"]:
        lo, hi = m["recall_ci95"]
        assert lo <= m["recall_at_budget"] <= hi and m["detected"] <= m["n_failures"]
    # the shipped fleet prior on the same test rows
    p = out["prior"]
    assert p["model_id"].startswith("prior-") and METHOD <= set(p)
    assert p["n_failures"] == m["n_failures"]
    assert p["at_shipped_threshold"]["threshold"] > 0
    assert set(out["baselines"]) == {"reactive_xid", "dcgm_thresholds", "logistic"}
    for m in out["baselines"].values():
        assert METHOD <= set(m)
    assert {"no_action", "reactive_xid", "dcgm_thresholds", "fleetcare"} <= set(out["goodput"])
    assert "gpu_hours_lost" in out["goodput"]["no_action"]
    for k in ("reactive_xid", "dcgm_thresholds", "fleetcare"):
        assert GOODPUT <= set(out["goodput"][k])
    # a reactive rule fires at the failure: it never recovers a crash
    assert out["goodput"]["reactive_xid"]["gpu_hours_lost"] >= \
        out["goodput"]["no_action"]["gpu_hours_lost"] - 1e-6 or \
        out["baselines"]["reactive_xid"]["recall"] > 0


def test_evaluate_json_and_html(fleets, tmp_path, capsys):
    a, _ = fleets
    html = tmp_path / "report.html"
    capsys.readouterr()
    assert main(["evaluate", "--db", a, "--json", "--html", str(html)]) == 0
    out = json.loads(capsys.readouterr().out)
    _check_contract(out)
    text = html.read_text()
    assert "SIMULATED DATA" in text
    assert '<img alt=' in text and 'src="data:image/png;base64,' in text


def test_evaluate_cross_fleet(fleets, capsys):
    a, b = fleets
    capsys.readouterr()
    assert main(["evaluate", "--train-db", a, "--test-db", b, "--json",
                 "--job-gpus", "1024", "--drain-cost", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    _check_contract(out, test_scale="40")
    assert out["setting"].startswith("cross-fleet")
    assert out["goodput"]["cost_model"]["drain_cost_gpu_h"] == 16.0


def test_usage_errors_name_the_flag(fleets, capsys):
    a, _ = fleets
    assert main(["evaluate", "--train-db", a, "--json"]) == 1
    assert "--train-db and --test-db go together" in capsys.readouterr().err
    assert main(["evaluate", "--db", a, "--job-gpus", "0"]) == 1
    assert "--job-gpus" in capsys.readouterr().err
    assert main(["evaluate", "--db", a, "--checkpoint-interval", "0s"]) == 1
    assert "--checkpoint-interval" in capsys.readouterr().err
    assert main(["evaluate", "--db", a, "--window", "12h"]) == 1
    assert "--window 12h is shorter than the horizon 24h" in capsys.readouterr().err


def test_evaluate_shards_and_window(fleets, capsys):
    """Two --db are the shards of one fleet; --window changes how alarms are judged."""
    a, b = fleets
    capsys.readouterr()
    assert main(["evaluate", "--db", a, "--db", b, "--window", "48h", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    _check_contract(out)
    assert out["test_period"]["shards"] == 2
    assert out["test_period"]["window_h"] == out["model"]["window_h"] == 48.0
