"""The temperature trend (``temp_trend``): the same slopes from a training grid and live,
and a ramp told from a step, on hand-built telemetry."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from fleetcare.collectors.contract import GpuSample
from fleetcare.pipeline import features, temp_trend
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
HOURS = 14
RAMP_GPU, RAMP_C_H = 5, 1.0   # G5: one degree more every hour at the same power
STEP_GPU, STEP_C, STEP_H = 6, 12.0, 10  # G6: twelve degrees more from hour 10 on


def _temp(g: int, minutes: float, power: float) -> float:
    extra = 0.0
    if g == RAMP_GPU:
        extra = RAMP_C_H * minutes / 60
    elif g == STEP_GPU and minutes >= STEP_H * 60:
        extra = STEP_C
    return 30.0 + 0.1 * power + extra + 0.3 * ((g * 7 + int(minutes) // 10) % 5 - 2)


def fleet(store: Store, skip=lambda g, minutes: False) -> None:
    """Twelve H100s on three nodes, a sample every 10 minutes (at :05, :15, ...) for 14 h;
    power differs by GPU and hour, temperature follows it, G5 ramps, G6 steps (both
    near the fleet's mean power, where one GPU moves the fitted line least)."""
    out = []
    for g in range(12):
        for i in range(HOURS * 6):
            minutes = 5 + 10 * i
            if skip(g, minutes):
                continue
            power = 200.0 + 30 * g + 20 * ((minutes // 60 + g) % 3)
            out.append(GpuSample(
                ts=T0 + dt.timedelta(minutes=minutes), node=f"n{g // 4}", gpu_uuid=f"G{g}",
                gpu_index=g % 4, pci_bus_id=f"00000000:{0x10 + g % 4:02X}:00.0",
                model="H100", gpu_temp_c=_temp(g, minutes, power), power_w=power))
    store.insert_sample_records(out)
    features.refresh(store)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "t.duckdb") as s:
        fleet(s)
        yield s


def _by_gpu(table: pa.Table, values: np.ndarray, ts: dt.datetime) -> dict[str, float]:
    naive = np.datetime64(ts.replace(tzinfo=None), "us")
    when = table.column("ts").to_numpy(zero_copy_only=False).astype("datetime64[us]")
    gpus = table.column("gpu_uuid").to_pylist()
    return {g: float(v) for g, v, t in zip(gpus, values, when, strict=True) if t == naive}


def test_live_trend_equals_the_grids_on_the_hour(store):
    end = T0 + dt.timedelta(hours=HOURS - 1)
    grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), end)
    g6, gb = temp_trend.grid_trend(grid)
    live = features.latest_features(store, end)
    assert live.num_rows == 12
    l6, lb = temp_trend.latest_trend(store, live, np.arange(live.num_rows))
    for grid_v, live_v in ((g6, l6), (gb, lb)):
        want = _by_gpu(grid, grid_v, end)
        got = dict(zip(live.column("gpu_uuid").to_pylist(), live_v.tolist(), strict=True))
        assert set(want) == set(got)
        for gpu in want:
            assert got[gpu] == pytest.approx(want[gpu], abs=1e-9), gpu
    slopes = dict(zip(live.column("gpu_uuid").to_pylist(), zip(l6, lb, strict=True),
                      strict=True))
    # the ramp rises in both halves (the fit over 12 GPUs takes a third of it) ...
    assert slopes["G5"][0] > 0.5 and slopes["G5"][1] > 0.5
    # ... the step (3 h ago) only in the newest six hours; none of the others rises
    # (the two pull the fitted line up, so their peers sit a little lower each hour)
    assert slopes["G6"][0] > 1.0 and abs(slopes["G6"][1]) < 0.3
    assert all(s6 < 0.1 and sb < 0.1 for g, (s6, sb) in slopes.items()
               if g not in ("G5", "G6"))


def test_a_missing_hour_leaves_the_slope_undefined(store):
    end = T0 + dt.timedelta(hours=HOURS - 1)
    cur = store.cursor()
    cur.execute("DELETE FROM telemetry_hourly WHERE gpu_uuid = 'G2' AND hour = ?",
                [(T0 + dt.timedelta(hours=8)).replace(tzinfo=None)])
    cur.close()
    live = features.latest_features(store, end)
    s6, sb = temp_trend.latest_trend(store, live, np.arange(live.num_rows))
    k = live.column("gpu_uuid").to_pylist().index("G2")
    assert np.isnan(s6[k]) and np.isfinite(sb[k])   # hour 8-9 is lag 4 at 13:00
    assert temp_trend.latest_trend(store, live, [])[0].shape == (0,)


def test_slopes_of_a_line_are_its_rate():
    lagged = (20.0 - 0.5 * np.arange(temp_trend.LAGS))[:, None]  # +0.5 degC each hour
    s6, sb = temp_trend.slopes(lagged)
    assert s6[0] == pytest.approx(0.5) and sb[0] == pytest.approx(0.5)


def test_the_trend_reads_a_store_rolled_up_to_the_scoring_time(store):
    # `fleetcare score` scores at the newest sample, where the rollup's watermark is:
    # the rollup is read as stored (the path that once left a query open and failed)
    live = features.latest_features(store)
    s6, sb = temp_trend.latest_trend(store, live, np.arange(live.num_rows))
    k = live.column("gpu_uuid").to_pylist().index(f"G{RAMP_GPU}")
    assert s6[k] > 0.5 and sb[k] > 0.5


def test_a_ten_minute_grid_gives_the_hourly_grids_slopes_on_the_hour(store):
    end = T0 + dt.timedelta(hours=HOURS - 1)
    hourly = features.gpu_features(store, T0 + dt.timedelta(hours=1), end)
    fine = features.gpu_features(store, T0 + dt.timedelta(hours=1), end, every_s=600)
    assert fine.num_rows > 5 * hourly.num_rows
    (a6, ab), (b6, bb) = temp_trend.grid_trend(hourly), temp_trend.grid_trend(fine)
    got = _by_gpu(fine, b6, end)
    assert got == pytest.approx(_by_gpu(hourly, a6, end))
    assert np.isfinite(list(got.values())).all()
    assert _by_gpu(fine, bb, end) == pytest.approx(_by_gpu(hourly, ab, end))


def test_a_gpu_silent_for_the_end_of_an_hour_has_no_lag_there(tmp_path):
    # G2 sends nothing after 8:15: the grid does not score it at 9:00 (stale), so that
    # hour is no lag of it, and the hour's line is fitted without it, live as on the grid
    with Store(tmp_path / "s.duckdb") as store:
        fleet(store, skip=lambda g, m: g == 2 and 8 * 60 + 15 < m < 9 * 60)
        end = T0 + dt.timedelta(hours=HOURS - 1)
        grid = features.gpu_features(store, T0 + dt.timedelta(hours=1), end)
        g6, gb = temp_trend.grid_trend(grid)
        live = features.latest_features(store, end)
        l6, lb = temp_trend.latest_trend(store, live, np.arange(live.num_rows))
        k = live.column("gpu_uuid").to_pylist().index("G2")
        assert np.isnan(l6[k]) and np.isfinite(lb[k])  # 8-9 is lag 4 at 13:00
        for grid_v, live_v in ((g6, l6), (gb, lb)):
            want = _by_gpu(grid, grid_v, end)
            got = dict(zip(live.column("gpu_uuid").to_pylist(), live_v.tolist(), strict=True))
            assert got == pytest.approx(want, nan_ok=True)


def test_kept_hours_give_the_same_slopes_and_only_new_or_changed_hours_are_computed(
        store, monkeypatch):
    # every hour's residuals are kept (temp_trend.HOURS): an hour is computed again only
    # when it is new (the next scoring hour) or its rows changed (late telemetry rolled
    # into it); the slopes equal a computation from nothing each time
    kept = temp_trend._Hours()

    def trend(at: dt.datetime, hours: temp_trend._Hours) -> tuple[list[str], np.ndarray]:
        monkeypatch.setattr(temp_trend, "HOURS", hours)
        live = features.latest_features(store, at)
        return (live.column("gpu_uuid").to_pylist(),
                np.stack(temp_trend.latest_trend(store, live, np.arange(live.num_rows))))

    def same_as_fresh(at: dt.datetime, built: int) -> np.ndarray:
        gpus, got = trend(at, kept)
        assert kept.built == built
        fresh_gpus, fresh = trend(at, temp_trend._Hours())
        assert gpus == fresh_gpus and np.isfinite(got).sum() > 12
        assert np.allclose(got, fresh, rtol=0, atol=1e-9, equal_nan=True)  # sums in any order
        return got

    noon, one = T0 + dt.timedelta(hours=12), T0 + dt.timedelta(hours=13)
    same_as_fresh(noon, 11)                           # 0:00 .. 10:00: lags 11 .. 1
    same_as_fresh(noon + dt.timedelta(minutes=20), 11)  # within the hour: none
    before = same_as_fresh(one, 12)                   # 11:00, newly complete

    # G3 sends an hour-old sample late, much hotter: the hour 5:00 changes, only it
    store.insert_sample_records([GpuSample(
        ts=T0 + dt.timedelta(hours=5, minutes=30), node="n0", gpu_uuid="G3", gpu_index=3,
        pci_bus_id="00000000:13:00.0", model="H100", gpu_temp_c=95.0, power_w=290.0)])
    features.refresh(store)
    after = same_as_fresh(one, 13)
    k = trend(one, kept)[0].index("G3")
    assert after[1, k] != pytest.approx(before[1, k])  # 5:00 is lag 7: slope_prev_6h


def test_a_closed_store_lets_go_of_its_kept_hours_and_bases(tmp_path):
    from fleetcare.pipeline import live_features

    store = Store(tmp_path / "c.duckdb")
    fleet(store)
    live = features.latest_features(store, T0 + dt.timedelta(hours=12))
    temp_trend.latest_trend(store, live, np.arange(live.num_rows))
    target = T0.replace(tzinfo=None) + dt.timedelta(hours=12)
    assert temp_trend.HOURS.held(store) == 11 and live_features.BASES.held(store, target)
    store.close()
    assert temp_trend.HOURS.held(store) == 0
    assert not live_features.BASES.held(store, target)
