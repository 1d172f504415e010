"""Embedded ingest vs DuckDB's own bulk insert of the same Arrow table (simulated data).

The ceiling is DuckDB inserting the samples as the ``telemetry`` table stores them
(``INSERT INTO telemetry SELECT <stored columns> FROM arrow_table`` on a fresh database:
the NVLink lists summarised per row, no idempotency check, no per-link detail table).
fleetcare's path converts the simulator's columns to Arrow and inserts with the
natural-key duplicate check and the per-link lists of the samples that need them.

``ingest_ceiling_link_lists`` shows why the layout changed (issue 15 §4): DuckDB's own
insert of the same rows in the older layout (the contract's five per-link lists of 18 in
every row), as stored now, and with no NVLink columns at all. Arrow tables are built
before the clock starts.

    .venv/bin/python bench/bench_ingest.py [--nodes 64] [--hours 24]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import resource
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
from _common import best_of, report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline import schema
from fleetcare.pipeline.store import Store, columns_to_arrow


def insert_rate(tables: list[pa.Table], tmp: str, name: str,
                select: str = "SELECT * FROM t") -> tuple[float, int]:
    """Best-of-3 seconds of DuckDB's own INSERT of ``tables`` (``select`` of each, as
    ``t``) into a fresh table."""
    fresh = itertools.count()

    def once() -> int:
        con = duckdb.connect(str(Path(tmp) / f"{name}{next(fresh)}.duckdb"))
        con.register("t", tables[0])
        con.execute(f"CREATE TABLE x AS {select} LIMIT 0")
        con.unregister("t")
        for t in tables:
            con.register("t", t)
            con.execute(f"INSERT INTO x {select}").fetchall()
            con.unregister("t")
        con.close()
        return sum(t.num_rows for t in tables)

    return best_of(once)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--hours", type=float, default=24)
    args = p.parse_args()
    spec = FleetSpec(nodes=args.nodes, seed=1)
    sim = FleetSimulator(spec, simulate_incidents(spec, args.hours / 24 + 1))
    chunks = [c.samples for c in sim.history(spec.start, spec.start + dt.timedelta(hours=args.hours))]
    n = sum(len(c["ts"]) for c in chunks)
    tables = [columns_to_arrow(c, schema.SAMPLE_SCHEMA) for c in chunks]

    fresh = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        def fleetcare_path() -> int:
            db = Path(tmp) / f"f{next(fresh)}.duckdb"
            with Store(db) as store:
                return sum(store.insert_sample_columns(c) for c in chunks)

        def duckdb_ceiling() -> int:
            db = Path(tmp) / f"c{next(fresh)}.duckdb"
            with Store(db) as store:
                cur = store.cursor()
                for t in tables:
                    cur.register("t", t)
                    cur.execute(f"INSERT INTO telemetry {schema.stored_samples_sql('t')}"
                                ).fetchall()
                    cur.unregister("t")
                return n

        ours, rows = best_of(fleetcare_path)
        ceiling, _ = best_of(duckdb_ceiling)
        lists, _ = insert_rate(tables, tmp, "lists")
        stored, _ = insert_rate(tables, tmp, "stored", schema.stored_samples_sql("t"))
        no_links, _ = insert_rate([t.drop_columns(list(schema.NVLINK_LISTS)) for t in tables],
                                  tmp, "nolinks")
    assert rows == n
    report("ingest_embedded", {"samples": n, "fleetcare_s": round(ours, 3),
                               "fleetcare_samples_per_s": round(n / ours),
                               "duckdb_bulk_insert_s": round(ceiling, 3),
                               "duckdb_samples_per_s": round(n / ceiling),
                               "ratio_of_ceiling": round(ceiling / ours, 3)})
    report("ingest_ceiling_link_lists", {
        "samples": n,
        "older_layout_lists_samples_per_s": round(n / lists),
        "as_stored_now_samples_per_s": round(n / stored),
        "no_nvlink_columns_samples_per_s": round(n / no_links),
        "as_stored_now_over_older_layout": round(lists / stored, 3),
        # the path summarises the lists with numpy before DuckDB sees them
        # (``link_summary``), so the insert of rows without lists is its tighter ceiling
        "fleetcare_over_no_nvlink_columns": round(no_links / ours, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})


if __name__ == "__main__":
    main()
