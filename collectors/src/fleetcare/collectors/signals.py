"""Signal handlers for the duration of a block: the one way fleetcare's long-running
commands (the agent, ingest, ``serve``, the demo) stop cleanly on SIGTERM and SIGINT.

The handlers are installed whatever the process inherited: a command started with ``&``
from a script inherits SIGINT *ignored*, and would otherwise never see ``kill -INT``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_signals(handler: Callable[[int, object], None],
               signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """While inside (the main thread: Python runs handlers there), ``signals`` call
    ``handler(signum, frame)``; the handlers there before come back on the way out."""
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
