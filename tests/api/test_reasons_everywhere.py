"""One sentence per reason, everywhere: scoring writes it once (``models.reasons``), and
the API, the dashboard, Slack and the drain reason show it as written."""

from __future__ import annotations

import datetime as dt
import html
import json

import numpy as np
import pyarrow as pa

from fleetcare.api.alerts.sinks import AlertEvent, SlackSink
from fleetcare.api.drains import drain_reason
from fleetcare.models import registry
from fleetcare.models.model import FailureModel
from fleetcare.models.scoring import score

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
NAMES = ["ecc_corrected_24h", "pcie_replay_24h", "power_mean_24h"]


def _model() -> FailureModel:
    rng = np.random.default_rng(2)
    n = 3000
    ecc = np.where(rng.random(n) < 0.1, rng.poisson(40, n), 0).astype(float)
    X = np.column_stack([ecc, np.zeros(n), rng.normal(300, 20, n)])
    y = rng.random(n) < 1 / (1 + np.exp(-(0.2 * ecc - 6)))
    return FailureModel(n_estimators=40).fit(X[:2200], y[:2200], X_cal=X[2200:],
                                             y_cal=y[2200:], feature_names=NAMES)


def test_the_api_dashboard_slack_and_drains_show_the_scored_sentence(store, serve_app):
    registry.save(store, _model(), created_at=T0)
    gpus = 8
    score(store, at=T0, features=pa.table({
        "ts": pa.array([T0.replace(tzinfo=None)] * gpus, pa.timestamp("us")),
        "node": [f"node-{i // 4}" for i in range(gpus)],
        "gpu_uuid": [f"GPU-{i}" for i in range(gpus)],
        "gpu_index": pa.array([i % 4 for i in range(gpus)], pa.int64()),
        "model": ["H100 80GB"] * gpus,
        "ecc_corrected_24h": [0.0, 0.0, 0.0, 0.0, 0.0, 310.0, 0.0, 0.0],
        "pcie_replay_24h": [0.0] * gpus, "power_mean_24h": [300.0] * gpus,
    }))
    stored = json.loads(store.cursor().execute(
        "SELECT reasons FROM node_scores WHERE node = 'node-1'").fetchone()[0])
    assert stored[0] == "GPU 1: 310 corrected ECC errors in 24 h (fleet median for H100 80GB: 0)"

    client = serve_app(store)
    node = client.get("/v1/nodes/node-1").json()
    assert node["reasons"] == stored
    gpu5 = next(g for g in node["gpus"] if g["gpu_uuid"] == "GPU-5")
    assert f"GPU 1: {gpu5['reasons'][0]}" == stored[0]
    assert html.escape(stored[0]) in client.get("/").text
    slack = json.loads(SlackSink("ops", "http://127.0.0.1:9/hook").render(AlertEvent(
        "e1", "a1", "firing", "node-1", 0.9, 0.9, 0.5, T0, T0, None, tuple(stored)))[2])
    assert f"• {stored[0]}" in json.dumps(slack, ensure_ascii=False)
    assert stored[0] in drain_reason(0.9, stored)
