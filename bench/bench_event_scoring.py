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
import datetime as dt
import json
import sys
import time
from typing import Any

import bench_fleet_pool as BP
import numpy as np

from fleetcare.collectors.xid import DEFAULT_CATALOG
from fleetcare.models import prior
from fleetcare.models.evaluation import NodeScores
from fleetcare.models.model import FailureModel
from fleetcare.pipeline import features
from fleetcare.pipeline.urgent import urgent_xid

DELAY = np.timedelta64(60, "s")


_UE = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "remapped_rows_uncorrectable",
       "retired_pages_dbe")


def telemetry_triggers(store: Any) -> list[tuple[dt.datetime, str]]:
    """(ts, node) of every sample ``pipeline.urgent`` would call urgent, and every NIC
    port leaving ACTIVE: its rules in SQL over the stored samples."""
    lags = ", ".join(f"coalesce({c}, 0) AS {c}, lag(coalesce({c}, 0)) OVER w AS p_{c}"
                     for c in _UE)
    grew = " OR ".join(f"{c} > p_{c}" for c in _UE)
    rows = store.cursor().execute(f"""
        WITH s AS (
          SELECT ts, node, {lags},
            coalesce(remapped_rows_failure, false) AS rf,
            lag(coalesce(remapped_rows_failure, false)) OVER w AS p_rf,
            nvlink_down_mask AS dm, lag(nvlink_down_mask IGNORE NULLS) OVER w AS p_dm,
            up_links, lag(up_links IGNORE NULLS) OVER w AS p_links
          FROM (SELECT *, CASE WHEN nvlink_present & 1 = 1 THEN nvlink_links END AS up_links
                FROM telemetry)
          WINDOW w AS (PARTITION BY gpu_uuid ORDER BY ts))
        SELECT DISTINCT ts, node FROM s
        WHERE ({grew}) OR (rf AND p_rf = false)
           OR (p_links = up_links AND bit_count(dm & ~p_dm) > 0)  -- a link up went down
        UNION
        SELECT ts, node FROM (
          SELECT ts, node, state,
            lag(state) OVER (PARTITION BY node, device, port ORDER BY ts) AS p_state
          FROM nic_telemetry)
        WHERE p_state = 'ACTIVE' AND state IS NOT NULL AND state <> 'ACTIVE'
        """).fetchall()
    return [(t, n) for t, n in rows]


def event_scores(workdir: str, fleet: Any, fs: Any, model: FailureModel,
                 triggers: str = "all") -> NodeScores:
    """One node score 60 s after each urgent XID (and, with ``triggers="all"``, each
    telemetry trigger) of the fleet's scored period."""
    t0 = fs.scores.ts.min()
    ts_l, node_l, risk_l, label_l = [], [], [], []
    fails: dict[str, list[np.datetime64]] = {}
    for f in fs.failures:
        fails.setdefault(f.node, []).append(f.ts.astype("datetime64[us]"))
    with prior.open_fleet(workdir, fleet, say=BP.say) as store:
        rows = store.cursor().execute(
            "SELECT DISTINCT ts, node, xid FROM xid_events ORDER BY ts").fetchall()
        events = [(np.datetime64(t, "us"), n) for t, n, x in rows
                  if urgent_xid(DEFAULT_CATALOG, int(x)) and np.datetime64(t, "us") >= t0]
        n_xid = len(events)
        if triggers == "all":
            events += [(np.datetime64(t, "us"), n) for t, n in telemetry_triggers(store)
                       if np.datetime64(t, "us") >= t0]
        BP.say(f"{fleet.name}: {n_xid} urgent XIDs, {len(events) - n_xid} telemetry "
               "triggers to score")
        for at, node in sorted(set(events)):
            when = (at + DELAY).astype(dt.datetime).replace(tzinfo=dt.UTC)
            feats = features.latest_features(store, when)
            mine = feats.filter(np.asarray(feats.column("node").to_pylist()) == node)
            if mine.num_rows == 0:
                continue
            p = model.predict_proba(mine)[:, 1]
            name = f"{fleet.name}/{node}"
            t = at + DELAY
            ts_l.append(t)
            node_l.append(name)
            risk_l.append(1.0 - float(np.prod(1.0 - np.clip(p, 0.0, 1.0))))
            label_l.append(any(t < f <= t + np.timedelta64(24, "h") for f in fails.get(name, [])))
    return NodeScores(np.array(ts_l, dtype="datetime64[us]"), np.array(node_l, dtype=object),
                      np.array(risk_l), np.array(label_l, dtype=bool),
                      np.ones(len(ts_l), dtype=bool))


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
        extra = event_scores(args.workdir, fleet, fs, model, args.triggers)
        n_events += len(extra.ts)
        merged = NodeScores(*(np.concatenate([getattr(fs.scores, k), getattr(extra, k)])
                              for k in ("ts", "node", "risk", "label", "known")))
        before.append(fs)
        after.append(prior.FleetScores(fs.name, merged, fs.failures, fs.node_days, fs.gpu_y,
                                       fs.gpu_p))
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
