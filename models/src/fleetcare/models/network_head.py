"""A node-level model of network failures (InfiniBand cable/switch and NIC) beside the
GPU model (issue 16).

The GPU model learns from GPU rows, and a network failure names no GPU: no row is
labelled by it, so the model never learns the network precursors its ``node_nic_*``
features show. Labelling every GPU of the node instead caught every network failure but
cost the GPU modes (marginal links look like failing ones and took the false-drain
budget; README). The head is a ``FailureModel`` of its own on one row per node and
scoring time (``fleetcare.pipeline.nic_features``: counters apart, three windows, the
worst port), labelled by a failure whose cause is in ``NETWORK_CAUSES`` within the
warning window W (72 h, what a drain is judged over; callers pass it), fitted and
calibrated on the periods before the test period: its output is P(network failure of
the node within W). Link precursors start days before the link stays down: labelled over the
GPU model's 24 h horizon instead, the head's calibrated probabilities of failing links
sat below the drain threshold the GPU side sets (network recall 6 of 15 against 9 of 15
on ``bench/bench_network.py``'s fleet, the rest equal). A node's risk takes both
(``combine``): ``1 - (1 - r_gpu) * (1 - p_net)``, as a node's GPUs already combine. A
fleet's own model has one threshold and one false-drain budget for both, shared by what
each scores; the fleet prior's head, whose probabilities stay low at published rates, has
a threshold of its own (``alarm_risk``, ``prior.network_threshold``). The head is
calibrated out of fold over the fit and calibration periods together (``fit``).

A head is fitted only when the fit period holds at least ``MIN_FAILURES`` network
failures on nodes that report InfiniBand ports (``fit`` returns None otherwise, and
nothing changes). It travels inside the GPU model (``FailureModel.network_head_``, in
its bytes); ``python -m fleetcare.models.prior head`` fits one for the fleet prior on
simulated fleets with ports (``prior.fit_network_head``). The day after any failure of a
node neither fits nor calibrates the head (the node is down, then its counters start
again), as for the GPU model.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from fleetcare.models.model import FailureModel
from fleetcare.pipeline import nic_features
from fleetcare.pipeline.store import Store

NETWORK_CAUSES = ("network_switch_cable", "nic")
"""Table 5 causes the head predicts (cable/switch, NIC)."""
MODES = ("link", "nic")
"""The failure modes of those causes that have precursors (``collectors.sim``)."""
MIN_FAILURES = 3
"""Network failures the fit period needs for a head (fewer: no head)."""
AFTERMATH_H = 24.0
FOLDS = 4
"""Blocks of time the head's calibration is fitted out of fold over (``fit``)."""
PARAMS = {"n_estimators": 300, "num_leaves": 15, "learning_rate": 0.05,
          "min_child_samples": 10, "feature_fraction": 0.8, "bagging_fraction": 0.8,
          "lambda_l2": 1.0}
"""The head's booster (``bench/bench_network_head.py`` measured these)."""


@dataclass(frozen=True)
class Period:
    """One store's share of a fit: its scoring times before the test period
    (``start`` .. ``end``) and the prefix of its node names."""

    store: Store
    start: dt.datetime
    end: dt.datetime
    shard: str = ""
    weight: float = 1.0
    """What each of its rows with a network failure ahead weighs in the fit and the
    calibration: ``1 / k`` for a fleet simulated with every failure rate x k, so it
    teaches the head precursors that are rare at published rates without raising the
    base rate the head calibrates to."""


@dataclass
class Rows:
    ts: np.ndarray  # datetime64[us]
    node: np.ndarray  # object (shard-prefixed)
    X: np.ndarray  # float32 (rows, features)
    y: np.ndarray  # bool: a network failure of the node within the horizon
    after: np.ndarray  # bool: within AFTERMATH_H after any failure of the node
    nic: np.ndarray  # bool: the failure within the horizon is a NIC's (``y`` too)


def _np(t: dt.datetime) -> np.datetime64:
    if t.tzinfo is not None:
        t = t.astimezone(dt.UTC).replace(tzinfo=None)
    return np.datetime64(t, "us")


def _failures(store: Store) -> list[tuple[str, np.datetime64, str | None]]:
    from fleetcare.pipeline import labels

    f = labels.failures(store, dt.datetime(1970, 1, 1), dt.datetime(9999, 1, 1))
    ts = f.column("ts").to_numpy().astype("datetime64[us]")
    return list(zip(f.column("node").to_pylist(), ts, f.column("cause").to_pylist(),
                    strict=True))


def features_of(table: pa.Table) -> np.ndarray:
    """The head's matrix of ``nic_features`` rows."""
    if table.num_rows == 0:
        return np.zeros((0, len(nic_features.FEATURE_NAMES)), dtype=np.float32)
    return np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float32)
                            for c in nic_features.FEATURE_NAMES])


def rows(store: Store, lo: dt.datetime, hi: dt.datetime, *, horizon_h: float,
         shard: str = "") -> Rows:
    """The head's rows for scoring times ``lo .. hi`` (hourly), with labels."""
    t = nic_features.grid(store, lo, hi)
    ts = t.column("ts").to_numpy().astype("datetime64[us]")
    node = np.asarray([shard + n for n in t.column("node").to_pylist()], dtype=object)
    y = np.zeros(len(ts), dtype=bool)
    after = np.zeros(len(ts), dtype=bool)
    nic = np.zeros(len(ts), dtype=bool)
    H = np.timedelta64(int(round(horizon_h * 3600)), "s")
    A = np.timedelta64(int(round(AFTERMATH_H * 3600)), "s")
    by_node: dict[str, np.ndarray] = {}
    order = np.argsort(node, kind="stable")
    names, starts = np.unique(node[order], return_index=True)
    for i, name in enumerate(names):
        end = starts[i + 1] if i + 1 < len(starts) else len(order)
        by_node[str(name)] = order[starts[i]:end]
    for n, at, cause in _failures(store):
        idx = by_node.get(shard + n)
        if idx is None:
            continue
        ahead = idx[(ts[idx] < at) & (ts[idx] >= at - H)]
        if cause in NETWORK_CAUSES:
            y[ahead] = True
        if cause == "nic":
            nic[ahead] = True
        after[idx[(ts[idx] > at) & (ts[idx] <= at + A)]] = True
    return Rows(ts, node, features_of(t), y, after, nic)


def _cat(parts: Sequence[Rows]) -> Rows:
    return Rows(*(np.concatenate([getattr(p, k) for p in parts]) if parts else
                  np.zeros(0) for k in ("ts", "node", "X", "y", "after", "nic")))


def network_failures(rows_: Rows) -> int:
    """Distinct network failures the rows look ahead to (runs of labelled rows per node)."""
    if not rows_.y.any():
        return 0
    idx = np.flatnonzero(rows_.y)
    order = np.lexsort((rows_.ts[idx], rows_.node[idx]))
    ts, node = rows_.ts[idx][order], rows_.node[idx][order]
    gap = np.ones(len(ts), dtype=bool)
    gap[1:] = (node[1:] != node[:-1]) | (ts[1:] - ts[:-1] > np.timedelta64(1, "h"))
    return int(gap.sum())


def fit(periods: Sequence[Period], *, horizon_h: float, seed: int, negatives: float = 1.0,
        nic_weight: float = 1.0) -> FailureModel | None:
    """The head fitted on the periods' fit and calibration rows, calibrated out of fold;
    None when they hold fewer than ``MIN_FAILURES`` network failures (or no NIC rows).

    A fleet's calibration period holds a handful of network failures: an isotonic map
    fitted on them alone put its top step at P = 1 over a wide range of margins (13
    false drains in one test period of ``bench/bench_network.py``'s seed 23 fleet, every
    one at P ~ 1). So the booster is fitted on both periods' rows and its calibrator on
    the out-of-fold margins of ``FOLDS`` boosters, each fitted without one block of time
    (every row calibrates once, by a booster that did not see it). ``negatives`` < 1 keeps
    that share of the rows that no network failure follows (drawn with ``seed``), each
    weighing ``1 / negatives`` in the fit and the calibration, so probabilities keep the
    base rate (what the fleet prior's many node-days need); a period's rows with a
    failure ahead weigh its ``weight``. ``nic_weight``: the rows with a NIC failure ahead
    weigh that many times more in the boosters (not in the calibration, so probabilities
    keep the base rate): NIC failures are a few of a fleet prior's network failures, and
    at weight 1 its head caught none (``prior.NIC_WEIGHT``)."""
    if not 0 < negatives <= 1:
        raise ValueError(f"negatives={negatives} must be in (0, 1]: the share of rows "
                         "without a network failure ahead that the head fits on")
    parts, positive = [], []
    H = np.timedelta64(int(round(horizon_h * 3600)), "s")
    for p in periods:
        if not p.weight > 0:
            raise ValueError(f"period {p.shard or p.store}: weight {p.weight} must be > 0")
        r = rows(p.store, p.start, p.end, horizon_h=horizon_h, shard=p.shard)
        known = r.ts + H <= _np(p.end)  # labels from the test period stay unseen
        parts.append(_subset(r, ~r.after & known))
        positive.append(np.full(len(parts[-1].y), p.weight))
    every = _cat(parts)
    if len(every.y) == 0 or network_failures(every) < MIN_FAILURES or every.y.all():
        return None
    pw = np.concatenate(positive)
    negative = 1.0
    if negatives < 1:
        keep = every.y | (np.random.default_rng(seed).random(len(every.y)) < negatives)
        every, pw, negative = _subset(every, keep), pw[keep], 1.0 / negatives
    weight = (np.where(every.y, pw, negative)
              if negatives < 1 or (pw[every.y] != 1.0).any() else None)
    fit_weight = weight
    if nic_weight != 1.0 and every.nic.any():
        fit_weight = (np.ones(len(every.y)) if weight is None else weight) * np.where(
            every.nic, nic_weight, 1.0)
    return fit_matrix(every.X, every.y, every.ts, list(nic_features.FEATURE_NAMES),
                      horizon_h=horizon_h, seed=seed, weight=weight, fit_weight=fit_weight)


def fit_matrix(X: np.ndarray, y: np.ndarray, ts: np.ndarray, names: list[str], *,
               horizon_h: float, seed: int, weight: np.ndarray | None = None,
               fit_weight: np.ndarray | None = None) -> FailureModel:
    """A head booster fitted on every row, calibrated on the out-of-fold margins of
    ``FOLDS`` boosters each fitted without one block of time (``ts``) and without the rows
    within ``horizon_h`` of it on either side: their labels look ahead to the same
    failures as the block's rows (a purge; without it the calibrator learnt from margins
    that had seen the answer at every block's edges). A plain prior shift when a fold
    leaves no positive (or no negative) to fit on. ``weight``: row weights for both
    (None: 1); ``fit_weight``: the boosters' own, when they differ."""
    fw = weight if fit_weight is None else fit_weight

    def booster(mask: np.ndarray) -> FailureModel:
        m = FailureModel(horizon_h=horizon_h, seed=seed, **PARAMS)  # type: ignore[arg-type]
        return m.fit(X[mask], y[mask], feature_names=names,
                     sample_weight=None if fw is None else fw[mask])

    t = ts.astype("datetime64[us]").astype(np.int64)
    edges = np.quantile(t, np.linspace(0.0, 1.0, FOLDS + 1))
    fold = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, FOLDS - 1)
    purge = int(round(horizon_h * 3600e6))
    oof = np.zeros(len(y))
    every = np.ones(len(y), dtype=bool)
    for k in range(FOLDS):
        block = fold == k
        if not block.any():
            continue
        lo, hi = t[block].min(), t[block].max()
        out = ~block & ((t <= lo - purge) | (t >= hi + purge))
        if not y[out].any() or y[out].all():
            return booster(every)
        oof[block] = booster(out).decision_function(X[block])
    return booster(every).calibrate_margins(oof, y, weight=weight)


def _subset(r: Rows, mask: np.ndarray) -> Rows:
    return Rows(r.ts[mask], r.node[mask], r.X[mask], r.y[mask], r.after[mask], r.nic[mask])


def predict_grid(head: FailureModel, store: Store, lo: dt.datetime, hi: dt.datetime,
                 *, shard: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, node, p) of every node with NIC rows at the hourly scoring times lo .. hi."""
    t = nic_features.grid(store, lo, hi)
    ts = t.column("ts").to_numpy().astype("datetime64[us]")
    node = np.asarray([shard + n for n in t.column("node").to_pylist()], dtype=object)
    p = head.predict_proba(features_of(t))[:, 1] if t.num_rows else np.zeros(0)
    return ts, node, p


def predict_latest(head: FailureModel, store: Store, at: dt.datetime, *,
                   nodes: Sequence[str] | None = None) -> tuple[pa.Table, np.ndarray]:
    """The nodes' ``nic_features`` rows at ``at`` and the head's probability of each."""
    t = nic_features.latest(store, at, nodes=None if nodes is None else list(nodes))
    p = head.predict_proba(features_of(t))[:, 1] if t.num_rows else np.zeros(0)
    return t, p


def recall(detected_by_mode: dict[str, list[int]]) -> tuple[float | None, dict[str, list[int]]]:
    """Network failures caught over those with precursors, from a report's
    ``detected_by_mode`` ({mode: [caught, of]}; None when it has none), and the
    ``MODES`` entries it was counted from."""
    net = {k: v for k, v in detected_by_mode.items() if k in MODES}
    n = sum(of for _, of in net.values())
    return (sum(c for c, _ in net.values()) / n if n else None), net


def combine(r_gpu: np.ndarray, p_net: np.ndarray) -> np.ndarray:
    """A node's risk from its GPUs' and its network's: ``1 - (1 - r)(1 - p)``."""
    r = np.clip(np.asarray(r_gpu, dtype=np.float64), 0.0, 1.0)
    p = np.clip(np.asarray(p_net, dtype=np.float64), 0.0, 1.0)
    return 1.0 - (1.0 - r) * (1.0 - p)


def probability_at(ts: np.ndarray, node: np.ndarray, head_ts: np.ndarray,
                   head_node: np.ndarray, head_p: np.ndarray) -> np.ndarray:
    """The head's probability at each (ts, node) from its rows (0 where it has none)."""
    if len(head_p) == 0 or len(ts) == 0:
        return np.zeros(len(ts))
    look = {(str(n), t): p for t, n, p in zip(head_ts.tolist(), head_node.tolist(),
                                              head_p.tolist(), strict=True)}
    return np.array([look.get((str(n), t), 0.0)
                     for t, n in zip(np.asarray(ts).astype("datetime64[us]").tolist(),
                                     np.asarray(node).tolist(), strict=True)], dtype=np.float64)


Lookup = Callable[[np.ndarray, np.ndarray], np.ndarray]


def lookup(head: FailureModel,
           spans: Sequence[tuple[Store, dt.datetime, dt.datetime, str]]) -> Lookup:
    """(ts, node) -> the head's probability at the hourly scoring times of each (store,
    lo, hi, shard) span (``predict_grid``; 0 where the node has no NIC row)."""
    parts = [predict_grid(head, st, lo, hi, shard=shard) for st, lo, hi, shard in spans]
    hts, hnode, hp = (np.concatenate([x[i] for x in parts]) for i in range(3))

    def at(ts: np.ndarray, node: np.ndarray) -> np.ndarray:
        return probability_at(ts, node, hts, hnode, hp)
    return at


Adjust = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def adjuster(head: FailureModel,
             spans: Sequence[tuple[Store, dt.datetime, dt.datetime, str]]) -> Adjust:
    """(ts, node, node risk) -> node risk combined with the head's probabilities at the
    hourly scoring times of each (store, lo, hi, shard) span (``lookup``)."""
    p_at = lookup(head, spans)

    def adjust(ts: np.ndarray, node: np.ndarray, risk: np.ndarray) -> np.ndarray:
        return combine(risk, p_at(ts, node)) if len(risk) else np.asarray(risk, float)
    return adjust


def alarm_risk(risk: np.ndarray, p_net: np.ndarray, threshold: float,
               head_threshold: float | None) -> np.ndarray:
    """Node risks whose crossings of ``threshold`` are the alarms of an operating point
    per head: a node alarms when its risk (GPUs and network combined) reaches
    ``threshold`` or its network probability alone reaches ``head_threshold`` (None:
    the one threshold for both). The fleet prior's head needs one: at published rates
    its calibrated probability stays far below the GPU side's threshold (``prior``)."""
    r = np.asarray(risk, dtype=np.float64)
    if head_threshold is None or len(r) == 0:
        return r
    return np.where(np.asarray(p_net, dtype=np.float64) >= head_threshold,
                    np.maximum(r, threshold), r)


DESCRIBE = {
    "sym": "symbol errors", "rec": "link error recoveries", "integ": "link integrity errors",
    "rcv": "receive errors", "rphys": "remote physical receive errors",
    "ovr": "receive buffer overruns", "flaps": "link flaps",
}


def reasons(row: dict[str, float], p: float) -> list[str]:
    """Plain words for a node the head scores: what its InfiniBand ports counted."""
    out = []
    for k, what in DESCRIBE.items():
        n6, n24 = row.get(f"node_{k}_6h") or 0.0, row.get(f"node_{k}_24h") or 0.0
        if n24 > 0:
            ports = int(row.get(f"ports_{k}_24h") or 0)
            out.append(f"InfiniBand: {n24:,.0f} {what} in 24 h ({n6:,.0f} in the last 6 h) "
                       f"on {ports} port{'s' if ports != 1 else ''}")
    ratio = row.get("rate_ratio_24h")
    if ratio is not None and ratio < 1.0:
        out.append(f"InfiniBand: a link trained down to {ratio:.0%} of its rate")
    if not out:
        out.append("InfiniBand: port counters unlike a healthy link's")
    return [f"network risk {p:.0%}: " + out[0], *out[1:3]]
