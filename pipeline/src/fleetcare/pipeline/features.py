"""Per-GPU features at scoring times, computed in DuckDB SQL (INTERFACE STUB: being built).

The models and the API depend on exactly this interface:

- ``KEY_COLUMNS``: the columns that identify a row of features; every other column of a
  feature table is a float64 feature named in ``FEATURES``.
- ``refresh(store, until=None)``: bring the incremental rollups up to date (call after
  ingest; cheap when little is new).
- ``gpu_features(store, start, end, every_s=3600)``: one row per GPU per scoring time on
  a grid from ``start`` to ``end`` (aware UTC datetimes), for training and evaluation.
- ``latest_features(store, at=None)``: one row per GPU that reported within the last
  ``STALE_AFTER`` before ``at`` (default: the newest telemetry), for live scoring.
- ``FEATURES``: the catalogue (name, window, definition, unit), which also generates
  docs/features.md.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa

from fleetcare.pipeline.store import Store

KEY_COLUMNS = ("ts", "node", "gpu_uuid", "gpu_index", "model")
STALE_AFTER = dt.timedelta(minutes=30)


@dataclass(frozen=True, slots=True)
class FeatureDef:
    name: str
    window: str        # "1h", "6h", "24h", "7d", "28d", "now"
    unit: str
    definition: str


FEATURES: list[FeatureDef] = []


def refresh(store: Store, *, until: dt.datetime | None = None) -> None:
    raise NotImplementedError


def gpu_features(store: Store, start: dt.datetime, end: dt.datetime, *,
                 every_s: int = 3600) -> pa.Table:
    raise NotImplementedError


def latest_features(store: Store, at: dt.datetime | None = None) -> pa.Table:
    raise NotImplementedError
