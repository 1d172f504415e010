"""``gc_paused`` turns the cyclic collector off for its body and restores what was there:
nested, from two threads at once, after an exception, and never enabling a collector
someone else had disabled; ``Ingestor.run_once`` runs with it off and leaves it on."""

from __future__ import annotations

import gc
import threading

import pytest

from fleetcare.pipeline.gc_pause import gc_paused


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_nested_pauses_restore_only_at_the_outermost():
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_restores_the_collector():
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_two_threads_overlapping():
    inside, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause is still open
    release.set()
    t.join()
    assert gc.isenabled()


def test_ingest_polls_with_the_collector_off(tmp_path):
    from fleetcare.collectors.transport import Record
    from fleetcare.pipeline.ingest import Ingestor
    from fleetcare.pipeline.store import Store
    from fleetcare.pipeline.validate import Validator

    seen = []

    class Watching(Validator):
        def validate(self, records):
            seen.append(gc.isenabled())
            return super().validate(records)

    class OneRecord:
        def __init__(self):
            self.records = [Record(topic="t", key="n", value=b"garbage", partition=0,
                                   offset=0)]

        def poll(self, timeout_s, max_records=10_000):
            out, self.records = self.records, []
            return out

        def commit(self):
            pass

    with Store(tmp_path / "f.duckdb") as store:
        r = Ingestor(store, OneRecord(), validator=Watching()).run_once(0)
    assert (r.records, r.quarantined, seen) == (1, 1, [False])
    assert gc.isenabled()
