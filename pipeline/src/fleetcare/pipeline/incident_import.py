"""Incidents from outside: Slurm's node event history and operators' CSV files.

Slurm. ``sacctmgr show event`` (``list event``) prints node events with the default format
``Cluster,NodeName,TimeStart,TimeEnd,State,Reason,User`` (SchedMD/slurm
``src/sacctmgr/event_functions.c``), either as a fixed-width table (a header line, a line of
dashes, right-aligned columns, values longer than the column cut with a trailing ``+``)
or, with ``-p`` / ``-P``, ``|``-separated (``-p`` ends every line with ``|``). Any format
with a ``NodeName`` (or ``Cluster Nodes``), ``TimeStart`` and ``State`` column parses;
headerless ``-n`` output must use the default columns. Times are the cluster's local
time without a zone: they are read as UTC, so run ``TZ=UTC sacctmgr show event ...``
(or pass ``tz``).

A node event whose state has DOWN, DRAIN / DRNG or FAIL becomes a ``failure`` incident
(source ``slurm``, ts = TimeStart, no GPU), except planned work and fleetcare's own
drains, which are not failures (``PLANNED``). The cause comes from keywords of the reason
(``REASON_CAUSES``, first match wins, GPU-specific first); a reason with no keyword
(``Not responding``, ``Kill task failed``, ``Node unexpectedly rebooted``) is
``host_maintenance``: the host went away for a reason Slurm cannot see, which is what
Llama 3's "host maintenance" row counts.

CSV. Header ``ts,node,gpu_uuid,kind,cause,mode,note`` (``ts``, ``node``, ``kind``,
``cause`` required). Every row is checked first; any bad row fails the whole import
with every problem listed by line number, so a file is imported entirely or not at all.
``write_csv`` writes incidents in that format (``fleetcare simulate --incidents-csv``);
an incident's XID, which has no column, goes into the note.

Exceptions::

    ImportProblem (ValueError)   (.problems: list of "line N: ..." strings)
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Iterable
from typing import TextIO

from fleetcare.collectors.contract import Incident
from fleetcare.pipeline.incidents import IncidentError, parse_time, validate

DEFAULT_COLUMNS = ("Cluster", "NodeName", "TimeStart", "TimeEnd", "State", "Reason", "User")
DEFAULT_WIDTHS = (10, 15, 19, 19, 6, 30, 10)
_TITLES = {"Cluster", "NodeName", "Cluster Nodes", "ClusterNodes", "TimeStart", "TimeEnd",
           "State", "Reason", "User", "Duration", "Event", "CPUs", "TRES"}
FAILURE_STATES = ("DOWN", "DRAIN", "DRNG", "FAIL")
PLANNED = ("planned", "maint", "upgrade", "reboot asap", "reboot requested",
           "scheduled", "fleetcare")
"""Reason fragments (lower case) of drains that are not failures; 'fleetcare' marks our
own drains (they must never become labels: the model would learn from itself)."""

_XID = r"xid\W*"
REASON_CAUSES: tuple[tuple[tuple[str, ...], str, str | None], ...] = (
    (("ecc", "hbm", "dbe", "remap", rf"{_XID}(48|63|64|94|95|140)\b"), "gpu_hbm3_memory",
     "hbm"),
    (("gsp", rf"{_XID}(119|120)\b"), "gpu_system_processor", "gsp"),
    (("nvlink", rf"{_XID}74\b"), "faulty_gpu", "nvlink"),
    (("fallen off", "gpu lost", "gpu is lost", rf"{_XID}79\b", "pcie"), "faulty_gpu", "pcie"),
    (("thermal", "overheat", "temperature"), "gpu_thermal_interface_sensor", "thermal"),
    (("gpu", "xid", "nvml", "dcgm"), "faulty_gpu", None),
    (("nccl",), "nccl_watchdog_timeout", None),
    ((r"ib\d*\b", "infiniband", "hca", "mlx", r"nic\b", "roce"), "nic", None),
    (("switch", "cable", "network", "link down", "ethernet"), "network_switch_cable", None),
    (("ssd", "nvme", "disk"), "ssd", None),
    (("psu", "power supply"), "power_supply", None),
    (("dimm", "system memory", "mce", "edac"), "system_memory", None),
    (("cpu",), "cpu", None),
    (("chassis", "fan", "bmc"), "server_chassis", None),
)
"""(regexes matched at a word start in the lower-case reason, cause, mode); first match wins."""
DEFAULT_CAUSE = "host_maintenance"


class ImportProblem(ValueError):
    """Input that cannot be imported; ``problems`` lists each as 'line N: what'."""

    def __init__(self, source: str, problems: list[str]) -> None:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{source}: {len(problems)} problem(s), nothing imported:\n  "
                         f"{shown}{more}")
        self.problems = problems


def cause_from_reason(reason: str) -> tuple[str, str | None]:
    """(cause, mode) from a Slurm reason's keywords; ``DEFAULT_CAUSE`` when none match."""
    text = reason.lower()
    for words, cause, mode in REASON_CAUSES:
        if any(re.search(rf"\b{w}", text) for w in words):
            return cause, mode
    return DEFAULT_CAUSE, None


def expand_hostlist(spec: str) -> list[str]:
    """'gpu[01-03,07]' → gpu01, gpu02, gpu03, gpu07 (one bracket group; plain names pass)."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part.strip())
        if not m:
            if part.strip():
                out.append(part.strip())
            continue
        pre, ranges, post = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{pre}{i:0{len(lo)}d}{post}")
    return out


def _split_fixed(lines: list[str]) -> tuple[list[str], list[list[str]], int]:
    """Header names and rows of a fixed-width table; returns the first data line's index."""
    if len(lines) >= 2 and set(lines[1].strip()) <= {"-", " "} and "-" in lines[1]:
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
        names = [lines[0][a:b].strip() for a, b in spans]
        first = 2
    else:                                    # -n: the default columns and widths
        spans, pos = [], 0
        for w in DEFAULT_WIDTHS:
            spans.append((pos, pos + w))
            pos += w + 1
        names, first = list(DEFAULT_COLUMNS), 0
    rows = [[line[a:b].strip() for a, b in spans] for line in lines[first:]]
    return names, rows, first


def _split_parsable(lines: list[str]) -> tuple[list[str], list[list[str]], int]:
    cells = [line.rstrip("\n").split("|") for line in lines]
    cells = [c[:-1] if c and c[-1] == "" and len(c) > 1 else c for c in cells]   # -p
    header = [c.strip() for c in cells[0]]
    if set(header) & _TITLES:
        return header, cells[1:], 1
    return list(DEFAULT_COLUMNS), cells, 0


def parse_slurm_events(text: str, *, tz: dt.tzinfo = dt.UTC,
                       source_name: str = "sacctmgr output") -> tuple[list[Incident], int]:
    """Failure incidents from ``sacctmgr show event`` output; returns (incidents, skipped).

    ``skipped`` counts node events that are not failures (up/idle states, planned work).
    Raises ``ImportProblem`` listing every line that cannot be read.
    """
    raw = text.splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(raw) if line.strip()]
    if not numbered:
        return [], 0
    lines = [line for _, line in numbered]
    parsable = "|" in lines[0]
    names, rows, first = (_split_parsable if parsable else _split_fixed)(lines)
    col = {n.replace(" ", "").lower(): i for i, n in enumerate(names)}
    node_i = col.get("nodename", col.get("clusternodes"))
    start_i = col.get("timestart", col.get("start"))
    state_i = col.get("state")
    if node_i is None or start_i is None or state_i is None:
        raise ImportProblem(source_name, [
            f"line {numbered[0][0]}: columns {names} lack NodeName, TimeStart or State; "
            "use sacctmgr's default format or format=NodeName,TimeStart,State,Reason"])
    reason_i, user_i, cluster_i = col.get("reason"), col.get("user"), col.get("cluster")
    out: list[Incident] = []
    problems: list[str] = []
    skipped = 0
    for (lineno, _), cells in zip(numbered[first:], rows, strict=True):
        def get(i: int | None, cells: list[str] = cells) -> str:
            return cells[i].strip() if i is not None and i < len(cells) else ""

        node, state, reason = get(node_i), get(state_i).upper(), get(reason_i)
        if not node:
            skipped += 1                     # a cluster event (no node)
            continue
        if not any(s in state for s in FAILURE_STATES) or any(
                p in reason.lower() for p in PLANNED):
            skipped += 1
            continue
        try:
            start = dt.datetime.fromisoformat(get(start_i))
        except ValueError:
            problems.append(f"line {lineno}: TimeStart {get(start_i)!r} is not a time "
                            "like 2024-05-01T13:02:11 (run sacctmgr without "
                            "SLURM_TIME_FORMAT set)")
            continue
        if start.tzinfo is None:
            start = start.replace(tzinfo=tz)
        cause, mode = cause_from_reason(reason)
        note = f"slurm {get(cluster_i)} State={state} Reason={reason}".replace("  ", " ")
        if get(user_i):
            note += f" User={get(user_i)}"
        for name in expand_hostlist(node):
            out.append(validate(ts=start, node=name, kind="failure", cause=cause,
                                source="slurm", mode=mode, note=note))
    if problems:
        raise ImportProblem(source_name, problems)
    return out, skipped


CSV_COLUMNS = ("ts", "node", "gpu_uuid", "kind", "cause", "mode", "note")
CSV_REQUIRED = ("ts", "node", "kind", "cause")


def parse_csv(text: str | Iterable[str], *, source_name: str = "CSV") -> list[Incident]:
    """Incidents from CSV (header ``CSV_COLUMNS``); all rows or ``ImportProblem``."""
    reader = csv.DictReader(io.StringIO(text) if isinstance(text, str) else text)
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise ImportProblem(source_name, [
            f"line 1: header {header} lacks {missing}; expected {','.join(CSV_COLUMNS)}"])
    unknown = [c for c in header if c not in CSV_COLUMNS]
    if unknown:
        raise ImportProblem(source_name, [
            f"line 1: unknown column(s) {unknown}; expected {','.join(CSV_COLUMNS)}"])
    out: list[Incident] = []
    problems: list[str] = []
    for row in reader:
        lineno = reader.line_num
        vals = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        if None in row:
            problems.append(f"line {lineno}: {len(row[None]) + len(header)} fields, "
                            f"the header has {len(header)}")
            continue
        try:
            if not vals.get("ts"):
                raise IncidentError("ts", "", "ts is empty")
            out.append(validate(
                ts=parse_time(vals["ts"]), node=vals.get("node", ""),
                kind=vals.get("kind", ""), cause=vals.get("cause", ""), source="csv",
                gpu_uuid=vals.get("gpu_uuid"), mode=vals.get("mode"), note=vals.get("note")))
        except IncidentError as exc:
            problems.append(f"line {lineno}: {exc}")
    if problems:
        raise ImportProblem(source_name, problems)
    return out


def write_csv(incidents: Iterable[Incident], out: TextIO, *, note_prefix: str = "") -> int:
    """Write ``incidents`` as CSV that ``parse_csv`` reads back (header ``CSV_COLUMNS``,
    ISO-8601 UTC times with ``Z``); an XID goes into the note as ``xid N``, after
    ``note_prefix``. Returns the rows written."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    n = 0
    for inc in incidents:
        note = "; ".join(p for p in (note_prefix, f"xid {inc.xid}" if inc.xid is not None
                                     else "", inc.note or "") if p)
        w.writerow([inc.ts.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"), inc.node,
                    inc.gpu_uuid or "", inc.kind, inc.cause, inc.mode or "", note])
        n += 1
    return n
