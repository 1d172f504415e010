"""Job-level goodput simulation: what failures and drains cost the jobs on a fleet.

Every node of the fleet runs a job. ``pack_jobs`` gives each node a job size by cycling
through ``job_sizes`` (node i gets ``job_sizes[i % len]``), then cuts the nodes of each
size into jobs of ``ceil(N / gpus_per_node)`` nodes. A small simulated fleet cannot hold a
4,096-GPU job, so a job may have fewer nodes *in the fleet* (``nodes``) than it needs
(``nodes_needed``): the rest of it runs on nodes outside the simulation, assumed to
behave like the ones inside (that is how ETTR is scaled, below).

Over a period [start, end), with node failures and alarm episodes (``metrics.alarm_episodes``:
the node is drained for the warning window W (``horizon_h``) from the episode start):

- a failure of a node running a job of N GPUs costs N·(time since the job's last
  checkpoint + u0) GPU-hours; checkpoints are every Δ from the job's phase;
- a failure that an episode started at least ``min_lead_h`` before (and at most W before)
  is *avoided*: the drain (checkpoint, inspection / repair) costs ``drain_cost_gpu_h``
  instead. A later alarm is too late: the crash costs in full;
- an episode with no failure of its node in (s, s + W] and none in [s − grace, s] is a
  *false drain* and costs ``drain_cost_gpu_h``; one that starts at (or just after) a
  failure is a *reaction* (reactive rules do this) and costs nothing beyond the crash;
- ETTR (Kokolis et al.) from the realised loss: each job's loss is scaled from its nodes in
  the fleet to all the nodes it needs, ``ETTR = (1 − Σ_j lost_j·n_j/k_j / Σ_j N_j·T) /
  (1 + w_cp/Δ)``, clipped at 0. Without drains, with failures at r_f per node-hour, its
  expectation is ``goodput.ettr``.

Goodput-optimal threshold: ``decision_score`` turns node risk into the expected saving of a
drain over its cost, ``risk · crash_cost(job) / drain_cost`` (the cost model says drain at
> 1); ``choose_goodput_threshold`` picks, among candidate thresholds, the one that loses
the fewest GPU-hours on a period with known failures (the calibration period).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetcare.models import metrics as M
from fleetcare.models.goodput import CostModel, GoodputError

DEFAULT_JOB_SIZES = (8, 64, 512, 1024, 4096)
MIN_LEAD_H = 0.25  # time to checkpoint and drain before the node goes
REACTION_GRACE_H = 1.0 / 6  # an alarm up to 10 min after a failure reacts to it
CHECKPOINT_WRITE_H = 0.05  # w_cp, 3 minutes


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    gpus: int  # N
    nodes: tuple[str, ...]  # its nodes in the simulated fleet (k)
    nodes_needed: int  # ceil(N / gpus_per_node) (n)
    phase_h: float  # first checkpoint at start + phase


@dataclass(frozen=True, slots=True)
class GoodputResult:
    gpu_hours_lost: float
    crash_gpu_hours: float
    drain_gpu_hours: float
    failures: int  # failures of nodes running a job
    interruptions: int  # crashes that were not avoided
    interruptions_avoided: int
    false_drains: int
    drains: int  # episodes that were not reactions
    ettr: float
    job_gpu_hours: float
    details: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours_lost": round(self.gpu_hours_lost, 3),
            "crash_gpu_hours": round(self.crash_gpu_hours, 3),
            "drain_gpu_hours": round(self.drain_gpu_hours, 3),
            "failures": self.failures,
            "interruptions": self.interruptions,
            "interruptions_avoided": self.interruptions_avoided,
            "false_drains": self.false_drains,
            "drains": self.drains,
            "ettr": round(self.ettr, 6),
        }


def pack_jobs(nodes: Iterable[str], job_sizes: Sequence[int] = DEFAULT_JOB_SIZES, *,
              gpus_per_node: int = 8, checkpoint_interval_h: float = 1.0, seed: int = 0
              ) -> list[Job]:
    """Jobs over the fleet's nodes (sorted by name); see the module docstring."""
    sizes = [int(s) for s in job_sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise GoodputError("job_sizes", job_sizes, "one or more job sizes in GPUs, each >= 1")
    rng = np.random.default_rng(seed)
    by_size: dict[int, list[str]] = {}
    for i, n in enumerate(sorted(set(nodes))):
        by_size.setdefault(sizes[i % len(sizes)], []).append(n)
    jobs: list[Job] = []
    for size in sizes:
        members = by_size.pop(size, [])
        need = math.ceil(size / gpus_per_node)
        for k in range(0, len(members), need):
            jobs.append(Job(len(jobs), size, tuple(members[k:k + need]), need,
                            float(rng.uniform(0.0, checkpoint_interval_h))))
    return jobs


def _hours(delta: np.timedelta64) -> float:
    return float(delta / np.timedelta64(1, "us")) / 3.6e9


def simulate_goodput(failures: Sequence[M.Failure], episodes: Sequence[tuple[str, np.datetime64]],
                     jobs: Sequence[Job], cost: CostModel, start: np.datetime64,
                     end: np.datetime64, *, horizon_h: float = 24.0,
                     min_lead_h: float = MIN_LEAD_H, grace_h: float = REACTION_GRACE_H,
                     checkpoint_write_h: float = CHECKPOINT_WRITE_H) -> GoodputResult:
    """GPU-hours lost to failures and drains on [start, end); see the module docstring."""
    H = np.timedelta64(int(round(horizon_h * 3.6e9)), "us")
    grace = np.timedelta64(int(round(grace_h * 3.6e9)), "us")
    job_of = {n: j for j in jobs for n in j.nodes}
    fails = [f for f in failures if f.node in job_of and start <= f.ts < end]
    eps = [(n, s) for n, s in episodes if start <= s < end]
    eps_by_node: dict[str, list[np.datetime64]] = {}
    for n, s in eps:
        eps_by_node.setdefault(n, []).append(s)
    fails_by_node: dict[str, list[np.datetime64]] = {}
    for f in fails:
        fails_by_node.setdefault(f.node, []).append(f.ts)
    lost_by_job = dict.fromkeys((j.job_id for j in jobs), 0.0)
    crash = drain = 0.0
    avoided = interrupted = 0
    details = []
    for f in fails:
        job = job_of[f.node]
        jc = replace(cost, job_gpus=job.gpus)
        leads = [_hours(f.ts - s) for s in eps_by_node.get(f.node, ()) if f.ts - H <= s < f.ts]
        if leads and max(leads) >= min_lead_h:
            avoided += 1  # the drain is charged with its episode below
            details.append({"node": f.node, "mode": f.mode, "outcome": "avoided",
                            "lead_h": max(leads)})
            continue
        since_ckpt = (_hours(f.ts - start) - job.phase_h) % jc.checkpoint_interval_h
        c = job.gpus * (since_ckpt + jc.restart_overhead_h)
        crash += c
        lost_by_job[job.job_id] += c
        interrupted += 1
        details.append({"node": f.node, "mode": f.mode, "outcome": "crash", "gpu_hours": c})
    false_drains = drains = 0
    for n, s in eps:
        fs = fails_by_node.get(n, ())
        if not any(s < t <= s + H for t in fs) and any(s - grace <= t <= s for t in fs):
            continue  # a reaction to a failure: the crash is already charged
        drains += 1
        if not any(s < t <= s + H for t in fs):
            false_drains += 1
        drain += cost.drain_cost_gpu_h
        if n in job_of:
            lost_by_job[job_of[n].job_id] += cost.drain_cost_gpu_h
    T = max(_hours(end - start), 0.0)
    job_gpu_h = sum(j.gpus * T for j in jobs)
    scaled = sum(lost_by_job[j.job_id] * j.nodes_needed / len(j.nodes) for j in jobs if j.nodes)
    if job_gpu_h > 0:
        ettr = max(0.0, (1.0 - scaled / job_gpu_h)
                   / (1.0 + checkpoint_write_h / cost.checkpoint_interval_h))
    else:
        ettr = 1.0 / (1.0 + checkpoint_write_h / cost.checkpoint_interval_h)
    return GoodputResult(crash + drain, crash, drain, len(fails), interrupted, avoided,
                         false_drains, drains, ettr, job_gpu_h, details)


def decision_score(node: np.ndarray, risk: np.ndarray, jobs: Sequence[Job], cost: CostModel
                   ) -> np.ndarray:
    """Expected saving of a drain over its cost: ``risk · crash_cost(job) / drain_cost``."""
    crash = {n: replace(cost, job_gpus=j.gpus).crash_cost_gpu_h() for j in jobs for n in j.nodes}
    c = np.array([crash.get(str(n), 0.0) for n in node], dtype=np.float64)
    r = np.clip(np.asarray(risk, dtype=np.float64), 0.0, 1.0)
    if cost.drain_cost_gpu_h <= 0:
        return np.where(r * c > 0, np.inf, 0.0)
    return r * c / cost.drain_cost_gpu_h


def candidate_thresholds(score: np.ndarray, *, max_candidates: int = 150) -> list[float]:
    """Quantiles of the scores, the cost model's break-even 1.0, and "never" (inf)."""
    s = np.asarray(score, dtype=np.float64)
    s = s[np.isfinite(s) & (s > 0)]
    qs: np.ndarray | list[float] = (
        np.unique(np.quantile(s, np.linspace(0.0, 1.0, max_candidates))) if len(s) else [])
    return sorted({float(q) for q in qs} | {1.0, math.inf})


def choose_goodput_threshold(ts: np.ndarray, node: np.ndarray, score: np.ndarray,
                             failures: Sequence[M.Failure], jobs: Sequence[Job],
                             cost: CostModel, start: np.datetime64, end: np.datetime64,
                             *, candidates: Iterable[float] | None = None,
                             horizon_h: float = 24.0, **sim: Any
                             ) -> tuple[float, GoodputResult, dict[float, float]]:
    """The threshold on ``score`` losing the fewest GPU-hours (ties: the higher one).

    Returns (threshold, its result, GPU-hours lost per candidate).
    """
    H = np.timedelta64(int(round(horizon_h * 3.6e9)), "us")
    cands = sorted(set(candidates if candidates is not None else candidate_thresholds(score)),
                   reverse=True)
    if not cands:
        raise GoodputError("candidates", cands, "at least one threshold")
    best: tuple[float, GoodputResult] | None = None
    lost: dict[float, float] = {}
    for thr in cands:
        eps = (M.alarm_episodes(ts, node, score, thr, H) if math.isfinite(thr) else [])
        res = simulate_goodput(failures, eps, jobs, cost, start, end, horizon_h=horizon_h, **sim)
        lost[thr] = res.gpu_hours_lost
        if best is None or res.gpu_hours_lost < best[1].gpu_hours_lost - 1e-9:
            best = (thr, res)
    assert best is not None
    return best[0], best[1], lost


def job_summary(jobs: Sequence[Job]) -> list[Mapping[str, Any]]:
    return [{"job_id": j.job_id, "gpus": j.gpus, "fleet_nodes": len(j.nodes),
             "nodes_needed": j.nodes_needed} for j in jobs]
