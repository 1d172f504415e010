"""The risk API under a steady request rate while ingest and scoring write (simulated data).

One service process, as in production: a DuckDB database (opened from a niced thread as
``serve`` opens it, so DuckDB's workers run niced; ``--duckdb-workers-unniced`` for the
code before) with a simulated fleet's history and a scoring history of production size (``--score-runs`` runs of every GPU,
what ``scoring.prune`` keeps between hourly ones), uvicorn serving the API (auth on, a
read token) on a real loopback port. Writers, each a thread of its own as in ``serve``
and niced as its loops are: an ingest thread landing one fleet tick of
live simulated telemetry every ``--tick-s`` seconds (default 60, the agents' rate: 16,384
samples a minute at 2,048 nodes) in ``--batches-per-tick`` batches spread over the
minute as messages arrive (``Store.insert_sample_columns``, the ingest path; ``--tick-s 1
--batches-per-tick 1`` lands an hour of telemetry a minute, a stress case) and a
scorer running a cycle every ``--score-every`` seconds (default 15: four times
``serve``'s default of 60 s, a heavier cadence). ``--scorer service`` (the default) runs
the service's own cycle, ``Service.rescore`` as ``serve``'s scoring loop does: rollups of
the new telemetry, the live features, the shipped prior's predictions and explanations,
the scoring run's write (which also rebuilds the API's in-memory latest scores), the
alert engine's evaluation (no sinks configured) and the next hour's feature base. ``--scorer write`` only writes runs of production size with
random risks (``scoring.write_run``: every GPU and node, reasons JSON on every row,
sentences on the riskiest 2,000 GPUs as ``scoring.EXPLAIN_TOP``; the figures before
2026-12-07), leaving out the model's compute, which shares the two cores with the API in
a real ``serve``.

A separate client process holds ``--rate`` requests/s, half ``GET /v1/risk?limit=100``,
half ``GET /v1/nodes/{node}`` (random node), open loop: each request has a scheduled send
time; latency is measured from the actual send (``latency_*``) and from the scheduled time
(``sched_latency_*``, which includes queueing when the server falls behind: no
coordinated omission). Requests not answered by the end of the phase plus 10 s count as
errors (``not_sent``).

Two phases in one run, same server, same rate, same mix, after ``--warmup`` seconds of
unmeasured load (the server's first requests are slow once: ``warmup_p99_ms``): ``quiet``
(writers paused: the ceiling) then ``writing``. The figure is the writing phase's
scheduled p99; the ratio is the quiet p99 over it (1.0: the writes cost readers nothing). ``--find-saturation`` then
steps the rate up, writers on, and reports the highest rate held (achieved >= 98 % of the
rate, no errors) with a scheduled p99 under ``--p99-ms``.

    .venv/bin/python bench/bench_api_load.py --nodes 2048 --rate 200 [--find-saturation]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import multiprocessing as mp
import random
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import report
from _score_runs import Scorer

from fleetcare.api import auth, priority, queries
from fleetcare.api.alerts import AlertEngine, load_config
from fleetcare.api.app import create_app
from fleetcare.api.server import bound_port, start_server_thread
from fleetcare.api.service import Service
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.sparse_links import Column
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.models import prior, scoring
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def client(base: str, token: str, nodes: list[str], rate: float, duration: float,
           workers: int, out: Any) -> None:
    """Open-loop load: ``workers`` threads share one schedule of ``rate`` requests/s.

    The standard library's keep-alive HTTP client, not httpx: the client shares the
    machine's two cores with the server, and httpx cost several times its CPU."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base)
    # The client's own collector must not stall the schedule: its first full pass over
    # the modules a spawned process imported (numpy, pyarrow, fleetcare) took 70-100 ms
    # at the start of every phase, counted against the server. As the server does.
    gc.collect()
    gc.freeze()
    n = int(rate * duration)
    start = time.perf_counter() + 0.5
    deadline = start + duration + 10.0
    lock = threading.Lock()
    nxt = [0]
    lat: list[float] = []
    sched: list[float] = []
    errors: dict[str, int] = {}
    by_path = {"risk": 0, "node": 0}
    headers = {"Authorization": f"Bearer {token}"}

    def work(seed: int) -> None:
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                conn.close()
                return
            due = start + i / rate
            if time.perf_counter() > deadline:
                with lock:
                    errors["not_sent"] = errors.get("not_sent", 0) + 1
                continue
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            kind = "risk" if i % 2 == 0 else "node"
            path = "/v1/risk?limit=100" if kind == "risk" else f"/v1/nodes/{rng.choice(nodes)}"
            t0 = time.perf_counter()
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                resp.read()
                err = None if resp.status == 200 else f"HTTP {resp.status}"
            except (OSError, http.client.HTTPException) as exc:
                err = type(exc).__name__
                conn.close()
                conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
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
        "rate": rate, "requests": n, "ok": len(lat), "errors": sum(errors.values()),
        "error_kinds": errors, "achieved_rps": round(len(lat) / elapsed, 1),
        "risk_requests": by_path["risk"], "node_requests": by_path["node"],
        "latency_p50_ms": _pct(lat, 50), "latency_p99_ms": _pct(lat, 99),
        "latency_max_ms": _pct(lat, 100),
        "sched_latency_p50_ms": _pct(sched, 50), "sched_latency_p99_ms": _pct(sched, 99),
        "client_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    })


def _ticks(sim: FleetSimulator, start: dt.datetime, n: int) -> list[dict[str, Column]]:
    """``n`` one-minute fleet ticks of live telemetry after ``start``, one dict each."""
    out = []
    for chunk in sim.history(start, start + dt.timedelta(minutes=n), interval_s=60):
        ts = chunk.samples["ts"]
        for t in np.unique(ts):
            mask = ts == t
            out.append({k: v[mask] for k, v in chunk.samples.items()})
    return out[:n]


def _hog(duty: float, stop: Any) -> None:
    """Busy ``duty`` of every 100 ms until ``stop`` is set: another tenant of the host,
    made repeatable (``--cpu-hog``)."""
    while not stop.is_set():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.1 * duty:
            pass
        stop.wait(0.1 * (1 - duty))


def _phase(base: str, token: str, nodes: list[str], rate: float, duration: float,
           workers: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    load = ctx.Process(target=client, args=(base, token, nodes, rate, duration, workers,
                                            results))
    load.start()
    figures: dict[str, Any] = results.get(timeout=duration + 120)
    load.join(30)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2048, help="8 GPUs each")
    p.add_argument("--history-hours", type=float, default=2,
                   help="hours of raw telemetry before the live ticks")
    p.add_argument("--score-runs", type=int, default=60,
                   help="scoring runs already in the tables (prune keeps 60 plus hourly)")
    p.add_argument("--rate", type=float, default=200, help="requests/s to hold")
    p.add_argument("--duration", type=float, default=60, help="seconds of load per phase")
    p.add_argument("--background-nice", type=int, default=priority.BACKGROUND_NICE,
                   help="niceness levels the writers and the sample memory's keeper run "
                        "below the API's threads, as `serve`'s (0: the same priority)")
    p.add_argument("--warmup", type=float, default=5,
                   help="seconds of unmeasured load before the phases (writers paused)")
    p.add_argument("--workers", type=int, default=32, help="client threads")
    p.add_argument("--tick-s", type=float, default=60.0,
                   help="wall seconds per live fleet tick (one simulated minute; default 60: "
                        "the agents' real rate; 1 lands 60 minutes of telemetry a minute)")
    p.add_argument("--batches-per-tick", type=int, default=60,
                   help="each tick lands in this many batches spread over it, as agents' "
                        "messages arrive through the minute (default 60: one a second)")
    p.add_argument("--score-every", type=float, default=15.0,
                   help="wall seconds between scoring runs")
    p.add_argument("--scorer", choices=("service", "write"), default="service",
                   help="service: the service's scoring cycle (rollups, features, the "
                        "prior's scores and reasons, the write); write: only the write of "
                        "a run with random risks (the figures before 2026-12-07)")
    p.add_argument("--duckdb-threads", type=int, default=0,
                   help="DuckDB's threads after setup (0: DuckDB's default, one per core)")
    p.add_argument("--duckdb-workers-unniced", action="store_true",
                   help="open the database from the main thread, so DuckDB's workers run at "
                        "the API's priority (the code before 2026-12-07; `serve` opens it "
                        "from a niced thread: priority.niced_call)")
    p.add_argument("--cpu-hog", type=float, default=0.0, metavar="DUTY",
                   help="a process of its own busy this share of a core (0-1) for the whole "
                        "run, at the bench's priority: a noisy host, repeatable (default 0)")
    p.add_argument("--p99-ms", type=float, default=20.0, help="the p99 target")
    p.add_argument("--find-saturation", action="store_true",
                   help="after the two phases, step the rate up (writers on) and report the "
                        "highest rate held with a scheduled p99 under --p99-ms")
    p.add_argument("--steps", default="100,200,300,400,500,600,800",
                   help="rates for --find-saturation")
    p.add_argument("--step-duration", type=float, default=20.0)
    args = p.parse_args()
    if not 0 <= args.cpu_hog <= 1:
        p.error(f"--cpu-hog {args.cpu_hog}: give a share of a core between 0 and 1")
    hog_stop, hog = None, None
    if args.cpu_hog:
        ctx = mp.get_context("spawn")
        hog_stop = ctx.Event()
        hog = ctx.Process(target=_hog, args=(args.cpu_hog, hog_stop), daemon=True)
        hog.start()
    try:
        _run(args)
    finally:
        if hog is not None and hog_stop is not None:
            hog_stop.set()
            hog.join(10)


def _run(args: argparse.Namespace) -> None:
    spec = FleetSpec(nodes=args.nodes, seed=3)
    hist_end = spec.start + dt.timedelta(hours=args.history_hours)
    sim = FleetSimulator(spec, simulate_incidents(spec, args.history_hours / 24 + 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.duckdb"
        # as `serve` opens it: DuckDB's workers start niced with the database
        store = (Store(path) if args.duckdb_workers_unniced
                 else priority.niced_call(lambda: Store(path), args.background_nice))
        scoring.ensure_schema(store)
        t0 = time.perf_counter()
        loaded = load_history(store, sim, spec.start, hist_end, interval_s=300)
        nodes = sorted(r[0] for r in store.con.execute(
            "SELECT DISTINCT node FROM telemetry").fetchall())
        model = store.con.execute("SELECT any_value(model) FROM telemetry").fetchone()[0]
        scorer = Scorer.of_store(store, model)
        # a scoring history of the size prune keeps; before the newest sample with the
        # service's cycle, whose first run scores at it
        newest = store.con.execute("SELECT max(ts) FROM telemetry").fetchone()[0]
        last_run = hist_end if args.scorer == "write" else newest - dt.timedelta(minutes=1)
        for k in range(args.score_runs):
            scorer.run(last_run - dt.timedelta(minutes=args.score_runs - 1 - k))
        if args.duckdb_threads:
            store.con.execute(f"SET threads = {int(args.duckdb_threads)}")
        service, cold_s = None, None
        if args.scorer == "service":
            prior.ensure_current(store)  # what a new fleet scores with
            # as serve builds it: the alert engine evaluates each run (no sinks configured)
            service = Service(store, background_nice=args.background_nice,
                              alerts=AlertEngine.from_config(
                                  store, load_config(None),
                                  node_labels=queries.labels_reader(store)))
            c0 = time.perf_counter()
            service.rescore()  # cold: every rollup row, the first feature base, retention
            cold_s = time.perf_counter() - c0
        cycle = _ticks(sim, hist_end, 30)  # replayed, shifted in time: no duplicates
        setup_s = time.perf_counter() - t0
        threads = int(store.con.execute("SELECT current_setting('threads')").fetchall()[0][0])

        token, _ = auth.create_token(store.cursor(), "read", name="bench")
        app = create_app(store, keep_fresh=True,  # as `serve` does
                         background_nice=args.background_nice)
        server, thread = start_server_thread(app, freeze=True)  # as `serve` does
        base = f"http://127.0.0.1:{bound_port(server)}"

        writing = threading.Event()
        stop = threading.Event()
        w: dict[str, Any] = {"ticks": 0, "samples": 0, "score_runs": 0, "tick_s": [],
                             "score_s": [], "last_ts": None}

        def ingester() -> None:
            """A fleet tick every tick_s in batches_per_tick slices (wall)."""
            priority.lower_this_thread(args.background_nice)  # as the service's loops
            k = 0
            parts = max(1, args.batches_per_tick)
            every = args.tick_s / parts
            next_batch = time.perf_counter()
            while not stop.is_set():
                if not writing.wait(0.1):
                    next_batch = time.perf_counter()
                    continue
                now = time.perf_counter()
                if now < next_batch:
                    stop.wait(next_batch - now)
                    continue
                tick = cycle[(k // parts) % len(cycle)]
                rows = len(tick["ts"])
                lo, hi = rows * (k % parts) // parts, rows * (k % parts + 1) // parts
                batch = {key: v[lo:hi] for key, v in tick.items()}
                batch["ts"] = batch["ts"] + np.timedelta64(
                    30 * (k // parts // len(cycle)), "m")  # replayed, shifted: no duplicates
                w0 = time.perf_counter()
                w["samples"] += store.insert_sample_columns(batch)
                w["ticks"] += 1
                w["last_ts"] = batch["ts"][0].astype("datetime64[us]").astype(dt.datetime)
                w["tick_s"].append(time.perf_counter() - w0)
                k += 1
                next_batch += every

        def scorer_loop() -> None:
            """A scoring cycle every score_every (wall), in a thread of its own as
            serve's scoring loop (ingest goes on meanwhile)."""
            priority.lower_this_thread(args.background_nice)  # as the service's loops
            next_score = time.perf_counter()
            while not stop.is_set():
                if not writing.wait(0.1):
                    next_score = time.perf_counter() + args.score_every / 2
                    continue
                now = time.perf_counter()
                if now < next_score:
                    stop.wait(min(next_score - now, 0.1))
                    continue
                if service is None and w["last_ts"] is None:  # nothing landed to score yet
                    stop.wait(0.1)
                    continue
                s0 = time.perf_counter()
                if service is not None:
                    service.rescore()
                else:
                    scorer.run(w["last_ts"])
                w["score_runs"] += 1
                w["score_s"].append(time.perf_counter() - s0)
                next_score += args.score_every

        writers = [threading.Thread(target=f, name=f"bench-{f.__name__}", daemon=True)
                   for f in (ingester, scorer_loop)]
        for t in writers:
            t.start()
        # the server's first requests (thread pool, connections, lazily built validators)
        # took up to ~0.4 s: a short unmeasured warm-up, so the ceiling is the steady state
        warmup = _phase(base, token, nodes, args.rate, args.warmup, args.workers)
        quiet = _phase(base, token, nodes, args.rate, args.duration, args.workers)
        writing.set()
        loaded_fig = _phase(base, token, nodes, args.rate, args.duration, args.workers)
        busy_writing = sum(w["tick_s"]) + sum(w["score_s"])  # both threads' busy time
        loaded_scores = list(w["score_s"])  # the loaded phase's, not the saturation steps'
        loaded_runs = w["score_runs"]
        steps = []
        if args.find_saturation:
            for rate in (float(r) for r in args.steps.split(",")):
                fig = _phase(base, token, nodes, rate, args.step_duration, args.workers)
                steps.append(fig)
                if not _held(fig, args.p99_ms):
                    break
        stop.set()
        for t in writers:
            t.join(30)
        server.should_exit = True
        thread.join(10)
        app.state.ctx.samples.stop()
        snapshot_builds = app.state.ctx.latest.builds
        store.close()
    figure = loaded_fig["sched_latency_p99_ms"]
    ceiling = quiet["sched_latency_p99_ms"]
    out: dict[str, Any] = {
        "nodes": args.nodes, "gpus": args.nodes * spec.gpus_per_node,
        "history_samples": loaded.samples, "score_runs_before": args.score_runs,
        "setup_s": round(setup_s, 1), "target_rps": args.rate, "duration_s": args.duration,
        "client_threads": args.workers,
        "p99_ms": figure, "p99_target_ms": args.p99_ms,
        "ceiling_p99_ms_no_writes": ceiling,
        "ratio": round(ceiling / figure, 2) if figure and ceiling else None,
        "writing": loaded_fig, "quiet": quiet,
        "warmup_s": args.warmup, "warmup_p99_ms": warmup["sched_latency_p99_ms"],
        "tick_s": args.tick_s, "batches_per_tick": args.batches_per_tick,
        "ingest_batches": w["ticks"], "ingest_samples": w["samples"],
        "ingest_batch_p50_ms": _pct(w["tick_s"], 50),
        "scorer": args.scorer, "score_every_s": args.score_every, "duckdb_threads": threads,
        "cold_rescore_s": None if cold_s is None else round(cold_s, 2),
        "score_runs": loaded_runs,
        # the loaded phase's: the service's whole cycle, or only the write of random risks
        **({"rescore_p50_ms": _pct(loaded_scores, 50),
            "rescore_max_ms": _pct(loaded_scores, 100)} if service is not None else
           {"score_write_p50_ms": _pct(loaded_scores, 50),
            "score_write_max_ms": _pct(loaded_scores, 100)}),
        "writer_busy_fraction": round(busy_writing / args.duration, 2),
        "snapshot_builds": snapshot_builds,
        "server_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "auth": "bearer (read)", "background_nice": args.background_nice,
        "duckdb_workers_niced": not args.duckdb_workers_unniced, "cpu_hog": args.cpu_hog,
    }
    if args.find_saturation:
        held = [s["rate"] for s in steps if _held(s, args.p99_ms)]
        out["saturation_rps"] = max(held) if held else None
        out["saturation_steps"] = [
            {k: s[k] for k in ("rate", "achieved_rps", "errors", "sched_latency_p50_ms",
                               "sched_latency_p99_ms", "latency_p99_ms")} for s in steps]
    report("api_load", out)


def _held(fig: dict[str, Any], p99_ms: float) -> bool:
    """The rate was held: no errors, >= 98 % achieved, scheduled p99 under the target."""
    p99 = fig["sched_latency_p99_ms"]
    return (fig["errors"] == 0 and fig["achieved_rps"] >= 0.98 * fig["rate"]
            and p99 is not None and p99 < p99_ms)


if __name__ == "__main__":
    main()
