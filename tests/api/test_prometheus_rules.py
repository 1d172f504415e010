"""deploy/prometheus: the rules are valid, unit-tested by promtool, and about metrics
fleetcare really exports; the Alertmanager example is valid and routes as it says."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetcare.api import metrics

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_FILES = ("fleetcare-rules.yml", "fleetcare-risk-rules.yml")

pytestmark = pytest.mark.prometheus


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(name) is None:
        pytest.skip(f"{name} not on PATH: run deploy/prometheus/install.sh")
    return subprocess.run([name, *args], cwd=RULES, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("rules", RULE_FILES)
def test_rules_are_valid_and_pass_their_unit_tests(rules: str) -> None:
    check = _tool("promtool", "check", "rules", rules)
    assert check.returncode == 0, check.stdout + check.stderr
    run = _tool("promtool", "test", "rules", rules.replace(".yml", ".test.yml"))
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_every_rule_has_a_unit_test() -> None:
    for rules in RULE_FILES:
        names = {r["alert"] for g in yaml.safe_load((RULES / rules).read_text())["groups"]
                 for r in g["rules"]}
        tests = yaml.safe_load((RULES / rules.replace(".yml", ".test.yml")).read_text())
        fired = {a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"]
                 if a["exp_alerts"]}
        assert names == fired, (rules, names - fired)


def test_rules_use_only_metrics_fleetcare_exports() -> None:
    text = metrics.render([{"node": "n", "risk": 0.5}], 1.0,
                          {"held": [("slurm", 1)], "overdue": 0,
                           "actions": [("drain", "ok", 1)], "last_action": 1.0},
                          latest_telemetry_s=1.0,
                          alerts={"open": [("firing", 1)], "messages": [("dead", 0)]},
                          network=([("n", 0.1)], 0.05), alarm=(0.74, 3600.0))
    exported = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    for rules in RULE_FILES:
        doc = yaml.safe_load((RULES / rules).read_text())
        used = {m for g in doc["groups"] for r in g["rules"]
                for m in re.findall(r"\bfleetcare_[a-z_]+", r["expr"])}
        assert used and used <= exported, (rules, used - exported)


def test_alertmanager_example_is_valid() -> None:
    check = _tool("amtool", "check-config", "alertmanager.example.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout and "3 inhibit rules" in check.stdout, check.stdout


@pytest.mark.parametrize(("labels", "receivers"), [
    ("alertname=FleetcareNodeFailureRisk node=gpu01 severity=warning", "gpu-ops-chat"),
    ("alertname=FleetcareNodeRiskCritical node=gpu01 severity=critical",
     "gpu-ops-pager,gpu-ops-chat"),
    ("alertname=FleetcareNodeFailureRisk node=gpu01 severity=critical partition=train-a",
     "gpu-ops-pager,training-infra"),
    ("alertname=FleetcareNodeRiskHigh node=gpu07 severity=warning partition=train-b",
     "training-infra"),
    ("alertname=FleetcareFleetWideRisk scope=fleet severity=critical job=fleetcare",
     "gpu-ops-pager"),
    ("alertname=FleetcareScoresStale severity=warning job=fleetcare", "fleetcare-ops"),
    ("alertname=FleetcareNodeNetworkRisk node=gpu01 severity=warning", "gpu-ops-chat"),
])
def test_alertmanager_example_routes(labels: str, receivers: str) -> None:
    out = _tool("amtool", "config", "routes", "test",
                "--config.file=alertmanager.example.yml", *labels.split())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receivers
