"""Shared helpers for the benchmarks: timing, and the one-line report format."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Fastest wall time of ``repeat`` runs (the machine is shared: min is the signal)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def report(name: str, figures: dict[str, Any]) -> None:
    figures = {"bench": name, **figures, "cpus": os.cpu_count(),
               "python": platform.python_version(), "data": "simulated"}
    print(json.dumps(figures))
