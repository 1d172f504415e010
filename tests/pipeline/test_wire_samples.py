"""``wire_samples.decode`` decodes a sample exactly as msgspec + Arrow would, or leaves it
to msgspec: on every msgpack encoding of every field (each integer width, float32, the
three timestamp extensions, nil), on wrong types, unknown and repeated keys, invalid
UTF-8, cut and mutated bytes, and on polls where decoded and undecided samples alternate
(what an undecided sample wrote is taken back)."""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcare.collectors.contract import GpuSample, encode_batch
from fleetcare.pipeline import wire_samples
from fleetcare.pipeline.schema import SAMPLE_SCHEMA
from fleetcare.pipeline.store import records_to_arrow
from fleetcare.pipeline.wire_samples import FIELDS, KIND
from tests.property import DERANDOMIZE, examples

STRICT = msgspec.msgpack.Decoder(GpuSample)
ENC = msgspec.msgpack.encode
NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
SETTINGS = dict(deadline=None, database=None, derandomize=DERANDOMIZE)


def full(i: int = 0, links: int = 18, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        ts=NOW - dt.timedelta(seconds=30 * i, microseconds=i), node="node-007",
        gpu_uuid=f"GPU-{i:04d}", gpu_index=i % 8, pci_bus_id="00000000:18:00.0",
        model="NVIDIA H100 80GB HBM3", gpu_temp_c=60.5 + i, mem_temp_c=70.0, power_w=580.5,
        power_limit_w=700.0, sm_clock_mhz=1980, mem_clock_mhz=2619, util_gpu_pct=93.0,
        util_mem_pct=40.0, fb_used_mib=58_000 + i, fb_total_mib=81_559,
        ecc_corrected_volatile=i, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=3 * i,
        ecc_uncorrected_aggregate=0, remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0, remapped_rows_pending=False,
        remapped_rows_failure=False, pcie_replay_count=i, pcie_link_gen=5,
        pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16,
        nvlink_up=[True] * links, nvlink_crc_flit=[i] * links, nvlink_crc_data=[0] * links,
        nvlink_replay=[0] * links, nvlink_recovery=[300] * links, clock_event_reasons=0)
    base.update(kw)
    return base


def map_bytes(pairs: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map of ``pairs`` in that order (repeats kept); a value that is bytes is
    written as it is (hand-made encodings)."""
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + b"".join(ENC(k) + (v if isinstance(v, bytes) else ENC(v)) for k, v in pairs)


def expected(raw: bytes) -> dict[str, Any] | None:
    """The row msgspec + Arrow make of ``raw``, or None when msgspec refuses it."""
    try:
        sample = STRICT.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        return records_to_arrow([sample], SAMPLE_SCHEMA).to_pylist()[0]
    except (OverflowError, pa.ArrowException):
        return None  # past int64: Arrow cannot hold it (the decoder must leave it)


def rows(raws: list[bytes]) -> dict[int, dict[str, Any]]:
    """Per decoded sample (its index), its row."""
    got = wire_samples.decode([msgspec.Raw(r) for r in raws])
    table = pa.Table.from_arrays([got.arrays[f.name] for f in SAMPLE_SCHEMA],
                                 schema=SAMPLE_SCHEMA)
    assert sorted([*got.rows, *got.undecided]) == list(range(len(raws)))
    return dict(zip(got.rows.tolist(), table.to_pylist(), strict=True))


def agree(raws: list[bytes]) -> int:
    """Every decoded sample as msgspec decodes it; returns how many were decoded."""
    got = rows(raws)
    for i, row in got.items():
        want = expected(raws[i])
        assert want is not None, f"decoded what msgspec refuses: {raws[i]!r}"
        assert repr(row) == repr(want), (raws[i], row, want)  # (repr: NaN equals NaN)
    return len(got)


def test_what_agents_send_is_decoded_exactly():
    samples = [GpuSample(**full(i)) for i in range(40)]
    samples += [GpuSample(**full(40, links=0)), GpuSample(**full(41, links=4)),
                GpuSample(**{k: v for k, v in full(42).items()
                             if k not in ("nvlink_up", "power_w", "ecc_corrected_volatile")})]
    batch = msgspec.msgpack.decode(encode_batch(_batch(samples)))
    raws = [ENC(s) for s in batch["samples"]]
    assert agree(raws) == len(raws)


def _batch(samples: list[GpuSample]) -> Any:
    from fleetcare.collectors.contract import Batch
    return Batch(schema_version=1, node="node-007", seq=1, sent_at=NOW, samples=samples)


# -- hand-made encodings -------------------------------------------------------------------
def int_bytes(value: int, code: int) -> bytes | None:
    """``value`` as the msgpack integer ``code`` (None when it does not fit)."""
    fmt = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
           0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}[code]
    try:
        return bytes([code]) + struct.pack(fmt, value)
    except struct.error:
        return None


def ts_bytes(sec: int, nano: int, form: int) -> bytes | None:
    if form == 4:
        return b"\xd6\xff" + struct.pack(">I", sec) if 0 <= sec < 2**32 and nano == 0 else None
    if form == 8:
        return (b"\xd7\xff" + struct.pack(">Q", (nano << 34) | sec)
                if 0 <= sec < 2**34 and 0 <= nano < 2**30 else None)
    return b"\xc7\x0c\xff" + struct.pack(">Iq", nano, sec) if nano < 2**32 else None


INTS = st.one_of(st.integers(-40, 300), st.integers(-(2**63), 2**64 - 1),
                 st.sampled_from([0, -1, -32, -33, 127, 128, 255, 256, 2**31, 2**63 - 1,
                                  2**63, -(2**63)]))
FLOATS = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def rfc3339(draw: st.DrawFn) -> str:
    """Timestamps as text, near and past every rule: days past a month's end, leap years,
    fractions of 0-9 digits, offsets, 'z', a space for 'T', missing parts."""
    year = draw(st.sampled_from([1969, 1970, 1971, 2000, 2024, 2026, 2100, 9998, 9999]))
    month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    hour, minute, second = draw(st.integers(0, 25)), draw(st.integers(0, 61)), draw(
        st.integers(0, 61))
    frac = draw(st.sampled_from(["", ".", ".5", ".123", ".000001", ".123456", ".1234567",
                                 ".123456789"]))
    zone = draw(st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-08:00", "+23:59",
                                 "+24:00", "+0530", "", "+05:60"]))
    sep = draw(st.sampled_from(["T", "T", "T", " ", "t"]))
    return f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}{frac}{zone}"


@st.composite
def value(draw: st.DrawFn, kind: int) -> Any:
    """A value for a field of ``kind``: mostly of its type, in every encoding, sometimes
    of another type or nil."""
    other = st.one_of(st.sampled_from([None, 0, 1, True, False, 0.0, 1.0, "", "1"]),
                      st.booleans(), INTS, FLOATS, st.text(max_size=4),
                      st.lists(st.integers(0, 3), max_size=3),
                      st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2))
    if draw(st.integers(0, 4)) == 0:
        return draw(other)
    if kind == wire_samples.INT or (kind == wire_samples.FLOAT and draw(st.booleans())):
        v = draw(INTS)
        code = draw(st.sampled_from([None, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3]))
        raw = None if code is None else int_bytes(v, code)
        return raw if raw is not None else v
    if kind == wire_samples.FLOAT:
        f = draw(FLOATS)
        return b"\xca" + struct.pack(">f", f) if draw(st.booleans()) and (
            math.isnan(f) or abs(f) < 3e38) else f
    if kind == wire_samples.BOOL:
        return draw(st.booleans())
    if kind == wire_samples.STR:
        text = draw(st.one_of(st.text(st.characters(max_codepoint=127), max_size=40),
                              st.text(max_size=6), st.just("x" * 300)))
        if draw(st.integers(0, 9)) == 0:
            return b"\xa2\xff\xfe"  # not UTF-8
        return text
    if kind == wire_samples.TS:
        sec = draw(st.one_of(st.integers(1_600_000_000, 1_900_000_000),
                             st.integers(-(2**40), 2**40)))
        nano = draw(st.one_of(st.just(0), st.integers(0, 999_999) .map(lambda u: u * 1000),
                              st.integers(0, 2**30 - 1)))
        if draw(st.booleans()):
            return draw(rfc3339())
        made = ts_bytes(sec, nano, draw(st.sampled_from([4, 8, 12])))
        return made if made is not None else draw(st.sampled_from(
            [NOW, "2026-03-01T12:00:00Z", "2026-03-01T12:00:00", 1_700_000_000]))
    if kind == wire_samples.BOOL_LIST:
        return draw(st.one_of(st.lists(st.booleans(), max_size=20),
                              st.lists(st.one_of(st.booleans(), st.integers(0, 1)),
                                       max_size=4)))
    items = draw(st.lists(INTS, max_size=20))
    if items and draw(st.booleans()):  # a wide encoding inside the list
        code = draw(st.sampled_from([0xCD, 0xD3, 0xCF]))
        first = int_bytes(items[0], code)
        if first is not None:
            return (bytes([0x90 | len(items)]) if len(items) < 16 else
                    b"\xdc" + struct.pack(">H", len(items))) + first + b"".join(
                        ENC(x) for x in items[1:])
    return items


@st.composite
def sample_bytes(draw: st.DrawFn) -> bytes:
    """A msgpack map close to a sample: a clean one with some fields changed, dropped,
    repeated, reordered, or an unknown key added."""
    base = full(draw(st.integers(0, 50)), links=draw(st.sampled_from([18, 4, 0])))
    pairs: list[tuple[Any, Any]] = [(k, v) for k, v in base.items()]
    for _ in range(draw(st.integers(0, 4))):
        f = draw(st.integers(0, len(FIELDS) - 1))
        what = draw(st.sampled_from(["set", "set", "set", "drop", "repeat", "unknown", "nil",
                                     "swap"]))
        names = [k for k, _ in pairs]
        if what == "set":
            new = draw(value(int(KIND[f])))
            pairs = [(k, new if k == FIELDS[f] else v) for k, v in pairs]
            if FIELDS[f] not in names:
                pairs.append((FIELDS[f], new))
        elif what == "drop":
            pairs = [(k, v) for k, v in pairs if k != FIELDS[f]]
        elif what == "repeat":
            pairs.append((FIELDS[f], draw(value(int(KIND[f])))))
        elif what == "unknown":
            pairs.insert(draw(st.integers(0, len(pairs))), ("extra_" + FIELDS[f], 1))
        elif what == "nil":
            pairs = [(k, None if k == FIELDS[f] else v) for k, v in pairs]
        elif len(pairs) > 1:
            j = draw(st.integers(0, len(pairs) - 2))
            pairs[j], pairs[j + 1] = pairs[j + 1], pairs[j]
    return map_bytes(pairs)


TRICKY = [None, 0, 1, -1, True, False, 1.0, math.nan, "", "x", [], [1], [True], {},
          2**63, 2**64 - 1, -(2**63), NOW, b"\xca\x3f\x80\x00\x00", b"\xd3" + bytes(8),
          [-1, 0, 127, -32], [5, -3] * 9, [0, True], [True, 0], [None], [0, 128, -33]]


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_with_every_kind_of_value(name):
    """Each field set to each value of the other kinds too (one sample each)."""
    raws = [map_bytes([(k, v if k != name else t) for k, v in full(3).items()])
            for t in TRICKY]
    agree(raws)


@settings(max_examples=examples(1200), **SETTINGS)
@given(rfc3339())
def test_timestamps_as_text_decode_as_msgspec_decodes_them(text):
    agree([map_bytes([(k, v if k != "ts" else text) for k, v in full(1).items()])])


def test_valid_text_timestamps_are_decoded_not_left():
    texts = ["2026-03-01T12:00:00Z", "2024-02-29T23:59:59.5+05:30", "2026-12-31T00:00:00-08:00",
             "1999-01-01T00:00:00.123456Z"]
    raws = [map_bytes([(k, v if k != "ts" else t) for k, v in full(1).items()]) for t in texts]
    assert agree(raws) == len(texts)


@settings(max_examples=examples(600), **SETTINGS)
@given(st.lists(sample_bytes(), min_size=1, max_size=6))
def test_a_decoded_sample_is_what_msgspec_decodes(raws):
    agree(raws)


@settings(max_examples=examples(400), **SETTINGS)
@given(st.lists(sample_bytes(), min_size=1, max_size=3), st.data())
def test_cut_or_mutated_bytes_never_decode_wrongly(raws, data):
    out = []
    for raw in raws:
        b = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(b) - 1))
            b[at] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            b = b[:data.draw(st.integers(1, len(b)))]
        out.append(bytes(b))
    agree(out)


def test_undecided_samples_between_decoded_ones_take_back_what_they_wrote():
    good = [ENC(full(i)) for i in range(6)]
    late_bad = map_bytes([*full(90).items(), ("clock_event_reasons", "x")])  # bad at the end
    raws = [good[0], late_bad, good[1], late_bad, late_bad, good[2], good[3]]
    got = rows(raws)
    assert sorted(got) == [0, 2, 5, 6]
    assert agree(raws) == 4


def test_long_strings_and_lists_make_room():
    raws = [ENC(full(i, links=200, model="M" * 250, pci_bus_id="p" * 200)) for i in range(3)]
    raws.append(ENC(full(3, links=4096)))
    assert agree(raws) == 4
    assert agree([ENC(full(0, links=4097))]) == 0  # past MAX_LIST: left to msgspec


@pytest.mark.parametrize("raw", [b"\x80", b"\xc0", b"\x90", b"\xdf\x00\x00\x00\x00", b""])
def test_what_is_not_a_sample_map_is_left(raw):
    got = wire_samples.decode([msgspec.Raw(raw)])
    assert got.undecided.tolist() == [0] and not len(got.rows)


def test_no_sample_no_column_rows():
    got = wire_samples.decode([])
    assert not len(got.rows) and all(len(a) == 0 for a in got.arrays.values())
