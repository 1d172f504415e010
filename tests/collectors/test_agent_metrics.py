"""The agent's Prometheus metrics: exact exposition text, served over HTTP."""

from __future__ import annotations

import datetime as dt
import urllib.error
import urllib.request
from collections import Counter
from types import SimpleNamespace

import pytest

from fleetcare.collectors.agent import Agent
from fleetcare.collectors.agent_metrics import (
    CONTENT_TYPE,
    AgentMetrics,
    Family,
    exposition,
    serve_metrics,
)
from fleetcare.collectors.backend import Reading
from fleetcare.collectors.transport.embedded import EmbeddedBus

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_family_text_escapes_labels_and_help() -> None:
    fam = Family("x_total", "counter", "a \\ b\nc",
                 [({"function": 'n"v\\l\n'}, 3), ({}, 1.5)])
    assert exposition([fam]) == (
        "# HELP x_total a \\\\ b\\nc\n"
        "# TYPE x_total counter\n"
        'x_total{function="n\\"v\\\\l\\n"} 3\n'
        "x_total 1.5\n")


class Nvml:
    name = "nvml"

    def __init__(self) -> None:
        self.errors_by_function = {"nvmlDeviceGetPcieReplayCounter": 2,
                                   "nvmlDeviceGetMemoryInfo": 1}
        self.events_dropped = 4


class Spool:
    size_bytes = 2048

    def __len__(self) -> int:
        return 3


EXPECTED = """\
# HELP fleetcare_agent_up 1 while the agent runs.
# TYPE fleetcare_agent_up gauge
fleetcare_agent_up 1
# HELP fleetcare_agent_samples_read_total GPU samples read from the backends.
# TYPE fleetcare_agent_samples_read_total counter
fleetcare_agent_samples_read_total 80
# HELP fleetcare_agent_events_read_total XID and lost-GPU events read from the backends.
# TYPE fleetcare_agent_events_read_total counter
fleetcare_agent_events_read_total 2
# HELP fleetcare_agent_samples_sent_total GPU samples the bus accepted (delivered, or spooled \
to disk to be delivered later).
# TYPE fleetcare_agent_samples_sent_total counter
fleetcare_agent_samples_sent_total 72
# HELP fleetcare_agent_samples_dropped_total GPU samples of batches the bus refused (e.g. the \
bus or spool was full).
# TYPE fleetcare_agent_samples_dropped_total counter
fleetcare_agent_samples_dropped_total 8
# HELP fleetcare_agent_nic_samples_read_total InfiniBand/RoCE port samples read (the \
infiniband backend).
# TYPE fleetcare_agent_nic_samples_read_total counter
fleetcare_agent_nic_samples_read_total 0
# HELP fleetcare_agent_nic_samples_sent_total InfiniBand/RoCE port samples the bus accepted.
# TYPE fleetcare_agent_nic_samples_sent_total counter
fleetcare_agent_nic_samples_sent_total 0
# HELP fleetcare_agent_batches_sent_total Per-node batches the bus accepted.
# TYPE fleetcare_agent_batches_sent_total counter
fleetcare_agent_batches_sent_total 9
# HELP fleetcare_agent_batches_failed_total Per-node batches the bus refused.
# TYPE fleetcare_agent_batches_failed_total counter
fleetcare_agent_batches_failed_total 1
# HELP fleetcare_agent_ticks_skipped_total Ticks skipped because a tick overran its interval.
# TYPE fleetcare_agent_ticks_skipped_total counter
fleetcare_agent_ticks_skipped_total 5
# HELP fleetcare_agent_backend_errors_total Polls of a backend that raised (logged; the agent \
keeps running).
# TYPE fleetcare_agent_backend_errors_total counter
fleetcare_agent_backend_errors_total{backend="nvml"} 0
fleetcare_agent_backend_errors_total{backend="kernel-log"} 7
# HELP fleetcare_agent_nvml_errors_total Failed NVML calls by function (an unsupported call \
fails once, then is not retried).
# TYPE fleetcare_agent_nvml_errors_total counter
fleetcare_agent_nvml_errors_total{function="nvmlDeviceGetMemoryInfo"} 1
fleetcare_agent_nvml_errors_total{function="nvmlDeviceGetPcieReplayCounter"} 2
# HELP fleetcare_agent_events_dropped_total Events a backend's bounded queue had no room for.
# TYPE fleetcare_agent_events_dropped_total counter
fleetcare_agent_events_dropped_total{backend="nvml"} 4
# HELP fleetcare_agent_bus_batches_sent_total Batch parts (one per topic per batch) delivered \
to the broker directly.
# TYPE fleetcare_agent_bus_batches_sent_total counter
fleetcare_agent_bus_batches_sent_total 10
# HELP fleetcare_agent_batches_spooled_total Batch parts written to the on-disk spool while \
the broker was away.
# TYPE fleetcare_agent_batches_spooled_total counter
fleetcare_agent_batches_spooled_total 6
# HELP fleetcare_agent_batches_replayed_total Batch parts delivered from the spool.
# TYPE fleetcare_agent_batches_replayed_total counter
fleetcare_agent_batches_replayed_total 3
# HELP fleetcare_agent_spool_dropped_batches_total Telemetry batch parts the spool's size \
bound pushed out (events are never dropped).
# TYPE fleetcare_agent_spool_dropped_batches_total counter
fleetcare_agent_spool_dropped_batches_total 1
# HELP fleetcare_agent_spool_bytes Bytes the on-disk spool holds.
# TYPE fleetcare_agent_spool_bytes gauge
fleetcare_agent_spool_bytes 2048
# HELP fleetcare_agent_spool_batches Batch parts waiting in the on-disk spool.
# TYPE fleetcare_agent_spool_batches gauge
fleetcare_agent_spool_batches 3
"""


@pytest.fixture
def metrics() -> AgentMetrics:
    agent = SimpleNamespace(counters=Counter({
        "samples_read": 80, "events_read": 2, "samples_sent": 72, "samples_dropped": 8,
        "batches_sent": 9, "batches_failed": 1, "ticks_skipped": 5,
        "backend_errors.kernel-log": 7}))
    bus = SimpleNamespace(sent=10, spooled=6, replayed=3, dropped=1, spool=Spool())
    return AgentMetrics(agent, backends=[Nvml(), SimpleNamespace(name="kernel-log")], bus=bus)


def test_render_exact(metrics: AgentMetrics) -> None:
    assert metrics.render() == EXPECTED


def test_scraped_over_http(metrics: AgentMetrics) -> None:
    server = serve_metrics(metrics, host="127.0.0.1", port=0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == CONTENT_TYPE
            assert r.read().decode() == EXPECTED
        metrics.agent.counters["samples_read"] += 8  # live: the next scrape sees it
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5) as r:
            assert "fleetcare_agent_samples_read_total 88\n" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=5)
        assert err.value.code == 404
    finally:
        server.close()


class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def poll(self, now: dt.datetime) -> Reading:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("boom")
        return Reading()

    def close(self) -> None:
        pass


def test_live_agent_without_kafka_has_no_spool_families(tmp_path) -> None:
    backend = Flaky()
    agent = Agent([backend], EmbeddedBus(tmp_path / "bus"), node="n1")
    agent.tick(NOW)
    agent.tick(NOW + dt.timedelta(seconds=10))
    text = AgentMetrics(agent, backends=[backend], bus=agent.bus).render()
    assert 'fleetcare_agent_backend_errors_total{backend="flaky"} 1\n' in text
    assert "fleetcare_agent_samples_read_total 0\n" in text
    assert "fleetcare_agent_spool_bytes" not in text
    for line in text.splitlines():  # every counter family is named ..._total
        if line.startswith("# TYPE") and line.endswith(" counter"):
            assert line.split()[2].endswith("_total")
