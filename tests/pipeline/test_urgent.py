"""What in a landed batch rescores its node at once (issue 16 §4)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    Batch,
    NicSample,
    XidEvent,
    encode_batch,
)
from fleetcare.pipeline.urgent import UrgentSignals
from fleetcare.pipeline.wire_columns import RAW_BATCH, WIRE_BATCH
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def batch(node: str = "node-00001", **kw) -> Batch:
    return Batch(schema_version=SCHEMA_VERSION, node=node, seq=0, sent_at=T0, **kw)


def xid(x: int, node: str = "node-00001") -> XidEvent:
    return XidEvent(ts=T0, node=node, xid=x, message="m", source="kernel-log")


def test_warning_and_fatal_hardware_xids_are_urgent_info_and_application_ones_are_not():
    u = UrgentSignals()
    assert u.observe([batch(events=[xid(119)])]) == {"node-00001"}  # GSP timeout
    assert "XID 119" in u.why["node-00001"]
    assert u.observe([batch(node="n2", events=[xid(48, "n2")])]) == {"n2"}  # DBE, fatal
    assert u.observe([batch(events=[xid(94)])]) == {"node-00001"}  # contained ECC: warning
    assert u.observe([batch(events=[xid(13)])]) == set()  # a job's own fault (application)
    assert u.observe([batch(events=[xid(63)])]) == set()  # row remap recorded: info


def test_a_new_uncorrectable_error_is_urgent_an_old_count_is_not():
    u = UrgentSignals()
    first = sample(ts=T0, gpu_uuid="GPU-1", ecc_uncorrected_volatile=3)
    assert u.observe([batch(samples=[first])]) == set()  # the baseline: not news
    same = sample(ts=T0 + dt.timedelta(minutes=1), gpu_uuid="GPU-1", ecc_uncorrected_volatile=3)
    assert u.observe([batch(samples=[same])]) == set()
    more = sample(ts=T0 + dt.timedelta(minutes=2), gpu_uuid="GPU-1", ecc_uncorrected_volatile=4)
    assert u.observe([batch(samples=[more])]) == {"node-00001"}
    assert u.why["node-00001"].startswith("new uncorrectable error on GPU")
    reset = sample(ts=T0 + dt.timedelta(minutes=3), gpu_uuid="GPU-1", ecc_uncorrected_volatile=0)
    assert u.observe([batch(samples=[reset])]) == set()  # a driver reload re-baselines
    rows = sample(ts=T0 + dt.timedelta(minutes=4), gpu_uuid="GPU-1", ecc_uncorrected_volatile=0,
                  remapped_rows_uncorrectable=1)
    assert u.observe([batch(samples=[rows])]) == {"node-00001"}


def test_links_going_down_are_urgent():
    u = UrgentSignals()
    up = sample(ts=T0, gpu_uuid="GPU-1", nvlink_up=[True] * 4)
    down = sample(ts=T0 + dt.timedelta(minutes=1), gpu_uuid="GPU-1",
                  nvlink_up=[True, False, True, True])
    assert u.observe([batch(samples=[up])]) == set()
    assert u.observe([batch(samples=[down])]) == {"node-00001"}
    assert "NVLink 1" in u.why["node-00001"]
    assert u.observe([batch(samples=[down])]) == set()  # still down: not new

    def port(state: str, minute: int) -> NicSample:
        return NicSample(ts=T0 + dt.timedelta(minutes=minute), node="node-00001",
                         device="mlx5_0", port=1, state=state)

    assert u.observe([batch(nics=[port("ACTIVE", 0)])]) == set()
    assert u.observe([batch(nics=[port("DOWN", 1)])]) == {"node-00001"}
    assert "mlx5_0 port 1 left ACTIVE" in u.why["node-00001"]


@pytest.mark.parametrize("decoder", [RAW_BATCH, WIRE_BATCH], ids=["samples", "lists"])
def test_signals_are_seen_in_batches_as_ingest_decodes_msgpack(decoder):
    """Ingest hands the hook what it decoded: from msgpack, samples still their bytes
    (``RawBatch``; ``WireBatch``: NVLink lists still bytes)."""
    u = UrgentSignals()
    up = sample(ts=T0, gpu_uuid="GPU-1", nvlink_up=[True] * 4)
    down = sample(ts=T0 + dt.timedelta(minutes=1), gpu_uuid="GPU-1",
                  nvlink_up=[True, True, False, True])
    ue = sample(ts=T0 + dt.timedelta(minutes=2), gpu_uuid="GPU-1",
                nvlink_up=[True, True, False, True], ecc_uncorrected_volatile=1)

    def wire(b: Batch) -> object:
        return decoder.decode(encode_batch(b))

    assert u.observe([wire(batch(samples=[up]))]) == set()
    assert u.observe([wire(batch(samples=[down]))]) == {"node-00001"}
    assert "NVLink 2" in u.why["node-00001"]
    assert u.observe([wire(batch(samples=[ue]))]) == {"node-00001"}
    assert "new uncorrectable error on GPU" in u.why["node-00001"]
