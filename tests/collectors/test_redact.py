"""Issue 13: secrets inside URLs are masked wherever fleetcare prints them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcare.collectors.redact import MaskingFormatter, mask_secrets

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("s3cret", "t0k3n", "p4ss")


@pytest.mark.parametrize(("text", "masked"), [
    ("kafka://user:s3cret@broker:9092", "kafka://user:****@broker:9092"),
    ("kafka://u:s3cret@b1:9092,v:p4ss@b2:9092", "kafka://u:****@b1:9092,v:****@b2:9092"),
    ("http://admin:s3cret@h:9400/metrics?token=t0k3n&x=1",
     "http://admin:****@h:9400/metrics?token=****&x=1"),
    ("https://t0k3n@github.com/org/repo", "https://****@github.com/org/repo"),
    ("GET http://h/p?api_key=t0k3n&X-Amz-Signature=s3cret#top",
     "GET http://h/p?api_key=****&X-Amz-Signature=****#top"),
    ("error: ConnectionRefused('kafka://u:s3cret@h:1')", "error: ConnectionRefused('kafka://u:****@h:1')"),
    ("embedded://var/bus", "embedded://var/bus"),
    ("kafka://10.0.0.5:9092,10.0.0.6:9092", "kafka://10.0.0.5:9092,10.0.0.6:9092"),
    ("ops@example.com at http://h:8000/v1/risk?limit=5", "ops@example.com at http://h:8000/v1/risk?limit=5"),
])
def test_mask_secrets(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked
    assert mask_secrets(masked) == masked  # idempotent


def test_the_log_formatter_masks_messages_and_tracebacks() -> None:
    fmt = MaskingFormatter(logging.Formatter("%(message)s"))
    try:
        raise OSError("cannot reach http://u:s3cret@h:9400/metrics")
    except OSError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "bus=%s", ("kafka://u:p4ss@h",),
                                   sys.exc_info())
    out = fmt.format(record)
    assert "bus=kafka://u:****@h" in out and "http://u:****@h:9400" in out
    assert not any(s in out for s in SECRETS)


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetcare.collectors.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_print_config_masks_urls(tmp_path: Path) -> None:
    """Was: --print-config printed kafka://user:pass@… and a dcgm-exporter URL with
    credentials in clear."""
    out = agent("--backend", "dcgm-exporter", "--bus", f"embedded://{tmp_path}",
                "--dcgm-url", "http://user:s3cret@127.0.0.1:9400/metrics?token=t0k3n",
                "--print-config")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["dcgm_url"] == "http://user:****@127.0.0.1:9400/metrics?token=****"
    assert not any(s in out.stdout for s in SECRETS)


def test_kafka_credentials_in_the_bus_url_are_refused_masked() -> None:
    out = agent("--bus", "kafka://user:s3cret@127.0.0.1:9092", "--print-config")
    assert out.returncode == 2
    assert "kafka://user:****@127.0.0.1:9092" in out.stderr
    assert "kafka_sasl_plain_password" in out.stderr and "s3cret" not in out.stderr


def test_agent_logs_and_errors_mask_the_dcgm_url(tmp_path: Path) -> None:
    """A scrape that fails is logged with its URL (and traceback): masked."""
    out = agent("--backend", "dcgm-exporter", "--bus", f"embedded://{tmp_path}",
                "--dcgm-url", "http://user:s3cret@127.0.0.1:9/metrics?token=t0k3n",
                "--interval", "1s", "--duration", "1s", "--metrics-port", "0",
                "--log-level", "debug")
    assert out.returncode == 0, out.stderr
    assert "cannot scrape http://user:****@127.0.0.1:9/metrics?token=****" in out.stderr
    assert not any(s in out.stderr for s in SECRETS)
