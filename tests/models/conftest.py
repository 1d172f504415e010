"""Fixtures for fleetcare.models: a fresh store and synthetic feature/label frames."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.pipeline.store import Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "fleet.duckdb")
    yield s
    s.close()


def planted_rows(n: int, *, seed: int, base_rate_logit: float = -5.0) -> tuple[np.ndarray, np.ndarray]:
    """iid rows: failures depend on feature 0 only (strongly); features 1-3 are noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    X[rng.random(n) < 0.05, 3] = np.nan  # an unsupported counter is null
    p = 1.0 / (1.0 + np.exp(-(4.0 * X[:, 0] + base_rate_logit)))
    return X, rng.random(n) < p


def timeline_table(*, nodes: int = 30, gpus: int = 2, days: int = 20, seed: int = 0,
                   horizon_h: float = 24.0, failures_per_node: float = 1.0,
                   down_h: int = 6) -> pa.Table:
    """Hourly features + labels like features.gpu_features + labels.attach_labels give.

    A GPU that will fail shows a high ``ecc_corrected_24h`` during the 18 h before; the
    node has no rows for ``down_h`` hours after a failure.
    """
    rng = np.random.default_rng(seed)
    hours = days * 24
    grid = np.datetime64(T0.replace(tzinfo=None), "us") + np.arange(hours) * np.timedelta64(1, "h")
    H = np.timedelta64(int(horizon_h * 3600), "s")
    cols: dict[str, list] = {k: [] for k in (
        "ts", "node", "gpu_uuid", "gpu_index", "model", "ecc_corrected_24h", "gpu_temp_c",
        "noise", "label", "node_label", "failure_ts", "failure_mode", "failure_cause")}
    for n in range(nodes):
        k = rng.poisson(failures_per_node)
        fails = np.sort(rng.integers(30, hours, size=k))  # failure hours
        fail_gpu = rng.integers(0, gpus, size=k)
        fail_ts = grid[0] + fails * np.timedelta64(1, "h") + np.timedelta64(30, "m")
        modes = rng.choice(["hbm", "thermal"], size=k)
        for h in range(hours):
            t = grid[h]
            if any(f <= t < f + np.timedelta64(down_h, "h") for f in fail_ts):
                continue  # node is down
            ahead = [i for i, f in enumerate(fail_ts) if t < f <= t + H]
            first = ahead[0] if ahead else None
            for g in range(gpus):
                soon = [i for i in ahead if fail_gpu[i] == g and fail_ts[i] - t <= np.timedelta64(18, "h")]
                cols["ts"].append(t)
                cols["node"].append(f"node-{n:03d}")
                cols["gpu_uuid"].append(f"GPU-{n:03d}-{g}")
                cols["gpu_index"].append(g)
                cols["model"].append("H100")
                cols["ecc_corrected_24h"].append(
                    float(rng.poisson(300)) if soon else float(rng.poisson(3)))
                cols["gpu_temp_c"].append(float(rng.normal(60, 5)))
                cols["noise"].append(float(rng.normal()))
                cols["label"].append(any(fail_gpu[i] == g for i in ahead))
                cols["node_label"].append(first is not None)
                cols["failure_ts"].append(fail_ts[first] if first is not None else None)
                cols["failure_mode"].append(str(modes[first]) if first is not None else None)
                cols["failure_cause"].append("gpu_hbm3_memory" if first is not None else None)
    return pa.table({
        **{k: cols[k] for k in ("node", "gpu_uuid", "model", "label", "node_label",
                                "failure_mode", "failure_cause")},
        "ts": pa.array(cols["ts"], pa.timestamp("us")),
        "gpu_index": pa.array(cols["gpu_index"], pa.int64()),
        "failure_ts": pa.array(cols["failure_ts"], pa.timestamp("us")),
        **{k: pa.array(cols[k], pa.float64()) for k in ("ecc_corrected_24h", "gpu_temp_c", "noise")},
    })


@pytest.fixture
def planted() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    return planted_rows


@pytest.fixture(scope="session")
def timeline() -> pa.Table:
    return timeline_table()
