"""Per-link counter columns held as their non-zero rows (``SparseLinks``).

A chunk's four per-link NVLink counters are (rows, links) integer matrices that are zero
on almost every row: at 100,000 GPUs a dense one is 7.2 MB a tick, and writing four of
them was a third of a tick three days into a fleet's life (issue 15 §5). The simulator
gives them as ``SparseLinks``: the rows that are not zero and their values. ``dense()``
(or ``np.asarray``) is the (rows, links) matrix; the store sums the links and keeps the
per-link detail of the non-zero rows only (``fleetcare.pipeline.link_summary``), which
reads these directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class SparseLinks:
    """An ``(n, links)`` integer matrix of which only the rows ``rows`` (sorted, unique)
    are not zero; ``values`` (``len(rows)``, links) holds them, each with a non-zero."""

    n: int
    links: int
    rows: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        if self.values.shape != (len(self.rows), self.links):
            raise ValueError(f"SparseLinks: values of shape {self.values.shape} for "
                             f"{len(self.rows)} rows of {self.links} links")

    @classmethod
    def of(cls, dense: np.ndarray) -> SparseLinks:
        """The non-zero rows of a dense (n, links) matrix."""
        rows = np.flatnonzero(dense.any(axis=1))
        return cls(len(dense), dense.shape[1], rows, dense[rows])

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.links

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    ndim = 2

    def __len__(self) -> int:
        return self.n

    def dense(self) -> np.ndarray:
        """The (n, links) matrix, zeros where no row is held."""
        out = np.zeros(self.shape, dtype=self.values.dtype)
        out[self.rows] = self.values
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.dense()
        return out if dtype is None else out.astype(dtype, copy=False)

    def tolist(self) -> list[list[int]]:
        return self.dense().tolist()

    def copy(self) -> SparseLinks:
        return SparseLinks(self.n, self.links, self.rows.copy(), self.values.copy())

    def __getitem__(self, key: Any) -> Any:
        """A row (an int: its links as an array), rows (a slice, or a 1-D int or bool
        array: as ``SparseLinks``), or anything else numpy indexes, of the dense matrix."""
        if isinstance(key, int | np.integer):
            i = int(key) + self.n if key < 0 else int(key)
            if not 0 <= i < self.n:
                raise IndexError(f"row {key} of {self.n}")
            at = int(np.searchsorted(self.rows, i))
            held = at < len(self.rows) and self.rows[at] == i
            return self.values[at].copy() if held else np.zeros(self.links, self.values.dtype)
        if isinstance(key, slice):
            return self.take(np.arange(self.n)[key])
        if isinstance(key, np.ndarray) and key.ndim == 1 and key.dtype.kind in "biu":
            return self.take(key)
        return self.dense()[key]

    def take(self, index: np.ndarray) -> SparseLinks:
        """The rows ``index`` (int, or bool of length n), in that order, as SparseLinks."""
        index = np.asarray(index)
        if index.dtype == bool:
            if index.shape != (self.n,):
                raise IndexError(f"a mask of {index.shape} for {self.n} rows")
            index = np.flatnonzero(index)
        index = index.astype(np.int64, copy=False)
        if len(index):
            lo, hi = int(index.min()), int(index.max())
            if lo < -self.n or hi >= self.n:
                raise IndexError(f"an index of {lo}..{hi} for {self.n} rows")
        index = np.where(index < 0, index + self.n, index)  # (counted from the end)
        # the held rows are sorted: each index's place among them (no n-long lookup)
        at = np.minimum(np.searchsorted(self.rows, index), max(len(self.rows) - 1, 0))
        held = (np.flatnonzero(self.rows[at] == index) if len(self.rows)
                else np.zeros(0, dtype=np.int64))
        return SparseLinks(len(index), self.links, held, self.values[at[held]])


Column: TypeAlias = np.ndarray | SparseLinks
"""A column of a simulator chunk: a numpy array, or ``SparseLinks`` for a per-link
counter."""
