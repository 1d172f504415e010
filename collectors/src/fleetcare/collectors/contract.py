"""The fleetcare data contract: every record type, its wire format and its version.

Records are born on the GPU node, so the contract lives here; the pipeline derives its
DuckDB DDL and Arrow schema from these structs, the API its JSON models.

- ``GpuSample``  one per GPU per tick: identity, metrics (units in the names) and the
  reliability counters. A counter the GPU does not support is ``None``, never 0.
- ``XidEvent``   one per XID seen (NVML event set, kernel log, or the simulator).
- ``Incident``   one per failure or operator action: the ground truth labels learn from.
- ``NicSample``  one per InfiniBand / RoCE port per tick (schema version 2): state, rate
  and the port's error counters (``NIC_COUNTER_BITS``: the legacy ones saturate).
- ``Batch``      the per-node envelope that travels on the bus, with ``schema_version``.

Versions: 1 = samples, events, incidents; 2 adds ``Batch.nics``. A producer writes the
lowest version that holds its batch (``batch_version``): a batch without NIC samples is
still version 1, so pipelines that predate version 2 keep taking GPU telemetry from new
agents, and refuse (quarantine, never drop silently) only the batches that carry NICs.

Wire formats: JSON and msgpack (``encode_batch`` / ``decode_batch``). Decoders accept
older schema versions and ignore unknown fields; garbage (also a value nested deeper than
the decoder's recursion limit) is rejected with a ``DecodeError`` that says what was wrong.

Numbers: integers are signed 64-bit downstream (DuckDB ``BIGINT``, Arrow ``int64``:
counter deltas are differences, and Parquet and Arrow agree on it). NVML and DCGM counters
are unsigned 64-bit, but no GPU counts to 2**63: the values up there are sentinels —
DCGM's blanks start at ``DCGM_INT64_BLANK`` (2**63 - 16) and NVML's "not available" is
2**64 - 1. So an integer ``>= DCGM_INT64_BLANK``, or a float ``>= DCGM_FP64_BLANK``, is
never a measurement: producers send ``None`` instead, and ingest quarantines such a record
(``sentinel_value``) rather than store a sentinel as a count. Every integer below is
stored exactly.

Exceptions::

    ContractError
     └── DecodeError          (.reason, .raw)
          └── SchemaVersionError  (.version)
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

import msgspec

SCHEMA_VERSION = 2
"""Bump when a field is added; decoders accept every version <= this one.
1: samples, events, incidents. 2: ``Batch.nics`` (``NicSample``)."""
NIC_VERSION = 2
"""The first version whose batches carry ``nics``."""

DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
"""DCGM's integer "blank" (+1 not found, +2 not supported, +3 no permission; DCGM's own
``DCGM_INT64_IS_BLANK`` is ``value >= DCGM_INT64_BLANK``): no integer of a record reaches it."""
DCGM_FP64_BLANK = 140737488355328.0
"""DCGM's float "blank" (2**47; +1.0, +2.0, +3.0 as for integers): no float reaches it."""
DCGM_INT32_BLANK = 0x7FFFFFF0
"""DCGM's 32-bit "blank" (a field DCGM keeps as int32, converted by dcgm-exporter)."""

WireFormat = Literal["json", "msgpack"]
XidSource = Literal["nvml", "kernel-log", "dcgm", "sim"]
UtcTime = Annotated[dt.datetime, msgspec.Meta(tz=True)]
"""A timezone-aware timestamp; naive datetimes are rejected on decode."""


class ContractError(Exception):
    """Base of every error of the data contract."""


class DecodeError(ContractError):
    """Bytes that are not a valid record. ``reason`` says why, ``raw`` keeps the bytes."""

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class SchemaVersionError(DecodeError):
    """A batch from a newer agent than this decoder knows."""

    def __init__(self, version: int, raw: bytes = b"") -> None:
        super().__init__(
            f"schema_version {version} is newer than this decoder's {SCHEMA_VERSION}: "
            "upgrade the fleetcare pipeline before the agents",
            raw,
        )
        self.version = version


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU at one tick. Field order is the column order downstream."""

    ts: UtcTime
    node: str
    gpu_uuid: str
    gpu_index: int
    pci_bus_id: str
    model: str
    # -- load, thermals, power, clocks, memory
    gpu_temp_c: float | None = None
    mem_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    fb_used_mib: int | None = None
    fb_total_mib: int | None = None
    # -- ECC error counts (NVML_MEMORY_ERROR_TYPE_* x NVML_VOLATILE/AGGREGATE_ECC)
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    # -- page retirement (pre-Ampere) and row remapping (Ampere and later)
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # -- PCIe
    pcie_replay_count: int | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    # -- NVLink, one entry per link (index = link id)
    nvlink_up: list[bool] | None = None
    nvlink_crc_flit: list[int] | None = None
    nvlink_crc_data: list[int] | None = None
    nvlink_replay: list[int] | None = None
    nvlink_recovery: list[int] | None = None
    # -- clock-event (throttle) reasons, nvmlClocksEventReason* bit mask
    clock_event_reasons: int | None = None


class XidEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One XID. ``xid`` is None only for messages that carry no number."""

    ts: UtcTime
    node: str
    xid: int | None
    message: str
    source: XidSource
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    pci_bus_id: str | None = None
    pid: int | None = None
    process: str | None = None


class Incident(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A failure or an operator action on a node (and GPU, when one is to blame).

    ``kind`` is ``failure`` for what interrupts jobs; ``repair``/``rma`` record the fix.
    ``cause`` uses the snake_case names of Llama 3's Table 5 (see ``CAUSES``);
    ``mode`` the failure mechanism (``hbm``, ``thermal``, ``nvlink``, ``pcie``, ``gsp``,
    ``sram``, ``none`` for no GPU-visible precursor).
    """

    ts: UtcTime
    node: str
    kind: Literal["failure", "repair", "rma"]
    cause: str
    source: str
    gpu_uuid: str | None = None
    mode: str | None = None
    xid: int | None = None
    note: str | None = None


NIC_COUNTER_BITS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
"""The legacy PMA PortCounters a ``NicSample`` carries, with their width in bits (the IBA
PortCounters attribute, as the kernel's ``drivers/infiniband/core/sysfs.c`` declares them
with ``PORT_PMA_ATTR(name, counter, width, offset)``). They *saturate*: at
``2**bits - 1`` a counter stops, so a flat line there is not a healthy port
(``NicSample.saturated``)."""


def nic_counter_max(name: str) -> int:
    """The value at which the legacy counter ``name`` sticks (``2**bits - 1``)."""
    return (1 << NIC_COUNTER_BITS[name]) - 1


class NicSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One InfiniBand / RoCE port at one tick (``/sys/class/infiniband/<device>/ports/<port>``).

    ``state`` and ``phys_state`` are the names of the sysfs values (``"4: ACTIVE"`` ->
    ``ACTIVE``, ``"5: LinkUp"`` -> ``LinkUp``); ``rate_gbps`` the number of ``rate``
    (``"400 Gb/sec (4X NDR)"`` -> 400.0). A counter the port does not report (a missing
    file, ``N/A (no PMA)``, an unreadable file) is ``None``, never 0. ``saturated`` names
    the counters that read their maximum (``NIC_COUNTER_BITS``): they no longer count.
    ``hw_counter_names`` / ``hw_counter_values`` are the driver's ``hw_counters`` (mlx5:
    ``out_of_buffer``, ``local_ack_timeout_err``, ...), one entry per file, same order.
    """

    ts: UtcTime
    node: str
    device: str
    port: int
    link_layer: str | None = None
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    # -- legacy PMA PortCounters (NIC_COUNTER_BITS)
    symbol_error: int | None = None
    link_error_recovery: int | None = None
    link_downed: int | None = None
    port_rcv_errors: int | None = None
    port_rcv_remote_physical_errors: int | None = None
    port_rcv_switch_relay_errors: int | None = None
    port_xmit_discards: int | None = None
    local_link_integrity_errors: int | None = None
    excessive_buffer_overrun_errors: int | None = None
    saturated: list[str] | None = None
    # -- the driver's hw_counters, where it has them
    hw_counter_names: list[str] | None = None
    hw_counter_values: list[int] | None = None


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """What one node sends in one message. ``seq`` increases per node, per agent run."""

    schema_version: int
    node: str
    seq: int
    sent_at: UtcTime
    samples: list[GpuSample] = []
    events: list[XidEvent] = []
    incidents: list[Incident] = []
    nics: list[NicSample] = []  # version 2


def batch_version(nics: bool) -> int:
    """The schema version a producer writes: the lowest that holds the batch (1 unless it
    carries NIC samples), so pipelines older than version 2 still take GPU telemetry."""
    return NIC_VERSION if nics else 1


def saturated_counters(sample: NicSample) -> list[str]:
    """The legacy counters of ``sample`` that read their maximum (they stopped counting)."""
    return [name for name in NIC_COUNTER_BITS
            if getattr(sample, name) == nic_counter_max(name)]


# Table 5 of the Llama 3 paper (arXiv 2407.21783): unexpected interruptions by cause.
# Values: (count in the 54-day, 16,384-GPU run, whether the GPU is to blame).
CAUSES: dict[str, tuple[int, bool]] = {
    "faulty_gpu": (148, True),
    "gpu_hbm3_memory": (72, True),
    "software_bug": (54, False),
    "network_switch_cable": (35, False),
    "host_maintenance": (32, False),
    "gpu_sram_memory": (19, True),
    "gpu_system_processor": (17, True),
    "nic": (7, False),
    "nccl_watchdog_timeout": (7, False),
    "silent_data_corruption": (6, True),
    "gpu_thermal_interface_sensor": (6, True),
    "ssd": (3, False),
    "power_supply": (3, False),
    "server_chassis": (2, False),
    "io_expansion_board": (2, False),
    "dependency": (2, False),
    "cpu": (2, False),
    "system_memory": (2, False),
}

_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
_json_batch = msgspec.json.Decoder(Batch)
_msgpack_batch = msgspec.msgpack.Decoder(Batch)


class _Version(msgspec.Struct):
    schema_version: int


_json_version = msgspec.json.Decoder(_Version)
_msgpack_version = msgspec.msgpack.Decoder(_Version)


def utc(ts: dt.datetime) -> dt.datetime:
    """``ts`` as an aware UTC datetime (naive values are taken to be UTC)."""
    if ts.tzinfo is None:
        return ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC)


def encode_batch(batch: Batch, fmt: WireFormat = "msgpack") -> bytes:
    if fmt == "json":
        return _json_encoder.encode(batch)
    if fmt == "msgpack":
        return _msgpack_encoder.encode(batch)
    raise ValueError(f"wire format {fmt!r} is not one of 'json', 'msgpack'")


def decode_batch(raw: bytes, fmt: WireFormat | None = None) -> Batch:
    """Decode one batch, sniffing the format when ``fmt`` is None (JSON starts with '{').

    Raises ``DecodeError`` (with the reason and the raw bytes) for anything that is not a
    valid batch, and ``SchemaVersionError`` for a version newer than ``SCHEMA_VERSION``.
    """
    if fmt is None:
        fmt = "json" if raw[:1] in (b"{", b" ", b"\n") else "msgpack"
    dec, ver = (
        (_json_batch, _json_version) if fmt == "json" else (_msgpack_batch, _msgpack_version)
    )
    try:  # one pass for a good batch; the version alone only to say why one is not
        batch = dec.decode(raw)
    except RecursionError:
        raise DecodeError(f"invalid batch ({fmt}): {TOO_DEEP}", raw) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _check_version(ver, raw, fmt)
        raise DecodeError(f"invalid batch ({fmt}): {exc}", raw) from exc
    _check_version_number(batch.schema_version, raw)
    return batch


TOO_DEEP = ("a value is nested deeper than the decoder allows (its recursion limit): no "
            "fleetcare record nests more than three levels")


def _check_version(ver: Any, raw: bytes, fmt: str) -> None:
    try:
        version = ver.decode(raw).schema_version
    except RecursionError:
        raise DecodeError(f"not a fleetcare batch ({fmt}): {TOO_DEEP}", raw) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"not a fleetcare batch ({fmt}): {exc}", raw) from exc
    _check_version_number(version, raw)


def _check_version_number(version: int, raw: bytes) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(version, raw)
    if version < 1:
        raise DecodeError(f"schema_version {version} is not a valid version (>= 1)", raw)


def null_sentinels(sample: GpuSample) -> GpuSample:
    """``sample`` with every "no value" sentinel made ``None``: an integer from
    ``DCGM_INT64_BLANK`` up (DCGM's blanks, NVML's 2**64-1), a float from ``DCGM_FP64_BLANK``
    up, and an integer list holding one (a list cannot hold a null, and a made-up entry would
    read as a count). Backends apply it to what they read; ingest refuses a sentinel that
    another producer sends."""
    changes: dict[str, Any] = {}
    for f, value in zip(msgspec.structs.fields(sample), msgspec.structs.astuple(sample),
                        strict=True):
        if value is None or isinstance(value, bool | str | dt.datetime):
            continue
        if isinstance(value, list):
            if value and not isinstance(value[0], bool) and max(value) >= DCGM_INT64_BLANK:
                changes[f.name] = None
        elif value >= (DCGM_INT64_BLANK if isinstance(value, int) else DCGM_FP64_BLANK):
            changes[f.name] = None
    return msgspec.structs.replace(sample, **changes) if changes else sample


def nic_fields() -> tuple[msgspec.structs.FieldInfo, ...]:
    """The ``NicSample`` fields, in column order."""
    return msgspec.structs.fields(NicSample)


def sample_fields() -> tuple[msgspec.structs.FieldInfo, ...]:
    """The ``GpuSample`` fields with their types, in column order (for DDL and Arrow)."""
    return msgspec.structs.fields(GpuSample)
