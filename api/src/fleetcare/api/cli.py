"""``fleetcare``: simulate a fleet, train the model, serve the risk API, run the demo.

    fleetcare simulate --nodes 64 --days 30 --seed 1 --db var/fleet.duckdb
    fleetcare simulate --nodes 2048 --days 54 --incidents-only --json
    fleetcare train --db var/fleet.duckdb --horizon 24h --json
    fleetcare score --db var/fleet.duckdb --json
    fleetcare serve --db var/fleet.duckdb --port 8000
    fleetcare demo [--once --json]
    fleetcare --version

Each command is a module of ``fleetcare.api.commands`` (``serve`` is here); what they
share is public in ``fleetcare.api.commands.common``. Durations take units (``30m``,
``1h``, ``2d``). A mistyped command or choice is answered with the nearest valid one.
Usage errors exit 2 naming the flag; operational errors go to stderr with exit 1. Either
is one line (what is wrong and how to fix it), never a traceback: an error nobody foresaw
says so and how to see its traceback (``--log-level debug``). Secrets in URLs are masked
in every line printed and logged (``fleetcare.collectors.redact``). A reader that closes
stdout early (``| head``) ends the command quietly with exit 1.
Every command reads ``FLEETCARE_*`` environment variables and ``--config FILE`` (TOML).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from fleetcare.api.commands.common import (
    LOG_FORMATS,
    LOG_LEVELS,
    CliError,
    Parser,
    Settings,
    duration_type,
    error_line,
    open_store,
    port,
    setup_logging,
    stdout_closed,
    version_text,
)
from fleetcare.collectors.config import ConfigError, load
from fleetcare.collectors.redact import mask_secrets

__all__ = ["CliError", "Parser", "Settings", "build_parser", "error_line", "main",
           "open_store", "port", "setup_logging", "stdout_closed"]

log = logging.getLogger("fleetcare")


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
        log.warning("serve.no_auth host=%s (the API accepts requests without a token)", host)
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
                  score_every_s=args.score_every,
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


# -- argument parsing ---------------------------------------------------------------------------------
def _add_serve_parser(sub: Any) -> None:
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
    v.add_argument("--score-every", type=duration_type(), default="60s",
                   help="rescoring period, e.g. 60s or 5m (default 60s)")
    v.add_argument("--drain-scheduler", choices=("none", "slurm", "kubernetes"), default="none",
                   help="after each scoring, decide drains for this scheduler (default none); "
                        "dry-run unless --drain-execute")
    v.add_argument("--drain-execute", action="store_true",
                   help="really drain (scontrol / cordon+taint); default: audit only")
    v.add_argument("--no-auth", action="store_true",
                   help="accept requests without a bearer token (loopback addresses only)")
    v.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                   help="text (default) or json: one JSON object per log line, for log "
                        "shippers ([cli] log_format, FLEETCARE_CLI_LOG_FORMAT)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="fleetcare",
        description="Predictive maintenance for GPU fleets: learn from fleet-wide telemetry "
                    "which GPUs are about to fail, and drain their nodes before they crash "
                    "a training job.",
        epilog="Environment: FLEETCARE_CLI_DB, FLEETCARE_CLI_PORT, ... override --config FILE "
               "([cli] table); flags override both.")
    p.add_argument("--version", action="version", version=version_text("fleetcare"))
    p.add_argument("--config", help="TOML config file (default: $FLEETCARE_CONFIG)")
    p.add_argument("--log-level", default=None, help="debug, info, warning (default), error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plugins = _plugins()
    for name in COMMAND_ORDER:
        if name == "serve":
            _add_serve_parser(sub)
        elif name in plugins:
            plugins[name].add_parser(sub)
    return p


COMMANDS = {"serve": cmd_serve}
"""Commands that live in this module: ``serve`` (its app and server wiring is being
reshaped with the API's routers)."""

PLUGIN_COMMANDS = ("simulate", "train", "score", "demo", "ingest", "quarantine", "incident",
                   "backfill", "retention", "tokens", "alerts", "drain", "evaluate", "models")
"""Commands that live in their own module ``fleetcare.api.commands.<name>``, each with
``add_parser(subparsers) -> None`` (registering exactly one sub-command named <name>)
and ``run(args, cfg: Settings) -> int``; what they share is public in
``fleetcare.api.commands.common``."""

COMMAND_ORDER = ("simulate", "train", "score", "serve", *PLUGIN_COMMANDS[3:])
"""The order of ``fleetcare --help``."""


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
    log_format = (getattr(args, "log_format", None) or cfg.log_format).lower()
    if log_format not in LOG_FORMATS:
        parser.error(f"log format {log_format!r} ([cli] log_format, FLEETCARE_CLI_LOG_FORMAT) "
                     f"is not one of {', '.join(LOG_FORMATS)}")
    setup_logging(level, log_format)
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
