"""``SampleScreen.screen`` is conservative: every sample ``RecordChecks.check`` finds a
problem in is a suspect, on random mutations of a full sample (every field, its edge
values and just past them); a poll of clean samples has no suspect, so the screen saves
the checks it is there to save; and its table is exactly what the sinks would have built
from the samples (``records_to_arrow``), or None when a value does not fit."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcare.collectors.contract import DCGM_FP64_BLANK, DCGM_INT64_BLANK, GpuSample
from fleetcare.pipeline.limits import KNOWN_CAUSES, Limits
from fleetcare.pipeline.record_checks import RANGED, RecordChecks
from fleetcare.pipeline.sample_screen import SampleScreen
from fleetcare.pipeline.schema import NVLINK_LISTS, SAMPLE_SCHEMA
from fleetcare.pipeline.store import records_to_arrow
from fleetcare.pipeline.wire_columns import WireSample
from tests.property import DERANDOMIZE, examples

LIM = Limits()
NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
NODE = "node-007"
CHECKS = RecordChecks(LIM, KNOWN_CAUSES)
SCREEN = SampleScreen(LIM)


def full(i: int = 0, links: int = 18, **kw: Any) -> GpuSample:
    """A clean sample with every field set, as an H100 agent sends it."""
    base: dict[str, Any] = dict(
        ts=NOW - dt.timedelta(seconds=30 * i), node=NODE, gpu_uuid=f"GPU-{i:04d}",
        gpu_index=i % 8, pci_bus_id="00000000:18:00.0", model="NVIDIA H100 80GB HBM3",
        gpu_temp_c=60.0 + i % 7, mem_temp_c=70.0, power_w=580.5, power_limit_w=700.0,
        sm_clock_mhz=1980, mem_clock_mhz=2619, util_gpu_pct=93.0, util_mem_pct=40.0,
        fb_used_mib=58_000 + i, fb_total_mib=81_559, ecc_corrected_volatile=i,
        ecc_uncorrected_volatile=0, ecc_corrected_aggregate=3 * i,
        ecc_uncorrected_aggregate=0, retired_pages_sbe=None, retired_pages_dbe=None,
        retired_pages_pending=None, remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0, remapped_rows_pending=False,
        remapped_rows_failure=False, pcie_replay_count=i, pcie_link_gen=5,
        pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16,
        nvlink_up=[True] * links, nvlink_crc_flit=[i] * links, nvlink_crc_data=[0] * links,
        nvlink_replay=[0] * links, nvlink_recovery=[1] * links, clock_event_reasons=0)
    base.update(kw)
    return GpuSample(**base)


def _edges() -> dict[str, list[Any]]:
    """Values at and just past every limit, per field."""
    ints = [None, 0, -1, 1, DCGM_INT64_BLANK - 1, DCGM_INT64_BLANK, 2**64 - 1, 3, 17, 33]
    floats = [None, 0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, DCGM_FP64_BLANK,
              math.nextafter(DCGM_FP64_BLANK, 0), 1e308, -1e308, 100.5, 5000.0, 5000.1]
    out: dict[str, list[Any]] = {}
    for name, _, attr, _ in RANGED:  # (of the type the decoder gives the field)
        lo, hi = getattr(LIM, attr)
        out[name] = [lo, hi, lo - 1, hi + 1]
        if isinstance(hi, float):
            out[name] += [math.nextafter(hi, math.inf), math.nextafter(lo, -math.inf)]
    for f, tp in zip(GpuSample.__struct_fields__, msgspec.structs.fields(GpuSample), strict=True):
        hint = str(tp.type)
        if "list" in hint:
            pool = [None, [], [0], [0] * 18, [0] * 19, [1, -1], [DCGM_INT64_BLANK, 0],
                    [2**64 - 1], [5] * 17, [-1] * 18, [0] * 17 + [DCGM_INT64_BLANK],
                    [300] * 18, [2**40, -(2**40)] * 9, [0] * 17 + [2**64 - 1]]
            out[f] = pool if "bool" not in hint else [None, [], [True], [False] * 18,
                                                     [True] * 19, [True] * 17]
        elif "float" in hint:
            out[f] = out.get(f, []) + floats
        elif "int" in hint:
            out[f] = out.get(f, []) + ints
        elif "str" in hint:
            out[f] = ["", " ", "x", "y" * LIM.max_name_len, "y" * (LIM.max_name_len + 1),
                      NODE, "other-node"]
    out["ts"] = [NOW + dt.timedelta(seconds=LIM.max_future_s),
                 NOW + dt.timedelta(seconds=LIM.max_future_s + 1),
                 NOW - dt.timedelta(seconds=LIM.max_age_s),
                 NOW - dt.timedelta(seconds=LIM.max_age_s + 1),
                 dt.datetime(1970, 1, 1, tzinfo=dt.UTC)]
    out["pcie_link_width"] += [1, 2, 4, 8, 16, 32, 12, 64]
    out["pcie_link_width_max"] += [4, 12, 32]
    out["fb_used_mib"] += [81_559, 81_560]
    return out


EDGES = _edges()


@st.composite
def poll(draw: st.DrawFn) -> tuple[list[GpuSample], list[str]]:
    samples, nodes = [], []
    for i in range(draw(st.integers(1, 12))):
        kw = {}
        for _ in range(draw(st.integers(0, 3))):
            name = draw(st.sampled_from(sorted(EDGES)))
            kw[name] = draw(st.sampled_from(EDGES[name]))
        samples.append(full(i, links=draw(st.sampled_from([18, 18, 4, 0])), **kw))
        nodes.append(draw(st.sampled_from([NODE, NODE, NODE, "other-node"])))
    return samples, nodes


@settings(max_examples=examples(1000), deadline=None, database=None,
          derandomize=DERANDOMIZE)
@given(poll())
def test_every_sample_with_a_problem_is_a_suspect(case):
    samples, nodes = case
    now = NOW.timestamp()
    screened = SCREEN.screen(samples, nodes, now)
    bad = {i for i, (s, n) in enumerate(zip(samples, nodes, strict=True))
           if CHECKS.check("samples", s, n, now)}
    assert bad <= screened.suspects, [CHECKS.check("samples", samples[i], nodes[i], now)
                                      for i in bad - screened.suspects]
    try:
        expected = records_to_arrow(samples, SAMPLE_SCHEMA)
    except (OverflowError, ValueError, TypeError):
        expected = None
    if screened.table is None:
        assert expected is None or _too_big(samples)
    else:
        assert same(screened.table, expected)


def same(a: Any, b: Any) -> bool:
    """Tables equal, NaN equal to NaN (``Table.equals`` says NaN != NaN)."""
    return a.schema == b.schema and repr(a.to_pylist()) == repr(b.to_pylist())


def _too_big(samples: list[GpuSample]) -> bool:
    """Whether an integer of ``samples`` is past int64 (Arrow cannot hold it)."""
    def big(v: Any) -> bool:
        return (isinstance(v, int) and not isinstance(v, bool) and v >= 2**63) or (
            isinstance(v, list) and any(big(x) for x in v))
    return any(big(v) for s in samples for v in msgspec.structs.astuple(s))


UNIFORM = [full(i) for i in range(64)]  # every list of 18 links: the 2-D fast path
MIXED = UNIFORM + [full(64, links=0), full(65, links=4),
                   full(66, nvlink_up=None, nvlink_crc_flit=None, nvlink_crc_data=None,
                        nvlink_replay=None, nvlink_recovery=None, pcie_replay_count=None)]


@pytest.mark.parametrize("samples", [UNIFORM, MIXED], ids=["uniform", "mixed"])
def test_a_clean_poll_has_no_suspect_and_one_bad_sample_only_itself(samples):
    nodes = [NODE] * len(samples)
    now = NOW.timestamp()
    assert not any(CHECKS.check("samples", s, NODE, now) for s in samples)
    clean = SCREEN.screen(samples, nodes, now)
    assert clean.suspects == set()
    assert same(clean.table, records_to_arrow(samples, SAMPLE_SCHEMA))
    for kw in [{"gpu_temp_c": math.nan}, {"nvlink_replay": [0] * 17 + [-2]},
               {"nvlink_crc_data": [0] * 17 + [DCGM_INT64_BLANK]},
               {"pcie_link_width": 12}, {"ts": NOW + dt.timedelta(hours=1)},
               {"node": "elsewhere"}, {"fb_used_mib": 90_000},
               {"sm_clock_mhz": DCGM_INT64_BLANK}, {"nvlink_up": [True] * 17}]:
        odd = [*samples[:10], full(10, **kw), *samples[11:]]
        assert CHECKS.check("samples", odd[10], NODE, now), kw
        assert SCREEN.screen(odd, nodes, now).suspects == {10}, kw


def test_values_a_column_minimum_and_maximum_do_not_decide():
    now = NOW.timestamp()
    widths = [full(0, pcie_link_width=8, pcie_link_width_max=16), full(1, pcie_link_width=12,
              pcie_link_width_max=16), full(2, pcie_link_width=16, pcie_link_width_max=16)]
    assert SCREEN.screen(widths, [NODE] * 3, now).suspects == {1}
    wide = [full(i, links=LIM.max_nvlinks + 1) for i in range(3)]  # one width, too many
    assert all(CHECKS.check("samples", s, NODE, now) for s in wide)
    assert SCREEN.screen(wide, [NODE] * 3, now).suspects == {0, 1, 2}


def as_wire(samples: list[GpuSample]) -> list[Any]:
    """``samples`` as ingest decodes msgpack: NVLink lists left as their bytes
    (``WireSample``; the other fields as they are, edge values included)."""
    out = []
    for s in samples:
        values = msgspec.structs.asdict(s)
        for name in NVLINK_LISTS:
            if values[name] is not None:
                values[name] = msgspec.Raw(msgspec.msgpack.encode(values[name]))
        out.append(WireSample(**values))
    return out


@settings(max_examples=examples(600), deadline=None, database=None,
          derandomize=DERANDOMIZE)
@given(poll())
def test_samples_with_their_lists_as_bytes_screen_as_the_decoded_ones(case):
    samples, nodes = case
    now = NOW.timestamp()
    decoded = SCREEN.screen(samples, nodes, now)
    raw = SCREEN.screen(as_wire(samples), nodes, now)
    assert raw.suspects == decoded.suspects and not raw.undecodable
    assert (raw.table is None) == (decoded.table is None)
    if raw.table is not None:
        assert same(raw.table, decoded.table)


def as_bytes(samples: list[GpuSample], keep: list[bool]) -> list[Any]:
    """``samples`` as ingest hands msgpack ones to the screen (``msgspec.Raw`` of each
    sample's bytes: ``wire_samples`` decodes them into columns), except where ``keep``
    (those stay objects, as from JSON or a salvaged batch) and where msgspec would refuse
    the bytes (``gpu_index=None``: ingest opens such a record strictly before it screens)."""
    out: list[Any] = []
    for s, k in zip(samples, keep, strict=True):
        raw = msgspec.Raw(msgspec.msgpack.encode(s))
        try:
            msgspec.msgpack.decode(raw, type=GpuSample)
        except msgspec.ValidationError:
            k = True
        out.append(s if k else raw)
    return out


@settings(max_examples=examples(600), deadline=None, database=None,
          derandomize=DERANDOMIZE)
@given(poll(), st.data())
def test_samples_as_their_bytes_screen_as_the_decoded_ones(case, data):
    samples, nodes = case
    keep = data.draw(st.lists(st.booleans(), min_size=len(samples), max_size=len(samples)))
    now = NOW.timestamp()
    decoded = SCREEN.screen(samples, nodes, now)
    raw = SCREEN.screen(as_bytes(samples, keep), nodes, now)
    assert raw.suspects == decoded.suspects and not raw.undecodable
    assert (raw.table is None) == (decoded.table is None)
    if raw.table is not None:
        assert same(raw.table, decoded.table)


def test_a_sample_whose_bytes_are_not_one_is_undecodable_the_rest_screened():
    now = NOW.timestamp()
    good = [msgspec.Raw(msgspec.msgpack.encode(full(i))) for i in range(4)]
    bad_list = dict(msgspec.structs.asdict(full(4)), nvlink_replay=[[1]] * 18)
    bad_type = dict(msgspec.structs.asdict(full(5)), gpu_temp_c="hot")
    odd = [good[0], msgspec.Raw(msgspec.msgpack.encode(bad_list)), good[1],
           msgspec.Raw(msgspec.msgpack.encode(bad_type)), good[2]]
    assert SCREEN.screen(odd, [NODE] * 5, now).undecodable == {1, 3}
    assert SCREEN.screen(good, [NODE] * 4, now).suspects == set()
