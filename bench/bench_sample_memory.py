"""The node pages' sample memory: what its every-second refresh costs while a fleet's
telemetry lands (simulated data).

A DuckDB store with ``--history-hours`` of a simulated fleet's telemetry, then
``--minutes`` live fleet ticks, each landing in ``--batches-per-tick`` batches
(``Store.insert_sample_columns``, the ingest path; default 60: one a second, as agents'
messages arrive over the minute). After each batch, as ``serve``'s keeper thread does
every second: ``LatestSamples`` refreshed (wall and CPU per refresh; checked: every GPU
of the batch is then held at its ts), and refreshed again with nothing new (``idle_*``).
The every-second refreshes are reported apart from the slack scans (every 30 s, and the
first after the load: a wider look back). Compared in the same run, for the same new
samples: a read of them through the table's own SQL (``schema.contract_samples_sql``,
lists built per row in SQL, keys given: about the second read the refresh made before it
read parts and rebuilt the lists in Python) and the ingest batch that landed them. At
16,384 GPUs the refresh shares the service's two cores and interpreter with every API
request (``bench_api_load.py``).

    .venv/bin/python bench/bench_sample_memory.py [--nodes 2048] [--minutes 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _common import report
from bench_api_load import _ticks

from fleetcare.api.latest_samples import LatestSamples
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline.schema import contract_samples_sql
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.telemetry import sql_ts


def _ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2048, help="8 GPUs each")
    p.add_argument("--history-hours", type=float, default=2,
                   help="hours of telemetry before the live ticks (5-minute samples)")
    p.add_argument("--minutes", type=int, default=3, help="live fleet ticks to land")
    p.add_argument("--batches-per-tick", type=int, default=60,
                   help="each tick lands in this many batches (a refresh after each)")
    args = p.parse_args()

    spec = FleetSpec(nodes=args.nodes, seed=3)
    hist_end = spec.start + dt.timedelta(hours=args.history_hours)
    sim = FleetSimulator(spec, simulate_incidents(spec, args.history_hours / 24 + 1))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "fleet.duckdb")
        load_history(store, sim, spec.start, hist_end, interval_s=300)
        ticks = _ticks(sim, hist_end, args.minutes)
        memory = LatestSamples()
        cur = store.cursor()
        w0 = time.perf_counter()
        memory.warm(cur)
        warm_s = time.perf_counter() - w0
        refresh_wall: list[float] = []
        refresh_cpu: list[float] = []
        slack_wall: list[float] = []
        idle_wall: list[float] = []
        table_read: list[float] = []
        insert: list[float] = []
        parts = max(1, args.batches_per_tick)
        taken = 0
        for k in range(parts * len(ticks)):
            tick = ticks[k // parts]
            rows = len(tick["ts"])
            lo, hi = rows * (k % parts) // parts, rows * (k % parts + 1) // parts
            batch = {key: v[lo:hi] for key, v in tick.items()}
            t = time.perf_counter()
            store.insert_sample_columns(batch)
            insert.append(time.perf_counter() - t)
            before, slack = memory.refreshes, memory._slack_checked
            t, c = time.perf_counter(), time.process_time()
            memory._refresh(cur, force=True)  # what the keeper thread calls
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            assert memory.refreshes == before + 1
            if memory._slack_checked != slack:
                slack_wall.append(wall)
            else:
                refresh_wall.append(wall)
                refresh_cpu.append(cpu)
            for g, ts in zip(batch["gpu_uuid"], batch["ts"].astype("datetime64[us]"),
                             strict=True):  # nothing missed
                assert memory._ts[str(g)] == ts.astype(dt.datetime), (g, ts)
            t = time.perf_counter()
            memory._refresh(cur, force=True)  # nothing new
            idle_wall.append(time.perf_counter() - t)
            keys = pa.table({"g": pa.array(batch["gpu_uuid"].astype(str), pa.string()),
                             "t": pa.array(batch["ts"].astype("datetime64[us]"),
                                           pa.timestamp("us"))})
            cur.register("_bench_keys", keys)
            since = sql_ts(keys.column("t")[0].as_py())
            t = time.perf_counter()
            got = cur.execute(contract_samples_sql(
                "EXISTS (SELECT 1 FROM _bench_keys w WHERE w.g = t.gpu_uuid AND w.t = t.ts)",
                since=since)).fetchall()
            table_read.append(time.perf_counter() - t)
            cur.unregister("_bench_keys")
            taken += len(got)
        store.close()
    out: dict[str, Any] = {
        "nodes": args.nodes, "gpus": args.nodes * spec.gpus_per_node,
        "batches": len(insert), "samples_per_batch": round(taken / len(insert), 1),
        "warm_s": round(warm_s, 2),
        "refresh_p50_ms": _ms(refresh_wall, 50), "refresh_p90_ms": _ms(refresh_wall, 90),
        "refresh_max_ms": _ms(refresh_wall, 100), "refresh_cpu_p50_ms": _ms(refresh_cpu, 50),
        "refreshes": len(refresh_wall), "slack_scans": len(slack_wall),
        "slack_scan_max_ms": _ms(slack_wall, 100) if slack_wall else None,
        "idle_refresh_p50_ms": _ms(idle_wall, 50),
        "table_read_p50_ms": _ms(table_read, 50),
        "ingest_batch_p50_ms": _ms(insert, 50),
        # the every-second refresh (find the new samples, read them, write their JSON)
        # against a read of the same samples alone through the table's SQL, keys given
        "ratio_refresh_to_table_read": round(float(np.median(refresh_wall))
                                             / float(np.median(table_read)), 2),
        "ratio_refresh_to_ingest_batch": round(float(np.median(refresh_wall))
                                               / float(np.median(insert)), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    report("sample_memory", out)


if __name__ == "__main__":
    main()
