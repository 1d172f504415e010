"""Failure incidents from fatal XIDs, lost GPUs, Slurm node events and CSV (issue 4 §5)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetcare.collectors.contract import GpuSample, XidEvent
from fleetcare.collectors.xid import DEFAULT_CATALOG
from fleetcare.pipeline import incidents
from fleetcare.pipeline.incident_import import (
    ImportProblem,
    cause_from_reason,
    expand_hostlist,
    parse_csv,
    parse_slurm_events,
)
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def xid(minutes: float, number: int | None, gpu: str | None = "G0", node: str = "n1",
        message: str = "", **kw: object) -> XidEvent:
    return XidEvent(ts=at(minutes), node=node, xid=number, message=message or f"Xid {number}",
                    source="kernel-log", gpu_uuid=gpu, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "f.duckdb") as s:
        yield s


def rows(store: Store) -> list[tuple]:
    return store.cursor().execute(
        "SELECT ts, node, gpu_uuid, kind, cause, mode, xid, source FROM incidents "
        "ORDER BY ts, node").fetchall()


def naive(minutes: float) -> dt.datetime:
    return at(minutes).replace(tzinfo=None)


def test_fatal_xids_become_one_incident_per_burst(store):
    store.insert_events([
        xid(0, 79), xid(2, 48), xid(9, 79),     # one burst on G0 (within 10 min of 0)
        xid(30, 74),                            # a new burst
        xid(1, 119, gpu="G1"),                  # another GPU
        xid(5, 13), xid(6, 31), xid(7, 43), xid(8, 45), xid(8, 68), xid(8, 69),  # application
        xid(40, 63), xid(41, 94), xid(42, 92),  # not fatal
    ])
    assert incidents.derive_from_xids(store) == 3
    assert rows(store) == [
        (naive(0), "n1", "G0", "failure", "faulty_gpu", "pcie", 79, "xid"),
        (naive(1), "n1", "G1", "failure", "gpu_system_processor", "gsp", 119, "xid"),
        (naive(30), "n1", "G0", "failure", "faulty_gpu", "nvlink", 74, "xid"),
    ]
    note = store.cursor().execute(
        "SELECT note FROM incidents WHERE ts = ?", [naive(0)]).fetchone()[0]
    assert note == "fatal XID 79, 48 (3 events)"
    assert incidents.derive_from_xids(store) == 0            # idempotent
    assert len(rows(store)) == 3


def test_cause_table():
    assert incidents.cause_of(48) == ("gpu_hbm3_memory", "hbm")
    assert incidents.cause_of(95) == ("gpu_hbm3_memory", "hbm")
    assert incidents.cause_of(140) == ("gpu_hbm3_memory", "hbm")
    assert incidents.cause_of(74) == ("faulty_gpu", "nvlink")
    assert incidents.cause_of(79) == ("faulty_gpu", "pcie")
    assert incidents.cause_of(120) == ("gpu_system_processor", "gsp")
    assert incidents.cause_of(None) == ("faulty_gpu", "pcie")
    assert incidents.cause_of(999) == ("faulty_gpu", "none")
    assert incidents.failure_xids() == {48, 62, 64, 74, 79, 95, 119, 120, 140, 143}


def test_lost_gpu_without_an_xid_number(store):
    store.insert_events([
        xid(0, None, message="NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
        xid(60, None, gpu="G1", message="NVRM: GPU at PCI:0000:5e:00: GPU is lost"),
        xid(90, None, gpu="G2", message="NVRM: loading NVIDIA UNIX x86_64 Kernel Module"),
    ])
    assert incidents.derive_from_xids(store) == 2
    assert [(r[2], r[4], r[5], r[6]) for r in rows(store)] == [
        ("G0", "faulty_gpu", "pcie", None), ("G1", "faulty_gpu", "pcie", None)]


def test_site_overrides_change_the_fatal_set_but_never_application_xids(store):
    store.insert_events([xid(0, 94), xid(20, 13), xid(40, 48)])
    catalog = DEFAULT_CATALOG.with_overrides({94: {"fatal": True}, 13: {"fatal": True},
                                              48: {"fatal": False}})
    assert incidents.derive_from_xids(store, catalog=catalog) == 1
    assert [(r[4], r[6]) for r in rows(store)] == [("gpu_hbm3_memory", 94)]


def test_kernel_log_events_resolve_the_gpu_from_telemetry(store):
    store.insert_sample_records([GpuSample(
        ts=at(-5), node="n1", gpu_uuid="GPU-abc", gpu_index=2, pci_bus_id="00000000:3B:00.0",
        model="H100")])
    store.insert_events([xid(0, 79, gpu=None, pci_bus_id="0000:3b:00"),
                         xid(0, 48, gpu=None, node="n2", pci_bus_id="0000:3b:00")])
    assert incidents.derive_from_xids(store) == 2
    got = {(r[1], r[2]) for r in rows(store)}
    assert got == {("n1", "GPU-abc"), ("n2", None)}


def test_late_first_event_does_not_duplicate_an_incident(store):
    store.insert_events([xid(5, 79)])
    assert incidents.derive_from_xids(store) == 1
    store.insert_events([xid(0, 48), xid(12, 79)])   # earlier event arrives late
    assert incidents.derive_from_xids(store) == 0
    store.insert_events([xid(16, 74)])               # past the burst of the incident at 5
    assert incidents.derive_from_xids(store, since=at(14)) == 1
    assert [r[0] for r in rows(store)] == [naive(5), naive(16)]


def test_operator_validation():
    with pytest.raises(incidents.IncidentError, match="valid causes: faulty_gpu"):
        incidents.validate(ts=T0, node="n1", kind="failure", cause="gremlins",
                           source="operator")
    with pytest.raises(incidents.IncidentError, match="kind 'broken'"):
        incidents.validate(ts=T0, node="n1", kind="broken", cause="faulty_gpu",
                           source="operator")
    assert incidents.parse_time("2025-03-01T10:00:00Z") == T0.replace(hour=10)
    assert incidents.parse_time("2025-03-01 12:00+02:00") == T0.replace(hour=10)
    assert incidents.parse_time("now", now=T0) == T0
    with pytest.raises(incidents.IncidentError, match="not ISO-8601"):
        incidents.parse_time("yesterday")


@pytest.mark.parametrize("name", ["sacctmgr_show_event.txt", "sacctmgr_show_event_p.txt",
                                  "sacctmgr_show_event_P.txt"])
def test_slurm_events_all_formats(name):
    found, skipped = parse_slurm_events((FIXTURES / name).read_text())
    assert skipped == 2          # 'Reboot ASAP' and 'planned kernel upgrade'
    assert [(i.node, i.ts, i.cause, i.mode, i.source) for i in found] == [
        ("gpu-node-017", dt.datetime(2025, 2, 27, 3, 14, 7, tzinfo=dt.UTC),
         "host_maintenance", None, "slurm"),
        ("gpu-node-022", dt.datetime(2025, 2, 27, 11, 2, 31, tzinfo=dt.UTC),
         "faulty_gpu", "pcie", "slurm"),
        ("gpu-node-031", dt.datetime(2025, 2, 28, 7, 45, 12, tzinfo=dt.UTC),
         "gpu_hbm3_memory", "hbm", "slurm"),
        ("gpu-node-040", dt.datetime(2025, 2, 28, 19, 3, 44, tzinfo=dt.UTC),
         "host_maintenance", None, "slurm"),
        ("gpu-node-044", dt.datetime(2025, 3, 1, 1, 10, 9, tzinfo=dt.UTC), "nic", None, "slurm"),
    ]
    assert all(i.kind == "failure" and i.gpu_uuid is None for i in found)


def test_slurm_headerless_parsable_and_bad_time():
    text = "c1|gpu[01-02]|2025-03-01T00:00:00|Unknown|DOWN|Not responding|slurm(1)\n"
    found, _ = parse_slurm_events(text)
    assert [i.node for i in found] == ["gpu01", "gpu02"]
    with pytest.raises(ImportProblem, match="line 2: TimeStart 'yesterday'"):
        parse_slurm_events("Cluster|NodeName|TimeStart|State|Reason\n"
                           "c1|n1|yesterday|DOWN|x\n")
    with pytest.raises(ImportProblem, match="lack NodeName"):
        parse_slurm_events("Cluster|Foo|Bar\nc|1|2\n")


def test_reason_keywords_and_our_own_drains():
    assert cause_from_reason("Xid 74 NVLink errors") == ("faulty_gpu", "nvlink")
    assert cause_from_reason("GSP timeout") == ("gpu_system_processor", "gsp")
    assert cause_from_reason("PSU failed") == ("power_supply", None)
    assert cause_from_reason("Node unexpectedly rebooted") == ("host_maintenance", None)
    found, skipped = parse_slurm_events(
        "c|n1|2025-03-01T00:00:00|Unknown|DRAIN|fleetcare: risk 0.91 HBM|root(0)\n")
    assert (found, skipped) == ([], 1)
    assert expand_hostlist("a[1-3],b7") == ["a1", "a2", "a3", "b7"]


def test_csv_all_or_nothing_with_line_numbers():
    good = ("ts,node,gpu_uuid,kind,cause,mode,note\n"
            "2025-03-01T10:00:00Z,n1,G0,failure,gpu_hbm3_memory,hbm,DBE\n"
            "2025-03-02T10:00:00,n1,,repair,gpu_hbm3_memory,,swapped GPU\n")
    found = parse_csv(good)
    assert [(i.ts, i.node, i.gpu_uuid, i.kind, i.mode, i.note, i.source) for i in found] == [
        (T0.replace(hour=10), "n1", "G0", "failure", "hbm", "DBE", "csv"),
        (T0.replace(day=2, hour=10), "n1", None, "repair", None, "swapped GPU", "csv")]
    bad = good + ("not-a-time,n2,,failure,faulty_gpu,,\n"
                  "2025-03-01T10:00:00Z,n3,,failure,gremlins,,\n"
                  "2025-03-01T10:00:00Z,,,failure,faulty_gpu,,\n"
                  "2025-03-01T10:00:00Z,n4,,failure,faulty_gpu,,,extra\n")
    with pytest.raises(ImportProblem) as exc:
        parse_csv(bad)
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "line 4", "line 5", "line 6", "line 7"]
    assert "cause 'gremlins' is unknown" in exc.value.problems[1]
    with pytest.raises(ImportProblem, match="lacks \\['cause'\\]"):
        parse_csv("ts,node,kind\n")


def test_a_failure_already_recorded_by_another_source_is_not_derived_again(tmp_path) -> None:
    import datetime as dt

    from fleetcare.collectors.contract import Incident, XidEvent
    from fleetcare.pipeline.incidents import derive_from_xids
    from fleetcare.pipeline.store import Store

    t = dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC)
    store = Store(tmp_path / "f.duckdb")
    store.insert_incidents([Incident(ts=t, node="n1", kind="failure", cause="gpu_hbm3_memory",
                                     source="sim", gpu_uuid="GPU-1", mode="hbm", xid=48)])
    store.insert_events([XidEvent(ts=t + dt.timedelta(seconds=30), node="n1", xid=48,
                                  message="DBE", source="sim", gpu_uuid="GPU-1")])
    assert derive_from_xids(store) == 0
    store.insert_events([XidEvent(ts=t + dt.timedelta(hours=5), node="n1", xid=48,
                                  message="DBE", source="sim", gpu_uuid="GPU-1")])
    assert derive_from_xids(store) == 1


def test_csv_takes_what_real_incident_data_holds():
    """Issue 16: a cause outside Table 5 (``unknown``, ``other`` with the text in the
    note), a repair with no failure before it, free text with commas and quotes."""
    text = ("ts,node,gpu_uuid,kind,cause,mode,note\n"
            "2025-03-01T10:00:00Z,n1,,failure,unknown,,\"Unknown Error, ticket #12\"\n"
            "2025-03-01T12:00:00Z,n2,,failure,other,,\"Fan: Speed Critical (Sensor) \"\"FAN3\"\"\"\n"
            "2025-03-02T10:00:00Z,n3,,repair,faulty_gpu,,reseated; no failure on record\n")
    found = parse_csv(text)
    assert [(i.node, i.kind, i.cause, i.note) for i in found] == [
        ("n1", "failure", "unknown", "Unknown Error, ticket #12"),
        ("n2", "failure", "other", 'Fan: Speed Critical (Sensor) "FAN3"'),
        ("n3", "repair", "faulty_gpu", "reseated; no failure on record")]
    with pytest.raises(ImportProblem, match="'other', with the text in the note"):
        parse_csv("ts,node,kind,cause\n2025-03-01T10:00:00Z,n1,failure,fan broke\n")
