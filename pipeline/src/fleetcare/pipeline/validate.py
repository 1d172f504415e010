"""Validation of bus records between decode and insert: reject the bad record, keep the rest.

``Validator.validate(records)`` turns bus records into the batches to insert (``kept``:
each batch with its source and bytes) and a list of ``Rejection`` (stable ``code``, a
``reason`` naming the field, the value and the allowed range, the ``source`` and the
``raw`` bytes) for the quarantine table. It never raises: a record it cannot handle for
a reason nobody foresaw is rejected as ``unexpected_error`` with the exception.

Policy:

- **The transport could not read it** (``Record.error_code``: a corrupt or torn
  embedded-bus frame, an unknown topic byte, a key that is not UTF-8): rejected with the
  transport's code and the bytes it found.
- **Envelope bad → the whole message is rejected**: bytes that are not JSON/msgpack,
  nested deeper than the decoder allows, no batch object, a schema version this decoder
  cannot read, a message key that is not the batch's node, an empty or too long batch
  node, a batch with no records or more than ``Limits.max_batch_records`` in a section.
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
  reason lists every problem. Values in reasons are shortened (``record_checks.short``).

Cost is linear in the message: a message is decoded once when it is good, and at most
four times plus once per record when it is not (the record slices are decoded once per
message, however many records are bad). msgpack is decoded first with the samples left as
bytes (``wire_columns.RawBatch``: the screen decodes them straight into columns,
``wire_samples``); anything that decoder refuses is decoded strictly, which gives the
reasons below; a sample msgspec refuses (or with an NVLink list that is not one) is
decoded strictly on its own and cut from its batch, the rest of the batch stays screened.

Stable reason codes (``CODES``; used as the quarantine ``code`` column and as metric
labels): see the table below. Ranges live in ``Limits`` (``fleetcare.pipeline.limits``);
the checks of one record in ``fleetcare.pipeline.record_checks``.

Incident causes accepted: the Llama 3 Table 5 names (``contract.CAUSES``) plus
``OPERATOR_CAUSES`` (what operators, Slurm node events and automatic derivation record
when no Table 5 diagnosis exists yet).

Time is injected: ``Validator(clock=time.time)``; timestamps more than
``Limits.max_future_s`` (10 min) ahead of it or older than ``Limits.max_age_s`` (400 days)
are rejected.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np
import pyarrow as pa

from fleetcare.collectors.contract import (
    SCHEMA_VERSION,
    TOO_DEEP,
    Batch,
    DecodeError,
    GpuSample,
    Incident,
    NicSample,
    SchemaVersionError,
    UtcTime,
    XidEvent,
    decode_batch,
)
from fleetcare.collectors.transport import READ_ERRORS, Record
from fleetcare.pipeline import wire_samples
from fleetcare.pipeline.limits import KNOWN_CAUSES, OPERATOR_CAUSES, Limits
from fleetcare.pipeline.record_checks import Problem, RecordChecks, clip, short
from fleetcare.pipeline.sample_screen import SampleScreen
from fleetcare.pipeline.wire_columns import RAW_BATCH, RawBatch, as_sample, full_batch

__all__ = ["CODES", "KNOWN_CAUSES", "OPERATOR_CAUSES", "Kept", "Limits", "RecordValidator",
           "Rejection", "ValidationResult", "Validator"]

log = logging.getLogger(__name__)

CODES: dict[str, str] = {
    # -- whole message (envelope)
    "undecodable": "the bytes are not JSON or msgpack at all (garbage, truncated)",
    "invalid_envelope": "well-formed, but not a batch object (not an object, bad envelope field)",
    "schema_version_unsupported": "schema_version newer than this pipeline (upgrade it first)",
    "schema_version_invalid": "schema_version below 1",
    "key_mismatch": "the bus message key is not the batch's node",
    "empty_batch": "a batch with no samples, events, incidents or nics",
    "batch_too_large": "more records in a section of one batch than Limits.max_batch_records",
    "nesting_too_deep": "a value nested deeper than the decoder's recursion limit",
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
    "nic_port_out_of_range": "a NIC sample's port outside Limits.nic_port",
    "nic_rate_out_of_range": "a NIC sample's rate_gbps outside Limits.nic_rate_gbps",
    "nic_counter_above_width": "a legacy port counter above its width's maximum "
                               "(contract.NIC_COUNTER_BITS): no port can report it",
    "nic_unknown_counter": "a NIC sample's saturated list names no legacy counter",
    "nic_hw_counters_invalid": "hw_counter_names / hw_counter_values of different lengths, "
                               "or more entries than Limits.max_hw_counters",
    "string_too_long": "a string longer than Limits.max_name_len (max_text_len for free text)",
    "sentinel_value": "a DCGM / NVML 'no value' sentinel (an integer >= DCGM_INT64_BLANK, "
                      "a float >= DCGM_FP64_BLANK) where null belongs",
    # -- the transport could not read it (Record.error_code)
    **READ_ERRORS,
    # -- the mechanism: whatever nobody foresaw costs one record, never the poll
    "unexpected_error": "validating the record raised an unexpected error (a fleetcare bug: "
                        "report it with the quarantined bytes)",
    "unstorable": "the store refused the batch's rows (a value the checks let through)",
}
"""Every reason code a rejection can carry, with what it means. Codes never change."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One quarantined message or record."""

    code: str
    reason: str
    source: str
    raw: bytes


class Kept:
    """A batch to insert (its bad records removed), with where its message came from.
    ``decoded``: the batch as decoded, a ``Batch`` or a ``wire_columns.RawBatch``
    (msgpack: the samples still bytes); ``batch``: the contract's ``Batch`` of it,
    decoded on first use."""

    __slots__ = ("_batch", "decoded", "raw", "source")

    def __init__(self, decoded: Any, source: str, raw: bytes) -> None:
        self.decoded = decoded
        self.source = source
        self.raw = raw
        self._batch: Batch | None = None

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            self._batch = full_batch(self.decoded)
        return self._batch

    def __repr__(self) -> str:
        return f"Kept({self.decoded!r}, {self.source!r}, {self.raw!r})"


@dataclass(slots=True)
class ValidationResult:
    kept: list[Kept] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    sample_table: pa.Table | None = None
    """The samples of ``kept``'s batches, in order, as the Arrow table the sinks insert
    (``schema.SAMPLE_SCHEMA``), built once while they were screened; None when it was not
    (the sinks then convert the samples). Any change to ``kept`` drops it."""

    @property
    def batches(self) -> list[Batch]:
        """The kept batches as the contract's ``Batch`` (NVLink lists decoded)."""
        return [k.batch for k in self.kept]

    @property
    def landing(self) -> list[Any]:
        """The kept batches as they were decoded, for the sinks (without ``sample_table``
        they convert the samples themselves: ``store.sample_rows``)."""
        return [k.decoded for k in self.kept]

    @property
    def codes(self) -> Counter[str]:
        """Rejections counted by reason code (for metrics)."""
        return Counter(r.code for r in self.rejections)

    def keep(self, batch: Batch, source: str, raw: bytes) -> None:
        self.kept.append(Kept(batch, source, raw))
        self.sample_table = None

    def extend(self, other: ValidationResult) -> None:
        self.sample_table = (other.sample_table if not self.kept
                             else None if other.kept else self.sample_table)
        self.kept.extend(other.kept)
        self.rejections.extend(other.rejections)


class RecordValidator(Protocol):
    """The seam ``Ingestor`` calls: bus records in, batches to insert and rejections out."""

    def validate(self, records: Sequence[Record]) -> ValidationResult: ...


def source_of(rec: Record) -> str:
    """``topic/partition@offset``: where a record came from (the quarantine's ``source``)."""
    return f"{rec.topic}/{rec.partition}@{rec.offset}"


def unexpected(rec: Record, exc: BaseException) -> Rejection:
    """The rejection of a record whose handling raised ``exc`` (nobody foresaw it)."""
    return Rejection("unexpected_error",
                     f"handling this record raised {type(exc).__name__}: "
                     f"{clip(str(exc))}; it is kept here so nothing is lost: report it "
                     "to the fleetcare developers with these bytes", source_of(rec), rec.value)


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
    nics: list[msgspec.Raw] = []


_SECTIONS: tuple[tuple[str, type[msgspec.Struct]], ...] = (
    ("samples", GpuSample), ("events", XidEvent), ("incidents", Incident),
    ("nics", NicSample))
_TYPES = (_LooseBatch, GpuSample, XidEvent, Incident, NicSample)
_DECODERS: dict[str, dict[Any, Any]] = {
    "json": {t: msgspec.json.Decoder(t) for t in _TYPES}
    | {None: msgspec.json.Decoder()},
    "msgpack": {t: msgspec.msgpack.Decoder(t)
                for t in _TYPES}
    | {None: msgspec.msgpack.Decoder()},
}
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PATH = re.compile(r"^\.(?P<field>\w+)(?P<rest>.*)$")
_MISSING = re.compile(r"missing required field `(?P<field>\w+)`")


def _fmt(raw: bytes) -> str:
    # The same sniffing rule as contract.decode_batch.
    return "json" if raw[:1] in (b"{", b" ", b"\n") else "msgpack"


def _record_decode_problem(section: str, raw: bytes, fmt: str,
                           exc: Exception) -> tuple[str, str]:
    """(code, message) for a record that does not decode, naming the field and value."""
    if isinstance(exc, RecursionError):
        return "nesting_too_deep", TOO_DEEP
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
        except _DECODE_ERRORS:
            value = None
    where = f"{name}{rest} = {short(value)}"
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


def _undecoded(section: str, i: int, raw: bytes, fmt: str, exc: Exception,
               source: str) -> Rejection:
    """The rejection of record ``i`` of ``section`` (its bytes ``raw``): it does not
    decode."""
    code, msg = _record_decode_problem(section, raw, fmt, exc)
    return Rejection(code, f"{section}[{i}].{msg}", f"{source}#{section}[{i}]", raw)


class _Slices:
    """The wire bytes of each record of one message, decoded from it at most once.

    ``indexes``: after a salvage, the message index of each record the batch holds (the
    records that did not decode are not in it)."""

    def __init__(self, raw: bytes, loose: _LooseBatch | None = None,
                 indexes: dict[str, list[int]] | None = None) -> None:
        self.raw = raw
        self._loose = loose
        self._failed = False
        self.indexes = indexes

    def index(self, section: str, i: int) -> int:
        return i if self.indexes is None else self.indexes[section][i]

    def of(self, section: str, index: int) -> bytes:
        if self._loose is None and not self._failed:
            try:
                self._loose = _DECODERS[_fmt(self.raw)][_LooseBatch].decode(self.raw)
            except _DECODE_ERRORS:
                self._failed = True
        if self._loose is None:
            return self.raw
        records = getattr(self._loose, section)
        return bytes(records[index]) if index < len(records) else self.raw


def _wire(raw: bytes) -> Any:
    """``raw`` decoded as a ``RawBatch`` (samples left as bytes) of a version this
    pipeline reads, else None (the strict decoder then decides and explains)."""
    try:
        batch = RAW_BATCH.decode(raw)
    except _DECODE_ERRORS:
        return None
    return batch if 1 <= batch.schema_version <= SCHEMA_VERSION else None


def _clean(batch: Any, suspects: set[int] | None, opened: ValidationResult) -> bool:
    """Whether ``check_batch`` would keep ``batch`` whole without a look: only samples,
    none of them a suspect of the screen, and nothing rejected while it was opened."""
    return (suspects is not None and not suspects and bool(batch.samples)
            and not (batch.events or batch.incidents or batch.nics or opened.rejections))


def _landed(opened: _Opened, kept: Batch | None) -> list[bool]:
    """For each row ``opened`` had in the table it was screened into: whether ``kept``
    (its batch less the bad records, as ``check_batch`` returns it: the same sample
    objects, in order) still holds that sample; never for a row ``Validator._cut``
    dropped."""
    samples = opened.batch.samples
    if kept is None:
        marks = [False] * len(samples)
    elif len(kept.samples) == len(samples):
        marks = [True] * len(samples)
    else:
        held = {id(s) for s in kept.samples}
        marks = [id(s) in held for s in samples]
    for i in opened.dropped:  # ascending: each lands at its own row
        marks.insert(i, False)
    return marks


@dataclass(frozen=True, slots=True, eq=False)
class _Opened:
    """A decoded batch whose envelope passed, waiting for its records' checks (a
    ``Batch`` or a ``wire_columns.RawBatch``)."""

    batch: Any
    source: str
    slices: _Slices
    dropped: tuple[int, ...] = ()
    """Samples cut from the batch as it was screened (``Validator._cut``), ascending:
    their rows of the table land nowhere."""


class Validator:
    """The standard ``RecordValidator``: decode, check the envelope, check every record."""

    def __init__(self, *, clock: Callable[[], float] = time.time, limits: Limits | None = None,
                 causes: Iterable[str] = KNOWN_CAUSES) -> None:
        self.clock = clock
        self.limits = limits or Limits()
        self.checks = RecordChecks(self.limits, causes)
        self.screen = SampleScreen(self.limits)
        wire_samples.prepare()  # (the compiled msgpack decoder: once a process, up front)

    @property
    def causes(self) -> frozenset[str]:
        return self.checks.causes

    # -- entry points ----------------------------------------------------------------------
    def validate(self, records: Sequence[Record]) -> ValidationResult:
        """Every record decoded and its envelope checked, then the samples of all of them
        screened together (``SampleScreen``: a column at a time), then each record's
        checks run: on all its events, incidents and NIC samples, and on the samples the
        screen could not clear. Kept batches and rejections come in record order; a record
        whose handling raised (what nobody foresaw) is one ``unexpected_error``."""
        now = self.clock()
        opened: list[tuple[Record, ValidationResult, _Opened | None]] = []
        for rec in records:
            one = ValidationResult()
            try:
                opened.append((rec, one, self._open(rec, one)))
            except Exception as exc:
                log.exception("ingest.validation_failed source=%s", source_of(rec))
                opened.append((rec, ValidationResult(rejections=[unexpected(rec, exc)]), None))
        suspects, table, undecodable = self._screen(
            [o for _, _, o in opened if o is not None], now)
        if undecodable and table is not None and self._cut(opened, undecodable, suspects):
            undecodable = {}  # each such sample rejected on its own, the rest kept screened
        if undecodable:  # (no table, or one decodes after all: rare) opened again, strictly
            for j, (rec, _, o) in enumerate(opened):
                if o is not None and id(o) in undecodable:
                    one = ValidationResult()
                    try:
                        opened[j] = (rec, one, self._open(rec, one, strict=True))
                    except Exception as exc:
                        log.exception("ingest.validation_failed source=%s", o.source)
                        opened[j] = (rec, ValidationResult(rejections=[unexpected(rec, exc)]),
                                     None)
            suspects, table, _ = self._screen([o for _, _, o in opened if o is not None], now)
        result = ValidationResult()
        keep: list[bool] = []  # per screened sample: landed (its row of ``table`` kept)
        for rec, one, o in opened:
            if o is not None and _clean(o.batch, suspects.get(id(o)), one):
                result.kept.append(Kept(o.batch, o.source, rec.value))  # nothing to check
                keep += [True] * len(o.batch.samples)
                continue
            if o is not None:
                try:
                    kept = self.check_batch(o.batch, source=o.source, raw=rec.value,
                                            rejections=one.rejections, slices=o.slices,
                                            now=now, suspects=suspects.get(id(o)))
                    if kept is not None:
                        one.keep(kept, o.source, rec.value)
                except Exception as exc:
                    log.exception("ingest.validation_failed source=%s", o.source)
                    one = ValidationResult(rejections=[unexpected(rec, exc)])
                keep += _landed(o, one.kept[0].decoded if one.kept else None)
            result.extend(one)
        if table is not None and table.num_rows == len(keep):
            result.sample_table = table if all(keep) else table.filter(pa.array(keep))
        return result

    def validate_record(self, rec: Record, result: ValidationResult) -> None:
        """Append the kept batch (if any) and the rejections of one bus record; never
        raises (what nobody foresaw becomes an ``unexpected_error`` rejection)."""
        result.extend(self.validate([rec]))

    def _open(self, rec: Record, result: ValidationResult, *,
              strict: bool = False) -> _Opened | None:
        """Decode ``rec`` and check its envelope: the batch whose records are to be
        checked, or None when the whole record was rejected (appended to ``result``).
        msgpack is decoded with the samples left as bytes (``RAW_BATCH``) unless
        ``strict``; anything that decoder refuses is decoded strictly, which says why."""
        raw, source = rec.value, source_of(rec)
        if rec.error_code is not None:
            result.rejections.append(Rejection(rec.error_code, rec.error, source, raw))
            return None
        undecoded: list[Rejection] = []
        slices: _Slices | None = None
        wire = None if strict or _fmt(raw) != "msgpack" else _wire(raw)
        try:
            batch = wire if wire is not None else decode_batch(raw)
        except SchemaVersionError as exc:
            result.rejections.append(Rejection("schema_version_unsupported", exc.reason,
                                               source, raw))
            return None
        except DecodeError as exc:
            salvage = self._salvage(raw, exc, source, rec.key)
            if isinstance(salvage, Rejection):
                result.rejections.append(salvage)
                return None
            batch, undecoded, slices = salvage
        envelope = self._check_envelope(batch, rec.key, undecoded)
        if envelope is not None:
            result.rejections.append(Rejection(envelope[0], envelope[1], source, raw))
            return None
        result.rejections.extend(undecoded)
        return _Opened(batch, source, slices or _Slices(raw))

    def _screen(self, opened: list[_Opened], now: float
                ) -> tuple[dict[int, set[int]], pa.Table | None, dict[int, list[int]]]:
        """The suspect samples of each opened batch (keyed by ``id``), screened in one
        pass, the table of all their samples (None: the sinks convert them), and the
        samples the strict decoder refuses (a field of the wrong type, an NVLink list that
        is not one), by batch (``id``), ascending. A batch missing from the suspects has
        every sample checked: if the screen raises (nobody foresaw it), that costs time,
        never a check (and each batch of samples still bytes is named undecodable, all of
        its samples: to be opened again, strictly)."""
        samples = [s for o in opened for s in o.batch.samples]
        nodes = [o.batch.node for o in opened for _ in o.batch.samples]
        try:
            screened = self.screen.screen(samples, nodes, now)
        except Exception:
            log.exception("ingest.screen_failed samples=%d: checking each one", len(samples))
            # samples still bytes are decoded strictly first (their records opened again)
            return {}, None, {id(o): list(range(len(o.batch.samples))) for o in opened
                              if isinstance(o.batch, RawBatch)}
        flagged = sorted(screened.suspects)
        out: dict[int, set[int]] = {}
        ends = np.cumsum([len(o.batch.samples) for o in opened], dtype=np.int64)
        bad = np.array(sorted(screened.undecodable), dtype=np.int64)
        undecodable: dict[int, list[int]] = {}
        for j, i in zip(np.searchsorted(ends, bad, side="right").tolist(), bad.tolist(),
                        strict=True):
            first = int(ends[j]) - len(opened[j].batch.samples)
            undecodable.setdefault(id(opened[j]), []).append(i - first)
        start = k = 0
        for o in opened:
            end = start + len(o.batch.samples)
            mine = out[id(o)] = set()
            while k < len(flagged) and flagged[k] < end:
                mine.add(flagged[k] - start)
                k += 1
            start = end
        return out, screened.table, undecodable

    @staticmethod
    def _cut(opened: list[tuple[Record, ValidationResult, _Opened | None]],
             undecodable: dict[int, list[int]], suspects: dict[int, set[int]]) -> bool:
        """Reject each sample the strict decoder refuses on its own (with the reason it
        gives, as ``_salvage`` would) and put in ``opened`` its batch without them, its
        suspects renumbered: the other samples stay screened, their rows of the table in
        place (``_Opened.dropped`` names the rows cut). False, and nothing changed, when
        one of them decodes after all (the records are then opened again, strictly)."""
        cuts: list[tuple[int, _Opened, list[Rejection]]] = []
        for j, (_, _, o) in enumerate(opened):
            bad = undecodable.get(id(o)) if o is not None else None
            if o is None or bad is None:
                continue
            rejected = []
            for i in bad:
                rec_bytes = bytes(o.batch.samples[i])
                try:
                    _DECODERS["msgpack"][GpuSample].decode(rec_bytes)
                except _DECODE_ERRORS as exc:
                    rejected.append(_undecoded("samples", i, rec_bytes, "msgpack", exc,
                                               o.source))
                    continue
                return False
            gone = set(bad)
            left = [i for i in range(len(o.batch.samples)) if i not in gone]
            renumber = {i: n for n, i in enumerate(left)}
            indexes = {s: left if s == "samples" else list(range(len(getattr(o.batch, s))))
                       for s, _ in _SECTIONS}
            cut = _Opened(msgspec.structs.replace(o.batch, samples=[o.batch.samples[i]
                                                                    for i in left]),
                          o.source, _Slices(o.slices.raw, indexes=indexes), tuple(bad))
            suspects[id(cut)] = {renumber[i] for i in suspects.get(id(o), ()) if i in renumber}
            cuts.append((j, cut, rejected))
        for j, cut, rejected in cuts:
            rec, one, _ = opened[j]
            one.rejections.extend(rejected)
            opened[j] = (rec, one, cut)
        return True

    def _check_envelope(self, batch: Batch | _LooseBatch, key: str,
                        undecoded: Sequence[Rejection]) -> Problem | None:
        lim = self.limits
        if batch.node != key:
            return ("key_mismatch", f"batch node {short(batch.node)} does not match the "
                                    f"message key {short(key)}")
        if not batch.node.strip():
            return "empty_field", f"batch node = {batch.node!r} is empty"
        if len(batch.node) > lim.max_name_len:
            return ("string_too_long", f"batch node has {len(batch.node):,} characters; at "
                                       f"most {lim.max_name_len:,} are allowed")
        for section, _ in _SECTIONS:
            n = len(getattr(batch, section))
            if n > lim.max_batch_records:
                return ("batch_too_large",
                        f"batch seq={batch.seq} of node {short(batch.node)} has {n:,} "
                        f"{section}; at most {lim.max_batch_records:,} records per section "
                        "are allowed (Limits.max_batch_records): split it")
        if not (batch.samples or batch.events or batch.incidents or batch.nics or undecoded):
            return ("empty_batch", f"batch seq={batch.seq} of node {short(batch.node)} has "
                                   "no samples, events, incidents or nics")
        return None

    def check_batch(self, batch: Batch, *, source: str, raw: bytes,
                    rejections: list[Rejection], slices: _Slices | None = None,
                    now: float | None = None, suspects: set[int] | None = None
                    ) -> Batch | None:
        """``batch`` without its bad records (None when none is left); appends rejections.
        ``suspects``: the only samples that may have a problem (``SampleScreen``); None
        checks every sample."""
        now = self.clock() if now is None else now
        slices = slices or _Slices(raw)
        bad: dict[str, set[int]] = {}
        for section, _ in _SECTIONS:
            records = getattr(batch, section)
            indexes: Iterable[int] = range(len(records))
            if section == "samples" and suspects is not None:
                indexes = sorted(suspects)
            for i in indexes:
                rec = records[i] if section != "samples" else as_sample(records[i])
                problems = self.checks.check(section, rec, batch.node, now)
                if problems:
                    bad.setdefault(section, set()).add(i)
                    at = slices.index(section, i)
                    rejections.append(Rejection(
                        problems[0][0],
                        "; ".join(f"{section}[{at}].{msg}" for _, msg in problems),
                        f"{source}#{section}[{at}]", slices.of(section, at)))
        if not bad:
            return (batch if batch.samples or batch.events or batch.incidents or batch.nics
                    else None)
        parts = {s: [r for i, r in enumerate(getattr(batch, s)) if i not in bad.get(s, ())]
                 for s, _ in _SECTIONS}
        if not any(parts.values()):
            return None
        return msgspec.structs.replace(batch, **parts)

    # -- decoding salvage ------------------------------------------------------------------
    def _salvage(self, raw: bytes, exc: DecodeError, source: str, key: str
                 ) -> Rejection | tuple[Batch, list[Rejection], _Slices]:
        """Decode the envelope with raw records, then each record alone: the records that
        do not decode are rejected, the others come back as a batch, with the slices that
        know each one's index in the message (``check_batch`` names and slices them by it)."""
        fmt = _fmt(raw)
        too_deep = Rejection("nesting_too_deep", f"not a fleetcare batch ({fmt}): {TOO_DEEP}",
                             source, raw)
        try:
            loose = _DECODERS[fmt][_LooseBatch].decode(raw)
        except RecursionError:
            return too_deep
        except msgspec.ValidationError:
            try:  # well-formed JSON/msgpack that is not a batch, or garbage?
                _DECODERS[fmt][None].decode(raw)
            except RecursionError:
                return too_deep
            except msgspec.DecodeError:
                return Rejection("undecodable", exc.reason, source, raw)
            return Rejection("invalid_envelope", exc.reason, source, raw)
        except msgspec.DecodeError:
            return Rejection("undecodable", exc.reason, source, raw)
        if loose.schema_version < 1:
            return Rejection("schema_version_invalid", exc.reason, source, raw)
        envelope = self._check_envelope(loose, key, ())
        if envelope is not None and envelope[0] in ("batch_too_large", "string_too_long"):
            return Rejection(envelope[0], envelope[1], source, raw)  # before decoding them
        parts: dict[str, list[Any]] = {}
        indexes: dict[str, list[int]] = {}
        bad: list[Rejection] = []
        for section, tp in _SECTIONS:
            parts[section], indexes[section] = [], []
            for i, rec_raw in enumerate(getattr(loose, section)):
                rec_bytes = bytes(rec_raw)
                try:
                    parts[section].append(_DECODERS[fmt][tp].decode(rec_bytes))
                    indexes[section].append(i)
                except _DECODE_ERRORS as rec_exc:
                    bad.append(_undecoded(section, i, rec_bytes, fmt, rec_exc, source))
        if not bad:  # should not happen: decode_batch failed for a reason we cannot see
            return Rejection("invalid_envelope", exc.reason, source, raw)
        batch = Batch(schema_version=loose.schema_version, node=loose.node, seq=loose.seq,
                      sent_at=loose.sent_at, **parts)
        return batch, bad, _Slices(raw, loose, indexes)
