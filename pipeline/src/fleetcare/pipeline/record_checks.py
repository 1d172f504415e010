"""The value checks of one decoded record (a GPU sample, an XID event, an incident).

``RecordChecks(limits, causes).check(section, record, node, now)`` returns the record's
problems as ``(code, message)`` pairs, first problem first; the message names the field,
the value (shortened) and what is allowed. ``fleetcare.pipeline.validate`` turns them into
rejections; the codes are its ``CODES``.

Checks every field has, derived from the contract's types (``schema.column_types``), so a
field added to the contract is checked without code here:

- strings: at most ``Limits.max_name_len`` characters (``Limits.max_text_len`` for the
  free text of ``TEXT_FIELDS``);
- integers (and integer list entries): below ``contract.DCGM_INT64_BLANK``, where DCGM's
  and NVML's "no value" sentinels start (see the contract's docstring);
- floats: below ``contract.DCGM_FP64_BLANK``, and finite.

Then each kind's own checks: timestamps, node, ranges, counters, PCIe, NVLink, XIDs, causes,
NIC ports (port number, rate, counter widths, saturated names, hw_counters lists).
"""

from __future__ import annotations

import datetime as dt
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from fleetcare.collectors.contract import (
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    NIC_COUNTER_BITS,
    GpuSample,
    Incident,
    NicSample,
    XidEvent,
    nic_counter_max,
)
from fleetcare.pipeline.limits import OPERATOR_CAUSES, Limits
from fleetcare.pipeline.schema import NVLINK_LISTS, column_types

Problem = tuple[str, str]
"""(code, message); the message names the field, the value and what is allowed."""

TEXT_FIELDS = frozenset({"message", "note"})
"""Free-text fields: ``Limits.max_text_len``; every other string ``Limits.max_name_len``."""

RANGED: tuple[tuple[str, str, str, str], ...] = (
    # (field, code, Limits attribute, unit)
    ("gpu_temp_c", "temperature_out_of_range", "temp_c", "°C"),
    ("mem_temp_c", "temperature_out_of_range", "temp_c", "°C"),
    ("power_w", "power_out_of_range", "power_w", "W"),
    ("power_limit_w", "power_out_of_range", "power_w", "W"),
    ("util_gpu_pct", "utilisation_out_of_range", "util_pct", "%"),
    ("util_mem_pct", "utilisation_out_of_range", "util_pct", "%"),
    ("sm_clock_mhz", "clock_out_of_range", "clock_mhz", "MHz"),
    ("mem_clock_mhz", "clock_out_of_range", "clock_mhz", "MHz"),
    ("fb_used_mib", "memory_out_of_range", "fb_mib", "MiB"),
    ("fb_total_mib", "memory_out_of_range", "fb_mib", "MiB"),
    ("gpu_index", "gpu_index_out_of_range", "gpu_index", ""),
    ("pcie_link_gen", "pcie_gen_out_of_range", "pcie_gen", ""),
    ("pcie_link_gen_max", "pcie_gen_out_of_range", "pcie_gen", ""),
)
COUNTERS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
             "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe",
             "remapped_rows_correctable", "remapped_rows_uncorrectable", "pcie_replay_count")


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a reason never echoes a 1 MiB string."""
    return clip(repr(value), limit)


def _in(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _getter(idx: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The values at ``idx`` of a tuple, always as a tuple (taken in C)."""
    if not idx:
        return lambda row: ()
    if len(idx) == 1:
        return lambda row: (row[idx[0]],)
    return operator.itemgetter(*idx)


class _Shape:
    """Where the strings, integers, floats and integer lists sit in a struct's tuple."""

    def __init__(self, struct: type[msgspec.Struct]) -> None:
        self.strs: list[tuple[int, str]] = []
        self.ints: list[tuple[int, str]] = []
        self.floats: list[tuple[int, str]] = []
        self.int_lists: list[tuple[int, str]] = []
        for i, (name, sql, _) in enumerate(column_types(struct)):
            {"VARCHAR": self.strs, "BIGINT": self.ints, "DOUBLE": self.floats,
             "BIGINT[]": self.int_lists}.get(sql, []).append((i, name))
        # for the fast test of a clean row (``RecordChecks._shape_clean``)
        self.name_strs = _getter([i for i, n in self.strs if n not in TEXT_FIELDS])
        self.text_strs = _getter([i for i, n in self.strs if n in TEXT_FIELDS])
        self.int_values = _getter([i for i, _ in self.ints])
        self.float_values = _getter([i for i, _ in self.floats])
        self.list_values = _getter([i for i, _ in self.int_lists])


SHAPES = {"samples": _Shape(GpuSample), "events": _Shape(XidEvent),
           "incidents": _Shape(Incident), "nics": _Shape(NicSample)}
_INT_SENTINEL = (f"is not a count: from {DCGM_INT64_BLANK} (DCGM_INT64_BLANK) up, integers "
                 "are DCGM's blank / not-found / not-supported / no-permission sentinels or "
                 "NVML's 'not available' (2**64-1); send null for a value the GPU did not "
                 "report")
_FLOAT_SENTINEL = (f"is at or above DCGM's float blank {DCGM_FP64_BLANK} (blank / not found / "
                   "not supported / no permission); send null for a value the GPU did not "
                   "report")


class RecordChecks:
    """The checks of every record kind, under one ``Limits`` and set of incident causes."""

    def __init__(self, limits: Limits, causes: Iterable[str]) -> None:
        self.limits = limits
        self.causes = frozenset(causes)

    def check(self, section: str, rec: Any, node: str, now: float) -> list[Problem]:
        """Every problem of ``rec`` (of ``section``: samples, events, incidents), in order."""
        row = msgspec.structs.astuple(rec)
        p, unusable = self._shape(SHAPES[section], row)
        p += self._common(rec, node, now)
        if section == "samples":
            p += self._sample(rec, unusable)
        elif section == "events":
            p += self._event(rec, unusable)
        elif section == "nics":
            p += self._nic(rec, unusable)
        else:
            p += self._incident(rec, unusable)
        return p

    # -- checks every field has ------------------------------------------------------------
    def _shape_clean(self, shape: _Shape, row: tuple[Any, ...]) -> bool:
        """True when ``_shape`` finds nothing in ``row``: the same conditions, tested a
        field group at a time in C (most rows are clean); False sends the row through
        ``_shape``'s per-field loop, which names every problem."""
        lim = self.limits
        if max(map(len, filter(None, shape.name_strs(row))), default=0) > lim.max_name_len:
            return False
        if max(map(len, filter(None, shape.text_strs(row))), default=0) > lim.max_text_len:
            return False
        ints = [v for v in shape.int_values(row) if v is not None]
        if ints and max(ints) >= DCGM_INT64_BLANK:
            return False
        floats = [v for v in shape.float_values(row) if v is not None]
        if floats and not (all(map(math.isfinite, floats)) and max(floats) < DCGM_FP64_BLANK):
            return False
        return max(map(max, filter(None, shape.list_values(row))),
                   default=0) < DCGM_INT64_BLANK

    def _shape(self, shape: _Shape, row: tuple[Any, ...]) -> tuple[list[Problem], set[str]]:
        """Length, sentinel and finiteness problems, and the fields they make unusable for
        the range checks that follow."""
        if self._shape_clean(shape, row):
            return [], set()
        lim = self.limits
        p: list[Problem] = []
        bad: set[str] = set()
        for i, name in shape.strs:
            v = row[i]
            top = lim.max_text_len if name in TEXT_FIELDS else lim.max_name_len
            if v is not None and len(v) > top:
                bad.add(name)
                p.append(("string_too_long", f"{name} has {len(v):,} characters; at most "
                                             f"{top:,} are allowed"))
        for i, name in shape.ints:
            v = row[i]
            if v is not None and v >= DCGM_INT64_BLANK:
                bad.add(name)
                p.append(("sentinel_value", f"{name} = {v!r} {_INT_SENTINEL}"))
        for i, name in shape.floats:
            v = row[i]
            if v is None:
                continue
            if not math.isfinite(v):
                bad.add(name)
                p.append(("non_finite_value", f"{name} = {v!r} is not a finite number"))
            elif v >= DCGM_FP64_BLANK:
                bad.add(name)
                p.append(("sentinel_value", f"{name} = {v!r} {_FLOAT_SENTINEL}"))
        for i, name in shape.int_lists:
            values = row[i]
            if values and max(values) >= DCGM_INT64_BLANK:  # (max in C: the loop only then)
                bad.add(name)
                for k, v in enumerate(values):
                    if v >= DCGM_INT64_BLANK:
                        p.append(("sentinel_value", f"{name}[{k}] = {v!r} {_INT_SENTINEL}"))
        return p, bad

    def _common(self, rec: Any, node: str, now: float) -> list[Problem]:
        p: list[Problem] = []
        if not rec.node.strip():
            p.append(("empty_field", f"node = {rec.node!r} is empty"))
        elif rec.node != node:
            p.append(("node_mismatch", f"node = {short(rec.node)} is not the batch node "
                                       f"{short(node)}"))
        gpu_uuid = getattr(rec, "gpu_uuid", None)
        if gpu_uuid is not None and not gpu_uuid.strip():
            p.append(("empty_field", f"gpu_uuid = {gpu_uuid!r} is empty"))
        ts: dt.datetime = rec.ts
        age = now - ts.timestamp()
        now_iso = dt.datetime.fromtimestamp(now, dt.UTC).isoformat()
        if -age > self.limits.max_future_s:
            p.append(("ts_in_future",
                      f"ts = {ts.isoformat()} is {-age:.0f} s ahead of the ingest clock "
                      f"({now_iso}); at most {self.limits.max_future_s:.0f} s ahead is "
                      "allowed: check the node's clock (NTP)"))
        elif age > self.limits.max_age_s:
            p.append(("ts_too_old",
                      f"ts = {ts.isoformat()} is {age / 86400:.1f} days before the ingest "
                      f"clock ({now_iso}); at most {self.limits.max_age_s / 86400:g} days "
                      "old is allowed"))
        return p

    def _xid(self, xid: int | None) -> list[Problem]:
        if xid is not None and not _in(xid, self.limits.xid):
            lo, hi = self.limits.xid
            return [("xid_out_of_range", f"xid = {xid!r} is outside {lo}..{hi}")]
        return []

    # -- per kind ------------------------------------------------------------------------------
    def _sample(self, s: GpuSample, unusable: set[str]) -> list[Problem]:
        lim = self.limits
        p: list[Problem] = []
        for name, code, attr, unit in RANGED:
            v = getattr(s, name)
            if v is None or name in unusable:
                continue
            bounds = getattr(lim, attr)
            if not _in(v, bounds):
                p.append((code, f"{name} = {v!r} is outside the allowed range "
                                f"{bounds[0]:g}..{bounds[1]:g}{' ' + unit if unit else ''}"))
        if s.fb_used_mib is not None and s.fb_total_mib is not None \
                and s.fb_used_mib > s.fb_total_mib and not {"fb_used_mib", "fb_total_mib"} & unusable:
            p.append(("fb_used_exceeds_total", f"fb_used_mib = {s.fb_used_mib!r} is more than "
                                               f"fb_total_mib = {s.fb_total_mib!r}"))
        for name in COUNTERS:
            v = getattr(s, name)
            if v is not None and v < 0:
                p.append(("negative_counter", f"{name} = {v!r} is negative; counters are "
                                              ">= 0 (null when unsupported)"))
        if s.clock_event_reasons is not None and s.clock_event_reasons < 0:
            p.append(("invalid_bitmask", f"clock_event_reasons = {s.clock_event_reasons!r} "
                                         "is negative; it is a bit mask >= 0"))
        for name in ("pcie_link_width", "pcie_link_width_max"):
            v = getattr(s, name)
            if v is not None and v not in lim.pcie_widths and name not in unusable:
                p.append(("pcie_width_invalid", f"{name} = {v!r} is not a PCIe link width "
                                                f"{sorted(lim.pcie_widths)}"))
        for cur, top in (("pcie_link_gen", "pcie_link_gen_max"),
                         ("pcie_link_width", "pcie_link_width_max")):
            a, b = getattr(s, cur), getattr(s, top)
            if a is not None and b is not None and a > b and not {cur, top} & unusable:
                p.append(("pcie_link_above_max", f"{cur} = {a!r} is above {top} = {b!r}"))
        p.extend(self._nvlink(s))
        return p

    def _nvlink(self, s: GpuSample) -> list[Problem]:
        p: list[Problem] = []
        lists = {n: getattr(s, n) for n in NVLINK_LISTS if getattr(s, n) is not None}
        for name, values in lists.items():
            if len(values) > self.limits.max_nvlinks:
                p.append(("nvlink_too_many_links",
                          f"{name} has {len(values)} entries; at most "
                          f"{self.limits.max_nvlinks} links are allowed"))
            if name == "nvlink_up" or not values or min(values) >= 0:
                continue  # (min in C: the per-link loop only when one is negative)
            for i, v in enumerate(values):
                if v < 0:
                    p.append(("negative_counter", f"{name}[{i}] = {v!r} is negative; "
                                                  "counters are >= 0"))
        if len({len(v) for v in lists.values()}) > 1:
            ref, ref_values = next(iter(lists.items()))
            odd = next(n for n, v in lists.items() if len(v) != len(ref_values))
            p.append(("nvlink_length_mismatch",
                      f"{odd} has {len(lists[odd])} entries but {ref} has {len(ref_values)}: "
                      "the NVLink lists need one entry per link"))
        return p

    def _event(self, e: XidEvent, unusable: set[str]) -> list[Problem]:
        p = [] if "xid" in unusable else self._xid(e.xid)
        if e.gpu_index is not None and "gpu_index" not in unusable \
                and not _in(e.gpu_index, self.limits.gpu_index):
            lo, hi = self.limits.gpu_index
            p.append(("gpu_index_out_of_range",
                      f"gpu_index = {e.gpu_index!r} is outside the allowed range {lo}..{hi}"))
        return p

    def _nic(self, n: NicSample, unusable: set[str]) -> list[Problem]:
        lim = self.limits
        p: list[Problem] = []
        if not n.device.strip():
            p.append(("empty_field", f"device = {n.device!r} is empty"))
        if "port" not in unusable and not _in(n.port, lim.nic_port):
            lo, hi = lim.nic_port
            p.append(("nic_port_out_of_range", f"port = {n.port!r} is outside {lo}..{hi}"))
        if n.rate_gbps is not None and "rate_gbps" not in unusable \
                and not _in(n.rate_gbps, lim.nic_rate_gbps):
            low, high = lim.nic_rate_gbps
            p.append(("nic_rate_out_of_range",
                      f"rate_gbps = {n.rate_gbps!r} is outside {low:g}..{high:g} Gb/s"))
        for name in NIC_COUNTER_BITS:
            v = getattr(n, name)
            if v is None or name in unusable:
                continue
            if v < 0:
                p.append(("negative_counter", f"{name} = {v!r} is negative; counters are "
                                              ">= 0 (null when the port has no PMA)"))
            elif v > nic_counter_max(name):
                p.append(("nic_counter_above_width",
                          f"{name} = {v!r} is above {nic_counter_max(name)}, the most a "
                          f"{NIC_COUNTER_BITS[name]}-bit port counter holds"))
        for name in n.saturated or ():
            if name not in NIC_COUNTER_BITS:
                p.append(("nic_unknown_counter",
                          f"saturated names {short(name)}, which is not a legacy counter "
                          f"({', '.join(NIC_COUNTER_BITS)})"))
                break
        names, values = n.hw_counter_names or [], n.hw_counter_values or []
        if len(names) != len(values) or len(names) > lim.max_hw_counters:
            p.append(("nic_hw_counters_invalid",
                      f"hw_counter_names has {len(names)} entries and hw_counter_values "
                      f"{len(values)}: they need one value per name, at most "
                      f"{lim.max_hw_counters}"))
        longest = max(map(len, names), default=0)
        if longest > lim.max_name_len:
            p.append(("string_too_long", f"a hw_counter_names entry has {longest:,} "
                                         f"characters; at most {lim.max_name_len:,} are "
                                         "allowed"))
        if values and min(values) < 0 and "hw_counter_values" not in unusable:
            p.append(("negative_counter", "hw_counter_values has a negative entry; "
                                          "counters are >= 0"))
        return p

    def _incident(self, inc: Incident, unusable: set[str]) -> list[Problem]:
        p: list[Problem] = []
        if inc.cause not in self.causes and "cause" not in unusable:
            p.append(("unknown_incident_cause",
                      f"cause = {short(inc.cause)} is not a known cause: use a name of "
                      "contract.CAUSES (Llama 3 Table 5) or of validate.OPERATOR_CAUSES "
                      f"({', '.join(OPERATOR_CAUSES)})"))
        return p + ([] if "xid" in unusable else self._xid(inc.xid))
