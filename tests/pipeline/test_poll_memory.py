"""``poll_memory.retain_freed``: ingest keeps a poll's freed memory for the next one
(Arrow's pool jemalloc with a decay, glibc's large blocks from the heap), unless the
operator chose otherwise. Each case in its own process: the settings are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, resource
import pyarrow as pa
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline import poll_memory
from tests.pipeline.test_ingest import ListConsumer
before = pa.default_memory_pool().backend_name
Ingestor(None, ListConsumer([]))
parts, faults = [b"x" * 1000] * 60_000, []
for _ in range(3):  # a poll's bytes joined, freed, joined again
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    joined = b"".join(parts)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
    del joined
print(json.dumps({"before": before, "after": pa.default_memory_pool().backend_name,
                  "chosen": poll_memory.retain_freed(), "faults": faults}))
"""


def probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_MMAP_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**clean, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_an_ingestor_keeps_freed_poll_memory() -> None:
    got = probe()
    assert got["after"] == "jemalloc"
    assert got["chosen"]["malloc"].startswith("heap up to")
    # 60 MB joined again: the heap's freed block serves it (a fresh mapping: ~14,600 faults)
    assert max(got["faults"][1:]) < 1_000, got["faults"]


@pytest.mark.parametrize("named", ["system", "mimalloc"])
def test_a_pool_the_operator_names_is_kept(named: str) -> None:
    got = probe(ARROW_DEFAULT_MEMORY_POOL=named)
    assert got["before"] == got["after"] == named


def test_a_malloc_threshold_the_operator_set_is_kept() -> None:
    got = probe(MALLOC_MMAP_THRESHOLD_="131072")
    assert got["chosen"]["malloc"] == "default"
    assert min(got["faults"]) > 10_000, got["faults"]  # every join a fresh mapping
