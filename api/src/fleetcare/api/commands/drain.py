"""``fleetcare drain``: what the drain controller would do now, or do it.

    fleetcare drain --db PATH [--dry-run | --execute] [--scheduler slurm|kubernetes] [--json]
    fleetcare drain clear NODE --db PATH [--force] [--note TEXT] [--execute]
    fleetcare drain clear NODE --api URL [--token TOKEN] [--force] [--note TEXT]
    fleetcare drain audit --db PATH [--node NODE] [--limit 50] [--json]

Dry-run is the default: the scheduler is asked for node states, nothing is changed, and
the decisions are written to the audit log marked ``dry_run``. ``clear`` records that an
operator inspected a drained node; the node is resumed (now with --execute, else by the
next executing controller run) once its risk is below the resume threshold, or at once
with --force. While ``fleetcare serve`` runs it holds the database (DuckDB has one writer):
clear through its API instead, ``--api http://HOST:8000`` with an admin token (``--token``
or ``FLEETCARE_TOKEN``); the server's own drain controller then decides. See
``fleetcare.api.drains`` for the rules and safety rails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
from typing import Any

from fleetcare.api.http_client import add_api_arguments
from fleetcare.collectors.durations import duration_type

SCHEDULERS = ("slurm", "kubernetes")


def _common(p: argparse.ArgumentParser, *, sub: bool) -> None:
    d = argparse.SUPPRESS if sub else None
    p.add_argument("--db", default=d, help="DuckDB file with node scores (default: [cli] db)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default=d if sub else "slurm",
                   help="slurm (scontrol; SLURM_CONF as usual) or kubernetes (kubeconfig or "
                        "in-cluster); default slurm")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="execute", action="store_false",
                      default=d if sub else False,
                      help="show and audit what would happen, change nothing (default)")
    mode.add_argument("--execute", dest="execute", action="store_true",
                      default=d if sub else False, help="drain and resume for real")
    p.add_argument("--json", action="store_true", default=d if sub else False,
                   help="machine-readable output")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "drain", help="drain risky nodes in Slurm or Kubernetes (dry-run by default)",
        description="Decide from the latest node risks and the goodput cost model which "
                    "nodes to drain, within a circuit breaker (at most --max-per-hour nodes "
                    "or --max-fraction of the fleet per hour); never touches nodes already "
                    "draining or down; every decision goes to the drain_audit table.")
    _common(p, sub=False)
    p.add_argument("--max-per-hour", type=int, default=10,
                   help="circuit breaker: at most this many drains per hour (default 10)")
    p.add_argument("--max-fraction", type=float, default=0.05,
                   help="circuit breaker: at most this fraction of the fleet per hour "
                        "(default 0.05; the smaller limit wins, at least 1 node)")
    p.add_argument("--review-after", type=duration_type(), default="24h",
                   help="escalate a drain nobody cleared after this long (default 24h)")
    p.add_argument("--resume-below", type=float, default=None,
                   help="resume cleared nodes below this risk (default: half the "
                        "break-even risk)")
    p.add_argument("--job-gpus", type=int, default=1024,
                   help="cost model: GPUs of the job a node serves (default 1024)")
    hours = duration_type(bare="h", per="h")
    p.add_argument("--checkpoint-interval", type=hours, default="1h",
                   help="cost model: time between checkpoints, e.g. 30m or 2h (default 1h; "
                        "a bare number is hours)")
    p.add_argument("--restart-overhead", type=hours, default="15m",
                   help="cost model: time to restart a job, e.g. 15m (default 15m; a bare "
                        "number is hours)")
    p.add_argument("--drain-cost", type=float, default=24.0,
                   help="cost model: GPU-hours a drain costs (default 24)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--actor", default="fleetcare", help="name written to the audit log")
    sub = p.add_subparsers(dest="drain_command", metavar="ACTION")
    c = sub.add_parser("clear", help="an operator clears a drained node for resuming")
    c.add_argument("node")
    c.add_argument("--force", action="store_true",
                   help="resume whatever the current risk (e.g. after a GPU swap)")
    c.add_argument("--note", default="", help="why, for the audit log")
    c.add_argument("--by", default=None, help="who (default: $SUDO_USER or the login name)")
    add_api_arguments(c)
    _common(c, sub=True)
    a = sub.add_parser("audit", help="show the drain audit log, newest first")
    a.add_argument("--node", default=None)
    a.add_argument("--limit", type=int, default=50)
    _common(a, sub=True)


def _drainer(name: str) -> Any:
    if name == "kubernetes":
        from fleetcare.api.drains.kubernetes import KubernetesDrainer

        return KubernetesDrainer()
    from fleetcare.api.drains.slurm import SlurmDrainer

    return SlurmDrainer()


def _controller(store: Any, args: argparse.Namespace) -> Any:
    from fleetcare.api.drains import BreakerPolicy, DrainController, DrainPolicy
    from fleetcare.models.goodput import CostModel

    review = dt.timedelta(seconds=args.review_after)
    cost = CostModel(job_gpus=args.job_gpus, checkpoint_interval_h=args.checkpoint_interval,
                     restart_overhead_h=args.restart_overhead, drain_cost_gpu_h=args.drain_cost,
                     gpus_per_node=args.gpus_per_node)
    return DrainController(
        store, _drainer(args.scheduler), cost,
        policy=DrainPolicy(resume_below=args.resume_below, review_after=review,
                           actor=args.actor),
        breaker=BreakerPolicy(max_fraction=args.max_fraction, max_nodes=args.max_per_hour),
        dry_run=not args.execute)


def _operator() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import existing_db
    from fleetcare.api.drains.audit import AuditLog
    from fleetcare.pipeline.store import Store, StoreError

    if args.drain_command == "clear" and args.api:
        return _clear_via_api(args)
    try:
        store = Store(existing_db(args.db or cfg.db))
    except StoreError as exc:
        from fleetcare.api.commands.common import CliError

        hint = (f" To clear while `fleetcare serve` runs: fleetcare drain clear {args.node} "
                "--api http://HOST:8000 --token ADMIN_TOKEN" if args.drain_command == "clear"
                else "")
        raise CliError(f"{exc}{hint}") from None
    try:
        if args.drain_command == "audit":
            rows = AuditLog(store).rows(node=args.node, limit=args.limit)
            if args.json:
                print(json.dumps({"audit": [r.to_json() for r in rows]}))
            else:
                for r in rows:
                    risk = "-" if r.risk is None else f"{r.risk:.3f}"
                    dry = " (dry-run)" if r.dry_run else ""
                    print(f"{r.ts:%Y-%m-%d %H:%M:%S}  {r.node:12s} {r.action:9s}{dry} "
                          f"risk {risk}  by {r.actor}: {r.result}  [{r.reason or ''}]")
            return 0
        ctl = _controller(store, args)
        if args.drain_command == "clear":
            decisions = ctl.clear(args.node, actor=args.by or _operator(), note=args.note,
                                  force=args.force)
            _print_clear(args, {"dry_run": ctl.dry_run,
                                "decisions": [d.to_json() for d in decisions]})
            return 0
        report = ctl.run_once()
        if args.json:
            print(json.dumps(report.to_json()))
        else:
            _print_report(report)
        return 0
    finally:
        store.close()


def _clear_via_api(args: argparse.Namespace) -> int:
    """POST /v1/drains/{node}/clear on a running server; prints what it decided."""
    from fleetcare.api.http_client import call, quote

    _print_clear(args, call(args.api, "POST", f"/v1/drains/{quote(args.node)}/clear",
                            token=args.token, body={
                                "note": args.note or (f"cleared by {args.by}" if args.by else ""),
                                "force": args.force}))
    return 0


def _print_clear(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """``{"dry_run", "decisions"}`` of a clear, local or through the API, as JSON or lines."""
    if args.json:
        print(json.dumps(doc))
    else:
        for d in doc["decisions"]:
            print(f"{d['node']}: {d['action']} ({d['result']}) - {d['reason']}")


def _print_report(r: Any) -> None:
    mode = "DRY RUN: nothing changed" if r.dry_run else "EXECUTED"
    print(f"{mode}; scheduler {r.scheduler}; {r.fleet_size} nodes scored"
          + (f" at {r.scores_ts:%Y-%m-%d %H:%M} UTC" if r.scores_ts else " (no scores yet)"))
    print(f"drain above risk {r.break_even_risk:.3f} (break-even), resume cleared nodes below "
          f"{r.resume_below:.3f}; breaker: {r.budget.limit} drain(s)/hour, "
          f"{r.budget.used} used before this run")
    if not r.decisions:
        print("no node to drain or resume")
    for d in r.decisions:
        risk = "-" if d.risk is None else f"{d.risk:.3f}"
        print(f"  {d.action:9s} {d.node:12s} risk {risk:>6s}  {d.result}")
        print(f"            {d.reason}")
