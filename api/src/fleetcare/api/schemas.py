"""The JSON the API returns, as pydantic models (they make the OpenAPI spec useful).

``Telemetry`` is generated from the data contract (``GpuSample``), never retyped: a field
added to the contract appears in the API and its spec. Timestamps are ISO-8601 UTC
strings ending in ``Z``; numbers are never NaN (a non-finite value is ``null``).
"""

from __future__ import annotations

import datetime as dt
import typing
from typing import Annotated, Any, Literal, TypeAlias

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model, field_validator

from fleetcare.collectors.contract import CAUSES, GpuSample
from fleetcare.pipeline.limits import OPERATOR_CAUSES, Limits

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


LABELS_DOC = "The node's labels (operator configuration, e.g. partition, rack)."


class NodeRisk(BaseModel):
    node: str
    risk: float | None = Field(description=RISK_DOC)
    reasons: list[str] = Field(description="Why, as sentences a human can check.")
    top_gpu_uuid: str | None = Field(description="The GPU contributing most to the risk.")
    scored_at: IsoTime = Field(description="When this score was computed.")
    model_id: str | None
    labels: dict[str, str] = Field(default_factory=dict, description=LABELS_DOC)


class RiskList(BaseModel):
    nodes: list[NodeRisk] = Field(description="Latest score per node, highest risk first.")
    simulated: bool = Field(description="True when the data came from the simulator.")
    scored_at: IsoTime | None = Field(description="Newest score in the fleet.")
    total: int = Field(description="Nodes matching the filters, over all pages.")
    next: str | None = Field(
        description="Path and query of the next page (same filters), null on the last.")


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


class NicPort(BaseModel):
    """One InfiniBand/RoCE port of the node (agent ``--backend infiniband``)."""

    device: str = Field(description="e.g. mlx5_0.")
    port: int
    ts: IsoTime = Field(description="Its newest sample.")
    link_layer: str | None = Field(description="InfiniBand or Ethernet (RoCE).")
    state: str | None = Field(description="ACTIVE, DOWN, INIT, ... (null: unreadable).")
    phys_state: str | None
    rate_gbps: float | None
    counters: dict[str, int | None] = Field(
        description="The legacy port counters as read (null: not reported, e.g. no PMA).")
    saturated: list[str] = Field(
        description="Counters stuck at their width's maximum: they no longer count.")
    flaps_24h: int | None = Field(
        description="Link flaps (ACTIVE left, or link_downed rose) in the 24 h before the "
        "newest sample (null: not rolled up yet).")
    link_downed_24h: int | None
    symbol_error_24h: int | None


class NodeDetail(BaseModel):
    node: str
    risk: float | None = Field(description=RISK_DOC)
    reasons: list[str]
    top_gpu_uuid: str | None
    scored_at: IsoTime | None = Field(description="Null when the node was never scored.")
    model_id: str | None
    simulated: bool
    labels: dict[str, str] = Field(description=LABELS_DOC)
    gpus: list[GpuDetail] = Field(description="Every GPU of the node, by gpu_index.")
    nics: list[NicPort] = Field(
        default_factory=list, description="Its InfiniBand/RoCE ports reporting in the hour "
        "before the node's newest port sample (empty: the agent reads no NIC).")


class Point(BaseModel):
    t: IsoTime = Field(description="The hour's start.")
    v: float | None = Field(description="The signal's value for that hour (null: not "
                            "reported, e.g. a counter the GPU does not support).")


class SignalInfo(BaseModel):
    name: str
    label: str
    unit: str


class GpuHistory(BaseModel):
    gpu_uuid: str
    gpu_index: int | None
    model: str | None
    series: dict[str, list[Point]] = Field(description="Per signal name, hourly points.")


class MedianHistory(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str = Field(description="The GPU model whose GPUs the median is over.")
    series: dict[str, list[Point]] = Field(description="Per signal name, the hourly median "
                                           "over every GPU of this model that reported.")


class NodeHistory(BaseModel):
    """The hourly history of a node's signals against the fleet median of its GPU model."""

    node: str
    since: IsoTime
    until: IsoTime = Field(description="End of the newest hour (exclusive).")
    step_s: int
    simulated: bool
    signals: list[SignalInfo]
    gpus: list[GpuHistory]
    fleet_median: list[MedianHistory]


class GpuInfo(GpuDetail):
    """One GPU, found by UUID: its score, latest sample and node."""

    node: str
    model_id: str | None
    simulated: bool


class ModelInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_id: str
    created_at: IsoTime | None
    origin: str = Field("fleet", description="fleet: trained on this fleet's data; prior: "
                        "the fleet prior shipped with fleetcare (simulated fleets).")
    current_reason: str | None = Field(None, description="Why this model scores.")
    horizon_h: float | None = Field(description="Prediction horizon H in hours.")
    features: Any = Field(description="The model's features (JSON, as registered).")
    params: Any = Field(description="Hyperparameters (JSON, as registered).")
    metrics: Any = Field(description="Evaluation metrics on held-out future data (JSON).")


class ErrorDetail(BaseModel):
    detail: str


# -- node labels -----------------------------------------------------------------------------
LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$"
LABEL_VALUE = r"^[A-Za-z0-9_.\-/:@+=,]{0,128}$"
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE)]


class NodeLabels(BaseModel):
    model_config = ConfigDict(extra="forbid")

    labels: dict[LabelKey, LabelValue] = Field(
        max_length=64,
        description="The node's complete label set (replaces the old one; {} clears it). "
        "Keys: letters, digits, '_', '.', '-', '/', at most 63; values at most 128. "
        "'partition' is what GET /v1/risk?partition= filters on.",
        examples=[{"partition": "train-a", "rack": "r12"}],
        # keys that do not match the key pattern are invalid, as the validation says
        json_schema_extra={"additionalProperties": False})


class NodeLabelsOut(BaseModel):
    node: str
    labels: dict[str, str]


# -- incidents -------------------------------------------------------------------------------
_LIMITS = Limits()  # the string bounds ingest applies (fleetcare.pipeline.limits), one source
Name = Annotated[str, StringConstraints(min_length=1, max_length=_LIMITS.max_name_len,
                                        pattern=r"^[^\x00-\x1f\x7f]+$")]
# A cause is one of the contract's CAUSES (Llama 3's Table 5) or the operator causes ingest
# also accepts (``limits.OPERATOR_CAUSES``: unknown, other, ...): pydantic validates and
# documents the Literal built from it at run time. mypy cannot evaluate a Literal built
# at run time, so to mypy a cause is a str.
if typing.TYPE_CHECKING:
    Cause: TypeAlias = str
else:
    Cause = Literal.__getitem__((*CAUSES, *OPERATOR_CAUSES))


class IncidentIn(BaseModel):
    """A failure or repair reported by an operator or a scheduler (the data contract's
    ``Incident``): the labels the next model learns from."""

    model_config = ConfigDict(extra="forbid")

    ts: dt.datetime = Field(description="When it happened: ISO-8601 with a time zone "
                            "('Z' or an offset), e.g. 2026-03-01T14:05:00Z; at most "
                            f"{_LIMITS.max_age_s / 86400:g} days before and "
                            f"{_LIMITS.max_future_s:g} s after the server's clock, as ingest "
                            "accepts (older history: `fleetcare incident import`).")
    node: Name
    kind: Literal["failure", "repair", "rma"] = Field(
        description="'failure' interrupts jobs; 'repair'/'rma' record the fix.")
    cause: Cause = Field(description="Llama 3 Table 5 cause, e.g. faulty_gpu, gpu_hbm3_memory.")
    gpu_uuid: Name | None = Field(default=None, description="The GPU to blame, if one is.")
    mode: Name | None = Field(default=None,
                              description="hbm, thermal, nvlink, pcie, gsp, sram, none.")
    xid: int | None = Field(default=None, ge=0, le=65535)
    note: Annotated[str, StringConstraints(max_length=_LIMITS.max_text_len)] | None = None
    source: Name = Field(default="api", description="Who reports it (default 'api').")

    @field_validator("ts")
    @classmethod
    def _aware(cls, value: dt.datetime) -> dt.datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("ts has no time zone: add 'Z' or an offset, e.g. "
                             "2026-03-01T14:05:00Z")
        try:
            return value.astimezone(dt.UTC)
        except OverflowError:
            raise ValueError("ts is out of range once converted to UTC") from None

    @field_validator("note")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("note contains a NUL character")
        return value


class IncidentOut(BaseModel):
    ts: IsoTime
    node: str
    kind: str
    cause: str
    source: str
    gpu_uuid: str | None
    mode: str | None
    xid: int | None
    note: str | None
    created: bool = Field(description="False when the same incident (node, ts, kind, GPU, "
                          "cause) was already recorded: reporting twice is safe.")


# -- drains and alerts -----------------------------------------------------------------------
class CostModelOut(BaseModel):
    job_gpus: int
    checkpoint_interval_h: float
    restart_overhead_h: float
    drain_cost_gpu_h: float
    gpus_per_node: int
    crash_cost_gpu_h: float = Field(description="N·(Δ/2 + u0): what an unplanned crash costs.")
    break_even_risk: float = Field(description="Risk above which draining pays.")


class RepeatOffender(BaseModel):
    """A node that failed ``failures`` times in ``window_days`` (``fleetcare.models.offenders``)."""

    node: str
    failures: int = Field(description="Failures in the window (planned maintenance excepted).")
    window_days: int
    last_failure_ts: IsoTime
    last_cause: str
    last_gpu_uuid: str | None
    repaired_since: bool = Field(description="A repair or RMA recorded after the last failure.")
    repaired_at: IsoTime | None
    risk_7d: float | None = Field(description="The recurrence model's probability of failing "
                                  "again within 7 days, from incident history alone.")
    reasons: list[str]
    suggestion: str = Field(description="'burn-in before large jobs' or 'RMA / replace the "
                            "GPU' (two failures blamed one GPU, or three failures).")
    why: str = Field(description="Why that suggestion.")


class RepeatOffenders(BaseModel):
    offenders: list[RepeatOffender] = Field(description="Most failures first, then risk.")
    at: IsoTime
    failures: int
    days: int


class DrainCandidate(BaseModel):
    node: str
    risk: float = Field(description=RISK_DOC)
    expected_saving_gpu_h: float = Field(description="risk × crash cost, in GPU-hours.")
    drain_cost_gpu_h: float
    net_saving_gpu_h: float = Field(description="expected saving − drain cost (> 0).")
    reasons: list[str]
    top_gpu_uuid: str | None
    scored_at: IsoTime
    labels: dict[str, str] = Field(description=LABELS_DOC)
    repeat_offender: RepeatOffender | None = Field(
        None, description="Set when the node is a repeat offender, with the suggestion.")
    post_repair_risk: float | None = Field(
        None, description="A repeat offender back from repair: its recurrence risk over "
        "24 h; the decision used the higher of it and `risk`.")


class DrainCandidates(BaseModel):
    candidates: list[DrainCandidate] = Field(description="Highest net saving first.")
    cost_model: CostModelOut
    simulated: bool
    scored_at: IsoTime | None


# -- tokens ---------------------------------------------------------------------------------
class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Literal["read", "write", "admin"] = Field(
        description="read (schedulers, dashboards) < write (incident reports) < admin.")
    name: Annotated[str, StringConstraints(min_length=1, max_length=128,
                                           pattern=r"^[^\x00-\x1f\x7f]+$")] | None = Field(
        None, description="Who or what uses it, e.g. slurm-prolog.")


class TokenOut(BaseModel):
    id: str
    name: str | None
    scope: str
    created_at: IsoTime
    revoked_at: IsoTime | None


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token, shown this once (only its SHA-256 "
                       "is stored).")


class TokenList(BaseModel):
    tokens: list[TokenOut] = Field(description="Oldest first; values are never shown.")


# -- drains ---------------------------------------------------------------------------------
class HeldDrain(BaseModel):
    node: str
    scheduler: str = Field(description="slurm or kubernetes.")
    drained_at: IsoTime
    review_at: IsoTime = Field(description="When it escalates if nobody cleared it.")
    risk: float | None = Field(description="Node risk when it was drained.")
    reason: str | None = Field(description="The reason given to the scheduler.")
    cleared_at: IsoTime | None = Field(description="When an operator cleared it (it is "
                                       "resumed once its risk is low, or at once if forced).")
    cleared_by: str | None


class HeldDrains(BaseModel):
    drains: list[HeldDrain] = Field(description="Drains fleetcare holds, by node.")


class DrainClearIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field("", max_length=1000,
                      description="What was done (audited), e.g. 'reseated GPU 3'.")
    force: bool = Field(False, description="Resume now whatever the risk (after a repair "
                        "the model's 7-day windows still remember the old errors).")


class DrainDecision(BaseModel):
    node: str
    action: str = Field(description="clear, then resume when the node is resumed.")
    risk: float | None
    expected_saving_gpu_h: float | None
    reason: str
    result: str = Field(description="ok, dry-run, error: ... (as the audit log).")
    actor: str
    repeat_offender: RepeatOffender | None = Field(
        None, description="Set when the node is a repeat offender, with the suggestion.")
    post_repair_risk: float | None = Field(
        None, description="A repeat offender back from repair: its recurrence risk over the "
        "model's horizon; the drain decision used the higher of it and `risk`.")


class DrainClearOut(BaseModel):
    dry_run: bool = Field(description="The server's drain controller only audits.")
    decisions: list[DrainDecision]


class Alert(BaseModel):
    id: str | None
    node: str | None
    state: str | None = Field(description="e.g. firing, resolved (the alerts engine's).")
    risk: float | None = Field(description="Risk at the last evaluation.")
    started_at: IsoTime | None = Field(description="When risk first crossed the threshold.")
    fired_at: IsoTime | None = Field(description="When the alert fired (after N minutes).")
    resolved_at: IsoTime | None
    reasons: list[str]
    top_gpu_uuid: str | None
    model_id: str | None
    p_net: float | None = Field(
        None, description="The network head's probability of a network failure of the node "
        "at the last evaluation, where the model's operating point alarms on it (the fleet "
        "prior's); null otherwise.")


class AlertList(BaseModel):
    alerts: list[Alert] = Field(description="Newest first.")
