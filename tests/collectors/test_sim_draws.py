"""The simulator's fleet-wide draws (``sim.draws``): made once per simulator, shared by
its groups, the same whether drawn ahead on a helper thread or when first asked, and
never lost to an executor that shut down before drawing them."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fleetcare.collectors.sim import FleetSimulator, FleetSpec, simulate_incidents, telemetry
from fleetcare.collectors.sim import draws as draws_mod
from fleetcare.collectors.sim.draws import (
    KEEP_DAYS,
    FleetDraws,
    draw_day,
    draw_error_traits,
    draw_sensor_traits,
)

SPEC = FleetSpec(nodes=16, seed=5, failure_scale=30, model="H100:3,A100:1")


@pytest.fixture()
def counted(monkeypatch):
    """Counts of the traits' and days' draws, by what was drawn."""
    calls: dict[object, int] = {}
    real_sensor, real_errors, real_day = (draws_mod.draw_sensor_traits,
                                          draws_mod.draw_error_traits, draws_mod.draw_day)

    def sensor(spec):
        calls["sensor"] = calls.get("sensor", 0) + 1
        return real_sensor(spec)

    def errors(spec):
        calls["errors"] = calls.get("errors", 0) + 1
        return real_errors(spec)

    def day(seed, d, cum):
        calls[d] = calls.get(d, 0) + 1
        return real_day(seed, d, cum)

    monkeypatch.setattr(draws_mod, "draw_sensor_traits", sensor)
    monkeypatch.setattr(draws_mod, "draw_error_traits", errors)
    monkeypatch.setattr(draws_mod, "draw_day", day)
    return calls


def test_groups_of_a_mixed_fleet_and_every_history_share_one_draw(counted):
    sim = FleetSimulator(SPEC, simulate_incidents(SPEC, days=3))
    assert len(sim.groups()) == 2
    for _ in range(2):
        for _ in sim.history(SPEC.start + dt.timedelta(days=2),
                             SPEC.start + dt.timedelta(days=2, hours=1), interval_s=300):
            pass
    # one draw of each trait; each day the counters caught up over drawn once
    assert counted == {"sensor": 1, "errors": 1, 0: 1, 1: 1, 2: 1}


def test_history_draws_the_error_traits_and_first_days_ahead(monkeypatch):
    """``history`` starts the fleet's error traits and the days its first chunk catches
    up over on its helper thread, before the groups ask for them."""
    where: dict[object, str] = {}
    real_errors, real_day = draws_mod.draw_error_traits, draws_mod.draw_day

    def errors(spec):
        where["errors"] = threading.current_thread().name
        return real_errors(spec)

    def day(seed, d, cum):
        where[d] = threading.current_thread().name
        out = real_day(seed, d, cum)
        if d == 3:
            last_drawn.set()
        return out

    # the groups wait (at most 10 s) for the last day: a helper that did not draw ahead
    # leaves them to draw everything on the main thread
    last_drawn = threading.Event()
    real_group = telemetry.Group.__init__

    def group(self, *a, **kw):
        last_drawn.wait(10)
        real_group(self, *a, **kw)

    monkeypatch.setattr(draws_mod, "draw_error_traits", errors)
    monkeypatch.setattr(draws_mod, "draw_day", day)
    monkeypatch.setattr(telemetry.Group, "__init__", group)
    sim = FleetSimulator(SPEC, simulate_incidents(SPEC, days=3))
    a = SPEC.start + dt.timedelta(days=2, hours=23)
    next(sim.history(a, a + dt.timedelta(hours=2), interval_s=3600))  # ticks on days 2, 3
    assert set(where) == {"errors", 0, 1, 2, 3}
    assert all(name.startswith("fleetcare-sim-draws") for name in where.values()), where


def test_draws_are_read_only():
    d = FleetDraws(SPEC)
    with pytest.raises(ValueError, match="read-only"):
        d.sensor().temp_off[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        d.errors().cum["ce"][0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        d.day(0)["ce"][0][:] = 0


def test_drawn_ahead_equals_drawn_when_asked():
    ahead = FleetDraws(SPEC)
    with ThreadPoolExecutor(1) as ex:
        ahead.start(ex, range(3))
        got_ahead = [ahead.day(d) for d in range(3)], ahead.errors()
    asked = FleetDraws(SPEC)
    got_asked = [asked.day(d) for d in range(3)], asked.errors()
    for a, b in zip(got_ahead[0], got_asked[0], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            for x, y in zip(a[k], b[k], strict=True):
                np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got_ahead[1].life_ce, got_asked[1].life_ce)
    np.testing.assert_array_equal(got_ahead[1].cum["ce"], draw_error_traits(SPEC).cum["ce"])
    # a day of the whole fleet: each event's GPU in the fleet, time in the day, a link
    g, t, link = got_asked[0][2]["nv_flit"]
    assert len(g) and g.max() < SPEC.gpus and (t // 86400 == 2).all() and link.max() < 18


def test_draws_cancelled_by_a_shut_down_executor_are_drawn_when_asked(counted):
    d = FleetDraws(SPEC)
    gate = threading.Event()
    ex = ThreadPoolExecutor(1)
    ex.submit(gate.wait)  # the executor is busy: what start queues stays queued
    d.start(ex, range(2))
    ex.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert counted == {}  # nothing was drawn by the executor
    asked: list = []
    t = threading.Thread(target=lambda: asked.append(d.day(1)), daemon=True)
    t.start()
    t.join(10)  # (a cancelled future asked again and again would never return)
    assert asked, "a day cancelled on its executor was never drawn"
    got = asked[0]
    assert counted == {"errors": 1, 1: 1}
    for k, (g, t, link) in got.items():
        for x, y in zip((g, t, link), draw_day(SPEC.seed, 1, d.errors().cum)[k], strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_failed_draw_is_drawn_again(monkeypatch):
    d = FleetDraws(SPEC)
    real = draws_mod.draw_sensor_traits
    monkeypatch.setattr(draws_mod, "draw_sensor_traits", lambda spec: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        d.sensor()
    monkeypatch.setattr(draws_mod, "draw_sensor_traits", real)
    np.testing.assert_array_equal(d.sensor().eff, draw_sensor_traits(SPEC).eff)


def test_days_held_are_bounded_and_the_least_recently_asked_go(counted):
    d = FleetDraws(SPEC)
    for day in range(KEEP_DAYS):
        d.day(day)
    d.day(0)  # asked again: now the most recently asked
    d.day(KEEP_DAYS)  # one too many: day 1 goes
    assert sum(isinstance(k, int) for k in d._got) == KEEP_DAYS
    d.day(0)
    assert counted[0] == 1
    d.day(1)  # evicted: drawn again, the same
    assert counted[1] == 2
    # days started ahead are kept though the days held are later ones (a catch-up from
    # the fleet's start after a history further on)
    for day in range(200, 200 + KEEP_DAYS):
        d.day(day)
    with ThreadPoolExecutor(1) as ex:
        d.start(ex, range(2, 4))
    before = dict(counted)
    d.day(2), d.day(3)
    assert counted == before
