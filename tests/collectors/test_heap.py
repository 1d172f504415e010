"""``heap.keep_freed_blocks``: a simulator keeps glibc's large freed blocks for its next
chunk (not a fresh mapping each time), unless the operator set the threshold. Each case
in its own process: the setting is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, resource
from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
spec = FleetSpec(nodes=4, seed=1)
FleetSimulator(spec, simulate_incidents(spec, 1))
faults = []
parts = [b"x" * 1000] * 64_000
for _ in range(3):  # a 64 MB block made and dropped, as a chunk's arrays are
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = b"".join(parts)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
    del a
from fleetcare.collectors.heap import keep_freed_blocks
print(json.dumps({"chosen": keep_freed_blocks(), "faults": faults}))
"""


def probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**clean, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_simulator_reuses_freed_large_blocks() -> None:
    got = probe()
    assert got["chosen"].startswith("heap up to")
    assert max(got["faults"][1:]) < 1_000, got["faults"]  # fresh 64 MB: ~15,600 faults


def test_a_threshold_the_operator_set_is_kept() -> None:
    got = probe(MALLOC_MMAP_THRESHOLD_="131072")
    assert got["chosen"] == "default"
    assert min(got["faults"]) > 10_000, got["faults"]
