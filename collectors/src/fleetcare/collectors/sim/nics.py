"""Simulated InfiniBand ports (opt in: ``FleetSpec(nic_ports=P)``): what ``fleetcare-agent
--backend infiniband`` reads from ``/sys/class/infiniband`` on every node.

Each node has ``P`` single-port HCAs ``mlx5_0 .. mlx5_{P-1}`` at ``NOMINAL_RATE`` (a DGX
H100 or H200 has 8 compute ConnectX-7 at 400 Gb/s NDR; A100 systems 200 Gb/s HDR). A
port's legacy counters (``contract.NIC_COUNTER_BITS``) are step functions of time: the
sum of the sizes of its *events* since the node last rebooted (a repair), stuck at the
counter's maximum once they reach it (then named in ``saturated``, as the agent does).
Events are drawn once for the whole run (``build_port_events``), so a counter read at
time ``t`` is the same whether the history or a live poll reads it.

Healthy ports (rates per port-day, ``BENIGN``): congestion discards on most ports, rare
symbol and receive errors, and one flap per ``BENIGN_FLAP_PORT_DAYS`` port-days
(``link_downed`` and ``link_error_recovery`` +1, a few symbol errors, the port DOWN /
Polling for seconds: a tick catches it only sometimes, the counter always).

Network failures with precursors (``incidents.NETWORK_MODES``, over the lead of
``incidents.LEAD``, event density rising as the square of the ramp ``s`` in [0, 1]):

- ``link`` (a degrading cable or transceiver): symbol errors from the start, link error
  recoveries and receive errors later, 1 + Poisson(2) flaps in the second half, and the
  link down for good in its last ``FINAL_DOWN_S`` (at most 2 % of the lead).
- ``nic``: receive errors, local link integrity errors, buffer overruns and discards; in
  ``SLOW_SHARE`` of them the link trains down to half its rate ("link speed low", a NIC
  fault of the InfiniteHBD trace) for the rest of the lead; 0 to 2 flaps.

Decoys: marginal links on any node (a burst of symbol errors over hours, a flap in half
of them, a recovery or two) that never fail, ``NET_DECOY_SHARE`` of them per network
failure with precursors (scaled with ``failure_scale``, like the GPU decoys).

No public source gives these rates, shares and leads: they are assumptions, chosen so that
a healthy port looks like one (counters nearly flat, a flap a year) and a failing one
like the reports of cable and NIC faults (symbol errors and flaps before a link goes).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from fleetcare.collectors.contract import CAUSES, NIC_COUNTER_BITS, nic_counter_max
from fleetcare.collectors.sim.incidents import (
    MODES,
    NETWORK_MODES,
    REFERENCE_NODE_DAYS,
    IncidentPlan,
)

COUNTERS: tuple[str, ...] = tuple(NIC_COUNTER_BITS)
NOMINAL_RATE = {"A100": 200.0}
"""Gb/s of a port by the node's GPU model; any other model: ``DEFAULT_RATE`` (NDR)."""
DEFAULT_RATE = 400.0
DAY_S = 86400.0
T_BITS = 36
"""An event's sort key is ``port << T_BITS | ms`` since the start (2**36 ms: 795 days)."""
BENIGN = (("port_xmit_discards", 0.5, 40.0), ("symbol_error", 0.05, 3.0),
          ("port_rcv_errors", 0.02, 1.0))
"""(counter, events per port-day, median size): what healthy ports count."""
BENIGN_FLAP_PORT_DAYS = 300.0
FLAP_DOWN_S = (20.0, 0.8)
"""Median seconds a flapping port stays DOWN, and the lognormal sigma."""
FINAL_DOWN_S = 300.0
SLOW_SHARE = 0.6
LINK, NIC = MODES.index("link"), MODES.index("nic")
_PRECURSOR_FAILURES = sum(share * CAUSES[cause][0]
                          for cause, (_, share) in NETWORK_MODES.items())
"""Network failures with precursors in Llama 3's Table 5 (``contract.CAUSES``' counts)."""
NET_DECOY_SHARE = 0.6
NET_DECOYS_PER_NODE_DAY = NET_DECOY_SHARE * _PRECURSOR_FAILURES / REFERENCE_NODE_DAYS


@dataclass(frozen=True, eq=False)
class PortEvents:
    """Every port's counter events and DOWN / slow windows over the run; ports are global
    (``node * nic_ports + port index``), times seconds since ``spec.start``."""

    ports_per_node: int
    keys: dict[str, np.ndarray]  # per counter, sorted: port << T_BITS | ms
    cum: dict[str, np.ndarray]  # 0, then running sums of the sizes in key order
    down: tuple[np.ndarray, np.ndarray, np.ndarray]  # (port, t0, t1), DOWN in [t0, t1)
    slow: tuple[np.ndarray, np.ndarray, np.ndarray]  # (port, t0, t1), half rate

    def counters(self, port: np.ndarray, t: np.ndarray, since: np.ndarray
                 ) -> dict[str, np.ndarray]:
        """Values at times ``t`` of global ports ``port``, counting the events after
        ``since`` (the last reboot; -1: none), capped at each counter's maximum."""
        base = port.astype(np.int64) << T_BITS
        hi = base + _ms(t)
        lo = base + np.where(since < 0, -1, _ms(since))
        out = {}
        for c in COUNTERS:
            keys, cum = self.keys[c], self.cum[c]
            v = (cum[np.searchsorted(keys, hi, side="right")]
                 - cum[np.searchsorted(keys, lo, side="right")])
            out[c] = np.minimum(v, nic_counter_max(c))
        return out

    @staticmethod
    def within(windows: tuple[np.ndarray, np.ndarray, np.ndarray], port: np.ndarray,
               t: np.ndarray) -> np.ndarray:
        """(T, Q) True where global port ``port[q]`` is inside a window at ``t[k]``."""
        wp, w0, w1 = windows
        out = np.zeros((len(t), len(port)), dtype=bool)
        hit = np.flatnonzero((w0 <= t[-1]) & (w1 > t[0]) & np.isin(wp, port))
        if len(hit):
            col = {int(p): i for i, p in enumerate(port.tolist())}
            for i in hit.tolist():
                out[(t >= w0[i]) & (t < w1[i]), col[int(wp[i])]] = True
        return out


def _ms(t: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(t, dtype=np.float64) * 1000.0).astype(np.int64)


class _Draws:
    """Events and windows collected while drawing, turned into ``PortEvents``."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.ev: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
            c: [] for c in COUNTERS}
        self.down: list[tuple[int, float, float]] = []
        self.slow: list[tuple[int, float, float]] = []

    def add(self, counter: str, port: np.ndarray | int, t: np.ndarray,
            size: np.ndarray | int = 1) -> None:
        t = np.asarray(t, dtype=np.float64)
        self.ev[counter].append((np.broadcast_to(np.asarray(port, dtype=np.int64), t.shape),
                                 t, np.broadcast_to(np.asarray(size, dtype=np.int64), t.shape)))

    def flap(self, port: int, t: float) -> None:
        rng = self.rng
        self.add("link_downed", port, np.array([t]))
        self.add("link_error_recovery", port, np.array([t]))
        self.add("symbol_error", port, np.array([t]), 1 + rng.poisson(5))
        median, sigma = FLAP_DOWN_S
        self.down.append((port, t, t + median * float(np.exp(sigma * rng.standard_normal()))))

    def ramp(self, t0: float, t1: float, n: int, lo: float = 0.0) -> np.ndarray:
        """``n`` times in ``[t0 + lo (t1 - t0), t1]`` with density rising as s**2."""
        s = np.cbrt(lo ** 3 + self.rng.random(n) * (1 - lo ** 3))
        return t0 + s * (t1 - t0)

    def build(self, ports_per_node: int) -> PortEvents:
        keys, cum = {}, {}
        for c, parts in self.ev.items():
            port = np.concatenate([p for p, _, _ in parts]) if parts else np.zeros(0, np.int64)
            t = np.concatenate([x for _, x, _ in parts]) if parts else np.zeros(0)
            size = np.concatenate([s for _, _, s in parts]) if parts else np.zeros(0, np.int64)
            ok = t >= 0
            k = (port[ok] << T_BITS) + _ms(t[ok])
            order = np.argsort(k, kind="stable")
            keys[c] = k[order]
            cum[c] = np.r_[0, np.cumsum(size[ok][order])].astype(np.int64)

        def windows(w: list[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            a = np.array(w, dtype=np.float64).reshape(-1, 3)
            return a[:, 0].astype(np.int64), a[:, 1], a[:, 2]

        return PortEvents(ports_per_node, keys, cum, windows(self.down), windows(self.slow))


def build_port_events(plan: IncidentPlan) -> PortEvents:
    """The run's port events (module docstring); its own random stream."""
    spec = plan.spec
    pp = spec.nic_ports
    if pp < 1:
        raise ValueError("build_port_events: the fleet has no NIC ports; simulate it with "
                         "FleetSpec(nic_ports=8) for NIC telemetry")
    n_ports = spec.nodes * pp
    span_s = plan.days * DAY_S
    rng = np.random.default_rng([spec.seed, 8])
    d = _Draws(rng)
    for counter, per_day, median in BENIGN:
        k = rng.poisson(per_day * n_ports * plan.days)
        size = np.maximum(1, np.rint(median * np.exp(rng.standard_normal(k)))).astype(np.int64)
        d.add(counter, rng.integers(0, n_ports, size=k), rng.random(k) * span_s, size)
    k = rng.poisson(n_ports * plan.days / BENIGN_FLAP_PORT_DAYS)
    for port, t in zip(rng.integers(0, n_ports, size=k).tolist(),
                       (rng.random(k) * span_s).tolist(), strict=True):
        d.flap(port, t)
    for i in np.flatnonzero(np.isin(plan.mode, (LINK, NIC))).tolist():
        port = int(plan.node[i]) * pp + int(plan.port[i])
        t1 = float(plan.time_h[i]) * 3600.0
        t0 = t1 - float(plan.lead_h[i]) * 3600.0
        a = float(np.exp(0.7 * rng.standard_normal()))
        if plan.mode[i] == LINK:
            _link(d, port, t0, t1, a)
        else:
            _nic(d, port, t0, t1, a)
    k = rng.poisson(NET_DECOYS_PER_NODE_DAY * spec.failure_scale * spec.nodes * plan.days)
    for port, t0, hours in zip(rng.integers(0, n_ports, size=k).tolist(),
                               (rng.random(k) * span_s).tolist(),
                               np.clip(12.0 * np.exp(0.8 * rng.standard_normal(k)), 1.0,
                                       7 * 24.0).tolist(), strict=True):
        _decoy(d, port, t0, t0 + hours * 3600.0, float(np.exp(0.7 * rng.standard_normal())))
    return d.build(pp)


def _link(d: _Draws, port: int, t0: float, t1: float, a: float) -> None:
    rng = d.rng
    n = rng.poisson(150 * a)
    d.add("symbol_error", port, d.ramp(t0, t1, n), 1 + rng.poisson(20, size=n))
    d.add("link_error_recovery", port, d.ramp(t0, t1, rng.poisson(4 * a), 0.3))
    n = rng.poisson(40 * a)
    d.add("port_rcv_errors", port, d.ramp(t0, t1, n, 0.2), 1 + rng.poisson(2, size=n))
    d.add("local_link_integrity_errors", port, d.ramp(t0, t1, rng.poisson(2 * a), 0.5))
    for u in rng.uniform(0.5, 0.98, size=1 + rng.poisson(2.0)).tolist():
        d.flap(port, t0 + u * (t1 - t0))
    d.down.append((port, t1 - min(FINAL_DOWN_S, 0.02 * (t1 - t0)), t1))


def _nic(d: _Draws, port: int, t0: float, t1: float, a: float) -> None:
    rng = d.rng
    n = rng.poisson(100 * a)
    d.add("port_rcv_errors", port, d.ramp(t0, t1, n), 1 + rng.poisson(3, size=n))
    d.add("local_link_integrity_errors", port, d.ramp(t0, t1, rng.poisson(3 * a), 0.3))
    d.add("excessive_buffer_overrun_errors", port, d.ramp(t0, t1, rng.poisson(3 * a), 0.3))
    n = rng.poisson(30 * a)
    d.add("port_xmit_discards", port, d.ramp(t0, t1, n),
          np.rint(200 * np.exp(rng.standard_normal(n))).astype(np.int64) + 1)
    if rng.random() < SLOW_SHARE:
        d.slow.append((port, t0 + rng.uniform(0.3, 0.9) * (t1 - t0), t1))
    for u in rng.uniform(0.5, 0.98, size=rng.integers(0, 3)).tolist():
        d.flap(port, t0 + u * (t1 - t0))


def _decoy(d: _Draws, port: int, t0: float, t1: float, a: float) -> None:
    rng = d.rng
    n = rng.poisson(80 * a)
    d.add("symbol_error", port, rng.uniform(t0, t1, size=n), 1 + rng.poisson(10, size=n))
    d.add("link_error_recovery", port, rng.uniform(t0, t1, size=rng.poisson(1.5)))
    if rng.random() < 0.5:
        d.flap(port, float(rng.uniform(t0, t1)))


class NicPorts:
    """The NIC ports of some nodes of one GPU model: ``columns(ticks, keep)`` builds
    their samples (``NicSample`` field names, one row per (tick, node, port), tick-major;
    rows of nodes down for repair left out)."""

    def __init__(self, events: PortEvents, *, start: dt.datetime, nodes: np.ndarray,
                 node_names: np.ndarray, model: str,
                 repairs: tuple[np.ndarray, np.ndarray]) -> None:
        """``nodes``: global node ids; ``repairs``: (end time s, local node) of each repair."""
        pp = events.ports_per_node
        self.ev = events
        self.pp = pp
        self.start = start
        self.nodes = np.asarray(nodes, dtype=np.int64)
        self.ports = (self.nodes[:, None] * pp + np.arange(pp)).ravel()
        self.node_col = np.repeat(np.asarray(node_names, dtype=object), pp)
        self.device_col = np.tile(np.array([f"mlx5_{i}" for i in range(pp)], dtype=object),
                                  len(self.nodes))
        self.rate = NOMINAL_RATE.get(model, DEFAULT_RATE)
        self.repair_t, self.repair_node = repairs

    def _since(self, ticks: np.ndarray) -> np.ndarray:
        """(T, N): the time of each node's last repair before each tick (-1: none)."""
        since = np.full((len(ticks), len(self.nodes)), -1.0)
        for t1, n in zip(self.repair_t.tolist(), self.repair_node.tolist(), strict=True):
            if t1 <= ticks[-1]:
                col = since[:, n]
                np.copyto(col, np.maximum(col, np.where(ticks >= t1, t1, -1.0)))
        return since

    def columns(self, ticks: np.ndarray, keep: np.ndarray | None) -> dict[str, np.ndarray]:
        """``keep``: (T, N) False where the node is down (None: all up)."""
        T, Q = len(ticks), len(self.ports)
        since = np.repeat(self._since(ticks), self.pp, axis=1)  # (T, Q)
        flat = None if keep is None else np.repeat(keep, self.pp, axis=1).ravel()

        def rows(x: np.ndarray) -> np.ndarray:
            x = x.reshape(T * Q)
            return x if flat is None else x[flat]

        t_grid = np.repeat(ticks, Q)
        port_grid = np.tile(self.ports, T)
        cnt = self.ev.counters(rows(port_grid), rows(t_grid), rows(since))
        down = rows(PortEvents.within(self.ev.down, self.ports, ticks))
        slow = rows(PortEvents.within(self.ev.slow, self.ports, ticks))
        n = len(down)
        base = np.datetime64(self.start.astimezone(dt.UTC).replace(tzinfo=None), "us")
        ts = base + np.rint(ticks * 1e6).astype("timedelta64[us]")
        saturated = np.full(n, None, dtype=object)
        at_max = {c: cnt[c] == nic_counter_max(c) for c in COUNTERS}
        for r in np.flatnonzero(np.logical_or.reduce(list(at_max.values()))).tolist():
            saturated[r] = [c for c in COUNTERS if at_max[c][r]]
        return {
            "ts": rows(np.repeat(ts, Q)),
            "node": rows(np.tile(self.node_col, T)),
            "device": rows(np.tile(self.device_col, T)),
            "port": np.ones(n, dtype=np.int64),
            "link_layer": np.full(n, "InfiniBand", dtype=object),
            "state": np.where(down, "DOWN", "ACTIVE").astype(object),
            "phys_state": np.where(down, "Polling", "LinkUp").astype(object),
            "rate_gbps": np.where(slow, self.rate / 2, self.rate),
            **cnt,
            "saturated": saturated,
        }

