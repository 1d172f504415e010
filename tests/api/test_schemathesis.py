"""Property-based fuzzing of every endpoint from the OpenAPI spec (schemathesis).

A real server on loopback, auth on, a real DuckDB file with scores, GPUs, telemetry,
labels, a model and alerts; requests carry an admin token. Checks: schemathesis's
defaults (no 5xx, status codes, content types and bodies as the spec says, ...) plus
ours: every 4xx says what is wrong in ``detail``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from fleetcare.api import auth
from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.collectors.contract import GpuSample
from fleetcare.models import registry, scoring
from fleetcare.pipeline.store import Store
from tests.api.conftest import Fleet

T0 = dt.datetime(2026, 3, 1, 12)
EXAMPLES = 20
"""Per operation and mode: ~12 operations x 2 modes x 20 runs in well under 60 s."""


@schemathesis.check
def error_has_a_message(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx body is JSON with a non-empty ``detail`` (the message, or 422's list);
    the dashboard's 401 is its sign-in form (HTML, as the spec declares)."""
    if response.status_code == 401 and response.headers.get(
            "content-type", [""])[0].startswith("text/html"):
        assert case.path == "/" and 'name="token"' in response.text, case.path
        return None
    if 400 <= response.status_code < 500:
        body = json.loads(response.content)
        assert isinstance(body, dict) and body.get("detail"), (
            f"{response.status_code} without a message: {response.content[:200]!r}")
        if response.status_code == 422:
            assert body.get("message"), f"422 without a message: {body}"
    return None


def _fill(store: Store) -> None:
    scoring.ensure_schema(store)
    registry.ensure_schema(store)
    fleet = Fleet(store)
    fleet.model("m1", metrics={"pr_auc": 0.5})
    for i in range(12):
        node = f"gpu-{i:03d}"
        fleet.node_score(node, i / 12, reasons=[f"reason {i}"], top_gpu_uuid=f"GPU-{i}-0")
        for g in range(2):
            fleet.gpu_score(node, f"GPU-{i}-{g}", g, i / 12,
                            model="NVIDIA H100 80GB HBM3" if i % 2 else "NVIDIA A100")
        store.insert_sample_records([GpuSample(
            ts=T0.replace(tzinfo=dt.UTC), node=node, gpu_uuid=f"GPU-{i}-{g}", gpu_index=g,
            pci_bus_id=f"00000000:{g:02X}:00.0", model="NVIDIA H100 80GB HBM3",
            gpu_temp_c=60.0 + i) for g in range(2)])
        store.con.execute("INSERT INTO node_labels VALUES (?, 'partition', ?, ?)",
                          [node, f"p{i % 3}", T0]).fetchall()
    store.con.execute("INSERT INTO alerts (id, node, state, risk, started_at, reasons) "
                      "VALUES ('a1', 'gpu-011', 'firing', 0.9, ?, '[\"HBM\"]')", [T0]).fetchall()


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: Any) -> Iterator[tuple[str, str]]:
    store = Store(tmp_path_factory.mktemp("schemathesis") / "fleet.duckdb")
    token, _ = auth.create_token(store.cursor(), "admin", name="schemathesis")
    app = create_app(store, freshness_s=0.0)  # auth on; creates the API's tables
    _fill(store)
    server, thread = start_server_thread(app)
    yield f"http://127.0.0.1:{bound_port(server)}", token
    server.should_exit = True
    thread.join(10)
    store.close()


MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_endpoint_conforms_to_the_spec(live_api: tuple[str, str], mode: Any) -> None:
    """Each operation of the live spec, valid (positive) and invalid (negative) inputs."""
    base, token = live_api
    api = schemathesis.openapi.from_url(f"{base}/openapi.json")
    headers = {"Authorization": f"Bearer {token}"}
    failures, labels = [], []
    for result in api.get_all_operations():
        op = result.ok()
        labels.append(op.label)

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:  # called at once, in this iteration
            if (mode is schemathesis.GenerationMode.POSITIVE and isinstance(case.body, dict)
                    and op.label == "POST /v1/incidents" and "ts" in case.body):  # noqa: B023
                # valid data: a ts within ingest's time bounds of now, which the field's
                # description states and JSON Schema cannot (a date-time has no minimum)
                case.body["ts"] = dt.datetime.now(dt.UTC).isoformat()
            case.call_and_validate(headers=headers, additional_checks=[error_has_a_message])

        try:
            fuzz()
        except Unsatisfiable:  # negative mode: an operation without inputs has no bad ones
            assert mode is schemathesis.GenerationMode.NEGATIVE and not op.label.startswith(
                ("PUT", "POST")), op.label
        except Exception as exc:  # collect: one report for every operation
            failures.append(f"{op.label}: {exc}")
    assert len(labels) >= 11, labels
    assert not failures, "\n\n".join(failures)
