"""deploy/prometheus/fleetcare-rules.yml: valid, unit-tested by promtool, and about metrics
fleetcare really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetcare.api import metrics

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"

pytestmark = pytest.mark.prometheus


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not on PATH: run deploy/prometheus/install.sh")
    return subprocess.run(["promtool", *args], cwd=RULES, capture_output=True, text=True,
                          timeout=60)


def test_rules_are_valid_and_pass_their_unit_tests():
    check = _promtool("check", "rules", "fleetcare-rules.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    run = _promtool("test", "rules", "fleetcare-rules.test.yml")
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_rules_use_only_metrics_fleetcare_exports():
    text = metrics.render([{"node": "n", "risk": 0.5}], 1.0,
                          {"held": [("slurm", 1)], "overdue": 0,
                           "actions": [("drain", "ok", 1)], "last_action": 1.0})
    exported = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    doc = yaml.safe_load((RULES / "fleetcare-rules.yml").read_text())
    used = {m for g in doc["groups"] for r in g["rules"]
            for m in re.findall(r"\bfleetcare_[a-z_]+", r["expr"])}
    assert used and used <= exported, used - exported
