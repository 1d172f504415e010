from __future__ import annotations

import datetime as dt
import json
import math
import urllib.error
from pathlib import Path

import pytest

from fleetcare.collectors.backend import BackendError, GpuBackend
from fleetcare.collectors.dcgm_exporter import (
    DcgmExporterBackend,
    ExpositionError,
    main_parse_dcgm,
    parse_exposition,
    samples_from_series,
)

FIX = Path(__file__).parent / "fixtures" / "dcgm"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def load(name: str):
    return samples_from_series(parse_exposition((FIX / name).read_text()), ts=NOW)


def test_exposition_parser_escapes_spaces_timestamps() -> None:
    text = ('# HELP x help with "quotes"\n# TYPE x gauge\n'
            'x{a="q\\"uote",b="back\\\\slash", c="new\\nline",} 1.5e3 1700000000000\n'
            'y NaN\nz{} +Inf\n\n')
    x, y, z = parse_exposition(text)
    assert x.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert (x.value, x.timestamp_ms) == (1500.0, 1700000000000)
    assert math.isnan(y.value) and z.value == math.inf and z.labels == {}


@pytest.mark.parametrize("bad", ['x{a="1" 2', "x{a=1} 2", "x", "x 1 2 3", "x{a=\"1\"} abc"])
def test_exposition_errors_name_the_line(bad: str) -> None:
    with pytest.raises(ExpositionError, match="line 2"):
        parse_exposition("ok 1\n" + bad)


def test_mig_a30_sample() -> None:
    samples, xids = load("issue317_a30_mig.txt")
    assert xids == {}
    s0, s1 = samples
    assert (s0.gpu_uuid, s0.gpu_index, s0.model, s0.node) == (
        "GPU-265c9814-6156-355b-e589-ff2064894f16", 0, "NVIDIA A30",
        "yg-data-k8s-gpu-a30-node-test-test0003.mt")
    assert (s0.gpu_temp_c, s0.fb_used_mib, s0.pcie_replay_count) == (35.0, 12, 0)
    assert (s1.gpu_temp_c, s1.fb_used_mib, s1.pcie_replay_count) == (35.0, 6, 0)
    # absent series are null, never 0
    assert s0.power_w is None and s0.ecc_uncorrected_volatile is None
    assert s0.nvlink_crc_flit is None and s0.retired_pages_dbe is None


def test_pci_bus_id_and_lowercase_hostname() -> None:
    samples, _ = load("pr736_mixed_models.txt")
    assert [(s.gpu_index, s.pci_bus_id, s.model, s.gpu_temp_c, s.fb_used_mib) for s in samples] == [
        (0, "00000000:65:00.0", "NVIDIA A30", 50.0, 3744),
        (1, "00000000:B1:00.0", "NVIDIA RTX 2000 Ada Generation", 44.0, None),
        (2, "00000000:CA:00.0", "NVIDIA A30", 45.0, None)]
    assert {s.node for s in samples} == {"dcgm-exporter-wwwjh"}


def test_blank_sentinel_is_null_and_spaces_in_labels() -> None:
    (s,), _ = load("readme_quickstart.txt")
    assert (s.sm_clock_mhz, s.mem_clock_mhz, s.mem_temp_c) == (139, 405, None)
    assert s.node == "unknown" and s.model == ""


def test_unknown_series_ignored() -> None:
    samples, _ = load("issue581_gb200_nvlink_count.txt")
    assert [(s.gpu_index, s.pci_bus_id) for s in samples] == [
        (0, "00000008:01:00.0"), (1, "00000009:01:00.0"), (2, "00000018:01:00.0"),
        (3, "00000019:01:00.0")]
    assert all(s.nvlink_recovery is None for s in samples)


# Synthetic (not a recorded scrape): reliability counters that the default CSV disables.
SYNTH = """\
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0",UUID="GPU-x",pci_bus_id="00000000:3B:00.0",modelName="H100",Hostname="h1"} 7
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu="0",UUID="GPU-x"} 1
DCGM_FI_DEV_RETIRED_PENDING{gpu="0",UUID="GPU-x"} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",UUID="GPU-x"} 1
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x"} 312.5
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{gpu="0",UUID="GPU-x"} 2
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L2{gpu="0",UUID="GPU-x"} 5
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="0",UUID="GPU-x"} 7
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-x"} %d
"""


def test_reliability_counters_mapping() -> None:
    (s,), xids = samples_from_series(parse_exposition(SYNTH % 0), ts=NOW)
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_aggregate) == (7, 1)
    assert (s.retired_pages_pending, s.remapped_rows_failure, s.power_w) == (False, True, 312.5)
    assert s.nvlink_crc_flit == [2, 0, 5]
    assert xids == {"GPU-x": 0}


def test_backend_xid_change_becomes_event() -> None:
    pages = iter([SYNTH % 0, SYNTH % 0, SYNTH % 79])
    b = DcgmExporterBackend("http://x/metrics", "node-9",
                            fetch=lambda url, timeout: next(pages).encode())
    assert isinstance(b, GpuBackend) and b.name == "dcgm-exporter"
    r1 = b.poll(NOW)
    assert r1.events == [] and r1.samples[0].node == "node-9" and r1.samples[0].ts == NOW
    assert b.poll(NOW).events == []
    (e,) = b.poll(NOW).events
    assert (e.xid, e.gpu_uuid, e.gpu_index, e.pci_bus_id, e.source) == (
        79, "GPU-x", 0, "00000000:3B:00.0", "dcgm")


def test_backend_errors_carry_a_fix_hint() -> None:
    def down(url: str, timeout: float) -> bytes:
        raise urllib.error.URLError("connection refused")
    with pytest.raises(BackendError, match="port 9400"):
        DcgmExporterBackend("http://x/metrics", "n", fetch=down).poll(NOW)
    with pytest.raises(BackendError, match="Prometheus text"):
        DcgmExporterBackend("http://x", "n", fetch=lambda u, t: b"<html>").poll(NOW)


def test_main_parse_dcgm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_parse_dcgm([str(FIX / "issue250_v100.txt")]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["node"], r["gpu_index"], r["gpu_uuid"], r["model"], r["sm_clock_mhz"]) for r in rows] == [
        ("r6i3n0", 0, "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd", "Tesla V100-SXM2-32GB", 135),
        ("r6i3n0", 1, "GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5", "Tesla V100-SXM2-32GB", 135)]
    assert "gpu_temp_c" not in rows[0]  # null fields are omitted on the wire


def test_main_parse_dcgm_default_node_and_errors(capsys, tmp_path) -> None:
    assert main_parse_dcgm([str(FIX / "readme_quickstart.txt"), "--node", "n7"]) == 0
    assert json.loads(capsys.readouterr().out)["node"] == "n7"
    bad = tmp_path / "bad.txt"
    bad.write_text("x{ 1\n")
    assert main_parse_dcgm([str(bad)]) == 1
    assert "not Prometheus text format" in capsys.readouterr().err


# -- issue 13: every DCGM "no value" sentinel is null; relabelled lower-case names ---------------
SENTINEL_PAGE = """\
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0",UUID="GPU-s",modelName="<<<NOT_SUPPORTED>>>"} %s
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",UUID="GPU-s"} %s
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-s"} %s
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-s"} %s
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{gpu="0",UUID="GPU-s"} 4
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1{gpu="0",UUID="GPU-s"} %s
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-s"} 40
"""


@pytest.mark.parametrize("offset", [0, 1, 2, 3], ids=["blank", "not_found", "not_supported",
                                                      "not_permissioned"])
def test_every_dcgm_sentinel_becomes_null(offset: int) -> None:
    """dcgm_structs.h: *_BLANK, +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED, for
    int64 (9223372036854775792 + k, e.g. 9223372036854775794 as real scrapes show it),
    fp64 (140737488355328.0 + k) and int32 (2147483632 + k); and the string sentinels."""
    int64, fp64, int32 = 0x7FFFFFFFFFFFFFF0 + offset, 140737488355328.0 + offset, 0x7FFFFFF0 + offset
    page = SENTINEL_PAGE % (int64, int64, fp64, int32, int64)
    (s,), _ = samples_from_series(parse_exposition(page), ts=NOW)
    assert (s.ecc_corrected_volatile, s.pcie_replay_count, s.power_w, s.sm_clock_mhz) == (
        None, None, None, None)
    assert s.nvlink_crc_flit is None  # one blank link: not a list with a made-up 0
    assert s.model == "" and s.gpu_temp_c == 40.0


def test_relabelled_lower_case_metric_names_are_read() -> None:
    """A relabelling pipeline that lower-cases metric names: the same fields come out."""
    (upper,), _ = samples_from_series(parse_exposition(SYNTH % 0), ts=NOW)
    (lower,), _ = samples_from_series(parse_exposition(
        "\n".join(line.split("{")[0].lower() + "{" + line.split("{", 1)[1]
                  for line in (SYNTH % 0).splitlines())), ts=NOW)
    assert lower == upper


def test_parse_dcgm_says_when_it_found_no_dcgm_field(tmp_path, capsys) -> None:
    """Was: a page with no field fleetcare knows printed nothing and exited 0."""
    page = tmp_path / "other.txt"
    page.write_text('node_cpu_seconds_total{cpu="0",mode="idle"} 1\n'
                    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-1"} 0.5\n')
    assert main_parse_dcgm([str(page)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    [line] = out.err.splitlines()
    assert line.startswith(f"parse-dcgm: {page}: no DCGM field fleetcare maps among 2 series")
    assert "DCGM_FI_DEV_GPU_TEMP" in line


def test_backend_warns_once_when_the_page_has_no_known_field(caplog) -> None:
    b = DcgmExporterBackend("http://x/metrics", "n",
                            fetch=lambda u, t: b'up{job="x"} 1\n')
    with caplog.at_level("WARNING"):
        assert b.poll(NOW).samples == [] and b.poll(NOW).samples == []
    warned = [r.getMessage() for r in caplog.records if "dcgm.no_known_fields" in r.getMessage()]
    assert len(warned) == 1 and "url=http://x/metrics" in warned[0]
