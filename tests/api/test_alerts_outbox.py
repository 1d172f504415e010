"""The durable outbox against real receivers on loopback: outages (HTTP 500, connection
refused) with exact backoff times on a manual clock, restarts, giving up loudly, order."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest

from fleetcare.api.alerts import AlertEngine
from fleetcare.pipeline.store import Store
from tests.api import test_alerts_helpers as helpers
from tests.api.test_alerts_helpers import (
    T0,
    Clock,
    config,
    epoch,
    minutes,
    put_scores,
)

db = helpers.db  # fixture
receivers = helpers.receivers  # fixture


def setup(store: Store, url: str, clock: Clock, **top: Any) -> AlertEngine:
    cfg = config([{"name": "am", "kind": "alertmanager", "url": url}],
                 **{"for": "0", "resolve_for": "0", **top})
    return AlertEngine.from_config(store, cfg, clock=clock, rng=lambda: 0.5)


def fire(store: Store, eng: AlertEngine, clock: Clock, node: str = "gpu01",
         at: dt.datetime = T0) -> None:
    put_scores(store, at, {node: 0.9})
    assert [e.status for e in eng.evaluate(clock.at(at))] == ["firing"]


def outbox_row(store: Store) -> tuple[Any, ...]:
    return store.cursor().execute(
        "SELECT state, attempts, next_attempt_at, last_error, delivered_at FROM alert_outbox"
    ).fetchone()


def test_http_500_outage_then_recovery_delivers_once_with_backoff(
        db: Store, receivers: Any) -> None:
    recv = receivers()
    recv.fail_next = 3
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    fire(db, eng, clock)
    t = T0
    for n, delay in enumerate((10, 20, 40), start=1):      # base 10 s, factor 2, jitter 0
        assert eng.outbox.deliver_due(clock.at(t)).retried == 1
        assert outbox_row(db) == ("pending", n, t + dt.timedelta(seconds=delay), "HTTP 500",
                                  None)
        # not due yet: nothing is sent
        assert eng.outbox.deliver_due(clock.at(t + dt.timedelta(seconds=delay - 1))) \
            .delivered == 0
        assert recv.attempts == n
        t += dt.timedelta(seconds=delay)
    assert eng.outbox.deliver_due(clock.at(t)).delivered == 1
    assert outbox_row(db) == ("delivered", 4, t, None, t)
    for _ in range(3):
        eng.outbox.deliver_due(clock.at(t + minutes(30)))
    assert recv.attempts == 4
    assert len(recv.got) == 1 and recv.got[0].json()["status"] == "firing"


def test_connection_refused_then_receiver_comes_back(db: Store, receivers: Any) -> None:
    recv = receivers()
    recv.stop()                                            # nothing listens on the port
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    fire(db, eng, clock)
    assert eng.outbox.deliver_due(clock.at(T0)).retried == 1
    state, attempts, next_at, error, _ = outbox_row(db)
    assert (state, attempts, next_at) == ("pending", 1, T0 + dt.timedelta(seconds=10))
    assert "ConnectionRefusedError" in error or "URLError" in error
    recv.start()                                           # back, on the same port
    assert eng.outbox.deliver_due(clock.at(T0 + dt.timedelta(seconds=10))).delivered == 1
    assert len(recv.got) == 1


def test_jitter_and_cap(db: Store) -> None:
    clock = Clock()
    eng = setup(db, "http://127.0.0.1:9/x", clock)
    box = eng.outbox
    assert [box.backoff_s(n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    box.rng = lambda: 1.0
    assert box.backoff_s(1) == pytest.approx(11.0)          # +10 %
    box.rng = lambda: 0.0
    assert box.backoff_s(6) == pytest.approx(270.0)         # cap 300 s, -10 %


def test_outbox_survives_a_restart(db: Store, receivers: Any, tmp_path: Any) -> None:
    recv = receivers()
    recv.fail_next = 1
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    fire(db, eng, clock)
    assert eng.outbox.deliver_due(clock.at(T0)).retried == 1
    db.close()                                              # fleetcare stops
    store = Store(tmp_path / "alerts.duckdb")               # and a new process starts
    try:
        eng = setup(store, recv.url(), clock)
        assert eng.outbox.deliver_due(clock.at(T0 + dt.timedelta(seconds=9))).delivered == 0
        assert eng.outbox.deliver_due(clock.at(T0 + dt.timedelta(seconds=10))).delivered == 1
        assert eng.outbox.stats() == {"pending": 0, "delivered": 1, "dead": 0}
        assert eng.evaluate(clock.at(T0 + minutes(1))) == []    # not fired twice
    finally:
        store.close()
    assert len(recv.got) == 1


def test_gives_up_after_max_age_loudly(db: Store, receivers: Any,
                                       caplog: pytest.LogCaptureFixture) -> None:
    recv = receivers()
    recv.fail_next = 10_000
    clock = Clock()
    eng = setup(db, recv.url("/services/SECRETPATH"), clock, max_age="2m")
    fire(db, eng, clock)
    t = T0
    with caplog.at_level(logging.WARNING, logger="fleetcare.api.alerts"):
        while outbox_row(db)[0] == "pending":
            eng.outbox.deliver_due(clock.at(t))
            t += dt.timedelta(seconds=1)
    state, attempts, next_at, error, delivered = outbox_row(db)
    # tries at 0, 10, 30, 70, 150 s (past 2 min: dead)
    assert (state, attempts, next_at, delivered) == ("dead", 5, None, None)
    assert error == "HTTP 500 (still failing after 150s)"
    assert eng.outbox.counters["dead"] == 1
    assert eng.outbox.stats() == {"pending": 0, "delivered": 0, "dead": 1}
    dead = [r for r in caplog.records if r.getMessage().startswith("alerts.dead")]
    assert len(dead) == 1 and dead[0].levelno == logging.ERROR
    assert all("SECRETPATH" not in r.getMessage() for r in caplog.records)


def test_a_permanent_4xx_is_dead_at_once(db: Store, receivers: Any) -> None:
    recv = receivers()
    recv.fail_next, recv.fail_status = 1, 400
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    fire(db, eng, clock)
    assert eng.outbox.deliver_due(clock.at(T0)).dead == 1
    assert outbox_row(db)[:2] == ("dead", 1)


def test_retryable_429_and_order_per_sink(db: Store, receivers: Any) -> None:
    recv = receivers()
    recv.fail_next, recv.fail_status = 1, 429
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    fire(db, eng, clock)                                    # firing at T0
    put_scores(db, T0 + minutes(1), {"gpu01": 0.1})
    eng.evaluate(clock.at(T0 + minutes(1)))                 # resolved, enqueued behind it
    box = eng.outbox
    # the firing message failed at T0+1m and waits 10 s: the resolved one must wait too
    assert box.deliver_due(clock.at(T0 + minutes(1))).retried == 1
    assert box.deliver_due(clock.at(T0 + minutes(1) + dt.timedelta(seconds=5))).delivered == 0
    assert box.deliver_due(clock.at(T0 + minutes(1) + dt.timedelta(seconds=10))).delivered == 2
    assert [r.json()["status"] for r in recv.got] == ["firing", "resolved"]


def test_now_accepts_epoch_or_datetime(db: Store, receivers: Any) -> None:
    recv = receivers()
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    put_scores(db, T0, {"gpu01": 0.9})
    assert len(eng.evaluate(T0.replace(tzinfo=dt.UTC))) == 1
    assert eng.outbox.deliver_due(epoch(T0)).delivered == 1


def test_old_messages_are_pruned_but_an_open_alert_keeps_its_last_firing(
        db: Store, receivers: Any) -> None:
    """The outbox is bounded: delivered messages go after 7 days, except the newest firing
    message of an alert still open (the engine reads it: pruning it would page again)."""
    recv = receivers()
    clock = Clock()
    eng = setup(db, recv.url(), clock)
    put_scores(db, T0, {"gpu01": 0.9, "gpu02": 0.9})
    assert [e.status for e in eng.evaluate(clock.at(T0))] == ["firing", "firing"]
    assert eng.outbox.deliver_due(clock.at(T0)).delivered == 2
    later = T0 + dt.timedelta(days=8)
    put_scores(db, later, {"gpu01": 0.9, "gpu02": 0.1})       # gpu02 recovers
    assert [e.status for e in eng.evaluate(clock.at(later))] == ["resolved"]
    assert eng.outbox.deliver_due(clock.at(later)).delivered == 1
    # pruned: gpu02's firing (8 days old, alert resolved); kept: gpu01's last firing
    # (its alert is open) and gpu02's resolve (new)
    rows = db.cursor().execute(
        "SELECT alert_id LIKE '%gpu01%', event FROM alert_outbox ORDER BY seq").fetchall()
    assert rows == [(True, "firing"), (False, "resolved")]
    assert eng.evaluate(clock.at(later + minutes(1))) == []    # gpu01 is not paged again
    much_later = later + dt.timedelta(days=8)
    assert eng.outbox.prune(clock.at(much_later)) == 1         # the resolve
    assert eng.outbox.stats() == {"pending": 0, "delivered": 1, "dead": 0}
    assert len(recv.got) == 3
