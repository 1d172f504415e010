"""The incident process: when each node fails, why, how, and when it is back.

Rates come from Llama 3's Table 5 (``contract.CAUSES``): cause ``c`` fails a node at
``count_c / (2048 * 54)`` per node-day, times ``FleetSpec.failure_scale``. Lemon nodes
(``lemon_fraction``) have ``LEMON_HAZARD`` times the hazard and the base rate is scaled
down so the fleet total stays calibrated; on a lemon most GPU failures hit the same GPU,
so it fails again after repair. Failures arrive as a Poisson process in *uptime*: while
a node is down for repair (lognormal hours per cause) it cannot fail again; repair
knobs longer than the default (``FleetSpec.repair_scale`` / ``repair_sigma``,
``TRACE_REPAIRS``) raise the uptime rate so failures per calendar node-day stay put.

Opt-in repeats (``FleetSpec.repeat_branching`` b > 0, a Hawkes cluster process): every
failure begets Poisson(b) follow-on failures of its node, each an exponential
``repeat_decay_days`` of uptime after it (so after its repair), and these beget their
own. The base rate is scaled by (1 - b), so the fleet total stays calibrated to Table 5;
a burn-in of ``REPEAT_BURN_IN`` decay times before day 0 keeps the rate flat from the
start; a follow-on's cause is drawn from Table 5's mix like any failure's. Off (b = 0),
the draws are exactly those of earlier versions.

Each GPU failure has a mode (the mechanism with GPU-visible precursors, see ``MODES``),
a precursor lead time (lognormal hours) and a terminal XID. A few healthy GPUs get
"decoys" (precursor-like signals that never end in a failure). With NIC ports
(``FleetSpec.nic_ports``), a share of network failures gets a mode too (``NETWORK_MODES``:
``link``, ``nic``) and the port its precursors show on (``sim/nics.py``).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from fleetcare.collectors.contract import CAUSES, Incident
from fleetcare.collectors.sim.fleet import FleetLayout, FleetSpec

REFERENCE_NODE_DAYS = 2048 * 54
CAUSE_NAMES: tuple[str, ...] = tuple(CAUSES)
MODES: tuple[str, ...] = ("none", "hbm", "sram", "gsp", "thermal", "nvlink", "pcie", "link",
                          "nic")
DECOY_KINDS: tuple[str, ...] = ("ecc_plateau", "pcie_burst", "hot_gpu")
LEMON_HAZARD = 12.0
LEMON_SAME_GPU = 0.7
REPEAT_BURN_IN = 10.0  # decay times simulated before day 0 when repeats are on
TRACE_REPEATS = {"repeat_branching": 0.3, "repeat_decay_days": 4.0}
"""FleetSpec knobs fit on the real InfiniteHBD trace's first 60 % (``bench/bench_repeats.py
--fit``; its README paragraph has the numbers matched and missed): opt in with
``FleetSpec(..., **TRACE_REPEATS)``."""
TRACE_REPAIRS = {"repair_scale": 3.0, "repair_sigma": 2.0}
"""FleetSpec knobs for repair times fit on the same part of the trace (median 35 h, 90th
percentile 528 h there; ``bench/bench_repeats.py --fit``)."""
TRACE_FAULTS = {"repeat_branching": 0.35, "repeat_decay_days": 1.0, **TRACE_REPAIRS}
"""The trace's repeats and repair times together: ``TRACE_REPAIRS`` with the repeat knobs
fit again with them on (long repairs push follow-on failures later, which the first fit
did not see). Opt in with ``FleetSpec(..., **TRACE_FAULTS)``."""
DECOYS_PER_GPU_DAY = 150 / (16384 * 54)  # about 0.6 decoys per GPU failure with precursors

# cause -> (median repair hours, GPU replaced)
REPAIR: dict[str, tuple[float, bool]] = {
    "faulty_gpu": (24.0, True), "gpu_hbm3_memory": (36.0, True),
    "software_bug": (1.0, False), "network_switch_cable": (6.0, False),
    "host_maintenance": (8.0, False), "gpu_sram_memory": (4.0, False),
    "gpu_system_processor": (2.0, False), "nic": (12.0, False),
    "nccl_watchdog_timeout": (0.5, False), "silent_data_corruption": (24.0, True),
    "gpu_thermal_interface_sensor": (24.0, True), "ssd": (12.0, False),
    "power_supply": (12.0, False), "server_chassis": (48.0, False),
    "io_expansion_board": (24.0, False), "dependency": (2.0, False),
    "cpu": (24.0, False), "system_memory": (12.0, False),
}
# mode -> (median lead hours, lognormal sigma)
LEAD: dict[str, tuple[float, float]] = {
    "hbm": (48.0, 0.9), "thermal": (24.0, 0.8), "nvlink": (12.0, 0.9),
    "pcie": (18.0, 0.9), "gsp": (3.0, 0.7), "sram": (1.0, 0.6),
    "link": (12.0, 1.0), "nic": (6.0, 0.9),
}
NETWORK_MODES: dict[str, tuple[str, float]] = {
    "network_switch_cable": ("link", 0.6), "nic": ("nic", 0.5),
}
"""cause -> (mode, share with precursors) when the fleet has NIC ports
(``FleetSpec.nic_ports``): a degrading cable or transceiver shows symbol errors and flaps
before its link stays down, a failing NIC receive errors and a link trained down; switches
and NICs that die at once (the rest) show nothing. No public source gives these shares or
leads (``LEAD``): they are assumptions, stated in ``sim/nics.py`` and the README."""
FAULTY_GPU_MODES = (("pcie", 0.35), ("nvlink", 0.30), ("thermal", 0.10), ("none", 0.25))
CAUSE_MODE = {
    "gpu_hbm3_memory": "hbm", "gpu_sram_memory": "sram", "gpu_system_processor": "gsp",
    "gpu_thermal_interface_sensor": "thermal",
}
# mode -> ((xid, probability), ...); -1 = no XID
TERMINAL_XID: dict[str, tuple[tuple[int, float], ...]] = {
    "hbm": ((48, 0.25), (64, 0.25), (94, 0.2), (95, 0.3)),
    "sram": ((48, 0.4), (94, 0.3), (95, 0.3)),
    "gsp": ((119, 0.7), (120, 0.3)),
    "thermal": ((79, 1.0),), "nvlink": ((74, 1.0),), "pcie": ((79, 1.0),),
}
FAULTY_NONE_XID = ((79, 0.6), (-1, 0.4))  # a GPU that just falls off the bus, or hangs


@dataclass(frozen=True, eq=False)
class IncidentPlan:
    """Ground truth of one simulated run; failures sorted by time.

    Times are float hours since ``spec.start``. ``gpu`` is the index within the node
    (-1: node-level), ``cause``/``mode`` index ``CAUSE_NAMES``/``MODES``, ``xid`` is
    the terminal XID (-1: none), ``lead_h`` the precursor lead (0 for mode none),
    ``repair_h`` how long the node is down, ``replaced`` whether the GPU was swapped,
    ``port`` the node's NIC port a network failure's precursors show on (-1: none).
    """

    spec: FleetSpec
    days: float
    layout: FleetLayout
    time_h: np.ndarray
    node: np.ndarray
    gpu: np.ndarray
    cause: np.ndarray
    mode: np.ndarray
    xid: np.ndarray
    lead_h: np.ndarray
    repair_h: np.ndarray
    replaced: np.ndarray
    lemon: np.ndarray  # bool per node
    decoy_time_h: np.ndarray
    decoy_node: np.ndarray
    decoy_gpu: np.ndarray
    decoy_kind: np.ndarray  # index into DECOY_KINDS
    decoy_dur_h: np.ndarray
    port: np.ndarray

    def __len__(self) -> int:
        return len(self.time_h)

    @property
    def time(self) -> np.ndarray:
        """Failure times as datetime64[us] (UTC)."""
        return _to_dt64(self.spec.start, self.time_h)

    def gpu_caused(self) -> np.ndarray:
        return np.array([CAUSES[CAUSE_NAMES[c]][1] for c in self.cause], dtype=bool)

    def incidents(self, *, repairs: bool = True) -> list[Incident]:
        """``contract.Incident`` records (failures, and repairs within the run), by time."""
        return plan_incidents(self, repairs=repairs)


def _to_dt64(start: dt.datetime, hours: np.ndarray) -> np.ndarray:
    base = np.datetime64(start.astimezone(dt.UTC).replace(tzinfo=None), "us")
    return base + np.round(np.asarray(hours) * 3.6e9).astype("timedelta64[us]")


def _pick(rng: np.random.Generator, table: tuple[tuple[int, float], ...] | tuple[tuple[str, float], ...], n: int) -> list:
    values = [v for v, _ in table]
    idx = rng.choice(len(values), size=n, p=[p for _, p in table])
    return [values[i] for i in idx]


def _mean_repair_days(counts: np.ndarray, scale: float, sigma: float, days: float) -> float:
    """Mean days of a ``days``-long window a repair takes, over Table 5's cause mix:
    E[min(R, D)] with R lognormal (the cause's median x ``scale``, ``sigma``)."""
    big_d = days * 24.0
    out = 0.0
    for c, w in zip(CAUSE_NAMES, counts / counts.sum(), strict=True):
        m = REPAIR[c][0] * scale
        if sigma == 0:
            out += w * min(m, big_d)
            continue
        z = math.log(big_d / m) / sigma
        below = m * math.exp(sigma ** 2 / 2) * _phi(z - sigma)  # E[R; R < D]
        out += w * (below + big_d * (1 - _phi(z)))
    return out / 24.0


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _downtime_factor(spec: FleetSpec, counts: np.ndarray, rate: np.ndarray,
                     days: float) -> np.ndarray:
    """How much faster each node (failing ``rate`` per calendar day) must fail per day of
    uptime so that, with ``spec``'s repair times, its failures per calendar day stay what
    the default repairs give (failures come in uptime: longer repairs leave fewer days to
    fail in; a lemon, down often, most of all). Exactly 1 for the default repair knobs,
    so their draws are unchanged."""
    if (spec.repair_scale, spec.repair_sigma) == (FleetSpec.repair_scale,
                                                  FleetSpec.repair_sigma):
        return np.ones_like(rate)
    base = 1 - rate * _mean_repair_days(counts, FleetSpec.repair_scale, FleetSpec.repair_sigma,
                                        days)
    mine = 1 - rate * _mean_repair_days(counts, spec.repair_scale, spec.repair_sigma, days)
    if mine.min() <= 0.05:
        raise ValueError(f"FleetSpec repair_scale={spec.repair_scale}, repair_sigma="
                         f"{spec.repair_sigma}: repairs would keep nodes down "
                         f"{1 - mine.min():.0%} of the time at failure_scale="
                         f"{spec.failure_scale}; use shorter repairs or a lower scale")
    return base / mine


def simulate_incidents(spec: FleetSpec, days: float) -> IncidentPlan:
    """Draw the failures, repairs and decoys of ``spec`` over ``days`` days."""
    if days <= 0:
        raise ValueError(f"days={days}: simulate at least a fraction of a day")
    layout = FleetLayout.build(spec)
    rng = np.random.default_rng([spec.seed, 1])
    n = spec.nodes
    gpn = spec.gpus_per_node
    counts = np.array([CAUSES[c][0] for c in CAUSE_NAMES], dtype=float)
    lemon = np.zeros(n, dtype=bool)
    lemon[rng.choice(n, size=round(spec.lemon_fraction * n), replace=False)] = True
    mult = np.where(lemon, LEMON_HAZARD, 1.0)
    norm = (1 - spec.lemon_fraction) + spec.lemon_fraction * LEMON_HAZARD
    total_rate = counts.sum() / REFERENCE_NODE_DAYS * spec.failure_scale / norm  # per node-day
    mult = mult * _downtime_factor(spec, counts, total_rate * mult, days)
    b = spec.repeat_branching
    k = rng.poisson(total_rate * (1 - b) * mult * days)
    node = np.repeat(np.arange(n, dtype=np.int32), k)
    uptime_h = rng.random(len(node)) * days * 24.0
    if b > 0:
        node, uptime_h = _with_repeats(spec, total_rate * (1 - b) * mult, node, uptime_h,
                                       days)
    m = len(node)
    cause = rng.choice(len(CAUSE_NAMES), size=m, p=counts / counts.sum()).astype(np.int16)
    cause_names = [CAUSE_NAMES[c] for c in cause]
    med = np.array([REPAIR[c][0] for c in cause_names])
    repair_h = med * spec.repair_scale * np.exp(spec.repair_sigma * rng.standard_normal(m))
    # uptime clock -> wall clock: add the repairs of the same node's earlier failures
    order = np.lexsort((uptime_h, node))
    node, uptime_h, cause, repair_h = node[order], uptime_h[order], cause[order], repair_h[order]
    cause_names = [CAUSE_NAMES[c] for c in cause]
    cum = np.cumsum(repair_h) - repair_h
    first = np.r_[0, np.flatnonzero(np.diff(node)) + 1] if m else np.array([], dtype=int)
    offset = np.repeat(cum[first], np.diff(np.r_[first, m])) if m else cum
    time_h = uptime_h + (cum - offset)
    # GPU, mode, lead, xid
    is_gpu = np.array([CAUSES[c][1] for c in cause_names], dtype=bool)
    lemon_gpu = rng.integers(0, gpn, size=n)
    gpu = np.where(
        is_gpu,
        np.where(lemon[node] & (rng.random(m) < LEMON_SAME_GPU), lemon_gpu[node],
                 rng.integers(0, gpn, size=m)),
        -1,
    ).astype(np.int8)
    faulty_modes = _pick(rng, FAULTY_GPU_MODES, m)
    mode_names = [
        CAUSE_MODE.get(c, faulty_modes[i] if c == "faulty_gpu" else "none")
        for i, c in enumerate(cause_names)
    ]
    mode = np.array([MODES.index(x) for x in mode_names], dtype=np.int8)
    z = rng.standard_normal(m)
    lead_h = np.array([
        float(np.clip(LEAD[x][0] * np.exp(LEAD[x][1] * z[i]), 0.25, 14 * 24)) if x in LEAD else 0.0
        for i, x in enumerate(mode_names)
    ])
    xid = np.full(m, -1, dtype=np.int16)
    for name, table in (*TERMINAL_XID.items(), ("none", FAULTY_NONE_XID)):
        mask = np.array([x == name for x in mode_names], dtype=bool)
        if name == "none":
            mask &= np.array([c == "faulty_gpu" for c in cause_names], dtype=bool)
        if mask.any():
            xid[mask] = _pick(rng, table, int(mask.sum()))
    replaced = np.array([REPAIR[c][1] for c in cause_names], dtype=bool) & (gpu >= 0)
    port = _network_modes(spec, cause_names, mode, lead_h)
    keep = time_h < days * 24.0
    by_time = np.argsort(time_h[keep], kind="stable")

    def sel(a: np.ndarray) -> np.ndarray:
        return a[keep][by_time]

    # decoys on GPUs that never fail
    drng = np.random.default_rng([spec.seed, 2])
    nd = drng.poisson(DECOYS_PER_GPU_DAY * spec.failure_scale * spec.gpus * days)
    d_node = drng.integers(0, n, size=nd).astype(np.int32)
    d_gpu = drng.integers(0, gpn, size=nd).astype(np.int8)
    failed = set(zip(node[gpu >= 0].tolist(), gpu[gpu >= 0].tolist(), strict=True))
    ok = np.array([(a, b) not in failed for a, b in zip(d_node.tolist(), d_gpu.tolist(), strict=True)],
                  dtype=bool)
    d_kind = drng.integers(0, len(DECOY_KINDS), size=nd).astype(np.int8)
    d_time = drng.random(nd) * days * 24.0
    d_dur = np.clip(12.0 * np.exp(0.8 * drng.standard_normal(nd)), 1.0, 7 * 24.0)
    d_order = np.argsort(d_time[ok], kind="stable")
    return IncidentPlan(
        spec=spec, days=float(days), layout=layout,
        time_h=sel(time_h), node=sel(node), gpu=sel(gpu), cause=sel(cause), mode=sel(mode),
        xid=sel(xid), lead_h=sel(lead_h), repair_h=sel(repair_h), replaced=sel(replaced),
        lemon=lemon,
        decoy_time_h=d_time[ok][d_order], decoy_node=d_node[ok][d_order],
        decoy_gpu=d_gpu[ok][d_order], decoy_kind=d_kind[ok][d_order],
        decoy_dur_h=d_dur[ok][d_order], port=sel(port),
    )


def _network_modes(spec: FleetSpec, cause_names: list[str], mode: np.ndarray,
                   lead_h: np.ndarray) -> np.ndarray:
    """With NIC ports, give a share of network failures (``NETWORK_MODES``) a mode, a
    lead and the port it shows on (``mode`` and ``lead_h`` are set in place); returns the
    port per failure (-1: none). Its own random stream: the other draws keep theirs."""
    port = np.full(len(cause_names), -1, dtype=np.int8)
    if not spec.nic_ports:
        return port
    rng = np.random.default_rng([spec.seed, 7])
    for i, c in enumerate(cause_names):
        if c not in NETWORK_MODES:
            continue
        name, share = NETWORK_MODES[c]
        u, z, p = rng.random(), rng.standard_normal(), rng.integers(0, spec.nic_ports)
        if u < share:
            mode[i] = MODES.index(name)
            lead_h[i] = float(np.clip(LEAD[name][0] * np.exp(LEAD[name][1] * z), 0.25,
                                      14 * 24))
            port[i] = p
    return port


def _with_repeats(spec: FleetSpec, base_per_day: np.ndarray, node: np.ndarray,
                  uptime_h: np.ndarray, days: float) -> tuple[np.ndarray, np.ndarray]:
    """The base failures plus their follow-ons (module docstring), in uptime hours
    within ``[0, days)``; its own random stream, so the other draws keep theirs."""
    rng = np.random.default_rng([spec.seed, 3])
    tau_h = spec.repeat_decay_days * 24.0
    burn_h = REPEAT_BURN_IN * tau_h
    kb = rng.poisson(base_per_day * burn_h / 24.0)
    pre_node = np.repeat(np.arange(spec.nodes, dtype=np.int32), kb)
    pre_t = -rng.random(len(pre_node)) * burn_h
    gen_node = np.r_[node, pre_node].astype(np.int32)
    gen_t = np.r_[uptime_h, pre_t]
    all_node, all_t = [gen_node], [gen_t]
    while len(gen_node):
        kids = rng.poisson(spec.repeat_branching, size=len(gen_node))
        gen_node = np.repeat(gen_node, kids)
        gen_t = np.repeat(gen_t, kids) + rng.exponential(tau_h, size=len(gen_node))
        inside = gen_t < days * 24.0
        gen_node, gen_t = gen_node[inside], gen_t[inside]
        all_node.append(gen_node)
        all_t.append(gen_t)
    t = np.concatenate(all_t)
    keep = t >= 0.0
    return np.concatenate(all_node)[keep], t[keep]


def failure_incidents(plan: IncidentPlan, idx: np.ndarray) -> list[Incident]:
    lay = plan.layout
    gpn = plan.spec.gpus_per_node
    out = []
    times = plan.time[idx].tolist()
    for i, ts in zip(idx.tolist(), times, strict=True):
        g = int(plan.gpu[i])
        x = int(plan.xid[i])
        out.append(Incident(
            ts=ts.replace(tzinfo=dt.UTC), node=lay.node_names[plan.node[i]], kind="failure",
            cause=CAUSE_NAMES[plan.cause[i]], source="sim",
            gpu_uuid=lay.gpu_uuids[plan.node[i] * gpn + g] if g >= 0 else None,
            mode=MODES[plan.mode[i]], xid=x if x >= 0 else None,
        ))
    return out


def repair_incidents(plan: IncidentPlan, idx: np.ndarray) -> list[Incident]:
    lay = plan.layout
    gpn = plan.spec.gpus_per_node
    times = _to_dt64(plan.spec.start, plan.time_h[idx] + plan.repair_h[idx]).tolist()
    out = []
    for i, ts in zip(idx.tolist(), times, strict=True):
        g = int(plan.gpu[i])
        out.append(Incident(
            ts=ts.replace(tzinfo=dt.UTC), node=lay.node_names[plan.node[i]], kind="repair",
            cause=CAUSE_NAMES[plan.cause[i]], source="sim",
            gpu_uuid=lay.gpu_uuids[plan.node[i] * gpn + g] if g >= 0 else None,
            mode=MODES[plan.mode[i]],
            note="GPU replaced (RMA)" if plan.replaced[i] else "node rebooted",
        ))
    return out


def plan_incidents(plan: IncidentPlan, *, repairs: bool = True) -> list[Incident]:
    out = failure_incidents(plan, np.arange(len(plan)))
    if repairs:
        end = plan.time_h + plan.repair_h
        out += repair_incidents(plan, np.flatnonzero(end < plan.days * 24.0))
    out.sort(key=lambda x: x.ts)
    return out


def summarize(plan: IncidentPlan) -> dict:
    """Failure counts, in the shape ``fleetcare simulate --incidents-only --json`` prints."""
    by_cause = {c: 0 for c in CAUSE_NAMES}
    for c in plan.cause.tolist():
        by_cause[CAUSE_NAMES[c]] += 1
    return {
        "nodes": plan.spec.nodes,
        "gpus": plan.spec.gpus,
        "days": plan.days,
        "incidents": {
            "total": len(plan),
            "gpu_caused": int(plan.gpu_caused().sum()),
            "by_cause": by_cause,
        },
    }
