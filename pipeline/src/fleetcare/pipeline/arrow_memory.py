"""Arrow's memory for ingest: freed poll buffers kept for the next poll, not given back.

A poll of Kafka samples becomes ~1.5 KB of Arrow column memory a sample (numbers, string
bytes, NVLink items; ``wire_samples``), held until the sink lands it (the lake buffers
several polls until a flush) and then freed. Arrow's default pool (mimalloc) hands freed
large blocks back to the operating system, so every poll takes fresh pages; where a fresh
page is costly (here, a VM whose host reclaims freed guest memory: ~3-6 ms a MB on first
touch) that was most of the decode: one lake worker spent 3.7-4.5 s of CPU in the
compiled walk over 491,520 samples with it and 1.1-1.4 s with jemalloc keeping freed
pages (``bench/bench_pipeline_ingest.py``, README). ``retain_freed()`` makes jemalloc
Arrow's default pool with a decay of ``decay_ms`` (freed pages go back to the system only
after that long unused: an idle worker does not hold its peak), once a process. It does
nothing when ``ARROW_DEFAULT_MEMORY_POOL`` names a pool (the operator's choice wins) or
this pyarrow has no jemalloc.
"""

from __future__ import annotations

import logging
import os
import threading

import pyarrow as pa

log = logging.getLogger(__name__)

DECAY_MS = 10_000
"""How long freed pages stay with the process: well above the time between polls."""

_lock = threading.Lock()
_chosen: str | None = None


def retain_freed(decay_ms: int = DECAY_MS) -> str:
    """Use jemalloc, keeping freed pages ``decay_ms`` (see the module docstring); returns
    the backend of Arrow's default pool afterwards."""
    global _chosen
    with _lock:
        if _chosen is not None:
            return _chosen
        if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
            _chosen = pa.default_memory_pool().backend_name
            return _chosen
        try:
            pool = pa.jemalloc_memory_pool()
            pa.jemalloc_set_decay_ms(decay_ms)
        except (NotImplementedError, pa.ArrowException) as exc:
            log.info("arrow.pool_default reason=%s", exc)
        else:
            pa.set_memory_pool(pool)
        _chosen = pa.default_memory_pool().backend_name
        return _chosen
