"""The evaluation's replay of ``serve``'s urgent rules in SQL over the stored samples
(``fleetcare.models.event_replay.telemetry_triggers``, which the event-scoring bench and
the prior's operating threshold use); over a simulated fleet with failures
it names the same (time, node) pairs that ``UrgentSignals`` names when the same samples
arrive one tick at a time. Simulated data."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from fleetcare.collectors.contract import SCHEMA_VERSION, Batch
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator, chunk_to_samples
from fleetcare.models.event_replay import telemetry_triggers
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.urgent import UrgentSignals


def test_the_replay_sql_names_what_urgent_signals_name(tmp_path):
    spec = FleetSpec(nodes=64, seed=7, failure_scale=40)  # HBM, SRAM, NVLink failures
    days = 6
    sim = FleetSimulator(spec, simulate_incidents(spec, days + 1))
    signals = UrgentSignals()
    by_tick: dict[tuple[dt.datetime, str], list] = defaultdict(list)
    with Store(tmp_path / "f.duckdb") as store:
        for chunk in sim.history(spec.start, spec.start + dt.timedelta(days=days), 1800):
            store.insert_sample_columns(chunk.samples)
            for s in chunk_to_samples(chunk):
                by_tick[(s.ts, s.node)].append(s)
        expected = set()
        for (ts, node), samples in sorted(by_tick.items()):
            batch = Batch(schema_version=SCHEMA_VERSION, node=node, seq=0, sent_at=ts,
                          samples=samples)
            if signals.observe([batch]):
                expected.add((ts.replace(tzinfo=None), node))
        got = set(telemetry_triggers(store))
    assert len(expected) >= 5, "the fleet needs failures with precursors to compare"
    assert got == expected
