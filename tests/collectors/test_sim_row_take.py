"""``RowTake`` gives what numpy's ``take`` gives, run by run or not."""

from __future__ import annotations

import numpy as np
import pytest

from fleetcare.collectors.sim.row_take import MAX_RUNS, RowTake


def _index(rng: np.random.Generator, n: int, holes: int) -> np.ndarray:
    keep = np.ones(n, dtype=bool)
    for start in rng.integers(0, n, size=holes):
        keep[start:start + int(rng.integers(1, 40))] = False
    return np.flatnonzero(keep)


@pytest.mark.parametrize(("n", "holes", "by_runs"), [
    (100_000, 0, True), (100_000, 1, True), (100_000, 57, True), (50_000, 3 * MAX_RUNS, False),
    (1_000, 2, False)])
def test_row_take_equals_numpys_take(n, holes, by_runs):
    rng = np.random.default_rng(holes)
    index = _index(rng, n, holes)
    take = RowTake(index)
    assert (take.runs is not None) == by_runs
    for x, axis in ((rng.integers(0, 9, n), 0), (rng.random((n, 3)), 0),
                    (rng.standard_normal((3, 2, n), dtype=np.float32), 2),
                    (rng.standard_normal((3, 2, n), dtype=np.float32), -1)):
        got = take(x, axis=axis)
        assert got.dtype == x.dtype and np.array_equal(got, x.take(index, axis=axis))
        assert got.flags.c_contiguous and not np.shares_memory(got, x)


def test_a_tick_major_index_of_several_ticks_breaks_runs_at_each_tick():
    keep = np.ones((3, 10_000), dtype=bool)
    keep[:, 4_000:4_008] = False
    index = np.nonzero(keep)[1]  # each kept row's GPU, tick-major
    take = RowTake(index)
    assert take.runs is not None and len(take.runs) == 6
    x = np.arange(10_000) * 3
    assert np.array_equal(take(x), x[index])


@pytest.mark.parametrize("index", [np.r_[np.arange(3000), np.arange(3100, 5000)],
                                   np.r_[-1, np.arange(5000)]])
def test_an_index_out_of_bounds_raises(index):
    """Runs past the array's end would slice short (numpy's take raises), and a negative
    index would count from the end: both raise."""
    x = np.arange(4000)
    assert RowTake(index).runs is not None  # (the slice path)
    with pytest.raises(IndexError, match="out of"):
        RowTake(index)(x)
