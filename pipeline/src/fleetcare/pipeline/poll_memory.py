"""Memory for ingest: a poll's freed buffers kept for the next poll, not given back.

A poll of Kafka samples becomes ~1.5 KB of Arrow column memory a sample (numbers, string
bytes, NVLink items; ``wire_samples``) plus a copy of its bytes, held until the sink lands
it (the lake buffers several polls until a flush) and then freed. Arrow's default pool
(mimalloc) hands freed large blocks back to the operating system, and so does glibc's
malloc for any block past its mmap threshold (32 MiB at most: a poll's bytes are ~50 MB);
every poll then takes fresh pages. Where a fresh page is costly (here, a VM whose host
reclaims freed guest memory: ~3-6 ms a MB on first touch) that was most of the decode:
one lake worker spent 3.7-4.5 s of CPU in the compiled walk over 491,520 samples with
mimalloc and 1.0-1.9 s with jemalloc keeping freed pages (``bench/bench_pipeline_ingest.py``,
README).

``retain_freed()`` (once a process):

- makes jemalloc Arrow's default pool with a decay of ``DECAY_MS`` (freed pages go back to
  the system only after that long unused: an idle worker does not keep its peak); nothing
  when ``ARROW_DEFAULT_MEMORY_POOL`` names a pool (the operator's choice wins) or this
  pyarrow has no jemalloc;
- on glibc, keeps large freed blocks for the next poll (``collectors.heap``: blocks up to
  256 MiB from the heap, not fresh mappings); nothing when ``MALLOC_MMAP_THRESHOLD_`` is
  set or the C library is not glibc.
"""

from __future__ import annotations

import functools
import logging
import os

import pyarrow as pa

from fleetcare.collectors.heap import keep_freed_blocks

log = logging.getLogger(__name__)

DECAY_MS = 10_000
"""How long jemalloc keeps freed pages: well above the time between polls."""


@functools.cache
def retain_freed() -> dict[str, str]:
    """Keep freed poll memory (see the module docstring); returns what was chosen:
    ``{"arrow": backend, "malloc": "heap up to N MiB" | "default"}``."""
    done = {"arrow": _arrow_pool(), "malloc": keep_freed_blocks()}
    log.debug("ingest.memory arrow=%(arrow)s malloc=%(malloc)s", done)
    return done


def _arrow_pool() -> str:
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pool = pa.jemalloc_memory_pool()
            pa.jemalloc_set_decay_ms(DECAY_MS)
        except (NotImplementedError, pa.ArrowException) as exc:
            log.info("arrow.pool_default reason=%s", exc)
        else:
            pa.set_memory_pool(pool)
    return pa.default_memory_pool().backend_name
