"""Columnar telemetry of the simulated fleet: ``FleetSimulator.history`` yields ``Chunk``s.

Healthy behaviour: node-wide jobs (6-hour blocks with idle gaps, ~84% busy), power and
temperatures following load with per-GPU offsets, a diurnal ambient swing per rack,
sensor noise, clock drops under power cap/thermal slowdown (with the matching
clock-event bits), idle PCIe links at gen 1, rare benign corrected ECC/PCIe/NVLink
errors, and application XIDs 13/31/43. App-XID rate: one per node per
``APP_XID_NODE_DAYS`` days of busy time (43 55%, 31 32%, 13 13% after DeepSeek's mix);
NCSA Delta's XID-31 MTBE of 4.5 node-hours comes from an academic job mix and would
bury every other signal in a healthy-fleet default.

Precursors (see ``episodes``) ramp in before each failure; a failed node sends nothing
until its repair; volatile counters reset at repair, aggregate ones at GPU replacement.

A chunk's ``samples`` maps exact ``GpuSample`` field names to arrays of one row per
(tick, GPU), tick-major; ``ts`` is datetime64[us] (UTC), strings are object arrays,
``nvlink_up`` is (rows, links) bool and the four per-link counters are ``SparseLinks``
(``sim.sparse_links``: their non-zero rows, int32, ``counters.LINK_DTYPE``; ``np.asarray``
gives the (rows, links) matrix);
``retired_pages_*`` are absent (null: row remapping replaced page retirement on
A100/H100/H200). The identity columns (node, GPU uuid/index, PCI bus id, model), the
model's constants (power limit, memory clock and size, PCIe maxima), ``nvlink_up``
when no link is down and, in one-tick chunks, the scalar counters (ECC, remapped rows,
PCIe replays: a counter none of whose GPUs moved repeats the last tick's array) are
read-only and may be shared between chunks. A mixed-model
fleet yields one chunk per model per time range (the NVLink width differs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import numpy as np

from fleetcare.collectors.contract import GpuSample, Incident, XidEvent, utc
from fleetcare.collectors.heap import keep_freed_blocks
from fleetcare.collectors.sim.counters import Counters, kept_rows
from fleetcare.collectors.sim.draws import DAY_S, FleetDraws
from fleetcare.collectors.sim.episodes import (
    FLAP_S,
    HBM,
    HOT_GPU,
    PCIE,
    THERMAL,
    Episodes,
    build_episodes,
)
from fleetcare.collectors.sim.fleet import FleetSpec
from fleetcare.collectors.sim.incidents import IncidentPlan, failure_incidents, repair_incidents
from fleetcare.collectors.sim.nics import NicPorts, PortEvents, build_port_events
from fleetcare.collectors.sim.row_take import RowTake
from fleetcare.collectors.sim.sparse_links import Column

ROWS_PER_CHUNK = 1 << 17
JOB_BLOCK_S = 6 * 3600.0
APP_XID_NODE_DAYS = 5.0
APP_XIDS = ((43, 0.55), (31, 0.32), (13, 0.13))
XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_3 faulted @ 0x7f3a_4c000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010, engmask 00000101, intr 10000000",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the "
        "framebuffer at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function "
         "76 (GSP_RM_CONTROL) (0x20801348 0x410).",
    120: "GSP task timeout @ pc:0x4bd36ec, task: 1",
}
# nvmlClocksEventReason* bits
GPU_IDLE, SW_POWER_CAP, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x20, 0x40
_EPOCH = np.datetime64("1970-01-01T00:00:00", "us")
_THROTTLE = np.array([1.0, 0.8, 0.6])  # SM clock factor by thermal slowdowns (sw, + hw)
Rec = TypeVar("Rec", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True, eq=False)
class Computed:
    """The GPUs a ``Group.step`` computes, and their per-GPU inputs. When the same nodes
    are up at every tick of the step (always for one tick): the GPUs of those nodes only
    (``gpus``, ``nodes``; None: every one), so no column is computed for rows that are
    then left out. Otherwise every GPU, with ``mask`` the rows kept (tick-major)."""

    gpus: RowTake | None  # local GPUs computed, in order (None: all)
    nodes: np.ndarray | None  # their local nodes
    column: np.ndarray  # each local GPU's column in the step's (T, GPUs) arrays, -1: none
    mask: np.ndarray | None  # (T * G,) rows kept when every GPU is computed
    temp_off: np.ndarray
    mem_off: np.ndarray
    eff: np.ndarray
    rack_off: np.ndarray  # each computed GPU's rack offset

    @property
    def size(self) -> int:
        return len(self.column) if self.gpus is None else len(self.gpus.index)


@dataclass(slots=True)
class Chunk:
    """Telemetry for ``[start, end)``: columnar samples, XID events and incidents, and
    with NIC ports (``FleetSpec.nic_ports``) columnar NIC port samples (``sim.nics``)."""

    start: dt.datetime
    end: dt.datetime
    samples: dict[str, Column]
    events: list[XidEvent] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    nics: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.samples["ts"])


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_uniform(seed: int, a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Deterministic uniform [0, 1) from (seed, a, b, k): counter-based, no state."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64) ^ _mix(a.astype(np.uint64) + np.uint64(k * 0x632BE59BD9B4E019 % 2**64))
             ^ _mix(b.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)))
        return (_mix(x) >> np.uint64(11)).astype(np.float64) / float(2**53)


def sensor_noise(T: int, G: int, rng: np.random.Generator) -> np.ndarray:
    """Standard normal noise (3, T, G) for a group of ``G`` GPUs' ``step``."""
    return rng.standard_normal((3, T, G), dtype=np.float32)


class Group:
    """The simulation of some nodes of one GPU model: metrics, counters, events."""

    def __init__(self, sim: FleetSimulator, nodes: np.ndarray) -> None:
        spec, lay, plan = sim.spec, sim.layout, sim.plan
        self.sim = sim
        self.nodes = np.asarray(nodes, dtype=np.int64)
        gpn = spec.gpus_per_node
        self.gpn = gpn
        self.gpus = (self.nodes[:, None] * gpn + np.arange(gpn)).ravel()
        self.G = len(self.gpus)
        self.model = lay.models[int(lay.node_model[self.nodes[0]])]
        m = self.model
        self.nodes_of = np.repeat(np.arange(len(self.nodes)), gpn)
        self.phase = hash_uniform(spec.seed, self.nodes, np.zeros_like(self.nodes), 0) * JOB_BLOCK_S
        # node down intervals and resets from the plan
        pos = np.full(spec.nodes, -1, dtype=np.int64)  # fleet node -> this group's
        pos[self.nodes] = np.arange(len(self.nodes))
        sel = np.flatnonzero(pos[plan.node] >= 0)
        self.f_idx = sel
        self.down_t0 = plan.time_h[sel] * 3600.0
        self.down_t1 = (plan.time_h[sel] + plan.repair_h[sel]) * 3600.0
        self.down_node = pos[plan.node[sel]]
        rep = sel[plan.replaced[sel]]
        repl_local = pos[plan.node[rep]] * gpn + plan.gpu[rep].astype(np.int64)
        ep: Episodes = sim.episodes
        local = np.full(spec.gpus, -1, dtype=np.int64)
        local[self.gpus] = np.arange(self.G)
        self.local = local
        self.ep = ep
        mine = np.flatnonzero(local[ep.gpu] >= 0)
        self.ep_idx = mine
        self.ev_sel = np.flatnonzero(local[ep.ev_gpu] >= 0)
        self.flap_sel = np.flatnonzero(local[ep.flap_gpu] >= 0)
        # what needs no fleet-wide draw comes first: those may still be being drawn
        # (``FleetSimulator.history`` starts them on its helper thread)
        self.node_names = sim.layout.node_names[self.nodes]
        self.nic = None if sim.port_events is None else NicPorts(
            sim.port_events, start=spec.start, nodes=self.nodes, node_names=self.node_names,
            model=self.model.key, repairs=(self.down_t1, self.down_node))
        self.uuids = sim.layout.gpu_uuids[self.gpus]
        self.pci = sim.layout.pci_bus_ids[self.gpus]
        self.model_col = np.array([self.model.name], dtype=object).repeat(self.G)
        self.node_col = np.repeat(self.node_names, gpn)
        self.gpu_index = np.tile(np.arange(gpn, dtype=np.int64), len(self.nodes))
        for a in (self.node_col, self.uuids, self.gpu_index, self.pci, self.model_col):
            a.flags.writeable = False  # a one-tick chunk of the whole group gives them as is
        self.counters = Counters(
            gpus=self.gpus, local_of=local, nodes_of=self.nodes_of, nlinks=m.nvlinks,
            episodes=ep, resets=(self.down_t1, self.down_node),
            replacements=((plan.time_h[rep] + plan.repair_h[rep]) * 3600.0, repl_local),
            draws=sim.draws,
        )
        traits = sim.draws.sensor()
        self.temp_off = traits.temp_off[self.gpus].astype(np.float32)
        self.mem_off = traits.mem_off[self.gpus].astype(np.float32)
        self.eff = traits.eff[self.gpus].astype(np.float32)
        self.rack_off = traits.rack_off[self.nodes]
        self.rack_off_g = np.repeat(self.rack_off, gpn)  # each GPU's rack
        self._layout: tuple[int, np.ndarray | None, tuple[RowTake, np.ndarray] | None,
                            dict[str, np.ndarray], Computed] | None = None
        self._blocks: tuple[np.ndarray, tuple[np.ndarray, ...]] | None = None  # jobs()

    # -- healthy behaviour -------------------------------------------------------------
    def jobs(self, t: np.ndarray, nodes_local: np.ndarray | None = None):
        """busy (bool) and intensity in [0, 1) for times t (T,) x nodes: (T, N)."""
        idx = np.arange(len(self.nodes)) if nodes_local is None else nodes_local
        nodes = self.nodes[idx][None, :]
        shifted = t[:, None] + self.phase[idx][None, :]
        block = np.floor(shifted / JOB_BLOCK_S)
        b = block.astype(np.int64)
        u1, u2, u3 = self._block_draws(nodes, b, cache=nodes_local is None and len(t) == 1)
        into = shifted - block * JOB_BLOCK_S
        busy = (u1 >= 0.08) & (into >= JOB_BLOCK_S * 0.25 * u2**2)
        return busy, u3

    def _block_draws(self, nodes: np.ndarray, b: np.ndarray, cache: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The three uniforms of each node's job block ``b`` (T, N). With ``cache`` (one
        tick of every node) only the nodes whose block changed since the last such call
        are hashed again: a 6-hour block changes for few nodes a tick."""
        seed = self.sim.spec.seed
        last = self._blocks if cache else None
        if last is None:
            draws = tuple(hash_uniform(seed, nodes + 0 * b, b, k) for k in (1, 2, 3))
        else:
            changed = np.flatnonzero(b[0] != last[0][0])
            draws = tuple(u.copy() for u in last[1])
            for k, u in enumerate(draws, start=1):
                u[0, changed] = hash_uniform(seed, nodes[0, changed], b[0, changed], k)
        if cache:
            self._blocks = (b, draws)
        return draws  # type: ignore[return-value]

    def down(self, t: np.ndarray) -> np.ndarray:
        """(T, N) True where the node is down for repair."""
        out = np.zeros((len(t), len(self.nodes)), dtype=bool)
        hit = np.flatnonzero((self.down_t0 <= t[-1]) & (self.down_t1 > t[0]))
        if len(hit):
            at, i = np.nonzero((t[:, None] >= self.down_t0[hit]) & (t[:, None] < self.down_t1[hit]))
            out[at, self.down_node[hit[i]]] = True
        return out

    def busy_and_up(self, t: np.ndarray, nodes_local: np.ndarray) -> np.ndarray:
        """For pairs (``t[i]``, ``nodes_local[i]``): whether that node runs a job and is
        not down for repair at that time; the values ``jobs`` and ``down`` give."""
        shifted = t + self.phase[nodes_local]
        block = np.floor(shifted / JOB_BLOCK_S)
        b = block.astype(np.int64)
        nodes = self.nodes[nodes_local]
        seed = self.sim.spec.seed
        u1, u2 = (hash_uniform(seed, nodes, b, k) for k in (1, 2))
        busy = (u1 >= 0.08) & (shifted - block * JOB_BLOCK_S >= JOB_BLOCK_S * 0.25 * u2**2)
        down = ((t[:, None] >= self.down_t0) & (t[:, None] < self.down_t1)
                & (nodes_local[:, None] == self.down_node)).any(axis=1)
        return busy & ~down

    def sensor_noise(self, T: int, rng: np.random.Generator) -> np.ndarray:
        """Standard normal noise (3, T, G) for ``step``: ``rng``'s first draws."""
        return sensor_noise(T, self.G, rng)

    def step(self, ticks: np.ndarray, rng: np.random.Generator,
             noise: np.ndarray | Callable[[], np.ndarray] | None = None
             ) -> dict[str, Column]:
        """Samples at ``ticks`` (seconds since spec.start) for all GPUs, down rows removed.
        ``noise``: ``sensor_noise(len(ticks), rng)`` when already drawn, or a function
        that gives it, called once the counters have advanced (it may be being drawn)."""
        m, T, gpn = self.model, len(ticks), self.gpn
        down = self.down(ticks)
        # rows of down nodes are left out: while the same nodes are up at every tick,
        # only the up nodes' GPUs are computed (``Computed``); else every column is taken
        # at ``keep`` once
        keep = ~np.repeat(down, gpn, axis=1) if down.any() else None
        kept, fixed, sub = self.layout(T, keep)
        G = sub.size
        cnt = self.counters.advance(ticks, keep, kept)
        busy_n, inten_n = self.jobs(ticks)
        if sub.nodes is not None:
            busy_n, inten_n = busy_n[:, sub.nodes], inten_n[:, sub.nodes]
        busy = np.repeat(busy_n, gpn, axis=1)
        inten = np.repeat(inten_n, gpn, axis=1).astype(np.float32)
        start = self.sim.spec.start
        hod = (ticks / 3600.0 + start.hour + start.minute / 60.0) % 24.0
        amb = 24.0 + 2.0 * np.sin(2 * np.pi * (hod - 9.0) / 24.0)
        amb_g = (amb[:, None] + sub.rack_off[None, :]).astype(np.float32)
        noise = (self.sensor_noise(T, rng) if noise is None
                 else noise() if callable(noise) else noise)
        if sub.gpus is not None:  # (drawn for every GPU: the same draws whoever is up)
            noise = sub.gpus(noise, axis=2)
        # (masks multiply rather than ``np.where``: a where with a scalar branch costs
        # several times the arithmetic at 100,000 GPUs)
        load = 0.80 + 0.17 * inten + 0.03 * noise[0]
        load *= busy
        np.clip(load, 0, 1.05, out=load)
        span = m.power_limit_w - m.idle_power_w
        power = m.idle_power_w + span * load * sub.eff + 4.0 * noise[1]
        capped = power > 0.97 * m.power_limit_w
        np.copyto(power, m.power_limit_w * (0.965 + 0.01 * np.abs(noise[1])), where=capped)
        frac = power / m.power_limit_w
        gtemp = amb_g + m.idle_rise_c + m.load_rise_c * frac + sub.temp_off + 0.7 * noise[2]
        mtemp = gtemp + 3.0 + 6.0 * frac + sub.mem_off
        width = np.full((T, G), m.pcie_width, dtype=np.int64)
        gen_drop = np.zeros((T, G), dtype=bool)
        pending = np.zeros((T, G), dtype=bool)
        rfail = np.zeros((T, G), dtype=bool)
        ep = self.ep
        live = self.ep_idx[(ep.t0[self.ep_idx] < ticks[-1]) & (ep.t1[self.ep_idx] > ticks[0])]
        if len(live):
            s = ep.ramp(live, ticks)  # (E, T)
            inside = (ticks[None, :] >= ep.t0[live][:, None]) & (ticks[None, :] < ep.t1[live][:, None])
            for j, e in enumerate(live.tolist()):
                g = int(sub.column[self.local[ep.gpu[e]]])
                if g < 0:  # its node is down: no row
                    continue
                k, a, sj, inj = ep.kind[e], ep.amp[e], s[j], inside[j]
                if k == THERMAL:
                    gtemp[:, g] += (18 * a * sj**1.5).astype(np.float32)
                    mtemp[:, g] += (22 * a * sj**1.5).astype(np.float32)
                elif k == HOT_GPU:
                    gtemp[:, g] += np.where(inj, 9 * a, 0).astype(np.float32)
                    mtemp[:, g] += np.where(inj, 9 * a, 0).astype(np.float32)
                elif k == PCIE:
                    width[:, g] = np.where(sj >= ep.wfrac[e], m.pcie_width // 2, width[:, g])
                    gen_drop[:, g] |= sj >= ep.gfrac[e]
                elif k == HBM:
                    pending[:, g] |= inj & (sj >= 0.9)
                    rfail[:, g] |= inj & (sj >= 0.97) & ep.remap_fail[e]
        gtemp = np.rint(gtemp)
        mtemp = np.rint(mtemp)
        sw_thermal = gtemp >= m.slowdown_temp_c - 2
        hw_thermal = gtemp >= m.slowdown_temp_c + 3
        bits = [x.view(np.uint8) for x in (~busy, capped, sw_thermal, hw_thermal)]
        reasons = (bits[0] * np.uint8(GPU_IDLE) | bits[1] * np.uint8(SW_POWER_CAP)
                   | bits[2] * np.uint8(SW_THERMAL) | bits[3] * np.uint8(HW_THERMAL))
        sm = np.where(busy, m.sm_clock_max_mhz - (120 + 60 * np.abs(noise[0])) * capped,
                      np.float32(m.sm_clock_idle_mhz))
        sm = sm.astype(np.float64)
        hot = np.flatnonzero(sw_thermal)  # few: the others' factor is 1
        if len(hot):  # hw_thermal implies sw_thermal
            sm.reshape(-1)[hot] *= _THROTTLE[bits[2].reshape(-1)[hot] + bits[3].reshape(-1)[hot]]
        sm = (np.rint(sm / 15.0) * 15).astype(np.int64)
        np.multiply(power, 0.85, out=power, where=sw_thermal)
        gen = busy.astype(np.int64)  # busy links at their generation (a step lower when
        gen *= m.pcie_gen - 1  # downtrained), idle ones at gen 1
        if gen_drop.any():
            gen -= gen_drop & busy
        gen += 1
        util = np.rint(93 + 5 * noise[2])
        np.clip(util, 0, 100, out=util)
        util *= busy
        util_mem = np.rint(30 + 30 * inten + 4 * noise[0])
        np.clip(util_mem, 0, 100, out=util_mem)
        util_mem *= busy
        fb = (m.fb_total_mib * (0.55 + 0.4 * inten)).astype(np.int64) - 4
        fb *= busy
        fb += 4
        base = np.datetime64(start.astimezone(dt.UTC).replace(tzinfo=None), "us")
        ts = base + np.rint(ticks * 1e6).astype("timedelta64[us]")
        if sub.mask is None:
            n = T * G

            def rows(x: np.ndarray) -> np.ndarray:  # (T, G) -> (rows,)
                return x.reshape(n)

            ts_col = np.repeat(ts, G)

            def row_of(t_idx: np.ndarray, g: int) -> np.ndarray:
                col = int(sub.column[g])
                return t_idx[:0] if col < 0 else t_idx * G + col
        else:
            assert keep is not None
            flat = sub.mask
            n = int(np.count_nonzero(flat))

            def rows(x: np.ndarray) -> np.ndarray:
                return x.reshape(T * G)[flat]

            ts_col = np.repeat(ts, np.count_nonzero(keep, axis=1))

            def row_of(t_idx: np.ndarray, g: int) -> np.ndarray:
                t_idx = t_idx[keep[t_idx, g]]
                before = np.cumsum(np.count_nonzero(keep, axis=1)) - np.count_nonzero(keep, axis=1)
                return before[t_idx] + np.count_nonzero(keep[t_idx, :g], axis=1)

        up = fixed["nvlink_up"]  # read-only, every link up: copied when one flaps
        if len(self.flap_sel):
            ft = ep.flap_t[self.flap_sel]
            hit = np.flatnonzero((ft <= ticks[-1]) & (ft + FLAP_S > ticks[0]))
            if len(hit):
                up = up.copy()
            for i in self.flap_sel[hit].tolist():
                on = np.flatnonzero((ticks >= ep.flap_t[i]) & (ticks < ep.flap_t[i] + FLAP_S))
                up[row_of(on, self.local[ep.flap_gpu[i]]), ep.flap_link[i] % m.nvlinks] = False
        cols: dict[str, Column] = {
            "ts": ts_col,
            **{k: fixed[k] for k in ("node", "gpu_uuid", "gpu_index", "pci_bus_id", "model")},
            "gpu_temp_c": rows(gtemp).astype(np.float64),
            "mem_temp_c": rows(mtemp).astype(np.float64),
            "power_w": np.round(rows(power).astype(np.float64), 1),
            "power_limit_w": fixed["power_limit_w"],
            "sm_clock_mhz": rows(sm),
            "mem_clock_mhz": fixed["mem_clock_mhz"],
            "util_gpu_pct": rows(util).astype(np.float64),
            "util_mem_pct": rows(util_mem).astype(np.float64),
            "fb_used_mib": rows(fb),
            "fb_total_mib": fixed["fb_total_mib"],
            "ecc_corrected_volatile": cnt["ce_v"],
            "ecc_uncorrected_volatile": cnt["ue_v"],
            "ecc_corrected_aggregate": cnt["ce_a"],
            "ecc_uncorrected_aggregate": cnt["ue_a"],
            "remapped_rows_correctable": cnt["rr_c"],
            "remapped_rows_uncorrectable": cnt["rr_u"],
            "remapped_rows_pending": rows(pending),
            "remapped_rows_failure": rows(rfail),
            "pcie_replay_count": cnt["pcie"],
            "pcie_link_gen": rows(gen),
            "pcie_link_gen_max": fixed["pcie_link_gen_max"],
            "pcie_link_width": rows(width),
            "pcie_link_width_max": fixed["pcie_link_width_max"],
            "nvlink_up": up,
            "nvlink_crc_flit": cnt["nv_flit"],
            "nvlink_crc_data": cnt["nv_data"],
            "nvlink_replay": cnt["nv_replay"],
            "nvlink_recovery": cnt["nv_recov"],
            "clock_event_reasons": rows(reasons).astype(np.int64),
        }
        return cols

    def layout(self, T: int, keep: np.ndarray | None
               ) -> tuple[tuple[RowTake, np.ndarray] | None, dict[str, np.ndarray], Computed]:
        """For ``T`` ticks' rows kept where ``keep`` says: ``counters.kept_rows(keep)``
        (None for every row), the columns that do not change while the same nodes are
        up, read-only: identity (node, GPU, PCI, model), the model's constants (power
        limit, memory clock, memory size, PCIe maxima) and ``nvlink_up`` with every link
        up, and the GPUs ``step`` computes with their inputs (``Computed``). The last one
        is cached: down nodes change rarely, so a tick usually repeats the previous one's
        (a copy of four object columns of 100,000 rows each was a tenth of a tick; the
        constants' five columns and the links 0.1)."""
        if self._layout is not None:
            t0, k0, kept, cols, sub = self._layout
            if t0 == T and (k0 is None if keep is None
                            else k0 is not None and np.array_equal(k0, keep)):
                return kept, cols, sub
        base = {"node": self.node_col, "gpu_uuid": self.uuids, "gpu_index": self.gpu_index,
                "pci_bus_id": self.pci, "model": self.model_col}
        kept = None if keep is None else kept_rows(keep)
        if keep is None and T == 1:
            cols = dict(base)
        else:
            cols = {}
            for name, x in base.items():  # (the kept rows' GPUs, tick-major)
                col = np.tile(x, T) if kept is None else kept[0](x)
                col.flags.writeable = False
                cols[name] = col
        # the model's constants, and every link up (``step`` copies it when a link flaps)
        m, n = self.model, len(cols["node"])
        for name, value, dtype in (
                ("power_limit_w", m.power_limit_w, np.float64),
                ("mem_clock_mhz", m.mem_clock_mhz, np.int64),
                ("fb_total_mib", m.fb_total_mib, np.int64),
                ("pcie_link_gen_max", m.pcie_gen, np.int64),
                ("pcie_link_width_max", m.pcie_width, np.int64)):
            cols[name] = np.full(n, value, dtype=dtype)
        cols["nvlink_up"] = np.ones((n, m.nvlinks), dtype=bool)
        for col in cols.values():
            col.flags.writeable = False
        sub = self._computed(keep)
        self._layout = (T, None if keep is None else keep.copy(), kept, cols, sub)
        return kept, cols, sub

    def _computed(self, keep: np.ndarray | None) -> Computed:
        """The GPUs ``step`` computes for rows kept where ``keep`` says (``Computed``)."""
        every = np.arange(self.G)
        inputs = (self.temp_off, self.mem_off, self.eff, self.rack_off_g)
        if keep is None:
            return Computed(None, None, every, None, *inputs)
        if not (keep == keep[:1]).all():  # a node goes down or comes back in the step
            return Computed(None, None, every, keep.ravel(), *inputs)
        gpus = RowTake(np.flatnonzero(keep[0]))
        column = np.full(self.G, -1, dtype=np.int64)
        column[gpus.index] = np.arange(len(gpus))
        nodes = np.flatnonzero(keep[0, ::self.gpn])  # (a node's GPUs are up together)
        return Computed(gpus, nodes, column, None, *(gpus(x) for x in inputs))

    def nic_step(self, ticks: np.ndarray) -> dict[str, np.ndarray] | None:
        """NIC port samples at ``ticks`` (None: the fleet has no NIC ports)."""
        if self.nic is None:
            return None
        down = self.down(ticks)
        return self.nic.columns(ticks, ~down if down.any() else None)

    # -- events and incidents ------------------------------------------------------------
    def events(self, a: float, b: float, rng: np.random.Generator) -> list[XidEvent]:
        """XIDs with a <= t < b: scheduled (precursor/terminal) plus application XIDs."""
        ep, lay = self.ep, self.sim.layout
        sel = self.ev_sel[(ep.ev_t[self.ev_sel] >= a) & (ep.ev_t[self.ev_sel] < b)]
        t = ep.ev_t[sel]
        g = ep.ev_gpu[sel]
        x = ep.ev_xid[sel]
        # application XIDs on busy, up nodes
        N = len(self.nodes)
        k = rng.poisson(N * (b - a) / (APP_XID_NODE_DAYS * 86400.0))
        an = rng.integers(0, N, size=k)
        at = rng.uniform(a, b, size=k)
        ok = self.busy_and_up(at, an)
        ag = self.gpus[an * self.gpn + rng.integers(0, self.gpn, size=k)]
        ax = rng.choice([v for v, _ in APP_XIDS], size=k, p=[p for _, p in APP_XIDS])
        t, g, x = np.r_[t, at[ok]], np.r_[g, ag[ok]], np.r_[x, ax[ok]]
        pids = rng.integers(1000, 4_000_000, size=len(t))
        order = np.argsort(t, kind="stable")
        out = []
        start = self.sim.spec.start
        for i in order.tolist():
            gi = int(g[i])
            xid = int(x[i])
            app = xid in (13, 31, 43)
            out.append(XidEvent(
                ts=start + dt.timedelta(seconds=float(t[i])), node=lay.node_names[gi // self.gpn],
                xid=xid, message=XID_MESSAGES[xid], source="sim", gpu_uuid=lay.gpu_uuids[gi],
                gpu_index=gi % self.gpn, pci_bus_id=lay.pci_bus_ids[gi],
                pid=int(pids[i]) if app else None, process="python" if app else None,
            ))
        return out

    def incidents(self, a: float, b: float) -> list[Incident]:
        f = self.f_idx
        fails = f[(self.down_t0 >= a) & (self.down_t0 < b)]
        reps = f[(self.down_t1 >= a) & (self.down_t1 < b)]
        out = failure_incidents(self.sim.plan, fails) + repair_incidents(self.sim.plan, reps)
        out.sort(key=lambda r: r.ts)
        return out


class FleetSimulator:
    """Telemetry of ``spec``'s fleet living through ``plan`` (see module docstring)."""

    def __init__(self, spec: FleetSpec, plan: IncidentPlan) -> None:
        if plan.spec != spec:
            raise ValueError("FleetSimulator: plan was simulated for another FleetSpec; "
                             "pass simulate_incidents(spec, days) of this spec")
        self.spec = spec
        self.plan = plan
        self.layout = plan.layout
        self.episodes = build_episodes(plan)
        self.port_events: PortEvents | None = (build_port_events(plan) if spec.nic_ports
                                               else None)
        self.draws = FleetDraws(spec)  # each GPU's traits and each day's benign events
        keep_freed_blocks()  # (each chunk's arrays reuse the last one's: ``heap``)

    def groups(self, nodes: np.ndarray | None = None) -> list[Group]:
        """One ``Group`` per GPU model among ``nodes`` (default: all), in model order."""
        return [Group(self, n) for n in self._group_nodes(nodes)]

    def _group_nodes(self, nodes: np.ndarray | None = None) -> list[np.ndarray]:
        nodes = np.arange(self.spec.nodes) if nodes is None else np.asarray(nodes)
        nm = self.layout.node_model[nodes]
        return [nodes[nm == k] for k in range(len(self.layout.model_keys)) if (nm == k).any()]

    def seconds(self, ts: dt.datetime) -> float:
        return (utc(ts) - self.spec.start).total_seconds()

    def history(self, start: dt.datetime, end: dt.datetime, interval_s: float = 60
                ) -> Iterator[Chunk]:
        """Chunks covering ticks ``start, start + interval, ... < end``, in time order."""
        a, b = self.seconds(start), self.seconds(end)
        if a < 0:
            raise ValueError(f"history start {start} is before the fleet's start "
                             f"{self.spec.start}; use a start >= FleetSpec.start")
        if interval_s <= 0 or b <= a:
            raise ValueError(f"history needs end > start and interval_s > 0, got "
                             f"{start}..{end} every {interval_s}s")
        ticks = np.arange(a, b, float(interval_s))
        group_nodes = self._group_nodes()
        sizes = [len(n) * self.spec.gpus_per_node for n in group_nodes]
        per = max(1, min(int(86400 // interval_s) or 1, ROWS_PER_CHUNK // self.spec.gpus))
        plan: list[tuple[np.ndarray, float, float, int]] = []  # (ticks, lo, hi, group)
        for c0 in range(0, len(ticks), per):
            tk = ticks[c0:c0 + per]
            lo, hi = float(tk[0]), float(tk[-1] + interval_s) if c0 + per >= len(ticks) else float(ticks[c0 + per])
            hi = min(hi, b) if c0 + per >= len(ticks) else hi
            plan += [(tk, lo, hi, gi) for gi in range(len(group_nodes))]

        def draw(i: int) -> tuple[np.random.Generator, Future[np.ndarray]]:
            """Chunk ``i``'s generator, its noise (the first draws) begun on ``ahead``."""
            tk, lo, _, gi = plan[i]
            rng = np.random.default_rng([self.spec.seed, 9, gi, int(round(lo * 1000))])
            return rng, ahead.submit(sensor_noise, len(tk), sizes[gi], rng)

        # a second thread draws ahead (numpy draws without the GIL): first the fleet's
        # error traits and the benign days the first chunk's counters catch up over
        # (from the fleet's start), while the groups are built; then each next chunk's
        # sensor noise (a third of a 100,000-GPU tick) while this one is built. The
        # same generators, the same draws, in the same order
        ahead = ThreadPoolExecutor(1, thread_name_prefix="fleetcare-sim-draws")
        try:
            self.draws.start(ahead, range(int(plan[0][0][-1] // DAY_S) + 1))  # to its last tick
            coming = draw(0)
            groups = [Group(self, n) for n in group_nodes]
            for i, (tk, lo, hi, gi) in enumerate(plan):
                rng, noise = coming
                if i + 1 < len(plan):
                    coming = draw(i + 1)
                grp = groups[gi]
                samples = grp.step(tk, rng, noise.result)  # rng is the noise's until then
                yield Chunk(
                    start=self.spec.start + dt.timedelta(seconds=lo),
                    end=self.spec.start + dt.timedelta(seconds=hi),
                    samples=samples,
                    events=grp.events(lo, hi, rng),
                    incidents=grp.incidents(lo, hi),
                    nics=grp.nic_step(tk),
                )
        finally:
            ahead.shutdown(wait=False, cancel_futures=True)


    def network_history(self, start: dt.datetime, end: dt.datetime, interval_s: float = 60
                        ) -> Iterator[tuple[dict[str, np.ndarray], list[Incident]]]:
        """(NIC port samples, incidents) covering ``start .. end`` as ``history`` gives
        them, without the GPU telemetry and XIDs: what a model of network failures learns
        from (``fleetcare.models.prior``'s network head), at a small part of the cost.
        ``ValueError`` for a fleet without NIC ports."""
        if self.spec.nic_ports == 0:
            raise ValueError("network_history needs NIC ports: FleetSpec(nic_ports=8)")
        a, b = self.seconds(start), self.seconds(end)
        if a < 0 or interval_s <= 0 or b <= a:
            raise ValueError(f"network_history needs fleet start <= start < end and "
                             f"interval_s > 0, got {start}..{end} every {interval_s}s")
        ticks = np.arange(a, b, float(interval_s))
        groups = self.groups()
        per = max(1, ROWS_PER_CHUNK // (self.spec.nodes * self.spec.nic_ports))
        for c0 in range(0, len(ticks), per):
            tk = ticks[c0:c0 + per]
            hi = float(ticks[c0 + per]) if c0 + per < len(ticks) else b
            for grp in groups:
                nics = grp.nic_step(tk)
                assert nics is not None  # the fleet has ports
                yield nics, grp.incidents(float(tk[0]), hi)


def columns_to_records(cols: Mapping[str, Column], struct: type[Rec]) -> list[Rec]:
    """The rows of columnar simulator output (``ts`` naive UTC) as ``struct`` objects,
    keeping only ``struct``'s fields (slow path: tests, live backend)."""
    fields = {f.name for f in msgspec.structs.fields(struct)}
    lists: dict[str, list[Any]] = {k: v.tolist() for k, v in cols.items() if k in fields}
    lists["ts"] = [t.replace(tzinfo=dt.UTC) for t in lists["ts"]]
    names = list(lists)
    return [struct(**dict(zip(names, row, strict=True)))
            for row in zip(*lists.values(), strict=True)]


def chunk_to_samples(chunk: Chunk) -> list[GpuSample]:
    """The chunk's rows as ``GpuSample`` objects (slow path: tests, live backend)."""
    return columns_to_records(chunk.samples, GpuSample)
