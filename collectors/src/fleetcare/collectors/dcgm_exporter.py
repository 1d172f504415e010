"""GPU samples from a dcgm-exporter endpoint (Prometheus text format, no extra deps).

``parse_exposition(text)`` is a small, strict parser of the Prometheus text format
(comments, ``# HELP``/``# TYPE``, labels with ``\\\\``, ``\\"`` and ``\\n`` escapes, spaces
around label commas, NaN/±Inf, optional millisecond timestamps). ``samples_from_series``
maps ``DCGM_FI_*`` series to ``GpuSample`` fields per GPU (``UUID`` label), following
``FIELD_MAP`` below (also in ``collectors/README_dcgm.md``). Unknown series are ignored;
a field whose series is absent, or carries DCGM's "blank" sentinel, is None.

MIG: device-level series repeat per GPU instance (``GPU_I_ID``); the value without
``GPU_I_ID`` wins, else the first instance's, except ``fb_used_mib`` which is summed over
instances.

``DcgmExporterBackend(url, node, fetch=...)`` scrapes on every ``poll``; a change of
``DCGM_FI_DEV_XID_ERRORS`` (the last XID of a GPU) becomes an ``XidEvent(source="dcgm")``.

Exceptions::

    ExpositionError (ValueError)   (.line_no, .line)
    BackendError                   when the endpoint cannot be scraped or parsed
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from fleetcare.collectors.backend import BackendError, Reading
from fleetcare.collectors.contract import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    GpuSample,
    XidEvent,
)
from fleetcare.collectors.redact import mask_secrets

log = logging.getLogger(__name__)


class ExpositionError(ValueError):
    """A line that is not valid Prometheus text format."""

    def __init__(self, line_no: int, line: str, reason: str) -> None:
        super().__init__(f"line {line_no}: {reason}: {line[:200]!r}")
        self.line_no = line_no
        self.line = line


@dataclass(frozen=True, slots=True)
class Series:
    """One sample line: ``name{labels} value [timestamp_ms]``."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_value(tok: str) -> float:
    low = tok.lower()
    if low in ("nan",):
        return math.nan
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(tok)


def _parse_line(line: str, line_no: int) -> Series:
    m = _NAME.match(line)
    if not m:
        raise ExpositionError(line_no, line, "metric name expected")
    name, i, labels = m.group(0), m.end(), {}
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while i < len(line) and line[i] in " \t":
                i += 1
            if i < len(line) and line[i] == "}":
                i += 1
                break
            lm = _LABEL.match(line, i)
            if not lm:
                raise ExpositionError(line_no, line, f"label name expected at column {i + 1}")
            key, i = lm.group(0), lm.end()
            while i < len(line) and line[i] in " \t":
                i += 1
            if line[i:i + 2] != '="':
                raise ExpositionError(line_no, line, f'"=\\"" expected after label {key!r}')
            i += 2
            val: list[str] = []
            while True:
                if i >= len(line):
                    raise ExpositionError(line_no, line, f"unterminated value of label {key!r}")
                c = line[i]
                if c == "\\" and i + 1 < len(line):
                    val.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    val.append(c)
                    i += 1
            labels[key] = "".join(val)
            while i < len(line) and line[i] in " \t":
                i += 1
            if i < len(line) and line[i] == ",":
                i += 1
            elif i < len(line) and line[i] == "}":
                i += 1
                break
            else:
                raise ExpositionError(line_no, line, "',' or '}' expected after a label")
    rest = line[i:].split()
    if not rest or len(rest) > 2:
        raise ExpositionError(line_no, line, "expected a value and an optional timestamp")
    try:
        value = _parse_value(rest[0])
        ts = int(rest[1]) if len(rest) == 2 else None
    except ValueError:
        raise ExpositionError(line_no, line, "value or timestamp is not a number") from None
    return Series(name, labels, value, ts)


def parse_exposition(text: str) -> list[Series]:
    """Every sample of a Prometheus text-format document; comments are skipped."""
    out: list[Series] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        out.append(_parse_line(line, n))
    return out


# -- DCGM -> GpuSample ------------------------------------------------------------------
def _f(v: float) -> float:
    return float(v)


def _i(v: float) -> int:
    return int(v)


def _b(v: float) -> bool:
    return v != 0


# DCGM field -> (GpuSample field, converter). Keep in sync with collectors/README_dcgm.md.
FIELD_MAP: dict[str, tuple[str, Callable[[float], Any]]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temp_c", _f),
    "DCGM_FI_DEV_MEMORY_TEMP": ("mem_temp_c", _f),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", _f),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", _f),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _i),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", _i),
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", _f),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", _f),
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", _i),
    "DCGM_FI_DEV_FB_TOTAL": ("fb_total_mib", _i),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected_volatile", _i),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected_volatile", _i),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected_aggregate", _i),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_aggregate", _i),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", _i),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", _i),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", _b),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", _i),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", _i),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows_pending", _b),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows_failure", _b),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_count", _i),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_link_gen", _i),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("pcie_link_gen_max", _i),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_link_width", _i),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("pcie_link_width_max", _i),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", _i),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", _i),
}

# Per-link NVLink counters: DCGM_FI_DEV_NVLINK_<KIND>_L<n>, or the same name without the
# suffix and an ``nvlink="<n>"`` label (link-entity metrics). The *_TOTAL series are not
# mapped: GpuSample keeps per-link counters; the pipeline sums them.
NVLINK_MAP: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT": "nvlink_crc_flit",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT": "nvlink_crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT": "nvlink_replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT": "nvlink_recovery",
}
_NVLINK_LANE = re.compile(r"^(DCGM_FI_DEV_NVLINK_[A-Z_]+_COUNT)_L(\d+)$")
XID_SERIES = "DCGM_FI_DEV_XID_ERRORS"

def is_blank(value: float) -> bool:
    """True for DCGM's "no value" sentinels (dcgm_structs.h: ``*_BLANK``, +1 ``NOT_FOUND``,
    +2 ``NOT_SUPPORTED``, +3 ``NOT_PERMISSIONED``), and for NaN / infinities. DCGM's own test
    is ``value >= BLANK``: every int64 from ``DCGM_INT64_BLANK`` (9223372036854775792; a
    scrape prints 9223372036854775794 for "not supported") and every float from
    ``DCGM_FP64_BLANK`` (2**47) up; a 32-bit field's blanks are 2147483632..2147483647."""
    if math.isnan(value) or math.isinf(value):
        return True
    return value >= DCGM_FP64_BLANK or (DCGM_INT32_BLANK <= value <= 0x7FFFFFFF)


def _label(value: str) -> str:
    """A label value, "" for DCGM's string sentinels (``<<<NULL>>>``, ``<<<NOT_FOUND>>>``,
    ``<<<NOT_SUPPORTED>>>``, ``<<<NOT_PERM>>>``: DCGM_STR_IS_BLANK)."""
    return "" if value.startswith("<<<") and ">>>" in value else value


@dataclass
class _Gpu:
    uuid: str
    index: int
    pci: str
    model: str
    host: str | None
    fields: dict[str, tuple[bool, Any]]  # name -> (from a non-MIG series, value)
    links: dict[str, dict[int, int | None]]  # None: that link's value was a blank
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class SeriesMeaning:
    """What one series says, worked out once from its name and labels (``meaning``):
    which GPU, and which ``GpuSample`` field (``fname``, converted by ``conv``), NVLink
    link (``link``) or the XID (``kind``: ``field``, ``link``, ``xid``)."""

    key: str
    index: int
    pci: str
    model: str
    host: str | None
    kind: str
    fname: str = ""
    conv: Callable[[float], Any] | None = None
    mig: bool = False
    link: int = -1


def meaning(name: str, labels: Mapping[str, str]) -> SeriesMeaning | None:
    """The meaning of series ``name{labels}``; None for a series fleetcare does not map
    or one without a GPU UUID. Metric names are matched case-insensitively (a relabelling
    pipeline may lower-case them: ``dcgm_fi_dev_gpu_temp``)."""
    key = _label(labels.get("UUID") or labels.get("gpu_uuid") or "") or None
    if key is None:
        return None
    if name.startswith("dcgm_"):
        name = name.upper()
    try:
        index = int(labels.get("gpu", "-1"))
    except ValueError:
        index = -1
    base = SeriesMeaning(key=key, index=index, pci=_label(labels.get("pci_bus_id", "")),
                         model=_label(labels.get("modelName") or labels.get("model_name", "")),
                         host=_label(labels.get("Hostname") or labels.get("hostname") or "")
                         or None, kind="none")
    if name == XID_SERIES:
        return replace(base, kind="xid")
    mapped = FIELD_MAP.get(name)
    if mapped is not None:
        return replace(base, kind="field", fname=mapped[0], conv=mapped[1],
                       mig="GPU_I_ID" in labels)
    lane = _NVLINK_LANE.match(name)
    stem, link = (lane.group(1), int(lane.group(2))) if lane else (name, None)
    if stem in NVLINK_MAP:
        if link is None and labels.get("nvlink", "").isdigit():
            link = int(labels["nvlink"])
        if link is not None:
            return replace(base, kind="link", fname=NVLINK_MAP[stem], link=link)
    return base


def gpu_samples(points: Iterable[tuple[SeriesMeaning, float]], *, ts: dt.datetime,
                node: str | None = None, default_node: str = "unknown"
                ) -> tuple[list[GpuSample], dict[str, int]]:
    """``samples_from_series`` for values whose series' meanings are already known."""
    gpus: dict[str, _Gpu] = {}
    for m, value in points:
        g = gpus.get(m.key)
        if g is None:
            g = gpus[m.key] = _Gpu(uuid=m.key, index=m.index, pci=m.pci, model=m.model,
                                   host=m.host, fields={}, links={})
        if is_blank(value):
            if m.kind == "link":  # one link not reported: the list would invent a 0
                g.links.setdefault(m.fname, {})[m.link] = None
            continue
        if m.kind == "field":
            assert m.conv is not None
            converted = m.conv(value)
            prev = g.fields.get(m.fname)
            if prev is None or (prev[0] is False and not m.mig):
                g.fields[m.fname] = (not m.mig, converted)
            elif m.fname == "fb_used_mib" and m.mig and prev[0] is False:
                g.fields[m.fname] = (False, prev[1] + converted)
        elif m.kind == "link":
            g.links.setdefault(m.fname, {})[m.link] = int(value)
        elif m.kind == "xid":
            g.xid = int(value)
    samples: list[GpuSample] = []
    xids: dict[str, int] = {}
    for g in gpus.values():
        kw: dict[str, Any] = {k: v for k, (_, v) in g.fields.items()}
        for fname, per_link in g.links.items():
            if None not in per_link.values():
                kw[fname] = [per_link.get(i, 0) for i in range(max(per_link) + 1)]
        samples.append(GpuSample(ts=ts, node=node or g.host or default_node, gpu_uuid=g.uuid,
                                 gpu_index=g.index, pci_bus_id=g.pci, model=g.model, **kw))
        if g.xid is not None:
            xids[g.uuid] = g.xid
    samples.sort(key=lambda s: (s.gpu_index, s.gpu_uuid))
    return samples, xids


def mapped_series(series: Iterable[Series]) -> int:
    """How many series fleetcare maps to a field, a link counter or the XID (0: not a
    dcgm-exporter page, or its names were renamed beyond lower-casing)."""
    return sum(1 for s in series
               if (m := meaning(s.name, s.labels)) is not None and m.kind != "none")


NO_KNOWN_FIELD = ("no DCGM field fleetcare maps among {n} series (e.g. DCGM_FI_DEV_GPU_TEMP "
                  "with a UUID label; names are matched case-insensitively): is this a "
                  "dcgm-exporter /metrics page, and are the metrics renamed?")


def samples_from_series(series: Iterable[Series], *, ts: dt.datetime,
                        node: str | None = None,
                        default_node: str = "unknown") -> tuple[list[GpuSample], dict[str, int]]:
    """One ``GpuSample`` per GPU (by ``UUID``), and the last XID per GPU uuid (if exported).

    ``node`` overrides the ``Hostname``/``hostname`` label; ``default_node`` is used when
    neither is there.
    """
    points = ((m, s.value) for s in series
              if (m := meaning(s.name, s.labels)) is not None)
    return gpu_samples(points, ts=ts, node=node, default_node=default_node)


# -- backend ----------------------------------------------------------------------------
Fetch = Callable[[str, float], bytes]


def urllib_fetch(url: str, timeout_s: float) -> bytes:
    """GET ``url`` with a timeout; the default ``fetch`` of ``DcgmExporterBackend``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
        return resp.read()


class DcgmExporterBackend:
    """Scrapes a dcgm-exporter ``/metrics`` URL once per ``poll``."""

    name = "dcgm-exporter"

    def __init__(self, url: str = "http://127.0.0.1:9400/metrics", node: str = "localhost", *,
                 fetch: Fetch = urllib_fetch, timeout_s: float = 5.0) -> None:
        self.url = url
        self.node = node
        self._fetch = fetch
        self._timeout = timeout_s
        self._last_xid: dict[str, int] = {}
        self._warned = False

    def poll(self, now: dt.datetime) -> Reading:
        try:
            raw = self._fetch(self.url, self._timeout)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise BackendError(self.name, f"cannot scrape {mask_secrets(self.url)}: "
                               f"{mask_secrets(str(exc))}; check that "
                               "dcgm-exporter runs and listens there (default port 9400, "
                               "path /metrics)") from exc
        try:
            series = parse_exposition(raw.decode("utf-8", "replace"))
        except ExpositionError as exc:
            raise BackendError(self.name, f"{mask_secrets(self.url)} did not return "
                               "Prometheus text "
                               f"format ({exc}); point the URL at dcgm-exporter's /metrics") from exc
        if series and not self._warned and mapped_series(series) == 0:
            self._warned = True  # once: the page will not change by itself
            log.warning("dcgm.no_known_fields url=%s %s", mask_secrets(self.url),
                        NO_KNOWN_FIELD.format(n=len(series)))
        samples, xids = samples_from_series(series, ts=now, node=self.node)
        by_uuid = {s.gpu_uuid: s for s in samples}
        events: list[XidEvent] = []
        for uuid, xid in xids.items():
            prev = self._last_xid.get(uuid)
            if prev is not None and xid != prev and xid != 0:
                s = by_uuid[uuid]
                events.append(XidEvent(ts=now, node=self.node, xid=xid, source="dcgm",
                                       message=f"{XID_SERIES} changed from {prev} to {xid}",
                                       gpu_uuid=uuid, gpu_index=s.gpu_index,
                                       pci_bus_id=s.pci_bus_id or None))
        self._last_xid = xids  # forget GPUs that are gone
        return Reading(samples=samples, events=events)

    def close(self) -> None:
        """Nothing to release: every poll is one HTTP request."""


# -- CLI --------------------------------------------------------------------------------
def main_parse_dcgm(argv: list[str] | None = None) -> int:
    """``parse-dcgm FILE|-``: one GpuSample JSON line per GPU of a /metrics document."""
    ap = argparse.ArgumentParser(prog="fleetcare-agent parse-dcgm",
                                 description="Map a dcgm-exporter /metrics document to "
                                             "fleetcare GpuSample JSON lines, one per GPU.")
    ap.add_argument("file", metavar="FILE", help="saved /metrics output, or - for stdin")
    ap.add_argument("--node", default="unknown",
                    help="node name when the series carry no Hostname label")
    args = ap.parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
    except OSError as exc:
        print(f"parse-dcgm: cannot read {args.file!r}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        series = parse_exposition(text)
    except ExpositionError as exc:
        print(f"parse-dcgm: {args.file}: not Prometheus text format: {exc}", file=sys.stderr)
        return 1
    if series and mapped_series(series) == 0:
        print(f"parse-dcgm: {args.file}: {NO_KNOWN_FIELD.format(n=len(series))}",
              file=sys.stderr)
        return 1
    samples, _ = samples_from_series(series, ts=dt.datetime.now(dt.UTC),
                                     default_node=args.node)
    enc = msgspec.json.Encoder()
    for s in samples:
        sys.stdout.write(enc.encode(s).decode() + "\n")
    return 0
