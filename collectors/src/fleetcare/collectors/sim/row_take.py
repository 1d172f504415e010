"""``RowTake``: the same rows taken from many arrays, copied run by run.

A step of a 100,000-GPU fleet with some nodes down keeps the GPUs of the nodes that are
up: a few dozen long runs of consecutive indices. numpy's ``take`` copies element by
element (~3x a plain copy here); copying each run as a slice costs little more than a
copy. An index of many short runs is taken with ``take``.
"""

from __future__ import annotations

import numpy as np

MAX_RUNS = 256
"""More runs than this (or a short index) and ``take`` is used: each run costs a slice."""


class RowTake:
    """``x.take(index, axis)`` for a fixed 1-D integer ``index``, for any ``x``."""

    def __init__(self, index: np.ndarray) -> None:
        self.index = np.asarray(index, dtype=np.int64)
        self.runs: list[slice] | None = None
        n = len(self.index)
        # (a slice past the end or a negative index would not raise as ``take`` does)
        self.bad = bool(n) and int(self.index.min()) < 0
        self.end = int(self.index.max()) + 1 if n else 0
        if n >= 4096:
            breaks = np.flatnonzero(np.diff(self.index) != 1) + 1
            if len(breaks) < MAX_RUNS:
                first = self.index[np.r_[0, breaks]].tolist()
                last = self.index[np.r_[breaks - 1, n - 1]].tolist()
                self.runs = [slice(a, b + 1) for a, b in zip(first, last, strict=True)]

    def __len__(self) -> int:
        return len(self.index)

    def __call__(self, x: np.ndarray, axis: int = 0) -> np.ndarray:
        if self.runs is None:
            return x.take(self.index, axis=axis)
        if axis < 0:
            axis += x.ndim
        if self.bad or self.end > x.shape[axis]:
            raise IndexError(f"RowTake: an index out of [0, {x.shape[axis]}) (indices "
                             f"{self.index.min()}..{self.end - 1})")
        if len(self.runs) == 1:
            return x[(slice(None),) * axis + (self.runs[0],)].copy()
        pre = (slice(None),) * axis
        return np.concatenate([x[(*pre, r)] for r in self.runs], axis=axis)
