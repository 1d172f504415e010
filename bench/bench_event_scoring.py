"""Scoring on events, not only on the hour (issue 16 §4), on the fleet pool (simulated).

    .venv/bin/python bench/bench_event_scoring.py --workdir var/pool [--only real|x4]

``bench_fleet_pool.py`` scores each fleet on the hour, as the training grid does: a scoring
time sees the full hours before it, so a GSP warning (XID 119) at 10:35 is seen at 11:00
at the earliest, and 1–3 h precursors lose much of their lead. ``fleetcare serve`` now
rescores a node within seconds of an urgent XID (``pipeline.urgent``). Here every urgent
XID of the fleet's history adds one score of its node 60 s after it, from the live
features the service computes at that moment (``features.latest_features(at)``: the full
hours plus the partial one, nothing after ``at``), scored by the shipped prior at its
shipped threshold. Printed: recall per mode, precursor recall, lead times and false
drains before (hourly only) and after (hourly + events). Every trigger ``serve`` has is
replayed (``--triggers all``, the default): urgent XIDs, and from the raw telemetry a
new uncorrectable error (ECC, remapped rows, DBE-retired pages above the GPU's previous
sample), a row-remap failure newly set, an NVLink up in the previous sample and down
now, an InfiniBand/RoCE port leaving ACTIVE — ``pipeline.urgent``'s rules, in SQL over
the stored samples. ``--triggers xid`` replays XIDs only. Prints one JSON object.
Simulated data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import bench_fleet_pool as BP

from fleetcare.models import prior
from fleetcare.models.model import FailureModel


def summary(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m.get(k) for k in ("precursor_recall_at_budget", "recall_at_budget",
                                  "false_drains_per_1000_node_days", "median_lead_time_h",
                                  "detected_by_mode")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="bench_fleet_pool's fleets (reused)")
    ap.add_argument("--only", choices=("real", "x4"), default="real")
    ap.add_argument("--triggers", choices=("all", "xid"), default="all",
                    help="what rescores a node: every trigger serve has (default) or urgent "
                         "XIDs only")
    args = ap.parse_args()
    started = time.perf_counter()
    blob, meta = prior.load()
    model = FailureModel.from_bytes(blob)
    threshold = float(meta["threshold"])
    before, after, n_events = [], [], 0
    for fleet in BP.GROUPS[args.only]:
        rows = prior.fleet_rows(args.workdir, fleet, say=BP.say)
        fs = prior.score_fleet(rows, model)
        with prior.open_fleet(args.workdir, fleet, say=BP.say) as store:
            both = prior.with_event_scores(
                store, fs, model, which=args.triggers, say=BP.say,
                cache=prior.event_scores_path(args.workdir, fleet, model, which=args.triggers))
        n_events += len(both.scores.ts) - len(fs.scores.ts)
        before.append(fs)
        after.append(both)
        del rows
    hourly = prior.metrics_of(prior.pooled(before), threshold=threshold)
    events = prior.metrics_of(prior.pooled(after), threshold=threshold)
    out = {"bench": "event_scoring", "data": "simulated", "group": args.only,
           "triggers": args.triggers,
           "prior": prior.prior_id(blob), "threshold": threshold, "event_scores": n_events,
           "hourly": summary(hourly), "hourly_and_events": summary(events),
           "wall_s": round(time.perf_counter() - started)}
    print(json.dumps(out, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
