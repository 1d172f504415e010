"""The API's latest-scores snapshot: how long one rebuild takes after a scoring run
(simulated scores).

A DuckDB store holding ``--runs`` scoring runs of every GPU and node (what
``scoring.prune`` keeps between hourly ones), written as the scorer writes them
(``_score_runs.Scorer``, as ``bench_api_load.py`` writes its scoring history). Timed,
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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import report
from _score_runs import Scorer

from fleetcare.api import latest_scores
from fleetcare.models import scoring
from fleetcare.pipeline.store import Store


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
        scorer = Scorer.synthetic(store, "NVIDIA H100 80GB HBM3", args.nodes, 8)
        t0 = dt.datetime(2026, 3, 1)
        for k in range(args.runs):
            scorer.run(t0 + dt.timedelta(minutes=k))
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
