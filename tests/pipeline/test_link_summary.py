"""``link_summary.summarise`` (numpy) gives the rows ``schema.stored_samples_sql`` and
``schema.IRREGULAR_SQL`` (DuckDB, the definition) give: for null lists, empty ones, null
entries, links down past the mask, lists of different lengths, counters whose total
passes int64, and chunked columns."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcare.pipeline import schema
from fleetcare.pipeline.link_summary import summarise
from fleetcare.pipeline.store import records_to_arrow
from tests.collectors.test_contract import sample
from tests.property import DERANDOMIZE, examples

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
BIG = [2**63 - 1, 2**62, -(2**63), 2**58, -(2**62), 7, 0, -1]


@st.composite
def lists(draw: st.DrawFn) -> dict[str, Any]:
    width = draw(st.sampled_from([18, 18, 4, 0, 1, 63, 70]))
    out: dict[str, Any] = {}
    for name in schema.NVLINK_LISTS:
        shape = draw(st.integers(0, 12))
        if shape == 0:
            out[name] = None
            continue
        n = width if shape > 1 else draw(st.integers(0, 20))  # sometimes ragged
        if name == "nvlink_up":
            item = st.one_of(st.just(True), st.just(True), st.booleans(), st.none())
        else:
            item = st.one_of(st.just(0), st.just(0), st.integers(0, 300),
                             st.sampled_from(BIG), st.none())
        out[name] = draw(st.lists(item, min_size=n, max_size=n))
    return out


def table(kinds: list[dict[str, Any]], chunks: int = 1) -> pa.Table:
    t = records_to_arrow([sample(gpu_uuid=f"GPU-{i}", gpu_index=i % 8, ts=T0, **kw)
                          for i, kw in enumerate(kinds)], schema.SAMPLE_SCHEMA)
    if chunks > 1 and t.num_rows > 1:  # the same rows in several record batches
        step = max(1, t.num_rows // chunks)
        t = pa.concat_tables([t.slice(i, step) for i in range(0, t.num_rows, step)])
    return t


def by_sql(t: pa.Table) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    con = duckdb.connect()
    con.register("t", t)
    stored = con.execute(f"{schema.stored_samples_sql('t')} ORDER BY gpu_uuid").fetchall()
    kept = con.execute(f"SELECT gpu_uuid, ts, {', '.join(schema.NVLINK_LISTS)} FROM t "
                       f"WHERE {schema.IRREGULAR_SQL} ORDER BY gpu_uuid").fetchall()
    return stored, kept


def by_numpy(t: pa.Table) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    got = summarise(t)
    assert got.stored.column_names == schema.STORED_SAMPLE_COLUMNS
    con = duckdb.connect()
    con.register("s", got.stored)
    con.register("k", got.lists)
    return (con.execute("SELECT * FROM s ORDER BY gpu_uuid").fetchall(),
            con.execute("SELECT * FROM k ORDER BY gpu_uuid").fetchall())


@settings(max_examples=examples(120), deadline=None, database=None, derandomize=DERANDOMIZE)
@given(st.lists(lists(), min_size=1, max_size=12), st.integers(1, 3))
def test_the_numpy_summary_is_what_the_sql_gives(kinds: list[dict[str, Any]],
                                                 chunks: int) -> None:
    t = table(kinds, chunks)
    assert by_numpy(t) == by_sql(t)


def test_the_edges_one_by_one() -> None:
    up = [True] * 70
    up[3] = up[61] = up[62] = up[69] = False  # links past the mask are not in it
    cases = [
        dict(nvlink_up=up, nvlink_crc_flit=[2**63 - 1, 1]),  # the total passes int64: null
        dict(nvlink_up=[None, True], nvlink_crc_data=[None, None]),  # only null entries
        dict(nvlink_up=[], nvlink_crc_flit=[], nvlink_replay=[]),  # empty: totals null
        dict(nvlink_recovery=[-(2**63), 2**63 - 1, 1]),  # passes and comes back: exact
        dict(nvlink_up=[True] * 18, nvlink_crc_flit=[0] * 18),  # regular
        dict(nvlink_up=None, nvlink_crc_flit=None),
    ]
    t = table(cases)
    assert by_numpy(t) == by_sql(t)
    got = summarise(t)
    assert got.stored.column("nvlink_down_mask")[0].as_py() == (1 << 3) | (1 << 61)
    assert got.stored.column("nvlink_crc_flit_total")[0].as_py() is None
    assert got.stored.column("nvlink_recovery_total")[3].as_py() == 0
    assert got.lists.column("gpu_uuid").to_pylist() == ["GPU-0", "GPU-1", "GPU-3"]


def test_no_samples() -> None:
    got = summarise(schema.SAMPLE_SCHEMA.empty_table())
    assert got.stored.num_rows == 0 and got.lists.num_rows == 0
    assert got.stored.column_names == schema.STORED_SAMPLE_COLUMNS


def test_a_slice_of_one_chunk_reads_its_own_rows() -> None:
    """A column of one sliced chunk (offsets not at zero) is read from its slice."""
    t = table([dict(nvlink_up=[True, False, None], nvlink_crc_flit=[0, 5, None]),
               dict(nvlink_up=[True] * 4, nvlink_crc_flit=[0] * 4),
               dict(nvlink_up=None, nvlink_crc_flit=[2**63 - 1, 1]),
               dict(nvlink_up=[False] * 3, nvlink_crc_flit=[1, 2, 3])])
    for lo in range(4):
        for hi in range(lo + 1, 5):
            part = t.slice(lo, hi - lo)
            assert by_numpy(part) == by_sql(part), (lo, hi)
