"""``arrow_memory.retain_freed``: ingest's Arrow pool keeps freed pages (jemalloc with a
decay), unless the operator named a pool. Each case in its own process: the pool is
process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import pyarrow as pa; from fleetcare.pipeline.ingest import Ingestor; "
         "from tests.pipeline.test_ingest import ListConsumer; "
         "before = pa.default_memory_pool().backend_name; "
         "Ingestor(None, ListConsumer([])); "
         "print(before, pa.default_memory_pool().backend_name)")


@pytest.mark.parametrize("named, want", [(None, "jemalloc"), ("system", "system"),
                                         ("mimalloc", "mimalloc")])
def test_an_ingestor_makes_arrow_keep_freed_pages_unless_a_pool_is_named(
        named: str | None, want: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if named:
        env["ARROW_DEFAULT_MEMORY_POOL"] = named
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == want
    if named:
        assert before == named
