"""Bad records: each kind is rejected with its exact code and a reason naming the field
and the value; the good records of the same batch are kept; the bytes are kept."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcare.collectors.contract import SCHEMA_VERSION, Batch, Incident, XidEvent, encode_batch
from fleetcare.collectors.transport import TELEMETRY_TOPIC, Record
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import CODES, Limits, ValidationResult, Validator
from tests.collectors.test_contract import sample
from tests.pipeline.test_ingest import ListConsumer
from tests.property import DERANDOMIZE, examples

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
NOW = (T0 + dt.timedelta(hours=1)).timestamp()
NODE = "node-00001"


def validator() -> Validator:
    return Validator(clock=lambda: NOW)


def good_dict() -> dict[str, Any]:
    """A batch of three good samples, one XID event, one incident, as plain data."""
    b = Batch(schema_version=SCHEMA_VERSION, node=NODE, seq=1, sent_at=T0,
              samples=[sample(gpu_uuid=f"GPU-{i}", gpu_index=i, ts=T0) for i in range(3)],
              events=[XidEvent(ts=T0, node=NODE, xid=79, message="fallen off the bus",
                               source="kernel-log")],
              incidents=[Incident(ts=T0, node=NODE, kind="failure", cause="faulty_gpu",
                                  source="sim")])
    return msgspec.to_builtins(b)


def encode(obj: Any, fmt: str) -> bytes:
    return msgspec.json.encode(obj) if fmt == "json" else msgspec.msgpack.encode(obj)


def check(raw: bytes, key: str = NODE) -> ValidationResult:
    return validator().validate([Record(TELEMETRY_TOPIC, key, raw, 0, 17)])


def iso(delta: dt.timedelta) -> str:
    return (T0 + delta).isoformat().replace("+00:00", "Z")


# (id, section, index, mutation, code, the field path and the value as the reason shows them)
Mutation = Callable[[dict[str, Any]], None]


def setter(**kw: Any) -> Mutation:
    return lambda rec: rec.update(kw)


RECORD_CASES: list[tuple[str, str, Mutation, str, str, str]] = [
    ("string temperature", "samples", setter(gpu_temp_c="hot"), "wrong_type",
     "gpu_temp_c", "'hot'"),
    ("string in NVLink list", "samples", setter(nvlink_crc_flit=[0, "x", 9]), "wrong_type",
     "nvlink_crc_flit[1]", "'x'"),
    ("missing required field", "samples", lambda r: r.pop("gpu_uuid"), "missing_field",
     "gpu_uuid", "missing"),
    ("naive timestamp", "samples", setter(ts="2026-03-01T00:00:00"), "naive_timestamp",
     "ts", "'2026-03-01T00:00:00'"),
    ("10,000 °C", "samples", setter(gpu_temp_c=10_000.0), "temperature_out_of_range",
     "gpu_temp_c", "10000.0"),
    ("-300 °C memory", "samples", setter(mem_temp_c=-300.0), "temperature_out_of_range",
     "mem_temp_c", "-300.0"),
    ("negative ECC counter", "samples", setter(ecc_uncorrected_volatile=-1), "negative_counter",
     "ecc_uncorrected_volatile", "-1"),
    ("negative NVLink entry", "samples", setter(nvlink_crc_flit=[0, -4, 9]),
     "negative_counter", "nvlink_crc_flit[1]", "-4"),
    ("util 150 %", "samples", setter(util_gpu_pct=150.0), "utilisation_out_of_range",
     "util_gpu_pct", "150.0"),
    ("power -5 W", "samples", setter(power_w=-5.0), "power_out_of_range", "power_w", "-5.0"),
    ("clock 20 GHz", "samples", setter(sm_clock_mhz=20_000), "clock_out_of_range",
     "sm_clock_mhz", "20000"),
    ("fb_used > fb_total", "samples", setter(fb_used_mib=90_000, fb_total_mib=81_559),
     "fb_used_exceeds_total", "fb_used_mib", "90000"),
    ("PCIe width 3", "samples", setter(pcie_link_width=3), "pcie_width_invalid",
     "pcie_link_width", "3"),
    ("PCIe gen 9", "samples", setter(pcie_link_gen=9), "pcie_gen_out_of_range",
     "pcie_link_gen", "9"),
    ("link gen above max", "samples", setter(pcie_link_gen=5, pcie_link_gen_max=4),
     "pcie_link_above_max", "pcie_link_gen", "5"),
    ("NVLink lists of different lengths", "samples", setter(nvlink_crc_data=[0, 1]),
     "nvlink_length_mismatch", "nvlink_crc_data", "2"),
    ("19 NVLinks", "samples", setter(nvlink_up=[True] * 19, nvlink_crc_flit=[0] * 19),
     "nvlink_too_many_links", "nvlink_up", "19"),
    ("gpu_index -1", "samples", setter(gpu_index=-1), "gpu_index_out_of_range",
     "gpu_index", "-1"),
    ("ts 1 day in the future", "samples", setter(ts=iso(dt.timedelta(days=1))), "ts_in_future",
     "ts", "2026-03-02T00:00:00+00:00"),
    ("ts 5 years ago", "samples", setter(ts=iso(-dt.timedelta(days=5 * 365))), "ts_too_old",
     "ts", "2021-03-02T00:00:00+00:00"),
    ("empty node", "samples", setter(node=""), "empty_field", "node", "''"),
    ("empty gpu_uuid", "samples", setter(gpu_uuid=""), "empty_field", "gpu_uuid", "''"),
    ("sample node is not the batch node", "samples", setter(node="node-00002"),
     "node_mismatch", "node", "'node-00002'"),
    ("XID -1", "events", setter(xid=-1), "xid_out_of_range", "xid", "-1"),
    ("XID 5000", "events", setter(xid=5000), "xid_out_of_range", "xid", "5000"),
    ("unknown XID source", "events", setter(source="smoke-signals"), "unknown_xid_source",
     "source", "'smoke-signals'"),
    ("unknown incident cause", "incidents", setter(cause="alien_abduction"),
     "unknown_incident_cause", "cause", "'alien_abduction'"),
    ("unknown incident kind", "incidents", setter(kind="explosion"), "unknown_incident_kind",
     "kind", "'explosion'"),
]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
@pytest.mark.parametrize(("name", "section", "mutate", "code", "where", "value"), RECORD_CASES,
                         ids=[c[0] for c in RECORD_CASES])
def test_a_bad_record_is_rejected_alone(fmt: str, name: str, section: str, mutate: Mutation,
                                        code: str, where: str, value: str) -> None:
    msg = good_dict()
    index = 1 if section == "samples" else 0
    mutate(msg[section][index])
    bad_record = copy.deepcopy(msg[section][index])
    result = check(encode(msg, fmt))

    assert [r.code for r in result.rejections] == [code]
    rej = result.rejections[0]
    assert code in CODES
    assert f"{section}[{index}].{where}" in rej.reason
    assert value in rej.reason
    assert rej.source == f"{TELEMETRY_TOPIC}/0@17#{section}[{index}]"
    # the record's own wire bytes, not the whole message
    decoded = (msgspec.json.decode if fmt == "json" else msgspec.msgpack.decode)(rej.raw)
    assert decoded == bad_record
    # the good records of the same batch are kept
    [kept] = result.batches
    expected = good_dict()
    del expected[section][index]
    assert msgspec.to_builtins(kept) == expected
    assert result.codes == {code: 1}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_float_in_msgpack(value: float) -> None:
    # msgpack carries NaN and infinities; msgspec lets them through as floats
    msg = good_dict()
    msg["samples"][1]["power_w"] = value
    result = check(encode(msg, "msgpack"))
    [rej] = result.rejections
    assert rej.code == "non_finite_value"
    assert f"samples[1].power_w = {value!r}" in rej.reason
    stored = msgspec.msgpack.decode(rej.raw)["power_w"]
    assert stored == value or (math.isnan(stored) and math.isnan(value))  # lossless
    assert [s.gpu_uuid for s in result.batches[0].samples] == ["GPU-0", "GPU-2"]


def test_json_cannot_carry_nan_but_1e999_is_caught() -> None:
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(b"NaN", type=float)  # JSON has no NaN: msgspec rejects it
    msg = good_dict()
    msg["samples"][1]["gpu_temp_c"] = 12345.25
    raw = encode(msg, "json").replace(b"12345.25", b"1e999")
    result = check(raw)
    [rej] = result.rejections
    assert rej.code == "number_out_of_range"
    assert "samples[1].gpu_temp_c" in rej.reason
    assert b"1e999" in rej.raw
    assert len(result.batches[0].samples) == 2


# -- the envelope is bad: the whole message goes to quarantine ---------------------------------
def _msg(**kw: Any) -> dict[str, Any]:
    m = good_dict()
    m.update(kw)
    return m


ENVELOPE_CASES: list[tuple[str, bytes, str, str, str]] = [
    ("undecodable bytes", b"\xff\xfe junk", NODE, "undecodable", "not a fleetcare batch"),
    ("truncated msgpack", encode(good_dict(), "msgpack")[:-40], NODE, "undecodable",
     "not a fleetcare batch (msgpack)"),
    ("truncated JSON", encode(good_dict(), "json")[:-40], NODE, "undecodable",
     "not a fleetcare batch (json)"),
    ("JSON that is not an object", b" [1, 2, 3]", NODE, "invalid_envelope",
     "Expected `object`, got `array`"),
    ("envelope field of the wrong type", encode(_msg(seq="nine"), "json"), NODE,
     "invalid_envelope", "seq"),
    ("unknown future schema_version", encode(_msg(schema_version=99), "msgpack"), NODE,
     "schema_version_unsupported", "schema_version 99 is newer"),
    ("schema_version 0", encode(_msg(schema_version=0), "msgpack"), NODE,
     "schema_version_invalid", "schema_version 0 is not a valid version"),
    ("message key is not the batch node", encode(good_dict(), "msgpack"), "node-00002",
     "key_mismatch", "batch node 'node-00001' does not match the message key 'node-00002'"),
    ("batch with no records", encode(_msg(samples=[], events=[], incidents=[]), "msgpack"),
     NODE, "empty_batch", "has no samples, events, incidents or nics"),
    ("empty batch node", encode(_msg(node=""), "msgpack"), "", "empty_field",
     "batch node = '' is empty"),
]


@pytest.mark.parametrize(("name", "raw", "key", "code", "text"), ENVELOPE_CASES,
                         ids=[c[0] for c in ENVELOPE_CASES])
def test_a_bad_envelope_rejects_the_whole_message(name: str, raw: bytes, key: str, code: str,
                                                  text: str) -> None:
    result = check(raw, key=key)
    assert [r.code for r in result.rejections] == [code]
    rej = result.rejections[0]
    assert text in rej.reason
    assert rej.raw == raw
    assert rej.source == f"{TELEMETRY_TOPIC}/0@17"
    assert result.batches == []


def test_key_mismatch_wins_over_record_problems() -> None:
    """A message for the wrong key is rejected once, whole, not record by record."""
    msg = good_dict()
    msg["samples"][0]["gpu_temp_c"] = "hot"
    result = check(encode(msg, "msgpack"), key="other")
    assert [r.code for r in result.rejections] == ["key_mismatch"]


def test_several_problems_one_rejection_listing_all() -> None:
    msg = good_dict()
    msg["samples"][0].update(gpu_temp_c=10_000.0, power_w=-5.0)
    [rej] = check(encode(msg, "msgpack")).rejections
    assert rej.code == "temperature_out_of_range"
    assert "samples[0].gpu_temp_c = 10000.0" in rej.reason
    assert "samples[0].power_w = -5.0" in rej.reason


def test_all_records_bad_keeps_no_batch() -> None:
    msg = good_dict()
    for s in msg["samples"]:
        s["util_gpu_pct"] = 101.0
    msg["events"], msg["incidents"] = [], []
    result = check(encode(msg, "msgpack"))
    assert result.codes == {"utilisation_out_of_range": 3}
    assert result.batches == []


def test_good_batch_passes_untouched_and_bounds_are_inclusive() -> None:
    msg = good_dict()
    msg["samples"][0].update(gpu_temp_c=200.0, util_gpu_pct=100.0, power_w=0.0,
                             pcie_link_width=16, pcie_link_width_max=16)
    msg["samples"][1]["ts"] = iso(dt.timedelta(hours=1, minutes=10))  # exactly 10 min ahead
    result = check(encode(msg, "msgpack"))
    assert result.rejections == []
    assert msgspec.to_builtins(result.batches[0]) == msg


def test_limits_and_max_age_are_configurable() -> None:
    msg = good_dict()
    msg["samples"][0]["ts"] = iso(-dt.timedelta(days=2))
    raw = encode(msg, "msgpack")
    strict = Validator(clock=lambda: NOW, limits=Limits(max_age_s=86400))
    [rej] = strict.validate([Record(TELEMETRY_TOPIC, NODE, raw, 0, 1)]).rejections
    assert rej.code == "ts_too_old"
    assert "at most 1 days old" in rej.reason
    assert check(raw).rejections == []


def test_operator_causes_are_accepted() -> None:
    msg = good_dict()
    msg["incidents"][0]["cause"] = "node_down"
    assert check(encode(msg, "msgpack")).rejections == []


# -- end to end: through the Ingestor, into DuckDB, out through the CLI ----------------------------
def test_ingest_keeps_running_counts_and_the_cli_prints_what_was_stored(tmp_path: Path) -> None:
    good = encode_batch(msgspec.convert(good_dict(), Batch))
    hot = good_dict()
    hot["samples"][2]["gpu_temp_c"] = 10_000.0
    hot["samples"][2]["ts"] = iso(dt.timedelta(minutes=1))  # not a duplicate of `good`
    for s in hot["samples"][:2]:
        s["ts"] = iso(dt.timedelta(minutes=1))
    values = [(NODE, good), (NODE, b"\xff\xfe junk"), (NODE, encode(hot, "msgpack")),
              (NODE, encode(_msg(schema_version=99), "msgpack")), ("node-x", good)]
    store = Store(tmp_path / "f.duckdb")
    consumer = ListConsumer(values)
    ingestor = Ingestor(store, consumer, max_records=2, validator=validator())
    r = ingestor.drain()
    assert (r.records, r.samples, r.events, r.incidents, r.quarantined) == (5, 5, 1, 1, 4)
    assert consumer.committed == 5
    assert ingestor.quarantined_by_code == {"undecodable": 1, "temperature_out_of_range": 1,
                                            "schema_version_unsupported": 1, "key_mismatch": 1}
    assert ingestor.counters["quarantined"] == 4
    rows = store.cursor().execute(
        "SELECT received_at, source, code, reason, raw FROM quarantine").fetchall()
    store.close()

    out = subprocess.run(
        [sys.executable, "-m", "fleetcare.api.cli", "quarantine", "list", "--db",
         str(tmp_path / "f.duckdb"), "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["total"] == 4
    assert doc["by_code"] == {"key_mismatch": 1, "schema_version_unsupported": 1,
                              "temperature_out_of_range": 1, "undecodable": 1}
    by_source = {q["source"]: q for q in doc["quarantined"]}
    assert len(by_source) == 4
    for received_at, source, code, reason, raw in rows:
        q = by_source[source]
        assert q["code"] == code
        assert q["reason"] == reason
        assert base64.b64decode(q["raw_base64"]) == raw
        assert q["received_at"] == received_at.replace(tzinfo=dt.UTC).isoformat()
    hot_q = by_source[f"{TELEMETRY_TOPIC}/0@2#samples[2]"]
    assert msgspec.msgpack.decode(base64.b64decode(hot_q["raw_base64"]))["gpu_temp_c"] == 10_000
    assert '"gpu_temp_c":10000.0' in hot_q["raw_preview"]
    assert by_source[f"{TELEMETRY_TOPIC}/0@1"]["raw_preview"] == "\\xff\\xfe junk"


def test_the_poll_table_holds_exactly_the_kept_samples() -> None:
    """Validation converts a poll's samples once (``sample_table``, what the sinks insert);
    after bad samples, a bad message and a salvaged one it holds the kept samples only."""
    from fleetcare.pipeline.schema import SAMPLE_SCHEMA
    from fleetcare.pipeline.store import flatten_batches, records_to_arrow

    bad_sample, salvaged = good_dict(), good_dict()
    bad_sample["samples"][0]["gpu_temp_c"] = 9999.0
    bad_sample["samples"][2]["nvlink_crc_flit"] = [1, -1, 0]
    salvaged["samples"][1]["power_w"] = "hot"  # does not decode: the batch is salvaged
    raws = [encode(good_dict(), "msgpack"), encode(bad_sample, "msgpack"), b"\x00garbage",
            encode(salvaged, "json"), encode(good_dict(), "json")]
    result = validator().validate([Record(TELEMETRY_TOPIC, NODE, r, 0, i)
                                   for i, r in enumerate(raws)])
    kept = flatten_batches(result.batches)[0]
    assert len(kept) == 3 + 1 + 2 + 3
    assert result.sample_table is not None
    assert result.sample_table.to_pylist() == records_to_arrow(kept, SAMPLE_SCHEMA).to_pylist()
    assert sorted(r.code for r in result.rejections) == [
        "negative_counter", "temperature_out_of_range", "undecodable", "wrong_type"]


def test_a_poll_with_undecodable_samples_keeps_every_other_row_in_its_table():
    """Samples msgspec refuses are cut from their records (each rejected on its own); the
    poll's table still holds exactly the kept samples, in record order."""
    from fleetcare.pipeline.schema import SAMPLE_SCHEMA
    from fleetcare.pipeline.store import records_to_arrow

    def record(i: int, bad: Any = None, field: str = "gpu_temp_c") -> Record:
        d = good_dict()
        for j, s in enumerate(d["samples"]):
            s["ts"] = T0 + dt.timedelta(minutes=i, seconds=j)  # (a timestamp, not text)
            if bad is not None and j == 1:
                s[field] = bad
        d["seq"] = i
        return Record(TELEMETRY_TOPIC, NODE, msgspec.msgpack.encode(d), 0, i)

    records = [record(0), record(1, "hot"), record(2), record(3, [[1]] * 18, "nvlink_replay"),
               record(4), record(5, 10_000.0)]
    result = validator().validate(records)
    assert sorted(r.code for r in result.rejections) == ["temperature_out_of_range",
                                                         "wrong_type", "wrong_type"]
    kept = [s for b in result.batches for s in b.samples]
    assert len(kept) == 15 and result.sample_table is not None
    want = records_to_arrow(kept, SAMPLE_SCHEMA)
    assert repr(result.sample_table.to_pylist()) == repr(want.to_pylist())


_ODD = {"gpu_temp_c": ["hot", 10_000.0, None, float("nan")],
        "power_w": ["x", -5.0], "ecc_corrected_volatile": ["3", -1, 2**64 - 1],
        "nvlink_replay": [[[1]] * 18, ["a"] * 18, [1, -1, 0]], "nvlink_up": [[1] * 18],
        "ts": ["2026-03-01T00:00:00", 7], "gpu_uuid": ["", 5]}


@st.composite
def _poll(draw: st.DrawFn) -> list[Record]:
    """msgpack records of 1-5 samples, each sample left alone or given an odd value
    (of the wrong type: msgspec refuses it; or out of range)."""
    records = []
    for r in range(draw(st.integers(1, 5))):
        d = good_dict()
        d["samples"] = [dict(d["samples"][0], gpu_uuid=f"GPU-{j}", gpu_index=j,
                             ts=T0 + dt.timedelta(seconds=j))
                        for j in range(draw(st.integers(1, 5)))]
        if draw(st.booleans()):
            d["events"], d["incidents"] = [], []
        for s in d["samples"]:
            if draw(st.integers(0, 2)) == 0:
                name = draw(st.sampled_from(sorted(_ODD)))
                s[name] = draw(st.sampled_from(_ODD[name]))
        d["seq"] = r
        records.append(Record(TELEMETRY_TOPIC, NODE, msgspec.msgpack.encode(d), 0, r))
    return records


@pytest.mark.parametrize("cut", [True, False], ids=["cut", "opened-again"])
@settings(max_examples=examples(300), deadline=None, derandomize=DERANDOMIZE)
@given(records=_poll())
def test_samples_msgspec_refuses_are_cut_as_the_strict_decoder_rejects_them(
        cut: bool, records: list[Record]) -> None:
    """A sample msgspec refuses in a record read with its samples as bytes is rejected on
    its own, and the rest of the poll lands exactly as when every record is decoded
    strictly: the same rejections (code, reason, source, bytes), batches and table. So
    does the fallback when a cut is refused (its records opened again strictly)."""
    from fleetcare.pipeline import validate
    from fleetcare.pipeline.wire_columns import full_batch

    checker = validator()
    if not cut:
        checker._cut = lambda *args: False  # type: ignore[method-assign]
    got = checker.validate(records)
    wire = validate._wire
    try:
        validate._wire = lambda raw: None  # every record decoded strictly (the reference)
        want = validator().validate(records)
    finally:
        validate._wire = wire
    assert ([(r.code, r.reason, r.source, r.raw) for r in got.rejections]
            == [(r.code, r.reason, r.source, r.raw) for r in want.rejections])
    assert [full_batch(k.decoded) for k in got.kept] == want.batches
    assert [k.source for k in got.kept] == [k.source for k in want.kept]
    assert (got.sample_table is None) == (want.sample_table is None)
    if got.sample_table is not None:
        assert repr(got.sample_table.to_pylist()) == repr(want.sample_table.to_pylist())
