"""Ingest throughput with 10 % bad samples vs a clean stream, measured in the same run
(issue 13: validation cost must be linear in the bad records), and the fuzz tests' speed.

The stream: batches of one node's 8 GPUs (what an agent sends each tick), through the
real ``Ingestor`` (decode, validate, insert, quarantine, commit) into a fresh DuckDB file.
In the bad stream one sample in ten is bad: half of them a value out of range (10,000 °C:
the message decodes, the sample is cut out), half a value of the wrong type (a string
temperature: the message does not decode, every record is decoded on its own). Throughput
counts every sample offered, good or bad. Also: the cost of one message with 1,000 /
2,000 / 4,000 bad samples (was 0.5 / 2.0 / 7.6 s: quadratic), and the fuzz examples/s.

    .venv/bin/python bench/bench_bad_records.py [--messages 3000] [--fuzz-examples 3000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from _common import best_of, report

from fleetcare.collectors.contract import SCHEMA_VERSION, GpuSample
from fleetcare.collectors.transport import TELEMETRY_TOPIC, Record
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.limits import Limits
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import Validator

ROOT = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
NOW = (T0 + dt.timedelta(days=1)).timestamp()
GPUS = 8


def _sample(node: str, gpu: int, tick: int) -> dict[str, Any]:
    s = GpuSample(ts=T0 + dt.timedelta(seconds=10 * tick), node=node,
                  gpu_uuid=f"GPU-{node}-{gpu}", gpu_index=gpu, pci_bus_id=f"0000:{gpu:02x}:00.0",
                  model="NVIDIA H100 80GB HBM3", gpu_temp_c=55.0 + gpu, mem_temp_c=60.0,
                  power_w=450.0, power_limit_w=700.0, sm_clock_mhz=1980, mem_clock_mhz=2619,
                  util_gpu_pct=97.0, util_mem_pct=40.0, fb_used_mib=70_000,
                  fb_total_mib=81_559, ecc_corrected_volatile=tick, ecc_uncorrected_volatile=0,
                  ecc_corrected_aggregate=tick, ecc_uncorrected_aggregate=0,
                  retired_pages_sbe=0, retired_pages_dbe=0, remapped_rows_correctable=0,
                  remapped_rows_uncorrectable=0, remapped_rows_pending=False,
                  remapped_rows_failure=False, pcie_replay_count=0, pcie_link_gen=5,
                  pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16,
                  nvlink_up=[True] * 18, nvlink_crc_flit=[0] * 18, nvlink_crc_data=[0] * 18,
                  nvlink_replay=[0] * 18, nvlink_recovery=[0] * 18, clock_event_reasons=0)
    return msgspec.to_builtins(s)


def stream(messages: int, bad_every: int | None) -> tuple[list[Record], int]:
    """``messages`` batches of 8 samples; every ``bad_every``-th sample bad (None: none)."""
    records, n = [], itertools.count()
    nodes = [f"node-{i:04d}" for i in range(64)]
    for m in range(messages):
        node, tick = nodes[m % len(nodes)], m // len(nodes)
        samples = [_sample(node, g, tick) for g in range(GPUS)]
        for s in samples:
            i = next(n)
            if bad_every and i % bad_every == 0:
                s["gpu_temp_c"] = 10_000.0 if (i // bad_every) % 2 else "hot"
        batch = {"schema_version": SCHEMA_VERSION, "node": node, "seq": tick,
                 "sent_at": T0.isoformat(), "samples": samples}
        records.append(Record(TELEMETRY_TOPIC, node, msgspec.msgpack.encode(batch), 0, m))
    return records, messages * GPUS


class ListConsumer:
    def __init__(self, records: list[Record]) -> None:
        self.records, self.read = records, 0

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        out = self.records[self.read:self.read + max_records]
        self.read += len(out)
        return out

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass


def ingest_rate(records: list[Record], samples: int, tmp: str, runs: itertools.count,
                poll: int) -> tuple[float, int]:
    def run() -> int:
        with Store(Path(tmp) / f"b{next(runs)}.duckdb") as store:
            r = Ingestor(store, ListConsumer(records), max_records=poll,
                         validator=Validator(clock=lambda: NOW)).drain()
            return r.quarantined
    seconds, quarantined = best_of(run)
    return samples / seconds, quarantined


def one_message(n_bad: int) -> float:
    """Seconds to validate one message of ``n_bad`` bad samples (wrong type: the salvage)."""
    samples = [_sample("node-0", i % 64, i) for i in range(n_bad)]
    for s in samples:
        s["gpu_temp_c"] = "hot"
    raw = msgspec.msgpack.encode({"schema_version": SCHEMA_VERSION, "node": "node-0", "seq": 1,
                                  "sent_at": T0.isoformat(), "samples": samples})
    v = Validator(clock=lambda: NOW, limits=Limits(max_batch_records=10_000))
    seconds, result = best_of(lambda: v.validate([Record(TELEMETRY_TOPIC, "node-0", raw, 0, 0)]))
    assert len(result.rejections) == n_bad
    return seconds


def fuzz_rate(examples: int) -> dict[str, Any]:
    """Examples/s of the Kafka-shaped fuzz property (hypothesis' own generate-phase time)."""
    env = {**os.environ, "FLEETCARE_FUZZ_EXAMPLES": str(examples)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--hypothesis-show-statistics", "-k", "kafka_shaped",
         "tests/pipeline/test_fuzz_ingest.py"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"the fuzz test failed:\n{out.stdout[-3000:]}")
    phase = re.search(r"during generate phase \(([\d.]+) seconds\)", out.stdout)
    passing = re.search(r"(\d+) passing", out.stdout)
    assert phase and passing, out.stdout[-2000:]
    seconds, n = float(phase.group(1)), int(passing.group(1))
    return {"fuzz_examples": n, "fuzz_s": seconds, "fuzz_examples_per_s": round(n / seconds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--poll", type=int, default=500, help="records per poll (default 500)")
    p.add_argument("--fuzz-examples", type=int, default=3000)
    args = p.parse_args()
    logging.getLogger("fleetcare").setLevel(logging.ERROR)  # one warning per poll otherwise
    clean, n = stream(args.messages, None)
    bad, _ = stream(args.messages, 10)
    runs = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        clean_rate, q0 = ingest_rate(clean, n, tmp, runs, args.poll)
        bad_rate, q1 = ingest_rate(bad, n, tmp, runs, args.poll)
    assert q0 == 0 and q1 == n // 10, (q0, q1)
    validate_clean = n / best_of(lambda: Validator(clock=lambda: NOW).validate(clean))[0]
    validate_bad = n / best_of(lambda: Validator(clock=lambda: NOW).validate(bad))[0]
    sizes = {k: round(one_message(k), 4) for k in (1000, 2000, 4000)}
    report("bad_records", {
        "samples": n, "bad_share": 0.1,
        "clean_samples_per_s": round(clean_rate), "bad_samples_per_s": round(bad_rate),
        "ratio_bad_to_clean": round(bad_rate / clean_rate, 3),
        "validate_only_clean_per_s": round(validate_clean),
        "validate_only_bad_per_s": round(validate_bad),
        "one_message_bad_samples_s": sizes,
        "one_message_4000_vs_1000": round(sizes[4000] / sizes[1000], 2),
        **fuzz_rate(args.fuzz_examples)})


if __name__ == "__main__":
    main()
