"""NvmlBackend against the scenario-driven fake pynvml (tests/collectors/fake_pynvml.py)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import itertools
import sys
import time
from pathlib import Path

import pytest

from fleetcare.collectors.backend import BackendError, GpuBackend
from fleetcare.collectors.contract import GpuSample, Incident
from fleetcare.collectors.nvml import NVML_FUNCTIONS, NvmlBackend, normalize_pci_bus_id

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
_FAKE = Path(__file__).with_name("fake_pynvml.py")
_copies = itertools.count()


def load_fake():
    """A fresh copy of the fake module (its own state and error classes)."""
    name = f"fake_pynvml_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, _FAKE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake():
    module = load_fake()
    module.install(
        module.Scenario(
            gpus=[
                module.FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0"),
                module.FakeGpu(uuid="GPU-bbbb", pci_bus_id="00000000:86:00.0", temp_c=55),
            ]
        )
    )
    yield module
    sys.modules.pop(module.__name__, None)


def backend(fake, **kw) -> NvmlBackend:
    kw.setdefault("event_timeout_ms", 5)
    return NvmlBackend("node-7", nvml=fake, clock=lambda: 1_740_830_400.0, **kw)


def wait_for(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_every_contract_field_equals_the_fake(fake):
    b = backend(fake, events=False)
    assert isinstance(b, GpuBackend)
    reading = b.poll(NOW)
    assert reading.events == [] and reading.incidents == []
    assert reading.samples[0] == GpuSample(
        ts=NOW,
        node="node-7",
        gpu_uuid="GPU-aaaa",
        gpu_index=0,
        pci_bus_id="0000:3b:00.0",
        model="NVIDIA H100 80GB HBM3",
        gpu_temp_c=41.0,
        mem_temp_c=47.0,
        power_w=312.5,
        power_limit_w=700.0,
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        util_gpu_pct=97.0,
        util_mem_pct=61.0,
        fb_used_mib=40 * 1024,
        fb_total_mib=80 * 1024,
        ecc_corrected_volatile=3,
        ecc_uncorrected_volatile=0,
        ecc_corrected_aggregate=120,
        ecc_uncorrected_aggregate=2,
        retired_pages_sbe=2,
        retired_pages_dbe=1,
        retired_pages_pending=True,
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=1,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        pcie_replay_count=17,
        pcie_link_gen=4,
        pcie_link_gen_max=5,
        pcie_link_width=8,
        pcie_link_width_max=16,
        nvlink_up=[True, True, False, True],
        nvlink_crc_flit=[9, 8, 7, 6],
        nvlink_crc_data=[0, 4, 0, 0],
        nvlink_replay=[5, 0, 1, 2],
        nvlink_recovery=[1, 0, 0, 3],
        clock_event_reasons=0x4 | 0x8,
    )
    assert reading.samples[1].gpu_uuid == "GPU-bbbb"
    assert reading.samples[1].gpu_temp_c == 55.0
    assert b.errors_by_function == {}
    assert b.driver_version == "570.133.20"
    assert [(g.serial, g.mig_enabled, g.nvlink_count) for g in b.gpus] == [
        ("1650123456789", False, 4)
    ] * 2
    b.close()


def test_batched_fields_save_the_direct_calls(fake):
    b = backend(fake, events=False)
    fake.calls.clear()
    b.poll(NOW)
    names = [name for name, _ in fake.calls]
    assert names.count("nvmlDeviceGetFieldValues") == 2  # one per GPU
    assert "nvmlDeviceGetTotalEccErrors" not in names
    assert "nvmlDeviceGetPcieReplayCounter" not in names
    assert set(names) <= set(NVML_FUNCTIONS)
    b.close()


def test_failed_batched_fields_fall_back_to_direct_calls(fake):
    gpu = fake.scenario.gpus[0]
    gpu.errors = {f"field:{fake.NVML_FI_DEV_ECC_DBE_AGG_TOTAL}": fake.NVML_ERROR_NOT_SUPPORTED}
    gpu.errors[f"field:{fake.NVML_FI_DEV_PCIE_REPLAY_COUNTER}"] = fake.NVML_ERROR_NOT_SUPPORTED
    b = backend(fake, events=False)
    sample = b.poll(NOW).samples[0]
    assert sample.ecc_uncorrected_aggregate == 2
    assert sample.pcie_replay_count == 17
    assert sample.ecc_corrected_volatile == 3
    fake.calls.clear()
    b.poll(NOW)
    batches = [a[1] for n, a in fake.calls if n == "nvmlDeviceGetFieldValues"]
    assert fake.NVML_FI_DEV_ECC_DBE_AGG_TOTAL not in batches[0]  # not asked again
    assert b.errors_by_function == {
        f"nvmlDeviceGetFieldValues({fake.NVML_FI_DEV_ECC_DBE_AGG_TOTAL})": 1,
        f"nvmlDeviceGetFieldValues({fake.NVML_FI_DEV_PCIE_REPLAY_COUNTER})": 1,
    }
    b.close()


def test_unsupported_is_none_never_zero_and_counted_once(fake):
    gpu = fake.scenario.gpus[1]
    ns, perm = fake.NVML_ERROR_NOT_SUPPORTED, fake.NVML_ERROR_NO_PERMISSION
    gpu.errors = {
        "nvmlDeviceGetRetiredPages": ns,
        "nvmlDeviceGetRetiredPagesPendingStatus": ns,
        "nvmlDeviceGetRemappedRows": ns,
        "nvmlDeviceGetPowerUsage": perm,
        "nvmlDeviceGetNvLinkErrorCounter": ns,
        "nvmlDeviceGetMigMode": ns,
        "nvmlDeviceGetSerial": ns,
        f"field:{fake.NVML_FI_DEV_MEMORY_TEMP}": ns,
    }
    gpu.nvlink_up = []  # no NVLink: link count 0
    b = backend(fake, events=False)
    for _ in range(3):
        sample = b.poll(NOW).samples[1]
    assert sample.retired_pages_sbe is None and sample.retired_pages_dbe is None
    assert sample.retired_pages_pending is None
    assert sample.remapped_rows_correctable is None and sample.remapped_rows_failure is None
    assert sample.power_w is None and sample.mem_temp_c is None
    assert sample.nvlink_up is None and sample.nvlink_crc_flit is None
    assert sample.power_limit_w == 700.0
    assert (b.gpus[1].serial, b.gpus[1].mig_enabled) == (None, None)
    assert b.errors_by_function == {
        "nvmlDeviceGetSerial": 1,
        "nvmlDeviceGetMigMode": 1,
        "nvmlDeviceGetRetiredPages": 2,  # one per cause
        "nvmlDeviceGetRetiredPagesPendingStatus": 1,
        "nvmlDeviceGetRemappedRows": 1,
        "nvmlDeviceGetPowerUsage": 1,
        f"nvmlDeviceGetFieldValues({fake.NVML_FI_DEV_MEMORY_TEMP})": 1,
    }
    b.close()


def test_one_unsupported_link_counter_nulls_that_list(fake):
    fake.scenario.gpus[0].nvlink_errors.pop(fake.NVML_NVLINK_ERROR_DL_CRC_DATA)
    b = backend(fake, events=False)
    sample = b.poll(NOW).samples[0]
    assert sample.nvlink_crc_data is None
    assert sample.nvlink_crc_flit == [9, 8, 7, 6]
    assert b.errors_by_function == {"nvmlDeviceGetNvLinkErrorCounter": 4}
    b.close()


def test_an_unsigned_64_bit_sentinel_is_null_not_a_count(fake):
    """Issue 13: NVML's counters are unsigned 64-bit and 2**64-1 means "not available";
    nothing from DCGM_INT64_BLANK (2**63-16) up is a count. Null at the source: ingest
    would otherwise quarantine the whole sample (sentinel_value)."""
    gpu = fake.scenario.gpus[0]
    gpu.pcie_replay = 2**64 - 1
    gpu.ecc[(0, 1)] = 2**64 - 1
    gpu.nvlink_errors[2] = [9, 2**64 - 1, 7, 6]
    b = backend(fake, events=False)
    sample = b.poll(NOW).samples[0]
    assert (sample.pcie_replay_count, sample.ecc_corrected_aggregate) == (None, None)
    assert sample.nvlink_crc_flit is None  # one link not available: no made-up list
    assert sample.ecc_corrected_volatile == 3 and sample.nvlink_crc_data is not None
    b.close()


def test_old_driver_falls_back_to_throttle_reasons(fake):
    fake.scenario.has_event_reasons = False
    b = backend(fake, events=False)
    assert b.poll(NOW).samples[0].clock_event_reasons == 0xC
    assert b.errors_by_function == {"nvmlDeviceGetCurrentClocksEventReasons": 2}
    b.poll(NOW)
    assert b.errors_by_function == {"nvmlDeviceGetCurrentClocksEventReasons": 2}
    b.close()


@pytest.mark.parametrize("code_name", ["NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN"])
def test_lost_gpu_reports_once_and_the_others_continue(fake, code_name):
    b = backend(fake, events=False)
    assert len(b.poll(NOW).samples) == 2
    gpu = fake.scenario.gpus[0]
    gpu.lost, gpu.lost_code = True, getattr(fake, code_name)
    later = NOW + dt.timedelta(seconds=10)
    reading = b.poll(later)
    assert [s.gpu_uuid for s in reading.samples] == ["GPU-bbbb"]
    (event,) = reading.events
    assert event.xid is None and event.source == "nvml"
    assert event.message.startswith(f"GPU is lost ({code_name})")
    assert (event.gpu_uuid, event.gpu_index, event.pci_bus_id) == ("GPU-aaaa", 0, "0000:3b:00.0")
    assert reading.incidents == [
        Incident(
            ts=later,
            node="node-7",
            kind="failure",
            cause="faulty_gpu",
            source="nvml",
            gpu_uuid="GPU-aaaa",
            mode="lost",
            note=event.message,
        )
    ]
    fake.calls.clear()
    again = b.poll(later)
    assert again.events == [] and again.incidents == []
    assert [s.gpu_uuid for s in again.samples] == ["GPU-bbbb"]
    assert all(args[0].contents.index == 1 for _, args in fake.calls)  # GPU 0 skipped
    b.close()


def test_gpu_lost_at_discovery_is_reported_at_first_poll(fake):
    fake.scenario.gpus[1].lost = True
    b = backend(fake, events=False)
    reading = b.poll(NOW)
    assert [s.gpu_uuid for s in reading.samples] == ["GPU-aaaa"]
    assert [(e.xid, e.gpu_index) for e in reading.events] == [(None, 1)]
    assert [i.mode for i in reading.incidents] == ["lost"]
    assert b.poll(NOW).incidents == []
    b.close()


def test_xid_events_arrive_through_the_thread(fake):
    b = backend(fake)
    fake.queue_xid(1, 79)
    fake.queue_xid(0, 48)
    fake.queue_xid(0, 0, event_type=0x1)  # not an XID: ignored
    assert wait_for(lambda: b._events.qsize() == 2)
    reading = b.poll(NOW)
    xids = [(e.xid, e.gpu_uuid, e.gpu_index, e.pci_bus_id, e.source) for e in reading.events]
    assert xids == [
        (79, "GPU-bbbb", 1, "0000:86:00.0", "nvml"),
        (48, "GPU-aaaa", 0, "0000:3b:00.0", "nvml"),
    ]
    assert reading.events[0].ts == dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
    assert b.poll(NOW).events == []
    b.close()


def test_event_queue_is_bounded_and_counts_drops(fake):
    b = backend(fake, event_queue_size=3)
    for xid in range(10):
        fake.queue_xid(0, 100 + xid)
    assert wait_for(lambda: b.events_dropped == 7)
    assert [e.xid for e in b.poll(NOW).events] == [100, 101, 102]
    b.close()


def test_register_not_supported_skips_that_gpu(fake):
    fake.scenario.register_errors = {0: fake.NVML_ERROR_NOT_SUPPORTED}
    b = backend(fake)
    assert b.errors_by_function == {"nvmlDeviceRegisterEvents": 1}
    assert b._thread is not None and b._thread.is_alive()
    b.close()


def test_close_stops_the_thread_frees_the_set_and_shuts_down(fake):
    b = backend(fake)
    thread = b._thread
    assert thread.is_alive()
    b.close()
    assert not thread.is_alive()
    names = [name for name, _ in fake.calls]
    assert names[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]
    b.close()  # idempotent
    assert [name for name, _ in fake.calls].count("nvmlShutdown") == 1


def test_init_failure_says_how_to_fix(fake):
    fake.scenario.init_error = fake.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendError, match="is the NVIDIA driver loaded") as info:
        backend(fake)
    assert info.value.backend == "nvml"


def test_missing_pynvml_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(BackendError, match=r"pip install 'fleetcare-collectors\[nvml\]'"):
        NvmlBackend("node-7")


def test_pci_to_gpu_accepts_every_spelling(fake):
    b = backend(fake, events=False)
    for spelling in ("0000:3b:00", "00000000:3B:00.0", "PCI:0000:3b:00", "3b:00.0"):
        assert b.pci_to_gpu(spelling) == ("GPU-aaaa", 0)
    assert b.pci_to_gpu("0000:86:00.0") == ("GPU-bbbb", 1)
    assert b.pci_to_gpu("0000:99:00") is None
    assert b.pci_to_gpu("not a pci id") is None
    b.close()


def test_normalize_pci_bus_id_rejects_garbage():
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    with pytest.raises(ValueError, match="'zz' is not of the form"):
        normalize_pci_bus_id("zz")


def test_handles_differ_by_object_but_events_still_match(fake):
    """pynvml hands out new pointer objects for one device; matching is by address."""
    fake.nvmlInit()
    a, b_ = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(0)
    assert a is not b_ and a != b_
    fake.nvmlShutdown()
