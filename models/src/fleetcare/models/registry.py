"""The model registry: every trained model, its ranges, metrics and bytes, in DuckDB.

Table ``models`` (created here, IF NOT EXISTS)::

    model_id    VARCHAR PRIMARY KEY   'm-YYYYmmddTHHMMSS-<sha256(blob)[:8]>'
    created_at  TIMESTAMP             UTC
    horizon_h   DOUBLE
    train_start, train_end, cal_start, cal_end, test_start, test_end   TIMESTAMP (UTC)
    features    JSON                  list of feature names, in model order
    params      JSON                  FailureModel hyperparameters
    metrics     JSON                  held-out test metrics (fleetcare.models.metrics)
    blob        BLOB                  FailureModel.to_bytes()
    is_current  BOOLEAN               at most one row is current

A model saved while none is current becomes current; ``promote`` moves the flag.

Exceptions::

    RegistryError
     └── ModelNotFoundError (.model_id)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import weakref
from dataclasses import dataclass
from typing import Any

from fleetcare.models.model import FailureModel
from fleetcare.pipeline.store import Store, has_column

DDL = """
CREATE TABLE IF NOT EXISTS models (
  model_id VARCHAR PRIMARY KEY,
  created_at TIMESTAMP NOT NULL,
  horizon_h DOUBLE NOT NULL,
  train_start TIMESTAMP, train_end TIMESTAMP,
  cal_start TIMESTAMP, cal_end TIMESTAMP,
  test_start TIMESTAMP, test_end TIMESTAMP,
  features JSON NOT NULL,
  params JSON NOT NULL,
  metrics JSON NOT NULL,
  blob BLOB NOT NULL,
  is_current BOOLEAN NOT NULL DEFAULT false
);
ALTER TABLE models ADD COLUMN IF NOT EXISTS origin VARCHAR DEFAULT 'fleet';
ALTER TABLE models ADD COLUMN IF NOT EXISTS current_reason VARCHAR;
"""
ORIGINS = ("fleet", "prior")
"""``fleet``: trained on this fleet's own data; ``prior``: the shipped fleet prior."""

_COLS = ("model_id, created_at, horizon_h, train_start, train_end, cal_start, cal_end, "
         "test_start, test_end, features, params, metrics, is_current, origin, "
         "current_reason")

Range = tuple[dt.datetime | None, dt.datetime | None]


class RegistryError(Exception):
    pass


class ModelNotFoundError(RegistryError, KeyError):
    def __init__(self, model_id: str) -> None:
        super().__init__(f"no model {model_id!r} in the registry; list them with "
                         "`fleetcare models list --db PATH`")
        self.model_id = model_id

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class ModelRecord:
    model_id: str
    created_at: dt.datetime
    horizon_h: float
    train_range: Range
    cal_range: Range
    test_range: Range
    features: list[str]
    params: dict[str, Any]
    metrics: dict[str, Any]
    is_current: bool
    origin: str = "fleet"
    current_reason: str | None = None  # why it scores (or scored, until replaced)


_ready: weakref.WeakSet[Store] = weakref.WeakSet()


def ensure_schema(store: Store) -> None:
    """Create the tables (once per Store object) unless they are there in this layout
    (the newest column present): a read-only store of the current layout reads them."""
    if store not in _ready:
        cur = store.cursor()
        if not has_column(cur, "models", "current_reason"):
            cur.execute(DDL).fetchall()
        _ready.add(store)


def _utc(ts: dt.datetime | None) -> dt.datetime | None:
    if ts is None:
        return None
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _aware(ts: dt.datetime | None) -> dt.datetime | None:
    return ts.replace(tzinfo=dt.UTC) if ts is not None and ts.tzinfo is None else ts


def make_model_id(blob: bytes, created_at: dt.datetime) -> str:
    stamp = _utc(created_at).strftime("%Y%m%dT%H%M%S")  # type: ignore[union-attr]
    return f"m-{stamp}-{hashlib.sha256(blob).hexdigest()[:8]}"


def _record(row: tuple[Any, ...]) -> ModelRecord:
    (mid, created, h, t0, t1, c0, c1, s0, s1, feats, params, metrics, cur, origin,
     reason) = row
    return ModelRecord(
        model_id=mid, created_at=_aware(created), horizon_h=float(h),  # type: ignore[arg-type]
        train_range=(_aware(t0), _aware(t1)), cal_range=(_aware(c0), _aware(c1)),
        test_range=(_aware(s0), _aware(s1)), features=json.loads(feats),
        params=json.loads(params), metrics=json.loads(metrics), is_current=bool(cur),
        origin=origin or "fleet", current_reason=reason,
    )


def save(store: Store, model: FailureModel, *, metrics: dict[str, Any] | None = None,
         train_range: Range = (None, None), cal_range: Range = (None, None),
         test_range: Range = (None, None), created_at: dt.datetime | None = None,
         make_current: bool | None = None, model_id: str | None = None,
         origin: str = "fleet", current_reason: str | None = None) -> ModelRecord:
    """Store a fitted model; it becomes current when ``make_current`` or when none is
    (``current_reason`` says why; default: the first model of the store).

    ``metrics`` must be JSON-safe (no NaN: use ``metrics.json_float``).
    """
    ensure_schema(store)
    if origin not in ORIGINS:
        raise ValueError(f"origin={origin!r}: use one of {', '.join(ORIGINS)}")
    blob = model.to_bytes()
    created = created_at or dt.datetime.now(dt.UTC)
    model_id = model_id or make_model_id(blob, created)
    with store.transaction() as cur:
        has_current = cur.execute(
            "SELECT count(*) FROM models WHERE is_current").fetchall()[0][0] > 0
        current = bool(make_current) or (make_current is None and not has_current)
        if current:
            cur.execute("UPDATE models SET is_current = false WHERE is_current").fetchall()
            current_reason = current_reason or (
                "forced current when registered" if make_current
                else "the first model of this fleet's registry")
        cur.execute(
            f"INSERT INTO models ({_COLS}, blob) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [model_id, _utc(created), float(model.horizon_h),
             _utc(train_range[0]), _utc(train_range[1]), _utc(cal_range[0]),
             _utc(cal_range[1]), _utc(test_range[0]), _utc(test_range[1]),
             json.dumps(model.feature_names_in_), json.dumps(model.get_params(), sort_keys=True),
             json.dumps(metrics or {}, sort_keys=True, allow_nan=False), current, origin,
             current_reason if current else None, blob],
        ).fetchall()
    return get(store, model_id)


def get(store: Store, model_id: str) -> ModelRecord:
    ensure_schema(store)
    row = store.cursor().execute(
        f"SELECT {_COLS} FROM models WHERE model_id = ?", [model_id]).fetchone()
    if row is None:
        raise ModelNotFoundError(model_id)
    return _record(row)


def load(store: Store, model_id: str) -> FailureModel:
    ensure_schema(store)
    row = store.cursor().execute(
        "SELECT blob FROM models WHERE model_id = ?", [model_id]).fetchone()
    if row is None:
        raise ModelNotFoundError(model_id)
    return FailureModel.from_bytes(bytes(row[0]))


def current(store: Store) -> ModelRecord | None:
    ensure_schema(store)
    row = store.cursor().execute(
        f"SELECT {_COLS} FROM models WHERE is_current ORDER BY created_at DESC LIMIT 1"
    ).fetchone()
    return _record(row) if row else None


def list_models(store: Store) -> list[ModelRecord]:
    """All models, newest first."""
    ensure_schema(store)
    rows = store.cursor().execute(
        f"SELECT {_COLS} FROM models ORDER BY created_at DESC, model_id DESC").fetchall()
    return [_record(r) for r in rows]


def _must_exist(cur: Any, model_id: str) -> None:
    found = cur.execute("SELECT count(*) FROM models WHERE model_id = ?",
                        [model_id]).fetchall()[0][0]
    if not found:
        raise ModelNotFoundError(model_id)


def set_metrics(store: Store, model_id: str, metrics: dict[str, Any]) -> ModelRecord:
    """Replace a registered model's metrics (JSON-safe, as for ``save``): the shipped
    prior's are re-chosen without the model changing (``prior.install``)."""
    ensure_schema(store)
    with store.transaction() as cur:
        _must_exist(cur, model_id)
        cur.execute("UPDATE models SET metrics = ? WHERE model_id = ?",
                    [json.dumps(metrics, sort_keys=True, allow_nan=False), model_id]
                    ).fetchall()
    return get(store, model_id)


def promote(store: Store, model_id: str, *, reason: str | None = None) -> ModelRecord:
    """Make ``model_id`` the current model (the one ``score`` uses by default); ``reason``
    is kept as why it scores."""
    ensure_schema(store)
    with store.transaction() as cur:
        _must_exist(cur, model_id)
        cur.execute("UPDATE models SET is_current = (model_id = ?)", [model_id]).fetchall()
        cur.execute("UPDATE models SET current_reason = ? WHERE model_id = ?",
                    [reason or "promoted by an operator", model_id]).fetchall()
    return get(store, model_id)
