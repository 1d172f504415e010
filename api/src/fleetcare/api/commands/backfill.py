"""``fleetcare backfill``: copy dcgm-exporter history from Prometheus into the database.

    fleetcare backfill --prometheus http://prometheus:9090 --since 90d --db var/fleet.duckdb
    fleetcare backfill --prometheus URL --since 2026-01-01 --until 2026-02-01 --json

Interrupted runs continue where they stopped (progress is kept in the database);
``--restart`` ignores it. See ``fleetcare.pipeline.backfill``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from fleetcare.api.progress import progress_bar
from fleetcare.collectors.durations import parse_duration
from fleetcare.collectors.redact import mask_secrets


def add_parser(subparsers: Any) -> None:
    b = subparsers.add_parser(
        "backfill", help="import dcgm-exporter history from a Prometheus server",
        description="Pull the dcgm-exporter series (DCGM_FI_*) a Prometheus server already "
                    "holds through its HTTP API (/api/v1/query_range, chunked by time) and "
                    "store them as telemetry, so a site trains on the history it has on day "
                    "one. Resumable: a rerun continues after the last completed chunk; rows "
                    "already stored are never duplicated.")
    b.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://prometheus:9090")
    b.add_argument("--since", required=True, metavar="AGE|TIME",
                   help="start: an age before --until (90d, 12h) or a UTC time (2026-01-01)")
    b.add_argument("--until", default="now", metavar="TIME",
                   help="end: a UTC time (ISO 8601), an age before now (1d), or now "
                        "(default)")
    b.add_argument("--db", help="DuckDB file to write (created if missing)")
    b.add_argument("--step", default="60s",
                   help="resolution: the dcgm-exporter scrape interval (default 60s)")
    b.add_argument("--chunk", default="6h",
                   help="time range per query (default 6h; smaller for big fleets)")
    b.add_argument("--match", default="", metavar="MATCHERS",
                   help="extra label matchers for every query, e.g. 'cluster=\"a\"'")
    b.add_argument("--node-label", default=None, metavar="LABEL",
                   help="label holding the node name (default: Hostname, as dcgm-exporter "
                        "sets it; in Kubernetes e.g. kubernetes_node)")
    b.add_argument("--timeout", default="60s", help="HTTP timeout per query (default 60s)")
    b.add_argument("--restart", action="store_true",
                   help="ignore recorded progress and fetch the whole range again")
    b.add_argument("--json", action="store_true", help="machine-readable output")


def _parse_time(text: str, *, flag: str, now: dt.datetime) -> dt.datetime:
    """``now``, an age before ``now`` (90d; a plain number is seconds), or ISO 8601 (naive = UTC)."""
    if text == "now":
        return now
    try:
        return now - dt.timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not understood: use an age (90d, 12h), an "
                         "ISO 8601 UTC time (2026-01-01T00:00:00)") from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.pipeline.backfill import backfill
    from fleetcare.pipeline.store import Store

    now = dt.datetime.now(dt.UTC)
    until = _parse_time(args.until, flag="--until", now=now)
    since = _parse_time(args.since, flag="--since", now=until)
    step, chunk = parse_duration(args.step), parse_duration(args.chunk)
    timeout = parse_duration(args.timeout)
    db = args.db or cfg.db
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    progress = progress_bar("backfill", unit="chunk", enabled=not args.json)
    with Store(db) as store:
        try:
            result = backfill(store, args.prometheus, since, until, step_s=step,
                              chunk_s=chunk, match=args.match, node_label=args.node_label,
                              timeout_s=timeout, restart=args.restart, progress=progress)
        finally:
            progress.close()
    if args.json:
        print(json.dumps({"prometheus": mask_secrets(result.url), "db": db,
                          "start": result.start.isoformat(), "end": result.end.isoformat(),
                          "chunks": result.chunks, "resumed": result.resumed,
                          "points": result.points, "samples": result.samples,
                          "added": result.added, "seconds": round(result.seconds, 3)}))
    else:
        how = "resumed, " if result.resumed else ""
        print(f"backfilled {result.added:,} new samples ({result.samples:,} read, {how}"
              f"{result.chunks} chunks) from {mask_secrets(result.url)} into {db}, "
              f"{result.start:%Y-%m-%d %H:%M} .. {result.end:%Y-%m-%d %H:%M} UTC")
    return 0
