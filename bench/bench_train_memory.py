"""Peak memory of `fleetcare train` and `fleetcare evaluate` as the fleet grows (issue 15 §1).

    .venv/bin/python bench/bench_train_memory.py --workdir var/trainmem \\
        [--fleet 64:30 --fleet 512:30 ...] [--db NAME=PATH ...] [--duckdb-memory 3GB] \\
        [--failure-scale 4] [--interval 5m] [--only train|evaluate] [--code DIR]

Each fleet (``NODES:DAYS``, 8 GPUs a node, simulated once into ``--workdir`` and reused;
or an existing database with ``--db``) is trained and evaluated by the real CLI in a child
process of its own; its peak RSS is the child's ``ru_maxrss`` (DuckDB's memory included:
``--duckdb-memory`` caps it through ``FLEETCARE_CLI_DUCKDB_MEMORY``). The ceiling is the
issue's budget, 8 GB at 2,048 nodes x 30 days; growth is how much the peak rises per
doubling of the fleet's hourly rows, from the smallest fleet to the largest (1.0: memory
proportional to rows). ``--code DIR`` runs another checkout's source instead (e.g. the
code before the change, for a before/after in the same run).

Prints one JSON object. Simulated data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import report

BUDGET_GB = 8.0
PACKAGES = ("collectors", "pipeline", "models", "api")


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int, float, float, str]:
    """``_child`` in a fresh interpreter, so ``RUSAGE_CHILDREN`` is this child's alone."""
    probe = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
             "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
             "sys.stderr.write(p.stderr);"
             "print(json.dumps({'rc':p.returncode,'wall':time.perf_counter()-t,"
             "'kb':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,'out':p.stdout}))")
    got = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                         env=env)
    if got.returncode:
        raise SystemExit(f"bench child failed: {got.stderr.strip()[-400:]}")
    doc = json.loads(got.stdout)
    if doc["rc"]:
        tail = got.stderr.strip().splitlines()
        print(f"{' '.join(cmd[:3])}: {tail[-1] if tail else doc['rc']}", file=sys.stderr)
    return doc["rc"], doc["wall"], doc["kb"] / 2**20, doc["out"]


def _fleet(workdir: Path, spec: str, args: argparse.Namespace, env: dict[str, str]
           ) -> tuple[str, Path, int, int]:
    nodes, days = (int(x) for x in spec.split(":"))
    db = workdir / f"fleet-{nodes}x{days}-{args.interval}-x{args.failure_scale:g}.duckdb"
    if not db.exists():
        print(f"simulating {nodes} nodes x {days} days into {db}", file=sys.stderr)
        tmp = db.with_suffix(".tmp.duckdb")
        tmp.unlink(missing_ok=True)
        rc, wall, _rss, _ = _run([str(Path(sys.executable).parent / "fleetcare"), "simulate",
                                  "--nodes", str(nodes), "--days", str(days), "--seed",
                                  str(args.seed), "--interval", args.interval,
                                  "--failure-scale", str(args.failure_scale),
                                  "--db", str(tmp)], env)
        if rc:
            raise SystemExit(f"simulate {spec} failed")
        tmp.rename(db)
        print(f"  {wall:.0f} s", file=sys.stderr)
    return spec, db, nodes, days


def _rows(db: Path, env: dict[str, str]) -> int:
    """Hourly GPU rows of the fleet (GPUs x hours of telemetry)."""
    code = ("import duckdb,sys;c=duckdb.connect(sys.argv[1],read_only=True);"
            "print(c.execute(\"SELECT count(DISTINCT gpu_uuid) * (epoch(max(ts)) - epoch(min(ts)))"
            " / 3600 FROM telemetry\").fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True,
                         text=True, env=env, check=True).stdout
    return int(float(out.strip().splitlines()[-1]))


def _summary(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    m = doc.get("metrics", doc) if kind == "train" else doc.get("model", {})
    keep = ("pr_auc", "recall_at_budget", "false_drains_per_1000_node_days",
            "median_lead_time_h", "n_failures", "train_rows", "healthy_rows_sampled")
    return {k: m.get(k) for k in keep if k in m}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="var/trainmem")
    ap.add_argument("--fleet", action="append", help="NODES:DAYS (repeatable; default 64:30)")
    ap.add_argument("--db", action="append", default=[], help="NAME=PATH of an existing fleet")
    ap.add_argument("--interval", default="5m")
    ap.add_argument("--failure-scale", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--duckdb-memory", default="3GB")
    ap.add_argument("--only", choices=("train", "evaluate"))
    ap.add_argument("--code", help="another checkout whose source runs instead")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLEETCARE_CLI_DUCKDB_MEMORY": args.duckdb_memory}
    if args.code:
        src = [str(Path(args.code) / p / "src") for p in PACKAGES]
        env["PYTHONPATH"] = os.pathsep.join([*src, env.get("PYTHONPATH", "")])
    fleets = [_fleet(workdir, f, args, env) for f in (args.fleet or ([] if args.db else
                                                                      ["64:30"]))]
    for item in args.db:
        name, _, path = item.partition("=")
        fleets.append((name, Path(path), 0, 0))
    exe = str(Path(sys.executable).parent / "fleetcare")
    results = []
    for name, db, _nodes, _days in fleets:
        rows = _rows(db, env)
        entry: dict[str, Any] = {"fleet": name, "db": db.name, "hourly_gpu_rows": rows}
        for kind in ("train", "evaluate"):
            if args.only and kind != args.only:
                continue
            cmd = [exe, kind, "--db", str(db), "--json"]
            if kind == "train":
                cmd += ["--min-failures", "1"]
            print(f"{kind} {name} ({rows:,} hourly GPU rows)", file=sys.stderr)
            rc, wall, gb, out = _run(cmd, env)
            doc: dict[str, Any] = {}
            if rc == 0:
                try:
                    doc = json.loads(out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    doc = {}
            entry[kind] = {"rc": rc, "wall_s": round(wall, 1), "peak_rss_gb": round(gb, 2),
                           "rss_kb_per_row": round(gb * 2**20 / max(rows, 1), 3),
                           **_summary(doc, kind)}
            print(f"  {entry[kind]}", file=sys.stderr)
        results.append(entry)
    growth: dict[str, Any] = {}
    if len(results) > 1:
        a, b = results[0], results[-1]
        for kind in ("train", "evaluate"):
            if kind in a and kind in b and b["hourly_gpu_rows"] > a["hourly_gpu_rows"]:
                doublings = math.log2(b["hourly_gpu_rows"] / a["hourly_gpu_rows"])
                growth[kind] = round(math.log2(b[kind]["peak_rss_gb"] / a[kind]["peak_rss_gb"])
                                     / doublings, 3)
    worst = max((e[k]["peak_rss_gb"] for e in results for k in ("train", "evaluate")
                 if k in e), default=None)
    report("train_memory", {
        "fleets": results, "budget_gb": BUDGET_GB,
        "worst_peak_rss_gb": worst,
        "ratio_to_budget": round(worst / BUDGET_GB, 3) if worst else None,
        "rss_growth_per_row_doubling": growth,
        "duckdb_memory": args.duckdb_memory, "code": "other checkout" if args.code else "this",
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
