"""``fleetcare``: simulate a fleet, train the model, serve the risk API, run the demo.

    fleetcare simulate --nodes 64 --days 30 --seed 1 --db var/fleet.duckdb
    fleetcare simulate --nodes 2048 --days 54 --incidents-only --json
    fleetcare train --db var/fleet.duckdb --horizon 24h --json
    fleetcare score --db var/fleet.duckdb --json
    fleetcare serve --db var/fleet.duckdb --port 8000
    fleetcare demo [--once --json]
    fleetcare --version

Each command is a module of ``fleetcare.api.commands``; what they
share is public in ``fleetcare.api.commands.common``. Durations take units (``30m``,
``1h``, ``2d``). A mistyped command or choice is answered with the nearest valid one.
Usage errors exit 2 naming the flag; operational errors go to stderr with exit 1. Either
is one line (what is wrong and how to fix it), never a traceback: an error nobody foresaw
says so and how to see its traceback (``--log-level debug``). Secrets in URLs are masked
in every line printed and logged (``fleetcare.collectors.redact``). A reader that closes
stdout early (``| head``) ends the command quietly with exit 1. ``kill -USR1 <pid>``
prints every thread's stack to stderr and lets the command run on (a stuck ``serve``).
Every command reads ``FLEETCARE_*`` environment variables and ``--config FILE`` (TOML).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from fleetcare.api.commands.common import (
    LOG_FORMATS,
    LOG_LEVELS,
    CliError,
    Parser,
    Settings,
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
        if name in plugins:
            plugins[name].add_parser(sub)
    return p


PLUGIN_COMMANDS = ("simulate", "train", "score", "serve", "demo", "ingest", "quarantine",
                   "incident", "backfill", "rollup", "retention", "tokens", "alerts", "drain",
                   "evaluate", "models", "recurrence")
"""Commands that live in their own module ``fleetcare.api.commands.<name>``, each with
``add_parser(subparsers) -> None`` (registering exactly one sub-command named <name>)
and ``run(args, cfg: Settings) -> int``; what they share is public in
``fleetcare.api.commands.common``."""

COMMAND_ORDER = PLUGIN_COMMANDS
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


def _stacks_on_usr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack on stderr (a stuck ``serve``), when
    stderr is a real file (not when a caller captured it in memory)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


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
    _stacks_on_usr1()
    from fleetcare.pipeline import store

    store.MEMORY_LIMIT = cfg.duckdb_memory
    try:
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
