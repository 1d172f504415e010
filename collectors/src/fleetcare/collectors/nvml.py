"""The NVML backend: every GPU of this node read through NVIDIA's management library.

``NvmlBackend(node, nvml=pynvml)`` discovers the GPUs once (UUID, PCI bus id, model,
serial, driver version, MIG mode, NVLink link count, max PCIe gen/width), then reads
every ``GpuSample`` field on each ``poll``. XID events arrive on an NVML event set
watched by a daemon thread and are drained by ``poll`` from a bounded queue.

Every NVML call goes through ``NvmlBackend._call``: NotSupported / NoPermission /
FunctionNotFound become ``None`` (remembered, so an unsupported call is not retried on
every tick), every failure is counted in ``errors_by_function`` (name -> count), and
GpuIsLost / Unknown turn that GPU into one lost-GPU ``XidEvent`` (``xid=None``) plus
one ``Incident(cause="faulty_gpu", mode="lost")``; the GPU is skipped afterwards.

Batched through ``nvmlDeviceGetFieldValues`` (one call per GPU per poll instead of
six): the memory temperature (``NVML_FI_DEV_MEMORY_TEMP``, only reachable this way),
the four ECC totals (``NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL``, the counters
``nvmlDeviceGetTotalEccErrors`` returns) and the PCIe replay counter
(``NVML_FI_DEV_PCIE_REPLAY_COUNTER``). A batched field that fails falls back to its
direct call (``nvmlDeviceGetTotalEccErrors`` / ``nvmlDeviceGetPcieReplayCounter``) and
is left out of later batches. The NVLink link count comes from
``NVML_FI_DEV_NVLINK_LINK_COUNT`` at discovery. NVLink CRC flit and CRC data counters
exist separately only through ``nvmlDeviceGetNvLinkErrorCounter``, so links are read
per link. ``pci_bus_id`` values are normalised to the sysfs form ``0000:3b:00.0``.
NVML's counters are unsigned 64-bit: a value no count reaches (2**64-1 is "not
available") is made null (``contract.null_sentinels``), never sent as a count.

Exceptions: only ``BackendError`` (pynvml missing, nvmlInit failed).
"""

from __future__ import annotations

import ctypes
import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fleetcare.collectors.backend import BackendError, Reading
from fleetcare.collectors.contract import GpuSample, Incident, XidEvent, null_sentinels, utc

log = logging.getLogger(__name__)

NVML_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
)
"""Every pynvml function this backend may call (checked against the real module)."""

NVML_CONSTANTS: tuple[str, ...] = (
    "NVML_SUCCESS",
    "NVML_FEATURE_ENABLED",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_VOLATILE_ECC",
    "NVML_AGGREGATE_ECC",
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
    "NVML_TEMPERATURE_GPU",
    "NVML_CLOCK_SM",
    "NVML_CLOCK_MEM",
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_NVLINK_LINK_COUNT",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "NVML_VALUE_TYPE_DOUBLE",
    "NVML_VALUE_TYPE_UNSIGNED_INT",
    "NVML_VALUE_TYPE_UNSIGNED_LONG",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG",
    "NVML_VALUE_TYPE_SIGNED_INT",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_UNKNOWN",
    "nvmlEventTypeXidCriticalError",
)
"""Every pynvml constant this backend uses (checked against the real module)."""

_UNSUPPORTED = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
_LOST = {"NVMLError_GpuIsLost": "NVML_ERROR_GPU_IS_LOST", "NVMLError_Unknown": "NVML_ERROR_UNKNOWN"}
_MIB = 1024 * 1024
_FIELD_ATTR = {  # NVML_VALUE_TYPE_* name -> c_nvmlValue_t member
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}


def normalize_pci_bus_id(pci: str) -> str:
    """``00000000:3B:00.0``, ``0000:3b:00``, ``PCI:0000:3b:00`` -> ``0000:3b:00.0``.

    Raises ``ValueError`` naming the value when it is not a PCI address.
    """
    text = pci.strip().lower().removeprefix("pci:")
    try:
        head, _, function = text.partition(".")
        parts = head.split(":")
        if len(parts) == 2:
            parts.insert(0, "0")
        domain, bus, device = (int(p, 16) for p in parts)
        fn = int(function, 16) if function else 0
    except ValueError:
        raise ValueError(
            f"PCI bus id {pci!r} is not of the form [domain:]bus:device[.function]"
        ) from None
    return f"{domain:04x}:{bus:02x}:{device:02x}.{fn:x}"


def _handle_key(handle: Any) -> int:
    """A stable key for a device handle: its address for ctypes pointers (two pointer
    objects to one device compare unequal), else the object's identity."""
    try:
        return ctypes.addressof(handle.contents)
    except (AttributeError, TypeError, ValueError):
        return id(handle)


class _GpuLost(Exception):
    def __init__(self, function: str, code_name: str) -> None:
        super().__init__(function)
        self.function = function
        self.code_name = code_name


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any = None
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    serial: str | None = None
    mig_enabled: bool | None = None
    nvlink_count: int = 0
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    lost: str | None = None  # the lost-GPU message, once lost
    lost_reported: bool = False
    unsupported: set[tuple[Any, ...]] = field(default_factory=set)
    bad_fields: set[int] = field(default_factory=set)


class NvmlBackend:
    """``GpuBackend`` over NVML. ``nvml`` is the pynvml module (injected for tests).

    Public state: ``gpus`` (discovered identities), ``driver_version``,
    ``errors_by_function`` (NVML function name -> failed calls), ``events_dropped``.
    """

    name = "nvml"

    def __init__(
        self,
        node: str,
        *,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.time,
        events: bool = True,
        event_timeout_ms: int = 500,
        event_queue_size: int = 1024,
    ) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise BackendError(
                    "nvml",
                    f"the pynvml module is missing ({exc}): "
                    "pip install 'fleetcare-collectors[nvml]'",
                ) from exc
            nvml = pynvml
        self.node = node
        self._nvml: Any = nvml
        self._clock = clock
        self.errors_by_function: dict[str, int] = {}
        self.events_dropped = 0
        self._unsupported_errors = tuple(getattr(nvml, n) for n in _UNSUPPORTED)
        self._lost_errors = {getattr(nvml, n): code for n, code in _LOST.items()}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendError(
                "nvml",
                f"nvmlInit failed: {exc} (NVML error {getattr(exc, 'value', '?')}); "
                "is the NVIDIA driver loaded? (`nvidia-smi` should list the GPUs)",
            ) from exc
        self._closed = False
        self.driver_version: str | None = self._call(None, "nvmlSystemGetDriverVersion")
        count = self._call(None, "nvmlDeviceGetCount") or 0
        found = (self._discover(i) for i in range(count))
        self.gpus: list[_Gpu] = [g for g in found if g is not None]
        self._by_handle = {_handle_key(g.handle): g for g in self.gpus if g.handle is not None}
        self._by_pci = {g.pci_bus_id: g for g in self.gpus if g.pci_bus_id}
        self._events: queue.Queue[XidEvent] = queue.Queue(maxsize=event_queue_size)
        self._stop = threading.Event()
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        if events:
            self._start_events(event_timeout_ms)
        log.info(
            "nvml.started node=%s gpus=%d driver=%s", node, len(self.gpus), self.driver_version
        )

    # -- the one door to NVML -------------------------------------------------------

    def _call(self, gpu: _Gpu | None, function: str, *args: Any) -> Any:
        """``nvml.<function>(handle?, *args)``; None when unsupported; raises _GpuLost."""
        key = (function, *(tuple(a) if isinstance(a, list) else a for a in args))
        if gpu is not None:
            if key in gpu.unsupported:
                return None
            args = (gpu.handle, *args)
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as exc:
            self._count(function)
            for cls, code_name in self._lost_errors.items():
                if isinstance(exc, cls) and gpu is not None:
                    raise _GpuLost(function, code_name) from exc
            if isinstance(exc, self._unsupported_errors):
                if gpu is not None:
                    gpu.unsupported.add(key)
                log.debug("nvml.unsupported function=%s error=%s", function, exc)
            else:
                log.warning("nvml.call_failed function=%s args=%r error=%s", function, args, exc)
            return None

    def _count(self, function: str) -> None:
        self.errors_by_function[function] = self.errors_by_function.get(function, 0) + 1

    # -- discovery ----------------------------------------------------------------

    def _discover(self, index: int) -> _Gpu | None:
        gpu = _Gpu(index=index)
        nv = self._nvml
        try:
            gpu.handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            self._count("nvmlDeviceGetHandleByIndex")
            lost = [code for cls, code in self._lost_errors.items() if isinstance(exc, cls)]
            if not lost:  # e.g. NoPermission: a GPU this process may not see is not ours
                log.warning("nvml.gpu_skipped node=%s index=%d error=%s", self.node, index, exc)
                return None
            gpu.lost = _lost_message(gpu, _GpuLost("nvmlDeviceGetHandleByIndex", lost[0]))
            log.error("nvml.gpu_lost node=%s index=%d at=discovery", self.node, index)
            return gpu
        try:
            gpu.uuid = self._call(gpu, "nvmlDeviceGetUUID") or ""
            pci = self._call(gpu, "nvmlDeviceGetPciInfo")
            if pci is not None:
                raw = pci.busId or pci.busIdLegacy
                gpu.pci_bus_id = normalize_pci_bus_id(_text(raw))
            gpu.model = _text(self._call(gpu, "nvmlDeviceGetName") or "")
            serial = self._call(gpu, "nvmlDeviceGetSerial")
            gpu.serial = _text(serial) if serial else None
            mig = self._call(gpu, "nvmlDeviceGetMigMode")
            gpu.mig_enabled = None if mig is None else mig[0] == nv.NVML_FEATURE_ENABLED
            links = self._fields(gpu, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])
            gpu.nvlink_count = int(links.get(nv.NVML_FI_DEV_NVLINK_LINK_COUNT) or 0)
            gpu.pcie_gen_max = self._call(gpu, "nvmlDeviceGetMaxPcieLinkGeneration")
            gpu.pcie_width_max = self._call(gpu, "nvmlDeviceGetMaxPcieLinkWidth")
        except _GpuLost as lost:
            gpu.lost = _lost_message(gpu, lost)
            log.error("nvml.gpu_lost node=%s index=%d at=discovery", self.node, index)
        return gpu

    def _fields(self, gpu: _Gpu, ids: list[int]) -> dict[int, float | int]:
        """One nvmlDeviceGetFieldValues call; {field id: value} for the fields that
        answered. Failed fields are counted, remembered in ``gpu.bad_fields``."""
        ids = [i for i in ids if i not in gpu.bad_fields]
        if not ids:
            return {}
        values = self._call(gpu, "nvmlDeviceGetFieldValues", ids)
        if values is None:
            gpu.bad_fields.update(ids)
            return {}
        nv = self._nvml
        out: dict[int, float | int] = {}
        for fid, fv in zip(ids, values, strict=False):
            if fv.nvmlReturn == nv.NVML_SUCCESS:
                for type_name, attr in _FIELD_ATTR.items():
                    if fv.valueType == getattr(nv, type_name):
                        out[fid] = getattr(fv.value, attr)
                        break
                continue
            self._count(f"nvmlDeviceGetFieldValues({fid})")
            if fv.nvmlReturn in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_UNKNOWN):
                name = "NVML_ERROR_GPU_IS_LOST"
                if fv.nvmlReturn == nv.NVML_ERROR_UNKNOWN:
                    name = "NVML_ERROR_UNKNOWN"
                raise _GpuLost(f"nvmlDeviceGetFieldValues({fid})", name)
            gpu.bad_fields.add(fid)
        return out

    # -- polling ------------------------------------------------------------------

    def poll(self, now: dt.datetime) -> Reading:
        now = utc(now)
        reading = Reading()
        for gpu in self.gpus:
            if gpu.lost is None:
                try:
                    reading.samples.append(self._sample(gpu, now))
                    continue
                except _GpuLost as lost:
                    gpu.lost = _lost_message(gpu, lost)
                    log.error("nvml.gpu_lost node=%s gpu=%s %s", self.node, gpu.uuid, gpu.lost)
            if not gpu.lost_reported:
                gpu.lost_reported = True
                reading.events.append(self._lost_event(gpu, now))
                reading.incidents.append(
                    Incident(
                        ts=now,
                        node=self.node,
                        kind="failure",
                        cause="faulty_gpu",
                        source="nvml",
                        gpu_uuid=gpu.uuid or None,
                        mode="lost",
                        note=gpu.lost,
                    )
                )
        while True:
            try:
                reading.events.append(self._events.get_nowait())
            except queue.Empty:
                break
        return reading

    def _lost_event(self, gpu: _Gpu, now: dt.datetime) -> XidEvent:
        return XidEvent(
            ts=now,
            node=self.node,
            xid=None,
            message=gpu.lost or "GPU is lost",
            source="nvml",
            gpu_uuid=gpu.uuid or None,
            gpu_index=gpu.index,
            pci_bus_id=gpu.pci_bus_id or None,
        )

    def _sample(self, gpu: _Gpu, now: dt.datetime) -> GpuSample:
        nv = self._nvml
        call = self._call
        corr, unc = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        ecc_fields = {
            nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (corr, vol),
            nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (unc, vol),
            nv.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (corr, agg),
            nv.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (unc, agg),
        }
        batch = self._fields(
            gpu, [nv.NVML_FI_DEV_MEMORY_TEMP, *ecc_fields, nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER]
        )
        ecc = {
            fid: _int(batch[fid]) if fid in batch else call(gpu, "nvmlDeviceGetTotalEccErrors", *a)
            for fid, a in ecc_fields.items()
        }
        replay = batch.get(nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
        if replay is None:
            replay = call(gpu, "nvmlDeviceGetPcieReplayCounter")
        mem_temp = batch.get(nv.NVML_FI_DEV_MEMORY_TEMP)

        rows = call(gpu, "nvmlDeviceGetRemappedRows")
        sbe = call(
            gpu,
            "nvmlDeviceGetRetiredPages",
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        dbe = call(
            gpu, "nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pending = call(gpu, "nvmlDeviceGetRetiredPagesPendingStatus")
        reasons = call(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:  # drivers before 535 only know the older name
            reasons = call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
        power = call(gpu, "nvmlDeviceGetPowerUsage")
        limit = call(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        util = call(gpu, "nvmlDeviceGetUtilizationRates")
        mem = call(gpu, "nvmlDeviceGetMemoryInfo")
        temp = call(gpu, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
        links = self._nvlinks(gpu)
        return null_sentinels(GpuSample(
            ts=now,
            node=self.node,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            pci_bus_id=gpu.pci_bus_id,
            model=gpu.model,
            gpu_temp_c=_float(temp),
            mem_temp_c=_float(mem_temp),
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            sm_clock_mhz=call(gpu, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM),
            mem_clock_mhz=call(gpu, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM),
            util_gpu_pct=None if util is None else float(util.gpu),
            util_mem_pct=None if util is None else float(util.memory),
            fb_used_mib=None if mem is None else mem.used // _MIB,
            fb_total_mib=None if mem is None else mem.total // _MIB,
            ecc_corrected_volatile=ecc[nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL],
            ecc_uncorrected_volatile=ecc[nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL],
            ecc_corrected_aggregate=ecc[nv.NVML_FI_DEV_ECC_SBE_AGG_TOTAL],
            ecc_uncorrected_aggregate=ecc[nv.NVML_FI_DEV_ECC_DBE_AGG_TOTAL],
            retired_pages_sbe=None if sbe is None else len(sbe),
            retired_pages_dbe=None if dbe is None else len(dbe),
            retired_pages_pending=None if pending is None else bool(pending),
            remapped_rows_correctable=None if rows is None else int(rows[0]),
            remapped_rows_uncorrectable=None if rows is None else int(rows[1]),
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failure=None if rows is None else bool(rows[3]),
            pcie_replay_count=_int(replay),
            pcie_link_gen=call(gpu, "nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_link_gen_max=gpu.pcie_gen_max,
            pcie_link_width=call(gpu, "nvmlDeviceGetCurrPcieLinkWidth"),
            pcie_link_width_max=gpu.pcie_width_max,
            nvlink_up=links["up"],
            nvlink_crc_flit=links["crc_flit"],
            nvlink_crc_data=links["crc_data"],
            nvlink_replay=links["replay"],
            nvlink_recovery=links["recovery"],
            clock_event_reasons=reasons,
        ))

    def _nvlinks(self, gpu: _Gpu) -> dict[str, list[Any] | None]:
        """Per-link lists; a list is None when the GPU has no NVLink or any link's
        value is unsupported (the contract's lists hold one value per link id)."""
        nv = self._nvml
        counters = {
            "crc_flit": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
            "replay": nv.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
        }
        links = range(min(gpu.nvlink_count, nv.NVML_NVLINK_MAX_LINKS))
        out: dict[str, list[Any] | None] = {"up": None, **dict.fromkeys(counters)}
        if not links:
            return out
        up = [self._call(gpu, "nvmlDeviceGetNvLinkState", link) for link in links]
        out["up"] = None if None in up else [v == nv.NVML_FEATURE_ENABLED for v in up]
        for name, counter in counters.items():
            values = [
                self._call(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, counter) for link in links
            ]
            out[name] = None if None in values else [int(v) for v in values]
        return out

    # -- XID events ---------------------------------------------------------------

    def _start_events(self, timeout_ms: int) -> None:
        nv = self._nvml
        self._event_set = self._call(None, "nvmlEventSetCreate")
        if self._event_set is None:
            log.warning("nvml.events_unavailable node=%s (nvmlEventSetCreate failed)", self.node)
            return
        registered = 0
        for gpu in self.gpus:
            if gpu.lost is not None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(
                    gpu.handle, nv.nvmlEventTypeXidCriticalError, self._event_set
                )
                registered += 1
            except nv.NVMLError as exc:
                self._count("nvmlDeviceRegisterEvents")
                log.info(
                    "nvml.xid_events_unsupported node=%s gpu=%s error=%s", self.node, gpu.uuid, exc
                )
        if not registered:
            return
        self._thread = threading.Thread(
            target=self._watch, args=(timeout_ms,), name="fleetcare-nvml-xid", daemon=True
        )
        self._thread.start()

    def _watch(self, timeout_ms: int) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(self._event_set, timeout_ms)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as exc:
                self._count("nvmlEventSetWait")
                log.warning("nvml.event_wait_failed node=%s error=%s", self.node, exc)
                self._stop.wait(1.0)
                continue
            try:
                if data.eventType == nv.nvmlEventTypeXidCriticalError:
                    self._enqueue(self._xid_event(data))
            except Exception:  # a daemon loop logs and keeps running
                log.exception("nvml.event_failed node=%s", self.node)

    def _xid_event(self, data: Any) -> XidEvent:
        gpu = self._by_handle.get(_handle_key(data.device))
        xid = int(data.eventData)
        return XidEvent(
            ts=dt.datetime.fromtimestamp(self._clock(), dt.UTC),
            node=self.node,
            xid=xid,
            message=f"Xid {xid} reported by the NVML event set",
            source="nvml",
            gpu_uuid=gpu.uuid if gpu else None,
            gpu_index=gpu.index if gpu else None,
            pci_bus_id=gpu.pci_bus_id if gpu else None,
        )

    def _enqueue(self, event: XidEvent) -> None:
        try:
            self._events.put_nowait(event)
        except queue.Full:
            self.events_dropped += 1
            if self.events_dropped == 1 or self.events_dropped % 100 == 0:
                log.warning(
                    "nvml.xid_dropped node=%s dropped=%d queue=%d (poll() is not draining fast enough)",
                    self.node,
                    self.events_dropped,
                    self._events.maxsize,
                )

    # -- lookups and shutdown -------------------------------------------------------

    def pci_to_gpu(self, pci: str) -> tuple[str, int] | None:
        """(uuid, index) of the GPU at PCI address ``pci`` (any common spelling)."""
        try:
            gpu = self._by_pci.get(normalize_pci_bus_id(pci))
        except ValueError:
            return None
        return None if gpu is None else (gpu.uuid, gpu.index)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._event_set is not None:
            self._call(None, "nvmlEventSetFree", self._event_set)
        self._call(None, "nvmlShutdown")
        log.info("nvml.closed node=%s", self.node)


def _lost_message(gpu: _Gpu, lost: _GpuLost) -> str:
    return (
        f"GPU is lost ({lost.code_name}) in {lost.function}: GPU {gpu.index} "
        f"{gpu.uuid or '?'} at PCI {gpu.pci_bus_id or '?'} no longer answers NVML; "
        "drain and reboot the node (XID 79 'fallen off the bus' usually goes with it)"
    )


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)
