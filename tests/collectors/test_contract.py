from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from fleetcare.collectors.contract import (
    CAUSES,
    SCHEMA_VERSION,
    Batch,
    DecodeError,
    GpuSample,
    Incident,
    SchemaVersionError,
    XidEvent,
    decode_batch,
    encode_batch,
)

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def sample(**kw: object) -> GpuSample:
    base = dict(ts=T0, node="node-00001", gpu_uuid="GPU-aaaa", gpu_index=3,
                pci_bus_id="00000000:3B:00.0", model="H100", gpu_temp_c=61.5,
                ecc_corrected_volatile=7, remapped_rows_pending=False,
                nvlink_up=[True, True, False], nvlink_crc_flit=[0, 4, 9])
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


def batch(**kw: object) -> Batch:
    base = dict(schema_version=SCHEMA_VERSION, node="node-00001", seq=9, sent_at=T0,
                samples=[sample()],
                events=[XidEvent(ts=T0, node="node-00001", xid=79, message="GPU has fallen off the bus.",
                                 source="kernel-log", pci_bus_id="0000:3b:00", pid=None)],
                incidents=[Incident(ts=T0, node="node-00001", kind="failure",
                                    cause="faulty_gpu", source="sim", mode="pcie", xid=79)])
    base.update(kw)
    return Batch(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_round_trip_is_exact(fmt: str) -> None:
    b = batch()
    assert decode_batch(encode_batch(b, fmt), fmt) == b  # type: ignore[arg-type]
    assert decode_batch(encode_batch(b, fmt)) == b  # sniffed format


def test_unsupported_counter_stays_null_not_zero() -> None:
    s = decode_batch(encode_batch(batch(samples=[sample(ecc_corrected_volatile=None)]))).samples[0]
    assert s.ecc_corrected_volatile is None
    assert s.retired_pages_sbe is None


def test_unknown_fields_and_older_versions_are_accepted() -> None:
    raw = msgspec.json.encode(msgspec.to_builtins(batch()) | {"future_field": 1})
    assert decode_batch(raw).seq == 9
    sample_with_extra = msgspec.to_builtins(sample()) | {"hbm_voltage_mv": 1100}
    raw = msgspec.json.encode(msgspec.to_builtins(batch()) | {"samples": [sample_with_extra]})
    assert decode_batch(raw).samples[0].gpu_temp_c == 61.5


def test_newer_schema_version_is_rejected_with_the_fix() -> None:
    raw = msgspec.json.encode(msgspec.to_builtins(batch()) | {"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(SchemaVersionError) as err:
        decode_batch(raw)
    assert err.value.version == SCHEMA_VERSION + 1
    assert "upgrade the fleetcare pipeline" in str(err.value)
    assert err.value.raw == raw


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"\x00\x01garbage", "not a fleetcare batch"),
        (b"{not json", "not a fleetcare batch"),
        (b'{"schema_version": "one"}', "not a fleetcare batch"),
        (b'{"schema_version": 0, "node": "n", "seq": 1, "sent_at": "2026-01-01T00:00:00Z"}',
         "not a valid version"),
        (b'{"schema_version": 1, "node": "n", "seq": 1, "sent_at": "2026-01-01T00:00:00"}',
         "sent_at"),  # naive timestamp: the time zone is not known
        (b'{"schema_version": 1, "node": "n", "seq": 1, "sent_at": "2026-01-01T00:00:00Z",'
         b' "samples": [{"ts": "2026-01-01T00:00:00Z", "node": "n"}]}', "gpu_uuid"),
        (b'{"schema_version": 1, "node": "n", "seq": 1, "sent_at": "2026-01-01T00:00:00Z",'
         b' "samples": [{"ts": "2026-01-01T00:00:00Z", "node": "n", "gpu_uuid": "g",'
         b' "gpu_index": 0, "pci_bus_id": "p", "model": "H100", "gpu_temp_c": "hot"}]}',
         "gpu_temp_c"),
    ],
)
def test_garbage_is_rejected_with_a_reason(raw: bytes, needle: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode_batch(raw)
    assert needle in err.value.reason
    assert err.value.raw == raw


def test_causes_are_table_5() -> None:
    assert sum(n for n, _ in CAUSES.values()) == 419
    assert sum(n for n, gpu in CAUSES.values() if gpu) == 268
