"""Hourly rollups of InfiniBand / RoCE port samples: flaps and error-counter increases.

``nic_hourly`` (this module owns it) holds one row per port (node, device, port) per clock
hour, computed from ``nic_telemetry`` by comparing each sample with the port's previous
one (ordered by ts):

- ``downs``: transitions out of ``ACTIVE`` (previous state ACTIVE, this one another
  non-null state);
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

``refresh(store)`` rebuilds the table from ``nic_telemetry`` (NIC samples are one row per
port per tick, a small fraction of GPU telemetry); it is not incremental yet.
"""

from __future__ import annotations

import logging

from fleetcare.collectors.contract import NIC_COUNTER_BITS, nic_counter_max
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

TABLE = "nic_hourly"
COUNTERS = tuple(NIC_COUNTER_BITS)
KEY = ("node", "device", "port")


def _inc(name: str) -> str:
    top = nic_counter_max(name)
    prev = f"lag({name} IGNORE NULLS) OVER w"
    return (f"CASE WHEN {name} IS NULL OR {prev} IS NULL THEN 0 "
            f"WHEN {name} < {prev} THEN {name} "
            f"WHEN {prev} >= {top} THEN 0 "
            f"ELSE {name} - {prev} END AS {name}_step")


def rollup_sql() -> str:
    """The SELECT that computes every ``nic_hourly`` row from ``nic_telemetry``."""
    steps = ",\n      ".join(_inc(c) for c in COUNTERS)
    sums = ",\n    ".join(f"sum({c}_step)::BIGINT AS {c}_inc" for c in COUNTERS)
    sat = " OR ".join(f"{c} >= {nic_counter_max(c)}" for c in COUNTERS)
    return f"""
WITH steps AS (
  SELECT node, device, port, ts, state, rate_gbps,
      date_trunc('hour', ts) AS hour,
      CASE WHEN lag(state) OVER w = 'ACTIVE' AND state IS NOT NULL AND state <> 'ACTIVE'
           THEN 1 ELSE 0 END AS down_step,
      CASE WHEN lag(state) OVER w IS NOT NULL AND state IS NOT NULL
                AND state <> lag(state) OVER w THEN 1 ELSE 0 END AS change_step,
      coalesce(({sat}), false) AS sat_step,
      {steps}
  FROM nic_telemetry
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


def refresh(store: Store) -> int:
    """Rebuild ``nic_hourly`` from ``nic_telemetry``; returns its rows."""
    with store._lock, store.transaction() as cur:
        cur.execute(f"CREATE OR REPLACE TABLE {TABLE} AS {rollup_sql()} "
                    "ORDER BY node, device, port, hour").fetchall()
        rows = cur.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
    log.info("nic_rollup.refreshed rows=%d", rows)
    return int(rows)


def hourly(store: Store, *, node: str | None = None) -> list[dict[str, object]]:
    """The rows of ``nic_hourly`` (of ``node``), oldest first."""
    cur = store.cursor()
    where, params = ("WHERE node = ?", [node]) if node else ("", [])
    res = cur.execute(f"SELECT * FROM {TABLE} {where} ORDER BY node, device, port, hour",
                      params)
    cols = [d[0] for d in res.description]
    return [dict(zip(cols, r, strict=True)) for r in res.fetchall()]
