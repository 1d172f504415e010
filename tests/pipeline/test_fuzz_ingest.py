"""Fuzzing the ingest path (issue 13): random and mutated bytes through the real
decode → validate → store code, for Kafka-shaped records and for the embedded bus.

Mutations of valid batches: truncation, bit flips, inserted junk, deep nesting, huge and
sentinel integers, wrong types, long strings, bad UTF-8, keys that are not UTF-8 or not the
batch's node, unknown topic bytes, and plain random bytes.

The property, for every poll:

- nothing raises;
- every record polled either lands (its batch, less its bad records) or is quarantined
  with a documented code and a reason, never both for a whole message and never twice;
- every unmutated valid batch lands exactly once, whole;
- the validator catches everything the store would refuse: no ``unstorable`` and no
  ``unexpected_error`` (either would be a hole in validation);
- the consumer's position is committed past every record.

``make test`` runs 10,000 examples of the Kafka-shaped property (derandomized, so a run is
repeatable) plus smaller runs of the embedded-bus and DuckDB properties;
``make fuzz`` runs many more with fresh randomness (``FLEETCARE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcare.collectors.contract import (
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    SCHEMA_VERSION,
    Batch,
    GpuSample,
    Incident,
    NicSample,
    XidEvent,
)
from fleetcare.collectors.transport import TELEMETRY_TOPIC, Record
from fleetcare.collectors.transport.embedded import EmbeddedConsumer
from fleetcare.collectors.transport.framing import HEADER_SIZE, SEGMENT_MAGIC, encode_frame
from fleetcare.collectors.transport.kafka import _record as kafka_record
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.lake import LakeWriter
from fleetcare.pipeline.schema import SAMPLE_SCHEMA
from fleetcare.pipeline.store import Store, flatten_batches, records_to_arrow
from fleetcare.pipeline.validate import CODES, ValidationResult, Validator, source_of
from fleetcare.pipeline.wire_columns import full_batch

FUZZ = "FLEETCARE_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FLEETCARE_FUZZ_EXAMPLES", "10000"))
SETTINGS = dict(deadline=None, database=None, derandomize=not FUZZ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
NOW = (T0 + dt.timedelta(hours=1)).timestamp()
NODE = "node-a"


# -- valid batches to start from ----------------------------------------------------------------
def _templates() -> list[Batch]:
    def s(i: int, **kw: Any) -> GpuSample:
        return GpuSample(ts=T0 + dt.timedelta(seconds=i), node=NODE, gpu_uuid=f"GPU-{i}",
                         gpu_index=i, pci_bus_id=f"00000000:{i:02x}:00.0", model="H100", **kw)

    full = dict(gpu_temp_c=61.5, mem_temp_c=70.0, power_w=400.0, power_limit_w=700.0,
                sm_clock_mhz=1980, mem_clock_mhz=2619, util_gpu_pct=99.0, util_mem_pct=40.0,
                fb_used_mib=1000, fb_total_mib=81559, ecc_corrected_volatile=3,
                ecc_uncorrected_volatile=0, ecc_corrected_aggregate=12,
                ecc_uncorrected_aggregate=0, retired_pages_sbe=0, retired_pages_dbe=0,
                retired_pages_pending=False, remapped_rows_correctable=1,
                remapped_rows_uncorrectable=0, remapped_rows_pending=False,
                remapped_rows_failure=False, pcie_replay_count=5, pcie_link_gen=5,
                pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16,
                nvlink_up=[True] * 4, nvlink_crc_flit=[0, 1, 2, 3], nvlink_crc_data=[0] * 4,
                nvlink_replay=[0] * 4, nvlink_recovery=[0] * 4, clock_event_reasons=4)
    ev = XidEvent(ts=T0, node=NODE, xid=79, message="GPU has fallen off the bus.",
                  source="kernel-log", gpu_uuid="GPU-0", gpu_index=0, pid=1234,
                  process="python")
    inc = Incident(ts=T0, node=NODE, kind="failure", cause="faulty_gpu", source="sim",
                   gpu_uuid="GPU-0", mode="pcie", xid=79, note="fuzz")
    nic = NicSample(ts=T0, node=NODE, device="mlx5_0", port=1, link_layer="InfiniBand",
                    state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, symbol_error=0,
                    link_error_recovery=0, link_downed=255, port_rcv_errors=3,
                    port_xmit_discards=65535, local_link_integrity_errors=0,
                    saturated=["link_downed", "port_xmit_discards"],
                    hw_counter_names=["out_of_buffer", "local_ack_timeout_err"],
                    hw_counter_values=[0, 3])
    b = Batch(schema_version=SCHEMA_VERSION, node=NODE, seq=1, sent_at=T0)
    return [msgspec.structs.replace(b, samples=[s(i, **full) for i in range(3)]),
            msgspec.structs.replace(b, seq=2, samples=[s(7)]),
            msgspec.structs.replace(b, seq=3, events=[ev], incidents=[inc]),
            msgspec.structs.replace(b, seq=4, nics=[nic])]


TEMPLATES = _templates()
ENCODED = [(fmt, b, msgspec.json.encode(b) if fmt == "json" else msgspec.msgpack.encode(b))
           for b in TEMPLATES for fmt in ("msgpack", "json")]
BUILTINS = [msgspec.to_builtins(b) for b in TEMPLATES]
HUGE_INTS = [2**63 - 1, 2**63, 2**64 - 1, DCGM_INT64_BLANK, DCGM_INT64_BLANK + 2,
             DCGM_INT64_BLANK - 1, -(2**63), -1, 0x7FFFFFF0, 10**18]
ODD_VALUES = ["x", "", " ", "\x00", "é" * 300, "x" * 5000, 1.5, float("nan"), float("inf"),
              DCGM_FP64_BLANK, -1e308, True, None, [], [1, "a"], {"k": 1}, 2**64 - 1, -5,
              "2026-03-01T00:00:00", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z"]
MUTATIONS = ("valid", "truncate", "bitflip", "insert", "deep", "deep_field", "huge_int",
             "odd_value", "bad_utf8", "random", "key")


def _encode(obj: Any, fmt: str) -> bytes:
    return msgspec.json.encode(obj) if fmt == "json" else msgspec.msgpack.encode(obj)


def _deep(fmt: str, depth: int) -> bytes:
    return (b"[" * depth + b"]" * depth) if fmt == "json" else b"\x91" * depth + b"\x90"


@st.composite
def message(draw: st.DrawFn) -> tuple[str, bytes, bytes, Batch | None]:
    """(mutation, key, value, the batch it must land as when unmutated)."""
    i = draw(st.integers(0, len(ENCODED) - 1))
    fmt, batch, raw = ENCODED[i]
    obj = BUILTINS[i // 2]
    kind = draw(st.sampled_from(MUTATIONS))
    key = NODE.encode()
    if kind == "valid":
        return kind, key, raw, batch
    if kind == "truncate":
        return kind, key, raw[:draw(st.integers(0, len(raw) - 1))], None
    if kind == "bitflip":
        at = draw(st.integers(0, len(raw) - 1))
        flipped = bytes([raw[at] ^ (1 << draw(st.integers(0, 7)))])
        return kind, key, raw[:at] + flipped + raw[at + 1:], None
    if kind == "insert":
        at = draw(st.integers(0, len(raw)))
        return kind, key, raw[:at] + draw(st.binary(min_size=1, max_size=16)) + raw[at:], None
    if kind == "deep":
        return kind, key, _deep(fmt, draw(st.sampled_from([64, 5_000, 200_000]))), None
    if kind == "random":
        return kind, key, draw(st.binary(max_size=256)), None
    if kind == "key":
        return kind, draw(st.binary(max_size=12)), raw, None
    mutated = msgspec.json.decode(msgspec.json.encode(obj))  # a deep copy
    section = draw(st.sampled_from([s for s in ("samples", "events", "incidents", "nics")
                                    if mutated[s]]))
    rec = mutated[section][draw(st.integers(0, len(mutated[section]) - 1))]
    name = draw(st.sampled_from(sorted(rec)))
    if kind == "deep_field":
        rec[name] = "@@DEEP@@"
        placeholder = _encode("@@DEEP@@", fmt)
        deep = _deep(fmt, draw(st.sampled_from([64, 5_000, 200_000])))
        return kind, key, _encode(mutated, fmt).replace(placeholder, deep, 1), None
    if kind == "huge_int":
        rec[name] = draw(st.sampled_from(HUGE_INTS))
        if isinstance(rec.get("nvlink_crc_flit"), list) and draw(st.booleans()):
            rec["nvlink_crc_flit"][0] = draw(st.sampled_from(HUGE_INTS))
        if isinstance(rec.get("hw_counter_values"), list) and draw(st.booleans()):
            rec["hw_counter_values"][0] = draw(st.sampled_from(HUGE_INTS))
    elif kind == "odd_value":
        rec[name] = draw(st.sampled_from(ODD_VALUES))
    else:  # bad_utf8: the node name's bytes replaced by bytes that are not UTF-8
        rec["node"] = "@@NODE@@"
        value = _encode(mutated, fmt).replace(b"@@NODE@@", b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8")
        return kind, key, value, None
    try:
        return kind, key, _encode(mutated, fmt), None
    except (ValueError, OverflowError, TypeError):  # JSON cannot carry NaN: send it raw
        return kind, key, _encode(mutated, "msgpack"), None


KafkaMessage = namedtuple("KafkaMessage", "topic partition offset key value")


def _kafka_records(messages: Sequence[tuple[str, bytes, bytes, Batch | None]]) -> list[Record]:
    """The records a KafkaConsumerSource makes of these messages (one partition)."""
    return [kafka_record(KafkaMessage(TELEMETRY_TOPIC, 0, off, key, value))
            for off, (_, key, value, _) in enumerate(messages)]


# -- the sink and the property ----------------------------------------------------------------------
class Consumer:
    def __init__(self, records: list[Record]) -> None:
        self.records, self.committed = records, -1

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        out, self.records = self.records, []
        return out

    def commit(self) -> None:
        self.committed = 1


class RecordingLake(LakeWriter):
    """The lake sink (real Arrow conversion with the contract's schema), remembering what
    it was given; ``reset`` drops the buffers between examples."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, worker_id="fuzz")
        self.inserted: list[Batch] = []
        self.rejected: list[Any] = []

    def insert_batches(self, batches: Any, **kw: Any) -> tuple[int, int, int]:
        batches = list(batches)
        counts = super().insert_batches(batches, **kw)
        self.inserted.extend(map(full_batch, batches))  # msgpack: NVLink lists as bytes
        return counts

    def quarantine_many(self, rows: Sequence[Any], **kw: Any) -> int:
        self.rejected.extend(rows)
        return super().quarantine_many(rows, **kw)

    def reset(self) -> None:
        self.inserted.clear()
        self.rejected.clear()
        for tables in self._buffer.values():
            tables.clear()
        self._quarantined.clear()


VALIDATOR = Validator(clock=lambda: NOW)


def check_property(records: list[Record], valid: dict[int, Batch], sink: Any) -> None:
    """The property of the module docstring. ``valid``: record index -> its batch, for
    the records that were not mutated."""
    expected: ValidationResult = VALIDATOR.validate(records)
    consumer = Consumer(list(records))
    result = Ingestor(sink, consumer, validator=VALIDATOR).run_once(0)  # must not raise
    assert consumer.committed == (1 if records else -1)
    assert result.records == len(records) and result.quarantined == len(expected.rejections)
    assert sink.inserted == expected.batches  # what was kept, landed, once
    if expected.sample_table is not None:  # the rows the sinks insert are those samples
        rows = records_to_arrow(flatten_batches(expected.batches)[0], SAMPLE_SCHEMA)
        assert repr(expected.sample_table.to_pylist()) == repr(rows.to_pylist())
    assert [r.source for r in sink.rejected] == [r.source for r in expected.rejections]
    sources = [source_of(r) for r in records]
    kept = [k.source for k in expected.kept]
    assert len(kept) == len(set(kept))
    whole = {r.source for r in expected.rejections if "#" not in r.source}
    parts = [r.source for r in expected.rejections if "#" in r.source]
    assert len(parts) == len(set(parts))
    for rej in expected.rejections:
        assert rej.code in CODES and rej.code not in ("unstorable", "unexpected_error"), rej
        assert rej.reason and isinstance(rej.raw, bytes)
        assert rej.source.split("#")[0] in sources
    for src in sources:
        assert (src in kept) + (src in whole) == 1 or any(
            p.startswith(src + "#") for p in parts), src  # landed or quarantined, never lost
        assert not (src in kept and src in whole)
    for i, batch in valid.items():
        assert sources[i] in kept and sources[i] not in whole
        assert expected.kept[kept.index(sources[i])].batch == batch
        assert not any(p.startswith(sources[i] + "#") for p in parts)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> RecordingLake:
    return RecordingLake(tmp_path_factory.mktemp("fuzz-lake"))


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(st.lists(message(), min_size=1, max_size=6))
def test_kafka_shaped_records_land_or_are_quarantined_once(
        lake: RecordingLake, messages: list[tuple[str, bytes, bytes, Batch | None]]) -> None:
    lake.reset()
    records = _kafka_records(messages)
    valid = {i: batch for i, (_, _, _, batch) in enumerate(messages) if batch is not None}
    check_property(records, valid, lake)


# -- the embedded bus: mutated segment bytes ----------------------------------------------------------
@st.composite
def segment(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int, Batch | None]]]:
    """A segment's bytes, and each frame that must come back whole: (start, end, batch)."""
    frames = []
    data = bytearray(SEGMENT_MAGIC)
    for _ in range(draw(st.integers(1, 5))):
        fmt, batch, raw = ENCODED[draw(st.integers(0, len(ENCODED) - 1))]
        topic = draw(st.sampled_from([0, 0, 0, 1, 7]))
        frame = encode_frame(topic, NODE.encode(), raw)
        frames.append((len(data), len(data) + len(frame), batch if topic < 2 else None))
        data += frame
    kind = draw(st.sampled_from(("none", "truncate", "bitflip", "insert", "zeros")))
    lo = len(SEGMENT_MAGIC)  # the segment's own magic is not mutated (see below)
    if kind == "truncate":
        cut = draw(st.integers(lo, len(data) - 1))
        del data[cut:]
        frames = [f for f in frames if f[1] <= cut]
    elif kind == "bitflip":
        at = draw(st.integers(lo, len(data) - 1))
        data[at] ^= 1 << draw(st.integers(0, 7))
        frames = [f for f in frames if not f[0] <= at < f[1]]
    elif kind in ("insert", "zeros"):
        at = draw(st.integers(lo, len(data)))
        junk = (draw(st.binary(min_size=1, max_size=HEADER_SIZE * 2)) if kind == "insert"
                else bytes(draw(st.integers(1, 64))))
        data[at:at] = junk
        frames = [(s, e, b) if e <= at else (s + len(junk), e + len(junk), b)
                  for s, e, b in frames if not s < at < e]
    return bytes(data), frames


@settings(max_examples=max(200, EXAMPLES // 5), **SETTINGS)
@given(segment())
def test_embedded_bus_segments_resynchronise_and_lose_nothing_intact(
        lake: RecordingLake, seg: tuple[bytes, list[tuple[int, int, Batch | None]]]) -> None:
    """Every frame the mutation did not touch comes back whole, once, in order; the bytes
    in between come back as torn/corrupt records; together they cover the segment.
    (The segment's first 8 bytes, its magic, are not mutated: without them it would be
    read as a segment written before framing.)"""
    data, intact = seg
    lake.reset()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "seg-000000000001.log").write_bytes(data)
        records = EmbeddedConsumer(tmp).poll()
    pos = len(SEGMENT_MAGIC)
    for r in records:  # contiguous cover of the segment, no overlap, no gap
        assert r.offset == pos, (r.offset, pos)
        pos += len(r.value) + (0 if r.error_code in ("torn_record", "corrupt_frame")
                               else HEADER_SIZE + len(r.key.encode()))
    assert pos == len(data)
    by_offset = {r.offset: r for r in records}
    valid = {}
    for start, end, batch in intact:
        r = by_offset[start]
        assert r.error_code in (None, "unknown_topic") and len(r.value) + HEADER_SIZE + len(
            NODE) == end - start
        if batch is not None:
            valid[records.index(r)] = batch
    check_property(records, valid, lake)


# -- into DuckDB ------------------------------------------------------------------------------------
class RecordingStore(Store):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.inserted: list[Batch] = []
        self.rejected: list[Any] = []

    def insert_batches(self, batches: Any, **kw: Any) -> tuple[int, int, int]:
        batches = list(batches)
        counts = super().insert_batches(batches, **kw)
        self.inserted.extend(map(full_batch, batches))  # msgpack: NVLink lists as bytes
        return counts

    def quarantine_many(self, rows: Sequence[Any], **kw: Any) -> int:
        self.rejected.extend(rows)
        return super().quarantine_many(rows, **kw)


@pytest.fixture(scope="module")
def duck(tmp_path_factory: pytest.TempPathFactory) -> RecordingStore:
    return RecordingStore(tmp_path_factory.mktemp("fuzz-db") / "f.duckdb")


@settings(max_examples=max(100, EXAMPLES // 40), **SETTINGS)
@given(st.lists(message(), min_size=1, max_size=4))
def test_duckdb_takes_whatever_validation_keeps(
        duck: RecordingStore, messages: list[tuple[str, bytes, bytes, Batch | None]]) -> None:
    duck.inserted.clear()
    duck.rejected.clear()
    records = _kafka_records(messages)
    valid = {i: b for i, (_, _, _, b) in enumerate(messages) if b is not None}
    check_property(records, valid, duck)
