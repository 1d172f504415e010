"""Simulated InfiniBand ports (issue 16 §2): opt-in, the same draws without them, the
documented shares and leads, counters that behave like a port's, live equal to history."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from fleetcare.collectors.contract import NIC_COUNTER_BITS, nic_counter_max
from fleetcare.collectors.sim import FleetSimulator, FleetSpec, SimBackend, simulate_incidents
from fleetcare.collectors.sim.incidents import CAUSE_NAMES, LEAD, MODES, NETWORK_MODES
from fleetcare.collectors.sim.nics import FLAP_DOWN_S, PortEvents, build_port_events

H = dt.timedelta(hours=1)
SPEC = FleetSpec(nodes=32, seed=2, failure_scale=60, nic_ports=8)
DAYS = 10


@pytest.fixture(scope="module")
def sim() -> FleetSimulator:
    return FleetSimulator(SPEC, simulate_incidents(SPEC, DAYS))


def network(plan, mode: str) -> np.ndarray:
    return np.flatnonzero(plan.mode == MODES.index(mode))


def history(sim: FleetSimulator, start: dt.datetime, hours: float, interval_s: float = 60
            ) -> dict[str, np.ndarray]:
    chunks = [c.nics for c in sim.history(start, start + hours * H, interval_s)]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def test_without_ports_nothing_changes_and_no_nic_telemetry() -> None:
    """nic_ports=0 (the default) keeps every draw of earlier versions; with ports only
    the network failures' mode, lead and port differ."""
    off = FleetSpec(nodes=64, seed=4, failure_scale=20)
    on = FleetSpec(nodes=64, seed=4, failure_scale=20, nic_ports=8)
    a, b = simulate_incidents(off, 30), simulate_incidents(on, 30)
    for name in ("time_h", "node", "gpu", "cause", "xid", "repair_h", "replaced",
                 "decoy_time_h", "decoy_node", "decoy_gpu"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    net = np.isin(a.cause, [CAUSE_NAMES.index(c) for c in NETWORK_MODES])
    assert np.array_equal(a.mode[~net], b.mode[~net])
    assert np.array_equal(a.lead_h[~net], b.lead_h[~net])
    assert (a.mode[net] == 0).all() and (a.port == -1).all()
    assert (b.mode[net] > 0).any() and (b.port[b.mode > 0][net[b.mode > 0]] >= 0).all()
    chunk = next(FleetSimulator(off, a).history(off.start, off.start + H, 600))
    assert chunk.nics is None


def test_network_modes_have_the_documented_shares_and_leads() -> None:
    spec = FleetSpec(nodes=2048, seed=11, failure_scale=10, nic_ports=8)
    plan = simulate_incidents(spec, 54)
    for cause, (mode, share) in NETWORK_MODES.items():
        of_cause = plan.cause == CAUSE_NAMES.index(cause)
        n = int(of_cause.sum())
        with_mode = of_cause & (plan.mode == MODES.index(mode))
        assert n > 50, cause
        got = with_mode.sum() / n
        assert abs(got - share) < 3 * np.sqrt(share * (1 - share) / n), (cause, got)
        assert (plan.mode[of_cause & ~with_mode] == 0).all()
        lead = np.median(plan.lead_h[with_mode])
        assert LEAD[mode][0] / 1.5 < lead < LEAD[mode][0] * 1.5, (mode, lead)
        assert ((plan.port[with_mode] >= 0) & (plan.port[with_mode] < 8)).all()
        assert (plan.gpu[with_mode] == -1).all()  # a node-level failure, as before


def test_counters_count_up_reset_at_repair_and_stick_at_their_maximum(sim) -> None:
    nics = history(sim, SPEC.start, DAYS * 24, interval_s=600)
    key = np.char.add(nics["node"].astype(str), nics["device"].astype(str))
    order = np.lexsort((nics["ts"], key))
    plan = sim.plan
    repairs = {(sim.layout.node_names[n], np.datetime64(
        (SPEC.start + dt.timedelta(hours=float(t + r))).replace(tzinfo=None), "us"))
        for n, t, r in zip(plan.node, plan.time_h, plan.repair_h, strict=True)}
    drops = 0
    for c in NIC_COUNTER_BITS:
        v = nics[c][order]
        same = key[order][1:] == key[order][:-1]
        down = same & (v[1:] < v[:-1])
        assert (v <= nic_counter_max(c)).all() and (v >= 0).all(), c
        # a counter only drops where its node was repaired (rebooted) in between
        for i in np.flatnonzero(down).tolist():
            node = nics["node"][order][i + 1]
            t0, t1 = nics["ts"][order][i], nics["ts"][order][i + 1]
            assert any(n == node and t0 < t <= t1 for n, t in repairs), (c, node, t0, t1)
            drops += 1
    assert drops > 0  # repaired nodes exist in this fleet, and their ports started over
    sat = [s for s in nics["saturated"] if s is not None]
    for row in np.flatnonzero([s is not None for s in nics["saturated"]]).tolist():
        for c in nics["saturated"][row]:
            assert nics[c][row] == nic_counter_max(c)
    assert all(set(s) <= set(NIC_COUNTER_BITS) for s in sat)


def test_port_events_are_pure_functions_of_time() -> None:
    """A counter read at t does not depend on what was read before (live == history)."""
    plan = simulate_incidents(SPEC, DAYS)
    ev = build_port_events(plan)
    ports = np.arange(SPEC.nodes * SPEC.nic_ports)
    t = np.full(len(ports), 5 * 86400.0)
    a = ev.counters(ports, t, np.full(len(ports), -1.0))
    b = build_port_events(plan).counters(ports[::-1], t, np.full(len(ports), -1.0))
    for c in NIC_COUNTER_BITS:
        assert np.array_equal(a[c], b[c][::-1]), c
    # counting from a reboot at t0 is the difference of the two readings
    t0 = np.full(len(ports), 86400.0)
    since = ev.counters(ports, t, t0)
    early = ev.counters(ports, t0, np.full(len(ports), -1.0))
    for c in NIC_COUNTER_BITS:
        unsat = a[c] < nic_counter_max(c)
        assert np.array_equal(since[c][unsat], (a[c] - early[c])[unsat]), c
    assert PortEvents.within(ev.down, ports, np.array([0.0])).shape == (1, len(ports))


def test_a_live_backend_reads_what_the_history_read(sim) -> None:
    at = SPEC.start + 50 * H
    hist = history(sim, at, 0.5, interval_s=300)
    first = hist["ts"] == np.datetime64(at.replace(tzinfo=None), "us")
    live = SimBackend(sim).poll(at).nics
    assert len(live) == int(first.sum()) > 0
    want = {(n, d): i for i, (n, d) in enumerate(zip(hist["node"][first],
                                                     hist["device"][first], strict=True))}
    for s in live:
        i = want[(s.node, s.device)]
        for c in (*NIC_COUNTER_BITS, "state", "phys_state", "rate_gbps"):
            assert getattr(s, c) == hist[c][first][i], c
        assert s.ts == at and s.port == 1 and s.link_layer == "InfiniBand"


def test_failing_ports_show_their_precursors_and_healthy_ones_stay_quiet(sim) -> None:
    """Over each link-mode lead, the failing port's symbol errors and flaps rise far above
    the fleet's healthy ports over the same time."""
    plan = sim.plan
    links = network(plan, "link")
    assert len(links) >= 3
    for i in links.tolist():
        t1 = SPEC.start + dt.timedelta(hours=float(plan.time_h[i]))
        lead = dt.timedelta(hours=float(plan.lead_h[i]))
        start = max(SPEC.start, t1 - lead - H)
        nics = history(sim, start, (t1 - start) / H, interval_s=60)
        node = sim.layout.node_names[plan.node[i]]
        dev = f"mlx5_{plan.port[i]}"
        mine = (nics["node"] == node) & (nics["device"] == dev)
        rise = {c: int(nics[c][mine].max() - nics[c][mine].min())
                for c in ("symbol_error", "link_downed")}
        assert rise["link_downed"] >= 1 and rise["symbol_error"] >= 10, (i, rise)
        others = ~mine & (nics["node"] != node)
        per_port = {c: 0 for c in rise}
        keys = np.char.add(nics["node"][others].astype(str), nics["device"][others].astype(str))
        for c in per_port:
            vals = nics[c][others]
            _, first = np.unique(keys, return_index=True)
            _, last = np.unique(keys[::-1], return_index=True)
            per_port[c] = np.mean(vals[::-1][last] - vals[first])
        assert per_port["link_downed"] < 0.2 and per_port["symbol_error"] < 5, per_port
    nic_modes = network(plan, "nic")
    assert len(nic_modes) >= 1
    assert FLAP_DOWN_S[0] < 60  # a flap is shorter than a tick: the counter is the signal


def test_a_counter_that_reaches_its_width_sticks_and_is_named_saturated() -> None:
    """As the real legacy counters do (8/16-bit PMA counters stop at their maximum)."""
    from fleetcare.collectors.sim.nics import NicPorts, _Draws

    d = _Draws(np.random.default_rng(0))
    d.add("symbol_error", 1, np.array([10.0, 20.0]), np.array([60_000, 10_000]))
    d.add("link_downed", 1, np.arange(300.0))  # 300 flaps > 255
    ev = d.build(2)
    ports = NicPorts(ev, start=SPEC.start, nodes=np.array([0]), node_names=np.array(["n0"]),
                     model="H100", repairs=(np.zeros(0), np.zeros(0, dtype=np.int64)))
    cols = ports.columns(np.array([15.0, 25.0, 400.0]), None)
    port1 = cols["device"] == "mlx5_1"
    assert cols["symbol_error"][port1].tolist() == [60_000, 65_535, 65_535]
    assert cols["link_downed"][port1].tolist() == [16, 26, 255]
    assert cols["saturated"][port1].tolist() == [None, ["symbol_error"],
                                                 ["symbol_error", "link_downed"]]
    assert all(s is None for s in cols["saturated"][~port1])


def test_network_history_is_the_historys_nics_and_incidents_without_gpu_telemetry(sim) -> None:
    """What the fleet prior's network head learns from (``network_history``: no GPU
    telemetry, no XIDs) is what the full history gives for the same span, chunked as it
    likes: every NIC sample and every incident, once."""
    start, hours = SPEC.start + 20 * H, 60.0
    full = list(sim.history(start, start + hours * H, 600))
    net = list(sim.network_history(start, start + hours * H, 600))
    got = {k: np.concatenate([n[k] for n, _ in net]) for k in net[0][0]}
    want = history(sim, start, hours, interval_s=600)

    def order(c: dict[str, np.ndarray]) -> np.ndarray:
        return np.lexsort((c["device"].astype(str), c["node"].astype(str), c["ts"]))

    a, b = order(got), order(want)
    assert len(a) == len(b) > 0
    for k in want:
        assert np.array_equal(got[k][a], want[k][b]), k
    key = lambda i: (i.ts, i.node, i.kind, i.cause)  # noqa: E731
    inc_net = sorted((i for _, found in net for i in found), key=key)
    inc_full = sorted((i for c in full for i in c.incidents), key=key)
    assert inc_net == inc_full and len(inc_full) > 0
    with pytest.raises(ValueError, match="nic_ports"):
        bare = FleetSpec(nodes=4, seed=2)
        next(FleetSimulator(bare, simulate_incidents(bare, 2)).network_history(
            bare.start, bare.start + H, 600))
