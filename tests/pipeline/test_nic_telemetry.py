"""NIC samples: agent -> embedded bus -> ingest -> nic_telemetry exactly once, quarantine of
bad ones with a reason, the lake, and the hourly flap rollup."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import msgspec

from fleetcare.collectors.agent import Agent
from fleetcare.collectors.contract import Batch, NicSample, encode_batch
from fleetcare.collectors.infiniband import InfinibandBackend
from fleetcare.collectors.transport import TELEMETRY_TOPIC, Record
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer
from fleetcare.pipeline import nic_rollup
from fleetcare.pipeline.ingest import Ingestor
from fleetcare.pipeline.lake import LakeWriter, open_lake
from fleetcare.pipeline.store import Store
from fleetcare.pipeline.validate import Validator

TREE = Path(__file__).parents[1] / "collectors" / "fixtures" / "infiniband" / "node_a"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
AT_T0 = Validator(clock=lambda: T0.timestamp() + 3600)


class Redeliver:
    """A consumer that hands out the same records twice (a crash before the commit)."""

    def __init__(self, records: list[Record]) -> None:
        self.batches = [records, records]

    def poll(self, timeout_s: float, max_records: int = 10_000) -> list[Record]:
        return self.batches.pop(0) if self.batches else []

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_agent_tick_to_nic_telemetry_exactly_once(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path / "bus")
    agent = Agent([InfinibandBackend("gpu-07", TREE)], bus, node="gpu-07")
    agent.tick(T0)
    agent.tick(T0 + dt.timedelta(seconds=10))
    bus.flush()
    records = EmbeddedConsumer(tmp_path / "bus").poll(0)
    store = Store(tmp_path / "f.duckdb")
    ing = Ingestor(store, Redeliver(records), validator=AT_T0)
    r = ing.drain()
    assert (r.records, r.quarantined, r.nics) == (4, 0, 8)  # the redelivery adds nothing
    rows = store.cursor().execute(
        "SELECT device, port, ts, state, link_downed, saturated FROM nic_telemetry "
        "ORDER BY ts, device").fetchall()
    assert len(rows) == 8
    assert rows[2] == ("mlx5_1", 1, T0.replace(tzinfo=None), "ACTIVE", 255,
                       ["link_downed", "port_xmit_discards", "excessive_buffer_overrun_errors"])
    assert ing.counters["nics"] == 8


def nic(minute: int, **kw) -> NicSample:
    base = dict(ts=T0 + dt.timedelta(minutes=minute), node="gpu-07", device="mlx5_0", port=1,
                link_layer="InfiniBand", state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0)
    return NicSample(**(base | kw))


def message(*nics: NicSample, fmt: str = "json") -> Record:
    batch = Batch(schema_version=2, node="gpu-07", seq=1, sent_at=T0, nics=list(nics))
    return Record(TELEMETRY_TOPIC, "gpu-07", encode_batch(batch, fmt), 0, 0)


def test_a_bad_nic_sample_is_quarantined_with_its_reason(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    good = nic(0, link_downed=3)
    bad = nic(1, link_downed=300, port=999)  # an 8-bit counter cannot read 300
    result = AT_T0.validate([message(good, bad)])
    assert [len(b.nics) for b in result.batches] == [1]
    [rej] = result.rejections
    assert rej.code == "nic_port_out_of_range"
    assert rej.source == f"{TELEMETRY_TOPIC}/0@0#nics[1]"
    assert rej.reason == ("nics[1].port = 999 is outside 0..255; nics[1].link_downed = 300 is "
                          "above 255, the most a 8-bit port counter holds")
    assert msgspec.json.decode(rej.raw, type=NicSample) == bad  # the record's own bytes
    # one that does not even decode (a string port) costs only itself
    raw = message(good).value.replace(b'"port":1', b'"port":"one"')
    r = Ingestor(store, Redeliver([Record(TELEMETRY_TOPIC, "gpu-07", raw, 0, 5)]),
                 validator=AT_T0).run_once()
    assert (r.quarantined, r.nics) == (1, 0)
    assert store.cursor().execute("SELECT code, reason FROM quarantine").fetchall() == [
        ("wrong_type", "nics[0].port = 'one': Expected `int`, got `str`")]


def test_hw_counter_lists_must_pair_and_saturated_names_must_be_counters() -> None:
    bad = nic(0, hw_counter_names=["out_of_buffer"], hw_counter_values=[1, 2],
              saturated=["port_xmit_wait"])
    [rej] = AT_T0.validate([message(bad, fmt="msgpack")]).rejections
    assert rej.code == "nic_unknown_counter"
    assert "saturated names 'port_xmit_wait'" in rej.reason
    assert "hw_counter_names has 1 entries and hw_counter_values 2" in rej.reason


def test_the_lake_keeps_nic_samples_once(tmp_path: Path) -> None:
    lake = LakeWriter(tmp_path / "lake", worker_id="w1")
    batch = Batch(schema_version=2, node="gpu-07", seq=1, sent_at=T0, nics=[nic(0), nic(1)])
    lake.insert_batches([batch])
    lake.insert_batches([batch])  # redelivered
    lake.flush()
    assert lake.nic_rows_added == 4
    con = open_lake(tmp_path / "lake")
    assert con.execute("SELECT count(*) FROM lake_nic_telemetry").fetchone() == (2,)


def test_flap_rollup_on_a_crafted_sequence(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    seq = [
        # hour 12: down seen both ways (state + counter) = 1 flap; then a flap shorter
        # than a tick (ACTIVE on both sides, counter +2) = 2 flaps
        nic(0, link_downed=5, symbol_error=100),
        nic(10, state="DOWN", phys_state="Polling", link_downed=6, symbol_error=100),
        nic(15, state=None, phys_state=None, link_downed=None, symbol_error=None),
        nic(20, link_downed=6, symbol_error=180),
        nic(30, link_downed=8, symbol_error=None),    # a null is skipped, not a reset
        nic(40, link_downed=8, symbol_error=200),     # +20 against the last non-null (180)
        # hour 13: a counter reset (perfquery -R / reload): 8 -> 1 counts 1
        nic(60, link_downed=1, symbol_error=3),
        # then link_downed saturates: 1 -> 255 counts 254, 255 -> 255 counts 0
        nic(70, link_downed=255, symbol_error=3),
        nic(80, link_downed=255, symbol_error=3),
        # another port, untouched
        nic(0, device="mlx5_1", link_downed=0),
        nic(90, device="mlx5_1", link_downed=0, rate_gbps=200.0),
    ]
    store.insert_nic_samples(seq)
    assert store.insert_nic_samples(seq) == 0  # natural key: exactly once
    assert nic_rollup.refresh(store) == 4  # two ports x hours 12 and 13
    rows = {(r["device"], r["hour"].hour): r for r in nic_rollup.hourly(store)}
    h12, h13 = rows[("mlx5_0", 12)], rows[("mlx5_0", 13)]
    assert (h12["samples"], h12["downs"], h12["link_downed_inc"], h12["flaps"],
            h12["state_changes"], h12["symbol_error_inc"], h12["saturated"]) == \
        (6, 1, 3, 3, 2, 100, False)
    assert (h13["samples"], h13["downs"], h13["link_downed_inc"], h13["flaps"],
            h13["symbol_error_inc"], h13["saturated"], h13["last_state"]) == \
        (3, 0, 255, 255, 3, True, "ACTIVE")
    other = rows[("mlx5_1", 12)]
    assert (other["flaps"], other["min_rate_gbps"], other["max_rate_gbps"]) == (0, 400.0, 400.0)
    assert rows[("mlx5_1", 13)]["min_rate_gbps"] == 200.0


def test_incremental_refresh_with_late_samples_equals_a_full_rebuild(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    early = [nic(m, link_downed=m // 10) for m in range(0, 60, 10)]      # hour 12
    store.insert_nic_samples(early)
    assert nic_rollup.refresh(store) == 1
    later = [nic(m, link_downed=9, state="DOWN") for m in (70, 130)]     # hours 13, 14
    late = [nic(55, device="mlx5_1", link_downed=1)]                     # back in hour 12
    store.insert_nic_samples(later)
    store.insert_nic_samples(late)
    assert nic_rollup.refresh(store) == 4  # hour 12 (late data) on: 12 x2 ports, 13, 14
    incremental = nic_rollup.hourly(store)
    nic_rollup.refresh(store, full=True)
    assert nic_rollup.hourly(store) == incremental
    h13 = [r for r in incremental if r["device"] == "mlx5_0" and r["hour"].hour == 13][0]
    assert (h13["downs"], h13["link_downed_inc"], h13["flaps"]) == (1, 4, 4)  # 5 -> 9


def test_retention_prunes_raw_nic_samples_the_rollup_no_longer_needs(tmp_path: Path) -> None:
    from fleetcare.pipeline import retention

    store = Store(tmp_path / "f.duckdb")
    day = [nic(m, link_downed=m // 600) for m in range(0, 3 * 24 * 60, 60)]  # 3 days hourly
    store.insert_nic_samples(day)
    nic_rollup.refresh(store)
    before = nic_rollup.hourly(store)
    last = T0.replace(tzinfo=None) + dt.timedelta(hours=71)
    assert nic_rollup.prune(store, last, dry_run=True) == 47  # kept: a day before the last hour
    assert nic_rollup.prune(store, last) == 47
    assert store.cursor().execute("SELECT min(ts) FROM nic_telemetry").fetchone() == (
        last - nic_rollup.LOOKBACK,)
    nic_rollup.refresh(store)
    assert nic_rollup.hourly(store) == before  # the rollup keeps every hour
    # retention cuts NIC samples with the GPU cut: none before the GPU rollup ran
    r = retention.apply(store, dt.timedelta(hours=12), now=T0 + dt.timedelta(days=3))
    assert (r.cutoff, r.nic_deleted) == (None, 0)
    from fleetcare.pipeline import features
    from tests.collectors.test_contract import sample

    store.insert_sample_records([sample(node="gpu-07", ts=T0 + dt.timedelta(hours=h))
                                 for h in range(72)])
    features.refresh(store)
    r = retention.apply(store, dt.timedelta(hours=12), now=T0 + dt.timedelta(days=3))
    assert r.cutoff == T0.replace(tzinfo=None) + dt.timedelta(hours=60)
    assert r.nic_deleted == 0  # the NIC cut stops a LOOKBACK before the newest NIC hour
    r = retention.apply(store, dt.timedelta(hours=1), now=T0 + dt.timedelta(days=3))
    assert r.nic_deleted == 0
    # a day later: the NIC cut follows the rollup (a LOOKBACK before its newest hour)
    store.insert_nic_samples([nic(m, link_downed=7) for m in range(72 * 60, 96 * 60, 60)])
    store.insert_sample_records([sample(node="gpu-07", ts=T0 + dt.timedelta(hours=h))
                                 for h in range(72, 96)])
    features.refresh(store)
    r = retention.apply(store, dt.timedelta(hours=12), now=T0 + dt.timedelta(days=4))
    assert r.cutoff == T0.replace(tzinfo=None) + dt.timedelta(hours=84)
    assert r.nic_deleted == 24  # hours 47..70; kept from 71 = 95 - LOOKBACK
