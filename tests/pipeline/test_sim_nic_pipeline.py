"""Simulated NIC ports through the production path (issue 16 §2): a live sim backend's NIC
samples pass the contract's checks (none quarantined) and land as the bulk history does;
the hourly rollup sees the failing ports' flaps and errors before their failures."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from fleetcare.collectors.agent import Agent
from fleetcare.collectors.sim import FleetSimulator, FleetSpec, SimBackend, simulate_incidents
from fleetcare.collectors.sim.incidents import MODES
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer
from fleetcare.pipeline import nic_rollup
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.simload import load_history
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import Validator

SPEC = FleetSpec(nodes=32, seed=2, failure_scale=60, nic_ports=8)
DAYS = 10
H = dt.timedelta(hours=1)


def test_live_nic_samples_pass_the_contract_and_equal_the_history(tmp_path: Path) -> None:
    sim = FleetSimulator(SPEC, simulate_incidents(SPEC, DAYS))
    at = SPEC.start + 30 * H
    bus = EmbeddedBus(tmp_path / "bus")
    agent = Agent([SimBackend(sim)], bus, node="sim")
    for k in range(3):
        agent.tick(at + k * dt.timedelta(minutes=5))
    bus.flush()
    live = Store(tmp_path / "live.duckdb")
    ing = Ingestor(live, EmbeddedConsumer(tmp_path / "bus"),
                   validator=Validator(clock=lambda: at.timestamp() + 600))
    r = ing.drain()
    assert r.quarantined == 0 and r.nics == agent.counters["nics_sent"] > 0
    bulk = Store(tmp_path / "bulk.duckdb")
    loaded = load_history(bulk, sim, at, at + 15 * dt.timedelta(minutes=1), interval_s=300)
    assert loaded.nic_samples == r.nics
    cols = "node, device, port, ts, state, phys_state, rate_gbps, symbol_error, " \
           "link_error_recovery, link_downed, port_rcv_errors, port_xmit_discards, " \
           "local_link_integrity_errors, excessive_buffer_overrun_errors, saturated"
    q = f"SELECT {cols} FROM nic_telemetry ORDER BY node, device, ts"
    assert live.cursor().execute(q).fetchall() == bulk.cursor().execute(q).fetchall()


def test_the_rollup_sees_failing_ports_before_they_fail(tmp_path: Path) -> None:
    sim = FleetSimulator(SPEC, simulate_incidents(SPEC, DAYS))
    store = Store(tmp_path / "f.duckdb")
    load_history(store, sim, SPEC.start, SPEC.start + DAYS * 24 * H, interval_s=300)
    nic_rollup.refresh(store)
    plan = sim.plan
    cur = store.cursor()
    healthy = cur.execute(
        "SELECT sum(flaps) / count(DISTINCT (node, device)), "
        "sum(symbol_error_inc) / count(DISTINCT (node, device)) FROM nic_hourly").fetchone()
    caught = 0
    links = np.flatnonzero(plan.mode == MODES.index("link"))
    for i in links.tolist():
        t1 = SPEC.start + dt.timedelta(hours=float(plan.time_h[i]))
        t0 = t1 - dt.timedelta(hours=float(plan.lead_h[i]))
        flaps, symbols = cur.execute(
            "SELECT coalesce(sum(flaps), 0), coalesce(sum(symbol_error_inc), 0) "
            "FROM nic_hourly WHERE node = ? AND device = ? AND hour >= ? AND hour < ?",
            [sim.layout.node_names[plan.node[i]], f"mlx5_{plan.port[i]}",
             t0.replace(tzinfo=None, minute=0, second=0, microsecond=0),
             t1.replace(tzinfo=None)]).fetchone()
        # a healthy port flaps about 0.03 times and counts ~1.5 symbol errors in 10 days
        caught += flaps >= 1 and symbols > 10 * healthy[1]
    assert len(links) >= 3 and caught == len(links), (caught, len(links), healthy)
    assert healthy[0] < 0.2
    # repaired nodes' ports start over: the rollup reads the drop as a reset, not as
    # billions of errors
    worst = cur.execute("SELECT max(symbol_error_inc), max(link_downed_inc) "
                        "FROM nic_hourly").fetchone()
    assert worst[0] < 20_000 and worst[1] < 10, worst
