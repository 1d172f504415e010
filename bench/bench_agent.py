"""Agent benchmarks: CPU time and peak RSS per tick for one 8-GPU node (sim backend, fake
NVML), and producer throughput to the real Kafka broker (deploy/kafka, acks=all).

    .venv/bin/python bench/bench_agent.py                 # all three, one JSON line each
    .venv/bin/python bench/bench_agent.py --case kafka --nodes 64 --ticks 30

Each case runs in its own process so its peak RSS is its own. The bus of the per-tick cases
is a null bus (encoding included: it encodes every part as the real buses do).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import report  # noqa: E402

from fleetcare.collectors.agent import Agent  # noqa: E402
from fleetcare.collectors.contract import encode_batch  # noqa: E402
from fleetcare.collectors.transport import split_batch  # noqa: E402

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


class NullBus:
    """Encodes like the real buses, sends nowhere."""

    def __init__(self) -> None:
        self.bytes = 0

    def send(self, batch) -> None:
        for _, part in split_batch(batch):
            self.bytes += len(encode_batch(part))

    def flush(self, timeout_s=None) -> None:
        pass

    def close(self) -> None:
        pass


def sim_backend(nodes: int):
    from fleetcare.collectors.cli import sim_backend as make

    backend, _ = make("bench", nodes, 1, NOW)
    return backend


def fake_nvml_backend():
    spec = importlib.util.spec_from_file_location(
        "fake_pynvml", HERE.parent / "tests" / "collectors" / "fake_pynvml.py")
    fake = importlib.util.module_from_spec(spec)
    sys.modules["fake_pynvml"] = fake
    spec.loader.exec_module(fake)
    fake.install(fake.Scenario(gpus=[
        fake.FakeGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                     pci_bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0") for i in range(8)]))
    from fleetcare.collectors.nvml import NvmlBackend

    return NvmlBackend("bench", nvml=fake, events=False), fake


def per_tick(case: str, ticks: int) -> dict:
    fake = None
    if case == "sim":
        backend = sim_backend(None)
    else:
        backend, fake = fake_nvml_backend()
    bus = NullBus()
    agent = Agent([backend], bus, node="bench", interval_s=10)
    agent.tick(NOW)  # warm-up (imports, first-poll lookback)
    calls0 = len(fake.calls) if fake else 0
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(1, ticks + 1):
        agent.tick(NOW + dt.timedelta(seconds=10 * i))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    out = {"gpus": 8, "ticks": ticks, "cpu_ms_per_tick": round(1000 * cpu / ticks, 3),
           "wall_ms_per_tick": round(1000 * wall / ticks, 3),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "wire_bytes_per_tick": bus.bytes // (ticks + 1),
           "samples": agent.counters["samples_read"]}
    if fake is not None:
        out["nvml_calls_per_tick"] = round((len(fake.calls) - calls0) / ticks, 1)
    backend.close()
    return out


def kafka(nodes: int, ticks: int, url: str) -> dict:
    from fleetcare.collectors.transport.kafka import KafkaBus

    backend = sim_backend(nodes)
    agent = Agent([backend], NullBus(), node="bench", interval_s=1)
    batches = []
    for i in range(ticks):  # generate first: time the producer alone
        now = NOW + dt.timedelta(seconds=i)
        batches += agent.batches(backend.poll(now), now)
    samples = sum(len(b.samples) for b in batches)
    import tempfile

    with tempfile.TemporaryDirectory() as spool:
        bus = KafkaBus.from_url(url, spool=spool, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}.")
        bus.send(batches[0])  # connect and create the topics outside the timing
        bus.flush()
        c0, w0 = time.process_time(), time.perf_counter()
        for b in batches[1:]:
            bus.send(b)
        bus.flush()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert bus.spooled == 0 and bus.pending == 0, "broker unreachable: parts were spooled"
        bus.close()
    n = len(batches) - 1
    return {"nodes": nodes, "gpus": nodes * 8, "batches": n, "acks": "all",
            "compression": "gzip", "batches_per_s": round(n / wall, 1),
            "samples_per_s": round((samples - len(batches[0].samples)) / wall, 1),
            "producer_cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("all", "sim", "nvml", "kafka"), default="all")
    ap.add_argument("--ticks", type=int, default=200, help="ticks per per-tick case")
    ap.add_argument("--nodes", type=int, default=64, help="simulated nodes for the kafka case")
    ap.add_argument("--kafka-ticks", type=int, default=30)
    ap.add_argument("--bus", default="kafka://127.0.0.1:9092")
    args = ap.parse_args(argv)
    if args.case == "all":
        for case in ("sim", "nvml", "kafka"):
            subprocess.run([sys.executable, __file__, "--case", case, "--ticks", str(args.ticks),
                            "--nodes", str(args.nodes), "--kafka-ticks", str(args.kafka_ticks),
                            "--bus", args.bus], check=True)
        return 0
    if args.case == "kafka":
        report("agent_kafka_producer", kafka(args.nodes, args.kafka_ticks, args.bus))
    else:
        report(f"agent_tick_{args.case}", per_tick(args.case, args.ticks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
