from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from fleetcare.pipeline import schema
from fleetcare.pipeline.store import Store, StoreError
from tests.collectors.test_contract import sample


def test_ddl_columns_come_from_the_contract(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    cols = [r[0] for r in store.cursor().execute("DESCRIBE telemetry").fetchall()]
    assert cols == schema.STORED_SAMPLE_COLUMNS
    assert [c for c in schema.SAMPLE_COLUMNS if c not in cols] == list(schema.NVLINK_LISTS)
    types = dict(store.cursor().execute("SELECT column_name, data_type FROM "
                                        "information_schema.columns WHERE table_name = 'telemetry'").fetchall())
    assert types["nvlink_crc_flit_total"] == "BIGINT"
    assert types["nvlink_down_mask"] == "BIGINT"
    assert types["ts"] == "TIMESTAMP"
    assert types["remapped_rows_pending"] == "BOOLEAN"


def test_columnar_and_record_paths_land_the_same_row(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    s = sample()
    store.insert_sample_records([s])
    cols = {"ts": np.array([np.datetime64(s.ts.replace(tzinfo=None), "us")]),
            "node": np.array([s.node], object), "gpu_uuid": np.array(["GPU-other"], object),
            "gpu_index": np.array([s.gpu_index]), "pci_bus_id": np.array([s.pci_bus_id], object),
            "model": np.array([s.model], object), "gpu_temp_c": np.array([s.gpu_temp_c]),
            "ecc_corrected_volatile": np.array([s.ecc_corrected_volatile]),
            "remapped_rows_pending": np.array([s.remapped_rows_pending]),
            "nvlink_up": np.array([s.nvlink_up]), "nvlink_crc_flit": np.array([s.nvlink_crc_flit])}
    assert store.insert_sample_columns(cols) == 1
    rows = store.cursor().execute(
        "SELECT * EXCLUDE (gpu_uuid) FROM telemetry ORDER BY gpu_uuid").fetchall()
    assert rows[0] == rows[1]


def test_transaction_rolls_back_on_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    with pytest.raises(RuntimeError):
        with store.transaction() as cur:
            cur.execute("INSERT INTO meta VALUES ('k', 'v')").fetchall()
            raise RuntimeError("boom")
    assert store.get_meta("k") is None
    with store.transaction() as cur:
        cur.execute("INSERT INTO meta VALUES ('k', 'v')").fetchall()
    assert store.get_meta("k") == "v"


def test_a_second_writer_gets_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = tmp_path / "f.duckdb"
    Store(db).close()
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               "print('ok', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(StoreError, match="one writing process per file"):
            Store(db)
    finally:
        holder.kill()
        holder.wait()


def test_naive_and_aware_timestamps_land_as_utc(tmp_path: Path) -> None:
    store = Store(tmp_path / "f.duckdb")
    aware = dt.datetime(2026, 3, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    store.insert_sample_records([sample(ts=aware)])
    assert store.cursor().execute("SELECT ts FROM telemetry").fetchone()[0] == dt.datetime(2026, 3, 1, 12, 0)


def test_memory_limit_caps_duckdb_and_a_bad_one_says_how_to_fix_it(tmp_path: Path,
                                                                   monkeypatch) -> None:
    from fleetcare.pipeline import store as store_mod

    def limit(s: Store) -> str:
        return s.cursor().execute("SELECT current_setting('memory_limit')").fetchone()[0]

    with Store(tmp_path / "a.duckdb", memory_limit="1GB") as s:
        assert limit(s) in ("953.6 MiB", "1.0 GB", "1000.0 MB")
    monkeypatch.setattr(store_mod, "MEMORY_LIMIT", "512MB")  # what the CLI sets
    with Store(tmp_path / "b.duckdb") as s:
        assert limit(s) in ("488.2 MiB", "512.0 MB")
    with pytest.raises(StoreError, match="FLEETCARE_CLI_DUCKDB_MEMORY"):
        Store(tmp_path / "c.duckdb", memory_limit="lots")
