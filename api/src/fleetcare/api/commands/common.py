"""What every ``fleetcare`` command shares: the parser, settings, errors, output, stores.

Commands (``fleetcare.api.commands.<name>``, ``fleetcare.api.cli``, ``fleetcare.api.demo``)
import these public names from here and nothing private from each other:

    CliError        an operational error: one line on stderr, exit 1
    Parser          argparse with one-line usage errors and "did you mean" for choices
    Settings        the [cli] table / FLEETCARE_CLI_* environment
    port            argparse type: a TCP port
    duration_type   argparse type: 30m, 1h, 2d (fleetcare.collectors.durations)
    open_store, existing_db          the DuckDB store a command works on
    print_json, human, print_metrics  machine output (full precision) and human output
    progress_steps  timed step lines on stderr for long work
    train_model, top_risk, print_top  train on a store; the riskiest nodes, printed
    setup_logging, LOG_FORMATS, error_line, stdout_closed, version_text
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fleetcare.collectors.durations import duration_type
from fleetcare.collectors.redact import MaskingFormatter, mask_secrets
from fleetcare.collectors.transport.kafka import KafkaSecurityConfig

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "CliError", "Parser", "Settings", "duration_type",
           "error_line", "existing_db", "human", "open_store", "port", "print_json",
           "print_metrics", "print_top", "progress_steps", "setup_logging", "stdout_closed",
           "top_risk", "train_model", "version_text"]

log = logging.getLogger("fleetcare")

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class CliError(Exception):
    """An operational error: printed to stderr, exit 1."""


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``PROG: error: MESSAGE`` naming the flag: the usage dump
    argparse prints before it is left out (``--help`` shows it). A mistyped command or
    choice gets the nearest valid one: ``did you mean 'train'?``."""

    def print_usage(self, file: Any = None) -> None:
        """Called by ``error`` only (``--help`` prints the help): nothing."""

    def error(self, message: str) -> NoReturn:
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            near = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
            if near:
                message = (f"{message[:m.start()]}invalid choice: {m.group(1)!r}; did you "
                           f"mean {near[0]!r}? (choose from {m.group(2)})")
        super().error(message)

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


def version_text(prog: str = "fleetcare") -> str:
    """``fleetcare 0.1.0 (api 0.1.0, models 0.1.0, pipeline 0.1.0, collectors 0.1.0)``:
    the installed distributions, which can differ on a host that upgraded one."""
    from importlib.metadata import PackageNotFoundError, version

    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    parts = ", ".join(f"{c} {v(f'fleetcare-{c}')}"
                      for c in ("api", "models", "pipeline", "collectors"))
    return f"{prog} {v('fleetcare-api')} ({parts})"


def _raised_by_fleetcare(exc: BaseException) -> bool:
    """Whether the innermost Python frame ``exc`` passed through is fleetcare's own code
    (a built-in such as ``int()`` or ``datetime.fromisoformat`` has no frame: its caller's
    counts). True for an exception that was never raised."""
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("fleetcare.")


def error_line(exc: BaseException) -> str:
    """The one line printed for an operational error: the message (fleetcare's errors,
    the ValueErrors fleetcare raises, and OSError say what is wrong and the fix), or for
    an error nobody foresaw — a ValueError from inside a library (numpy, LightGBM: a bug of
    ours that passed it bad data) included — its type and how to see the traceback.
    Secrets masked, newlines folded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    expected = (type(exc).__module__.startswith("fleetcare.")
                or isinstance(exc, OSError)
                or (isinstance(exc, ValueError) and _raised_by_fleetcare(exc)))
    if not expected:
        text = (f"unexpected error ({type(exc).__name__}: {text}); rerun with --log-level "
                "debug for the traceback, and report it")
    return mask_secrets(text)


def setup_logging(level: str, log_format: str = "text") -> None:
    """stderr, ``time level logger message`` or one JSON object per line (``json``: for
    log shippers; ``event k=v`` messages become fields), secrets masked."""
    from fleetcare.collectors.cli import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    inner = JsonFormatter() if log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(MaskingFormatter(inner))
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
    log_format: str = "text"
    # where serve / ingest read from: a bus (kafka://... or embedded://...) or a lake
    bus: str | None = None
    lake: str | None = None
    group: str | None = None
    topic_prefix: str | None = None
    # the API: the largest request body it reads (larger: 413)
    max_body_bytes: int = 1 << 20
    # DuckDB's memory limit for every database a command opens ("4GB"; default DuckDB's own,
    # 80 % of RAM); past it DuckDB spills to disk
    duckdb_memory: str | None = None
    # serve: how many niceness levels its ingest, scoring and sample-memory threads run below
    # the API's (0 to 19; 0: the same priority), so a request does not wait behind a write
    background_nice: int = 10


# -- output ---------------------------------------------------------------------------------
def print_json(obj: object) -> None:
    """Machine output: one JSON object, full precision (``--json``)."""
    print(json.dumps(obj, indent=None, sort_keys=False, allow_nan=False))


def human(v: Any) -> str:
    """A metric for people: 3 decimals below 1 (``0.412``), 2 up to 100 (``37.51``),
    whole numbers with separators above (``1,234``); ints, None and text as they are;
    lists and dicts item by item. ``--json`` keeps full precision."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        a = abs(v)
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:.2f}"
        if a and a < 0.001:
            return f"{v:.1e}"
        return f"{v:.3f}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(human(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {human(x)}" for k, x in v.items()) or "-"
    return str(v)


def print_metrics(metrics: Mapping[str, Any], indent: str = "  ") -> None:
    """``name  value`` lines, values rounded by ``human``."""
    for k, v in metrics.items():
        print(f"{indent}{k:36s} {human(v)}")


def progress_steps(command: str, *, enabled: bool | None = None,
                   clock: Callable[[], float] = time.monotonic) -> Callable[[str], None]:
    """A ``progress(message)`` callback for long work: ``train: [  12s] labels for ...``
    on stderr (stdout stays the result). ``enabled`` None: only when stderr is a
    terminal, like the progress bars, so a script or a failure still reads one line."""
    t0 = clock()

    def say(message: str) -> None:
        on = sys.stderr.isatty() if enabled is None else enabled
        if on:
            print(f"{command}: [{clock() - t0:5.0f}s] {message}", file=sys.stderr, flush=True)

    return say


# -- stores, models, scores -----------------------------------------------------------------
def open_store(db: str, *, lake: str | None = None, create: bool = False,
               create_lake: bool = False, sync: bool = False) -> Any:
    """The store at ``db`` (its raw telemetry in ``lake`` when given). ``create``: make a
    new database, ``create_lake`` a new lake; otherwise they must exist. ``sync``: read
    the lake's new files first."""
    from fleetcare.pipeline.store import Store

    if create:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    else:
        existing_db(db)
    if lake is None:
        return Store(db)
    from fleetcare.pipeline.lake_feed import open_state

    try:
        store = open_state(db, lake, create=create_lake)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    while sync and store.raw.sync(store).files:  # type: ignore[attr-defined]
        pass
    return store


def existing_db(db: str, make: str | None = None) -> str:
    """``db`` if the file exists, else a CliError saying how to make one (``make``: the
    command that would, default ``fleetcare simulate --db DB``)."""
    if not Path(db).exists():
        make = make or f"fleetcare simulate --db {db}"
        raise CliError(f"database {db} does not exist: create it with `{make}` or point "
                       f"--db at an existing one")
    return db


def train_model(store: Any, horizon_h: float, seed: int, min_failures: int | None = None,
                progress: Callable[[str], None] | None = None) -> Any:
    """Roll up the store's telemetry and train a model of its fleet (registered, not yet
    promoted): ``fleetcare.models.training.train``'s result."""
    from fleetcare.models.training import MIN_TRAIN_FAILURES, train
    from fleetcare.pipeline import features

    if progress is not None:
        progress("rolling up telemetry")
    features.refresh(store)
    return train(store, horizon_h=horizon_h, seed=seed, progress=progress,
                 min_failures=MIN_TRAIN_FAILURES if min_failures is None else min_failures)


def top_risk(store: Any, limit: int) -> list[dict[str, Any]]:
    """The highest-risk nodes of the latest scoring: node, risk, reasons (sentences)."""
    from fleetcare.models.scoring import latest_node_scores

    out = []
    for r in latest_node_scores(store, limit=limit).to_pylist():
        reasons = json.loads(r["reasons"]) if isinstance(r["reasons"], str) else r["reasons"]
        out.append({"node": r["node"], "risk": round(float(r["risk"]), 4),
                    "reasons": list(reasons or [])})
    return out


def print_top(top: list[dict[str, Any]]) -> None:
    """The riskiest nodes as a table: node, risk, the first two reasons."""
    print(f"{'node':14s} {'risk':>6s}  reasons")
    for r in top:
        reasons = "; ".join(r["reasons"][:2]) or "-"
        print(f"{r['node']:14s} {r['risk']:6.3f}  {reasons}")
