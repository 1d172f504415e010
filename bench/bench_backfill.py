"""Backfill from a real Prometheus into DuckDB, against fetching the same history.

    .venv/bin/python bench/bench_backfill.py [--nodes 4] [--hours 24]

A private ``prometheus`` (deploy/prometheus/install.sh) is loaded with simulated
dcgm-exporter history (8 GPUs per node at 60 s) by ``promtool``. Three cases over the
same range, 6 h chunks, one query per mapped metric as ``backfill`` asks:

- ``fetch``: ``query_range`` every chunk and metric (HTTP + JSON), nothing else: the
  ceiling any backfill through Prometheus' API has;
- ``fetch+decode``: the same answers read as arrays (``query_matrix``: msgspec, values
  parsed as floats), what backfill reads;
- ``fetch+rows``: that plus the sample columns (``prom_columns.samples_table``);
- ``backfill``: ``fleetcare.pipeline.backfill.backfill`` into a fresh DuckDB file.

The ceiling is the faster of ``fetch`` and ``fetch+decode`` (``backfill_vs_ceiling``).
Figures are GPU samples per second (one sample = one GPU at one time, about a hundred
Prometheus points with NVLink per link). One run each, best of ``--repeat``; the machine
is shared, so read the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _common import report  # noqa: E402

from fleetcare.collectors.sim import FleetSpec, simulate_incidents  # noqa: E402
from fleetcare.collectors.sim.telemetry import FleetSimulator  # noqa: E402
from fleetcare.pipeline.backfill import (  # noqa: E402
    PrometheusClient,
    backfill,
    chunks,
    metric_queries,
)
from fleetcare.pipeline.prom_columns import samples_table  # noqa: E402
from fleetcare.pipeline.store import Store  # noqa: E402
from tests.pipeline.prom_history import dcgm_series, running_prometheus  # noqa: E402

START = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
CHUNK_S = 6 * 3600.0
STEP_S = 60.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes, 8 GPUs each")
    p.add_argument("--hours", type=int, default=24, help="hours of history at 60 s")
    p.add_argument("--repeat", type=int, default=2, help="runs per case (best counts)")
    args = p.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        raise SystemExit("prometheus/promtool not on PATH: run deploy/prometheus/install.sh")
    end = START + dt.timedelta(hours=args.hours)
    spec = FleetSpec(nodes=args.nodes, seed=5, start=START)
    sim = FleetSimulator(spec, simulate_incidents(spec, max(1, args.hours // 24)))
    cols: dict[str, list[np.ndarray]] = {}
    for chunk in sim.history(START, end, int(STEP_S)):
        for k, v in chunk.samples.items():
            cols.setdefault(k, []).append(v)
    samples = {k: np.concatenate(v) for k, v in cols.items()}
    series = dcgm_series(samples)
    n_samples = len(samples["ts"])
    n_points = sum(len(s[2]) for s in series)
    print(f"{n_samples:,} GPU samples as {len(series):,} series, {n_points:,} points; "
          "loading prometheus (promtool)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with running_prometheus(series, Path(tmp)) as url:
            load_s = time.perf_counter() - t0
            a, b = START.timestamp(), (end - dt.timedelta(minutes=1)).timestamp()
            plan = list(chunks(a, b, STEP_S, CHUNK_S))
            queries = metric_queries()
            client = PrometheusClient(url, timeout_s=300)

            def fetch(how: str) -> int:
                n = 0
                for c0, c1 in plan:
                    if how == "json":
                        for q in queries:
                            client.query_range(q, c0, c1, STEP_S)
                        continue
                    results = [client.query_matrix(q, c0, c1, STEP_S) for q in queries]
                    n += samples_table(results).num_rows if how == "rows" else 0
                return n

            def full(k: int) -> int:
                with Store(Path(tmp) / f"b{k}.duckdb") as store:
                    return backfill(store, url, START, end - dt.timedelta(minutes=1),
                                    step_s=STEP_S, chunk_s=CHUNK_S).added

            best: dict[str, float] = {}
            got: dict[str, int] = {}
            for k in range(args.repeat):
                for name, fn in (("fetch", lambda: fetch("json")),
                                 ("fetch+decode", lambda: fetch("decode")),
                                 ("fetch+rows", lambda: fetch("rows")),
                                 ("backfill", lambda k=k: full(k))):
                    print(f"run {k + 1}/{args.repeat}: {name}", file=sys.stderr)
                    t = time.perf_counter()
                    got[name] = fn()
                    best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
    if got["backfill"] != n_samples or got["fetch+rows"] != n_samples:
        raise SystemExit(f"backfill landed {got['backfill']:,} and fetch+rows made "
                         f"{got['fetch+rows']:,} samples of {n_samples:,}: not a fair timing")
    rate = {k: n_samples / v for k, v in best.items()}
    report("backfill", {
        "nodes": args.nodes, "gpus": args.nodes * 8, "hours": args.hours,
        "gpu_samples": n_samples, "prometheus_points": n_points, "chunks": len(plan),
        "queries_per_chunk": len(queries), "promtool_load_s": round(load_s, 1),
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "gpu_samples_per_s": {k: round(v) for k, v in rate.items()},
        # the ceiling: the faster way of only fetching the answers
        "ceiling": max(("fetch", "fetch+decode"), key=lambda k: rate[k]),
        "backfill_vs_ceiling": round(rate["backfill"] / max(rate["fetch"], rate["fetch+decode"]), 3),
        "backfill_vs_fetch": round(rate["backfill"] / rate["fetch"], 3),
        "rows_vs_fetch": round(rate["fetch+rows"] / rate["fetch"], 3),
    })


if __name__ == "__main__":
    main()
