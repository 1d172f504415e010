"""``fleetcare demo``: the whole product on one host, on simulated data (see
``fleetcare.api.demo``).

    fleetcare demo [--once --json]
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetcare.api.commands.common import Settings, duration_type, port


def add_parser(subparsers: Any) -> None:
    d = subparsers.add_parser(
        "demo", help="simulate, train, stream live telemetry, serve the API",
        description="Simulate 64 nodes x 30 days of history, train, then stream live "
                    "simulated telemetry through the agent and the embedded bus, rescoring "
                    "every minute, deciding drains in dry-run, and serving the API and "
                    "dashboard at http://127.0.0.1:8000 until Ctrl-C.")
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
    d.add_argument("--nic-ports", type=int, default=0, metavar="N",
                   help="InfiniBand ports per node to simulate (a DGX H100 has 8): NIC "
                        "telemetry, link flaps and network failures with precursors "
                        "(default 0: GPUs only)")
    d.add_argument("--history-interval", type=duration_type(), default="5m",
                   help="sample interval of the simulated history (default 5m, so the demo "
                        "fits in minutes on 2 cores; live telemetry streams at 60s)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=port, default=8000)
    d.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall second while live (default 1; 60 = an "
                        "hour of fleet time per minute)")
    d.add_argument("--score-every", type=duration_type(), default="60s",
                   help="rescoring period, wall time (default 60s)")
    d.add_argument("--live-minutes", type=float, default=60,
                   help="simulated minutes to stream with --once (default 60)")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from fleetcare.api.demo import run_demo

    return run_demo(args)
