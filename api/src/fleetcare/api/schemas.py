"""The JSON the API returns, as pydantic models (they make the OpenAPI spec useful).

``Telemetry`` is generated from the data contract (``GpuSample``), never retyped: a field
added to the contract appears in the API and its spec. Timestamps are ISO-8601 UTC
strings ending in ``Z``; numbers are never NaN (a non-finite value is ``null``).
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, create_model

from fleetcare.collectors.contract import GpuSample

IsoTime = str
"""ISO-8601 UTC timestamp ending in 'Z', e.g. ``2026-01-31T12:00:00.250000Z``."""

RISK_DOC = (
    "Calibrated probability of a failure incident within the model's horizon "
    "(null when the scorer produced no finite value)."
)


def _telemetry_model() -> type[BaseModel]:
    hints = typing.get_type_hints(GpuSample)
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(GpuSample):
        if f.name == "ts":
            fields["ts"] = (IsoTime, Field(description="Sample time, ISO-8601 UTC ('Z')."))
        elif f.required:
            fields[f.name] = (hints[f.name], ...)
        else:
            fields[f.name] = (hints[f.name], None)
    return create_model(
        "Telemetry",
        __doc__="The latest sample of one GPU: every field of the data contract's "
        "GpuSample, in contract order. A counter the GPU does not support is null.",
        **fields,
    )


Telemetry = _telemetry_model()


class Health(BaseModel):
    status: str = Field(description="'ok' when the database answers, else 'error'.")
    db: str = Field(description="'ok', or the database error.")
    latest_telemetry: IsoTime | None = Field(description="Newest telemetry sample.")
    latest_score: IsoTime | None = Field(description="Newest node score.")
    score_age_s: float | None = Field(
        default=None, description="Seconds since the newest node score (staleness of /v1/risk)."
    )


class NodeRisk(BaseModel):
    node: str
    risk: float | None = Field(description=RISK_DOC)
    reasons: list[str] = Field(description="Why, as sentences a human can check.")
    top_gpu_uuid: str | None = Field(description="The GPU contributing most to the risk.")
    scored_at: IsoTime = Field(description="When this score was computed.")
    model_id: str | None


class RiskList(BaseModel):
    nodes: list[NodeRisk] = Field(description="Latest score per node, highest risk first.")
    simulated: bool = Field(description="True when the data came from the simulator.")
    scored_at: IsoTime | None = Field(description="Newest score in the fleet.")


class GpuDetail(BaseModel):
    gpu_uuid: str
    gpu_index: int | None
    model: str | None
    risk: float | None = Field(description=RISK_DOC)
    reasons: list[str]
    scored_at: IsoTime | None
    telemetry: Telemetry | None = Field(  # type: ignore[valid-type]
        description="The GPU's latest sample (null if it never reported)."
    )


class NodeDetail(BaseModel):
    node: str
    risk: float | None = Field(description=RISK_DOC)
    reasons: list[str]
    top_gpu_uuid: str | None
    scored_at: IsoTime | None = Field(description="Null when the node was never scored.")
    model_id: str | None
    simulated: bool
    gpus: list[GpuDetail] = Field(description="Every GPU of the node, by gpu_index.")


class ModelInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_id: str
    created_at: IsoTime | None
    horizon_h: float | None = Field(description="Prediction horizon H in hours.")
    features: Any = Field(description="The model's features (JSON, as registered).")
    params: Any = Field(description="Hyperparameters (JSON, as registered).")
    metrics: Any = Field(description="Evaluation metrics on held-out future data (JSON).")


class ErrorDetail(BaseModel):
    detail: str
