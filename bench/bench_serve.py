"""``fleetcare serve --bus kafka://`` under a fleet's load: throughput and freshness.

Two phases against the real broker (deploy/kafka), one ``fleetcare serve`` process (the
CLI, as operators run it: ingest, scoring, alerts and API in one process), a current
model in its database (a random model over the fleet's features: scoring costs the
same whatever the model learned):

1. backlog: ``--ticks`` ticks of the simulated fleet (``--gpus``, 8 per node) are on the
   topic before ``serve`` starts; its sustained rate is samples from its first committed
   offset to its last, while its scoring loop runs. The ceiling is plain consume (poll +
   decode, nothing written) of the same topic by ``bench_pipeline_ingest``'s consumer.
2. live: the agent's sim backend sends one tick of the whole fleet every ``--interval``
   seconds for ``--minutes``, stamped with the wall clock. ``/healthz`` is polled every
   0.2 s; a sample's freshness is the time from its timestamp until a score that
   includes it (a scoring run at a ts >= the sample's) is served. Also reported: the
   consumer group's lag when the producer stops, and how long until it is zero.

    .venv/bin/python bench/bench_serve.py --gpus 16384 [--interval 10] [--minutes 5]
        [--score-every 30] [--ticks N]

One run each; the machine is shared: read the ratios. Data is simulated.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import report  # noqa: E402
from bench_pipeline_ingest import run_case  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    """The simulated fleet as the agent sees it, sending one tick at a time."""

    def __init__(self, bus_url: str, prefix: str, nodes: int, spool: Path) -> None:
        from fleetcare.collectors.agent import Agent
        from fleetcare.collectors.cli import sim_backend
        from fleetcare.collectors.transport.kafka import KafkaBus

        self.backend, _ = sim_backend("bench", nodes, 1, dt.datetime.now(dt.UTC))
        self.bus = KafkaBus.from_url(bus_url, spool=spool, topic_prefix=prefix)
        self.agent = Agent([self.backend], self.bus, node="bench")
        self.samples = 0

    def tick(self, now: dt.datetime) -> None:
        for b in self.agent.batches(self.backend.poll(now), now):
            self.bus.send(b)
            self.samples += len(b.samples)
        self.bus.flush(60)

    def close(self) -> None:
        assert self.bus.spooled == 0, "the broker was unreachable: parts were spooled"
        self.bus.close()


def committed(bus: str, group: str) -> int:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bus.removeprefix("kafka://"),
                             client_id="fleetcare-bench-admin")
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return sum(max(0, o.offset) for o in offsets.values())


def end_offsets(bus: str, prefix: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bus.removeprefix("kafka://"))
    try:
        tps = [TopicPartition(t, p) for t in c.topics() if t.startswith(prefix)
               for p in c.partitions_for_topic(t) or ()]
        return sum(c.end_offsets(tps).values())
    finally:
        c.close()


def start_serve(db: Path, args: argparse.Namespace, prefix: str, group: str, port: int,
                log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fleetcare.api.cli", "--log-level", "info", "serve",
         "--db", str(db), "--bus", args.bus, "--group", group, "--topic-prefix", prefix,
         "--score-every", f"{args.score_every:g}s", "--no-auth", "--port", str(port)],
        env=env, text=True, stdout=open(log, "a"), stderr=subprocess.STDOUT)  # noqa: SIM115


def backlog(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"bench-serve-{uuid.uuid4().hex[:8]}."
    fleet = Fleet(args.bus, prefix, args.gpus // 8, tmp / "spool-backlog")
    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=args.interval * args.ticks)
    for i in range(args.ticks):
        fleet.tick(t0 + dt.timedelta(seconds=args.interval * i))
    fleet.close()
    samples, end = fleet.samples, end_offsets(args.bus, prefix)

    db, group = tmp / "backlog.duckdb", f"{prefix}serve"
    serve = start_serve(db, args, prefix, group, _free_port(), tmp / "serve-backlog.log")
    first = last = None
    try:
        while True:
            if serve.poll() is not None:
                raise SystemExit(f"serve exited ({serve.returncode}); see its log")
            done = committed(args.bus, group)
            now = time.time()
            if done and first is None:
                first = (now, done)
            if done >= end:
                last = now
                break
            time.sleep(0.2)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    assert first is not None and last is not None
    # offsets before the first observed commit were done before it: scale to the rest
    rate = samples * (end - first[1]) / end / max(1e-9, last - first[0])
    consume = run_case("consume", 1, argparse.Namespace(bus=args.bus), prefix, tmp, samples)
    return {"gpus": args.gpus, "ticks": args.ticks, "samples": samples,
            "serve_samples_per_s": round(rate), "consume_samples_per_s": consume[
                "samples_per_s"], "ratio_to_consume": round(rate / consume["samples_per_s"], 3),
            "score_every_s": args.score_every}


def live(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"bench-serve-{uuid.uuid4().hex[:8]}."
    db, group, port = tmp / "live.duckdb", f"{prefix}serve", _free_port()
    fleet = Fleet(args.bus, prefix, args.gpus // 8, tmp / "spool-live")
    fleet.tick(dt.datetime.now(dt.UTC))  # creates the topics before serve joins
    serve = start_serve(db, args, prefix, group, port, tmp / "serve-live.log")
    ticks: list[float] = []
    seen: list[tuple[float, float]] = []  # (wall, newest score ts) when it changed
    stop = threading.Event()

    def watch() -> None:
        last = None
        while not stop.is_set():
            try:
                h = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
            except (httpx.TransportError, ValueError):
                h = {}
            score = h.get("latest_score")
            if score and score != last:
                last = score
                seen.append((time.time(), dt.datetime.fromisoformat(score).timestamp()))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    tick_s: list[float] = []
    try:
        deadline = time.time() + args.minutes * 60
        nxt = time.time()
        while time.time() < deadline:
            if serve.poll() is not None:
                raise SystemExit(f"serve exited ({serve.returncode}); see its log")
            now = dt.datetime.now(dt.UTC)
            t = time.perf_counter()
            fleet.tick(now)
            tick_s.append(time.perf_counter() - t)
            ticks.append(now.timestamp())
            nxt += args.interval
            time.sleep(max(0.0, nxt - time.time()))
        lag = end_offsets(args.bus, prefix) - committed(args.bus, group)
        t_stop = time.time()
        end = end_offsets(args.bus, prefix)
        while committed(args.bus, group) < end and time.time() - t_stop < 300:
            time.sleep(0.2)
        drain_s = time.time() - t_stop
        time.sleep(args.score_every * 2.5)  # the last ticks get their score
    finally:
        stop.set()
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
        fleet.close()
    fresh = []
    for ts in ticks:
        after = [w for w, s in seen if s >= ts - 1e-3]
        if after:
            fresh.append(after[0] - ts)
    covered = len(fresh) / len(ticks)
    p50, p99 = (float(np.percentile(fresh, q)) for q in (50, 99))
    return {"gpus": args.gpus, "interval_s": args.interval, "minutes": args.minutes,
            "samples": fleet.samples, "offered_samples_per_s": round(args.gpus / args.interval),
            "score_every_s": args.score_every, "scoring_runs": len(seen),
            "ticks": len(ticks), "ticks_scored": round(covered, 3),
            "freshness_p50_s": round(p50, 1), "freshness_p99_s": round(p99, 1),
            "freshness_p99_in_intervals": round(p99 / args.score_every, 2),
            "lag_records_at_stop": lag, "drain_after_stop_s": round(drain_s, 1),
            "producer_tick_s_p50": round(float(np.median(tick_s)), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2048, help="simulated GPUs (8 per node)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between ticks")
    ap.add_argument("--minutes", type=float, default=5.0, help="live phase length")
    ap.add_argument("--score-every", type=float, default=30.0, help="serve's scoring period")
    ap.add_argument("--ticks", type=int, default=None,
                    help="backlog ticks (default: about 500,000 samples)")
    ap.add_argument("--bus", default="kafka://127.0.0.1:9092")
    ap.add_argument("--skip-backlog", action="store_true")
    args = ap.parse_args(argv)
    args.ticks = args.ticks or -(-500_000 // args.gpus)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if not args.skip_backlog:
            report("serve_kafka_backlog", backlog(args, tmp))
        report("serve_kafka_live", live(args, tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
