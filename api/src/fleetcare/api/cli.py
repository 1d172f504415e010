"""``fleetcare``: simulate a fleet, train the model, serve the risk API, run the demo.

    fleetcare simulate --nodes 64 --days 30 --seed 1 --db var/fleet.duckdb
    fleetcare simulate --nodes 2048 --days 54 --incidents-only --json
    fleetcare train --db var/fleet.duckdb --horizon 24h --json
    fleetcare score --db var/fleet.duckdb --json
    fleetcare serve --db var/fleet.duckdb --port 8000
    fleetcare demo [--once --json]

Usage errors exit 2 naming the flag; operational errors go to stderr with exit 1. Either
is one line (what is wrong and how to fix it), never a traceback: an error nobody foresaw
says so and how to see its traceback (``--log-level debug``). Secrets in URLs are masked
in every line printed and logged (``fleetcare.collectors.redact``). A reader that closes
stdout early (``| head``) ends the command quietly with exit 1.
Every command reads ``FLEETCARE_*`` environment variables and ``--config FILE`` (TOML).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fleetcare.api.progress import progress_bar
from fleetcare.collectors.config import ConfigError, load
from fleetcare.collectors.durations import parse_duration
from fleetcare.collectors.redact import MaskingFormatter, mask_secrets
from fleetcare.collectors.transport.kafka import KafkaSecurityConfig

log = logging.getLogger("fleetcare")


class CliError(Exception):
    """An operational error: printed to stderr, exit 1."""


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``PROG: error: MESSAGE`` naming the flag: the usage dump
    argparse prints before it is left out (``--help`` shows it)."""

    def print_usage(self, file: Any = None) -> None:
        """Called by ``error`` only (``--help`` prints the help): nothing."""

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        super().exit(status, mask_secrets(message) if message else message)


def port(text: str) -> int:
    """An argparse type: a TCP port, 0..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: use 1..65535 (0 picks a "
                                         "free one)")
    return value


def error_line(exc: BaseException) -> str:
    """The one line printed for an operational error: the message (fleetcare's errors,
    ValueError and OSError say what is wrong and the fix), or for an error nobody
    foresaw its type and how to see the traceback. Secrets masked, newlines folded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    expected = (type(exc).__module__.startswith("fleetcare.")
                or isinstance(exc, (ValueError, OSError)))
    if not expected:
        text = (f"unexpected error ({type(exc).__name__}: {text}); rerun with --log-level "
                "debug for the traceback, and report it")
    return mask_secrets(text)


def setup_logging(level: str) -> None:
    """stderr, ``time level logger message``, secrets masked (``MaskingFormatter``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s")))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def stdout_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly. Python's documented
    way: point stdout at /dev/null so the flush at exit does not fail again; exit 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


@dataclass(frozen=True)
class Settings(KafkaSecurityConfig):
    """The ``[cli]`` table; every key is also ``FLEETCARE_CLI_<KEY>``; flags win. A secured
    Kafka cluster (``serve --bus``, ``ingest``): the ``kafka_*`` keys of
    ``KafkaSecurityConfig``."""

    db: str = "var/fleetcare.duckdb"
    host: str = "127.0.0.1"
    port: int = 8000
    horizon: str = "24h"
    seed: int = 0
    log_level: str = "warning"
    # where serve / ingest read from: a bus (kafka://... or embedded://...) or a lake
    bus: str | None = None
    lake: str | None = None
    group: str | None = None
    topic_prefix: str | None = None
    # the API: the largest request body it reads (larger: 413)
    max_body_bytes: int = 1 << 20


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False, allow_nan=False))


# -- simulate -----------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.collectors.sim import FleetSpec, simulate_incidents, summarize

    spec = FleetSpec(nodes=args.nodes, seed=args.seed if args.seed is not None else cfg.seed,
                     model=args.model, failure_scale=args.failure_scale)
    plan = simulate_incidents(spec, args.days)
    summary = summarize(plan)
    if args.incidents_only:
        if args.json:
            _print_json(summary)
        else:
            inc = summary["incidents"]
            print(f"simulated {summary['nodes']} nodes / {summary['gpus']} GPUs for "
                  f"{summary['days']} days: {inc['total']} failures, {inc['gpu_caused']} GPU-caused")
            for cause, n in sorted(inc["by_cause"].items(), key=lambda kv: -kv[1]):
                print(f"  {cause:30s} {n:5d}")
        return 0
    from fleetcare.collectors.sim.telemetry import FleetSimulator
    from fleetcare.pipeline.simload import load_history, mark_simulated
    from fleetcare.pipeline.store import Store

    db = args.db or cfg.db
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(db)
    end = spec.start + dt.timedelta(days=args.days)
    progress = progress_bar("simulate", unit="tick")
    result = load_history(store, FleetSimulator(spec, plan), spec.start, end,
                          interval_s=parse_duration(args.interval), progress=progress)
    progress.close()
    mark_simulated(store, f"nodes={spec.nodes} days={args.days} seed={spec.seed} "
                          f"model={spec.model} failure_scale={spec.failure_scale}")
    store.close()
    out = {**summary, "db": db, "rows": {"telemetry": result.samples, "xid_events": result.events,
                                          "incidents": result.incidents}, "simulated": True}
    if args.json:
        _print_json(out)
    else:
        print(f"wrote {result.samples:,} samples, {result.events:,} XID events and "
              f"{result.incidents:,} incidents (simulated) to {db}")
    return 0


# -- train / score ---------------------------------------------------------------------------
def _train(store: Any, horizon_h: float, seed: int, min_failures: int | None = None) -> Any:
    from fleetcare.models.training import MIN_TRAIN_FAILURES, train
    from fleetcare.pipeline import features

    features.refresh(store)
    return train(store, horizon_h=horizon_h, seed=seed,
                 min_failures=MIN_TRAIN_FAILURES if min_failures is None else min_failures)


def _model_json(result: Any) -> dict[str, Any]:
    return {"model_id": result.model_id, "metrics": result.metrics}


def cmd_train(args: argparse.Namespace, cfg: Settings) -> int:
    horizon_h = parse_duration(args.horizon or cfg.horizon) / 3600
    store = open_store(args.db or cfg.db, lake=args.lake, create=bool(args.lake), sync=True)
    from fleetcare.models.training import TrainError

    try:
        result = _train(store, horizon_h, args.seed if args.seed is not None else cfg.seed,
                        args.min_failures)
    except TrainError as exc:
        store.close()
        raise CliError(str(exc)) from None
    if args.no_promote:
        why = (f"{result.model_id} registered, not promoted (--no-promote): "
               f"`fleetcare models promote {result.model_id}` compares it with the current one")
    else:
        from fleetcare.models.promotion import consider

        # current only if it beats the current model on its own held-out period
        why = consider(store, result.model_id).reason
    store.close()
    if args.json:
        _print_json(_model_json(result))  # the contract's keys; the decision goes to stderr
        print(f"fleetcare train: {why}", file=sys.stderr)
    else:
        print(f"trained {result.model_id} (horizon {horizon_h:g} h); held-out metrics:")
        for k, v in result.metrics.items():
            print(f"  {k:36s} {v}")
        print(why)
    return 0


def _top_risk(store: Any, limit: int) -> list[dict[str, Any]]:
    """The highest-risk nodes of the latest scoring: node, risk, reasons (sentences)."""
    from fleetcare.models.scoring import latest_node_scores

    out = []
    for r in latest_node_scores(store, limit=limit).to_pylist():
        reasons = json.loads(r["reasons"]) if isinstance(r["reasons"], str) else r["reasons"]
        out.append({"node": r["node"], "risk": round(float(r["risk"]), 4),
                    "reasons": list(reasons or [])})
    return out


def cmd_score(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.models import registry
    from fleetcare.models.scoring import score
    from fleetcare.pipeline import features

    store = open_store(args.db or cfg.db, lake=args.lake, create=bool(args.lake), sync=True)
    features.refresh(store)
    result = score(store)  # the fleet prior when the fleet has no model of its own
    rec = registry.get(store, result.model_id)
    top = _top_risk(store, args.limit)
    store.close()
    if args.json:
        _print_json({"top_risk": top, "model_id": rec.model_id, "origin": rec.origin})
    else:
        _print_top(top)
        print(f"scored with {rec.model_id} ({rec.origin}"
              f"{': ' + rec.current_reason if rec.current_reason else ''})")
    return 0


def _print_top(top: list[dict[str, Any]]) -> None:
    print(f"{'node':14s} {'risk':>6s}  reasons")
    for r in top:
        reasons = "; ".join(r["reasons"][:2]) or "-"
        print(f"{r['node']:14s} {r['risk']:6.3f}  {reasons}")


def open_store(db: str, *, lake: str | None = None, create: bool = False,
               create_lake: bool = False, sync: bool = False) -> Any:
    """The store at ``db`` (its raw telemetry in ``lake`` when given). ``create``: make a
    new database, ``create_lake`` a new lake; otherwise they must exist. ``sync``: read
    the lake's new files first."""
    from fleetcare.pipeline.store import Store

    if create:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    else:
        _existing_db(db)
    if lake is None:
        return Store(db)
    from fleetcare.pipeline.lake_feed import open_state

    try:
        store = open_state(db, lake, create=create_lake)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    while sync and store.raw.sync(store).files:
        pass
    return store


def _existing_db(db: str) -> str:
    if not Path(db).exists():
        raise CliError(f"database {db} does not exist: create it with "
                       f"`fleetcare simulate --db {db}` or point --db at an existing one")
    return db


# -- serve ---------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.api.app import create_app, serve
    from fleetcare.api.service import Service

    host = args.host or cfg.host
    if args.no_auth:
        from fleetcare.api.auth import is_loopback

        if not is_loopback(host):
            print(f"fleetcare serve: --no-auth refuses to bind {host}, which is not a "
                  "loopback address: anyone who can reach it could read the fleet and "
                  "write incidents. Use --host 127.0.0.1, or drop --no-auth and create "
                  "tokens with `fleetcare tokens create`", file=sys.stderr)
            return 2
        log.warning("serve.no_auth host=%s: the API accepts requests without a token", host)
    from fleetcare.api.commands.ingest import consumer_factory, resolve_source

    listen = args.port if args.port is not None else cfg.port
    if not 0 <= listen <= 65535:
        args.serve_parser.error(f"port {listen} (the [cli] port setting, FLEETCARE_CLI_PORT) "
                                "is not a port: use 1..65535")
    _check_listen(host, listen)
    resolve_source(args.serve_parser, args, cfg)
    open_consumer = consumer_factory(args.serve_parser, args, cfg) if args.bus else None
    store = open_store(args.db or cfg.db, lake=args.lake, create=bool(args.bus or args.lake),
                       create_lake=True)
    from fleetcare.api import queries
    from fleetcare.api.alerts import AlertEngine, load_config

    drains = _drain_controller(store, args.drain_scheduler, args.drain_execute)
    svc = Service(store, open_consumer=open_consumer,
                  score_every_s=parse_duration(args.score_every),
                  alerts=AlertEngine.from_config(store, load_config(args.config),
                                                 node_labels=queries.labels_reader(store)),
                  drains=drains)
    log.info("serve.started db=%s source=%s", store.path, mask_secrets(
        args.bus or (f"lake {args.lake}" if args.lake else "none (scoring only)")))
    svc.start()
    try:
        serve(store, host=host, port=listen,
              app=create_app(store, auth=not args.no_auth, drains=drains,
                             max_body_bytes=cfg.max_body_bytes,
                             ingest=lambda: w.families() if (w := svc.worker) else []))
    finally:
        svc.stop()
        store.close()
    return 0


def _check_listen(host: str, port: int) -> None:
    """Fail now, in one line, when ``host:port`` cannot be listened on (taken, no such
    address), not later as a traceback from the server thread."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another "
                       "--port, or stop what holds it") from None


def _drain_controller(store: Any, scheduler: str, execute: bool) -> Any:
    """The drain controller the service runs after each scoring (None: no drains)."""
    if scheduler == "none":
        if execute:
            raise CliError("--drain-execute needs --drain-scheduler slurm or kubernetes")
        return None
    from fleetcare.api.drains import DrainController

    if scheduler == "slurm":
        from fleetcare.api.drains.slurm import SlurmDrainer

        drainer: Any = SlurmDrainer()
    else:
        from fleetcare.api.drains.kubernetes import KubernetesDrainer

        drainer = KubernetesDrainer()
    if not execute:
        log.warning("drains.dry_run scheduler=%s: decisions are audited, nothing is drained "
                    "(add --drain-execute to act)", scheduler)
    return DrainController(store, drainer, dry_run=not execute)


# -- demo ------------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.api.demo import run_demo

    return run_demo(args)


# -- argument parsing ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="fleetcare",
        description="Predictive maintenance for GPU fleets: learn from fleet-wide telemetry "
                    "which GPUs are about to fail, and drain their nodes before they crash "
                    "a training job.",
        epilog="Environment: FLEETCARE_CLI_DB, FLEETCARE_CLI_PORT, ... override --config FILE "
               "([cli] table); flags override both.")
    p.add_argument("--config", help="TOML config file (default: $FLEETCARE_CONFIG)")
    p.add_argument("--log-level", default=None, help="debug, info, warning (default), error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("simulate", help="simulate a fleet's telemetry and failures into DuckDB",
                       description="Simulate a GPU fleet (calibrated to Llama 3's failure "
                                   "mix) and write its history into DuckDB. The data is "
                                   "labelled as simulated everywhere it shows.")
    s.add_argument("--nodes", type=int, default=64, help="nodes to simulate (8 GPUs each)")
    s.add_argument("--days", type=float, default=30, help="days of history (default 30)")
    s.add_argument("--seed", type=int, default=None, help="random seed (same seed, same fleet)")
    s.add_argument("--db", help="DuckDB file to write")
    s.add_argument("--interval", default="60", help="sample interval (default 60s)")
    s.add_argument("--model", default="H100", help="GPU model or mix: H100, A100, H200, 'H100:3,A100:1'")
    s.add_argument("--failure-scale", type=float, default=1.0,
                   help="multiply every failure rate (1 = Llama 3's rates)")
    s.add_argument("--incidents-only", action="store_true",
                   help="only simulate incidents, write nothing (fast: 2,048 nodes x 54 days < 1 s)")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    t = sub.add_parser("train", help="train the fleet failure model on a time split")
    t.add_argument("--db", help="DuckDB file with telemetry and incidents")
    t.add_argument("--lake", default=None,
                   help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                        "workers); --db is then the service's state DB (created if missing)")
    t.add_argument("--horizon", default=None, help="predict failures within this time (default 24h)")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--min-failures", type=int, default=None, metavar="N",
                   help="node failures the training period must hold before a model of this "
                        "fleet is fitted (default 30; below it the fleet prior scores "
                        "better)")
    t.add_argument("--no-promote", action="store_true",
                   help="register the model without comparing it with the current one "
                        "(default: it becomes current only if it beats it on its held-out period)")
    t.add_argument("--json", action="store_true")

    sc = sub.add_parser("score", help="score every GPU and node now with the current model")
    sc.add_argument("--db")
    sc.add_argument("--lake", default=None,
                   help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                        "workers); --db is then the service's state DB (created if missing)")
    sc.add_argument("--limit", type=int, default=10, help="nodes to show (default 10)")
    sc.add_argument("--json", action="store_true")

    v = sub.add_parser("serve", help="serve the REST risk API (and ingest/score in-process)")
    v.add_argument("--db")
    v.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    v.add_argument("--port", type=port, default=None, help="port (default 8000)")
    src = v.add_mutually_exclusive_group()
    src.add_argument("--bus", default=None,
                     help="ingest in this process from kafka://HOST:PORT[,HOST:PORT] (one "
                          "consumer group, offsets committed after the rows are durable) or "
                          "embedded://PATH; --db is then created if missing")
    src.add_argument("--lake", default=None,
                     help="scale-out: read raw telemetry from this Parquet lake, written by "
                          "`fleetcare ingest --lake` workers; --db is the service's state "
                          "(rollups, scores, models, alerts, drains, tokens)")
    from fleetcare.api.commands.ingest import add_consumer_arguments

    add_consumer_arguments(v)
    v.set_defaults(serve_parser=v)
    v.add_argument("--score-every", default="60s", help="rescoring period (default 60s)")
    v.add_argument("--drain-scheduler", choices=("none", "slurm", "kubernetes"), default="none",
                   help="after each scoring, decide drains for this scheduler (default none); "
                        "dry-run unless --drain-execute")
    v.add_argument("--drain-execute", action="store_true",
                   help="really drain (scontrol / cordon+taint); default: audit only")
    v.add_argument("--no-auth", action="store_true",
                   help="accept requests without a bearer token (loopback addresses only)")

    d = sub.add_parser("demo", help="simulate, train, stream live telemetry, serve the API",
                       description="Simulate 64 nodes x 30 days of history, train, then stream "
                                   "live simulated telemetry through the agent and the "
                                   "embedded bus, rescoring every minute and serving the API "
                                   "at http://127.0.0.1:8000 until Ctrl-C.")
    d.add_argument("--once", action="store_true",
                   help="stream a short live window, score once, print, exit (no server)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--db", default="var/demo.duckdb", help="DuckDB file (recreated each run)")
    d.add_argument("--nodes", type=int, default=64)
    d.add_argument("--days", type=float, default=30)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--failure-scale", type=float, default=8.0,
                   help="failure-rate multiplier so a 64-node month has enough failures to "
                        "learn from (default 8; 1 = Llama 3's rates)")
    d.add_argument("--history-interval", default="5m",
                   help="sample interval of the simulated history (default 5m, so the demo "
                        "fits in minutes on 2 cores; live telemetry streams at 60s)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=port, default=8000)
    d.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall second while live (default 1; 60 = an "
                        "hour of fleet time per minute)")
    d.add_argument("--score-every", default="60s", help="rescoring period, wall time (default 60s)")
    d.add_argument("--live-minutes", type=float, default=60,
                   help="simulated minutes to stream with --once (default 60)")
    for module in _plugins().values():
        module.add_parser(sub)
    return p


COMMANDS = {"simulate": cmd_simulate, "train": cmd_train, "score": cmd_score,
            "serve": cmd_serve, "demo": cmd_demo}

PLUGIN_COMMANDS = ("ingest", "quarantine", "incident", "backfill", "retention", "tokens", "alerts",
                   "drain", "evaluate", "models")
"""Commands that live in their own module ``fleetcare.api.commands.<name>``, each with
``add_parser(subparsers) -> None`` (registering exactly one sub-command named <name>)
and ``run(args, cfg: Settings) -> int``."""


def _plugins() -> dict[str, Any]:
    import importlib

    found = {}
    for name in PLUGIN_COMMANDS:
        try:
            found[name] = importlib.import_module(f"fleetcare.api.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"fleetcare.api.commands.{name}":
                raise
    return found


LOG_LEVELS = ("debug", "info", "warning", "error")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = load(Settings, section="cli", path=args.config)
    except ConfigError as exc:
        print(f"fleetcare: {mask_secrets(str(exc))}", file=sys.stderr)
        return 2
    level = (args.log_level or cfg.log_level).lower()
    if level not in LOG_LEVELS:
        parser.error(f"--log-level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    setup_logging(level)
    try:
        if args.command in COMMANDS:
            return COMMANDS[args.command](args, cfg)
        return int(_plugins()[args.command].run(args, cfg))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return stdout_closed()
    except Exception as exc:
        log.debug("fleetcare.failed command=%s", args.command, exc_info=True)
        print(f"fleetcare {args.command}: {error_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    # run as `python -m fleetcare.api.cli`: use the imported module's main, so plugins and
    # this file share one CliError class (as __main__ it would be a second copy)
    from fleetcare.api.cli import main as _main

    sys.exit(_main())
