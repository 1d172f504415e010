"""[alerts] configuration: TOML + environment, clear errors, masked secrets; the README's
receiver code is the code the tests run."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from fleetcare.api.alerts import config as alerts_config
from fleetcare.api.alerts import sinks
from fleetcare.api.alerts.config import PAGERDUTY_URL, Secret, load, mask_url, parse
from fleetcare.collectors.config import ConfigError

TOML = """
[alerts]
threshold = 0.6
for = "10m"
resolve_threshold = 0.4
resolve_for = "15m"
repeat_interval = "4h"

[[alerts.sinks]]
name = "ops-slack"
kind = "slack"
min_risk = 0.7
match = { node = "gpu-a*" }

[[alerts.sinks]]
name = "pager"
kind = "pagerduty"
events = ["firing", "resolved"]
"""


def test_toml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "fleetcare.toml"
    path.write_text(TOML)
    env = {"FLEETCARE_ALERTS_OPS_SLACK_URL": "https://hooks.slack.com/services/T0/B0/XYZ",
           "FLEETCARE_ALERTS_PAGER_ROUTING_KEY": "rk-123",
           "FLEETCARE_ALERTS_THRESHOLD": "0.7"}
    cfg = load(path, env)
    assert (cfg.threshold, cfg.for_s, cfg.resolve_threshold, cfg.resolve_for_s,
            cfg.repeat_interval_s) == (0.7, 600, 0.4, 900, 14400)
    slack, pager = cfg.sinks
    assert slack.url.reveal() == "https://hooks.slack.com/services/T0/B0/XYZ"
    assert (slack.min_risk, dict(slack.match)) == (0.7, {"node": "gpu-a*"})
    assert pager.url.reveal() == PAGERDUTY_URL
    assert pager.routing_key is not None and pager.routing_key.reveal() == "rk-123"
    shown = repr(cfg) + str(slack.describe()) + str(pager.describe())
    assert "XYZ" not in shown and "rk-123" not in shown
    assert slack.describe()["url"] == "https://hooks.slack.com/…"
    assert "rk-123" not in repr(sinks.build(pager))


def test_no_config_file_means_defaults_and_no_sinks() -> None:
    cfg = load(None, {})
    assert (cfg.threshold, cfg.sinks) == (0.5, ())


@pytest.mark.parametrize("table, key, fragment", [
    ({"threshold": 0.3, "resolve_threshold": 0.4}, "[alerts] resolve_threshold", "flap"),
    ({"for": "ten minutes"}, "[alerts] for", "10m"),
    ({"treshold": 0.5}, "[alerts] treshold", "known keys"),
    ({"threshold": 1.5}, "[alerts] threshold", "between 0.0 and 1.0"),
    ({"sinks": [{"name": "x", "kind": "teams", "url": "http://a"}]},
     "[[alerts.sinks]] x kind", "alertmanager, alertmanager-api, slack, pagerduty, hmac"),
    ({"sinks": [{"name": "x", "kind": "slack"}]}, "[[alerts.sinks]] x url",
     "FLEETCARE_ALERTS_X_URL"),
    ({"sinks": [{"name": "p", "kind": "pagerduty"}]}, "[[alerts.sinks]] p routing_key",
     "FLEETCARE_ALERTS_P_ROUTING_KEY"),
    ({"sinks": [{"name": "h", "kind": "hmac", "url": "http://a"}]},
     "[[alerts.sinks]] h secret", "FLEETCARE_ALERTS_H_SECRET"),
    ({"sinks": [{"name": "h", "kind": "alertmanager", "url": "http://a",
                 "events": ["fired"]}]}, "[[alerts.sinks]] h events", '"firing"'),
    ({"sinks": [{"name": "s", "kind": "slack", "url": "http://a", "username": "u"}]},
     "[[alerts.sinks]] s username", "only alertmanager-api sinks take a username"),
    ({"sinks": [{"name": "am", "kind": "alertmanager-api", "url": "http://a",
                 "username": "fleetcare"}]}, "[[alerts.sinks]] am secret",
     "FLEETCARE_ALERTS_AM_SECRET"),
    ({"sinks": [{"name": "s", "kind": "slack", "url": "http://a", "job": "x"}]},
     "[[alerts.sinks]] s job", "only alertmanager-api sinks take a job label"),
    ({"sinks": [{"name": "am", "kind": "alertmanager-api", "url": "http://a", "job": " "}]},
     "[[alerts.sinks]] am job", "the job Prometheus scrapes this serve as"),
    ({"sinks": [{"name": "s", "kind": "slack", "url": "http://a",
                 "repeat_interval": "often"}]}, "[[alerts.sinks]] s repeat_interval", "10m"),
    ({"sinks": [{"name": "a", "kind": "alertmanager", "url": "http://a"},
                {"name": "a", "kind": "alertmanager", "url": "http://b"}]},
     "[[alerts.sinks]] name", "more than one sink"),
])
def test_errors_name_the_key_and_the_fix(table: dict[str, Any], key: str,
                                          fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(table, {})
    assert info.value.key == key
    assert fragment in str(info.value)


def test_alertmanager_api_sink_defaults_and_secret_from_the_environment() -> None:
    cfg = parse({"sinks": [
        {"name": "am", "kind": "alertmanager-api", "url": "http://am:9093",
         "username": "fleetcare"},
        {"name": "am-crit", "kind": "alertmanager-api", "url": "http://am:9093",
         "severity": "critical", "min_risk": 0.8, "repeat_interval": "30s"},
        {"name": "slack", "kind": "slack", "url": "http://a"}]},
        {"FLEETCARE_ALERTS_AM_SECRET": "pw"})
    am, crit, slack = cfg.sinks
    assert (am.username, am.secret, am.severity, am.repeat_interval_s) == (
        "fleetcare", Secret("pw"), "auto", 60.0)
    assert (crit.username, crit.secret, crit.severity, crit.repeat_interval_s) == (
        None, None, "critical", 30.0)
    assert slack.repeat_interval_s is None  # [alerts] repeat_interval
    assert "pw" not in str(am.describe()) and am.describe()["secret"] == "********"


def test_a_bad_secret_url_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        parse({"sinks": [{"name": "s", "kind": "slack"}]},
              {"FLEETCARE_ALERTS_S_URL": "hooks.slack.com/services/T0/B0/XYZ"})
    assert "XYZ" not in str(info.value)


def test_mask_url() -> None:
    assert mask_url("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/…"
    assert mask_url("http://user:pw@127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert mask_url("nonsense") == "********"
    assert str(Secret("x")) == "********" and "x" not in repr(Secret("x"))


def test_readme_verification_code_is_the_tested_function() -> None:
    readme = (Path(alerts_config.__file__).parent / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S)
    assert block is not None
    documented = block.group(1).split("\n\n\ndef ", 1)[1].split("\n\n\n#", 1)[0]
    source = inspect.getsource(sinks.verify_signature)
    source = re.sub(r'    """.*?"""\n', "", source, flags=re.S)
    assert "def " + documented.strip() == source.strip()
