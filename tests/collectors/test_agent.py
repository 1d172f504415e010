from __future__ import annotations

import datetime as dt
from pathlib import Path

from fleetcare.collectors.agent import Agent
from fleetcare.collectors.backend import GpuBackend, Reading
from fleetcare.collectors.contract import Batch, XidEvent
from fleetcare.collectors.transport import BusFullError
from tests.collectors.test_contract import sample


class ManualClock:
    def __init__(self, t: float = 1_767_225_600.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class TwoNodeBackend:
    name = "two"

    def __init__(self) -> None:
        self.polls: list[dt.datetime] = []

    def poll(self, now: dt.datetime) -> Reading:
        self.polls.append(now)
        return Reading(samples=[sample(ts=now, node="a"), sample(ts=now, node="b", gpu_uuid="GPU-b")],
                       events=[XidEvent(ts=now, node="b", xid=13, message="m", source="sim")])

    def close(self) -> None:
        pass


class Broken:
    name = "broken"

    def poll(self, now: dt.datetime) -> Reading:
        raise RuntimeError("driver exploded")

    def close(self) -> None:
        pass


class ListBus:
    def __init__(self, fail_after: int | None = None) -> None:
        self.batches: list[Batch] = []
        self.flushed = 0
        self.fail_after = fail_after

    def send(self, batch: Batch) -> None:
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise BusFullError("test bus", 1)
        self.batches.append(batch)

    def flush(self, timeout_s: float | None = None) -> None:
        self.flushed += 1

    def close(self) -> None:
        pass


def test_backends_follow_the_protocol() -> None:
    assert isinstance(TwoNodeBackend(), GpuBackend)


def test_one_batch_per_node_with_increasing_seq() -> None:
    clock = ManualClock()
    bus = ListBus()
    backend = TwoNodeBackend()
    agent = Agent([backend, Broken()], bus, node="host", interval_s=10, clock=clock, sleep=clock.sleep)
    agent.run(duration_s=30)
    assert [(b.node, b.seq) for b in bus.batches] == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert [len(b.events) for b in bus.batches if b.node == "b"] == [1, 1, 1]
    assert [p.timestamp() - 1_767_225_600.0 for p in backend.polls] == [0.0, 10.0, 20.0]
    assert agent.counters["backend_errors.broken"] == 3  # logged, counted, loop kept going
    assert bus.flushed == 1


def test_missed_ticks_are_skipped_not_burst() -> None:
    clock = ManualClock()
    backend = TwoNodeBackend()

    def slow_sleep(s: float) -> None:
        clock.t += s

    class Slow(TwoNodeBackend):
        def poll(self, now: dt.datetime) -> Reading:
            clock.t += 25  # a poll that takes 2.5 ticks
            return super().poll(now)

    backend = Slow()
    agent = Agent([backend], ListBus(), node="h", interval_s=10, clock=clock, sleep=slow_sleep)
    agent.run(duration_s=60)
    offsets = [p.timestamp() - 1_767_225_600.0 for p in backend.polls]
    assert offsets == [0.0, 30.0]
    assert agent.counters["ticks_skipped"] == 4


def test_full_bus_is_counted_and_the_agent_keeps_running() -> None:
    clock = ManualClock()
    agent = Agent([TwoNodeBackend()], ListBus(fail_after=3), node="h", interval_s=1,
                  clock=clock, sleep=clock.sleep)
    agent.run(duration_s=3)
    assert agent.counters["batches_sent"] == 3
    assert agent.counters["batches_failed"] == 3
    assert agent.counters["samples_dropped"] == 3


def test_embedded_end_to_end_into_duckdb(tmp_path: Path) -> None:
    from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer
    from fleetcare.pipeline.ingest import Ingestor
    from fleetcare.pipeline.store import Store
    from fleetcare.pipeline.validate import Validator

    clock = ManualClock()
    bus = EmbeddedBus(tmp_path / "bus")
    Agent([TwoNodeBackend()], bus, node="h", interval_s=10, clock=clock, sleep=clock.sleep).run(duration_s=50)
    store = Store(tmp_path / "f.duckdb")
    at_clock = Validator(clock=clock)  # the validator's "now" is the agent's
    ing = Ingestor(store, EmbeddedConsumer(tmp_path / "bus"), validator=at_clock)
    assert ing.drain() .samples == 10
    # redelivery after a crash before commit lands nothing twice
    again = Ingestor(store, EmbeddedConsumer(tmp_path / "bus"), validator=at_clock)
    assert again.drain().records == 0
    assert store.cursor().execute("SELECT count(*), count(DISTINCT node) FROM telemetry").fetchone() == (10, 2)
    assert store.cursor().execute("SELECT count(*) FROM xid_events").fetchone() == (5,)
