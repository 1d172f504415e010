"""XIDs from the kernel log: a pure parser and a backend that follows a log source.

Parser: ``parse_lines(lines)`` / ``KernelLogParser.feed(line)`` turn kernel-log text into
``ParsedXid`` values. Accepted prefixes: plain ``dmesg`` (``[ 1234.567890] ``), ``dmesg -T``
(``[Fri Aug 30 11:43:09 2024] ``), ``journalctl -o short-iso`` / ``short-iso-precise``
(``2024-08-30T11:43:14+0000 host kernel: ``), classic syslog (``Aug 30 11:43:09 host
kernel: [..] ``), bare ``kernel: `` and ``/dev/kmsg`` records (``4,2051,6781741548779,-;``).
Handled messages:

- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
  with or without ``pid=`` / ``name=`` (``pid='<unknown>', name=<unknown>`` -> None);
- the "fallen off the bus" message without an Xid number, one line
  (``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``) or several (``NVRM: The NVIDIA
  GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: ...) installed in this system has`` / ``NVRM: fallen
  off the bus ...``): reported as XID 79 ONCE per GPU and burst, also when the Xid line of
  the same burst was already seen;
- NVSwitch ``nvidia-nvswitchN: SXid (PCI:0000:06:00.0): 20034, ...`` (``nvswitch=True``);
- ``NVRM: GPU at PCI:0000:91:00: GPU-<uuid>`` lines are remembered, so later XIDs of that
  PCI id carry ``gpu_uuid``.

Backend: ``KernelLogBackend`` follows ``/dev/kmsg``, ``journalctl -k -f -o short-iso`` or a
file (tail -f) on its own thread into a bounded queue; ``poll`` turns what arrived into
``XidEvent(source="kernel-log")``. SXid lines are logged, not turned into XidEvents (the
contract has no NVSwitch field).

Exceptions: ``BackendError`` (from ``fleetcare.collectors.backend``) when the source cannot
be opened.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

from fleetcare.collectors.backend import BackendError, Reading
from fleetcare.collectors.contract import XidEvent, utc

log = logging.getLogger(__name__)

# -- prefixes ---------------------------------------------------------------------------
_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_DMESG_T = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]\s?(.*)$")
_ISO = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+\S+\s+(.*)$")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2} [ \d]?\d \d{2}:\d{2}:\d{2})\s+\S+\s+(.*)$")
_TAG = re.compile(r"^kernel:\s?(.*)$")
_CONT = re.compile(r"^\s+(NVRM:.*)$")

# -- messages ---------------------------------------------------------------------------
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+),?\s*(.*)$")
_PID = re.compile(r"^pid=(?:'<unknown>'|<unknown>|(\d+)),\s*")
_NAME = re.compile(r"^name=(<unknown>|[^,]*),\s*")
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")
_GPU_AT = re.compile(r"NVRM: GPU at PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^:]*: (GPU-[0-9a-fA-F-]+)")
_GPU_FELL = re.compile(
    r"NVRM: GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?: GPU has fallen off the bus")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\s*(.*)$")
_FALLEN = "fallen off the bus"

FALLEN_OFF_BUS_XID = 79
DEDUP_WINDOW_LINES = 50
"""A second fallen-off-the-bus report of the same GPU within this many lines is the same
event (the driver prints the Xid 79 line and the plain message together)..."""
DEDUP_WINDOW_S = 10.0
"""...provided their timestamps, when both lines have comparable ones, are this close."""


@dataclass(frozen=True, slots=True)
class ParsedXid:
    """One XID (or SXid) found in the kernel log.

    ``pci`` is as printed, without the function (``0000:3b:00``); ``ts`` is set when the
    prefix carries a wall-clock time (aware for journal ISO prefixes, naive local time for
    ``dmesg -T`` and syslog); ``mono_s`` is the kernel's monotonic stamp when present.
    """

    xid: int | None
    pci: str | None
    pid: int | None
    process: str | None
    message: str
    ts: dt.datetime | None = None
    nvswitch: bool = False
    sxid: int | None = None
    gpu_uuid: str | None = None
    mono_s: float | None = None

    def as_json_dict(self) -> dict[str, object]:
        return {"xid": self.xid, "pci": self.pci, "pid": self.pid, "process": self.process,
                "message": self.message}


@dataclass(slots=True)
class _Prefix:
    body: str
    ts: dt.datetime | None = None
    mono_s: float | None = None


def _strip_prefix(line: str, year: int) -> _Prefix:
    m = _KMSG.match(line)
    if m:
        return _Prefix(m.group(4), mono_s=int(m.group(3)) / 1e6)
    m = _DMESG_T.match(line)
    if m:
        wall = dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        return _Prefix(m.group(2), ts=wall)
    m = _DMESG.match(line)
    if m:
        return _Prefix(m.group(2), mono_s=float(m.group(1)))
    ts: dt.datetime | None = None
    rest: str | None = None
    m = _ISO.match(line)
    if m:
        try:
            ts = dt.datetime.fromisoformat(m.group(1).replace(",", "."))
            rest = m.group(2)
        except ValueError:
            rest = None
    if rest is None:
        m = _SYSLOG.match(line)
        if m:
            try:
                ts = dt.datetime.strptime(f"{year} {' '.join(m.group(1).split())}",
                                          "%Y %b %d %H:%M:%S")
                rest = m.group(2)
            except ValueError:
                rest = None
    if rest is None:
        rest = line
    t = _TAG.match(rest)
    if t:
        rest = t.group(1)
    mono: float | None = None
    d = _DMESG.match(rest)  # syslog lines often keep the "[12345.678]" stamp
    if d:
        rest, mono = d.group(2), float(d.group(1))
    return _Prefix(rest, ts=ts, mono_s=mono)


def _clock_key(pre: _Prefix) -> tuple[str, float] | None:
    if pre.ts is not None:
        ts = pre.ts if pre.ts.tzinfo is not None else pre.ts.replace(tzinfo=dt.UTC)
        return ("wall", ts.timestamp())
    if pre.mono_s is not None:
        return ("mono", pre.mono_s)
    return None


def _pci_key(pci: str) -> str:
    return pci.lower()


@dataclass
class KernelLogParser:
    """Stateful line parser: ``feed`` one line, get the XIDs it completes (0, 1 or more).

    State is bounded: the GPU-uuid map keeps the last 1024 PCI ids, the de-dup memory
    covers ``dedup_window`` lines.
    """

    year: int | None = None
    dedup_window: int = DEDUP_WINDOW_LINES
    _line_no: int = 0
    _fell_at: dict[str, tuple[int, tuple[str, float] | None]] = field(default_factory=dict)
    _uuids: dict[str, str] = field(default_factory=dict)
    _pending: tuple[str, list[str], _Prefix] | None = None

    def feed(self, raw: str) -> list[ParsedXid]:
        self._line_no += 1
        line = raw.rstrip("\r\n")
        if not line.strip():
            return []
        if line.startswith(" ") and _KMSG_CONT_KV.match(line):
            return []  # /dev/kmsg key=value continuation ("  SUBSYSTEM=pci")
        if "\\x0a" in line:  # /dev/kmsg escapes embedded newlines
            out: list[ParsedXid] = []
            first, *rest = line.split("\\x0a")
            out += self.feed(first)
            for part in rest:
                out += self.feed("  " + part.strip())
            return out
        cont = _CONT.match(line)
        if cont:
            return self._continuation(cont.group(1))
        pre = _strip_prefix(line, self.year if self.year is not None else dt.date.today().year)
        body = pre.body
        if self._pending is not None:
            if body.startswith("NVRM:") and not _XID.search(body) and not body.startswith(
                    "NVRM: The NVIDIA GPU"):
                return self._continuation(body)
            self._pending = None
        if "NVRM:" not in body and "SXid" not in body:
            return []
        m = _XID.search(body)
        if m:
            return self._xid(m, pre)
        m = _SXID.search(body)
        if m:
            return [ParsedXid(xid=None, pci=m.group(2), pid=None, process=None,
                              message=m.group(4), ts=pre.ts, nvswitch=True,
                              sxid=int(m.group(3)), mono_s=pre.mono_s)]
        m = _GPU_AT.search(body)
        if m:
            self._remember_uuid(_pci_key(m.group(1)), m.group(2))
            return []
        m = _GPU_FELL.search(body)
        if m:
            msg = body[body.index("NVRM:") + len("NVRM: "):]
            return self._fallen(m.group(1), msg, pre)
        m = _THE_GPU.search(body)
        if m:
            text = body[body.index("NVRM:") + len("NVRM: "):]
            if _FALLEN in text:
                return self._fallen(m.group(1), text, pre)
            self._pending = (m.group(1), [text], pre)
        return []

    # -- helpers -------------------------------------------------------------------------
    def _continuation(self, body: str) -> list[ParsedXid]:
        if self._pending is None:
            return []
        pci, parts, pre = self._pending
        parts.append(body[len("NVRM:"):].strip())
        if _FALLEN in " ".join(parts):
            self._pending = None
            return self._fallen(pci, " ".join(parts), pre)
        if len(parts) > 8:
            self._pending = None
        return []

    def _remember_uuid(self, pci: str, uuid: str) -> None:
        self._uuids.pop(pci, None)
        self._uuids[pci] = uuid
        while len(self._uuids) > 1024:
            self._uuids.pop(next(iter(self._uuids)))

    def _recent_fall(self, pci: str, pre: _Prefix) -> bool:
        seen = self._fell_at.get(_pci_key(pci))
        if seen is None or self._line_no - seen[0] > self.dedup_window:
            return False
        now, then = _clock_key(pre), seen[1]
        if now is None or then is None or now[0] != then[0]:
            return True  # no comparable clocks: the line window decides
        return abs(now[1] - then[1]) <= DEDUP_WINDOW_S

    def _mark_fall(self, pci: str, pre: _Prefix) -> None:
        self._fell_at[_pci_key(pci)] = (self._line_no, _clock_key(pre))
        for k in [k for k, v in self._fell_at.items()
                  if self._line_no - v[0] > self.dedup_window]:
            del self._fell_at[k]

    def _fallen(self, pci: str, message: str, pre: _Prefix) -> list[ParsedXid]:
        if self._recent_fall(pci, pre):
            self._mark_fall(pci, pre)
            return []
        self._mark_fall(pci, pre)
        return [ParsedXid(xid=FALLEN_OFF_BUS_XID, pci=pci, pid=None, process=None,
                          message=message, ts=pre.ts,
                          gpu_uuid=self._uuids.get(_pci_key(pci)), mono_s=pre.mono_s)]

    def _xid(self, m: re.Match[str], pre: _Prefix) -> list[ParsedXid]:
        pci, xid, rest = m.group(1), int(m.group(2)), m.group(3)
        pid: int | None = None
        process: str | None = None
        pm = _PID.match(rest)
        if pm:
            pid = int(pm.group(1)) if pm.group(1) else None
            rest = rest[pm.end():]
        nm = _NAME.match(rest)
        if nm:
            process = None if nm.group(1) == "<unknown>" else nm.group(1)
            rest = rest[nm.end():]
        if xid == FALLEN_OFF_BUS_XID:
            if self._recent_fall(pci, pre):
                self._mark_fall(pci, pre)
                return []
            self._mark_fall(pci, pre)
        return [ParsedXid(xid=xid, pci=pci, pid=pid, process=process, message=rest.strip(),
                          ts=pre.ts, gpu_uuid=self._uuids.get(_pci_key(pci)),
                          mono_s=pre.mono_s)]


_KMSG_CONT_KV = re.compile(r"^ [A-Z_]+=")


def parse_lines(lines: Iterable[str], *, year: int | None = None) -> Iterator[ParsedXid]:
    """Every XID/SXid in ``lines`` (any of the supported prefixes, mixed freely).

    ``year`` completes syslog timestamps, which carry none (default: this year).
    """
    parser = KernelLogParser(year=year)
    for line in lines:
        yield from parser.feed(line)


# -- the backend ------------------------------------------------------------------------
PciToGpu = Callable[[str], "tuple[str, int] | None"]
KMSG = "/dev/kmsg"
JOURNAL = "journalctl"


class KernelLogBackend:
    """Follows a kernel-log source on a thread; ``poll`` returns the XIDs seen since.

    ``source``: ``"/dev/kmsg"`` (default), ``"journalctl"`` (runs ``journalctl -k -f -o
    short-iso``) or the path of a file, followed like ``tail -f`` (truncation and
    rotation are noticed). Reading starts at the end of the source unless ``from_start``.
    The queue holds ``queue_size`` events; when it is full new events are dropped,
    counted in ``dropped`` and logged as ``kernel_log.queue_full``.
    """

    name = "kernel-log"

    def __init__(self, node: str, source: str = KMSG, *,
                 pci_to_gpu: PciToGpu | None = None, queue_size: int = 10_000,
                 from_start: bool = False, poll_interval_s: float = 0.1,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 journal_cmd: list[str] | None = None) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size {queue_size} must be at least 1")
        self.node = node
        self.source = source
        self.pci_to_gpu = pci_to_gpu
        self.dropped = 0
        self.sxid_seen = 0
        self._clock = clock
        self._interval = poll_interval_s
        self._queue: queue.Queue[tuple[ParsedXid, dt.datetime]] = queue.Queue(queue_size)
        self._stop = threading.Event()
        self._parser = KernelLogParser()
        self._full_logged = False
        self._proc: subprocess.Popen[str] | None = None
        self._file: IO[str] | None = None
        self._fd: int | None = None
        if source == KMSG:
            self._open_kmsg(from_start)
            target = self._run_kmsg
        elif source == JOURNAL:
            self._open_journal(journal_cmd)
            target = self._run_journal
        else:
            self._open_file(from_start)
            target = self._run_file
        self._thread = threading.Thread(target=self._guard, args=(target,),
                                        name=f"fleetcare-kernel-log:{source}", daemon=True)
        self._thread.start()

    # -- sources (opened on the caller's thread so errors surface at once) ---------------
    def _open_kmsg(self, from_start: bool) -> None:
        try:
            self._fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise BackendError(self.name, f"cannot open {KMSG}: {exc.strerror}; run the agent "
                               "as root or with CAP_SYSLOG, or use source='journalctl'") from exc
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)

    def _open_journal(self, cmd: list[str] | None) -> None:
        cmd = cmd or ["journalctl", "-k", "-f", "-o", "short-iso", "-n", "0"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True, errors="replace")
        except OSError as exc:
            raise BackendError(self.name, f"cannot run {cmd[0]!r}: {exc.strerror}; install "
                               "systemd's journalctl or use source='/dev/kmsg'") from exc

    def _open_file(self, from_start: bool) -> None:
        try:
            self._file = open(self.source, encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError as exc:
            raise BackendError(self.name, f"cannot open {self.source!r}: {exc.strerror}; check "
                               "the path of the kernel log file") from exc
        if not from_start:
            self._file.seek(0, os.SEEK_END)

    # -- reader thread -------------------------------------------------------------------
    def _guard(self, target: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                target()
                return
            except Exception:  # daemon loops log and keep running
                log.exception("kernel_log.reader_failed source=%s", self.source)
                self._stop.wait(1.0)

    def _ingest(self, line: str) -> None:
        for parsed in self._parser.feed(line):
            if parsed.nvswitch:
                self.sxid_seen += 1
                log.info("kernel_log.sxid pci=%s sxid=%s message=%s", parsed.pci, parsed.sxid,
                         parsed.message)
                continue
            try:
                self._queue.put_nowait((parsed, self._clock()))
                self._full_logged = False
            except queue.Full:
                self.dropped += 1
                if not self._full_logged:
                    log.warning("kernel_log.queue_full size=%d dropped=%d: poll() is not "
                                "keeping up; events are being dropped",
                                self._queue.maxsize, self.dropped)
                    self._full_logged = True

    def _run_kmsg(self) -> None:
        assert self._fd is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], self._interval)
            if not ready:
                continue
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                continue
            except BrokenPipeError:  # records overwritten before we read them
                log.warning("kernel_log.kmsg_overrun: ring buffer wrapped, records lost")
                continue
            for line in record.decode("utf-8", "replace").splitlines():
                self._ingest(line)

    def _run_journal(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if self._stop.is_set():
                return
            self._ingest(line)
        if not self._stop.is_set():
            log.error("kernel_log.journal_exited rc=%s", self._proc.poll())

    def _run_file(self) -> None:
        assert self._file is not None
        buf = ""
        while not self._stop.is_set():
            chunk = self._file.readline()
            if chunk:
                buf += chunk
                if buf.endswith("\n"):
                    self._ingest(buf)
                    buf = ""
                continue
            self._reopen_if_rotated()
            self._stop.wait(self._interval)

    def _reopen_if_rotated(self) -> None:
        assert self._file is not None
        try:
            st = os.stat(self.source)
        except OSError:
            return
        fst = os.fstat(self._file.fileno())
        if st.st_ino != fst.st_ino:
            self._file.close()
            self._file = open(self.source, encoding="utf-8", errors="replace")  # noqa: SIM115
            log.info("kernel_log.file_rotated path=%s", self.source)
        elif st.st_size < self._file.tell():
            self._file.seek(0)
            log.info("kernel_log.file_truncated path=%s", self.source)

    # -- GpuBackend ----------------------------------------------------------------------
    def poll(self, now: dt.datetime) -> Reading:
        """XidEvents for every XID read since the last poll (never blocks)."""
        events: list[XidEvent] = []
        while True:
            try:
                parsed, seen_at = self._queue.get_nowait()
            except queue.Empty:
                break
            events.append(self._event(parsed, seen_at))
        return Reading(events=events)

    def _event(self, p: ParsedXid, seen_at: dt.datetime) -> XidEvent:
        uuid, index = p.gpu_uuid, None
        if p.pci is not None and self.pci_to_gpu is not None:
            try:
                hit = self.pci_to_gpu(p.pci)
            except Exception:
                log.exception("kernel_log.pci_to_gpu_failed pci=%s", p.pci)
                hit = None
            if hit is not None:
                uuid, index = hit
        ts = utc(p.ts) if p.ts is not None and p.ts.tzinfo is not None else utc(seen_at)
        return XidEvent(ts=ts, node=self.node, xid=p.xid, message=p.message,
                        source="kernel-log", gpu_uuid=uuid, gpu_index=index,
                        pci_bus_id=p.pci, pid=p.pid, process=p.process)

    def close(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._thread.join(timeout=5)
        if self._file is not None:
            self._file.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- CLI --------------------------------------------------------------------------------
def main_parse_kmsg(argv: list[str] | None = None) -> int:
    """``parse-kmsg FILE|-``: one JSON object per GPU XID event, keys xid/pci/pid/process/message."""
    ap = argparse.ArgumentParser(
        prog="fleetcare-agent parse-kmsg",
        description="Print the NVIDIA XIDs found in a kernel log (dmesg, dmesg -T, journalctl, "
                    "syslog or /dev/kmsg format) as JSON lines.")
    ap.add_argument("file", metavar="FILE", help="kernel log file, or - for stdin")
    ap.add_argument("--year", type=int, default=None,
                    help="year for syslog timestamps, which carry none (default: this year)")
    args = ap.parse_args(argv)
    try:
        stream: IO[str] = (sys.stdin if args.file == "-"
                           else open(args.file, encoding="utf-8", errors="replace"))  # noqa: SIM115
    except OSError as exc:
        print(f"parse-kmsg: cannot read {args.file!r}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        for parsed in parse_lines(stream, year=args.year):
            if not parsed.nvswitch:
                print(json.dumps(parsed.as_json_dict()))
    finally:
        if stream is not sys.stdin:
            stream.close()
    return 0

