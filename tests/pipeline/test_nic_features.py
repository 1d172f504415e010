"""Node-level InfiniBand features (``nic_features``): counters apart, three windows, the
worst port and how many ports count, on the grid and live, from the hourly NIC rollup."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetcare.collectors.contract import NicSample
from fleetcare.pipeline import features, nic_features
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def nic(hour: float, node: str, device: str, **kw: object) -> NicSample:
    base: dict[str, object] = dict(port=1, link_layer="InfiniBand", state="ACTIVE",
                                   phys_state="LinkUp", rate_gbps=400.0, symbol_error=0,
                                   link_error_recovery=0, link_downed=0)
    return NicSample(ts=T0 + hour * H, node=node, device=device, **(base | kw))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """n1: port mlx5_0 counts 10 symbol errors in hour 1, 20 more and 2 link error
    recoveries in hour 10; port mlx5_1 counts 5 in hour 9 and trains down to 200 Gb/s
    then. n2: one quiet port. A sample on the hour every hour, 0..40."""
    s = Store(tmp_path / "nic.duckdb")
    rows = []
    for h in range(41):
        sym0 = 0 if h < 1 else 10 if h < 10 else 30
        rows.append(nic(h, "n1", "mlx5_0", symbol_error=sym0,
                        link_error_recovery=0 if h < 10 else 2))
        rows.append(nic(h, "n1", "mlx5_1", symbol_error=0 if h < 9 else 5,
                        rate_gbps=400.0 if h < 9 else 200.0))
        rows.append(nic(h, "n2", "mlx5_0"))
    s.insert_nic_samples(rows)
    features.refresh(s)
    yield s
    s.close()


def _rows(table) -> dict[tuple[dt.datetime, str], dict[str, float]]:
    out = {}
    for r in table.to_pylist():
        out[(r.pop("ts"), r.pop("node"))] = r
    return out


def at(h: float) -> dt.datetime:
    return (T0 + h * H).replace(tzinfo=None)


def test_windows_worst_port_and_ports_counting(store: Store) -> None:
    g = _rows(nic_features.grid(store, T0 + 7 * H, T0 + 30 * H))
    assert set(g) == {(at(h), n) for h in range(7, 31) for n in ("n1", "n2")}
    r = g[(at(11), "n1")]  # hours 5..10 / up to 10
    assert (r["node_sym_6h"], r["node_sym_24h"], r["node_sym_72h"]) == (25.0, 35.0, 35.0)
    assert (r["worst_sym_24h"], r["ports_sym_24h"]) == (30.0, 2.0)
    assert (r["node_rec_6h"], r["worst_rec_24h"], r["ports_rec_24h"]) == (2.0, 2.0, 1.0)
    assert r["rate_ratio_24h"] == 0.5
    r = g[(at(10), "n1")]  # hour 10 is not read yet
    assert (r["node_sym_6h"], r["node_sym_24h"], r["worst_sym_24h"], r["node_rec_6h"]) \
        == (5.0, 15.0, 10.0, 0.0)
    # the 6 h window: hour 1 is in at 7 (hours 1..6), out at 8 (hours 2..7)
    assert (g[(at(7), "n1")]["node_sym_6h"], g[(at(8), "n1")]["node_sym_6h"]) == (10.0, 0.0)
    # 24 h and 72 h: at 30 (hours 6..29 / up to 29) hour 1 is out of one, in the other
    r = g[(at(30), "n1")]
    assert (r["node_sym_24h"], r["node_sym_72h"], r["ports_sym_24h"]) == (25.0, 35.0, 2.0)
    assert all(v == 0.0 for k, v in g[(at(11), "n2")].items() if k != "rate_ratio_24h")
    assert g[(at(11), "n2")]["rate_ratio_24h"] == 1.0
    assert list(g[(at(11), "n1")]) == list(nic_features.FEATURE_NAMES)


def test_live_reads_the_current_partial_hour_like_the_next_grid_time(store: Store) -> None:
    live = _rows(nic_features.latest(store, T0 + 10.5 * H))
    grid = _rows(nic_features.grid(store, T0 + 11 * H, T0 + 11 * H))
    assert set(live) == {(at(10.5), "n1"), (at(10.5), "n2")}
    assert live[(at(10.5), "n1")] == grid[(at(11), "n1")]
    # every hour: the one-hour query equals the grid's window functions
    g = _rows(nic_features.grid(store, T0 + 2 * H, T0 + 41 * H))
    for h in range(2, 42):
        one = _rows(nic_features.latest(store, T0 + h * H))
        assert one == {k: v for k, v in g.items() if k[0] == at(h)}
    only = nic_features.latest(store, T0 + 10.5 * H, nodes=["n2"])
    assert only.column("node").to_pylist() == ["n2"]
    # a node down (no port rows in that hour) has no row; far past the data, none has
    assert nic_features.latest(store, T0 + 60 * H).num_rows == 0


def test_a_store_without_nic_rollup(tmp_path: Path) -> None:
    s = Store(tmp_path / "none.duckdb")
    try:
        t = nic_features.grid(s, T0, T0 + H)
        assert t.num_rows == 0 and t.column_names == ["ts", "node", *nic_features.FEATURE_NAMES]
    finally:
        s.close()
