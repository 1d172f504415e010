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

DDL = f"""
CREATE TABLE IF NOT EXISTS telemetry (
  {columns_ddl(GpuSample)}
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
