"""collectors.signals: the commands' stop handlers."""

from __future__ import annotations


def test_on_signals_sets_the_event_even_when_sigint_was_ignored() -> None:
    """The demo waits on an event set this way: SIGINT (inherited ignored, as by `cmd &`
    from a script) and SIGTERM set the event instead of being lost or ending the process;
    the handlers that were there come back after."""
    import os
    import signal
    import threading

    from fleetcare.collectors.signals import on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            stop = threading.Event()
            with on_signals(lambda signum, frame, stop=stop: stop.set()):
                os.kill(os.getpid(), sig)
                assert stop.wait(5), signal.Signals(sig).name
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for s, h in before.items():
            signal.signal(s, h)
