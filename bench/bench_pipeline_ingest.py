"""Ingest from the real Kafka broker (deploy/kafka) into DuckDB and into the Parquet lake,
against the plain consume rate of the same consumer (poll + decode, no writes); two
lake workers in one consumer group against one; and ``serve --lake``'s incremental read
of the lake one worker wrote (new files' stats and newest samples, then the rollups).

    .venv/bin/python bench/bench_pipeline_ingest.py [--nodes 128] [--ticks 240] [--bus kafka://127.0.0.1:9092]

The stream is simulated (the agent's sim backend, 8 GPUs per node, one batch per node
per tick) and produced once to a fresh topic prefix (6 partitions per topic). Every case
is its own process and its own consumer group, so each reads the whole stream. Rates are
samples from the first record received to the last one made durable and committed
(joining the group is excluded; it is reported as ``join_s``, and so is the fetch that
the first poll returns: a stream of many polls keeps that small). Every case runs
``--repeat`` rounds (default 3); each ratio is taken within a round and the median of the
rounds is reported, with each round's figure: the machine is shared, so read the ratios,
not the third digit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import report  # noqa: E402

ROLES = ("consume", "duckdb", "lake")


class Timed:
    """A ``BusConsumer`` wrapper that notes when the first record arrived and when the
    last commit returned (``time.time()``, comparable across processes)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.first: float | None = None
        self.last_commit: float | None = None
        self.started = time.time()

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Any]:
        out = self.inner.poll(timeout_s, max_records)
        if out and self.first is None:
            self.first = time.time()
        return out

    def commit(self) -> None:
        self.inner.commit()
        self.last_commit = time.time()

    def assignment(self) -> Any:
        return self.inner.assignment()

    def close(self) -> None:
        self.inner.close()


def worker(role: str, bus: str, prefix: str, group: str, out: Path, idle_s: float) -> dict:
    """One ingest process; prints what it did as JSON."""
    from fleetcare.collectors.contract import decode_batch
    from fleetcare.pipeline.ingest_worker import IngestWorker, open_consumer
    from fleetcare.pipeline.lake import LakeWriter
    from fleetcare.pipeline.store import Store

    consumer = Timed(open_consumer(bus, group=group, topic_prefix=prefix))
    if role == "consume":
        records = samples = 0
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            got = consumer.poll(0.5)
            if got:
                last = time.monotonic()
                records += len(got)
                samples += sum(len(decode_batch(r.value).samples) for r in got)
                consumer.last_commit = time.time()  # no writes, no commit: the last decode
        consumer.close()
    else:
        sink: Any = Store(out / "f.duckdb") if role == "duckdb" else LakeWriter(out / "lake")
        summary = IngestWorker(sink, consumer, idle_exit_s=idle_s, poll_timeout_s=0.2).run()
        if role == "duckdb":
            sink.close()
        records, samples = summary.records, summary.samples
    return {"records": records, "samples": samples, "started": consumer.started,
            "first": consumer.first, "last": consumer.last_commit}


def spawn(role: str, args: argparse.Namespace, prefix: str, group: str, out: Path
          ) -> subprocess.Popen[str]:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, __file__, "--worker", role, "--bus", args.bus,
                             "--prefix", prefix, "--group", group, "--out", str(out)],
                            stdout=subprocess.PIPE, text=True)


def run_case(role: str, workers: int, args: argparse.Namespace, prefix: str, tmp: Path,
             expect_samples: int) -> dict:
    group = f"{prefix}{role}-{workers}-{uuid.uuid4().hex[:6]}"
    out = tmp / group
    procs = [spawn(role, args, prefix, group, out) for _ in range(workers)]
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"{role} worker failed with exit {p.returncode}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    samples = sum(r["samples"] for r in results)
    redelivered = 0
    if workers > 1 and role == "lake" and samples > expect_samples:
        # a worker that joins while the other reads makes the group rebalance; the
        # partitions moved are read again from their last commit (at least once), and the
        # lake's views keep one row per sample: what counts is what they hold
        from fleetcare.pipeline.lake import open_lake
        con = open_lake(out / "lake")
        unique = con.execute("SELECT count(*) FROM lake_telemetry").fetchone()[0]
        con.close()
        if unique != expect_samples:
            raise SystemExit(f"lake x{workers}: {unique} distinct samples in the lake, "
                             f"expected {expect_samples}")
        redelivered, samples = samples - expect_samples, expect_samples
    if samples != expect_samples:
        raise SystemExit(f"{role} x{workers}: {samples} samples, expected {expect_samples}")
    busy = [r for r in results if r["first"] is not None]  # a worker may get no partition
    first = min(r["first"] for r in busy)
    last = max(r["last"] for r in busy)
    return {"samples": samples, "records": sum(r["records"] for r in results),
            "seconds": round(last - first, 3), "samples_per_s": round(samples / (last - first)),
            "join_s": round(first - min(r["started"] for r in results), 2),
            **({"redelivered_samples": redelivered} if workers > 1 else {}), "out": str(out)}


def lake_read(lake: Path, state: Path, samples: int) -> dict:
    """The service's incremental read of a lake it has not seen: ``sync`` (new files'
    stats, events, each GPU's newest sample) and the rollup of every hour from them."""
    from fleetcare.pipeline import features
    from fleetcare.pipeline.lake_feed import open_state

    store = open_state(state, lake)
    t0 = time.perf_counter()
    files = 0
    while (got := store.raw.sync(store)).files:
        files += got.files
    t1 = time.perf_counter()
    features.refresh(store)
    t2 = time.perf_counter()
    rolled = store.cursor().execute("SELECT sum(n) FROM telemetry_hourly").fetchone()[0]
    store.close()
    if rolled != samples:
        raise SystemExit(f"lake read: rolled up {rolled} samples, expected {samples}")
    return {"samples": samples, "files": files, "sync_s": round(t1 - t0, 3),
            "rollup_s": round(t2 - t1, 3),
            "samples_per_s": round(samples / (t2 - t0)),
            "rollup_samples_per_s": round(samples / (t2 - t1))}


def produce(args: argparse.Namespace, prefix: str) -> tuple[int, int]:
    from fleetcare.collectors.agent import Agent
    from fleetcare.collectors.cli import sim_backend
    from fleetcare.collectors.transport.kafka import KafkaBus

    # the stream ends now: ingest validation rejects timestamps from the future
    now0 = (dt.datetime.now(dt.UTC).replace(microsecond=0)
            - dt.timedelta(seconds=args.interval * args.ticks))
    backend, _ = sim_backend("bench", args.nodes, 1, now0)

    class NullBus:
        def send(self, batch: Any) -> None: ...
        def flush(self, timeout_s: float | None = None) -> None: ...
        def close(self) -> None: ...

    agent = Agent([backend], NullBus(), node="bench", interval_s=args.interval)
    batches: list[Any] = []
    for i in range(args.ticks):
        now = now0 + dt.timedelta(seconds=args.interval * i)
        batches += agent.batches(backend.poll(now), now)
    with tempfile.TemporaryDirectory() as spool:
        bus = KafkaBus.from_url(args.bus, spool=spool, topic_prefix=prefix)
        for b in batches:
            bus.send(b)
        bus.flush(120)
        assert bus.spooled == 0 and bus.pending == 0, "broker unreachable: parts were spooled"
        bus.close()
    return len(batches), sum(len(b.samples) for b in batches)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128, help="simulated nodes (8 GPUs each)")
    ap.add_argument("--ticks", type=int, default=240, help="ticks per node (default 240: "
                    "the first poll's fetch, made before any case's clock starts, is then a "
                    "small share of the stream; at 60 it was two thirds of it, and the "
                    "consume rate was read from the last third)")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between ticks")
    ap.add_argument("--bus", default="kafka://127.0.0.1:9092")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every case over the same "
                    "stream; rates and ratios are reported as the median of the rounds "
                    "(default 3: the machine is shared and one round is noisy)")
    ap.add_argument("--worker", choices=ROLES, help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--idle", type=float, default=3.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.bus, args.prefix, args.group, args.out,
                                args.idle)))
        return 0

    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    t0 = time.perf_counter()
    batches, samples = produce(args, prefix)
    produce_s = time.perf_counter() - t0
    keys = (("consume", 1), ("duckdb", 1), ("lake", 1), ("lake", 2))
    rounds: list[dict[tuple[str, int], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):  # each round reads the whole stream in every case
            rounds.append({k: run_case(k[0], k[1], args, prefix, Path(tmp) / f"r{r}", samples)
                           for k in keys})
        read = lake_read(Path(rounds[-1][("lake", 1)]["out"]) / "lake",
                         Path(tmp) / "state.duckdb", samples)
    for c in (c for rnd in rounds for c in rnd.values()):
        c.pop("out")
    for rnd in rounds:  # the ratios of one round: its cases ran minutes apart, not more
        base = rnd[("consume", 1)]["samples_per_s"]
        for role in ("duckdb", "lake"):
            rnd[(role, 1)]["ratio_to_consume"] = rnd[(role, 1)]["samples_per_s"] / base
        rnd[("lake", 2)]["speedup_vs_one"] = (rnd[("lake", 2)]["samples_per_s"]
                                              / rnd[("lake", 1)]["samples_per_s"])

    def case(key: tuple[str, int], ratio: str | None = None) -> dict[str, Any]:
        """The last round's figures, with the median (and each round's) of the rate and
        ``ratio`` over the rounds."""
        out = dict(rounds[-1][key])
        for name in ("samples_per_s", *((ratio,) if ratio else ())):
            runs = [rnd[key][name] for rnd in rounds]
            out[name] = round(statistics.median(runs), 3 if name != "samples_per_s" else None)
            if len(runs) > 1:
                out[f"{name}_runs"] = [round(v, 3) for v in runs]
        return out

    common = {"nodes": args.nodes, "gpus": args.nodes * 8, "batches": batches,
              "samples": samples, "partitions_per_topic": 6, "produce_s": round(produce_s, 1),
              "rounds": args.repeat}
    report("ingest_kafka_consume_only", {**common, **case(("consume", 1))})
    for role in ("duckdb", "lake"):
        report(f"ingest_kafka_{role}", {**common, **case((role, 1), "ratio_to_consume")})
    one = case(("lake", 1))
    report("ingest_kafka_lake_two_workers", {**common, **case(("lake", 2), "speedup_vs_one")})
    report("serve_lake_incremental_read", {**common, **read,
                                           "ratio_to_one_lake_worker": round(
                                               read["samples_per_s"] / one["samples_per_s"], 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
