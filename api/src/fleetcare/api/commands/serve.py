"""``fleetcare serve``: the service in one process: ingest (Kafka, the embedded bus or a
Parquet lake), rescoring, alerts, drains and the REST API and dashboard over one DuckDB file.

    fleetcare serve --db var/fleet.duckdb --port 8000 --bus kafka://127.0.0.1:9092
    fleetcare serve --db var/state.duckdb --lake var/lake --drain-scheduler slurm
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from fleetcare.api.commands.common import (
    LOG_FORMATS,
    CliError,
    Settings,
    duration_type,
    open_store,
    port,
)
from fleetcare.collectors.redact import mask_secrets

log = logging.getLogger("fleetcare")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.api.app import create_app
    from fleetcare.api.server import serve
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
        log.warning("serve.no_auth host=%s (the API accepts requests without a token)", host)
    from fleetcare.api.commands.ingest import consumer_factory, resolve_source

    listen = args.port if args.port is not None else cfg.port
    if not 0 <= listen <= 65535:
        args.serve_parser.error(f"port {listen} (the [cli] port setting, FLEETCARE_CLI_PORT) "
                                "is not a port: use 1..65535")
    from fleetcare.api.priority import MAX_NICE, checked, niced_call

    try:
        checked(cfg.background_nice)
    except ValueError:
        args.serve_parser.error(f"background_nice {cfg.background_nice} (the [cli] "
                                "background_nice setting, FLEETCARE_CLI_BACKGROUND_NICE) is not "
                                f"a niceness step: use 0 (writers at the API's priority) to {MAX_NICE}")
    check_listen(host, listen)
    resolve_source(args.serve_parser, args, cfg)
    open_consumer = consumer_factory(args.serve_parser, args, cfg) if args.bus else None
    # opened from a niced thread: DuckDB's workers, started with the database, run below
    # the API's threads as the service's loops do (``priority``)
    store = niced_call(lambda: open_store(args.db or cfg.db, lake=args.lake,
                                          create=bool(args.bus or args.lake),
                                          create_lake=True), cfg.background_nice)
    from fleetcare.api import queries
    from fleetcare.api.alerts import AlertEngine, load_config

    drains = drain_controller(store, args.drain_scheduler, args.drain_execute)
    svc = Service(store, open_consumer=open_consumer,
                  score_every_s=args.score_every,
                  alerts=AlertEngine.from_config(store, load_config(args.config),
                                                 node_labels=queries.labels_reader(store)),
                  drains=drains, rescore_on_events=not args.no_event_rescore,
                  background_nice=cfg.background_nice)
    log.info("serve.started db=%s source=%s", store.path, mask_secrets(
        args.bus or (f"lake {args.lake}" if args.lake else "none (scoring only)")))
    svc.start()
    app = None
    try:
        app = create_app(store, auth=not args.no_auth, drains=drains,
                         max_body_bytes=cfg.max_body_bytes, ingest=svc.families,
                         keep_fresh=True, background_nice=cfg.background_nice)
        serve(app, host=host, port=listen)
    finally:
        if app is not None:
            app.state.ctx.samples.stop()
        svc.stop()
        store.close()
    return 0


def check_listen(host: str, port: int) -> None:
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


def drain_controller(store: Any, scheduler: str, execute: bool) -> Any:
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


def add_parser(subparsers: Any) -> None:
    v = subparsers.add_parser("serve", help="serve the REST risk API (and ingest/score in-process)")
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
    v.add_argument("--score-every", type=duration_type(), default="60s",
                   help="rescoring period, e.g. 60s or 5m (default 60s)")
    v.add_argument("--drain-scheduler", choices=("none", "slurm", "kubernetes"), default="none",
                   help="after each scoring, decide drains for this scheduler (default none); "
                        "dry-run unless --drain-execute")
    v.add_argument("--drain-execute", action="store_true",
                   help="really drain (scontrol / cordon+taint); default: audit only")
    v.add_argument("--no-event-rescore", action="store_true",
                   help="rescore only on the --score-every period; by default a batch with "
                        "an urgent signal (warning or fatal XID, new uncorrectable error, "
                        "link down) rescores its node within seconds")
    v.add_argument("--no-auth", action="store_true",
                   help="accept requests without a bearer token (loopback addresses only)")
    v.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                   help="text (default) or json: one JSON object per log line, for log "
                        "shippers ([cli] log_format, FLEETCARE_CLI_LOG_FORMAT)")
