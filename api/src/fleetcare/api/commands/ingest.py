"""``fleetcare ingest``: land the bus's records in DuckDB (one host) or the Parquet lake.

    fleetcare ingest --bus kafka://127.0.0.1:9092 --db var/fleetcare.duckdb
    fleetcare ingest --bus kafka://10.0.0.5:9092 --lake /data/lake --group fleetcare-ingest
    fleetcare ingest --bus embedded://var/bus --db var/fleetcare.duckdb --exit-when-idle 5 --json

Several ``--lake`` workers in one ``--group`` split the partitions, each writing its own
files. Offsets are committed only after the rows are durable. SIGTERM finishes the
current batch, commits and exits 0. ``--json`` prints one summary object at the end:
``{"records", "samples", "events", "incidents", "quarantined", "reason", "seconds",
"commits", "commit_failures", "worker_id"}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetcare.collectors.durations import parse_duration
from fleetcare.collectors.redact import mask_secrets

log = logging.getLogger(__name__)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_consumer_arguments(p: argparse.ArgumentParser) -> None:
    """``--group``, ``--topic-prefix``, ``--instance-id``: how a process joins the Kafka
    consumer group (``fleetcare ingest`` and ``fleetcare serve --bus`` share them)."""
    p.add_argument("--group", default=None,
                   help="Kafka consumer group (default fleetcare-ingest; Kafka only)")
    p.add_argument("--topic-prefix", default=None,
                   help="prefix of the topic names, as the agents were given (Kafka only)")
    p.add_argument("--instance-id", default=None,
                   help="Kafka static group membership id, stable across restarts of this "
                        "process (e.g. the pod name): a restart takes its partitions back "
                        "without a rebalance (Kafka only)")


def resolve_source(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   cfg: Any) -> None:
    """Fill ``args.bus`` / ``args.lake`` / ``args.group`` / ``args.topic_prefix`` from the
    ``[cli]`` config (``FLEETCARE_CLI_BUS`` ...) where no flag gave them; both a bus and a
    lake for ``serve`` is a usage error."""
    for name in ("bus", "lake", "group", "topic_prefix"):
        if name == "lake" and parser.prog.endswith("ingest") and args.db:
            continue  # ingest --db: the flag chose the database over a configured lake
        if getattr(args, name, None) is None:
            setattr(args, name, getattr(cfg, name, None))
    if args.bus and args.lake and parser.prog.endswith("serve"):
        parser.error("--bus and --lake (or the [cli] bus and lake settings) exclude each "
                     "other: serve ingests from a bus, or reads a lake ingest workers write")


def consumer_factory(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     cfg: Any = None) -> Callable[[], Any]:
    """A function opening one group member on ``args.bus`` (checked; usage errors exit 2).
    Kafka security options come from the ``[cli]`` config (``Settings.kafka_security``)."""
    from fleetcare.collectors.transport.factory import bus_scheme
    from fleetcare.pipeline.ingest_worker import DEFAULT_GROUP, open_consumer

    try:
        scheme = bus_scheme(args.bus)
    except ValueError as exc:
        parser.error(f"--bus: {exc}")
    if scheme == "embedded":
        for flag, value in (("--group", args.group), ("--topic-prefix", args.topic_prefix),
                            ("--instance-id", args.instance_id)):
            if value is not None:
                parser.error(f"{flag} applies to kafka:// buses only (the embedded bus has "
                             "one reader)")

    security = cfg.kafka_security() if cfg is not None and scheme == "kafka" else {}

    def opener() -> Any:
        return open_consumer(args.bus, group=args.group or DEFAULT_GROUP,
                             topic_prefix=args.topic_prefix or "",
                             instance_id=args.instance_id, security=security)

    return opener


def add_parser(subparsers: Any) -> None:
    from fleetcare.api.commands.common import port

    p = subparsers.add_parser(
        "ingest", help="land bus records in DuckDB (--db) or a Parquet lake (--lake)",
        description="Read telemetry, XID events and incidents from the bus and land them "
                    "in DuckDB (one host) or in a Parquet lake partitioned by date and hour "
                    "(several workers in one consumer group). Offsets are committed only "
                    "after the rows are durable; re-read records land once.")
    p.add_argument("--bus", default=None,
                   help="kafka://HOST:PORT[,HOST:PORT] or embedded://PATH (default: the "
                        "[cli] bus setting, FLEETCARE_CLI_BUS)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", help="DuckDB file (one host; default: the configured db)")
    where.add_argument("--lake", help="Parquet lake folder (scale-out workers)")
    add_consumer_arguments(p)
    p.add_argument("--worker-id", default=None,
                   help="name in this worker's lake file names (default host-pid-random; "
                        "must differ between running workers and runs)")
    p.add_argument("--exit-when-idle", type=_duration, default=None, metavar="SECONDS",
                   help="exit once no record arrived for this long (e.g. 30, 5m), counted "
                        "from joining the group")
    p.add_argument("--max-records", type=_positive_int, default=None, metavar="N",
                   help="exit after N bus records")
    p.add_argument("--batch", type=_positive_int, default=10_000, metavar="N",
                   help="records per poll (default 10000)")
    p.add_argument("--flush-interval", type=_duration, default=5.0, metavar="SECONDS",
                   help="lake: write files and commit at least this often (default 5s)")
    p.add_argument("--metrics-port", type=port, default=None,
                   help="serve Prometheus metrics on this port (GET /metrics)")
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    p.set_defaults(ingest_parser=p)


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.pipeline.ingest_worker import IngestWorker, handle_signals
    from fleetcare.pipeline.lake import LakeWriter, new_worker_id
    from fleetcare.pipeline.store import Store, StoreError

    resolve_source(args.ingest_parser, args, cfg)
    if not args.bus:
        args.ingest_parser.error("--bus is required (or the [cli] bus setting, "
                                 "FLEETCARE_CLI_BUS)")
    open_consumer = consumer_factory(args.ingest_parser, args, cfg)
    worker_id = args.worker_id or new_worker_id()

    if args.lake:
        sink: Any = LakeWriter(args.lake, worker_id=worker_id)
        target = f"lake {args.lake}"
    else:
        db = args.db or cfg.db
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        try:
            sink = Store(db)
        except StoreError as exc:
            print(f"fleetcare ingest: {exc}", file=sys.stderr)
            return 1
        target = f"database {db}"
    try:
        try:
            consumer = open_consumer()
        except Exception as exc:  # NoBrokersAvailable and friends
            print(mask_secrets(f"fleetcare ingest: cannot read {args.bus} ({exc!r}): is the "
                               "broker running and reachable from here?"), file=sys.stderr)
            return 1
        worker = IngestWorker(sink, consumer, max_batch=args.batch,
                              idle_exit_s=args.exit_when_idle, max_records=args.max_records,
                              flush_interval_s=args.flush_interval, worker_id=worker_id)
        server = None
        if args.metrics_port is not None:
            from fleetcare.collectors.agent_metrics import serve_metrics

            server = serve_metrics(worker, port=args.metrics_port)  # type: ignore[arg-type]
        try:
            with handle_signals(worker):  # "started": from here SIGTERM ends it cleanly
                log.info("ingest.started worker=%s pid=%d bus=%s into=%s", worker_id,
                         os.getpid(), mask_secrets(args.bus), target)
                summary = worker.run()
        finally:
            if server is not None:
                server.close()
    finally:
        if not args.lake:
            sink.close()
    out = {**summary.to_json(), "worker_id": worker_id}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"ingested {summary.records:,} records into {target}: {summary.samples:,} "
              f"samples, {summary.events:,} events, {summary.incidents:,} incidents, "
              f"{summary.quarantined:,} quarantined in {summary.seconds:.1f} s "
              f"(stopped: {summary.reason})")
    return 1 if summary.reason == "error" else 0
