"""Node-level InfiniBand features per scoring time, for a network head (issue 16).

The ``node_nic_*`` features of the GPU catalogue sum a node's ports over 24 h and add
symbol errors, link error recoveries and integrity errors together; a failing cable and
a marginal one that never fails then look alike. These keep the counters apart, over
three windows, and say whether one port or many count: per counter of ``COUNTERS``

- ``node_<c>_<w>h``  the node's sum over the window (``WINDOWS_H``: 6, 24, 72 h),
- ``worst_<c>_24h``  the largest 24 h sum of any one port,
- ``ports_<c>_24h``  how many ports counted any in 24 h,

and ``rate_ratio_24h``, the lowest rate any port ran at over the highest (below 1: a link
trained down). ``bench/bench_network_head.py`` measures a node-level model on them.

A scoring time ``te`` reads the hours before ``hour_ceil(te)``, as ``features``' NIC
windows do: on the grid (``te`` on the hour) the full hours before it, live the hours
before the current one and the current partial hour. A node has a row at ``te`` when one
of its ports has a row in ``nic_hourly`` for the hour before ``hour_ceil(te)`` (a node
down for repair reports nothing and has none). Everything is computed in DuckDB from the
hourly NIC rollup (``nic_rollup``; ``features.refresh`` keeps it current).
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa

from fleetcare.pipeline import nic_rollup
from fleetcare.pipeline.store import Store, has_column

COUNTERS: dict[str, str] = {
    "sym": "symbol_error_inc",
    "rec": "link_error_recovery_inc",
    "integ": "local_link_integrity_errors_inc",
    "rcv": "port_rcv_errors_inc",
    "rphys": "port_rcv_remote_physical_errors_inc",
    "ovr": "excessive_buffer_overrun_errors_inc",
    "flaps": "flaps",
}
"""Short name -> ``nic_hourly`` column. Transmit discards are left out (congestion)."""
WINDOWS_H = (6, 24, 72)
FEATURE_NAMES: tuple[str, ...] = (
    *(f"{kind}_{c}_{w}h" for c in COUNTERS for kind, w in
      [*(("node", w) for w in WINDOWS_H), ("worst", 24), ("ports", 24)]),
    "rate_ratio_24h",
)


def _per_node() -> str:
    """The node aggregates over per-port window sums ``<c>_<w>h`` and rates."""
    per_node = []
    for k in COUNTERS:
        per_node += [f"sum({k}_{w}h)::DOUBLE AS node_{k}_{w}h" for w in WINDOWS_H]
        per_node += [f"max({k}_24h)::DOUBLE AS worst_{k}_24h",
                     f"count_if({k}_24h > 0)::DOUBLE AS ports_{k}_24h"]
    per_node.append("(min(rate_min_24h) / nullif(max(rate_max_24h), 0))::DOUBLE "
                    "AS rate_ratio_24h")
    return ", ".join(per_node)


def _ports(lo_hour: dt.datetime, hi_hour: dt.datetime, nodes: list[str] | None
           ) -> tuple[str, list[object]]:
    """The CTE ``ph``: port-hours from ``max(WINDOWS_H) - 1`` hours before ``lo_hour`` to
    ``hi_hour``, counters by short name (null: 0)."""
    params: list[object] = [lo_hour - dt.timedelta(hours=max(WINDOWS_H) - 1), hi_hour]
    only = ""
    if nodes is not None:
        only = "AND list_contains(?, node)"
        params.append(list(nodes))
    return f"""ph AS (
  SELECT node, device, port, hour,
    {", ".join(f"coalesce({c}, 0) AS {k}" for k, c in COUNTERS.items())},
    min_rate_gbps, max_rate_gbps
  FROM {nic_rollup.TABLE} WHERE hour >= ? AND hour <= ? {only}
)""", params


def _grid_sql(lo_hour: dt.datetime, hi_hour: dt.datetime, nodes: list[str] | None
              ) -> tuple[str, list[object]]:
    """Rows (hour, node, features) for the hours ``lo_hour`` .. ``hi_hour``: each counts
    its ports' hours up to and including ``hour`` (window functions over every hour)."""
    frame = "PARTITION BY node, device, port ORDER BY hour RANGE BETWEEN INTERVAL {} HOURS " \
            "PRECEDING AND CURRENT ROW"
    rolled = [f"sum({k}) OVER ({frame.format(w - 1)}) AS {k}_{w}h"
              for k in COUNTERS for w in WINDOWS_H]
    rolled += [f"min(min_rate_gbps) OVER ({frame.format(23)}) AS rate_min_24h",
               f"max(max_rate_gbps) OVER ({frame.format(23)}) AS rate_max_24h"]
    ports, params = _ports(lo_hour, hi_hour, nodes)
    sql = f"""
WITH {ports},
pw AS (SELECT node, device, port, hour, {", ".join(rolled)} FROM ph)
SELECT hour, node, {_per_node()}
FROM pw WHERE hour >= ? GROUP BY hour, node
"""
    return sql, [*params, lo_hour]


def _hour_sql(hour: dt.datetime, nodes: list[str] | None) -> tuple[str, list[object]]:
    """The row of ``_grid_sql`` for one hour, by filtered sums (no window functions: what
    live scoring reads every cycle)."""
    def since(w: int) -> str:
        return f"hour > TIMESTAMP '{(hour - dt.timedelta(hours=w)).isoformat(sep=' ')}'"
    sums = [f"sum({k}) FILTER (WHERE {since(w)}) AS {k}_{w}h"
            for k in COUNTERS for w in WINDOWS_H]
    sums += [f"min(min_rate_gbps) FILTER (WHERE {since(24)}) AS rate_min_24h",
             f"max(max_rate_gbps) FILTER (WHERE {since(24)}) AS rate_max_24h"]
    ports, params = _ports(hour, hour, nodes)
    sql = f"""
WITH {ports},
pw AS (SELECT node, device, port, {", ".join(sums)} FROM ph GROUP BY node, device, port
       HAVING max(hour) = ?)
SELECT ?::TIMESTAMP AS hour, node, {_per_node()}
FROM pw GROUP BY node
"""
    return sql, [*params, hour, hour]


def _naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _hour_ceil(ts: dt.datetime) -> dt.datetime:
    floor = ts.replace(minute=0, second=0, microsecond=0)
    return floor if floor == ts else floor + dt.timedelta(hours=1)


def grid(store: Store, lo: dt.datetime, hi: dt.datetime, *,
         nodes: list[str] | None = None) -> pa.Table:
    """Rows (ts, node, ``FEATURE_NAMES``) for every hour ``ts`` in ``[lo, hi]`` (both
    rounded up to the hour), ordered by ts and node."""
    a, b = _hour_ceil(_naive(lo)), _hour_ceil(_naive(hi))
    sql, params = _grid_sql(a - dt.timedelta(hours=1), b - dt.timedelta(hours=1), nodes)
    cur = store.cursor()
    try:
        if not _has_rollup(cur):
            return _empty()
        return cur.sql(f"SELECT hour + INTERVAL 1 HOUR AS ts, * EXCLUDE (hour) FROM ({sql}) "
                       "ORDER BY ts, node", params=params).to_arrow_table()
    finally:
        cur.close()


def latest(store: Store, at: dt.datetime, *, nodes: list[str] | None = None) -> pa.Table:
    """Rows (ts = ``at``, node, ``FEATURE_NAMES``) of the nodes whose ports reported in the
    hour before ``hour_ceil(at)``, ordered by node."""
    t = _naive(at)
    hour = _hour_ceil(t) - dt.timedelta(hours=1)
    sql, params = _hour_sql(hour, nodes)
    cur = store.cursor()
    try:
        if not _has_rollup(cur):
            return _empty()
        return cur.sql(f"SELECT ?::TIMESTAMP AS ts, * EXCLUDE (hour) FROM ({sql}) "
                       "ORDER BY node", params=[t, *params]).to_arrow_table()
    finally:
        cur.close()


def _has_rollup(cur: duckdb.DuckDBPyConnection) -> bool:
    return has_column(cur, nic_rollup.TABLE, "flaps")


def _empty() -> pa.Table:
    return pa.table({"ts": pa.array([], pa.timestamp("us")), "node": pa.array([], pa.string()),
                     **{f: pa.array([], pa.float64()) for f in FEATURE_NAMES}})
