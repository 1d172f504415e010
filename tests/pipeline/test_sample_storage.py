"""How GPU samples are stored (issue 15 §4): the NVLink lists summarised in each row of
``telemetry`` and kept whole in ``telemetry_nvlink`` only for a sample with a link down or
a counter not zero. Every sample reads back exactly as it was sent (``latest_samples``),
a database of the older layout is converted on open, and the rollups it gives equal
those of the lists (flaps, links down, counter increases)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pytest

from fleetcare.pipeline import features, rollup, schema
from fleetcare.pipeline.store import Store, StoreError, records_to_arrow
from tests.collectors.test_contract import sample

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
SHAPES = {  # NVLink lists as agents send them
    "regular": dict(nvlink_up=[True] * 18, nvlink_crc_flit=[0] * 18, nvlink_crc_data=[0] * 18,
                    nvlink_replay=[0] * 18, nvlink_recovery=[0] * 18),
    "link_down": dict(nvlink_up=[True] * 5 + [False] + [True] * 12, nvlink_crc_flit=[0] * 18,
                      nvlink_crc_data=[0] * 18, nvlink_replay=[0] * 18,
                      nvlink_recovery=[0] * 18),
    "counter": dict(nvlink_up=[True] * 4, nvlink_crc_flit=[0, 7, 0, 2], nvlink_crc_data=[0] * 4,
                    nvlink_replay=[0] * 4, nvlink_recovery=[0, 0, 0, 1]),
    "no_nvlink": dict(nvlink_up=None, nvlink_crc_flit=None, nvlink_crc_data=None,
                      nvlink_replay=None, nvlink_recovery=None),
    "empty": dict(nvlink_up=[], nvlink_crc_flit=[], nvlink_crc_data=[], nvlink_replay=[],
                  nvlink_recovery=[]),
    "up_only": dict(nvlink_up=[True, True], nvlink_crc_flit=None, nvlink_crc_data=None,
                    nvlink_replay=None, nvlink_recovery=None),
    "counters_only": dict(nvlink_up=None, nvlink_crc_flit=[0, 0, 0], nvlink_crc_data=None,
                          nvlink_replay=[0, 0, 0], nvlink_recovery=None),
    "ragged": dict(nvlink_up=[True] * 3, nvlink_crc_flit=[0] * 2, nvlink_crc_data=None,
                   nvlink_replay=None, nvlink_recovery=None),
}


def _samples() -> list:
    return [sample(gpu_uuid=f"GPU-{name}", gpu_index=i, ts=T0, **kw)
            for i, (name, kw) in enumerate(SHAPES.items())]


def test_every_sample_reads_back_as_it_was_sent(tmp_path: Path) -> None:
    with Store(tmp_path / "f.duckdb") as store:
        sent = _samples()
        assert store.insert_sample_records(sent) == len(sent)
        assert store.insert_sample_records(sent) == 0  # idempotent, the lists too
        cur = store.cursor()
        got = {r["gpu_uuid"]: r for r in store.raw.latest_samples(cur)}
        for s in sent:
            row = got[s.gpu_uuid]
            for c in schema.NVLINK_LISTS:
                assert row[c] == getattr(s, c), (s.gpu_uuid, c)
        kept = {r[0] for r in cur.execute("SELECT gpu_uuid FROM telemetry_nvlink").fetchall()}
        assert kept == {"GPU-link_down", "GPU-counter", "GPU-ragged"}  # only where needed
        totals = dict(cur.execute("SELECT gpu_uuid, nvlink_crc_flit_total FROM telemetry"
                                  ).fetchall())
        assert totals["GPU-counter"] == 9 and totals["GPU-regular"] == 0
        assert totals["GPU-no_nvlink"] is None and totals["GPU-empty"] is None
        masks = dict(cur.execute("SELECT gpu_uuid, nvlink_down_mask FROM telemetry").fetchall())
        assert masks["GPU-link_down"] == 1 << 5 and masks["GPU-regular"] == 0
        assert masks["GPU-no_nvlink"] is None


def test_lists_rebuilt_in_python_equal_those_rebuilt_in_sql(tmp_path: Path) -> None:
    """``contract_sample`` of ``contract_parts_sql``'s rows (the node pages' memory) gives
    each sample as ``contract_samples_sql`` does, and as it was sent: every list shape."""
    with Store(tmp_path / "f.duckdb") as store:
        sent = _samples()
        store.insert_sample_records(sent)
        cur = store.cursor()
        since = "TIMESTAMP '2026-03-01 00:00:00'"
        by_sql = {r[schema.SAMPLE_COLUMNS.index("gpu_uuid")]: dict(
            zip(schema.SAMPLE_COLUMNS, r, strict=True)) for r in cur.execute(
            schema.contract_samples_sql(since=since)).fetchall()}
        parts = cur.execute(schema.contract_parts_sql("TRUE", since=since)).fetchall()
        assert len(parts) == len(sent) == len(by_sql)
        for row in parts:
            got = schema.contract_sample(row)
            assert got == by_sql[got["gpu_uuid"]], got["gpu_uuid"]
        for s in sent:
            for c in schema.NVLINK_LISTS:
                assert by_sql[s.gpu_uuid][c] == getattr(s, c), (s.gpu_uuid, c)

def _old_layout(path: Path, samples: list) -> None:
    """A database as fleetcare wrote it before issue 15 §4: the lists in every row."""
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE telemetry ({schema.columns_ddl(schema.GpuSample)})")
    con.register("s", records_to_arrow(samples, schema.SAMPLE_SCHEMA))
    con.execute("INSERT INTO telemetry SELECT * FROM s")
    con.close()


def _flapping() -> list:
    """One GPU over three hours: a link goes down and comes back, counters grow."""
    out = []
    for k in range(36):
        up = [True] * 18
        if k % 7 in (3, 4):
            up[k % 18] = False
        out.append(sample(gpu_uuid="GPU-f", gpu_index=0, ts=T0 + dt.timedelta(minutes=5 * k),
                          nvlink_up=up, nvlink_crc_flit=[k // 5] * 18,
                          nvlink_crc_data=[0] * 18, nvlink_replay=[k // 9] * 18,
                          nvlink_recovery=[0] * 18))
    return out + _samples()


def test_an_older_database_is_converted_on_open_and_rolls_up_the_same(tmp_path: Path) -> None:
    sent = _flapping()
    _old_layout(tmp_path / "old.duckdb", sent)
    with pytest.raises(StoreError, match="open it once writable"):
        Store(tmp_path / "old.duckdb", read_only=True)
    with Store(tmp_path / "old.duckdb") as old, Store(tmp_path / "new.duckdb") as new:
        new.insert_sample_records(sent)
        for store in (old, new):
            features.refresh(store)
        q = (f"SELECT * EXCLUDE (gpu_uuid) FROM {rollup.TABLE} ORDER BY gpu_uuid, hour")
        a, b = old.cursor().execute(q).fetchall(), new.cursor().execute(q).fetchall()
        assert a == b
        flaps = new.cursor().execute(f"SELECT sum(nvlink_flaps) FROM {rollup.TABLE}"
                                     ).fetchall()[0][0]
        ups = [s.nvlink_up for s in sent[:36]]
        assert flaps == sum(a and not b for p, c in zip(ups, ups[1:], strict=False)
                            for a, b in zip(p, c, strict=True))
        for store in (old, new):
            got = {r["gpu_uuid"]: r for r in store.raw.latest_samples(store.cursor())}
            assert got["GPU-f"]["nvlink_replay"] == sent[35].nvlink_replay
            assert got["GPU-ragged"]["nvlink_crc_flit"] == [0, 0]


def test_hourly_rows_of_the_older_layout_keep_their_link_state(tmp_path: Path) -> None:
    """A refresh after the conversion compares with the state the old hourly rows held:
    a link down at the last rolled sample and up again after is no flap; one that goes
    down after is."""
    sent = _flapping()
    path = tmp_path / "f.duckdb"
    with Store(path) as store:
        store.insert_sample_records(sent[:20])
        features.refresh(store)
        cur = store.cursor()
        rows = cur.execute(f"SELECT * FROM {rollup.TABLE}").fetchall()
        cols = [d[0] for d in cur.description]
    con = duckdb.connect(str(path))  # rewrite the hourly state in the older layout
    con.execute(f"ALTER TABLE {rollup.TABLE} ADD COLUMN nvlink_up_last BOOLEAN[]")
    con.execute(f"UPDATE {rollup.TABLE} SET nvlink_up_last = list_transform(range("
                "nvlink_up_links_last), lambda i: (nvlink_down_mask_last >> i) & 1 = 0)")
    con.execute(f"ALTER TABLE {rollup.TABLE} DROP COLUMN nvlink_down_mask_last")
    con.execute(f"ALTER TABLE {rollup.TABLE} DROP COLUMN nvlink_up_links_last")
    con.close()
    with Store(path) as store, Store(tmp_path / "ref.duckdb") as ref:
        cur = store.cursor()
        rollup.ensure_tables(cur)
        assert cur.execute(f"SELECT * FROM {rollup.TABLE}").fetchall() == rows
        assert [d[0] for d in cur.description] == cols
        store.insert_sample_records(sent[20:])
        ref.insert_sample_records(sent)
        for s in (store, ref):
            features.refresh(s)
        q = f"SELECT * EXCLUDE (gpu_uuid) FROM {rollup.TABLE} ORDER BY gpu_uuid, hour"
        assert store.cursor().execute(q).fetchall() == ref.cursor().execute(q).fetchall()
