"""Run every benchmark in turn and print its JSON figures (``make bench``).

Figures are from simulated data on whatever machine runs this; the README quotes them
with the machine and the command. Kafka figures need the broker (``make kafka``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [
    ["bench_simulator.py"],
    ["bench_ingest.py"],
    ["bench_bad_records.py", "--messages", "2000", "--fuzz-examples", "2000"],
    ["bench_fleet_scoring.py"],
    ["bench_repeats.py"],
    ["bench_snapshot.py"],
    ["bench_sample_memory.py"],
    ["bench_agent.py", "--case", "sim", "--ticks", "100"],
    ["bench_agent.py", "--case", "nvml", "--ticks", "100"],
    ["bench_agent.py", "--case", "kafka", "--nodes", "64", "--kafka-ticks", "30"],
]


def main() -> int:
    failed = 0
    for args in BENCHES:
        print(f"# {' '.join(args)}", flush=True)
        rc = subprocess.run([sys.executable, *args], cwd=HERE).returncode
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
