"""Reading the NVLink lists of a poll straight from their msgpack bytes
(``wire_columns``): the same columns the strict decoder and Arrow give, for every
integer width msgpack has; anything else named as slow, and the validator's rejection of
a bad list exactly what it was with the strict decoder."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcare.collectors.contract import Batch, GpuSample
from fleetcare.collectors.transport import Record
from fleetcare.pipeline.schema import NVLINK_LISTS, SAMPLE_SCHEMA
from fleetcare.pipeline.validate import Validator
from fleetcare.pipeline.wire_columns import (
    WIRE_BATCH,
    LinkColumns,
    as_list,
    as_sample,
    full_batch,
    link_columns,
)
from tests.property import DERANDOMIZE, examples

NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
NODE = "node-007"
# every msgpack integer width, both signs, and the edges of each
EDGES = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1,
         -1, -32, -33, -128, -129, -32_768, -32_769, -(2**31), -(2**31) - 1, -(2**63)]
COUNTS = st.one_of(st.sampled_from(EDGES), st.integers(-(2**63), 2**63 - 1),
                   st.integers(0, 200))


def sample(i: int, **lists: Any) -> GpuSample:
    return GpuSample(ts=NOW, node=NODE, gpu_uuid=f"GPU-{i}", gpu_index=i % 8,
                     pci_bus_id="00000000:18:00.0", model="NVIDIA H100 80GB HBM3",
                     gpu_temp_c=60.0, **lists)


def wire(samples: list[GpuSample]) -> list[Any]:
    batch = Batch(schema_version=1, node=NODE, seq=1, sent_at=NOW, samples=samples)
    return list(WIRE_BATCH.decode(msgspec.msgpack.encode(batch)).samples)


def columns(samples: list[Any]) -> dict[str, tuple[Any, ...]]:
    return {name: tuple(getattr(s, name) for s in samples) for name in NVLINK_LISTS}


@st.composite
def link_lists(draw: st.DrawFn) -> list[GpuSample]:
    out = []
    for i in range(draw(st.integers(1, 10))):
        width = draw(st.sampled_from([18, 18, 12, 4, 0, 16, 17, 40]))
        lists: dict[str, Any] = {}
        for name in NVLINK_LISTS:
            if draw(st.integers(0, 9)) == 0:
                continue  # absent: null
            item = st.booleans() if name == "nvlink_up" else COUNTS
            lists[name] = draw(st.lists(item, min_size=width, max_size=width))
        out.append(sample(i, **lists))
    return out


@settings(max_examples=examples(250), deadline=None, database=None,
          derandomize=DERANDOMIZE)
@given(link_lists())
def test_the_columns_are_what_the_strict_decoder_and_arrow_give(samples):
    got = link_columns(columns(wire(samples)))
    assert isinstance(got, LinkColumns)
    for name in NVLINK_LISTS:
        expected = pa.array([getattr(s, name) for s in samples],
                            type=SAMPLE_SCHEMA.field(name).type)
        assert got.arrays[name].equals(expected), name
        lengths = [len(v) if v is not None else None for v in expected.to_pylist()]
        assert [None if c != c else int(c) for c in got.counts[name]] == lengths
        flat = [x for v in expected.to_pylist() if v for x in v]
        assert got.values[name].tolist() == flat
        every = got.values[name] == got.values[name]
        assert got.rows(name, every).tolist() == sorted(
            {i for i, n in enumerate(lengths) if n})


def test_each_width_is_read_exactly_also_where_the_list_holds_them_all():
    ints = EDGES[:18] + [0] * (18 - len(EDGES[:18]))
    samples = [sample(0, nvlink_up=[True, False] * 9, nvlink_crc_flit=ints,
                      nvlink_crc_data=EDGES[3:], nvlink_replay=[5] * 18,
                      nvlink_recovery=[-5] * 18),
               sample(1)]  # a sample without NVLink: every list null
    got = link_columns(columns(wire(samples)))
    assert isinstance(got, LinkColumns)
    assert got.arrays["nvlink_crc_flit"].to_pylist() == [ints, None]
    assert got.arrays["nvlink_crc_data"].to_pylist() == [EDGES[3:], None]
    assert got.arrays["nvlink_up"].to_pylist() == [[True, False] * 9, None]
    assert got.arrays["nvlink_recovery"].to_pylist() == [[-5] * 18, None]


def test_a_poll_without_samples_has_empty_columns():
    got = link_columns({name: () for name in NVLINK_LISTS})
    assert isinstance(got, LinkColumns)
    assert all(len(a) == 0 for a in got.arrays.values())


def test_a_counter_past_int64_is_slow_and_decodes_strictly():
    samples = [sample(0, nvlink_crc_flit=[1] * 4), sample(1, nvlink_crc_flit=[2**64 - 1, 0])]
    got = link_columns(columns(wire(samples)))
    assert got == {1}
    assert as_list("nvlink_crc_flit", columns(wire(samples))["nvlink_crc_flit"][1]) == [
        2**64 - 1, 0]


def raw_batch(crc: Any, field: str = "nvlink_crc_flit") -> bytes:
    """A msgpack batch of two samples, the second with ``crc`` as ``field``."""
    good = msgspec.to_builtins(sample(0, nvlink_crc_flit=[0, 1]))
    bad = {**msgspec.to_builtins(sample(1)), field: crc}
    return msgspec.msgpack.encode({"schema_version": 1, "node": NODE, "seq": 3,
                                   "sent_at": NOW, "samples": [good, bad]})


def test_a_list_of_the_wrong_type_is_named_slow_and_as_list_says_why():
    for crc in ([0, 1.5], [0, "x"], [[0]], "0", {"a": 1}, [True], 7):
        decoded = WIRE_BATCH.decode(raw_batch(crc)).samples
        assert link_columns(columns(decoded)) == {1}, crc
        try:
            as_list("nvlink_crc_flit", decoded[1].nvlink_crc_flit)
        except msgspec.ValidationError as exc:
            assert "Expected" in str(exc), crc
        else:
            raise AssertionError(f"{crc!r} decoded as a counter list")
    # a wide integer sends every list down the item-by-item path; a bad item in the last
    # list of the buffer must not be read past
    for crc in ([300, 1.5, 0, 0, 0], [70_000, "abc", 1, 2], [2**40, None, 3]):
        decoded = WIRE_BATCH.decode(raw_batch(crc, "nvlink_recovery")).samples
        assert link_columns(columns(decoded)) == {1}, crc
    up = {**msgspec.to_builtins(sample(1)), "nvlink_up": [1, 0]}  # integers: not booleans
    raw = msgspec.msgpack.encode({"schema_version": 1, "node": NODE, "seq": 3,
                                  "sent_at": NOW, "samples": [up]})
    assert link_columns(columns(WIRE_BATCH.decode(raw).samples)) == {0}


def test_the_validator_rejects_a_bad_list_as_the_strict_decoder_did_and_keeps_the_rest():
    v = Validator(clock=lambda: NOW.timestamp())
    rec = Record(topic="fleetcare.telemetry", key=NODE, value=raw_batch([0, "x"]),
                 partition=0, offset=9)
    res = v.validate([rec])
    assert [r.code for r in res.rejections] == ["wrong_type"]
    assert res.rejections[0].source.endswith("#samples[1]")
    assert "nvlink_crc_flit" in res.rejections[0].reason
    assert [s.gpu_uuid for b in res.batches for s in b.samples] == ["GPU-0"]
    assert res.batches[0].samples[0].nvlink_crc_flit == [0, 1]
    assert res.sample_table is not None and res.sample_table.num_rows == 1
    # a clean poll keeps what it decoded (lists still bytes) and its table
    clean = v.validate([Record(topic="fleetcare.telemetry", key=NODE,
                               value=raw_batch([4, 5]), partition=0, offset=10)])
    assert not clean.rejections and clean.sample_table is not None
    assert clean.sample_table.column("nvlink_crc_flit").to_pylist() == [[0, 1], [4, 5]]
    assert full_batch(clean.landing[0]) == clean.batches[0]
    assert as_sample(clean.landing[0].samples[1]).nvlink_crc_flit == [4, 5]
