"""The risk API under a steady request rate while ingest writes (simulated data).

One service process, as in production: a DuckDB database with a simulated fleet's
history, uvicorn serving the API (auth on, a read token) on a real loopback port, and an
ingest thread landing one fleet tick of live simulated telemetry every ``--tick-s``
seconds (``Store.insert_sample_columns``, the ingest path) plus a new scoring round
every ``--score-every`` seconds. The scores are synthetic rows in the scorer's tables
(model cost is bench_fleet_scoring's subject, not this one's).

A separate client process holds ``--rate`` requests/s for ``--duration`` s, half
``GET /v1/risk?limit=100``, half ``GET /v1/nodes/{node}`` (random node), open loop:
each request has a scheduled send time; latency is measured from the actual send
(``latency_*``) and from the scheduled time (``sched_latency_*``, which includes any
queueing when the server falls behind: no coordinated omission).

    .venv/bin/python bench/bench_api_load.py [--nodes 256] [--rate 100] [--duration 60]
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import report

from fleetcare.api import auth
from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.models.scoring import DDL as SCORE_DDL
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def client(base: str, token: str, nodes: list[str], rate: float, duration: float,
           workers: int, out: Any) -> None:
    """Open-loop load: ``workers`` threads share one schedule of ``rate`` requests/s."""
    import httpx

    n = int(rate * duration)
    start = time.perf_counter() + 0.5
    lock = threading.Lock()
    nxt = [0]
    lat: list[float] = []
    sched: list[float] = []
    errors: dict[str, int] = {}
    by_path = {"risk": 0, "node": 0}

    def work(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=base, timeout=10,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= n:
                    return
                due = start + i / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                kind = "risk" if i % 2 == 0 else "node"
                path = "/v1/risk?limit=100" if kind == "risk" else f"/v1/nodes/{rng.choice(nodes)}"
                t0 = time.perf_counter()
                try:
                    status = http.get(path).status_code
                    err = None if status == 200 else f"HTTP {status}"
                except httpx.HTTPError as exc:
                    err = type(exc).__name__
                t1 = time.perf_counter()
                with lock:
                    if err:
                        errors[err] = errors.get(err, 0) + 1
                    else:
                        lat.append(t1 - t0)
                        sched.append(t1 - due)
                        by_path[kind] += 1

    threads = [threading.Thread(target=work, args=(s,)) for s in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    out.put({
        "requests": n, "ok": len(lat), "errors": sum(errors.values()), "error_kinds": errors,
        "achieved_rps": round(len(lat) / elapsed, 1), "risk_requests": by_path["risk"],
        "node_requests": by_path["node"],
        "latency_p50_ms": _pct(lat, 50), "latency_p99_ms": _pct(lat, 99),
        "latency_max_ms": _pct(lat, 100),
        "sched_latency_p50_ms": _pct(sched, 50), "sched_latency_p99_ms": _pct(sched, 99),
    })


def _ticks(sim: FleetSimulator, start: dt.datetime, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` one-minute fleet ticks of live telemetry after ``start``, one dict each."""
    out = []
    for chunk in sim.history(start, start + dt.timedelta(minutes=n), interval_s=60):
        ts = chunk.samples["ts"]
        for t in np.unique(ts):
            mask = ts == t
            out.append({k: v[mask] for k, v in chunk.samples.items()})
    return out[:n]


def _score_round(store: Store, nodes: list[str], gpus: int, ts: dt.datetime,
                 rng: np.random.Generator, model: str) -> None:
    """One scoring round in the scorer's tables: a risk per GPU, max per node."""
    risk = rng.beta(0.3, 20.0, size=(len(nodes), gpus))
    cur = store.cursor()
    try:
        node_rows = [(ts, n, float(risk[i].max()), '["synthetic score"]',
                      f"GPU-{n}-{int(risk[i].argmax())}", "bench")
                     for i, n in enumerate(nodes)]
        gpu_rows = [(ts, n, f"GPU-{n}-{g}", g, model, float(risk[i, g]), "[]", "bench")
                    for i, n in enumerate(nodes) for g in range(gpus)]
        cur.executemany("INSERT INTO node_scores VALUES (?, ?, ?, ?, ?, ?)", node_rows)
        cur.executemany("INSERT INTO gpu_scores VALUES (?, ?, ?, ?, ?, ?, ?, ?)", gpu_rows)
    finally:
        cur.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--history-hours", type=float, default=6)
    p.add_argument("--rate", type=float, default=100, help="requests/s to hold")
    p.add_argument("--duration", type=float, default=60, help="seconds of load")
    p.add_argument("--workers", type=int, default=8, help="client threads")
    p.add_argument("--tick-s", type=float, default=1.0,
                   help="wall seconds between live fleet ticks (one per simulated minute)")
    p.add_argument("--score-every", type=float, default=15.0,
                   help="wall seconds between scoring rounds")
    args = p.parse_args()

    spec = FleetSpec(nodes=args.nodes, seed=3)
    hist_end = spec.start + dt.timedelta(hours=args.history_hours)
    live_ticks = int(args.duration / args.tick_s) + 30  # spare: stops when the load ends
    sim = FleetSimulator(spec, simulate_incidents(spec, args.history_hours / 24 + 1))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "fleet.duckdb")
        store.con.execute(SCORE_DDL).fetchall()
        t0 = time.perf_counter()
        loaded = load_history(store, sim, spec.start, hist_end, interval_s=300)
        nodes = sorted(r[0] for r in store.con.execute(
            "SELECT DISTINCT node FROM telemetry").fetchall())
        model = store.con.execute("SELECT any_value(model) FROM telemetry").fetchone()[0]
        rng = np.random.default_rng(1)
        for h in range(int(args.history_hours)):  # an hourly scoring history
            _score_round(store, nodes, spec.gpus_per_node,
                         (spec.start + dt.timedelta(hours=h + 1)).replace(tzinfo=None), rng, model)
        ticks = _ticks(sim, hist_end, live_ticks)
        setup_s = time.perf_counter() - t0

        token, _ = auth.create_token(store.cursor(), "read", name="bench")
        server, thread = start_server_thread(create_app(store))
        base = f"http://127.0.0.1:{bound_port(server)}"

        stop = threading.Event()
        ingested: dict[str, Any] = {"ticks": 0, "samples": 0, "score_rounds": 0,
                                    "max_tick_s": 0.0, "begin": 0.0, "end": 1.0}

        def ingest() -> None:
            """One fleet tick every tick_s; a scoring round every score_every (wall)."""
            begin = time.perf_counter()
            ingested["begin"] = begin
            last_score = begin
            for i, tick in enumerate(ticks):
                due = begin + i * args.tick_s
                if stop.wait(max(0.0, due - time.perf_counter())):
                    return
                w0 = time.perf_counter()
                ingested["samples"] += store.insert_sample_columns(tick)
                ingested["ticks"] += 1
                if time.perf_counter() - last_score >= args.score_every:
                    ts = tick["ts"][0].astype("datetime64[us]").astype(dt.datetime)
                    _score_round(store, nodes, spec.gpus_per_node, ts, rng, model)
                    ingested["score_rounds"] += 1
                    last_score = time.perf_counter()
                ingested["max_tick_s"] = max(ingested["max_tick_s"], time.perf_counter() - w0)
                ingested["end"] = time.perf_counter()

        writer = threading.Thread(target=ingest, name="bench-ingest", daemon=True)
        ctx = mp.get_context("spawn")
        results: Any = ctx.Queue()
        load = ctx.Process(target=client, args=(base, token, nodes, args.rate, args.duration,
                                                args.workers, results))
        writer.start()
        load.start()
        figures = results.get(timeout=args.duration + 120)
        stop.set()
        load.join(30)
        writer.join(30)
        server.should_exit = True
        thread.join(10)
        store.close()
    report("api_load", {
        "nodes": args.nodes, "gpus": args.nodes * spec.gpus_per_node,
        "history_samples": loaded.samples, "setup_s": round(setup_s, 1),
        "target_rps": args.rate, "duration_s": args.duration, "client_threads": args.workers,
        **figures,
        "ingest_ticks": ingested["ticks"], "ingest_samples": ingested["samples"],
        "ingest_samples_per_s": round(
            ingested["samples"] / max(1e-9, ingested["end"] - ingested["begin"])),
        "ingest_max_tick_ms": round(ingested["max_tick_s"] * 1000, 1),
        "score_rounds": ingested["score_rounds"], "auth": "bearer (read)",
    })


if __name__ == "__main__":
    main()
