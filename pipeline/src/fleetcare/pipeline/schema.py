"""DuckDB DDL and Arrow schemas, derived from the data contract (never retyped).

Timestamps are stored as ``TIMESTAMP`` holding UTC (naive in DuckDB, aware again when
they leave through ``fleetcare.collectors.contract.utc``).
"""

from __future__ import annotations

import datetime as dt
import types
import typing
from typing import Any

import msgspec
import pyarrow as pa

from fleetcare.collectors.contract import GpuSample, Incident, NicSample, XidEvent

_SCALARS: dict[Any, tuple[str, pa.DataType]] = {
    str: ("VARCHAR", pa.string()),
    int: ("BIGINT", pa.int64()),
    float: ("DOUBLE", pa.float64()),
    bool: ("BOOLEAN", pa.bool_()),
    dt.datetime: ("TIMESTAMP", pa.timestamp("us")),
}


def _strip(tp: Any) -> Any:
    """The non-None type inside ``X | None`` / ``Annotated[X, ...]`` / ``Literal[...]``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _strip(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _strip(args[0])
    if origin is typing.Literal:
        return type(typing.get_args(tp)[0])
    return tp


def column_types(struct: type[msgspec.Struct]) -> list[tuple[str, str, pa.DataType]]:
    """(name, DuckDB type, Arrow type) for each field of a contract struct, in order."""
    hints = typing.get_type_hints(struct, include_extras=True)
    out = []
    for f in msgspec.structs.fields(struct):
        tp = _strip(hints[f.name])
        if typing.get_origin(tp) is list:
            inner = _strip(typing.get_args(tp)[0])
            sql, arrow = _SCALARS[inner]
            out.append((f.name, f"{sql}[]", pa.list_(arrow)))
        else:
            sql, arrow = _SCALARS[tp]
            out.append((f.name, sql, arrow))
    return out


def arrow_schema(struct: type[msgspec.Struct]) -> pa.Schema:
    return pa.schema([(name, arrow) for name, _, arrow in column_types(struct)])


def columns_ddl(struct: type[msgspec.Struct]) -> str:
    return ",\n  ".join(f"{name} {sql}" for name, sql, _ in column_types(struct))


SAMPLE_COLUMNS = [name for name, _, _ in column_types(GpuSample)]
EVENT_COLUMNS = [name for name, _, _ in column_types(XidEvent)]
INCIDENT_COLUMNS = [name for name, _, _ in column_types(Incident)]
SAMPLE_SCHEMA = arrow_schema(GpuSample)
EVENT_SCHEMA = arrow_schema(XidEvent)
INCIDENT_SCHEMA = arrow_schema(Incident)
NIC_COLUMNS = [name for name, _, _ in column_types(NicSample)]
NIC_SCHEMA = arrow_schema(NicSample)

# Natural keys: a record seen twice (redelivery, replayed spool) lands once.
SAMPLE_KEY = ("gpu_uuid", "ts")
EVENT_KEY = ("node", "ts", "gpu_uuid", "pci_bus_id", "xid", "message")
INCIDENT_KEY = ("node", "ts", "kind", "gpu_uuid", "cause")
NIC_KEY = ("node", "device", "port", "ts")

# -- how GPU samples are stored in DuckDB ------------------------------------------------------
NVLINK_LISTS = ("nvlink_up", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay",
                "nvlink_recovery")
NVLINK_COUNTERS = NVLINK_LISTS[1:]
MASK_LINKS = 62
"""Links ``nvlink_down_mask`` holds (bits of a BIGINT); NVML has at most 18."""
SCALAR_SAMPLE_COLUMNS = [c for c in SAMPLE_COLUMNS if c not in NVLINK_LISTS]
LINK_SUMMARY = (("nvlink_present", "BIGINT"), ("nvlink_links", "BIGINT"),
                ("nvlink_down_mask", "BIGINT"),
                *((f"{c}_total", "BIGINT") for c in NVLINK_COUNTERS))
STORED_SAMPLE_COLUMNS = SCALAR_SAMPLE_COLUMNS + [name for name, _ in LINK_SUMMARY]
"""The ``telemetry`` table's columns (see ``stored_samples_sql``), and those of every raw
sample relation (``fleetcare.pipeline.telemetry``)."""


def down_mask_sql(up: str) -> str:
    """SQL of a BIGINT with bit ``i`` set when entry ``i`` of the BOOLEAN[] ``up`` is false
    (links past ``MASK_LINKS`` left out); null when ``up`` is."""
    return (f"CASE WHEN {up} IS NULL THEN NULL ELSE coalesce(list_sum(list_transform("
            f"range(least(len({up}), {MASK_LINKS})), lambda i: CASE WHEN NOT {up}[i + 1] "
            "THEN 1::BIGINT << i ELSE 0 END)), 0) END")


def _present(c: str) -> str:
    return f"CASE WHEN {c} IS NULL THEN 0 ELSE {1 << NVLINK_LISTS.index(c)} END"


_LINK_SUMMARY_SQL = {
    "nvlink_present": " | ".join(_present(c) for c in NVLINK_LISTS),
    "nvlink_links": f"coalesce({', '.join(f'len({c})' for c in NVLINK_LISTS)})",
    "nvlink_down_mask": down_mask_sql("nvlink_up"),
    # summed as HUGEINT: 18 links of counters near 2**63 overflow BIGINT, and such a
    # total is null (no usable count; the exact values are in ``telemetry_nvlink``, as
    # for any counter not zero)
    **{f"{c}_total": f"TRY_CAST(list_sum({c}::HUGEINT[]) AS BIGINT)"
       for c in NVLINK_COUNTERS},
}
IRREGULAR_SQL = " OR ".join(  # (null for a null list: then not irregular on its account)
    ["NOT list_bool_and(nvlink_up)", "list_count(nvlink_up) <> len(nvlink_up)"]
    + [f"list_min({c}) <> 0 OR list_max({c}) <> 0 OR list_count({c}) <> len({c})"
       for c in NVLINK_COUNTERS]
    + [f"greatest({', '.join(f'len({c})' for c in NVLINK_LISTS)}) <> "
       f"least({', '.join(f'len({c})' for c in NVLINK_LISTS)})",
       f"len(nvlink_up) > {MASK_LINKS}"])
"""A sample whose NVLink lists are kept whole in ``telemetry_nvlink``: a link down or a
counter not zero (or a null entry), lists of different lengths, more links than the mask."""


def stored_samples_sql(src: str) -> str:
    """SELECT of ``src`` (a relation with the contract's columns) as stored: the scalar
    columns, then per sample the NVLink lists summarised (which lists are present, the
    number of links, a bit per link down, each counter's total over the links)."""
    summary = ", ".join(f"{_LINK_SUMMARY_SQL[name]} AS {name}" for name, _ in LINK_SUMMARY)
    return f"SELECT {', '.join(SCALAR_SAMPLE_COLUMNS)}, {summary} FROM {src}"


def contract_samples_sql(where: str = "TRUE", since: str | None = None) -> str:
    """SELECT of stored samples (``telemetry t`` with ``where``) with the contract's
    columns again: the lists of ``telemetry_nvlink`` where it has them, else all links
    up and every counter 0 (what a regular sample had), null for a list not sent.
    ``since``: a SQL timestamp no wanted sample is older than, so the per-link rows are
    read from there on (zone maps skip the rest) rather than all of them."""
    def rebuilt(c: str) -> str:
        fill = "true" if c == "nvlink_up" else "0::BIGINT"
        return (f"CASE WHEN d.gpu_uuid IS NOT NULL THEN d.{c} "
                f"WHEN t.nvlink_present & {1 << NVLINK_LISTS.index(c)} = 0 THEN NULL "
                f"ELSE list_transform(range(t.nvlink_links), lambda i: {fill}) END AS {c}")
    cols = [rebuilt(c) if c in NVLINK_LISTS else f"t.{c}" for c in SAMPLE_COLUMNS]
    details = ("telemetry_nvlink" if since is None
               else f"(SELECT * FROM telemetry_nvlink WHERE ts >= {since})")
    return (f"SELECT {', '.join(cols)} FROM telemetry t LEFT JOIN {details} d "
            f"ON d.gpu_uuid = t.gpu_uuid AND d.ts = t.ts WHERE {where}"
            + ("" if since is None else f" AND t.ts >= {since}"))


def contract_parts_sql(where: str = "TRUE", since: str | None = None) -> str:
    """``contract_samples_sql``'s rows in parts, for a reader that rebuilds the NVLink
    lists itself (``contract_sample``): the scalar columns, ``nvlink_present`` and
    ``nvlink_links``, whether a ``telemetry_nvlink`` row was joined, and that row's lists
    (null without one). A regular sample's lists are not built per row in SQL: for the
    few hundred samples the node pages' memory reads a second (``latest_samples``), that
    ``list_transform`` and the lists' conversion were ~60 % of the read."""
    details = ("telemetry_nvlink" if since is None
               else f"(SELECT * FROM telemetry_nvlink WHERE ts >= {since})")
    cols = ([f"t.{c}" for c in SCALAR_SAMPLE_COLUMNS]
            + ["t.nvlink_present", "t.nvlink_links", "d.gpu_uuid IS NOT NULL"]
            + [f"d.{c}" for c in NVLINK_LISTS])
    return (f"SELECT {', '.join(cols)} FROM telemetry t LEFT JOIN {details} d "
            f"ON d.gpu_uuid = t.gpu_uuid AND d.ts = t.ts WHERE {where}"
            + ("" if since is None else f" AND t.ts >= {since}"))


_N_SCALAR = len(SCALAR_SAMPLE_COLUMNS)
_PARTS_AT = [SCALAR_SAMPLE_COLUMNS.index(c) if c in SCALAR_SAMPLE_COLUMNS
             else -1 - NVLINK_LISTS.index(c) for c in SAMPLE_COLUMNS]
"""Per contract column: its place among ``contract_parts_sql``'s scalar columns, or
``-1 - i`` for the NVLink list ``i``."""
_UP = NVLINK_LISTS.index("nvlink_up")


def contract_sample(row: tuple[Any, ...]) -> dict[str, Any]:
    """A row of ``contract_parts_sql`` as the contract's sample (the contract's column
    order): what ``contract_samples_sql`` gives for it. The lists come from the per-link
    row where there is one; else null for a list not sent, and for one sent all links up
    and every counter 0 (what a regular sample had)."""
    present, links, detailed = row[_N_SCALAR:_N_SCALAR + 3]
    values = []
    for at in _PARTS_AT:
        if at >= 0:
            values.append(row[at])
            continue
        i = -1 - at
        if detailed:
            values.append(row[_N_SCALAR + 3 + i])
        elif (present is not None and not present & (1 << i)) or links is None:
            values.append(None)
        else:
            values.append([True] * links if i == _UP else [0] * links)
    return dict(zip(SAMPLE_COLUMNS, values, strict=True))


_SAMPLE_TYPES = {name: sql for name, sql, _ in column_types(GpuSample)}
DDL = f"""
CREATE TABLE IF NOT EXISTS telemetry (
  {", ".join(f"{c} {_SAMPLE_TYPES[c]}" for c in SCALAR_SAMPLE_COLUMNS)},
  {", ".join(f"{name} {sql}" for name, sql in LINK_SUMMARY)}
);
CREATE TABLE IF NOT EXISTS telemetry_nvlink (
  gpu_uuid VARCHAR NOT NULL, ts TIMESTAMP NOT NULL,
  {", ".join(f"{c} {_SAMPLE_TYPES[c]}" for c in NVLINK_LISTS)}
);
CREATE TABLE IF NOT EXISTS xid_events (
  {columns_ddl(XidEvent)}
);
CREATE TABLE IF NOT EXISTS incidents (
  {columns_ddl(Incident)}
);
CREATE TABLE IF NOT EXISTS nic_telemetry (
  {columns_ddl(NicSample)}
);
CREATE TABLE IF NOT EXISTS quarantine (
  received_at TIMESTAMP NOT NULL,
  source VARCHAR NOT NULL,
  reason VARCHAR NOT NULL,
  raw BLOB,
  code VARCHAR
);
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS code VARCHAR;
CREATE TABLE IF NOT EXISTS meta (
  key VARCHAR PRIMARY KEY,
  value VARCHAR
);
"""
