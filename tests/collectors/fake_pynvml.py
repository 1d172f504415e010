"""A fake ``pynvml`` (nvidia-ml-py 13.x) driven by a scenario, for tests without a GPU.

Same function names and parameter names, same constant values, same return shapes
(ctypes structs where the real module returns them, device handles as ctypes pointers)
and the same NVMLError class tree as the real module; test_nvml_real_api.py checks it.

Use a fresh copy per test (``load()`` in test_nvml.py) and ``install(Scenario(...))``.
Scenario knobs: ``FakeGpu`` counters, ``errors`` (function name or ``field:<id>`` ->
NVML error code, e.g. NotSupported), ``lost`` (every call on that GPU raises
``lost_code``), ``events`` (queue of ``(gpu index, event type, xid)`` for
``nvmlEventSetWait``), ``init_error``. Every call is recorded in ``calls``.
"""

from __future__ import annotations

import ctypes
import functools
import queue
import string
import sys
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
)
from dataclasses import dataclass, field

# -- constants (values as in nvidia-ml-py 13.x) ------------------------------------------
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_ECC_SBE_AGG_TOTAL = 5
NVML_FI_DEV_ECC_DBE_AGG_TOTAL = 6
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999


# -- errors: NVMLError(value) returns the subclass for that code, as in pynvml ------------
class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        names = {v: k for k, v in globals().items() if k.startswith("NVML_ERROR_")}
        return names.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _extractNVMLErrorsAsClasses():
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(
            err_name.replace("NVML_ERROR_", ""), "_"
        ).replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        cls.__module__ = __name__
        setattr(this_module, class_name, cls)
        NVMLError._valClassMapping[err_val] = cls


_extractNVMLErrorsAsClasses()


# -- structures (same fields as pynvml) ------------------------------------------------
class struct_c_nvmlDevice_t(Structure):
    _fields_ = [("index", c_uint)]  # opaque in pynvml; the fake keeps the index inside


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)


class struct_c_nvmlEventSet_t(Structure):
    _fields_ = [("id", c_uint)]


c_nvmlEventSet_t = POINTER(struct_c_nvmlEventSet_t)


class nvmlPciInfo_t(Structure):
    _fields_ = [
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class c_nvmlFieldValue_t(Structure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlEventData_t(Structure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


# -- scenario ----------------------------------------------------------------------------
@dataclass
class FakeGpu:
    uuid: str
    pci_bus_id: str = "00000000:3B:00.0"  # NVML's busId spelling
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650123456789"
    mig_mode: tuple[int, int] = (0, 0)
    temp_c: int = 41
    mem_temp_c: int = 47
    power_mw: int = 312_500
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    util_gpu: int = 97
    util_mem: int = 61
    fb_used_bytes: int = 40 * 1024**3 + 5
    fb_total_bytes: int = 80 * 1024**3
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: {(0, 0): 3, (1, 0): 0, (0, 1): 120, (1, 1): 2}
    )  # (errorType, counterType) -> count
    remapped_rows: tuple[int, int, int, int] = (2, 1, 0, 0)
    retired_sbe: list[int] = field(default_factory=lambda: [0x1000, 0x2000])
    retired_dbe: list[int] = field(default_factory=lambda: [0x3000])
    retired_pending: int = 1
    pcie_replay: int = 17
    pcie_gen: int = 4
    pcie_gen_max: int = 5
    pcie_width: int = 8
    pcie_width_max: int = 16
    nvlink_up: list[int] = field(default_factory=lambda: [1, 1, 0, 1])
    nvlink_errors: dict[int, list[int]] = field(
        default_factory=lambda: {0: [5, 0, 1, 2], 1: [1, 0, 0, 3], 2: [9, 8, 7, 6], 3: [0, 4, 0, 0]}
    )  # NVML_NVLINK_ERROR_DL_* -> per-link counts
    clock_reasons: int = nvmlClocksEventReasonSwPowerCap | nvmlClocksEventReasonHwSlowdown
    errors: dict[str, int] = field(default_factory=dict)  # fn name or "field:<id>" -> code
    lost: bool = False
    lost_code: int = NVML_ERROR_GPU_IS_LOST


@dataclass
class Scenario:
    gpus: list[FakeGpu]
    driver_version: str = "570.133.20"
    init_error: int | None = None
    register_errors: dict[int, int] = field(default_factory=dict)  # gpu index -> code
    events: queue.Queue = field(default_factory=queue.Queue)  # (index, type, xid)
    has_event_reasons: bool = True


scenario: Scenario = Scenario(gpus=[])
calls: list[tuple[str, tuple]] = []
_handles: list = []
_initialized = 0


def install(new: Scenario) -> Scenario:
    global scenario, _handles
    scenario = new
    calls.clear()
    _handles = [ctypes.pointer(struct_c_nvmlDevice_t(i)) for i in range(len(new.gpus))]
    return new


def queue_xid(index: int, xid: int, event_type: int = nvmlEventTypeXidCriticalError) -> None:
    scenario.events.put((index, event_type, xid))


def _api(fn):
    """Record the call; raise the scenario's error for this function / lost GPU."""

    @functools.wraps(fn)
    def wrapper(*args):
        calls.append((fn.__name__, args))
        if fn.__name__ not in ("nvmlInit", "nvmlInitWithFlags") and not _initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if args and isinstance(args[0], c_nvmlDevice_t):
            gpu = _gpu(args[0])
            if gpu.lost:
                raise NVMLError(gpu.lost_code)
            if fn.__name__ in gpu.errors:
                raise NVMLError(gpu.errors[fn.__name__])
        return fn(*args)

    return wrapper


def _gpu(handle) -> FakeGpu:
    return scenario.gpus[handle.contents.index]


# -- API (names and parameter names as in pynvml) ---------------------------------------
@_api
def nvmlInit():
    global _initialized
    if scenario.init_error is not None:
        raise NVMLError(scenario.init_error)
    _initialized += 1


@_api
def nvmlShutdown():
    global _initialized
    _initialized = max(0, _initialized - 1)


@_api
def nvmlSystemGetDriverVersion():
    return scenario.driver_version


@_api
def nvmlDeviceGetCount():
    return len(scenario.gpus)


@_api
def nvmlDeviceGetHandleByIndex(index):
    if index >= len(scenario.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = scenario.gpus[index]
    if gpu.lost:
        raise NVMLError(gpu.lost_code)
    if "nvmlDeviceGetHandleByIndex" in gpu.errors:
        raise NVMLError(gpu.errors["nvmlDeviceGetHandleByIndex"])
    return c_nvmlDevice_t(_handles[index].contents)


@_api
def nvmlDeviceGetUUID(handle):
    return _gpu(handle).uuid


@_api
def nvmlDeviceGetPciInfo(handle):
    gpu = _gpu(handle)
    domain, bus, rest = gpu.pci_bus_id.split(":")
    info = nvmlPciInfo_t()
    info.busId = gpu.pci_bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
    return info


@_api
def nvmlDeviceGetName(handle):
    return _gpu(handle).name


@_api
def nvmlDeviceGetSerial(handle):
    return _gpu(handle).serial


@_api
def nvmlDeviceGetMigMode(device):
    return list(_gpu(device).mig_mode)


@_api
def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    return _gpu(handle).ecc[(errorType, counterType)]


@_api
def nvmlDeviceGetRemappedRows(device):
    return tuple(_gpu(device).remapped_rows)


@_api
def nvmlDeviceGetRetiredPages(device, sourceFilter):
    gpu = _gpu(device)
    if sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
        return list(gpu.retired_sbe)
    if sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
        return list(gpu.retired_dbe)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


@_api
def nvmlDeviceGetRetiredPagesPendingStatus(device):
    return int(_gpu(device).retired_pending)


@_api
def nvmlDeviceGetPcieReplayCounter(handle):
    return _gpu(handle).pcie_replay


@_api
def nvmlDeviceGetCurrPcieLinkGeneration(handle):
    return _gpu(handle).pcie_gen


@_api
def nvmlDeviceGetMaxPcieLinkGeneration(handle):
    return _gpu(handle).pcie_gen_max


@_api
def nvmlDeviceGetCurrPcieLinkWidth(handle):
    return _gpu(handle).pcie_width


@_api
def nvmlDeviceGetMaxPcieLinkWidth(handle):
    return _gpu(handle).pcie_width_max


@_api
def nvmlDeviceGetNvLinkState(device, link):
    gpu = _gpu(device)
    if link >= len(gpu.nvlink_up):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu.nvlink_up[link]


@_api
def nvmlDeviceGetNvLinkErrorCounter(device, link, counter):
    gpu = _gpu(device)
    if link >= len(gpu.nvlink_up):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if counter not in gpu.nvlink_errors:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.nvlink_errors[counter][link]


def _event_reasons(handle):
    return _gpu(handle).clock_reasons


@_api
def nvmlDeviceGetCurrentClocksEventReasons(handle):
    if not scenario.has_event_reasons:  # a driver before 535: the symbol is missing
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _event_reasons(handle)


@_api
def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return _event_reasons(handle)


@_api
def nvmlDeviceGetTemperature(handle, sensor):
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _gpu(handle).temp_c


@_api
def nvmlDeviceGetFieldValues(handle, fieldIds):
    gpu = _gpu(handle)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for i, fid in enumerate(fieldIds):
        fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
        values[i].fieldId, values[i].scopeId = fid, scope
        values[i].nvmlReturn = gpu.errors.get(f"field:{fid}", NVML_SUCCESS)
        if values[i].nvmlReturn != NVML_SUCCESS:
            continue
        value, vtype = _field_value(gpu, fid)
        if value is None:
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            continue
        values[i].valueType = vtype
        attr = "uiVal" if vtype == NVML_VALUE_TYPE_UNSIGNED_INT else "ullVal"
        setattr(values[i].value, attr, value)
    return values


def _field_value(gpu: FakeGpu, fid: int):
    ull, ui = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_UNSIGNED_INT
    ecc = {
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (0, 0),
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (1, 0),
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (0, 1),
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (1, 1),
    }
    if fid in ecc:
        return gpu.ecc[ecc[fid]], ull
    table = {
        NVML_FI_DEV_MEMORY_TEMP: (gpu.mem_temp_c, ui),
        NVML_FI_DEV_NVLINK_LINK_COUNT: (len(gpu.nvlink_up), ui),
        NVML_FI_DEV_PCIE_REPLAY_COUNTER: (gpu.pcie_replay, ull),
    }
    return table.get(fid, (None, None))


@_api
def nvmlDeviceGetPowerUsage(handle):
    return _gpu(handle).power_mw


@_api
def nvmlDeviceGetEnforcedPowerLimit(handle):
    return _gpu(handle).power_limit_mw


@_api
def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - pynvml's parameter name
    gpu = _gpu(handle)
    return {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.mem_clock_mhz}[type]


@_api
def nvmlDeviceGetUtilizationRates(handle):
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)


@_api
def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _gpu(handle)
    used, total = gpu.fb_used_bytes, gpu.fb_total_bytes
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


@_api
def nvmlEventSetCreate():
    return c_nvmlEventSet_t(struct_c_nvmlEventSet_t(1))


@_api
def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    index = handle.contents.index
    if index in scenario.register_errors:
        raise NVMLError(scenario.register_errors[index])


@_api
def nvmlEventSetWait(eventSet, timeoutms):
    try:
        index, event_type, xid = scenario.events.get(timeout=timeoutms / 1000)
    except queue.Empty:
        raise NVMLError(NVML_ERROR_TIMEOUT) from None
    data = c_nvmlEventData_t()
    data.device = _handles[index]
    data.eventType, data.eventData = event_type, xid
    return data


@_api
def nvmlEventSetFree(eventSet):
    return None
