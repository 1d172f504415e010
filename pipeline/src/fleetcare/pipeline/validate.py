"""Validation of bus records between decode and insert: reject the bad record, keep the rest.

``Validator.validate(records)`` turns bus records into the batches to insert and a list
of ``Rejection`` (stable ``code``, a ``reason`` naming the field, the value and the
allowed range, the ``source`` and the ``raw`` bytes) for the quarantine table.

Policy:

- **Envelope bad → the whole message is rejected**: bytes that are not JSON/msgpack,
  no batch object, a schema version this decoder cannot read, a message key that is
  not the batch's node, an empty batch node, a batch with no records.
  ``source`` is ``topic/partition@offset``, ``raw`` the message bytes.
- **One record bad → only that record is rejected**; the good records of the same batch
  are kept. ``source`` is ``topic/partition@offset#samples[i]`` (or ``events[i]``,
  ``incidents[i]``) and ``raw`` the record's own bytes as they came on the wire (JSON
  or msgpack), sliced out of the message: lossless, so a NaN stays a NaN (msgspec's JSON
  encoder would write it as null).
- A record that does not even decode (string temperature, missing field, naive
  timestamp, unknown incident kind) is salvaged the same way: the envelope is decoded
  with the records left as raw bytes and each record is decoded on its own.
- A record with several problems is rejected once, with the first problem's code; its
  reason lists every problem.

Stable reason codes (``CODES``; used as the quarantine ``code`` column and as metric
labels): see the table below. Ranges live in ``Limits`` and are deliberately wide: they
catch what no GPU can report (10,000 °C), not what is merely unusual.

Incident causes accepted: the Llama 3 Table 5 names (``contract.CAUSES``) plus
``OPERATOR_CAUSES`` (what operators, Slurm node events and automatic derivation record
when no Table 5 diagnosis exists yet).

Time is injected: ``Validator(clock=time.time)``; timestamps more than
``Limits.max_future_s`` (10 min) ahead of it or older than ``Limits.max_age_s`` (400 days)
are rejected.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from fleetcare.collectors.contract import (
    CAUSES,
    Batch,
    DecodeError,
    GpuSample,
    Incident,
    SchemaVersionError,
    UtcTime,
    XidEvent,
    decode_batch,
)
from fleetcare.collectors.transport import Record

CODES: dict[str, str] = {
    # -- whole message (envelope)
    "undecodable": "the bytes are not JSON or msgpack at all (garbage, truncated)",
    "invalid_envelope": "well-formed, but not a batch object (not an object, bad envelope field)",
    "schema_version_unsupported": "schema_version newer than this pipeline (upgrade it first)",
    "schema_version_invalid": "schema_version below 1",
    "key_mismatch": "the bus message key is not the batch's node",
    "empty_batch": "a batch with no samples, events or incidents",
    # -- one record: decoding
    "wrong_type": "a field of the wrong type (string temperature, string in a counter list)",
    "missing_field": "a required field is absent",
    "naive_timestamp": "a timestamp without a timezone",
    "number_out_of_range": "a number too large for its type (1e999, > 2**63)",
    "unknown_incident_kind": "incident kind not failure/repair/rma",
    "unknown_xid_source": "XID source not nvml/kernel-log/dcgm/sim",
    "invalid_record": "any other record that does not decode",
    # -- one record: values
    "empty_field": "node or gpu_uuid is an empty string",
    "node_mismatch": "record node is not the batch node",
    "ts_in_future": "timestamp too far ahead of the ingest clock",
    "ts_too_old": "timestamp older than the maximum age",
    "non_finite_value": "NaN or infinity in a float field",
    "temperature_out_of_range": "gpu_temp_c / mem_temp_c outside Limits.temp_c",
    "power_out_of_range": "power_w / power_limit_w outside Limits.power_w",
    "utilisation_out_of_range": "util_gpu_pct / util_mem_pct outside 0..100",
    "clock_out_of_range": "sm_clock_mhz / mem_clock_mhz outside Limits.clock_mhz",
    "memory_out_of_range": "fb_used_mib / fb_total_mib outside Limits.fb_mib",
    "fb_used_exceeds_total": "fb_used_mib > fb_total_mib",
    "negative_counter": "a negative ECC / retired-page / remap / PCIe replay / NVLink count",
    "invalid_bitmask": "clock_event_reasons negative",
    "pcie_gen_out_of_range": "pcie_link_gen(_max) outside Limits.pcie_gen",
    "pcie_width_invalid": "pcie_link_width(_max) not a PCIe width",
    "pcie_link_above_max": "current PCIe gen/width above its max",
    "nvlink_length_mismatch": "NVLink per-link lists of different lengths",
    "nvlink_too_many_links": "more NVLink entries than Limits.max_nvlinks",
    "gpu_index_out_of_range": "gpu_index outside Limits.gpu_index",
    "xid_out_of_range": "xid outside Limits.xid",
    "unknown_incident_cause": "incident cause not in KNOWN_CAUSES",
}
"""Every reason code a rejection can carry, with what it means. Codes never change."""

OPERATOR_CAUSES: dict[str, str] = {
    "unknown": "an operator recorded a failure before it was diagnosed",
    "node_down": "a node went down (Slurm node event) with no finer cause",
    "gpu_lost": "a GPU fell off the bus / was lost (derived automatically)",
    "fatal_xid": "a fatal XID ended the job (derived automatically, before diagnosis)",
    "planned_maintenance": "a planned drain or maintenance window",
    "other": "anything else an operator wants to record, explained in the note",
}
"""Incident causes beyond Llama 3's Table 5 (``contract.CAUSES``)."""

KNOWN_CAUSES: frozenset[str] = frozenset(CAUSES) | frozenset(OPERATOR_CAUSES)


@dataclass(frozen=True, slots=True)
class Limits:
    """The plausible range of every checked value (inclusive)."""

    temp_c: tuple[float, float] = (-40.0, 200.0)
    power_w: tuple[float, float] = (0.0, 5000.0)
    util_pct: tuple[float, float] = (0.0, 100.0)
    clock_mhz: tuple[int, int] = (0, 10_000)
    fb_mib: tuple[int, int] = (0, 16 * 1024 * 1024)
    pcie_gen: tuple[int, int] = (1, 7)
    pcie_widths: frozenset[int] = frozenset({1, 2, 4, 8, 16, 32})
    max_nvlinks: int = 18
    gpu_index: tuple[int, int] = (0, 64)
    xid: tuple[int, int] = (0, 1000)
    max_future_s: float = 600.0
    max_age_s: float = 400 * 86400.0


@dataclass(frozen=True, slots=True)
class Rejection:
    """One quarantined message or record."""

    code: str
    reason: str
    source: str
    raw: bytes


@dataclass(slots=True)
class ValidationResult:
    batches: list[Batch] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def codes(self) -> Counter[str]:
        """Rejections counted by reason code (for metrics)."""
        return Counter(r.code for r in self.rejections)


class RecordValidator(Protocol):
    """The seam ``Ingestor`` calls: bus records in, batches to insert and rejections out."""

    def validate(self, records: Sequence[Record]) -> ValidationResult: ...


# -- decoding ------------------------------------------------------------------------------------
class _LooseBatch(msgspec.Struct):
    """The envelope with its records left as raw bytes, to decode them one by one."""

    schema_version: int
    node: str
    seq: int
    sent_at: UtcTime
    samples: list[msgspec.Raw] = []
    events: list[msgspec.Raw] = []
    incidents: list[msgspec.Raw] = []


_SECTIONS: tuple[tuple[str, type[msgspec.Struct]], ...] = (
    ("samples", GpuSample), ("events", XidEvent), ("incidents", Incident))
_DECODERS: dict[str, dict[Any, Any]] = {
    "json": {t: msgspec.json.Decoder(t) for t in (_LooseBatch, GpuSample, XidEvent, Incident)}
    | {None: msgspec.json.Decoder()},
    "msgpack": {t: msgspec.msgpack.Decoder(t)
                for t in (_LooseBatch, GpuSample, XidEvent, Incident)}
    | {None: msgspec.msgpack.Decoder()},
}
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PATH = re.compile(r"^\.(?P<field>\w+)(?P<rest>.*)$")
_MISSING = re.compile(r"missing required field `(?P<field>\w+)`")


def _fmt(raw: bytes) -> str:
    # The same sniffing rule as contract.decode_batch.
    return "json" if raw[:1] in (b"{", b" ", b"\n") else "msgpack"


def _record_decode_problem(section: str, raw: bytes, fmt: str,
                           exc: Exception) -> tuple[str, str]:
    """(code, message) for a record that does not decode, naming the field and value."""
    m = _AT.match(str(exc))
    msg, path = (m.group("msg"), m.group("path")) if m else (str(exc), None)
    missing = _MISSING.search(msg)
    if missing:
        return "missing_field", f"{missing.group('field')}: required field is missing"
    name, rest, value = "?", "", None
    pm = _PATH.match(path or "")
    if pm:
        name, rest = pm.group("field"), pm.group("rest")
        try:
            obj = _DECODERS[fmt][None].decode(raw)
            value = obj.get(name) if isinstance(obj, dict) else None
            idx = re.match(r"^\[(\d+)\]", rest)
            if idx and isinstance(value, list) and int(idx.group(1)) < len(value):
                value = value[int(idx.group(1))]
        except (msgspec.DecodeError, msgspec.ValidationError):
            value = None
    where = f"{name}{rest} = {value!r}"
    if "timezone" in msg:
        return "naive_timestamp", f"{where} has no timezone: send UTC ('Z') or an offset"
    if "Invalid enum value" in msg:
        if section == "incidents" and name == "kind":
            return "unknown_incident_kind", f"{where} is not one of 'failure', 'repair', 'rma'"
        if section == "events" and name == "source":
            return ("unknown_xid_source",
                    f"{where} is not one of 'nvml', 'kernel-log', 'dcgm', 'sim'")
        return "invalid_record", f"{where}: {msg}"
    if "out of range" in msg:
        return "number_out_of_range", f"{where}: {msg}"
    if msg.startswith("Expected"):
        return "wrong_type", f"{where}: {msg}"
    return "invalid_record", f"{where}: {msg}"


# -- value checks ----------------------------------------------------------------------------------
_FLOATS = ("gpu_temp_c", "mem_temp_c", "power_w", "power_limit_w", "util_gpu_pct",
           "util_mem_pct")
_RANGED: tuple[tuple[str, str, str, str], ...] = (
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
_COUNTERS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
             "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe",
             "remapped_rows_correctable", "remapped_rows_uncorrectable", "pcie_replay_count")
_NVLINK_LISTS = ("nvlink_up", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay",
                 "nvlink_recovery")

Problem = tuple[str, str]
"""(code, message); the message names the field, the value and what is allowed."""


def _in(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


class Validator:
    """The standard ``RecordValidator``: decode, check the envelope, check every record."""

    def __init__(self, *, clock: Callable[[], float] = time.time, limits: Limits | None = None,
                 causes: Iterable[str] = KNOWN_CAUSES) -> None:
        self.clock = clock
        self.limits = limits or Limits()
        self.causes = frozenset(causes)

    # -- entry points ----------------------------------------------------------------------
    def validate(self, records: Sequence[Record]) -> ValidationResult:
        result = ValidationResult()
        for rec in records:
            self.validate_record(rec, result)
        return result

    def validate_record(self, rec: Record, result: ValidationResult) -> None:
        """Append the kept batch (if any) and the rejections of one bus record."""
        source = f"{rec.topic}/{rec.partition}@{rec.offset}"
        raw = rec.value
        undecoded: list[Rejection] = []
        try:
            batch = decode_batch(raw)
        except SchemaVersionError as exc:
            result.rejections.append(Rejection("schema_version_unsupported", exc.reason,
                                               source, raw))
            return
        except DecodeError as exc:
            salvage = self._salvage(raw, exc, source)
            if isinstance(salvage, Rejection):
                result.rejections.append(salvage)
                return
            batch, undecoded = salvage
        envelope = self._check_envelope(batch, rec.key, undecoded)
        if envelope is not None:
            result.rejections.append(Rejection(envelope[0], envelope[1], source, raw))
            return
        result.rejections.extend(undecoded)
        kept = self.check_batch(batch, source=source, raw=raw, rejections=result.rejections)
        if kept is not None:
            result.batches.append(kept)

    @staticmethod
    def _check_envelope(batch: Batch, key: str, undecoded: list[Rejection]) -> Problem | None:
        if batch.node != key:
            return ("key_mismatch",
                    f"batch node {batch.node!r} does not match the message key {key!r}")
        if not batch.node.strip():
            return "empty_field", f"batch node = {batch.node!r} is empty"
        if not (batch.samples or batch.events or batch.incidents or undecoded):
            return ("empty_batch", f"batch seq={batch.seq} of node {batch.node!r} has no "
                                   "samples, events or incidents")
        return None

    def check_batch(self, batch: Batch, *, source: str, raw: bytes,
                    rejections: list[Rejection]) -> Batch | None:
        """``batch`` without its bad records (None when none is left); appends rejections."""
        now = self.clock()
        bad: dict[str, set[int]] = {}
        for section, _ in _SECTIONS:
            check = getattr(self, f"_check_{section}")
            for i, rec in enumerate(getattr(batch, section)):
                problems = check(rec, batch.node, now)
                if problems:
                    bad.setdefault(section, set()).add(i)
                    rejections.append(Rejection(
                        problems[0][0],
                        "; ".join(f"{section}[{i}].{msg}" for _, msg in problems),
                        f"{source}#{section}[{i}]", self._record_raw(raw, section, i)))
        if not bad:
            return batch if batch.samples or batch.events or batch.incidents else None
        parts = {s: [r for i, r in enumerate(getattr(batch, s)) if i not in bad.get(s, ())]
                 for s, _ in _SECTIONS}
        if not any(parts.values()):
            return None
        return msgspec.structs.replace(batch, **parts)

    # -- decoding salvage ------------------------------------------------------------------
    def _salvage(self, raw: bytes, exc: DecodeError,
                 source: str) -> Rejection | tuple[Batch, list[Rejection]]:
        """Decode the envelope with raw records, then each record alone."""
        fmt = _fmt(raw)
        try:
            loose = _DECODERS[fmt][_LooseBatch].decode(raw)
        except msgspec.ValidationError:
            try:  # well-formed JSON/msgpack that is not a batch, or garbage?
                _DECODERS[fmt][None].decode(raw)
            except msgspec.DecodeError:
                return Rejection("undecodable", exc.reason, source, raw)
            return Rejection("invalid_envelope", exc.reason, source, raw)
        except msgspec.DecodeError:
            return Rejection("undecodable", exc.reason, source, raw)
        if loose.schema_version < 1:
            return Rejection("schema_version_invalid", exc.reason, source, raw)
        parts: dict[str, list[Any]] = {}
        bad: list[Rejection] = []
        for section, tp in _SECTIONS:
            parts[section] = []
            for i, rec_raw in enumerate(getattr(loose, section)):
                rec_bytes = bytes(rec_raw)
                try:
                    parts[section].append(_DECODERS[fmt][tp].decode(rec_bytes))
                except (msgspec.ValidationError, msgspec.DecodeError) as rec_exc:
                    code, msg = _record_decode_problem(section, rec_bytes, fmt, rec_exc)
                    bad.append(Rejection(code, f"{section}[{i}].{msg}",
                                         f"{source}#{section}[{i}]", rec_bytes))
        if not bad:  # should not happen: decode_batch failed for a reason we cannot see
            return Rejection("invalid_envelope", exc.reason, source, raw)
        batch = Batch(schema_version=loose.schema_version, node=loose.node, seq=loose.seq,
                      sent_at=loose.sent_at, **parts)
        return batch, bad

    @staticmethod
    def _record_raw(raw: bytes, section: str, index: int) -> bytes:
        """The wire bytes of one record of the message ``raw``."""
        try:
            loose = _DECODERS[_fmt(raw)][_LooseBatch].decode(raw)
            return bytes(getattr(loose, section)[index])
        except (msgspec.ValidationError, msgspec.DecodeError, IndexError):
            return raw

    # -- record checks ---------------------------------------------------------------------
    def _common(self, rec: Any, node: str, now: float) -> list[Problem]:
        p: list[Problem] = []
        if not rec.node.strip():
            p.append(("empty_field", f"node = {rec.node!r} is empty"))
        elif rec.node != node:
            p.append(("node_mismatch", f"node = {rec.node!r} is not the batch node {node!r}"))
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

    def _check_samples(self, s: GpuSample, node: str, now: float) -> list[Problem]:
        lim = self.limits
        p = self._common(s, node, now)
        nonfinite = set()
        for name in _FLOATS:
            v = getattr(s, name)
            if v is not None and not math.isfinite(v):
                nonfinite.add(name)
                p.append(("non_finite_value", f"{name} = {v!r} is not a finite number"))
        for name, code, attr, unit in _RANGED:
            v = getattr(s, name)
            if v is None or name in nonfinite:
                continue
            bounds = getattr(lim, attr)
            if not _in(v, bounds):
                p.append((code, f"{name} = {v!r} is outside the allowed range "
                                f"{bounds[0]:g}..{bounds[1]:g}{' ' + unit if unit else ''}"))
        if s.fb_used_mib is not None and s.fb_total_mib is not None \
                and s.fb_used_mib > s.fb_total_mib:
            p.append(("fb_used_exceeds_total", f"fb_used_mib = {s.fb_used_mib!r} is more than "
                                               f"fb_total_mib = {s.fb_total_mib!r}"))
        for name in _COUNTERS:
            v = getattr(s, name)
            if v is not None and v < 0:
                p.append(("negative_counter", f"{name} = {v!r} is negative; counters are "
                                              ">= 0 (null when unsupported)"))
        if s.clock_event_reasons is not None and s.clock_event_reasons < 0:
            p.append(("invalid_bitmask", f"clock_event_reasons = {s.clock_event_reasons!r} "
                                         "is negative; it is a bit mask >= 0"))
        for name in ("pcie_link_width", "pcie_link_width_max"):
            v = getattr(s, name)
            if v is not None and v not in lim.pcie_widths:
                p.append(("pcie_width_invalid", f"{name} = {v!r} is not a PCIe link width "
                                                f"{sorted(lim.pcie_widths)}"))
        for cur, top in (("pcie_link_gen", "pcie_link_gen_max"),
                         ("pcie_link_width", "pcie_link_width_max")):
            a, b = getattr(s, cur), getattr(s, top)
            if a is not None and b is not None and a > b:
                p.append(("pcie_link_above_max", f"{cur} = {a!r} is above {top} = {b!r}"))
        p.extend(self._nvlink(s))
        return p

    def _nvlink(self, s: GpuSample) -> list[Problem]:
        p: list[Problem] = []
        lists = {n: getattr(s, n) for n in _NVLINK_LISTS if getattr(s, n) is not None}
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

    def _check_events(self, e: XidEvent, node: str, now: float) -> list[Problem]:
        p = self._common(e, node, now) + self._xid(e.xid)
        if e.gpu_index is not None and not _in(e.gpu_index, self.limits.gpu_index):
            lo, hi = self.limits.gpu_index
            p.append(("gpu_index_out_of_range",
                      f"gpu_index = {e.gpu_index!r} is outside the allowed range {lo}..{hi}"))
        return p

    def _check_incidents(self, inc: Incident, node: str, now: float) -> list[Problem]:
        p = self._common(inc, node, now)
        if inc.cause not in self.causes:
            p.append(("unknown_incident_cause",
                      f"cause = {inc.cause!r} is not a known cause: use a name of "
                      "contract.CAUSES (Llama 3 Table 5) or of validate.OPERATOR_CAUSES "
                      f"({', '.join(OPERATOR_CAUSES)})"))
        return p + self._xid(inc.xid)
