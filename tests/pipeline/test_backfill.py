"""Backfill from Prometheus: a real server loaded with simulated dcgm-exporter history.

The real-server tests start their own ``prometheus`` (Debian package; installed by
``deploy/prometheus/install.sh``) on a free 127.0.0.1 port, with a TSDB built by
``promtool tsdb create-blocks-from openmetrics`` from the simulator's samples. They are
skipped only when the ``prometheus`` binary is not on PATH. The same tests also run
against ``FakePrometheus``, which answers ``query_range`` with the JSON shapes of the
recorded responses in ``fixtures/prometheus/``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetcare.collectors.dcgm_exporter import FIELD_MAP, NVLINK_MAP, urllib_fetch
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline import schema
from fleetcare.pipeline.backfill import (
    BackfillError,
    PrometheusApiError,
    PrometheusClient,
    PrometheusUnreachable,
    backfill,
    chunks,
    metric_queries,
    progress_key,
)
from fleetcare.pipeline.prom_columns import decode_matrix, samples_table
from fleetcare.pipeline.store import Store

from .prom_history import Series, dcgm_series, free_port, running_prometheus

FIXTURES = Path(__file__).parent / "fixtures" / "prometheus"
START = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
HOURS = 6
LAST = START + dt.timedelta(hours=HOURS, minutes=-1)   # the last simulated tick
QUERIES = len(metric_queries())


# -- simulated dcgm-exporter history ------------------------------------------------------
@pytest.fixture(scope="module")
def sim() -> dict[str, np.ndarray]:
    """2 nodes x 8 GPUs x 6 h at 60 s, columnar (GpuSample field names)."""
    spec = FleetSpec(nodes=2, seed=3, start=START)
    chunk = list(FleetSimulator(spec, simulate_incidents(spec, 1)).history(
        START, START + dt.timedelta(hours=HOURS), 60))
    assert len(chunk) == 1
    return chunk[0].samples


# -- a fake server with the real API's JSON shapes -----------------------------------------
@functools.lru_cache(maxsize=65536)
def _prom_float(v: float) -> str:  # cached: a few thousand distinct values
    """Go's strconv.FormatFloat(v, 'f', -1, 64), as Prometheus renders sample values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(float(v), trim="-")


class FakePrometheus:
    """Answers ``/api/v1/query_range`` for ``{__name__="X",...}`` / ``{__name__=~"X",...}``
    selectors with Prometheus' evaluation (latest sample within 5 min of each step)."""

    _SEL = re.compile(r'^\{__name__(=~?)"([^"]+)"((?:,[a-zA-Z_]+="[^"]*")*)\}$')

    def __init__(self, series: list[Series]) -> None:
        self.series = series
        self.rendered = [[[int(t), _prom_float(v)] for t, v in zip(ts.tolist(), values, strict=True)]
                         for _, _, ts, values in series]
        self.requests: list[str] = []

    def fetch(self, url: str, timeout_s: float) -> bytes:
        self.requests.append(url)
        parts = urllib.parse.urlsplit(url)
        assert parts.path == "/api/v1/query_range"
        q = dict(urllib.parse.parse_qsl(parts.query))
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        if (end - start) / step > 11_000:
            raise urllib.error.HTTPError(url, 400, "Bad Request", {},  # type: ignore[arg-type]
                                         _BytesIO((FIXTURES / "error_400_max_resolution.json").read_bytes()))
        m = self._SEL.match(q["query"])
        if m is None:
            raise urllib.error.HTTPError(url, 400, "Bad Request", {},  # type: ignore[arg-type]
                                         _BytesIO((FIXTURES / "error_400_bad_data.json").read_bytes()))
        op, pattern, extra = m.groups()
        want = dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', extra))
        grid = np.arange(start, end + step / 2, step)
        result = []
        for (name, labels, ts, values), rendered in zip(self.series, self.rendered, strict=True):
            if not (name == pattern if op == "=" else re.fullmatch(pattern, name)):
                continue
            if any(labels.get(k) != v for k, v in want.items()):
                continue
            idx = np.searchsorted(ts, grid, side="right") - 1
            ok = (idx >= 0) & (grid - ts[np.maximum(idx, 0)] <= 300)
            if ok.all() and (ts[idx] == grid).all() and (np.diff(idx) == 1).all():
                pts = rendered[idx[0]:idx[-1] + 1]  # the grid is the scrape times
            else:
                pts = [[int(t) if float(t).is_integer() else float(t), _prom_float(values[i])]
                       for t, i, good in zip(grid.tolist(), idx.tolist(), ok.tolist(), strict=True)
                       if good]
            if pts:
                result.append({"metric": {"__name__": name, **labels}, "values": pts})
        return json.dumps({"status": "success",
                           "data": {"resultType": "matrix", "result": result}}).encode()


class _BytesIO:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, *_: Any) -> bytes:
        return self.data

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def series(sim: dict[str, np.ndarray]) -> list[Series]:
    return dcgm_series(sim)


@pytest.fixture(scope="module")
def prometheus(series: list[Series], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a private Prometheus holding the simulated history."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool not on PATH: run deploy/prometheus/install.sh")
    with running_prometheus(series, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


@pytest.fixture(params=["real", "fake"])
def server(request: pytest.FixtureRequest,
           series: list[Series]
           ) -> tuple[str, Callable[[str, float], bytes]]:
    """(url, fetch) of the real server or of the fake."""
    if request.param == "real":
        return request.getfixturevalue("prometheus"), urllib_fetch
    fake = FakePrometheus(series)
    return "http://prometheus.test:9090", fake.fetch


# -- helpers ------------------------------------------------------------------------------------
def _table(db: Path) -> dict[str, list[Any]]:
    with Store(db, read_only=True) as store:
        cur = store.cursor()
        rows = cur.execute(schema.contract_samples_sql() + " ORDER BY t.gpu_uuid, t.ts"
                           ).fetchall()  # every sample whole again, NVLink lists included
        names = [d[0] for d in cur.description]
    return {name: [r[i] for r in rows] for i, name in enumerate(names)}


def _expected(sim: dict[str, np.ndarray]) -> dict[str, list[Any]]:
    order = np.lexsort((sim["ts"], sim["gpu_uuid"]))
    out: dict[str, list[Any]] = {}
    n = len(order)
    for name in schema.SAMPLE_COLUMNS:
        if name in ("nvlink_up", "retired_pages_sbe", "retired_pages_dbe",
                    "retired_pages_pending"):
            out[name] = [None] * n  # no dcgm-exporter series / DCGM blank
        elif name == "ts":
            out[name] = [t.replace(tzinfo=None) for t in sim["ts"][order].tolist()]
        else:
            out[name] = sim[name][order].tolist()
    return out


def _assert_equal_tables(got: dict[str, list[Any]], want: dict[str, list[Any]]) -> None:
    assert len(got["ts"]) == len(want["ts"])
    for name in schema.SAMPLE_COLUMNS:
        if got[name] != want[name]:
            i = next(k for k, (a, b) in enumerate(zip(got[name], want[name], strict=True))
                     if a != b)
            raise AssertionError(f"column {name} row {i}: got {got[name][i]!r}, "
                                 f"want {want[name][i]!r} ({got['gpu_uuid'][i]} {got['ts'][i]})")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetcare.api.cli", "backfill", *argv],
                          capture_output=True, text=True, timeout=300)


# -- the real server, through the CLI -------------------------------------------------------------
def test_cli_backfills_exact_history_from_a_real_prometheus(
        prometheus: str, sim: dict[str, np.ndarray], tmp_path: Path) -> None:
    db = tmp_path / "fleet.duckdb"
    proc = _cli("--prometheus", prometheus, "--since", START.isoformat(),
                "--until", LAST.isoformat(), "--db", str(db), "--step", "60s", "--chunk", "2h",
                "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["chunks"] == 3 and out["samples"] == out["added"] == 16 * HOURS * 60
    assert out["resumed"] is False

    got = _table(db)
    # a few cells, spelled out
    row_of = {(u, t): i for i, (u, t) in enumerate(zip(got["gpu_uuid"], got["ts"], strict=True))}
    for k in (0, 17, 2000, 5759):
        r = row_of[(sim["gpu_uuid"][k], sim["ts"][k].tolist())]
        assert got["node"][r] == sim["node"][k]
        assert got["gpu_index"][r] == sim["gpu_index"][k]
        assert got["power_w"][r] == sim["power_w"][k]
        assert got["gpu_temp_c"][r] == sim["gpu_temp_c"][k]
        assert got["sm_clock_mhz"][r] == sim["sm_clock_mhz"][k]
        assert got["clock_event_reasons"][r] == sim["clock_event_reasons"][k]
        assert got["nvlink_crc_flit"][r] == sim["nvlink_crc_flit"][k].tolist()
        assert got["retired_pages_sbe"][r] is None  # DCGM blank → null, never 0
    # and every cell
    _assert_equal_tables(got, _expected(sim))

    again = _cli("--prometheus", prometheus, "--since", START.isoformat(),
                 "--until", LAST.isoformat(), "--db", str(db), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["chunks"] == 0  # already done: nothing refetched


def test_cli_reports_a_refused_query_with_the_fix(prometheus: str, tmp_path: Path) -> None:
    proc = _cli("--prometheus", prometheus, "--since", START.isoformat(), "--until",
                LAST.isoformat(), "--db", str(tmp_path / "f.duckdb"), "--match", "cluster=a")
    assert proc.returncode == 1
    assert "HTTP 400, bad_data" in proc.stderr and "--match" in proc.stderr


# -- interruption and resume (real server and fake) ------------------------------------------------
def test_interrupted_backfill_resumes_without_duplicates(
        server: tuple[str, Callable[[str, float], bytes]], sim: dict[str, np.ndarray],
        tmp_path: Path) -> None:
    url, fetch = server
    calls = 0

    def flaky(u: str, timeout_s: float) -> bytes:
        nonlocal calls
        calls += 1
        if calls > 2 * QUERIES + 5:  # dies in the middle of the third chunk
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        return fetch(u, timeout_s)

    store = Store(tmp_path / "f.duckdb")
    seen: list[tuple[int, int]] = []
    with pytest.raises(PrometheusUnreachable, match="cannot reach Prometheus"):
        backfill(store, url, START, LAST, chunk_s=3600, fetch=flaky,
                 progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 6), (1, 6), (2, 6)]
    assert store.get_meta(progress_key(url)) == "2025-06-01T02:00:00+00:00"
    n = store.cursor().execute("SELECT count(*) FROM telemetry").fetchone()
    assert n == (16 * 120,)

    res = backfill(store, url, START, LAST, chunk_s=3600, fetch=fetch)
    assert res.resumed and res.chunks == 4
    assert res.start == START + dt.timedelta(hours=2) and res.end == LAST
    assert res.added == res.samples == 16 * 240
    dups = store.cursor().execute(
        "SELECT count(*) FROM (SELECT gpu_uuid, ts FROM telemetry GROUP BY ALL "
        "HAVING count(*) > 1)").fetchone()
    assert dups == (0,)
    store.close()
    _assert_equal_tables(_table(tmp_path / "f.duckdb"), _expected(sim))

    with Store(tmp_path / "f.duckdb") as store:
        assert backfill(store, url, START, LAST, chunk_s=3600, fetch=fetch).chunks == 0
        hour = START + dt.timedelta(minutes=59)
        redo = backfill(store, url, START, hour, chunk_s=1800, fetch=fetch, restart=True)
        assert (redo.chunks, redo.samples, redo.added) == (2, 16 * 60, 0)


def test_node_label_names_the_node(server: tuple[str, Callable[[str, float], bytes]],
                                   tmp_path: Path) -> None:
    url, fetch = server
    with Store(tmp_path / "f.duckdb") as store:
        backfill(store, url, START, START + dt.timedelta(minutes=4), fetch=fetch,
                 node_label="kubernetes_node", match='job="dcgm-exporter"')
        nodes = store.cursor().execute(
            "SELECT node, count(*) FROM telemetry GROUP BY 1 ORDER BY 1").fetchall()
    assert nodes == [("k8s-node-00000", 40), ("k8s-node-00001", 40)]


def test_an_earlier_since_fetches_the_older_range_too(
        server: tuple[str, Callable[[str, float], bytes]], tmp_path: Path) -> None:
    url, fetch = server
    with Store(tmp_path / "f.duckdb") as store:
        until = START + dt.timedelta(minutes=119)
        late = backfill(store, url, START + dt.timedelta(hours=1), until, fetch=fetch)
        assert late.added == 16 * 60
        full = backfill(store, url, START, until, fetch=fetch)
        assert not full.resumed and full.added == 16 * 60
        assert store.cursor().execute("SELECT count(*) FROM telemetry").fetchone() == (16 * 120,)


# -- chunking, queries, mapping ------------------------------------------------------------------------
def test_chunks_cover_the_step_grid_once() -> None:
    got = list(chunks(90.0, 1000.0, 60.0, 300.0))
    assert got == [(120.0, 360.0), (420.0, 660.0), (720.0, 960.0)]
    points = [t for a, b in got for t in np.arange(a, b + 1, 60.0)]
    assert points == list(np.arange(120.0, 1000.0, 60.0))
    assert list(chunks(0.0, 0.0, 60.0, 3600.0)) == [(0.0, 0.0)]
    assert list(chunks(61.0, 100.0, 60.0, 3600.0)) == []


def test_one_query_per_mapped_metric_with_extra_matchers() -> None:
    qs = metric_queries('cluster="a"')
    assert len(qs) == len(FIELD_MAP) + len(NVLINK_MAP)
    assert '{__name__="DCGM_FI_DEV_GPU_TEMP",cluster="a"}' in qs
    assert '{__name__=~"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT(_L[0-9]+)?",cluster="a"}' in qs


def test_matrix_rows_group_metrics_by_gpu_and_time() -> None:
    doc = json.loads((FIXTURES / "query_range_power_gpu0.json").read_text())
    link = [{"metric": {"__name__": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT", "nvlink": "2",
                        "UUID": "GPU-e8fbb7d1-aacb-9ef9-fe51-dc2b67b60d89", "gpu": "0",
                        "Hostname": "node-00000"},
             "values": [[1748736060, "7"]]},
            {"metric": {"__name__": "DCGM_FI_DEV_MEMORY_TEMP", "Hostname": "node-00000",
                        "UUID": "GPU-e8fbb7d1-aacb-9ef9-fe51-dc2b67b60d89", "gpu": "0"},
             "values": [[1748736060, "NaN"]]}]
    matrices = [decode_matrix(json.dumps(d).encode()) for d in
                (doc, {"status": "success", "data": {"resultType": "matrix", "result": link}})]
    assert None not in matrices
    rows = samples_table([m[0] for m in matrices if m is not None]).to_pylist()
    assert len(rows) == 6
    r = next(s for s in rows if s["node"] == "node-00000"
             and s["ts"] == dt.datetime(2025, 6, 1, 0, 1))
    assert (r["power_w"], r["pci_bus_id"], r["model"]) == (
        72.2, "00000000:18:00.0", "NVIDIA H100 80GB HBM3")
    assert r["nvlink_crc_flit"] == [0, 0, 7] and r["mem_temp_c"] is None
    other = next(s for s in rows if s["node"] == "node-00001"
                 and s["ts"] == dt.datetime(2025, 6, 1, 0, 2))
    assert other["power_w"] == 632.6 and other["nvlink_crc_flit"] is None


# -- errors say what is wrong and the fix --------------------------------------------------------------
def _raising(code: int, body: bytes) -> Callable[[str, float], bytes]:
    def fetch(url: str, timeout_s: float) -> bytes:
        raise urllib.error.HTTPError(url, code, "x", {}, _BytesIO(body))  # type: ignore[arg-type]
    return fetch


@pytest.mark.parametrize(("code", "fixture", "fix"), [
    (400, "error_400_max_resolution.json", "smaller --chunk or a larger --step"),
    (400, "error_400_bad_data.json", "Check --match"),
    (404, "error_404_wrong_path.txt", "base URL"),
])
def test_http_errors_carry_the_fix(code: int, fixture: str, fix: str) -> None:
    client = PrometheusClient("http://p:9090", fetch=_raising(code, (FIXTURES / fixture).read_bytes()))
    with pytest.raises(PrometheusApiError) as info:
        client.query_range("up", 0, 60, 60)
    assert info.value.http_status == code and fix in str(info.value)


def test_error_status_and_non_json_answers() -> None:
    body = b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}'
    with pytest.raises(PrometheusApiError, match="smaller --chunk") as info:
        PrometheusClient("http://p:9090", fetch=_raising(503, body)).query_range("up", 0, 60, 60)
    assert info.value.error_type == "timeout"
    with pytest.raises(PrometheusApiError, match="did not answer with Prometheus API JSON"):
        PrometheusClient("http://p:9090", fetch=lambda u, t: b"<html>Grafana</html>"
                         ).query_range("up", 0, 60, 60)
    with pytest.raises(PrometheusApiError, match="refused the query"):
        PrometheusClient("http://p:9090", fetch=lambda u, t: body).query_range("up", 0, 60, 60)


def test_unreachable_server_and_bad_arguments(tmp_path: Path) -> None:
    port = free_port()
    with Store(tmp_path / "f.duckdb") as store:
        with pytest.raises(PrometheusUnreachable, match=r"curl http://127.0.0.1:\d+/-/ready"):
            backfill(store, f"http://127.0.0.1:{port}", START, LAST, timeout_s=5)
        with pytest.raises(BackfillError, match="at most 11,000"):
            backfill(store, "http://p:9090", START, LAST, step_s=1, chunk_s=86400)
        with pytest.raises(BackfillError, match="not an http"):
            backfill(store, "prometheus:9090", START, LAST)
        with pytest.raises(BackfillError, match="is not after the start"):
            backfill(store, "http://p:9090", LAST, START)


def test_cli_usage_and_operational_errors(tmp_path: Path) -> None:
    bad = _cli("--prometheus", "http://127.0.0.1:9", "--since", "yesterday",
               "--db", str(tmp_path / "f.duckdb"))
    assert bad.returncode == 1 and "--since 'yesterday' is not understood" in bad.stderr
    down = _cli("--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "1h",
                "--db", str(tmp_path / "f.duckdb"))
    assert down.returncode == 1 and "cannot reach Prometheus" in down.stderr
