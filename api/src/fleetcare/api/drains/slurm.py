"""``SlurmDrainer``: drain and resume Slurm nodes with ``scontrol``.

    scontrol update NodeName=gpu01 State=DRAIN Reason="fleetcare: risk 0.83, ..."
    scontrol update NodeName=gpu01 State=RESUME
    scontrol show node gpu01          (State= and Reason= are parsed)

Commands run through an injectable ``runner`` (default: ``subprocess.run`` with a
timeout), so tests can record them and a site can wrap them (ssh, sudo). Arguments
are passed as a list, never through a shell: a reason cannot inject anything.
Slurm finds its cluster the usual way (``SLURM_CONF``, ``/etc/slurm/slurm.conf``).
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable, Sequence

from fleetcare.api.drains.drainer import (
    ALLOC,
    DOWN,
    DRAINED,
    DRAINING,
    IDLE,
    MIXED,
    UNKNOWN,
    DrainerError,
    NodeState,
    clean_reason,
)

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

_BASE = {"IDLE": IDLE, "ALLOCATED": ALLOC, "ALLOC": ALLOC, "MIXED": MIXED,
         "COMPLETING": ALLOC, "DOWN": DOWN, "FUTURE": UNKNOWN, "UNKNOWN": UNKNOWN,
         "PLANNED": IDLE, "RESERVED": IDLE}
_DOWN_FLAGS = {"FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN",
               "POWER_DOWN", "REBOOT_ISSUED", "REBOOT_REQUESTED"}
_REASON_SUFFIX = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")  # " [root@2026-11-29T16:35:01]"


def parse_state(raw: str) -> str:
    """Slurm's ``State=`` value (``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DOWN*+DRAIN``, ...)
    → one of drainer's states. A trailing ``*`` means not responding: ``down``."""
    parts = raw.strip().upper().split("+")
    base, flags = parts[0], set(parts[1:])
    if base.endswith("*") or any(f.endswith("*") for f in flags):
        return DOWN
    state = _BASE.get(base, UNKNOWN)
    if state == DOWN or flags & _DOWN_FLAGS:
        return DOWN
    if "DRAIN" in flags or base in ("DRAIN", "DRAINED", "DRAINING"):
        return DRAINING if state in (ALLOC, MIXED) or base == "DRAINING" else DRAINED
    return state


def parse_show_node(text: str) -> tuple[str, str | None]:
    """(``State=`` value, ``Reason=`` text without Slurm's ``[user@time]`` suffix)."""
    m = re.search(r"(?:^|\s)State=(\S+)", text)
    if not m:
        raise ValueError(f"no State= in scontrol output: {text[:200]!r}")
    reason = None
    r = re.search(r"(?:^|\s)Reason=(.*)$", text, re.MULTILINE)
    if r:
        reason = _REASON_SUFFIX.sub("", r.group(1)).strip() or None
    return m.group(1), reason


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


class SlurmDrainer:
    """Drain, resume and inspect Slurm nodes through ``scontrol``."""

    name = "slurm"

    def __init__(self, *, scontrol: str = "scontrol", runner: Runner = _run) -> None:
        self.scontrol = scontrol
        self.runner = runner

    def _call(self, node: str, args: list[str]) -> str:
        cmd = [self.scontrol, *args]
        try:
            res = self.runner(cmd)
        except FileNotFoundError:
            raise DrainerError(node, f"{self.scontrol!r} not found: install Slurm's client "
                                     "(Debian: slurm-client) or pass scontrol=/path/to/scontrol"
                               ) from None
        except subprocess.TimeoutExpired:
            raise DrainerError(node, f"`{' '.join(cmd)}` timed out: is slurmctld up? "
                                     "(check `scontrol ping`)") from None
        if res.returncode != 0:
            err = (res.stderr or res.stdout or "").strip()
            hint = ""
            if "Invalid node name" in err:
                hint = " Check the name with `sinfo -N`."
            elif "Unable to contact" in err or "Connection refused" in err:
                hint = " Is slurmctld running, and SLURM_CONF pointing at its slurm.conf?"
            elif "Access/permission denied" in err or "Invalid user" in err:
                hint = " Node updates need SlurmUser or root (or an admin account)."
            raise DrainerError(node, f"`{' '.join(cmd)}` failed (exit {res.returncode}): "
                                     f"{err or 'no output'}.{hint}", detail=err)
        return res.stdout

    def state(self, node: str) -> NodeState:
        try:
            out = self._call(node, ["show", "node", node])
        except DrainerError as exc:
            if "not found" in exc.detail.lower() or "invalid node name" in exc.detail.lower():
                return NodeState(node, UNKNOWN, None, exc.detail)
            raise
        try:
            raw, reason = parse_show_node(out)
        except ValueError as exc:
            raise DrainerError(node, f"cannot read the state of {node}: {exc}") from None
        return NodeState(node, parse_state(raw), reason, raw)

    def drain(self, node: str, reason: str) -> None:
        reason = clean_reason(reason)
        self._call(node, ["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        log.info("drain.slurm.drained node=%s reason=%r", node, reason)

    def resume(self, node: str, reason: str) -> None:
        # Slurm keeps no reason on RESUME; ours goes to the audit log only.
        self._call(node, ["update", f"NodeName={node}", "State=RESUME"])
        log.info("drain.slurm.resumed node=%s why=%r", node, reason)
