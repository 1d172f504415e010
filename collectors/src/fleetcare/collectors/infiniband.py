"""InfiniBand / RoCE ports from sysfs: a pure reader of a ``/sys/class/infiniband`` tree and
the ``infiniband`` backend that polls it each tick.

Layout (the kernel's ``Documentation/ABI/stable/sysfs-class-infiniband``)::

    <root>/<device>/ports/<port>/state          "4: ACTIVE"        (DOWN, INIT, ARMED, ...)
    <root>/<device>/ports/<port>/phys_state     "5: LinkUp"        (Polling, Disabled, ...)
    <root>/<device>/ports/<port>/rate           "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)"
    <root>/<device>/ports/<port>/link_layer     "InfiniBand" | "Ethernet" (RoCE)
    <root>/<device>/ports/<port>/counters/<name>     legacy PMA counters (``NIC_COUNTER_BITS``)
    <root>/<device>/ports/<port>/hw_counters/<name>  the driver's own counters (mlx5, ...)

What cannot be read becomes a value, never a crash: a missing file, a file that cannot
be read (EIO, EACCES: newer kernels fail the read when the port has no PMA), and older
kernels' ``N/A (no PMA)`` are ``None``. A legacy counter at its maximum is listed in
``NicSample.saturated``. ``hw_counters/lifespan`` (the driver's cache time in ms, not a
count) is skipped.

    for s in read_ports("/sys/class/infiniband", node="gpu-07", now=now): ...
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

from fleetcare.collectors.backend import Reading
from fleetcare.collectors.contract import (
    DCGM_INT64_BLANK,
    NIC_COUNTER_BITS,
    NicSample,
    saturated_counters,
)

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/sys/class/infiniband"
HW_SKIP = frozenset({"lifespan"})
"""``hw_counters`` files that are not counters."""
MAX_READ = 4096
"""sysfs values are at most a page; read no more than that of any file."""

_NAMED = re.compile(r"^\s*(\d+)\s*:\s*(.+?)\s*$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def _read(path: Path) -> str | None:
    """The stripped text of a sysfs file, or None when it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ).decode("ascii", "replace").strip()
    except OSError:
        return None


def parse_named(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; a bare name stays as it is; empty -> None."""
    if not text:
        return None
    m = _NAMED.match(text)
    return m.group(2) if m else text


def parse_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; ``"2.5 Gb/sec (1X SDR)"`` -> 2.5; else None."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def parse_counter(text: str | None) -> int | None:
    """A decimal count; ``N/A (no PMA)``, garbage, negatives and values from DCGM's blank
    up (no port counts there: a sentinel) are None."""
    if text is None:
        return None
    t = text.strip()
    if not t.isdigit():
        return None
    value = int(t)
    return value if value < DCGM_INT64_BLANK else None


def _port_dirs(root: Path) -> list[tuple[str, int, Path]]:
    out: list[tuple[str, int, Path]] = []
    try:
        devices = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for dev in devices:
        try:
            ports = [p for p in (dev / "ports").iterdir() if p.is_dir() and p.name.isdigit()]
        except OSError:
            continue
        out.extend((dev.name, int(p.name), p) for p in sorted(ports, key=lambda p: int(p.name)))
    return out


def read_port(port_dir: Path, *, node: str, device: str, port: int,
              now: dt.datetime) -> NicSample:
    """One port directory as a ``NicSample`` (unreadable values are None)."""
    counters: dict[str, Any] = {name: parse_counter(_read(port_dir / "counters" / name))
                for name in NIC_COUNTER_BITS}
    hw_names: list[str] = []
    hw_values: list[int] = []
    try:
        hw_files = sorted(p for p in (port_dir / "hw_counters").iterdir() if p.is_file())
    except OSError:
        hw_files = []
    for f in hw_files:
        if f.name in HW_SKIP:
            continue
        value = parse_counter(_read(f))
        if value is not None:
            hw_names.append(f.name)
            hw_values.append(value)
    sample = NicSample(
        ts=now, node=node, device=device, port=port,
        link_layer=_read(port_dir / "link_layer") or None,
        state=parse_named(_read(port_dir / "state")),
        phys_state=parse_named(_read(port_dir / "phys_state")),
        rate_gbps=parse_rate(_read(port_dir / "rate")),
        hw_counter_names=hw_names or None, hw_counter_values=hw_values or None,
        **counters)
    saturated = saturated_counters(sample)
    return msgspec.structs.replace(sample, saturated=saturated) if saturated else sample


def read_ports(root: str | Path, *, node: str, now: dt.datetime) -> list[NicSample]:
    """Every port of every device under ``root`` (a ``/sys/class/infiniband`` layout),
    devices by name, ports by number. A root that does not exist has no ports."""
    samples = []
    for device, port, path in _port_dirs(Path(root)):
        try:
            samples.append(read_port(path, node=node, device=device, port=port, now=now))
        except Exception:  # one odd port never costs the others
            log.exception("infiniband.port_failed device=%s port=%d", device, port)
    return samples


class InfinibandBackend:
    """The ``infiniband`` backend: every port under ``root`` once per tick, as NicSamples."""

    name = "infiniband"

    def __init__(self, node: str, root: str | Path = DEFAULT_ROOT) -> None:
        self.node = node
        self.root = Path(root)
        if not self.root.is_dir():
            log.warning("infiniband.no_root root=%s: no InfiniBand/RoCE devices (is the "
                        "ib_core module loaded?); NIC samples stay empty", self.root)

    def poll(self, now: dt.datetime) -> Reading:
        return Reading(nics=read_ports(self.root, node=self.node, now=now))

    def close(self) -> None:
        pass


def main_parse_ib(argv: list[str] | None = None) -> int:
    """``parse-ib DIR``: one JSON object per port (a ``NicSample``) of a sysfs tree."""
    ap = argparse.ArgumentParser(
        prog="fleetcare-agent parse-ib",
        description="Print every port of a directory laid out like /sys/class/infiniband "
                    "(<device>/ports/<n>/{state,phys_state,rate,link_layer,counters/,"
                    "hw_counters/}) as NicSample JSON lines. A saved tree works: "
                    "`cp -rL /sys/class/infiniband/. saved/` on a node, then parse-ib saved.",
        epilog="DIR only, no '-': a sysfs tree is many small files, and no text stream "
               "carries it without an archive format of its own; unpack an archive first "
               "(tar -x) and give its directory.")
    ap.add_argument("dir", metavar="DIR", help="the tree's root (default layout of "
                    f"{DEFAULT_ROOT})")
    ap.add_argument("--node", default="", help="node name on the records (default: this "
                    "host's name)")
    args = ap.parse_args(argv)
    if args.dir == "-":
        print("parse-ib: '-' is not supported: give a directory laid out like "
              f"{DEFAULT_ROOT} (unpack an archive of one first)", file=sys.stderr)
        return 2
    root = Path(args.dir)
    if not root.is_dir():
        print(f"parse-ib: {args.dir!r} is not a directory: give one laid out like "
              f"{DEFAULT_ROOT}", file=sys.stderr)
        return 1
    import socket

    node = args.node or socket.gethostname()
    for sample in read_ports(root, node=node, now=dt.datetime.now(dt.UTC)):
        print(json.dumps(msgspec.to_builtins(sample)))
    return 0
