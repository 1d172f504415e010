"""Failure incidents (the labels' ground truth): derived from XIDs, added by operators.

- ``derive_from_xids(store)``: one ``failure`` incident per burst of fatal XIDs (or lost-GPU
  messages) on one GPU, source ``xid``. Idempotent: safe to call from the service loop
  after every ingest.
- ``operator_incident(...)``: a validated incident from ``fleetcare incident add``.
- ``list_incidents(store, ...)``: rows for ``fleetcare incident list``.
- Slurm's node events and CSV files: ``fleetcare.pipeline.incident_import``.

Which XIDs are failures. The fatal set of the XID catalogue
(``fleetcare.collectors.xid``, site overrides through ``XidCatalog.with_overrides``),
minus application XIDs, which are never failures whatever a site configures (13, 31, 43,
45, 68, 69 and any XID of class ``application``). An event with no XID number whose
message says the GPU is lost or has fallen off the bus is a failure too.

One incident per burst. Fatal events on the same GPU (uuid; else PCI bus on the node,
resolved to a uuid from telemetry where possible; else the node) within ``BURST`` of the
burst's first event are one incident, stamped with that first event (its ts, XID, cause);
the note lists every XID of the burst. An incident whose first event arrives late, inside
the ``BURST`` of an existing ``xid`` incident of the same GPU, is not added twice.

Cause and mode by XID (``XID_CAUSES``; ``CAUSES`` names are Llama 3's Table 5):

======================  ====================  =======  ==================================
XID                     cause                 mode     why
======================  ====================  =======  ==================================
48, 63, 64, 92, 94,     gpu_hbm3_memory       hbm      DBE, row remap (failure), ECC
95, 140                                                contained / uncontained / unrecovered
74                      faulty_gpu            nvlink   NVLink error
121                     faulty_gpu            nvlink   C2C link error
79, 32, lost GPU        faulty_gpu            pcie     fallen off the bus, PBDMA / PCIe
62, 119, 120            gpu_system_processor  gsp      micro-controller halt, GSP RPC
                                                       timeout, GSP error
143, 109, 154, other    faulty_gpu            none     init error, context-switch timeout
======================  ====================  =======  ==================================

An XID a site makes fatal that is not in the table gets its cause from its class
(memory → gpu_hbm3_memory/hbm, link → faulty_gpu/nvlink, bus → faulty_gpu/pcie,
firmware → gpu_system_processor/gsp, else faulty_gpu/none).

Exceptions::

    IncidentError (ValueError)   an invalid operator or imported incident (.field, .value)
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleetcare.collectors.contract import CAUSES, Incident, utc
from fleetcare.collectors.xid import DEFAULT_CATALOG, XidCatalog
from fleetcare.pipeline.limits import KNOWN_CAUSES, OPERATOR_CAUSES, Limits
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

KINDS = ("failure", "repair", "rma")
BURST = dt.timedelta(minutes=10)
"""Fatal XIDs on one GPU within this time of the first are one incident."""
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})
"""Never failures: the application crashed, the GPU is healthy."""
LOST_GPU_PATTERNS = ("gpu is lost", "fallen off the bus")
"""Case-insensitive message fragments of a lost GPU reported without an XID number."""

XID_CAUSES: dict[int | None, tuple[str, str]] = {
    **dict.fromkeys((48, 63, 64, 92, 94, 95, 140), ("gpu_hbm3_memory", "hbm")),
    74: ("faulty_gpu", "nvlink"),
    121: ("faulty_gpu", "nvlink"),
    79: ("faulty_gpu", "pcie"),
    32: ("faulty_gpu", "pcie"),
    None: ("faulty_gpu", "pcie"),          # lost GPU, no XID number
    **dict.fromkeys((62, 119, 120), ("gpu_system_processor", "gsp")),
    **dict.fromkeys((143, 109, 154), ("faulty_gpu", "none")),
}
_CLASS_CAUSES = {
    "memory": ("gpu_hbm3_memory", "hbm"),
    "link": ("faulty_gpu", "nvlink"),
    "bus": ("faulty_gpu", "pcie"),
    "firmware": ("gpu_system_processor", "gsp"),
}


class IncidentError(ValueError):
    """An incident that cannot be recorded; says which field, the value and the fix."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


def cause_of(xid: int | None, catalog: XidCatalog = DEFAULT_CATALOG) -> tuple[str, str]:
    """(cause, mode) of a fatal XID (None: a lost GPU without a number)."""
    if xid in XID_CAUSES:
        return XID_CAUSES[xid]
    assert xid is not None
    return _CLASS_CAUSES.get(catalog.lookup(xid).xid_class, ("faulty_gpu", "none"))


def failure_xids(catalog: XidCatalog = DEFAULT_CATALOG) -> frozenset[int]:
    """The XIDs that become failure incidents: fatal, and not an application XID."""
    return frozenset(
        x for x in catalog.fatal_xids()
        if x not in APPLICATION_XIDS and catalog.lookup(x).xid_class != "application")


# -- derivation from XIDs --------------------------------------------------------------------

def _ident_sql(cur: Any) -> str:
    """(node, bus, gpu_index, gpu_uuid) of every GPU seen, from rollups else raw telemetry."""
    have = {r[0] for r in cur.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}
    src = "telemetry_hourly" if "telemetry_hourly" in have else "telemetry"
    return f"""SELECT DISTINCT node, {_bus('pci_bus_id')} AS bus, gpu_index, gpu_uuid
               FROM {src}"""


def _bus(expr: str) -> str:
    """PCI bus:device, lower case: '00000000:3B:00.0' and '0000:3b:00' → '3b:00'."""
    return f"regexp_extract(lower({expr}), '([0-9a-f]{{2}}:[0-9a-f]{{2}})(\\.[0-9a-f]+)?$', 1)"


def _fatal_events(store: Store, catalog: XidCatalog,
                  since: dt.datetime | None) -> list[tuple[Any, ...]]:
    """Fatal events (ts, node, gpu_uuid, gpu key, xid), GPU resolved, ordered by key and ts."""
    xids = sorted(failure_xids(catalog))
    lost = " OR ".join(f"lower(e.message) LIKE '%{p}%'" for p in LOST_GPU_PATTERNS)
    xid_in = f"e.xid IN ({', '.join(map(str, xids))})" if xids else "FALSE"
    cond = f"({xid_in} OR (e.xid IS NULL AND ({lost})))"
    params: list[Any] = []
    if since is not None:
        cond += " AND e.ts >= ?"
        params.append(since)
    cur = store.cursor()
    try:
        return cur.execute(f"""
            WITH ident AS ({_ident_sql(cur)}),
            ib AS (SELECT node, bus, min(gpu_uuid) AS gpu_uuid FROM ident GROUP BY ALL),
            ii AS (SELECT node, gpu_index, min(gpu_uuid) AS gpu_uuid FROM ident GROUP BY ALL),
            ev AS (
              SELECT e.ts, e.node, e.xid,
                coalesce(e.gpu_uuid, ib.gpu_uuid, ii.gpu_uuid) AS gpu_uuid,
                coalesce(e.gpu_uuid, ib.gpu_uuid, ii.gpu_uuid,
                         'bus:' || nullif({_bus('e.pci_bus_id')}, ''),
                         'index:' || e.gpu_index, 'node') AS gkey
              FROM xid_events e
              LEFT JOIN ib ON ib.node = e.node AND ib.bus = {_bus('e.pci_bus_id')}
              LEFT JOIN ii ON ii.node = e.node AND ii.gpu_index = e.gpu_index
              WHERE {cond}
            )
            SELECT ts, node, gpu_uuid, gkey, xid FROM ev ORDER BY node, gkey, ts, xid
        """, params).fetchall()
    finally:
        cur.close()


@dataclass
class _Burst:
    ts: dt.datetime
    node: str
    gpu_uuid: str | None
    key: str
    xids: list[int | None]


def _bursts(events: Iterable[tuple[Any, ...]], burst: dt.timedelta,
            known: dict[tuple[str, str | None], list[dt.datetime]]) -> list[_Burst]:
    """Group events into bursts, leaving out events inside a known incident's burst."""
    out: list[_Burst] = []
    for ts, node, gpu_uuid, key, xid in events:
        if any(t <= ts <= t + burst for t in known.get((node, gpu_uuid), ())):
            continue
        last = out[-1] if out else None
        if last and (last.node, last.key) == (node, key) and ts - last.ts <= burst:
            last.xids.append(xid)
        else:
            out.append(_Burst(ts, node, gpu_uuid, key, [xid]))
    # A late first event just before a known incident: the same failure, already recorded.
    return [b for b in out
            if not any(t - burst <= b.ts < t for t in known.get((b.node, b.gpu_uuid), ()))]


def derive_from_xids(store: Store, *, catalog: XidCatalog = DEFAULT_CATALOG,
                     since: dt.datetime | None = None, burst: dt.timedelta = BURST) -> int:
    """Add a failure incident per burst of fatal XIDs / lost GPUs; returns incidents added.

    Idempotent. ``since`` limits the scan to events at or after it (the service loop passes
    a recent time; None scans every event).
    """
    since_n = utc(since).replace(tzinfo=None) - burst if since else None
    events = _fatal_events(store, catalog, since_n)
    if not events:
        return 0
    known: dict[tuple[str, str | None], list[dt.datetime]] = {}
    for node, gpu, ts in store.cursor().execute(
            # any source: a failure an operator, Slurm or the simulator already recorded
            # is not counted again from its XIDs (labels would double)
            "SELECT node, gpu_uuid, ts FROM incidents WHERE kind = 'failure'"
            + (" AND ts >= ?" if since_n else ""), [since_n - burst] if since_n else []
    ).fetchall():
        known.setdefault((node, gpu), []).append(ts)
    bursts = _bursts(events, burst, known)
    new = []
    for b in bursts:
        first = b.xids[0]
        cause, mode = cause_of(first, catalog)
        names = ", ".join("lost GPU" if x is None else str(x) for x in dict.fromkeys(b.xids))
        where = "" if b.gpu_uuid or b.key == "node" else f", {b.key}"
        new.append(Incident(
            ts=utc(b.ts), node=b.node, kind="failure", cause=cause, source="xid",
            gpu_uuid=b.gpu_uuid, mode=mode, xid=first,
            note=f"fatal XID {names} ({len(b.xids)} event{'s' if len(b.xids) > 1 else ''}"
                 f"{where})"))
    added = store.insert_incidents(new)
    if added:
        log.info("incidents.derived source=xid added=%d events=%d", added, len(events))
    return added


# -- operators ----------------------------------------------------------------------------------

def parse_time(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """ISO-8601 (naive = UTC, 'Z' allowed) or 'now' → an aware UTC datetime."""
    text = value.strip()
    if text.lower() == "now":
        return utc(now or dt.datetime.now(dt.UTC))
    try:
        return utc(dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")))
    except ValueError:
        raise IncidentError("ts", value, f"time {value!r} is not ISO-8601 (e.g. "
                            "2026-03-01T14:05:00Z) or 'now'") from None


def validate(*, ts: dt.datetime, node: str, kind: str, cause: str, source: str,
             gpu_uuid: str | None = None, mode: str | None = None,
             note: str | None = None, now: float | None = None,
             limits: Limits | None = None) -> Incident:
    """An ``Incident`` from operator input, or ``IncidentError`` saying what to fix.

    ``now`` (Unix seconds): also check ``ts`` against ingest's time bounds
    (``Limits.max_future_s`` ahead, ``Limits.max_age_s`` old), as ``POST /v1/incidents``
    does: what ingest would refuse is not accepted through the API either."""
    if now is not None:
        _check_time(utc(ts), now, limits or Limits())
    if not node or not node.strip():
        raise IncidentError("node", node, "node is empty: name the node, e.g. gpu-node-017")
    if kind not in KINDS:
        raise IncidentError("kind", kind, f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if cause not in KNOWN_CAUSES:
        raise IncidentError("cause", cause, f"cause {cause!r} is unknown; valid causes: "
                            f"{', '.join([*CAUSES, *OPERATOR_CAUSES])} (a cause of your own: "
                            "'other', with the text in the note)")
    return Incident(ts=utc(ts), node=node.strip(), kind=kind, cause=cause,  # type: ignore[arg-type]
                    source=source, gpu_uuid=gpu_uuid or None, mode=mode or None,
                    note=note or None)


def _check_time(ts: dt.datetime, now: float, limits: Limits) -> None:
    age = now - ts.timestamp()
    if -age > limits.max_future_s:
        raise IncidentError("ts", ts.isoformat(), f"ts {ts.isoformat()} is {-age:,.0f} s ahead "
                            f"of the server's clock; at most {limits.max_future_s:,.0f} s ahead "
                            "is accepted (as ingest accepts): check the reporter's clock (NTP)")
    if age > limits.max_age_s:
        raise IncidentError("ts", ts.isoformat(), f"ts {ts.isoformat()} is {age / 86400:,.0f} "
                            f"days old; at most {limits.max_age_s / 86400:g} days old is "
                            "accepted (as ingest accepts): record older history with "
                            "`fleetcare incident import`")


def list_incidents(store: Store, *, node: str | None = None, kind: str | None = None,
                   source: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Incidents, newest first, as dicts with ISO-8601 UTC timestamps."""
    conds, params = [], []
    for col, val in (("node", node), ("kind", kind), ("source", source)):
        if val is not None:
            conds.append(f"{col} = ?")
            params.append(val)
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    lim = f"LIMIT {int(limit)}" if limit else ""
    cur = store.cursor()
    try:
        res = cur.execute(f"SELECT * FROM incidents {where} "
                          f"ORDER BY ts DESC, node, gpu_uuid {lim}", params)
        cols = [d[0] for d in res.description]
        rows = [dict(zip(cols, r, strict=True)) for r in res.fetchall()]
    finally:
        cur.close()
    for r in rows:
        r["ts"] = r["ts"].isoformat() + "Z"
    return rows
