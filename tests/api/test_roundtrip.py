"""One data contract, round-trip tested end to end (STYLE.md #5):

GpuSample -> wire bytes (encode_batch) -> decode_batch -> Store.insert_batches ->
DuckDB row -> GET /v1/nodes/{node} latest telemetry JSON -> equal to the sample.

The strategies are derived from the contract's field types, so a field added to
``GpuSample`` is covered without touching this test.
"""

from __future__ import annotations

import datetime as dt
import json
import types
import typing
from urllib.parse import quote

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    Batch,
    GpuSample,
    decode_batch,
    encode_batch,
)
from fleetcare.pipeline.store import Store

TIMES = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2300, 1, 1),
                     timezones=st.just(dt.UTC))
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SCALARS: dict[type, st.SearchStrategy] = {
    int: INT64,
    float: st.floats(allow_nan=False, allow_infinity=False),
    bool: st.booleans(),
    str: st.text(max_size=40),
    dt.datetime: TIMES,
}
NODES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)


def _strategy(tp: typing.Any) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(inner) == 1, tp
        return st.none() | _strategy(inner[0])
    if origin is list:
        return st.lists(_strategy(typing.get_args(tp)[0]), max_size=18)
    return SCALARS[tp]


def _sample_strategy() -> st.SearchStrategy[GpuSample]:
    hints = typing.get_type_hints(GpuSample)
    fields = {f.name: _strategy(hints[f.name]) for f in msgspec.structs.fields(GpuSample)}
    fields["node"] = NODES
    return st.builds(GpuSample, **fields)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("roundtrip") / "fleet.duckdb")
    server, thread = start_server_thread(create_app(store, auth=False, freshness_s=0.0))
    client = httpx.Client(base_url=f"http://127.0.0.1:{bound_port(server)}", timeout=10)
    yield store, client
    client.close()
    server.should_exit = True
    thread.join(10)
    store.close()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sample=_sample_strategy(), fmt=st.sampled_from(["json", "msgpack"]))
def test_sample_survives_wire_store_and_api(live, sample, fmt):
    store, client = live
    store.con.execute("DELETE FROM telemetry").fetchall()
    store.con.execute("DELETE FROM telemetry_nvlink").fetchall()  # its per-link rows

    batch = Batch(schema_version=SCHEMA_VERSION, node=sample.node, seq=1,
                  sent_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), samples=[sample])
    assert store.insert_batches([decode_batch(encode_batch(batch, fmt))]) == (1, 0, 0)

    r = client.get(f"/v1/nodes/{quote(sample.node, safe='')}")
    assert r.status_code == 200, r.text
    gpus = {g["gpu_uuid"]: g for g in r.json()["gpus"]}
    got = gpus[sample.gpu_uuid]["telemetry"]

    expected = {f.name: None for f in msgspec.structs.fields(GpuSample)}
    expected.update(json.loads(msgspec.json.encode(sample)))
    assert got == expected
    assert list(got) == list(expected)
    assert dt.datetime.fromisoformat(got["ts"]) == sample.ts
