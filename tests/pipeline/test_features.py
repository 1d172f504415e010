"""Features from hand-built telemetry, with exact expected values."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from fleetcare.collectors.contract import GpuSample, Incident, NicSample, XidEvent
from fleetcare.pipeline import features, rollup
from fleetcare.pipeline.store import Store

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def sample(minutes: float, gpu: str = "G0", node: str = "n1", index: int = 0,
           model: str = "H100", **kw) -> GpuSample:
    return GpuSample(ts=at(minutes), node=node, gpu_uuid=gpu, gpu_index=index,
                     pci_bus_id=f"00000000:{0x10 + index:02X}:00.0", model=model, **kw)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "f.duckdb") as s:
        yield s


def row(table, ts: dt.datetime, gpu: str = "G0") -> dict:
    naive = ts.astimezone(dt.UTC).replace(tzinfo=None)
    rows = [r for r in table.to_pylist() if r["ts"] == naive and r["gpu_uuid"] == gpu]
    assert len(rows) == 1, f"{len(rows)} rows for {gpu} at {ts}"
    return rows[0]


def test_counter_delta_is_reset_aware(store):
    # 0, 5, 5, 12, reset to 0, 3 -> 5 + 7 + 3 = 15, across two hours.
    values = [0, 5, 5, 12, 0, 3]
    store.insert_sample_records(
        sample(20 * i, ecc_corrected_volatile=v, pcie_replay_count=2 * v)
        for i, v in enumerate(values))
    features.refresh(store)
    r = row(features.gpu_features(store, at(120), at(120)), at(120))
    assert r["ecc_corrected_24h"] == 15.0
    assert r["ecc_corrected_1h"] == 10.0       # 12 (+7), 0 (reset), 3 (+3)
    assert r["pcie_replay_24h"] == 30.0
    assert math.isnan(r["remapped_rows_24h"])   # unsupported counter: NaN, not 0
    assert r["ecc_uncorrected_24h"] != r["ecc_uncorrected_24h"]


def test_link_flap_downtraining_and_throttle(store):
    up = [[True, True], [True, False], [True, True], [True, True]]
    width = [16, 16, 8, 8]
    store.insert_sample_records(
        sample(15 * i, nvlink_up=u, nvlink_crc_flit=[i, 2 * i], nvlink_crc_data=[0, 0],
               pcie_link_width=w, pcie_link_width_max=16, pcie_link_gen=5,
               pcie_link_gen_max=5, clock_event_reasons=0x40 if i == 3 else 0x4,
               gpu_temp_c=50.0 + i, power_w=300.0)
        for i, (u, w) in enumerate(zip(up, width, strict=True)))
    features.refresh(store)
    r = row(features.gpu_features(store, at(60), at(60)), at(60))
    assert r["nvlink_flaps_1h"] == 1.0
    assert r["nvlink_links_down_now"] == 0.0
    assert r["nvlink_links_now"] == 2.0
    assert r["nvlink_crc_1h"] == 9.0            # link 0: 3, link 1: 6
    assert r["pcie_width_down_frac_1h"] == 0.5
    assert r["pcie_width_down_now"] == 1.0
    assert r["pcie_gen_down_now"] == 0.0
    assert r["throttle_thermal_frac_1h"] == 0.25
    assert r["throttle_power_frac_1h"] == 0.75
    assert r["gpu_temp_mean_1h"] == 51.5
    assert r["gpu_temp_max_1h"] == 53.0
    assert r["gpu_temp_now"] == 53.0


def test_xid_classes_and_hours_since(store):
    store.insert_sample_records(sample(m) for m in range(0, 600, 30))
    store.insert_events([
        XidEvent(ts=at(30), node="n1", xid=13, message="app", source="sim", gpu_uuid="G0"),
        XidEvent(ts=at(90), node="n1", xid=31, message="app", source="sim", gpu_uuid="G0"),
        # kernel-log style: no uuid, only the PCI bus id in the driver's short format
        XidEvent(ts=at(400), node="n1", xid=48, message="dbe", source="kernel-log",
                 pci_bus_id="0000:10:00"),
        XidEvent(ts=at(410), node="n1", xid=79, message="bus", source="kernel-log"),
    ])
    features.refresh(store)
    r = row(features.gpu_features(store, at(540), at(540)), at(540))
    assert r["xid_application_24h"] == 2.0
    assert r["xid_application_1h"] == 0.0
    assert r["xid_memory_6h"] == 1.0
    assert r["xid_memory_hours_since"] == pytest.approx(140 / 60)
    assert r["xid_application_hours_since"] == pytest.approx(450 / 60)
    assert r["xid_link_hours_since"] == 24 * 28
    assert r["xid_bus_24h"] == 0.0             # no GPU named: counted for the node only
    assert r["node_xid_bus_24h"] == 1.0
    assert r["node_xid_memory_24h"] == 1.0


def test_lemon_history(store):
    store.insert_sample_records(
        [sample(m) for m in range(0, 120, 30)]
        + [sample(m, gpu="G1", index=1) for m in range(0, 120, 30)])
    store.insert_incidents([
        Incident(ts=at(-60 * 24 * 3), node="n1", kind="failure", cause="faulty_gpu",
                 source="sim", gpu_uuid="G0", mode="hbm"),
        Incident(ts=at(-60 * 24 * 2), node="n1", kind="repair", cause="faulty_gpu",
                 source="ops", gpu_uuid="G0"),
        Incident(ts=at(-60 * 24 * 40), node="n1", kind="failure", cause="faulty_gpu",
                 source="sim", gpu_uuid="G0"),     # older than 28 d
    ])
    features.refresh(store)
    tab = features.gpu_features(store, at(120), at(120))
    g0, g1 = row(tab, at(120), "G0"), row(tab, at(120), "G1")
    assert (g0["gpu_failures_28d"], g0["node_failures_28d"], g0["node_repairs_28d"]) == (
        1.0, 1.0, 1.0)
    assert (g1["gpu_failures_28d"], g1["node_failures_28d"]) == (0.0, 1.0)
    # issue 16 §3: how recently the node failed and was repaired (the 40-day-old failure
    # is past the 28-day window); at(120) is 2 h after at(0)
    for g in (g0, g1):
        assert (g["node_failure_hours_since"], g["node_repair_hours_since"]) == (74.0, 50.0)
    store.insert_sample_records(sample(m, node="n2", gpu="G2") for m in range(0, 120, 30))
    features.refresh(store)
    g2 = row(features.gpu_features(store, at(120), at(120)), at(120), "G2")
    assert (g2["node_failure_hours_since"], g2["node_repair_hours_since"]) == (672.0, 672.0)


def test_fleet_relative_and_node_aggregates(store):
    # 5 H100 with 24 h corrected-ECC deltas 0, 2, 4, 6, 40 -> median 4 -> rel = x / 5.
    deltas = [0, 2, 4, 6, 40]
    recs = []
    for i, d in enumerate(deltas):
        node = "n1" if i < 3 else "n2"
        recs += [sample(0, gpu=f"G{i}", node=node, index=i, ecc_corrected_volatile=0),
                 sample(30, gpu=f"G{i}", node=node, index=i, ecc_corrected_volatile=d)]
    # an A100 does not move the H100 median
    recs += [sample(0, gpu="A", node="n3", model="A100", ecc_corrected_volatile=0),
             sample(30, gpu="A", node="n3", model="A100", ecc_corrected_volatile=1000)]
    store.insert_sample_records(recs)
    features.refresh(store)
    tab = features.gpu_features(store, at(60), at(60))
    assert row(tab, at(60), "G4")["ecc_corrected_24h_rel"] == 40 / 5
    assert row(tab, at(60), "G0")["ecc_corrected_24h_rel"] == 0.0
    assert row(tab, at(60), "A")["ecc_corrected_24h_rel"] == 1000 / 1001
    assert row(tab, at(60), "G0")["node_max_ecc_corrected_24h"] == 4.0
    assert row(tab, at(60), "G3")["node_max_ecc_corrected_24h"] == 40.0
    assert row(tab, at(60), "G0")["node_gpus_with_errors_24h"] == 2.0
    assert row(tab, at(60), "G0")["node_gpus"] == 3.0


def _history(store, hours: int) -> None:
    recs = []
    for g in range(3):
        for m in range(0, 60 * hours, 10):
            recs.append(sample(
                m, gpu=f"G{g}", index=g, node=f"n{g % 2}",
                ecc_corrected_volatile=(m // 10) * g % 97,   # with resets
                nvlink_up=[True, (m // 10 + g) % 7 != 0], nvlink_replay=[m, m // 2],
                gpu_temp_c=40.0 + (m % 60) / 6 + g, power_w=200.0 + 10 * g + (m % 30),
                clock_event_reasons=0x20 if m % 50 == 0 else 0,
                pcie_link_width=16 if m % 40 else 8, pcie_link_width_max=16))
    store.insert_sample_records(recs)
    store.insert_events([
        XidEvent(ts=at(m), node="n1", xid=74, message="nvlink", source="sim",
                 gpu_uuid="G1") for m in (100, 350, 700)])


def _same(a, b) -> None:
    assert a.column_names == b.column_names
    for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True):
        for k in x:
            if isinstance(x[k], float):
                assert x[k] == pytest.approx(y[k], nan_ok=True, abs=1e-9), k
            else:
                assert x[k] == y[k], k


def test_incremental_refresh_equals_full_rebuild(tmp_path):
    with Store(tmp_path / "inc.duckdb") as inc, Store(tmp_path / "full.duckdb") as full:
        _history(inc, 14)
        _history(full, 14)
        for minutes in (25, 61, 62, 200, 201, 480, 14 * 60):
            features.refresh(inc, until=at(minutes))
        rollup.refresh(full, full=True)
        a = features.gpu_features(inc, at(60), at(14 * 60))
        b = features.gpu_features(full, at(60), at(14 * 60))
        assert a.num_rows == 3 * 14
        _same(a, b)


def test_latest_matches_grid_at_an_hour_boundary(store):
    _history(store, 10)
    features.refresh(store)
    live = features.latest_features(store, at(600))
    grid = features.gpu_features(store, at(600), at(600))
    assert live.num_rows == 3
    _same(live, grid)
    # without a refresh up to `at`, latest_features rolls the rest up on the fly
    partial = features.latest_features(store, at(455))
    features.refresh(store, until=at(455))
    _same(partial, features.latest_features(store, at(455)))


def test_schema_keys_then_float64_features(store):
    store.insert_sample_records(sample(m) for m in range(0, 60, 10))
    features.refresh(store)
    tab = features.latest_features(store)
    assert tuple(tab.column_names[:5]) == features.KEY_COLUMNS
    assert tab.column_names[5:] == [f.name for f in features.FEATURES]
    assert all(str(tab.schema.field(f.name).type) == "double" for f in features.FEATURES)
    assert all(tab.column(f.name).null_count == 0 for f in features.FEATURES)
    assert tab.column("ts").to_pylist() == [at(50).replace(tzinfo=None)]


def test_stale_gpus_are_left_out(store):
    store.insert_sample_records([sample(0), sample(10, gpu="G1", index=1), sample(50)])
    features.refresh(store)
    assert features.latest_features(store).column("gpu_uuid").to_pylist() == ["G0"]


def nic(minutes: float, node: str = "n1", device: str = "mlx5_0", **kw) -> NicSample:
    base = dict(state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, port=1,
                link_layer="InfiniBand")
    return NicSample(ts=at(minutes), node=node, device=device, **(base | kw))


def test_node_nic_features_count_the_nodes_ports_over_24_hours(store):
    """Issue 16: flaps, link and receive errors and a link trained down, summed over the
    node's ports, the same for every GPU of the node; NaN on a node without NIC ports."""
    for node in ("n1", "n2"):
        store.insert_sample_records(sample(10 * i, gpu=f"{node}-G{g}", node=node, index=g)
                                    for i in range(3 * 6 + 1) for g in range(2))
    store.insert_nic_samples([
        nic(0, symbol_error=0, link_downed=1, port_rcv_errors=5, port_xmit_discards=100,
            link_error_recovery=0),
        nic(60, symbol_error=40, link_downed=1, port_rcv_errors=5, port_xmit_discards=900),
        nic(70, symbol_error=40, link_downed=2, port_rcv_errors=5, state="DOWN",
            phys_state="Polling"),
        nic(80, symbol_error=45, link_downed=2, port_rcv_errors=8, link_error_recovery=3),
        nic(0, device="mlx5_1", local_link_integrity_errors=0), nic(90, device="mlx5_1", rate_gbps=200.0,
                                     local_link_integrity_errors=2),
    ])
    features.refresh(store)
    grid = features.gpu_features(store, at(180), at(180))
    for gpu in ("n1-G0", "n1-G1"):
        r = row(grid, at(180), gpu)
        assert r["node_nic_flaps_24h"] == 1.0  # the DOWN sample and link_downed: one flap
        # 40 + 5 symbol errors, 3 recoveries, 2 integrity errors (from each first reading)
        assert r["node_nic_link_errors_24h"] == 50.0
        assert r["node_nic_rcv_errors_24h"] == 3.0  # discards are congestion: not counted
        assert r["node_nic_rate_ratio_24h"] == 0.5
    r = row(grid, at(180), "n2-G0")
    assert all(math.isnan(r[f]) for f in ("node_nic_flaps_24h", "node_nic_link_errors_24h",
                                          "node_nic_rcv_errors_24h",
                                          "node_nic_rate_ratio_24h"))
    # a day later the window has moved past them; the ports still report, quiet (0 and a
    # ratio of 1, not NaN: NaN is for a node whose ports sent nothing in 24 hours)
    store.insert_sample_records(sample(180 + 25 * 60 - 10 * i, gpu="n1-G0", node="n1")
                                for i in range(3))
    store.insert_nic_samples([nic(180 + 24 * 60, symbol_error=45, link_downed=2,
                                  port_rcv_errors=8, link_error_recovery=3)])
    features.refresh(store)
    late = features.gpu_features(store, at(180) + 25 * H, at(180) + 25 * H)
    r = row(late, at(180) + 25 * H, "n1-G0")
    assert (r["node_nic_flaps_24h"], r["node_nic_link_errors_24h"],
            r["node_nic_rate_ratio_24h"]) == (0.0, 0.0, 1.0)
    # live scoring at the hour boundary reads the same as the grid
    live = features.latest_features(store, at(180))
    assert {k: v for k, v in row(live, at(180), "n1-G0").items() if k.startswith("node_nic")} \
        == {k: v for k, v in row(grid, at(180), "n1-G0").items() if k.startswith("node_nic")}
