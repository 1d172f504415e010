"""Hourly rollups of InfiniBand / RoCE port samples: flaps and error-counter increases.

``nic_hourly`` (this module owns it) holds one row per port (node, device, port) per clock
hour, computed from ``nic_telemetry`` by comparing each sample with the port's previous
one (ordered by ts):

- ``downs``: transitions out of ``ACTIVE`` (the previous non-null state ACTIVE, this one
  another non-null state: an unreadable ``state`` between them hides nothing);
- ``link_downed_inc``: the increase of the ``link_downed`` counter (below);
- ``flaps``: per step, the larger of the two: a flap seen both ways (the sample caught the
  port down *and* the counter rose) counts once, and one shorter than a tick (state
  ACTIVE on both sides) still counts through the counter;
- ``state_changes``: any change of ``state``;
- ``<counter>_inc`` for every legacy counter of ``contract.NIC_COUNTER_BITS``;
- ``saturated``: a counter of the port read its maximum in the hour (from then on it no
  longer counts: its increases are unknown, not zero);
- ``min_rate_gbps`` / ``max_rate_gbps`` (a link that trained down), ``last_state``.

Counter increases, per step: ``value - previous`` when it did not drop; the value itself
when it dropped (a reset: a driver reload, or ``perfquery -R``); 0 when the previous value
was the counter's maximum (saturated: a later value equal to it says nothing). A null (no
PMA, unreadable) is skipped: the next value is compared with the last non-null one. A
port's first sample counts 0.

``refresh(store)`` is incremental: it rebuilds the hours from the newest rolled-up hour
(the last, partial one) on, or from the hour of the oldest NIC sample inserted since the
last refresh when that is older (late data: the store lowers
``store.NIC_DIRTY_SINCE_KEY`` on every insert). Each step compares with the port's
previous sample found within ``LOOKBACK`` before the first rebuilt hour; a port silent for
longer starts again from 0. ``full=True`` rebuilds every hour that still has raw NIC
samples (hours before the oldest one are kept as they are). ``features.refresh`` calls
it beside the GPU rollup.

``prune(store, cutoff)`` (called by ``retention.apply`` with the GPU cut) deletes raw NIC
samples before ``cutoff`` that the rollup no longer needs: never past ``LOOKBACK`` before
the newest rolled-up hour, nor before the NIC dirty mark (late data waiting).
"""

from __future__ import annotations

import datetime as dt
import logging

from fleetcare.collectors.contract import NIC_COUNTER_BITS, nic_counter_max
from fleetcare.pipeline.store import NIC_DIRTY_SINCE_KEY, Store

log = logging.getLogger(__name__)

TABLE = "nic_hourly"
COUNTERS = tuple(NIC_COUNTER_BITS)
KEY = ("node", "device", "port")
LOOKBACK = dt.timedelta(days=1)
"""How far before the first rebuilt hour a port's previous sample is looked for."""


def _inc(name: str) -> str:
    top = nic_counter_max(name)
    prev = f"lag({name} IGNORE NULLS) OVER w"
    return (f"CASE WHEN {name} IS NULL OR {prev} IS NULL THEN 0 "
            f"WHEN {name} < {prev} THEN {name} "
            f"WHEN {prev} >= {top} THEN 0 "
            f"ELSE {name} - {prev} END AS {name}_step")


def rollup_sql(where: str = "true") -> str:
    """The SELECT of ``nic_hourly`` rows from the ``nic_telemetry`` rows matching ``where``."""
    steps = ",\n      ".join(_inc(c) for c in COUNTERS)
    sums = ",\n    ".join(f"sum({c}_step)::BIGINT AS {c}_inc" for c in COUNTERS)
    sat = " OR ".join(f"{c} >= {nic_counter_max(c)}" for c in COUNTERS)
    return f"""
WITH steps AS (
  SELECT node, device, port, ts, state, rate_gbps,
      date_trunc('hour', ts) AS hour,
      CASE WHEN lag(state IGNORE NULLS) OVER w = 'ACTIVE' AND state <> 'ACTIVE'
           THEN 1 ELSE 0 END AS down_step,
      CASE WHEN state <> lag(state IGNORE NULLS) OVER w THEN 1 ELSE 0 END AS change_step,
      coalesce(({sat}), false) AS sat_step,
      {steps}
  FROM nic_telemetry
  WHERE {where}
  WINDOW w AS (PARTITION BY node, device, port ORDER BY ts)
)
SELECT node, device, port, hour,
    count(*)::BIGINT AS samples,
    sum(down_step)::BIGINT AS downs,
    sum(greatest(down_step, link_downed_step))::BIGINT AS flaps,
    sum(change_step)::BIGINT AS state_changes,
    {sums},
    bool_or(sat_step) AS saturated,
    min(rate_gbps) AS min_rate_gbps,
    max(rate_gbps) AS max_rate_gbps,
    arg_max(state, ts) AS last_state
FROM steps
GROUP BY node, device, port, hour
"""


def _hour(ts: dt.datetime) -> dt.datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def refresh(store: Store, *, full: bool = False) -> int:
    """Bring ``nic_hourly`` up to date with ``nic_telemetry``; returns the rows rebuilt."""
    with store._lock, store.transaction() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} AS {rollup_sql('false')}").fetchall()
        last = cur.execute(f"SELECT max(hour) FROM {TABLE}").fetchall()[0][0]
        dirty = cur.execute("SELECT value FROM meta WHERE key = ?",
                            [NIC_DIRTY_SINCE_KEY]).fetchall()
        if last is None:
            lo = None
        elif full:
            oldest = cur.execute("SELECT min(ts) FROM nic_telemetry").fetchall()[0][0]
            lo = _hour(oldest) if oldest is not None else None
        else:
            lo = last
            if dirty:
                lo = min(lo, _hour(dt.datetime.fromisoformat(dirty[0][0])))
        if lo is None:
            cur.execute(f"DELETE FROM {TABLE}").fetchall()
            where, params = "true", []
        else:
            cur.execute(f"DELETE FROM {TABLE} WHERE hour >= ?", [lo]).fetchall()
            where, params = "ts >= ?", [lo - LOOKBACK]
        rows = cur.execute(
            f"INSERT INTO {TABLE} SELECT * FROM ({rollup_sql(where)}) WHERE hour >= ? "
            "ORDER BY hour, node, device, port",  # hour first: zone maps skip other hours
            [*params, lo or dt.datetime(1970, 1, 1)]).fetchall()[0][0]
        cur.execute("DELETE FROM meta WHERE key = ?", [NIC_DIRTY_SINCE_KEY]).fetchall()
    log.info("nic_rollup.refreshed from=%s rows=%d", lo, rows)
    return int(rows)


def prune(store: Store, cutoff: dt.datetime, *, dry_run: bool = False) -> int:
    """Delete ``nic_telemetry`` rows before ``cutoff`` (naive UTC) that are rolled up for
    good; returns the rows deleted (``dry_run``: that would be)."""
    with store._lock, store.transaction() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} AS {rollup_sql('false')}").fetchall()
        last = cur.execute(f"SELECT max(hour) FROM {TABLE}").fetchall()[0][0]
        if last is None:
            return 0
        cut = min(cutoff, last - LOOKBACK)
        dirty = cur.execute("SELECT value FROM meta WHERE key = ?",
                            [NIC_DIRTY_SINCE_KEY]).fetchall()
        if dirty:
            cut = min(cut, _hour(dt.datetime.fromisoformat(dirty[0][0])) - LOOKBACK)
        n = cur.execute("SELECT count(*) FROM nic_telemetry WHERE ts < ?",
                        [cut]).fetchall()[0][0]
        if n and not dry_run:
            cur.execute("DELETE FROM nic_telemetry WHERE ts < ?", [cut]).fetchall()
            log.info("nic_rollup.pruned cutoff=%s deleted=%d", cut, n)
    return int(n)


def hourly(store: Store, *, node: str | None = None) -> list[dict[str, object]]:
    """The rows of ``nic_hourly`` (of ``node``), oldest first."""
    cur = store.cursor()
    where, params = ("WHERE node = ?", [node]) if node else ("", [])
    res = cur.execute(f"SELECT * FROM {TABLE} {where} ORDER BY node, device, port, hour",
                      params)
    cols = [d[0] for d in res.description]
    return [dict(zip(cols, r, strict=True)) for r in res.fetchall()]
