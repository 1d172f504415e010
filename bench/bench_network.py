"""Network failures on a simulated fleet with InfiniBand ports (issue 16 §2): can a model
see cable and NIC failures coming, and at what cost to the rest?

    .venv/bin/python bench/bench_network.py [--nodes 512] [--days 30] [--seed 22]
                                            [--failure-scale 20] [--workdir DIR]

Simulates one fleet with 8 InfiniBand ports a node (``fleetcare simulate --nic-ports 8``,
10-minute history; reused from ``--workdir`` when there) and runs ``fleetcare evaluate``
on it: a model trained on the fleet's first 60 % (it reads the ``node_nic_*`` features),
measured on its last 25 % at the budget of 1 false drain per 1,000 node-days, beside the
shipped prior at the same budget (its feature list predates the NIC features). Prints
one JSON object: per mode (``link``: cable/transceiver, ``nic``) the failures and those
caught, and the overall figures. Network failures are 10 % of Llama 3's Table 5 and a
share of them has precursors, so a fleet needs many failures for a handful of them in
its test period: the default multiplies every rate by 20. Simulated data.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from typing import Any

from fleetcare.api.cli import main as cli
from fleetcare.models import network_head


def _run(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(argv)
    if rc != 0:
        raise SystemExit(f"fleetcare {argv[0]} failed (exit {rc})")
    return dict(json.loads(out.getvalue()))


def _recalls(by_mode: dict[str, list[int]]) -> dict[str, Any]:
    """Precursor and network recall (0 where there were none) from ``detected_by_mode``."""
    prec = [v for k, v in by_mode.items() if k != "none"]
    return {"precursor_recall": sum(d for d, _ in prec) / max(1, sum(n for _, n in prec)),
            "network_recall": network_head.recall(by_mode)[0] or 0.0}


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    by_mode = m["detected_by_mode"]
    return {
        "pr_auc": m["pr_auc"], "threshold": m["threshold"],
        "false_drains_per_1000_node_days": m["false_drains_per_1000_node_days"],
        **_recalls(by_mode),
        "median_lead_h": m["median_lead_time_h"],
        "detected_by_mode": by_mode,
    }


def _at_shipped(a: dict[str, Any]) -> dict[str, Any]:
    """The prior at its own operating point (fixed on its validation fleets): its
    threshold, and its network head's."""
    by_mode = a.get("detected_by_mode") or {}
    return {"threshold": a["threshold"], "network_threshold": a.get("network_threshold"),
            "false_drains_per_1000_node_days": a["false_drains_per_1000_node_days"],
            **_recalls(by_mode), "detected_by_mode": by_mode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--failure-scale", type=float, default=20.0)
    ap.add_argument("--workdir", default="var/bench-network")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    db = os.path.join(args.workdir, f"net-{args.nodes}-{args.days}-{args.seed}-"
                                    f"{args.failure_scale:g}.duckdb")
    t0 = time.monotonic()
    if os.path.exists(db):
        print(f"reusing {db}", file=sys.stderr)
    else:
        _run(["simulate", "--nodes", str(args.nodes), "--days", str(args.days), "--seed",
              str(args.seed), "--failure-scale", str(args.failure_scale), "--nic-ports", "8",
              "--interval", "10m", "--db", db, "--json"])
    doc = _run(["evaluate", "--db", db, "--json"])
    print(json.dumps({
        "simulated": True,
        "fleet": doc["fleet"], "test_period": doc["test_period"],
        "fleet_model": _summary(doc["model"]),
        "prior": _summary(doc["prior"]) | {
            "model_id": doc["prior"].get("model_id"),
            "at_shipped_threshold": _at_shipped(doc["prior"]["at_shipped_threshold"])},
        "wall_s": round(time.monotonic() - t0, 1),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
