"""The node agent: poll every backend once per tick, batch per node, send on the bus.

One code path for every backend — the simulator streams through exactly what the NVML
backend will use. The loop works to deadlines and skips missed ticks (never bursts to
catch up); a backend or bus that fails is logged and counted, and the loop keeps going.

    agent = Agent([NvmlBackend(node)], bus, node=node, interval_s=10)
    agent.run()            # until stop() or SIGTERM; flushes the bus on the way out
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from fleetcare.collectors.backend import GpuBackend, Reading
from fleetcare.collectors.contract import Batch, batch_version
from fleetcare.collectors.transport import Bus, TransportError

log = logging.getLogger(__name__)


class Agent:
    def __init__(
        self,
        backends: Sequence[GpuBackend],
        bus: Bus,
        *,
        node: str,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval_s}")
        self.backends = list(backends)
        self.bus = bus
        self.node = node
        self.interval_s = interval_s
        self.clock = clock
        self._stop = threading.Event()
        self.sleep = sleep or self.wait
        self._seq: dict[str, int] = {}
        self.counters: Counter[str] = Counter()

    def stop(self) -> None:
        self._stop.set()

    def wait(self, seconds: float) -> None:
        """Sleep that ``stop()`` interrupts (the default ``sleep``)."""
        self._stop.wait(seconds)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def collect(self, now: dt.datetime) -> Reading:
        reading = Reading()
        for backend in self.backends:
            try:
                reading.extend(backend.poll(now))
            except Exception:  # a daemon loop logs and keeps running
                self.counters[f"backend_errors.{backend.name}"] += 1
                log.exception("agent.backend_failed backend=%s", backend.name)
        return reading

    def batches(self, reading: Reading, now: dt.datetime) -> list[Batch]:
        """One batch per node seen (the sim backend speaks for many nodes)."""
        by_node: dict[str, Reading] = {}
        for s in reading.samples:
            by_node.setdefault(s.node, Reading()).samples.append(s)
        for e in reading.events:
            by_node.setdefault(e.node, Reading()).events.append(e)
        for i in reading.incidents:
            by_node.setdefault(i.node, Reading()).incidents.append(i)
        for n in reading.nics:
            by_node.setdefault(n.node, Reading()).nics.append(n)
        out = []
        for node, r in by_node.items():
            seq = self._seq.get(node, 0) + 1
            self._seq[node] = seq
            out.append(Batch(schema_version=batch_version(bool(r.nics)), node=node, seq=seq,
                             sent_at=now, samples=r.samples, events=r.events,
                             incidents=r.incidents, nics=r.nics))
        return out

    def tick(self, now: dt.datetime | None = None) -> int:
        """Collect and send once; returns the number of batches the bus accepted."""
        now = now or dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        reading = self.collect(now)
        self.counters["samples_read"] += len(reading.samples)
        self.counters["events_read"] += len(reading.events)
        self.counters["nics_read"] += len(reading.nics)
        sent = 0
        for batch in self.batches(reading, now):
            try:
                self.bus.send(batch)
            except TransportError as exc:
                self.counters["batches_failed"] += 1
                self.counters["samples_dropped"] += len(batch.samples)
                log.error("agent.send_failed node=%s seq=%d error=%s", batch.node, batch.seq, exc)
                continue
            sent += 1
            self.counters["batches_sent"] += 1
            self.counters["samples_sent"] += len(batch.samples)
            self.counters["nics_sent"] += len(batch.nics)
        return sent

    def run(self, *, duration_s: float | None = None) -> None:
        """Tick on a fixed grid until stopped (or for ``duration_s``), then flush."""
        start = self.clock()
        next_tick = start
        try:
            while not self.stopped:
                now = self.clock()
                if duration_s is not None and now - start >= duration_s:
                    break
                if now >= next_tick:
                    self.tick()
                    missed = int((self.clock() - next_tick) // self.interval_s)
                    if missed > 0:
                        self.counters["ticks_skipped"] += missed
                        log.warning("agent.ticks_skipped count=%d", missed)
                    next_tick += (missed + 1) * self.interval_s
                wait = next_tick - self.clock()
                if duration_s is not None:
                    wait = min(wait, start + duration_s - self.clock())
                if wait > 0:
                    self.sleep(wait)
        finally:
            self.bus.flush()
