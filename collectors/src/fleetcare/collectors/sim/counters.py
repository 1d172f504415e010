"""Cumulative reliability counters of a group of simulated GPUs, advanced tick by tick.

A counter's value at tick ``t`` is its value at the previous advance plus what happened
in between: benign events (sparse Poisson, per-GPU rates) and precursor curves
(``Episodes.cumulative``). Volatile counters (ECC volatile, PCIe replay, NVLink) reset
when the node is repaired (rebooted); aggregate ones (ECC aggregate, remapped rows)
only when the GPU is replaced. Only GPUs touched by an event, an episode or a reset are
computed column by column; all others repeat their state, so a tick costs O(GPUs).
"""

from __future__ import annotations

import numpy as np

from fleetcare.collectors.sim.episodes import LINK_COUNTERS, Episodes

DAY_S = 86400.0
VOLATILE = ("ce_v", "ue_v", "pcie", *LINK_COUNTERS)
AGGREGATE = ("ce_a", "ue_a", "rr_c", "rr_u")
# rates per GPU-second: benign corrected ECC (median 1 per 50 days, heavy tail),
# PCIe replays (1 per 100 days), NVLink CRC flits per link (1 per 500 days)
CE_MEDIAN_PER_DAY = 0.02
PCIE_PER_DAY = 0.01
NV_FLIT_PER_LINK_DAY = 0.002


class Counters:
    def __init__(self, *, seed: int, gpus: np.ndarray, nodes_of: np.ndarray, nlinks: int,
                 episodes: Episodes, resets: tuple[np.ndarray, np.ndarray],
                 replacements: tuple[np.ndarray, np.ndarray], fleet_gpus: int) -> None:
        """``gpus``: global ids; ``nodes_of``: local node of each; ``resets``: (time,
        local node) of repairs; ``replacements``: (time, local gpu)."""
        self.seed = seed
        self.gpus = gpus
        self.nodes_of = nodes_of
        self.G = len(gpus)
        self.L = nlinks
        self.ep = episodes
        local = {int(g): i for i, g in enumerate(gpus.tolist())}
        self.ep_idx = np.array([i for i, g in enumerate(episodes.gpu.tolist()) if g in local],
                               dtype=np.int64)
        self.ep_local = np.array([local[int(g)] for g in episodes.gpu[self.ep_idx]],
                                 dtype=np.int64)
        self.reset_t, self.reset_node = resets
        self.repl_t, self.repl_gpu = replacements
        rng = np.random.default_rng([seed, 4])
        ce_rate = CE_MEDIAN_PER_DAY * np.exp(1.5 * rng.standard_normal(fleet_gpus))
        life_ce = np.where(rng.random(fleet_gpus) < 0.3,
                           np.floor(np.exp(1 + 1.5 * rng.standard_normal(fleet_gpus))), 0)
        life_rr = (rng.random(fleet_gpus) < 0.03).astype(np.int64)
        self.rates = {
            "ce": ce_rate[gpus] / DAY_S,
            "pcie": np.full(self.G, PCIE_PER_DAY / DAY_S),
            "nv_flit": np.full(self.G, NV_FLIT_PER_LINK_DAY * nlinks / DAY_S),
        }
        self.cum_rates = {k: np.cumsum(v) for k, v in self.rates.items()}
        self.t = 0.0
        z = np.zeros(self.G, dtype=np.int64)
        self.state: dict[str, np.ndarray] = {
            "ce_v": z.copy(), "ue_v": z.copy(), "pcie": z.copy(),
            "ce_a": life_ce[gpus].astype(np.int64), "ue_a": z.copy(),
            "rr_c": life_rr[gpus], "rr_u": z.copy(),
        }
        for name in LINK_COUNTERS:
            self.state[name] = np.zeros((self.G, nlinks), dtype=np.int64)

    def _benign(self, rng: np.random.Generator, t_prev: float, t_end: float) -> dict:
        out = {}
        for name, cum in self.cum_rates.items():
            total = cum[-1] * (t_end - t_prev) if self.G else 0.0
            k = rng.poisson(total)
            g = np.minimum(np.searchsorted(cum, rng.random(k) * cum[-1], side="right"),
                           self.G - 1)
            t = rng.uniform(t_prev, t_end, size=k)
            link = rng.integers(0, self.L, size=k)
            out[name] = (g, t, link)
        return out

    def advance(self, ticks: np.ndarray, rng: np.random.Generator,
                output: bool = True) -> dict[str, np.ndarray]:
        """Values at ``ticks`` (seconds, increasing, > previous): {name: (T, G[, L])}."""
        t_prev, t_end = self.t, float(ticks[-1])
        T = len(ticks)
        benign = self._benign(rng, t_prev, t_end)
        ep = self.ep
        live = (ep.t0[self.ep_idx] < t_end) & (ep.t1[self.ep_idx] > t_prev)
        eps, ep_g = self.ep_idx[live], self.ep_local[live]
        rs = (self.reset_t > t_prev) & (self.reset_t <= t_end)
        reset_gpus = np.flatnonzero(np.isin(self.nodes_of, self.reset_node[rs]))
        rp = (self.repl_t > t_prev) & (self.repl_t <= t_end)
        special = np.unique(np.concatenate(
            [ep_g, reset_gpus, self.repl_gpu[rp]] + [b[0] for b in benign.values()]
        ).astype(np.int64))
        out: dict[str, np.ndarray] = {}
        if output:
            for name, st in self.state.items():
                out[name] = np.broadcast_to(st, (T, *st.shape)).copy()
        for g in special.tolist():
            node = self.nodes_of[g]
            r_vol = self.reset_t[rs & (self.reset_node == node)]
            r_agg = self.repl_t[rp & (self.repl_gpu == g)]
            times = np.sort(np.r_[ticks, r_vol, r_agg, t_prev])
            mine = eps[ep_g == g]
            if len(mine):
                cum = ep.cumulative(mine, times, self.L)
                c = {name: v.sum(axis=0) for name, v in cum.items()}  # (K[, L])
            else:
                zs, zl = np.zeros(len(times), np.int64), np.zeros((len(times), self.L), np.int64)
                c = {n: zs for n in ("ce", "ue", "rr_c", "rr_u", "pcie")}
                c.update({n: zl for n in LINK_COUNTERS})
            for name, (bg, bt, bl) in benign.items():
                sel = bg == g
                if not sel.any():
                    continue
                cnt = np.searchsorted(np.sort(bt[sel]), times, side="right")
                if name == "nv_flit":
                    inc = np.zeros((len(times), self.L), dtype=np.int64)
                    for tt, ll in zip(bt[sel].tolist(), bl[sel].tolist(), strict=True):
                        inc[times >= tt, ll] += 1
                    c[name] = c[name] + inc
                else:
                    c[name] = c[name] + cnt
            c["ce_v"] = c["ce_a"] = c.pop("ce")
            c["ue_v"] = c["ue_a"] = c.pop("ue")
            ti = np.searchsorted(times, ticks)
            i_prev = int(np.searchsorted(times, t_prev))
            for name in self.state:
                resets = r_vol if name in VOLATILE else r_agg
                cv = c[name]
                vals = cv[ti] + (self.state[name][g] - cv[i_prev])
                if len(resets):
                    ridx = np.searchsorted(np.sort(resets), ticks, side="right") - 1
                    has = ridx >= 0
                    rvals = cv[ti] - cv[np.searchsorted(times, np.sort(resets))[np.maximum(ridx, 0)]]
                    vals = np.where(has.reshape((-1,) + (1,) * (cv.ndim - 1)), rvals, vals)
                self.state[name][g] = vals[-1]
                if output:
                    out[name][:, g] = vals
        self.t = t_end
        return out

