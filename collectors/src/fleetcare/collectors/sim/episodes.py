"""Precursor episodes: what a failing (or decoy) GPU shows, and when.

Every GPU failure with a mode other than ``none`` becomes an episode over
``[t_fail - lead, t_fail]``; every decoy an episode over its own window. An episode
has an amplitude (lognormal, so some precursors are weak) and mode parameters (the
NVLink links it hits, when PCIe downtrains, whether row remapping fails). Counters
follow closed-form cumulative curves ``F(s)`` of the ramp ``s`` in [0, 1], so they are
the same whatever the tick spacing. Scheduled XIDs (precursor warnings, terminal XIDs)
and NVLink flaps are drawn once here, so history and live polls agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetcare.collectors.sim.incidents import MODES, IncidentPlan

KIND_DECOY = {"ecc_plateau": 10, "pcie_burst": 11, "hot_gpu": 12}
HBM, SRAM, GSP, THERMAL, NVLINK, PCIE = (MODES.index(m) for m in
                                         ("hbm", "sram", "gsp", "thermal", "nvlink", "pcie"))
ECC_PLATEAU, PCIE_BURST, HOT_GPU = 10, 11, 12
SCALAR_COUNTERS = ("ce", "ue", "rr_c", "rr_u", "pcie")
LINK_COUNTERS = ("nv_flit", "nv_data", "nv_replay", "nv_recov")


@dataclass(frozen=True, eq=False)
class Episodes:
    gpu: np.ndarray  # global gpu id
    t0: np.ndarray  # seconds since spec.start
    t1: np.ndarray
    kind: np.ndarray
    amp: np.ndarray
    link1: np.ndarray
    link2: np.ndarray
    wfrac: np.ndarray  # ramp fraction at which PCIe width halves (>1: never)
    gfrac: np.ndarray  # ... at which the PCIe gen drops by one
    remap_fail: np.ndarray
    ev_t: np.ndarray  # scheduled XIDs
    ev_gpu: np.ndarray
    ev_xid: np.ndarray
    flap_t: np.ndarray  # NVLink flaps (link down for FLAP_S)
    flap_gpu: np.ndarray
    flap_link: np.ndarray

    def ramp(self, i: np.ndarray, t: np.ndarray) -> np.ndarray:
        """s in [0, 1] for episodes ``i`` (E,) at times ``t`` (K,): shape (E, K)."""
        t0 = self.t0[i][:, None]
        return np.clip((t[None, :] - t0) / (self.t1[i][:, None] - t0), 0.0, 1.0)

    def cumulative(self, i: np.ndarray, t: np.ndarray, nlinks: int) -> dict[str, np.ndarray]:
        """Expected cumulative counts (floored) of episodes ``i`` at ``t``: (E, K[, L])."""
        s = self.ramp(i, t)
        a = self.amp[i][:, None]
        k = self.kind[i][:, None]
        z = np.zeros_like(s)

        def r(x: float) -> np.ndarray:
            return np.clip((s - x) / (1 - x), 0.0, 1.0)

        dur = (self.t1[i] - self.t0[i])[:, None]
        lin = np.clip((t[None, :] - self.t0[i][:, None]) / np.maximum(0.3 * dur, 1.0), 0, 1)
        burst = np.clip((t[None, :] - self.t0[i][:, None]) / 600.0, 0, 1)
        out = {
            "ce": np.where(k == HBM, 2000 * a * s**3, z) + np.where(k == SRAM, 60 * a * s**2, z)
            + np.where(k == ECC_PLATEAU, 300 * a * lin, z),
            "ue": np.where(k == HBM, 3 * a * r(0.85) ** 2, z) + np.where(k == SRAM, 2 * r(0.6), z),
            "rr_c": np.where(k == HBM, 8 * a * s**2, z),
            "rr_u": np.where(k == HBM, 4 * a * r(0.5) ** 2, z),
            "pcie": np.where(k == PCIE, 3000 * a * s**2, z)
            + np.where(k == PCIE_BURST, 500 * a * burst, z),
        }
        out = {name: np.floor(v).astype(np.int64) for name, v in out.items()}
        nv = k == NVLINK
        onehot = np.zeros((len(i), nlinks))
        rows = np.arange(len(i))
        onehot[rows, self.link1[i] % nlinks] += 1.0
        onehot[rows, self.link2[i] % nlinks] += 0.3
        for name, curve in (("nv_flit", 5000 * s**3), ("nv_data", 500 * s**3),
                            ("nv_replay", 200 * s**2.5), ("nv_recov", 6 * s**2)):
            v = np.where(nv, a * curve, z)[:, :, None] * onehot[:, None, :]
            out[name] = np.floor(v).astype(np.int64)
        return out


FLAP_S = 60.0


def build_episodes(plan: IncidentPlan) -> Episodes:
    spec = plan.spec
    gpn = spec.gpus_per_node
    rng = np.random.default_rng([spec.seed, 3])
    f = np.flatnonzero((plan.mode > 0) & (plan.gpu >= 0))
    fd = len(f)
    nd = len(plan.decoy_time_h)
    gpu = np.r_[plan.node[f].astype(np.int64) * gpn + plan.gpu[f],
                plan.decoy_node.astype(np.int64) * gpn + plan.decoy_gpu]
    t1f = plan.time_h[f] * 3600.0
    t0 = np.r_[t1f - plan.lead_h[f] * 3600.0, plan.decoy_time_h * 3600.0]
    t1 = np.r_[t1f, (plan.decoy_time_h + plan.decoy_dur_h) * 3600.0]
    kind = np.r_[plan.mode[f].astype(np.int16), 10 + plan.decoy_kind.astype(np.int16)]
    n = fd + nd
    amp = np.exp(0.7 * rng.standard_normal(n))
    link1 = rng.integers(0, 18, size=n)
    link2 = np.where(rng.random(n) < 0.5, link1, rng.integers(0, 18, size=n))
    wfrac = np.where(rng.random(n) < 0.6, rng.uniform(0.4, 0.95, size=n), 2.0)
    gfrac = np.where(rng.random(n) < 0.6, rng.uniform(0.4, 0.95, size=n), 2.0)
    remap_fail = np.r_[plan.xid[f] == 64, np.zeros(nd, dtype=bool)]
    ev_t: list[float] = []
    ev_gpu: list[int] = []
    ev_xid: list[int] = []
    fl_t: list[float] = []
    fl_gpu: list[int] = []
    fl_link: list[int] = []

    def sched(e: int, xid: int, lo: float, hi: float, k: int) -> None:
        for u in rng.uniform(lo, hi, size=k):
            ev_t.append(t0[e] + u * (t1[e] - t0[e]))
            ev_gpu.append(int(gpu[e]))
            ev_xid.append(xid)

    for e in range(fd):
        k = kind[e]
        if k == HBM:
            sched(e, 63, 0.5, 0.98, 1 + rng.poisson(1.5))
            sched(e, 92, 0.6, 0.9, int(rng.random() < 0.5))
            sched(e, 94, 0.8, 0.98, int(rng.random() < 0.4))
            sched(e, 63, 0.99, 0.995, int(remap_fail[e]))
        elif k == GSP:
            sched(e, 119, 0.3, 0.95, 1 + rng.poisson(1.0))
        elif k == SRAM:
            sched(e, 94, 0.5, 0.95, int(rng.random() < 0.3))
        elif k == NVLINK:
            for u in rng.uniform(0.5, 0.98, size=1 + rng.poisson(2.0)):
                fl_t.append(t0[e] + u * (t1[e] - t0[e]))
                fl_gpu.append(int(gpu[e]))
                fl_link.append(int(link1[e] if rng.random() < 0.7 else link2[e]))
    # terminal XIDs at the failure time, for every GPU failure that has one
    term = np.flatnonzero((plan.xid >= 0) & (plan.gpu >= 0))
    ev_t += (plan.time_h[term] * 3600.0).tolist()
    ev_gpu += (plan.node[term].astype(np.int64) * gpn + plan.gpu[term]).tolist()
    ev_xid += plan.xid[term].tolist()
    order = np.argsort(np.asarray(ev_t), kind="stable")
    forder = np.argsort(np.asarray(fl_t), kind="stable")
    return Episodes(
        gpu=gpu, t0=t0, t1=t1, kind=kind, amp=amp, link1=link1, link2=link2, wfrac=wfrac,
        gfrac=gfrac, remap_fail=remap_fail,
        ev_t=np.asarray(ev_t, dtype=float)[order], ev_gpu=np.asarray(ev_gpu, dtype=np.int64)[order],
        ev_xid=np.asarray(ev_xid, dtype=np.int64)[order],
        flap_t=np.asarray(fl_t, dtype=float)[forder],
        flap_gpu=np.asarray(fl_gpu, dtype=np.int64)[forder],
        flap_link=np.asarray(fl_link, dtype=np.int64)[forder],
    )
