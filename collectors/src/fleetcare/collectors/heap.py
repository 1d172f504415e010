"""glibc's large freed blocks kept for the next one, not given back each time.

glibc's malloc serves a block past its mmap threshold (dynamic, at most 32 MiB) with a
fresh mapping and unmaps it on free; the next one is fresh pages again, a page fault every
4 KiB. Work that makes and drops arrays of tens of MB per step (the simulator's chunks,
ingest's polls) pays that every step; where a fresh page is costly (here, a VM whose host
reclaims freed guest memory: ~3-6 ms a MB on first touch) it was most of the time: the
simulator wrote 2.3 M samples/s at 100,000 GPUs with glibc's defaults and 4.4 M with its
blocks kept (``bench/bench_simulator.py``, README).

``keep_freed_blocks()`` (once a process) serves blocks up to ``HEAP_BLOCK`` from the heap
and gives the heap's free top back to the system only past ``2 * HEAP_BLOCK``: the
process keeps at most its peak. It does nothing when ``MALLOC_MMAP_THRESHOLD_`` is set
(the operator's choice) or the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os

HEAP_BLOCK = 256 << 20
"""Blocks up to this size come from the heap (a poll's bytes are ~50 MB, a chunk's
arrays up to ~40 MB each)."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (glibc's mallopt parameters)


@functools.cache
def keep_freed_blocks() -> str:
    """Keep large freed blocks (see the module docstring); returns what was chosen:
    ``"heap up to N MiB"`` or ``"default"``."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return "default"
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return "default"
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_TRIM_THRESHOLD, 2 * HEAP_BLOCK) and mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK):
        return f"heap up to {HEAP_BLOCK >> 20} MiB"
    return "default"
