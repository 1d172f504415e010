"""Progress bars for long CLI work (tqdm on stderr, off when stderr is not a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class ProgressBar:
    """``bar(done, total)`` moves the bar; ``bar.close()`` ends it. Fits the pipeline's
    ``Progress = Callable[[int, int], None]`` callbacks."""

    def __init__(self, desc: str, *, unit: str = "it", enabled: bool = True) -> None:
        from tqdm import tqdm

        self._bar: Any = tqdm(total=0, desc=desc, unit=unit,
                              disable=None if enabled else True, file=sys.stderr,
                              dynamic_ncols=True)

    def __call__(self, done: int, total: int) -> None:
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def progress_bar(desc: str, *, unit: str = "it", enabled: bool = True) -> ProgressBar:
    return ProgressBar(desc, unit=unit, enabled=enabled)


Progress = Callable[[int, int], None]
