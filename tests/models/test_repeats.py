"""``repeat_stats`` on small hand-made histories, exact values."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetcare.models.repeats import repeat_stats

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(days: float, hours: float = 0.0) -> dt.datetime:
    return T0 + dt.timedelta(days=days, hours=hours)


def fail(node: str, day: float, cause: str = "faulty_gpu") -> tuple:
    return (at(day), node, "failure", cause)


def repair(node: str, day: float, hours: float) -> tuple:
    return (at(day, hours), node, "repair", "faulty_gpu")


HISTORY = [
    fail("a", 0), repair("a", 0, 2), fail("a", 5), repair("a", 5, 10),
    fail("a", 20), fail("a", 80),                        # never repaired
    fail("b", 10), repair("b", 10, 30), fail("b", 50), repair("b", 50, 1),
    fail("b", 60, "planned_maintenance"), repair("b", 60, 3),   # not a failure
    fail("c", 75), repair("c", 75, 4),
    fail("d", -3), repair("d", -3, 5),                   # before the window
]


def test_repeat_stats_of_a_small_fleet() -> None:
    s = repeat_stats(HISTORY, servers=10, span_days=100, start=T0)
    # eligible (30 days after them in the window): a0 a5 a20 b10 b50 (c75, a80 too late);
    # within 7 days: a0 -> a5; within 30: a0 -> a5, a5 -> a20
    assert s == {
        "servers": 10, "span_days": 100, "failures": 7, "nodes_failed": 3,
        "eligible_failures": 5, "repeat_7d": 0.2, "repeat_30d": 0.4,
        "top10_share": round(4 / 7, 4),                  # node a, the 1 of 10 worst
        "repairs_timed": 5, "repair_h_median": 4.0,
        "repair_h_p90": 22.0,                            # of 1, 2, 4, 10, 30 h
        "failures_per_1000_node_days": 7.0,
    }


def test_never_failing_nodes_count_in_the_top_share() -> None:
    rows = [fail(f"n{i}", 1) for i in range(10)] + [fail("n0", 2)]
    assert repeat_stats(rows, servers=10, span_days=40, start=T0)["top10_share"] == round(
        2 / 11, 4)
    # 100 servers: the top 10 % is 10 nodes, which hold every failure
    assert repeat_stats(rows, servers=100, span_days=40, start=T0)["top10_share"] == 1.0


def test_overlapping_faults_close_oldest_first() -> None:
    rows = [fail("a", 1), fail("a", 1.5), repair("a", 2, 0), repair("a", 3, 0)]
    s = repeat_stats(rows, servers=1, span_days=10, start=T0)
    assert (s["repairs_timed"], s["repair_h_median"]) == (2, 30.0)   # 24 h and 36 h
    assert s["eligible_failures"] == 0 and s["repeat_30d"] is None  # 10 days: none eligible


def test_start_defaults_to_the_first_row_and_sizes_are_checked() -> None:
    rows = [fail("a", 3), fail("a", 4)]
    assert repeat_stats(rows, servers=2, span_days=40)["repeat_7d"] == 0.5  # a3 -> a4; a4 none
    with pytest.raises(ValueError, match="servers=1, but 2 nodes failed"):
        repeat_stats([fail("a", 1), fail("b", 1)], servers=1, span_days=40)
    with pytest.raises(ValueError, match="must be positive"):
        repeat_stats([], servers=0, span_days=1)
