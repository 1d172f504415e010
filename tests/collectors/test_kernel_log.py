from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from fleetcare.collectors.backend import BackendError, GpuBackend
from fleetcare.collectors.kernel_log import KernelLogBackend, main_parse_kmsg, parse_lines

FIX = Path(__file__).parent / "fixtures" / "kmsg"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def parse(name: str, year: int = 2026):
    return list(parse_lines((FIX / name).read_text().splitlines(True), year=year))


def triples(events):
    return [(e.xid, e.pci, e.pid, e.process) for e in events if not e.nvswitch]


def test_multiline_fallen_off_bus_is_one_xid_79_with_uuid() -> None:
    out = parse("dmesg_fallen_off_bus_sxid.txt")
    gpu = [e for e in out if not e.nvswitch]
    assert triples(gpu) == [(79, "0000:91:00", None, None)]
    assert gpu[0].message == "GPU has fallen off the bus."
    assert gpu[0].gpu_uuid == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    assert gpu[0].mono_s == pytest.approx(6781741.548779)
    assert gpu[0].ts is None


def test_sxid_lines() -> None:
    sx = [e for e in parse("dmesg_fallen_off_bus_sxid.txt") if e.nvswitch]
    assert [(e.sxid, e.pci, e.xid) for e in sx] == [
        (20034, "0000:06:00.0", None), (20034, "0000:05:00.0", None),
        (20034, "0000:07:00.0", None), (20034, "0000:05:00.0", None)]
    assert sx[0].message == "Fatal, Link 48 LTSSM Fault Up"


def test_fallen_off_bus_without_xid_number_is_79_once() -> None:
    out = parse("dmesg_fallen_off_no_xid.txt")
    assert triples(out) == [(79, "0000:b3:00", None, None)]
    assert out[0].message == ("The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in "
                              "this system has fallen off the bus and is not responding to "
                              "commands.")


def test_dmesg_T_prefix_and_unknown_pid() -> None:
    out = parse("dmesg_T_gpud.txt")
    assert triples(out) == [
        (13, "0000:cb:00", None, None), (13, "0000:cb:00", None, None),
        (13, "0000:cb:00", None, None), (109, "0000:cb:00", 1797828, "pt_main_thread"),
        (31, "0000:cb:00", 626486, "pt_main_thread"), (109, "0000:cb:00", 1158578, "pt_main_thread")]
    assert out[0].ts == dt.datetime(2024, 8, 30, 11, 43, 9)
    assert out[3].message == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"


def test_journal_iso_and_syslog_prefixes() -> None:
    out = parse("journal_precise_and_syslog.txt")
    assert triples(out) == [(79, "0000:01:00", 30393, "Media"), (154, "0000:01:00", None, None),
                            (79, "0000:01:00", None, None), (154, "0000:01:00", None, None)]
    tz3 = dt.timezone(dt.timedelta(hours=3))
    assert out[0].ts == dt.datetime(2026, 6, 1, 15, 55, 6, 218036, tzinfo=tz3)
    assert out[2].ts == dt.datetime(2026, 6, 1, 20, 11, 11)  # syslog: naive, year given


def test_journal_short_iso() -> None:
    (e,) = parse("constructed_journal_short_iso.txt")
    assert (e.xid, e.pci, e.pid, e.process) == (109, "0000:cb:00", 1797828, "pt_main_thread")
    assert e.ts == dt.datetime(2024, 8, 30, 11, 43, 14, tzinfo=dt.UTC)


def test_syslog_and_bare_kernel_prefixes() -> None:
    assert triples(parse("syslog_xid_1_9.txt", 2015)) == [(1, "0000:01:00", None, None),
                                                          (9, "0000:01:00", None, None)]
    assert parse("syslog_xid_1_9.txt", 2015)[0].ts == dt.datetime(2015, 7, 15, 11, 11, 58)
    assert triples(parse("kernel_prefix_xid45.txt")) == [(45, "0000:dc:00", 1818990, "python3"),
                                                         (45, "0000:ed:00", 1818992, "python3")]


def test_misc_driver_forms() -> None:
    out = parse("dmesg_misc_forms.txt")
    assert triples(out) == [(32, "0000:01:00", None, None), (31, "0000:01:00", None, None),
                            (79, "0000:01:00", 8828, None), (62, "0000:01:00", 2763, None)]
    assert out[3].message == "0c83(1870) 00000000 00000000"
    assert out[2].gpu_uuid == "GPU-18af74bb-7c72-ff70-e447-87d48378ea20"
    assert [e.sxid for e in out if e.nvswitch] == [22013]


def test_kmsg_records() -> None:
    out = parse("constructed_kmsg_records.txt")
    assert triples(out) == [(79, "0000:91:00", None, None),
                            (109, "0000:cb:00", 1797828, "pt_main_thread")]
    assert out[0].mono_s == pytest.approx(6781741.548779)


def test_main_parse_kmsg(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_parse_kmsg([str(FIX / "dmesg_fallen_off_bus_sxid.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x) for x in lines] == [
        {"xid": 79, "pci": "0000:91:00", "pid": None, "process": None,
         "message": "GPU has fallen off the bus."}]


def test_main_parse_kmsg_stdin(capsys, monkeypatch) -> None:
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO((FIX / "kernel_prefix_xid45.txt").read_text()))
    assert main_parse_kmsg(["-"]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert out[1] == {"xid": 45, "pci": "0000:ed:00", "pid": 1818992, "process": "python3",
                      "message": "Ch 0000000c caused by previous Xid 145"}


def test_main_parse_kmsg_missing_file(capsys, tmp_path) -> None:
    assert main_parse_kmsg([str(tmp_path / "nope")]) == 1
    assert "cannot read" in capsys.readouterr().err


def _wait_for(backend: KernelLogBackend, n: int, timeout: float = 5.0):
    events = []
    deadline = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < deadline:
        events += backend.poll(NOW).events
        time.sleep(0.02)
    return events


def test_file_follow_backend(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line: NVRM: Xid (PCI:0000:aa:00): 13, old, must not be reported\n")
    mapping = {"0000:91:00": ("GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b", 3)}
    b = KernelLogBackend("node-a", str(log), pci_to_gpu=mapping.get, poll_interval_s=0.01)
    try:
        assert isinstance(b, GpuBackend) and b.name == "kernel-log"
        with log.open("a") as fh:
            fh.write((FIX / "dmesg_fallen_off_bus_sxid.txt").read_text())
            fh.write((FIX / "constructed_journal_short_iso.txt").read_text())
        events = _wait_for(b, 2)
        assert [(e.xid, e.pci_bus_id, e.gpu_uuid, e.gpu_index, e.source) for e in events] == [
            (79, "0000:91:00", "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b", 3, "kernel-log"),
            (109, "0000:cb:00", None, None, "kernel-log")]
        assert events[0].node == "node-a"
        assert events[0].ts.tzinfo is not None  # no wall clock in dmesg: time it was read
        assert events[1].ts == dt.datetime(2024, 8, 30, 11, 43, 14, tzinfo=dt.UTC)
        assert events[1].pid == 1797828 and events[1].process == "pt_main_thread"
        assert b.sxid_seen == 4
        assert b.poll(NOW).events == []
    finally:
        b.close()


def test_kmsg_format_through_file_backend(tmp_path: Path) -> None:
    f = tmp_path / "kmsg"
    f.write_text("")
    b = KernelLogBackend("n", str(f), poll_interval_s=0.01)
    try:
        f.write_text((FIX / "constructed_kmsg_records.txt").read_text())
        events = _wait_for(b, 2)
        assert [(e.xid, e.pci_bus_id, e.pid) for e in events] == [
            (79, "0000:91:00", None), (109, "0000:cb:00", 1797828)]
    finally:
        b.close()


def test_queue_bound_counts_drops(tmp_path: Path, caplog) -> None:
    f = tmp_path / "kern.log"
    f.write_text("")
    b = KernelLogBackend("n", str(f), queue_size=2, poll_interval_s=0.01)
    try:
        with f.open("a") as fh:
            fh.write((FIX / "dmesg_T_gpud.txt").read_text())  # 6 XIDs
        deadline = time.monotonic() + 5
        while b.dropped < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.dropped == 4
        assert len(b.poll(NOW).events) == 2
        assert "kernel_log.queue_full" in caplog.text
    finally:
        b.close()


def test_unopenable_source_is_a_backend_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="cannot open"):
        KernelLogBackend("n", str(tmp_path / "missing.log"))
    with pytest.raises(BackendError, match="journalctl"):
        KernelLogBackend("n", "journalctl", journal_cmd=[str(tmp_path / "no-journalctl")])
