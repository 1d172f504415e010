"""Research bench (issue 16): can a node-level network head, with its own share of the
false-drain budget, catch cable and NIC failures that the GPU model cannot learn?

    .venv/bin/python bench/bench_network_head.py [--db var/bench-network/net-512-30-22-20.duckdb]

Reads a fleet simulated with InfiniBand ports (``bench/bench_network.py`` makes it:
``fleetcare simulate --nic-ports 8``). One row per node and scoring hour with the node
InfiniBand features of ``fleetcare.pipeline.nic_features`` (``rich``: counters apart, 6 /
24 / 72 h, worst port, ports counting), and ``basic``: the same head on the four
``node_nic_*`` features the GPU model has (24 h node sums, symbol errors and recoveries
summed together), built from the same rows.

Label: a network failure (cause ``network_switch_cable`` or ``nic``) of the node within
24 h; the day after any failure of the node is left out of fit and calibration. LightGBM
is fit on the first 60 % of the period and calibrated (isotonic) on the next 15 %; on the
last 25 % it is judged at calibrated probabilities fixed beforehand (0.3, 0.5, and 0.9,
about where the shipped prior drains) and, for reference only, at the best threshold on
the test period itself within 0.1 and 0.3 false drains per 1,000 node-days. Judged:
network failures with precursors caught (modes ``link`` / ``nic``: an alarm episode
starting within 72 h before the failure) and false drains (an episode with no failure of
its node in the next 72 h; every failure mode counts as a true drain, as in ``fleetcare
evaluate``). Prints one JSON object. Simulated data.
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
from fleetcare.pipeline import features, nic_features
from fleetcare.pipeline.store import Store

NETWORK_CAUSES = ("network_switch_cable", "nic")
PRECURSOR_MODES = ("link", "nic")
HORIZON_H = 24
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


def load(store: Store, start: dt.datetime, end: dt.datetime
         ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(ts, node, {feature: column}) of every node and hour (``nic_features.grid``)."""
    t = nic_features.grid(store, start, end)
    cols = {c: t.column(c).to_numpy(zero_copy_only=False).astype(np.float32)
            for c in nic_features.FEATURE_NAMES}
    ts = t.column("ts").to_numpy().astype("datetime64[us]")
    return ts, np.asarray(t.column("node").to_pylist(), dtype=object), cols


def matrices(cols: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, list[str]]]:
    """The two heads' inputs: every ``nic_features`` column (rich), the four (basic)."""
    rich = list(nic_features.FEATURE_NAMES)
    basic = {k: np.sum([cols[c] for c in parts], axis=0) for k, parts in BASIC.items()}
    return {"rich": (np.column_stack([cols[c] for c in rich]), rich),
            "basic": (np.column_stack(list(basic.values())), list(basic))}


def failures(store: Store) -> list[tuple[str, np.datetime64, str, str]]:
    rows = store.cursor().execute(
        "SELECT node, ts, coalesce(mode, 'none'), cause FROM incidents "
        "WHERE kind = 'failure' ORDER BY ts").fetchall()
    return [(n, np.datetime64(t, "us"), m, c) for n, t, m, c in rows]


def labels(ts: np.ndarray, node: np.ndarray, fails: list[tuple[str, np.datetime64, str, str]]
           ) -> tuple[np.ndarray, np.ndarray]:
    """(label: a network failure of the node in (ts, ts + 24 h], aftermath: the row is
    within 24 h after any failure of its node)."""
    y = np.zeros(len(ts), dtype=bool)
    after = np.zeros(len(ts), dtype=bool)
    h = np.timedelta64(HORIZON_H * 3600, "s")
    by_node: dict[str, np.ndarray] = {}
    for name in np.unique(node):
        by_node[str(name)] = np.flatnonzero(node == name)
    for n, t, _, cause in fails:
        rows = by_node.get(n)
        if rows is None:
            continue
        if cause in NETWORK_CAUSES:
            y[rows[(ts[rows] < t) & (ts[rows] >= t - h)]] = True
        after[rows[(ts[rows] > t) & (ts[rows] <= t + h)]] = True
    return y, after


def head(X: np.ndarray, y: np.ndarray, fit: np.ndarray, seed: int) -> Any:
    import lightgbm as lgb

    clf = lgb.LGBMClassifier(n_estimators=300, learning_rate=0.05, num_leaves=15,
                             min_child_samples=10, subsample=0.8, subsample_freq=1,
                             colsample_bytree=0.8, reg_lambda=1.0,
                             random_state=seed,
                             verbose=-1)
    clf.fit(X[fit], y[fit])
    return clf


def judge(ts: np.ndarray, node: np.ndarray, p: np.ndarray, mask: np.ndarray,
          fails: list[M.Failure], thr: float, node_days: float) -> dict[str, Any]:
    res = M.evaluate_alarms(ts[mask], node[mask], p[mask], fails, thr, WINDOW, grace=GRACE)
    net = [d for f, d in zip(res.failures, res.detected, strict=True)
           if f.mode in PRECURSOR_MODES]
    by_mode: dict[str, list[int]] = {}
    for f, d in zip(res.failures, res.detected, strict=True):
        by_mode.setdefault(f.mode, [0, 0])
        by_mode[f.mode][0] += int(d)
        by_mode[f.mode][1] += 1
    return {"threshold": thr, "false_drains": res.false_drains,
            "false_drains_per_1000_node_days": round(1000 * res.false_drains / node_days, 3),
            "network_precursor_caught": int(sum(net)), "network_precursor_failures": len(net),
            "network_recall": round(sum(net) / len(net), 3) if net else None,
            "caught_by_mode": by_mode}


def evaluate(ts: np.ndarray, node: np.ndarray, X: np.ndarray, fails_all: list[Any],
             start: np.datetime64, cal: np.datetime64, test: np.datetime64, end: np.datetime64,
             seed: int) -> dict[str, Any]:
    from sklearn.isotonic import IsotonicRegression

    y, after = labels(ts, node, fails_all)
    known = ts <= end - np.timedelta64(HORIZON_H * 3600, "s")
    fit = (ts < cal) & ~after & known
    in_cal = (ts >= cal) & (ts < test) & ~after & known
    clf = head(X, y, fit, seed)
    raw = clf.predict_proba(X)[:, 1]
    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
    p = iso.fit(raw[in_cal], y[in_cal]).predict(raw)
    m = ts >= test
    fl = [M.Failure(n, t, mo) for n, t, mo, _ in fails_all if t >= test]
    node_days = len(np.unique(ts[m])) * len(np.unique(node)) / 24.0
    modes: dict[str, int] = {}
    for f in fl:
        modes[f.mode] = modes.get(f.mode, 0) + 1
    lab = m & known
    out: dict[str, Any] = {
        "fit_rows": int(fit.sum()), "fit_positives": int(y[fit].sum()),
        "cal_positives": int(y[in_cal].sum()), "test_node_days": round(node_days, 1),
        "test_failures_by_mode": modes,
        "test_pr_auc": M.average_precision(y[lab], p[lab]),
        "test_base_rate": round(float(y[lab].mean()), 5) if lab.any() else None,
        "at_probability": [judge(ts, node, p, m, fl, thr, node_days) for thr in THRESHOLDS],
    }
    ref = []
    for share in SHARES:
        best = M.choose_threshold(ts[m], node[m], p[m], fl, WINDOW, node_days,
                                  false_drain_budget=share, grace=GRACE)
        if best is not None:
            ref.append({"budget_share": share} | judge(ts, node, p, m, fl,
                                                          float(best.threshold), node_days))
    out["best_on_test_for_reference"] = ref
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="var/bench-network/net-512-30-22-20.duckdb")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    store = Store(args.db)
    features.refresh(store)  # the NIC rollup, when the simulation left it to us
    start, end = store.cursor().execute("SELECT min(hour), max(hour) FROM nic_hourly").fetchone()
    span = end - start
    cal = start + span * 0.60
    test = start + span * 0.75
    fails = failures(store)
    b = [np.datetime64(x, "us") for x in (start, cal, test, end)]
    out: dict[str, Any] = {"simulated": True, "db": args.db,
                           "period": [str(x) for x in (start, cal, test, end)]}
    ts, node, cols = load(store, start + dt.timedelta(hours=1), end + dt.timedelta(hours=1))
    for name, (X, names) in matrices(cols).items():
        out[name] = {"features": len(names), **evaluate(ts, node, X, fails, *b, args.seed)}
        print(f"{name} done after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    store.close()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
