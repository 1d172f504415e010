"""``SimulatedDrainer``: the scheduler of a simulated fleet (``fleetcare demo``).

Every node runs a (simulated) training job until drained; drains and resumes change
only this object's memory. The demo runs the drain controller in dry-run over it, so
its decisions (which nodes would be drained, why, what it would save) reach the audit
log, the API and the dashboard as they would on a real cluster, and nothing changes.
"""

from __future__ import annotations

import threading

from fleetcare.api.drains.drainer import ALLOC, DRAINED, NodeState


class SimulatedDrainer:
    """A scheduler in memory: every node ``alloc`` until drained."""

    name = "simulated"

    def __init__(self) -> None:
        self._drained: dict[str, str] = {}
        self._lock = threading.Lock()

    def state(self, node: str) -> NodeState:
        with self._lock:
            reason = self._drained.get(node)
        if reason is not None:
            return NodeState(node, DRAINED, reason, raw="DRAINED (simulated)")
        return NodeState(node, ALLOC, None, raw="ALLOCATED (simulated training job)")

    def drain(self, node: str, reason: str) -> None:
        with self._lock:
            self._drained[node] = reason

    def resume(self, node: str, reason: str) -> None:
        with self._lock:
            self._drained.pop(node, None)
