from fleetcare.collectors.clock import ManualClock, ScaledClock


def test_manual_clock_moves_only_on_sleep() -> None:
    c = ManualClock(100)
    assert c() == 100.0
    c.sleep(2.5)
    c.sleep(-1)
    assert c() == 102.5


def test_scaled_clock_runs_at_speed() -> None:
    wall = ManualClock(5)
    c = ScaledClock(1000, speed=60, wall=wall)
    wall.sleep(2)
    assert c() == 1120.0
    assert c.wall_seconds(60) == 1.0
