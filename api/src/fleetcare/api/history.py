"""The hourly history of a node's signals against its fleet peers: what the node page draws
and ``GET /v1/nodes/{node}/history`` returns.

Read from the hourly rollups (``fleetcare.pipeline.rollup``, table ``telemetry_hourly``,
one row per GPU per clock hour, in the service's database in both production shapes) and
``xid_events``. Each signal is one value per GPU-hour; the fleet median of an hour is the
median of that value over every GPU of the same model that reported in that hour.

``SIGNALS`` is the catalogue; ``signals_for_reason`` picks the signal a reason sentence is
about (by the words it uses: reasons are sentences, see ``fleetcare.models.reasons``), so
each reason on the node page gets the chart of its own signal.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import duckdb

from fleetcare.api.queries import finite, iso_z
from fleetcare.pipeline.rollup import TABLE as ROLLUP

MAX_DAYS = 31
"""The longest history one request may ask for (744 hourly points per series)."""
DEFAULT_DAYS = 7


def _sum(*cols: str) -> str:
    """The sum of rollup columns, null only when all of them are (counter unsupported)."""
    nulls = " AND ".join(f"{c} IS NULL" for c in cols)
    total = " + ".join(f"coalesce({c}, 0)" for c in cols)
    return f"CASE WHEN {nulls} THEN NULL ELSE {total} END"


@dataclass(frozen=True)
class Signal:
    name: str
    label: str
    unit: str
    sql: str
    """The value of one GPU-hour, over the rollup row ``h`` (and ``x.xids``)."""
    words: tuple[str, ...]
    """Lower-case words of a reason sentence about this signal."""


# Order matters for signals_for_reason: the first whose words a reason uses wins.
SIGNALS: tuple[Signal, ...] = (
    Signal("ecc_uncorrected", "Uncorrected ECC errors", "errors/h",
           "h.ecc_uncorrected_volatile_inc", ("uncorrect", "double-bit", "dbe")),
    Signal("remapped_rows", "Remapped HBM rows", "rows/h",
           _sum("h.remapped_rows_correctable_inc", "h.remapped_rows_uncorrectable_inc"),
           ("remap", "row")),
    Signal("retired_pages", "Retired pages", "pages/h",
           _sum("h.retired_pages_sbe_inc", "h.retired_pages_dbe_inc"), ("retire", "page")),
    Signal("ecc_corrected", "Corrected ECC errors", "errors/h",
           "h.ecc_corrected_volatile_inc", ("ecc", "sbe", "single-bit")),
    Signal("pcie_replay", "PCIe replays", "replays/h", "h.pcie_replay_count_inc",
           ("pcie replay", "replay count")),
    Signal("pcie_downtrained", "PCIe link downtrained", "% of samples",
           "100.0 * (coalesce(h.pcie_width_down_n, 0) + coalesce(h.pcie_gen_down_n, 0)) "
           "/ nullif(h.pcie_n, 0)", ("pcie", "downtrain", "link width", "link gen")),
    Signal("nvlink_crc", "NVLink CRC errors", "errors/h",
           _sum("h.nvlink_crc_flit_inc", "h.nvlink_crc_data_inc"), ("crc",)),
    Signal("nvlink_flaps", "NVLink link flaps", "transitions/h", "h.nvlink_flaps",
           ("flap", "link state", "links down", "link down")),
    Signal("nvlink_recovery", "NVLink replays and recoveries", "events/h",
           _sum("h.nvlink_replay_inc", "h.nvlink_recovery_inc"), ("nvlink", "recover")),
    Signal("xid", "XID events", "events/h", "coalesce(x.xids, 0)", ("xid",)),
    Signal("throttle", "Clock throttling", "% of samples",
           "100.0 * (coalesce(h.thr_thermal_n, 0) + coalesce(h.thr_power_n, 0) "
           "+ coalesce(h.thr_hw_n, 0)) / nullif(h.thr_n, 0)",
           ("throttl", "slowdown", "clock event", "power brake")),
    Signal("gpu_temp_c", "GPU temperature", "°C", "h.gpu_temp_sum / nullif(h.gpu_temp_n, 0)",
           ("temp", "°c", "thermal", "heat")),
    Signal("power_w", "Power draw", "W", "h.power_sum / nullif(h.power_n, 0)", ("power",)),
)
BY_NAME = {s.name: s for s in SIGNALS}
DEFAULT_SIGNALS = ("ecc_corrected", "remapped_rows", "xid", "pcie_replay", "nvlink_crc",
                   "gpu_temp_c")
"""What the node page charts for a GPU whose reasons name no signal."""


def signals_for_reason(reason: str) -> Signal | None:
    """The signal a reason sentence is about, or None (a node-level reason: repairs,
    incidents, ...). Only what precedes the comparison with the fleet is read: the GPU
    model named there ("H100 80GB HBM3") says nothing about the signal."""
    text = reason.lower()
    for cut in ("fleet median", "the fleet"):
        text = text.split(cut, 1)[0]
    if ":" in text[:12]:  # "GPU 5: ..."
        text = text.split(":", 1)[1]
    for s in SIGNALS:
        if any(w in text for w in s.words):
            return s
    return None


class HistoryError(ValueError):
    """A history request that cannot be answered as asked (.field, .value)."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


def parse_signals(raw: str | None) -> list[Signal]:
    """``signals=a,b``: names from ``SIGNALS`` (all of them when None)."""
    if raw is None:
        return list(SIGNALS)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        why = f"unknown signal {unknown[0]!r}" if unknown else "no signal named"
        raise HistoryError("signals", raw, f"{why}; known signals: {', '.join(BY_NAME)} "
                           "(comma-separated)")
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def newest_hour(cur: duckdb.DuckDBPyConnection, tables: set[str],
                node: str | None = None) -> dt.datetime | None:
    """The newest rollup hour (of ``node``, else of the fleet); None without rollups."""
    if ROLLUP not in tables:
        return None
    if node is None:
        return cur.execute(f"SELECT max(hour) FROM {ROLLUP}").fetchone()[0]  # type: ignore[index]
    return cur.execute(f"SELECT max(hour) FROM {ROLLUP} WHERE node = ?",  # type: ignore[index]
                       [node]).fetchone()[0]


def _xid_join(tables: set[str], since: dt.datetime,
              node: str | None = None) -> tuple[str, list[Any]]:
    """XID events per GPU-hour joined to the rollup row ``h`` (by GPU UUID, else by PCI
    bus: a kernel-log XID may carry only the bus), and the join's parameters."""
    if "xid_events" not in tables:
        return "LEFT JOIN (SELECT NULL::BIGINT AS xids) x ON FALSE", []
    cond: str = "ts >= ?"
    params: list[Any] = [since]
    if node is not None:
        cond, params = cond + " AND node = ?", [since, node]
    return (f"LEFT JOIN (SELECT node, date_trunc('hour', ts) AS hour, gpu_uuid, pci_bus_id, "
            f"count(*) AS xids FROM xid_events WHERE {cond} GROUP BY ALL) x "
            "ON x.node = h.node AND x.hour = h.hour AND (x.gpu_uuid = h.gpu_uuid OR "
            "(x.gpu_uuid IS NULL AND x.pci_bus_id = h.pci_bus_id))", params)


def node_history(cur: duckdb.DuckDBPyConnection, tables: set[str], node: str,
                 signals: list[Signal], *, since: dt.datetime | None = None,
                 gpu: str | None = None) -> dict[str, Any] | None:
    """The hourly series of ``signals`` for each GPU of ``node`` (or the one GPU ``gpu``,
    a UUID or an index) since ``since`` (default: ``DEFAULT_DAYS`` before the node's newest
    hour), with the fleet median per GPU model. None when the node has no rollups."""
    newest = newest_hour(cur, tables, node)
    if newest is None:
        return None
    if since is None:
        since = newest - dt.timedelta(days=DEFAULT_DAYS) + dt.timedelta(hours=1)
    if newest - since > dt.timedelta(days=MAX_DAYS):
        raise HistoryError("since", iso_z(since), f"since is more than {MAX_DAYS} days "
                           f"before the node's newest hour ({iso_z(newest)}): at most "
                           f"{MAX_DAYS} days of history are served per request")
    cols = ", ".join(f"{s.sql} AS {s.name}" for s in signals)
    names = [s.name for s in signals]
    join, xparams = _xid_join(tables, since, node)
    gpu_cond, gparams = "", []
    if gpu is not None:
        gpu_cond = "AND (h.gpu_uuid = ? OR CAST(h.gpu_index AS VARCHAR) = ?)"
        gparams = [gpu, gpu]
    rows = cur.execute(
        f"SELECT h.gpu_uuid, h.gpu_index, h.model, h.hour, {cols} FROM {ROLLUP} h {join} "
        f"WHERE h.node = ? AND h.hour >= ? {gpu_cond} ORDER BY h.gpu_index, h.gpu_uuid, "
        "h.hour", xparams + [node, since] + gparams).fetchall()
    if gpu is not None and not rows:
        raise HistoryError("gpu", gpu, f"node {node!r} has no GPU {gpu!r} with history "
                           "since then: GPUs are listed in GET /v1/nodes/{node}")
    gpus: dict[str, dict[str, Any]] = {}
    for uuid, index, model, hour, *values in rows:
        g = gpus.setdefault(uuid, {"gpu_uuid": uuid, "gpu_index": index, "model": model,
                                   "series": {n: [] for n in names}})
        t = iso_z(hour)
        for n, v in zip(names, values, strict=True):
            g["series"][n].append({"t": t, "v": finite(None if v is None else float(v))})
    models = sorted({g["model"] for g in gpus.values() if g["model"] is not None})
    medians = _fleet_medians(cur, tables, signals, models, since)
    return {"node": node, "since": iso_z(since), "until": iso_z(newest + dt.timedelta(hours=1)),
            "step_s": 3600, "signals": [{"name": s.name, "label": s.label, "unit": s.unit}
                                        for s in signals],
            "gpus": list(gpus.values()), "fleet_median": medians}


def _fleet_medians(cur: duckdb.DuckDBPyConnection, tables: set[str], signals: list[Signal],
                   models: list[str], since: dt.datetime) -> list[dict[str, Any]]:
    """Per GPU model and hour, the median of each signal over the model's GPUs."""
    if not models:
        return []
    names = [s.name for s in signals]
    marks = ", ".join("?" for _ in models)
    per_gpu = ", ".join(f"{s.sql} AS {s.name}" for s in signals)
    xids, xparams = _xid_join(tables, since)
    meds = ", ".join(f"median({n})" for n in names)
    rows = cur.execute(
        f"SELECT model, hour, {meds} FROM (SELECT h.model, h.hour, {per_gpu} FROM {ROLLUP} h "
        f"{xids} WHERE h.hour >= ? AND h.model IN ({marks})) GROUP BY model, hour "
        "ORDER BY model, hour", xparams + [since, *models]).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for model, hour, *values in rows:
        m = out.setdefault(model, {"model": model, "series": {n: [] for n in names}})
        t = iso_z(hour)
        for n, v in zip(names, values, strict=True):
            m["series"][n].append({"t": t, "v": finite(None if v is None else float(v))})
    return list(out.values())
