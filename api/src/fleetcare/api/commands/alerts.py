"""``fleetcare alerts list|test-sink|deliver``: the alerts, a sink check, the outbox.

    fleetcare alerts list --db PATH [--state firing] [--limit N] [--json]
    fleetcare alerts test-sink NAME [--config FILE] [--json]
    fleetcare alerts deliver --db PATH [--config FILE] [--json]

Sinks come from ``[[alerts.sinks]]`` of the config file (``--config`` or
``$FLEETCARE_CONFIG``), secrets from ``FLEETCARE_ALERTS_<SINK>_URL|ROUTING_KEY|SECRET``;
secrets are never printed.

``list --json``: ``{"alerts": [{"id", "node", "state", "risk", "started_at", "fired_at",
"resolved_at", "reasons", "updated_at", "resolving_since", "peak_risk", "top_gpu_uuid",
"model_id", "p_net"}], "outbox": {"pending": N, "delivered": N, "dead": N}}``, newest first, times
RFC 3339 UTC.

``test-sink`` POSTs a made-up firing alert for node ``fleetcare-test`` to one sink now
(not through the outbox) and prints the receiver's HTTP status; exit 1 unless 2xx. Its
threshold is the configured one, or with ``threshold = "model"`` the shipped fleet prior's
(what a fleet without a model of its own alerts at; no database is read).

``deliver`` sends the outbox's due messages once, as the service does every minute. It
writes the database, so it cannot run while ``fleetcare serve`` holds it: the service
delivers on its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any

_DOC = __doc__ or ""


def add_parser(subparsers: Any) -> None:
    a = subparsers.add_parser(
        "alerts", help="list alerts, test a sink, deliver the outbox",
        description="Alerts fire when a node's failure risk stays above [alerts] threshold; "
                    "they are sent to the [[alerts.sinks]] through a durable outbox.",
        epilog=_DOC[_DOC.index("``list --json``"):].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = a.add_subparsers(dest="alerts_command", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="alerts, newest first, and the outbox's counts")
    ls.add_argument("--state", choices=("pending", "firing", "resolved"), default=None)
    ls.add_argument("--limit", type=int, default=100, help="rows to print (default 100)")
    ts = sub.add_parser("test-sink", help="POST a made-up alert to one sink now")
    ts.add_argument("name", help="the sink's name in [[alerts.sinks]]")
    dl = sub.add_parser("deliver", help="send the outbox's due messages once")
    for p in (ls, dl):
        p.add_argument("--db", help="DuckDB file (default: the [cli] db setting)")
    for p in (ls, ts, dl):
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, cfg: Any) -> int:
    if args.alerts_command == "list":
        return _list(args, cfg)
    if args.alerts_command == "test-sink":
        return _test_sink(args)
    return _deliver(args, cfg)


def _config(args: argparse.Namespace) -> Any:
    from fleetcare.api.alerts.config import load
    from fleetcare.api.commands.common import CliError
    from fleetcare.collectors.config import ConfigError

    try:
        return load(getattr(args, "config", None))
    except ConfigError as exc:
        raise CliError(str(exc)) from exc


def _open(args: argparse.Namespace, cfg: Any, *, read_only: bool) -> Any:
    from fleetcare.api.commands.common import CliError, existing_db
    from fleetcare.pipeline.store import Store, StoreError

    try:
        return Store(existing_db(args.db or cfg.db), read_only=read_only)
    except StoreError as exc:
        raise CliError(str(exc)) from exc


def _list(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.alerts.engine import list_alerts
    from fleetcare.api.commands.common import CliError, print_json

    if args.limit < 0:
        raise CliError(f"--limit {args.limit} must be >= 0")
    store = _open(args, cfg, read_only=True)
    try:
        cur = store.cursor()
        tables = {r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        alerts = (list_alerts(cur, state=args.state, limit=args.limit)
                  if "alerts" in tables else [])
        outbox = {"pending": 0, "delivered": 0, "dead": 0}
        if "alert_outbox" in tables:
            outbox.update({s: int(n) for s, n in cur.execute(
                "SELECT state, count(*) FROM alert_outbox GROUP BY state").fetchall()})
    finally:
        store.close()
    if args.json:
        print_json({"alerts": alerts, "outbox": outbox})
        return 0
    print(f"{'node':16s} {'state':9s} {'risk':>6s}  {'fired_at':22s} id")
    for a in alerts:
        print(f"{a['node']:16s} {a['state']:9s} {a['risk']:6.3f}  {a['fired_at'] or '-':22s} "
              f"{a['id']}")
    print(f"outbox: {outbox['pending']} pending, {outbox['delivered']} delivered, "
          f"{outbox['dead']} dead")
    return 0


def _shown_threshold(config: Any) -> float:
    """The made-up alert's threshold: the configured one, or with ``threshold = "model"``
    the shipped prior's operating threshold (the configured fallback without a prior)."""
    if not config.from_model:
        return float(config.threshold)
    from fleetcare.api.alerts.engine import operating_point
    from fleetcare.models import prior

    try:
        _, meta = prior.load()
    except FileNotFoundError:
        return float(config.threshold)
    point = operating_point(prior.shipped_metrics(meta))
    return point.threshold if point is not None else float(config.threshold)


def _test_sink(args: argparse.Namespace) -> int:
    from fleetcare.api.alerts import sinks as sinks_mod
    from fleetcare.api.alerts.config import mask_url
    from fleetcare.api.alerts.outbox import urllib_post
    from fleetcare.api.commands.common import CliError, print_json
    from fleetcare.collectors.config import ConfigError

    config = _config(args)
    try:
        sink_cfg = config.sink(args.name)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    sink = sinks_mod.build(sink_cfg)
    threshold = _shown_threshold(config)
    now = time.time()
    at = dt.datetime.fromtimestamp(now, dt.UTC).replace(tzinfo=None, microsecond=0)
    event = sinks_mod.AlertEvent(
        event_id=f"fleetcare-test@{at:%Y%m%dT%H%M%SZ}:firing:test",
        alert_id=f"fleetcare-test@{at:%Y%m%dT%H%M%SZ}", status="firing", node="fleetcare-test",
        risk=max(threshold, sink_cfg.min_risk), peak_risk=max(threshold, sink_cfg.min_risk),
        threshold=threshold, started_at=at, fired_at=at, resolved_at=None,
        reasons=("This is a test alert from `fleetcare alerts test-sink`.",),
        external_url=config.external_url)
    url, headers, body = sink.render(event)
    if isinstance(sink, sinks_mod.SigningSink):
        headers = sink.sign(headers, body, now)
    try:
        status: int | None = urllib_post(url, headers, body, config.timeout_s)
        error = None if status is not None and 200 <= status < 300 else f"HTTP {status}"
    except OSError as exc:
        status, error = None, f"{type(exc).__name__}: {exc}".replace(url, mask_url(url))
    out = {"sink": sink_cfg.name, "kind": sink_cfg.kind, "url": mask_url(url),
           "status": status, "ok": error is None, "error": error}
    if args.json:
        print_json(out)
    elif error is None:
        print(f"sink {sink_cfg.name} ({sink_cfg.kind}) at {out['url']}: HTTP {status}, ok")
    if error is not None:
        raise CliError(f"sink {sink_cfg.name} ({sink_cfg.kind}) at {out['url']} failed: {error}; "
                       "check the URL and credentials (FLEETCARE_ALERTS_<SINK>_...)")
    return 0


def _deliver(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.alerts.engine import AlertEngine
    from fleetcare.api.commands.common import print_json

    config = _config(args)
    store = _open(args, cfg, read_only=False)
    try:
        engine = AlertEngine.from_config(store, config)
        done = engine.outbox.deliver_due(time.time())
        stats = engine.outbox.stats()
    finally:
        store.close()
    out = {"delivered": done.delivered, "retried": done.retried, "dead": done.dead,
           "outbox": stats}
    if args.json:
        print_json(out)
    else:
        print(f"delivered {done.delivered}, retrying {done.retried}, gave up {done.dead}; "
              f"outbox: {stats['pending']} pending, {stats['delivered']} delivered, "
              f"{stats['dead']} dead")
    return 0
