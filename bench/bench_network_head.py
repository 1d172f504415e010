"""The network head alone (issue 16): how many cable and NIC failures a node-level model
of InfiniBand features catches, and at what false drains, beside the same model on the
four ``node_nic_*`` features the GPU model has.

    .venv/bin/python bench/bench_network_head.py [--db var/bench-network/net-512-30-22-20.duckdb]
                                                 [--horizon 72]

Reads a fleet simulated with InfiniBand ports (``bench/bench_network.py`` makes it:
``fleetcare simulate --nic-ports 8``). Rows and labels are the head's own
(``fleetcare.models.network_head.rows``: one row per node and scoring hour of
``fleetcare.pipeline.nic_features``, labelled by a cable/switch or NIC failure of the
node within ``--horizon``, default the warning window as ``train`` uses; the day after any
failure left out of fit and calibration). ``rich``: every ``nic_features`` column (the
head); ``basic``: the four ``node_nic_*`` sums built from the same rows (symbol errors,
recoveries and integrity errors added together, as the GPU catalogue has them). Each is a
head fitted as ``train`` fits one (``network_head.fit_matrix``: on the first 75 % of
the period, calibrated out of fold over it); on the last 25 % it is judged at calibrated
probabilities fixed beforehand (0.3, 0.5, 0.9) and, for reference only, at the best threshold on the
test period itself within 0.1 and 0.3 false drains per 1,000 node-days: network failures
with precursors caught (modes ``link`` / ``nic``: an alarm episode starting within 72 h
before the failure) and false drains (an episode with no failure of its node in the next
72 h; every failure mode counts as a true drain, as in ``fleetcare evaluate``). Prints one
JSON object. Simulated data.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

import numpy as np

from fleetcare.models import metrics as M
from fleetcare.models import network_head as NH
from fleetcare.pipeline import features, nic_features
from fleetcare.pipeline.store import Store

PRECURSOR_MODES = ("link", "nic")
WINDOW = np.timedelta64(72 * 3600, "s")
GRACE = np.timedelta64(3600, "s")
SHARES = (0.1, 0.3)
THRESHOLDS = (0.3, 0.5, 0.9)
BASIC = {  # the GPU catalogue's node_nic_* features, from the same rows
    "node_nic_flaps_24h": ("node_flaps_24h",),
    "node_nic_link_errors_24h": ("node_sym_24h", "node_rec_24h", "node_integ_24h"),
    "node_nic_rcv_errors_24h": ("node_rcv_24h", "node_rphys_24h", "node_ovr_24h"),
    "node_nic_rate_ratio_24h": ("rate_ratio_24h",),
}


def basic(X: np.ndarray) -> np.ndarray:
    col = {n: i for i, n in enumerate(nic_features.FEATURE_NAMES)}
    return np.column_stack([X[:, [col[c] for c in parts]].sum(axis=1)
                            for parts in BASIC.values()])


def failures(store: Store, since: np.datetime64) -> list[M.Failure]:
    rows = store.cursor().execute(
        "SELECT node, ts, coalesce(mode, 'none') FROM incidents "
        "WHERE kind = 'failure' ORDER BY ts").fetchall()
    return [M.Failure(n, np.datetime64(t, "us"), m) for n, t, m in rows
            if np.datetime64(t, "us") >= since]


def judge(r: NH.Rows, p: np.ndarray, mask: np.ndarray, fails: list[M.Failure], thr: float,
          node_days: float) -> dict[str, Any]:
    res = M.evaluate_alarms(r.ts[mask], r.node[mask], p[mask], fails, thr, WINDOW, grace=GRACE)
    caught: dict[str, list[int]] = {}
    for f, d in zip(res.failures, res.detected, strict=True):
        caught.setdefault(f.mode, [0, 0])
        caught[f.mode][0] += int(d)
        caught[f.mode][1] += 1
    net = [caught.get(m, [0, 0]) for m in PRECURSOR_MODES]
    n_net = sum(n for _, n in net)
    return {"threshold": thr, "false_drains": res.false_drains,
            "false_drains_per_1000_node_days": round(1000 * res.false_drains / node_days, 3),
            "network_precursor_caught": sum(d for d, _ in net),
            "network_precursor_failures": n_net,
            "network_recall": round(sum(d for d, _ in net) / n_net, 3) if n_net else None,
            "caught_by_mode": caught}


def evaluate(r: NH.Rows, X: np.ndarray, names: list[str], fails: list[M.Failure],
             test: np.datetime64, end: np.datetime64, horizon_h: float,
             seed: int) -> dict[str, Any]:
    H = np.timedelta64(int(horizon_h * 3600), "s")
    before = (r.ts < test) & ~r.after & (r.ts + H <= test)  # test labels stay unseen
    head = NH.fit_matrix(X[before], r.y[before], r.ts[before], names, horizon_h=horizon_h,
                         seed=seed)
    p = head.predict_proba(X)[:, 1]
    m = r.ts >= test
    node_days = len(np.unique(r.ts[m])) * len(np.unique(r.node)) / 24.0
    lab = m & (r.ts + H <= end)
    out: dict[str, Any] = {
        "features": len(names), "fit_rows": int(before.sum()),
        "fit_positives": int(r.y[before].sum()), "calibration": head.calibrator_["kind"],
        "test_node_days": round(node_days, 1),
        "test_pr_auc": M.average_precision(r.y[lab], p[lab]),
        "test_base_rate": round(float(r.y[lab].mean()), 5) if lab.any() else None,
        "at_probability": [judge(r, p, m, fails, thr, node_days) for thr in THRESHOLDS],
    }
    ref = []
    for share in SHARES:
        best = M.choose_threshold(r.ts[m], r.node[m], p[m], fails, WINDOW, node_days,
                                  false_drain_budget=share, grace=GRACE)
        if best is not None:
            ref.append({"budget_share": share}
                       | judge(r, p, m, fails, float(best.threshold), node_days))
    out["best_on_test_for_reference"] = ref
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="var/bench-network/net-512-30-22-20.duckdb")
    ap.add_argument("--horizon", type=float, default=M.WINDOW_H,
                    help="label horizon in hours (default: the warning window, as train)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    store = Store(args.db)
    features.refresh(store)  # the NIC rollup, when the simulation left it to us
    start, end = store.cursor().execute("SELECT min(hour), max(hour) FROM nic_hourly").fetchone()
    span = end - start
    test = start + span * 0.75
    r = NH.rows(store, start + dt.timedelta(hours=1), end + dt.timedelta(hours=1),
                horizon_h=args.horizon)
    fails = failures(store, np.datetime64(test, "us"))
    b = [np.datetime64(x, "us") for x in (test, end)]
    out: dict[str, Any] = {"simulated": True, "db": args.db, "horizon_h": args.horizon,
                           "period": [str(x) for x in (start, test, end)],
                           "test_failures_by_mode": {}}
    for f in fails:
        out["test_failures_by_mode"][f.mode] = out["test_failures_by_mode"].get(f.mode, 0) + 1
    for name, X, names in (("rich", r.X, list(nic_features.FEATURE_NAMES)),
                           ("basic", basic(r.X), list(BASIC))):
        out[name] = evaluate(r, X, names, fails, *b, args.horizon, args.seed)
        print(f"{name} done after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    store.close()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
