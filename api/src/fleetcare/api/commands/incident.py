"""``fleetcare incident``: record, import, list and derive failure incidents (the labels).

    fleetcare incident add NODE [--gpu UUID] --cause CAUSE --at TIME [--kind failure|repair|rma]
                               [--mode MODE] [--note TEXT] --db PATH
    fleetcare incident import (--slurm-events FILE|- | --csv FILE|-) --db PATH [--json]
    fleetcare incident list --db PATH [--node N] [--kind K] [--source S] [--limit N] [--json]
    fleetcare incident derive --db PATH [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fleetcare.collectors.contract import CAUSES
from fleetcare.pipeline.limits import OPERATOR_CAUSES


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "incident", help="record, import, list and derive failure incidents (labels)",
        description="Failure incidents are the ground truth the model learns from: derived "
                    "from fatal XIDs and lost GPUs, recorded by operators, imported from "
                    "Slurm's node events or a CSV file.")
    sub = p.add_subparsers(dest="incident_command", required=True, metavar="ACTION")

    a = sub.add_parser("add", help="record one incident by hand")
    a.add_argument("node", metavar="NODE")
    a.add_argument("--gpu", help="GPU UUID to blame (omit for the whole node)")
    a.add_argument("--cause", required=True,
                   help=f"one of: {', '.join([*CAUSES, *OPERATOR_CAUSES])} ('other': say what "
                        "in --note)")
    a.add_argument("--at", required=True, metavar="TIME",
                   help="ISO-8601 time (naive = UTC) or 'now'")
    a.add_argument("--kind", default="failure", choices=("failure", "repair", "rma"))
    a.add_argument("--mode", help="failure mechanism: hbm, thermal, nvlink, pcie, gsp, sram, none")
    a.add_argument("--note")
    a.add_argument("--db", required=True)
    a.add_argument("--json", action="store_true")

    i = sub.add_parser("import", help="import Slurm node events or a CSV of incidents")
    src = i.add_mutually_exclusive_group(required=True)
    src.add_argument("--slurm-events", metavar="FILE",
                     help="`sacctmgr show event` output (default or -p/-P), '-' for stdin; "
                          "run it with TZ=UTC")
    src.add_argument("--csv", metavar="FILE",
                     help="CSV with header ts,node,gpu_uuid,kind,cause,mode,note; '-' for stdin")
    i.add_argument("--db", required=True)
    i.add_argument("--json", action="store_true")

    ls = sub.add_parser("list", help="list incidents, newest first")
    ls.add_argument("--db", required=True)
    ls.add_argument("--node")
    ls.add_argument("--kind", choices=("failure", "repair", "rma"))
    ls.add_argument("--source", help="xid, slurm, csv, operator, sim, ...")
    ls.add_argument("--limit", type=int, default=None)
    ls.add_argument("--json", action="store_true")

    d = sub.add_parser("derive", help="derive failure incidents from fatal XIDs and lost GPUs")
    d.add_argument("--db", required=True)
    d.add_argument("--json", action="store_true")


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


def _store(db: str, create: bool) -> Any:
    """The store at ``db``; with ``create`` a new one when there is none (a fleet's
    history starts with its tickets or Slurm's events: nothing else needs to exist), said
    on stderr."""
    from fleetcare.api.commands.common import existing_db
    from fleetcare.pipeline.store import Store

    if create and not Path(db).exists():
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        store = Store(db)
        print(f"fleetcare incident: created database {db}", file=sys.stderr)
        return store
    return Store(existing_db(db, make=f"fleetcare incident import --csv FILE --db {db}"))


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.pipeline import incident_import, incidents

    action = args.incident_command
    if action == "import":
        try:
            if args.slurm_events:
                name = args.slurm_events
                found, skipped = incident_import.parse_slurm_events(
                    _read(name), source_name=name)
            else:
                name = args.csv
                found, skipped = incident_import.parse_csv(_read(name), source_name=name), 0
        except incident_import.ImportProblem as exc:
            print(f"fleetcare incident import: {exc}", file=sys.stderr)
            return 1
    elif action == "add":
        inc = incidents.validate(
            ts=incidents.parse_time(args.at), node=args.node, kind=args.kind,
            cause=args.cause, source="operator", gpu_uuid=args.gpu, mode=args.mode,
            note=args.note)
    store = _store(args.db, create=action in ("import", "add"))
    try:
        if action == "list":
            rows = incidents.list_incidents(store, node=args.node, kind=args.kind,
                                            source=args.source, limit=args.limit)
            if args.json:
                print(json.dumps(rows))
            else:
                for r in rows:
                    gpu = f" gpu={r['gpu_uuid']}" if r["gpu_uuid"] else ""
                    print(f"{r['ts']} {r['node']} {r['kind']} {r['cause']} "
                          f"source={r['source']}{gpu}" + (f"  {r['note']}" if r["note"] else ""))
            return 0
        if action == "derive":
            added = incidents.derive_from_xids(store)
            out: dict[str, Any] = {"added": added}
        elif action == "add":
            added = store.insert_incidents([inc])
            out = {"added": added, "incident": {
                **{k: getattr(inc, k) for k in ("node", "kind", "cause", "source",
                                                "gpu_uuid", "mode", "note")},
                "ts": inc.ts.isoformat().replace("+00:00", "Z")}}
        else:
            added = store.insert_incidents(found)
            out = {"read": len(found), "added": added, "duplicates": len(found) - added,
                   "skipped": skipped}
    finally:
        store.close()
    if args.json:
        print(json.dumps(out))
    else:
        print(" ".join(f"{k}={v}" for k, v in out.items() if k != "incident"))
    return 0
