"""The ``Drainer`` seam: how the controller reads and changes a node's scheduler state.

A drainer knows one scheduler (Slurm, Kubernetes). It reports a node's state in a
scheduler-neutral vocabulary (``NodeState``) and drains or resumes it with a reason a
human can read. Every drain reason fleetcare writes starts with ``"fleetcare:"``:
``pipeline.incident_import`` skips scheduler events whose reason contains
"fleetcare", so our own drains never become failure labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

REASON_PREFIX = "fleetcare:"
MAX_REASON_CHARS = 200

# scheduler-neutral node states
IDLE = "idle"          # up, no work
ALLOC = "alloc"        # up, running work (Slurm allocated)
MIXED = "mixed"        # up, partly allocated
DRAINING = "draining"  # marked for drain, work still running
DRAINED = "drained"    # marked for drain (Slurm) / cordoned (Kubernetes), no new work
DOWN = "down"          # not responding, down, failed or NotReady
UNKNOWN = "unknown"    # the scheduler does not know the node, or says something we do not

SCHEDULABLE = frozenset({IDLE, ALLOC, MIXED})
"""States the controller may drain from; it never acts on any other."""


class DrainerError(Exception):
    """A scheduler command or API call failed; ``node`` and ``detail`` say which and why."""

    def __init__(self, node: str, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.node = node
        self.detail = detail


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as its scheduler sees it: ``state`` is one of the constants above."""

    node: str
    state: str
    reason: str | None = None  # the scheduler's drain/down reason, if any
    raw: str = ""  # the scheduler's own words (Slurm "IDLE+DRAIN", Kubernetes conditions)

    @property
    def schedulable(self) -> bool:
        return self.state in SCHEDULABLE

    @property
    def by_fleetcare(self) -> bool:
        """Drained with a reason fleetcare wrote."""
        return self.reason is not None and REASON_PREFIX in self.reason


@runtime_checkable
class Drainer(Protocol):
    """One scheduler. ``drain``/``resume`` raise ``DrainerError`` with a readable message."""

    name: str

    def state(self, node: str) -> NodeState: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str, reason: str) -> None: ...


_UNSAFE = re.compile(r"[\x00-\x1f\"'`\\]+")


def drain_reason(risk: float, reasons: list[str] | None = None) -> str:
    """``"fleetcare: risk 0.83, GPU 3: HBM errors ..."``: one line, no quotes, <= 200 chars.

    Scheduler reasons are shown in ``sinfo``/``kubectl`` and parsed by other tools, so
    control characters, quotes and backslashes are replaced by spaces.
    """
    text = f"{REASON_PREFIX} risk {risk:.2f}"
    if reasons:
        text += ", " + "; ".join(reasons[:2])
    return clean_reason(text)


def clean_reason(text: str) -> str:
    text = " ".join(_UNSAFE.sub(" ", text).split())
    if not text.startswith(REASON_PREFIX):
        text = f"{REASON_PREFIX} {text}"
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3].rstrip() + "..."
    return text
