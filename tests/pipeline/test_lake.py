"""The Parquet lake: layout, atomic files, views that deduplicate by natural key,
compaction, and two ``fleetcare ingest --lake`` workers in one Kafka consumer group,
SIGKILLed at random points and restarted (every record exactly once in the views)."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetcare.pipeline import schema
from fleetcare.pipeline.lake import SCHEMA_FILE, TABLES, LakeWriter, compact, open_lake
from tests.pipeline.test_ingest_worker import (
    DATE,
    DAY,
    GPUS,
    SUMMARY_KEYS,
    T0,
    Producer,
    assert_exactly_once,
    expected,
    make_batch,
    nodes_of,
    rng,  # noqa: F401  (fixture)
    sigkill,
    start_ingest,
    wait_for_progress,
    wait_started,
)

LAKE_VIEWS = {t: f"lake_{t}" for t in ("telemetry", "xid_events", "incidents")}


def write(lake: LakeWriter, nodes: list[str], seqs: range) -> None:
    lake.insert_batches([make_batch(n, s) for s in seqs for n in nodes])
    lake.flush()


def test_layout_by_date_and_hour_one_file_per_partition_per_flush(tmp_path: Path) -> None:
    lake = LakeWriter(tmp_path, worker_id="w1")
    write(lake, ["a"], range(0, 130))  # 04:30 .. 05:34:30
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert files == [
        "incidents/_schema.parquet",
        f"incidents/date={DATE}/hour=04/w1-00000005.parquet",
        f"incidents/date={DATE}/hour=05/w1-00000006.parquet",
        "nic_telemetry/_schema.parquet",
        "quarantine/_schema.parquet",
        "telemetry/_schema.parquet",
        f"telemetry/date={DATE}/hour=04/w1-00000001.parquet",
        f"telemetry/date={DATE}/hour=05/w1-00000002.parquet",
        "xid_events/_schema.parquet",
        f"xid_events/date={DATE}/hour=04/w1-00000003.parquet",
        f"xid_events/date={DATE}/hour=05/w1-00000004.parquet",
    ]
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary file left behind
    t = pq.read_table(tmp_path / f"telemetry/date={DATE}/hour=04/w1-00000001.parquet")
    assert t.schema == schema.SAMPLE_SCHEMA and t.num_rows == 60 * GPUS
    assert lake.pending_rows == 0 and lake.files_written == 6


def test_views_hide_duplicates_from_redelivery(tmp_path: Path) -> None:
    nodes = ["a", "b"]
    w1 = LakeWriter(tmp_path, worker_id="w1")
    write(w1, nodes, range(0, 60))
    # a crash after the rename, before the commit: another worker writes 40..59 again
    w2 = LakeWriter(tmp_path, worker_id="w2")
    write(w2, nodes, range(40, 80))
    con = open_lake(tmp_path)
    raw = con.execute("SELECT count(*) FROM lake_telemetry_raw").fetchone()[0]
    assert raw == 2 * (60 + 40) * GPUS
    assert_exactly_once(con, expected(nodes, 80), LAKE_VIEWS)
    # rows come back exactly as written (the contract's columns and types)
    row = con.execute("SELECT ts, ecc_corrected_volatile, gpu_temp_c FROM lake_telemetry "
                      "WHERE gpu_uuid = 'GPU-a-1' AND ecc_corrected_volatile = 45").fetchone()
    assert row == ((T0 + dt.timedelta(minutes=22, seconds=30)).replace(tzinfo=None), 45, 55.0)


def test_quarantine_is_kept_with_reason_and_raw_bytes(tmp_path: Path) -> None:
    lake = LakeWriter(tmp_path, worker_id="w1")
    lake.quarantine("fleetcare.telemetry/0@7", "not a fleetcare batch", b"\xff junk",
                    received_at=dt.datetime(2026, 2, 3, 10, 15, tzinfo=dt.UTC), code="undecodable")
    assert lake.pending_rows == 1
    lake.flush()
    assert (tmp_path / "quarantine/date=2026-02-03/hour=10/w1-00000001.parquet").exists()
    rows = open_lake(tmp_path).execute("SELECT * FROM lake_quarantine").fetchall()
    assert rows == [(dt.datetime(2026, 2, 3, 10, 15), "fleetcare.telemetry/0@7",
                     "not a fleetcare batch", b"\xff junk", "undecodable")]
    # redelivered after a crash (another worker, an hour later): still one record
    again = LakeWriter(tmp_path, worker_id="w2")
    again.quarantine("fleetcare.telemetry/0@7", "not a fleetcare batch", b"\xff junk",
                     received_at=dt.datetime(2026, 2, 3, 11, 5, tzinfo=dt.UTC), code="undecodable")
    again.flush()
    con = open_lake(tmp_path)
    assert con.execute("SELECT count(*) FROM lake_quarantine_raw").fetchone() == (2,)
    assert con.execute("SELECT count(*) FROM lake_quarantine").fetchone() == (1,)


def test_an_empty_lake_has_typed_empty_views(tmp_path: Path) -> None:
    LakeWriter(tmp_path)
    con = open_lake(tmp_path)
    for name in TABLES:
        assert con.execute(f"SELECT count(*) FROM lake_{name}").fetchone() == (0,)
    cols = [r[0] for r in con.execute("DESCRIBE lake_telemetry").fetchall()]
    assert cols == schema.SAMPLE_COLUMNS
    # a lake written by others, without schema files (read-only copy): still typed
    (tmp_path / "other").mkdir()
    con = open_lake(tmp_path / "other")
    assert [r[0] for r in con.execute("DESCRIBE lake_xid_events").fetchall()] == \
        schema.EVENT_COLUMNS
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_lake(tmp_path / "missing")


def test_views_see_new_files_without_reopening(tmp_path: Path) -> None:
    lake = LakeWriter(tmp_path, worker_id="w1")
    con = open_lake(tmp_path)
    assert con.execute("SELECT count(*) FROM lake_telemetry").fetchone() == (0,)
    write(lake, ["a"], range(3))
    assert con.execute("SELECT count(*) FROM lake_telemetry").fetchone() == (3 * GPUS,)


def test_worker_ids_must_be_file_name_safe(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="worker id 'a/b'"):
        LakeWriter(tmp_path, worker_id="a/b")


def test_compaction_merges_old_partitions_and_drops_duplicates(tmp_path: Path) -> None:
    nodes = ["a", "b", "c"]
    write(LakeWriter(tmp_path, worker_id="w1"), nodes, range(0, 60))
    write(LakeWriter(tmp_path, worker_id="w2"), nodes, range(30, 100))
    now = DAY + dt.timedelta(hours=7)
    result = compact(tmp_path, older_than=dt.timedelta(hours=2), now=now)
    # 04:00 partitions of three tables were old enough and had two files; 05:00 not yet
    assert (result.partitions, result.files_in, result.files_out) == (3, 6, 3)
    telemetry_04 = list((tmp_path / f"telemetry/date={DATE}/hour=04").glob("*.parquet"))
    assert len(telemetry_04) == 1 and telemetry_04[0].name.startswith("compact-")
    assert [p.name for p in (tmp_path / f"telemetry/date={DATE}/hour=05").glob("*.parquet")
            ] == ["w2-00000002.parquet"]
    assert pq.read_table(telemetry_04[0]).schema == schema.SAMPLE_SCHEMA
    con = open_lake(tmp_path)
    assert_exactly_once(con, expected(nodes, 100), LAKE_VIEWS)
    assert (tmp_path / "telemetry" / SCHEMA_FILE).exists()


# -- the real broker: two workers in one group, SIGKILL five times -----------------------------------
@pytest.mark.kafka
@pytest.mark.slow
def test_two_lake_workers_sigkill_five_times_every_record_exactly_once(
        kafka_broker: str, tmp_path: Path, rng: random.Random) -> None:  # noqa: F811
    prefix = f"test-{uuid.uuid4().hex[:10]}."
    nodes, seqs = nodes_of(12), 150
    group = f"{prefix}lake"
    lake = tmp_path / "lake"

    def args(i: int) -> list[str]:
        return ["--bus", kafka_broker, "--lake", str(lake), "--topic-prefix", prefix,
                "--group", group, "--instance-id", f"lake-{i}", "--batch", "40",
                "--flush-interval", "0.3"]

    log = tmp_path / "ingest.log"
    producer = Producer(kafka_broker, prefix, tmp_path / "spool", nodes, seqs, seconds=10)
    producer.start()
    procs = [start_ingest(*args(i), log=log) for i in range(2)]
    progress = 0
    try:
        for _ in range(5):
            progress = wait_for_progress(kafka_broker, group, progress, procs)
            time.sleep(rng.uniform(0.0, 0.6))
            victim = rng.randrange(2)
            sigkill(procs[victim])
            procs[victim] = start_ingest(*args(victim), log=log)
        producer.finish()
        wait_started(log, procs)  # the restarted victim too, not still importing
        for p in procs:  # SIGTERM: finish the batch, write, commit, exit 0
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
            assert p.returncode == 0
        procs = [start_ingest(*args(i), "--exit-when-idle", "3", "--json", log=log)
                 for i in range(2)]
        summaries = []
        for p in procs:
            out, _ = p.communicate(timeout=90)
            assert p.returncode == 0, log.read_text()[-3000:]
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(set(s) == SUMMARY_KEYS and s["reason"] == "idle" for s in summaries)
    con = open_lake(lake)
    assert_exactly_once(con, expected(nodes, seqs), LAKE_VIEWS)
    writers = {p.name.rsplit("-", 1)[0] for p in (lake / "telemetry").rglob("date=*/*/*.parquet")}
    assert len(writers) >= 2  # each process wrote its own files


def test_two_workers_creating_one_lake_at_once_do_not_collide(tmp_path: Path, monkeypatch) -> None:
    """Both see no schema file and write it; the second's rename lands between the
    first's write and rename (the race two ingest workers started together hit)."""
    from fleetcare.pipeline import lake as lake_mod

    real_replace = os.replace
    raced: list[Path] = []

    def replace(src, dst):  # the other worker gets in first, once per file
        if Path(dst).name == SCHEMA_FILE and Path(dst) not in raced:
            raced.append(Path(dst))
            lake_mod.write_atomic(pa.table({"x": [1]}), Path(dst))
        real_replace(src, dst)

    monkeypatch.setattr(lake_mod.os, "replace", replace)
    lake_mod.ensure_layout(tmp_path)
    assert len(raced) == len(TABLES)
    for t in TABLES.values():
        assert pq.read_schema(tmp_path / t.name / SCHEMA_FILE) == t.schema
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_restarted_worker_with_the_same_id_never_overwrites_its_files(tmp_path: Path) -> None:
    """A fixed --worker-id (a pod name) restarts its file sequence at 1: the files of the
    previous run, whose offsets are committed, must stay."""
    for run in range(2):
        lake = LakeWriter(tmp_path, worker_id="pod-0")
        write(lake, ["a"], range(run * 10, run * 10 + 10))
    con = open_lake(tmp_path)
    assert con.execute("SELECT count(*) FROM lake_telemetry").fetchone()[0] == 20 * GPUS
    names = sorted(p.name for p in (tmp_path / "telemetry").rglob("pod-0-*.parquet"))
    assert names == ["pod-0-00000001.parquet", "pod-0-00000002.parquet"]


@pytest.mark.parametrize("layout", ["one hour", "ascending", "turning", "interleaved"])
def test_rows_go_to_their_hour_in_table_order(layout: str) -> None:
    """Each row lands in the partition of its hour, the rows of an hour in table order,
    however the hours are laid out (runs are sliced, many runs sorted first)."""
    from fleetcare.pipeline import lake

    draw = random.Random(layout)
    base = dt.datetime(2026, 2, 28, 22, 0)
    minutes = {"one hour": lambda i: i % 60, "ascending": lambda i: i // 3,
               "turning": lambda i: 55 + (i % 10) + (i // 50) * 5,
               "interleaved": lambda i: draw.randrange(0, 300)}[layout]
    ts = [base + dt.timedelta(minutes=minutes(i), seconds=i % 60) for i in range(600)]
    table = pa.table({"ts": pa.array(ts, pa.timestamp("us")), "row": list(range(600))})
    parts = list(lake._partitions(table, "ts"))
    names = [name for name, _ in parts]
    assert names == sorted(set(names))
    got = {name: rows.column("row").to_pylist() for name, rows in parts}
    want: dict[str, list[int]] = {}
    for i, t in enumerate(ts):
        want.setdefault(f"date={t:%Y-%m-%d}/hour={t:%H}", []).append(i)
    assert got == want
    if layout == "interleaved":
        assert sum(1 for i in range(1, 600) if ts[i].hour != ts[i - 1].hour) > lake._MAX_RUNS
    assert list(lake._partitions(table.slice(0, 0), "ts")) == []
