"""``RecordChecks._shape_clean`` (the fast test of a clean row) says "clean" exactly when
``_shape``'s per-field loop finds nothing, for every field group and its edge cases."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import msgspec
import pytest

from fleetcare.collectors.contract import (
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    GpuSample,
    Incident,
    XidEvent,
)
from fleetcare.pipeline.record_checks import SHAPES, RecordChecks
from fleetcare.pipeline.validate import KNOWN_CAUSES, Limits
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
LIM = Limits()

SAMPLE_CASES: list[dict[str, Any]] = [
    {},
    {"gpu_uuid": ""},
    {"gpu_uuid": "G" * LIM.max_name_len},
    {"gpu_uuid": "G" * (LIM.max_name_len + 1)},
    {"model": "M" * (LIM.max_name_len + 5)},
    {"ecc_corrected_volatile": DCGM_INT64_BLANK - 1},
    {"ecc_corrected_volatile": DCGM_INT64_BLANK},
    {"retired_pages_sbe": 2**64 - 1},
    {"ecc_corrected_volatile": None, "pcie_replay_count": DCGM_INT64_BLANK + 3},
    {"gpu_temp_c": math.nan},
    {"power_w": math.inf},
    {"mem_temp_c": -math.inf},
    {"power_w": DCGM_FP64_BLANK},
    {"power_w": math.nextafter(DCGM_FP64_BLANK, 0)},
    {"gpu_temp_c": None, "power_w": None, "mem_temp_c": None},
    {"nvlink_crc_flit": []},
    {"nvlink_crc_flit": None},
    {"nvlink_crc_flit": [0, DCGM_INT64_BLANK - 1]},
    {"nvlink_crc_flit": [0, DCGM_INT64_BLANK]},
    {"nvlink_replay": [DCGM_INT64_BLANK, 1], "nvlink_crc_flit": []},
    {"nvlink_crc_data": [-5, 3]},  # negative: not a shape problem (the NVLink check's)
    {"ecc_uncorrected_volatile": -1},  # likewise (the counter check's)
]


def slow(checks: RecordChecks, section: str, rec: msgspec.Struct,
         monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], set[str]]:
    with monkeypatch.context() as m:
        m.setattr(checks, "_shape_clean", lambda shape, row: False)
        return checks._shape(SHAPES[section], msgspec.structs.astuple(rec))


@pytest.mark.parametrize("kw", SAMPLE_CASES, ids=[",".join(k) or "clean" for k in
                                                  (c.keys() for c in SAMPLE_CASES)])
def test_fast_clean_test_agrees_with_the_per_field_loop(kw, monkeypatch):
    checks = RecordChecks(LIM, KNOWN_CAUSES)
    rec = sample(**kw)
    expected = slow(checks, "samples", rec, monkeypatch)
    clean = checks._shape_clean(SHAPES["samples"], msgspec.structs.astuple(rec))
    assert clean == (expected == ([], set())), (kw, expected)
    assert checks._shape(SHAPES["samples"], msgspec.structs.astuple(rec)) == expected


@pytest.mark.parametrize("rec", [
    XidEvent(ts=T0, node="n", xid=79, message="m" * LIM.max_text_len, source="sim"),
    XidEvent(ts=T0, node="n", xid=79, message="m" * (LIM.max_text_len + 1), source="sim"),
    XidEvent(ts=T0, node="n" * (LIM.max_name_len + 1), xid=79, message="ok", source="sim"),
    XidEvent(ts=T0, node="n", xid=DCGM_INT64_BLANK, message="", source="sim"),
    Incident(ts=T0, node="n", kind="failure", cause="gpu", source="sim",
             note="x" * (LIM.max_text_len + 1)),
    Incident(ts=T0, node="n", kind="failure", cause="gpu", source="s" * 300),
], ids=lambda r: type(r).__name__)
def test_events_and_incidents_too(rec, monkeypatch):
    section = "events" if isinstance(rec, XidEvent) else "incidents"
    checks = RecordChecks(LIM, KNOWN_CAUSES)
    expected = slow(checks, section, rec, monkeypatch)
    clean = checks._shape_clean(SHAPES[section], msgspec.structs.astuple(rec))
    assert clean == (expected == ([], set()))
    assert checks._shape(SHAPES[section], msgspec.structs.astuple(rec)) == expected


def test_the_cases_cover_clean_and_every_group():
    checks = RecordChecks(LIM, KNOWN_CAUSES)
    shape = SHAPES["samples"]
    verdicts = [checks._shape_clean(shape, msgspec.structs.astuple(sample(**kw)))
                for kw in SAMPLE_CASES]
    assert verdicts.count(True) >= 8 and verdicts.count(False) >= 10
    assert isinstance(sample(), GpuSample)
