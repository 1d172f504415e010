"""The API's latest-scores snapshot: how long one rebuild takes after a scoring run
(simulated scores).

A DuckDB store holding ``--runs`` scoring runs of every GPU and node (what
``scoring.prune`` keeps between hourly ones), written by ``scoring.write_run`` with
reasons on the riskiest ``scoring.EXPLAIN_TOP`` GPUs as the scorer writes them. Timed,
median of ``--repeat``: ``scoring.read_latest`` (the read inside the rebuild), the same
rows read through the ``latest_*`` views (the way it read them before: the comparison,
same run), and ``latest_scores.build`` whole (read plus the Python rows the API serves),
wall and CPU seconds. The rebuild runs after every scoring run in the scorer's thread;
its interpreter time delays API requests meanwhile (``bench_api_load.py``).

    .venv/bin/python bench/bench_snapshot.py [--nodes 2048] [--runs 60]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _common import report

from fleetcare.api import latest_scores
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store

SENTENCES = ["uncorrectable ECC errors: 3 in 24 h (fleet median 0)",
             "row remap failures rising: 2 in 7 d", "XID 79 (fallen off the bus) once in 24 h"]


def write_runs(store: Store, nodes: int, gpus: int, runs: int) -> None:
    names = np.array([f"node-{i:05d}" for i in range(nodes)])
    node_col = np.repeat(names, gpus)
    uuids = np.array([f"GPU-{i:08d}" for i in range(nodes * gpus)])
    index = np.tile(np.arange(gpus), nodes)
    rng = np.random.default_rng(1)
    t0 = dt.datetime(2026, 3, 1)
    for k in range(runs):
        ts = t0 + dt.timedelta(minutes=k)
        risk = rng.beta(0.3, 20.0, size=nodes * gpus)
        order = np.argsort(-risk, kind="stable")
        explained = set(order[:scoring.EXPLAIN_TOP].tolist())
        gpu = pa.table({
            "ts": pa.array([ts] * len(order), pa.timestamp("us")), "node": node_col[order],
            "gpu_uuid": uuids[order], "gpu_index": pa.array(index[order], pa.int64()),
            "model": ["NVIDIA H100 80GB HBM3"] * len(order), "risk": risk[order],
            "reasons": [json.dumps(SENTENCES) if i in explained else "[]" for i in order],
            "model_id": ["bench"] * len(order)}, schema=scoring.GPU_SCHEMA)
        per_node = risk.reshape(nodes, gpus)
        node_risk = 1.0 - np.prod(1.0 - per_node, axis=1)
        top = per_node.argmax(axis=1)
        node_order = np.lexsort((names, -node_risk))
        node = pa.table({
            "ts": pa.array([ts] * nodes, pa.timestamp("us")), "node": names[node_order],
            "risk": node_risk[node_order],
            "reasons": [json.dumps([f"GPU {top[i]}: {s}" for s in SENTENCES])
                        for i in node_order],
            "top_gpu_uuid": [uuids[i * gpus + top[i]] for i in node_order],
            "model_id": ["bench"] * nodes}, schema=scoring.NODE_SCHEMA)
        scoring.write_run(store, ts, "bench", gpu, node)


def median_of(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return {"wall_s": round(float(np.median(wall)), 4), "cpu_s": round(float(np.median(cpu)), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2048, help="8 GPUs each")
    p.add_argument("--runs", type=int, default=60, help="scoring runs in the tables")
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "scores.duckdb")
        scoring.ensure_schema(store)
        write_runs(store, args.nodes, 8, args.runs)
        cur = store.cursor()

        def views() -> None:
            cur.sql("SELECT * FROM latest_node_scores").to_arrow_table()
            cur.sql("SELECT * FROM latest_gpu_scores").to_arrow_table()

        read = median_of(lambda: scoring.read_latest(cur), args.repeat)
        via_views = median_of(views, args.repeat)
        build = median_of(lambda: latest_scores.build(cur), args.repeat)
        cur.close()
        store.close()
    report("snapshot", {
        "gpus": args.nodes * 8, "score_runs": args.runs, "read_latest": read,
        "read_through_views": via_views,
        "read_ratio": round(read["wall_s"] / via_views["wall_s"], 3),
        "build": build})


if __name__ == "__main__":
    main()
