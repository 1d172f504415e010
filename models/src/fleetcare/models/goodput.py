"""Goodput: the decision rule for draining a node, and the ETTR model.

DESIGN.md, "Goodput: the decision rule": drain when the expected goodput saved exceeds
the cost of draining. For a job of N GPUs with checkpoint interval Δ and restart
overhead u0, a crash costs about N·(Δ/2 + u0) GPU-hours (on average half a checkpoint
interval of work is lost, plus the restart); a planned drain costs a checkpoint plus
the node's inspection / repair, ``drain_cost_gpu_h``.

Expected training-time ratio (Kokolis et al., "Revisiting Reliability in Large-Scale
Machine Learning Research Clusters", HPCA 2025):

    E[ETTR] ≈ (1 − N_nodes · r_f · (u0 + Δ/2)) / (1 + w_cp / Δ)

with r_f the failure rate per node-hour and w_cp the time to write a checkpoint.

Errors::

    ValueError
     └── GoodputError       a cost-model or ETTR argument is out of range
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CostModel", "GoodputError", "ettr"]


class GoodputError(ValueError):
    """A goodput argument is out of range; ``name`` and ``value`` say which."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name}={value!r} is invalid: expected {expected}.")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise GoodputError(name, value, "a finite number > 0")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise GoodputError(name, value, "a finite number >= 0")


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GoodputError(name, value, "an integer >= 1")


def _probability(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise GoodputError(name, value, "a probability in [0, 1]")


@dataclass(frozen=True)
class CostModel:
    """What a crash and a drain cost, in GPU-hours, for the job a node serves."""

    job_gpus: int = 1024  # N, GPUs of the job the node serves
    checkpoint_interval_h: float = 1.0  # Δ
    restart_overhead_h: float = 0.25  # u0
    drain_cost_gpu_h: float = 24.0  # checkpoint + the node's inspection/repair
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        _positive_int("job_gpus", self.job_gpus)
        _positive("checkpoint_interval_h", self.checkpoint_interval_h)
        _non_negative("restart_overhead_h", self.restart_overhead_h)
        _non_negative("drain_cost_gpu_h", self.drain_cost_gpu_h)
        _positive_int("gpus_per_node", self.gpus_per_node)

    def crash_cost_gpu_h(self) -> float:
        """Expected GPU-hours an unplanned crash costs: N·(Δ/2 + u0)."""
        return self.job_gpus * (self.checkpoint_interval_h / 2 + self.restart_overhead_h)

    def expected_saving_gpu_h(self, risk: float) -> float:
        """Expected GPU-hours a drain saves at failure probability ``risk``."""
        _probability("risk", risk)
        return risk * self.crash_cost_gpu_h()

    def should_drain(self, risk: float, *, post_repair_risk: float | None = None) -> bool:
        """Drain when the expected saving exceeds the drain cost. ``post_repair_risk``: for
        a repeat offender back from repair, its recurrence risk over the same horizon
        (``offenders.post_repair_risk``); the decision uses the higher of the two
        (``decision_risk``)."""
        return (self.expected_saving_gpu_h(self.decision_risk(risk, post_repair_risk))
                > self.drain_cost_gpu_h)

    @staticmethod
    def decision_risk(risk: float, post_repair_risk: float | None = None) -> float:
        """The risk a decision uses: the model's, or the post-repair risk when higher."""
        _probability("risk", risk)
        if post_repair_risk is None:
            return risk
        _probability("post_repair_risk", post_repair_risk)
        return max(risk, post_repair_risk)

    def break_even_risk(self) -> float:
        """The risk at which draining and not draining cost the same (capped at 1)."""
        crash = self.crash_cost_gpu_h()
        if crash <= 0:
            return 1.0
        return min(1.0, self.drain_cost_gpu_h / crash)


def ettr(
    job_gpus: int,
    failures_per_node_h: float,
    restart_overhead_h: float,
    checkpoint_interval_h: float,
    checkpoint_write_h: float,
    gpus_per_node: int = 8,
) -> float:
    """Expected training-time ratio (Kokolis et al., HPCA 2025), clipped at 0.

    ``(1 − N_nodes·r_f·(u0 + Δ/2)) / (1 + w_cp/Δ)`` with ``N_nodes = ceil(N / gpus_per_node)``.
    """
    _positive_int("job_gpus", job_gpus)
    _non_negative("failures_per_node_h", failures_per_node_h)
    _non_negative("restart_overhead_h", restart_overhead_h)
    _positive("checkpoint_interval_h", checkpoint_interval_h)
    _non_negative("checkpoint_write_h", checkpoint_write_h)
    _positive_int("gpus_per_node", gpus_per_node)
    nodes = math.ceil(job_gpus / gpus_per_node)
    lost = nodes * failures_per_node_h * (restart_overhead_h + checkpoint_interval_h / 2)
    return max(0.0, (1.0 - lost) / (1.0 + checkpoint_write_h / checkpoint_interval_h))
