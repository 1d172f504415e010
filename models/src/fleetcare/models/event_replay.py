"""Replaying ``serve``'s event rescoring over a stored history (evaluation only).

``fleetcare serve`` rescores a node within seconds of an urgent signal
(``pipeline.urgent``): a warning or fatal hardware XID, a new uncorrectable error, a
row-remap failure newly set, an NVLink going down, an InfiniBand/RoCE port leaving
ACTIVE. The training grid scores on the hour only, so an evaluation on it misses what the
service does between hours. Here every such signal of a stored history becomes one node
score ``DELAY`` after it, from the live features the service computes at that moment
(``features.latest_features(at)``: the full hours plus the partial one, nothing after
``at``), built for the signalling node only (``nodes=``: the rows the fleet's build
gives it, somewhat sooner). ``pipeline.urgent``'s telemetry rules are written
again in SQL over the stored samples (``tests/models/test_event_replay.py`` checks both
name the same (time, node) pairs).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence

import numpy as np

from fleetcare.collectors.xid import DEFAULT_CATALOG
from fleetcare.models import metrics as M
from fleetcare.models import thermal_ramp
from fleetcare.models.evaluation import NodeScores
from fleetcare.models.model import FailureModel
from fleetcare.pipeline import features
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.urgent import urgent_xid

DELAY = np.timedelta64(60, "s")
"""Between a signal and its score: ``serve`` rescores within seconds (at most every 5 s)
once the batch has landed; a minute is a conservative stand-in."""

_UE = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "remapped_rows_uncorrectable",
       "retired_pages_dbe")


def telemetry_triggers(store: Store) -> list[tuple[dt.datetime, str]]:
    """(ts, node) of every stored sample ``pipeline.urgent`` would call urgent, and every
    NIC port leaving ACTIVE: its rules in SQL over the stored samples."""
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


def urgent_xids(store: Store) -> list[tuple[dt.datetime, str]]:
    """(ts, node) of every stored XID the catalogue calls urgent."""
    rows = store.cursor().execute(
        "SELECT DISTINCT ts, node, xid FROM xid_events ORDER BY ts").fetchall()
    return [(t, n) for t, n, x in rows if urgent_xid(DEFAULT_CATALOG, int(x))]


def triggers(store: Store, since: np.datetime64, which: str = "all"
             ) -> list[tuple[np.datetime64, str]]:
    """The (time, node) pairs ``serve`` rescores on from ``since``, sorted, unique:
    urgent XIDs, and with ``which="all"`` the telemetry triggers too."""
    found = urgent_xids(store) + (telemetry_triggers(store) if which == "all" else [])
    return sorted({(np.datetime64(t, "us"), n) for t, n in found
                   if np.datetime64(t, "us") >= since})


def event_scores(store: Store, events: Sequence[tuple[np.datetime64, str]],
                 model: FailureModel, failures: Sequence[M.Failure], *, prefix: str = "",
                 horizon_h: float = 24.0, say: Callable[[str], None] | None = None,
                 every: int = 100) -> NodeScores:
    """One node score ``DELAY`` after each event (time, node): the node risk
    (1 − Π(1 − p) over its GPUs) from the live features at that moment. Node names get
    ``prefix`` in front (a pooled fleet's name and ``/``), as ``failures`` name them;
    ``label`` says whether the node fails within ``horizon_h`` after the score; ``say``
    hears the progress every ``every`` events."""
    H = np.timedelta64(int(round(horizon_h * 3600)), "s")
    fails: dict[str, list[np.datetime64]] = {}
    for f in failures:
        fails.setdefault(f.node, []).append(f.ts.astype("datetime64[us]"))
    ts_l: list[np.datetime64] = []
    node_l: list[str] = []
    risk_l: list[float] = []
    label_l: list[bool] = []
    t0 = time.perf_counter()
    for k, (at, node) in enumerate(events):
        if say is not None and k and k % every == 0:
            rate = (time.perf_counter() - t0) / k
            say(f"{prefix}events {k}/{len(events)}, {rate:.2f} s each, "
                f"~{rate * (len(events) - k) / 60:.0f} min left")
        when = (at + DELAY).astype(dt.datetime).replace(tzinfo=dt.UTC)
        mine = features.latest_features(store, when, nodes=[node])
        if mine.num_rows == 0:
            continue
        p = thermal_ramp.live(store, mine).risk(model.predict_proba(mine)[:, 1])
        name, t = f"{prefix}{node}", at + DELAY
        ts_l.append(t)
        node_l.append(name)
        risk_l.append(1.0 - float(np.prod(1.0 - np.clip(p, 0.0, 1.0))))
        label_l.append(any(t < f <= t + H for f in fails.get(name, [])))
    return NodeScores(np.array(ts_l, dtype="datetime64[us]"), np.array(node_l, dtype=object),
                      np.array(risk_l, dtype=float), np.array(label_l, dtype=bool),
                      np.ones(len(ts_l), dtype=bool))


def merged(hourly: NodeScores, events: NodeScores) -> NodeScores:
    """The hourly scores and the event scores as one set (alarm episodes read them in
    time order per node, whatever their order here)."""
    return NodeScores(*(np.concatenate([getattr(hourly, k), getattr(events, k)])
                        for k in ("ts", "node", "risk", "label", "known")))


