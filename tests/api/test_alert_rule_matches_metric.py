"""The operating point the prior is measured at (``metrics.two_tier``: a risk held for an
hour, or an immediate one) alarms exactly when the product's alert rule (``[alerts]
threshold``, ``for``, ``immediate_threshold``) fires, on the runs ``serve`` makes: a
scoring every hour and others at any minute (after urgent signals), every node in each."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from fleetcare.api.alerts import Rule, Score
from fleetcare.models import metrics as M

T0 = dt.datetime(2026, 3, 1)
NODES = ("a", "b", "c", "d")


def runs(seed: int) -> tuple[list[dt.datetime], dict[str, list[float]]]:
    """Two days of runs: on the hour plus ~40 at random minutes; each node's risk a
    two-state chain (high spells of one run to several hours)."""
    rng = np.random.default_rng(seed)
    minutes = set(range(0, 48 * 60, 60)) | set(rng.integers(0, 48 * 60, 40).tolist())
    times = [T0 + dt.timedelta(minutes=m) for m in sorted(minutes)]
    risks: dict[str, list[float]] = {}
    for n in NODES:
        high, out = False, []
        for _ in times:
            high = rng.random() < (0.8 if high else 0.15)
            out.append(float(rng.uniform(0.7, 1.0) if high else rng.uniform(0.0, 0.7)))
        risks[n] = out
    return times, risks


def rule_fires(rule: Rule, times: list[dt.datetime], risks: list[float]) -> list[dt.datetime]:
    alert, fired = None, []
    for t, r in zip(times, risks, strict=True):
        alert, change = rule.step(alert, Score(t, "n", r), t)
        if change == "firing":
            fired.append(t)
    return fired


def metric_fires(times: list[dt.datetime], risks: list[float], score: np.ndarray,
                 x: float) -> list[dt.datetime]:
    """Per spell of runs at or above ``x``, its first run whose alarm score reaches ``x``."""
    fired, armed = [], True
    for t, r, s in zip(times, risks, score, strict=True):
        if r < x:
            armed = True
        elif armed and s >= x:
            fired.append(t)
            armed = False
    return fired


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("immediate", [None, 0.93])
@pytest.mark.parametrize("hold_min", [60, 90])
def test_two_tier_alarms_when_the_alert_rule_fires(seed: int, immediate: float | None,
                                                    hold_min: int) -> None:
    times, risks = runs(seed)
    ts = np.array([np.datetime64(t, "us") for t in times] * len(NODES))
    node = np.repeat(np.array(NODES, dtype=object), len(times))
    risk = np.concatenate([risks[n] for n in NODES])
    hold = np.timedelta64(hold_min, "m")
    score = M.two_tier(ts, node, risk, hold, np.inf if immediate is None else immediate)
    compared = 0
    for x in (0.74, 0.85):
        # resolving at the first run below the threshold: one alert per spell
        rule = Rule(threshold=x, for_s=hold_min * 60.0, resolve_threshold=x,
                    resolve_for_s=0.0, immediate=immediate)
        for i, n in enumerate(NODES):
            mine = slice(i * len(times), (i + 1) * len(times))
            want = rule_fires(rule, times, risks[n])
            assert metric_fires(times, risks[n], score[mine], x) == want, (n, x)
            compared += len(want)
    assert compared >= 5  # the timelines do fire
