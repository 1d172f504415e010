"""Embedded ingest vs DuckDB's own bulk insert of the same Arrow table (simulated data).

The ceiling is ``INSERT INTO telemetry SELECT * FROM arrow_table`` on a fresh database:
what DuckDB does with no idempotency check, no conversion. fleetcare's path converts
the simulator's columns to Arrow and inserts with the natural-key duplicate check.

What caps that ceiling: the same insert of the same rows without the five per-link
NVLink lists (``ingest_ceiling_link_lists``), once with no NVLink columns at all and
once with each list replaced by two scalars (total over links, worst link), a possible
storage of the same information for scoring (per-link detail would then live in a table
of its own, holding only non-zero rows). Arrow tables are built before the clock starts.

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
import numpy as np
import pyarrow as pa
from _common import best_of, report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline import schema
from fleetcare.pipeline.store import Store, columns_to_arrow

LINK_LISTS = ("nvlink_up", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay",
              "nvlink_recovery")


def link_scalars(table: pa.Table, chunk: dict[str, np.ndarray]) -> pa.Table:
    """``table`` with each per-link list replaced by (total over links, worst link)."""
    out = table.drop_columns(list(LINK_LISTS))
    for name in LINK_LISTS:
        v = chunk[name].astype(np.int64)
        if name == "nvlink_up":  # links down, and whether any is
            v = 1 - v
        out = out.append_column(f"{name}_total", pa.array(v.sum(axis=1)))
        out = out.append_column(f"{name}_max", pa.array(v.max(axis=1)))
    return out


def insert_rate(tables: list[pa.Table], tmp: str, name: str) -> tuple[float, int]:
    """Best-of-3 seconds of DuckDB's own INSERT of ``tables`` into a fresh table."""
    fresh = itertools.count()

    def once() -> int:
        con = duckdb.connect(str(Path(tmp) / f"{name}{next(fresh)}.duckdb"))
        con.register("t", tables[0])
        con.execute("CREATE TABLE x AS SELECT * FROM t LIMIT 0")
        con.unregister("t")
        for t in tables:
            con.register("t", t)
            con.execute("INSERT INTO x SELECT * FROM t").fetchall()
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
                    cur.execute("INSERT INTO telemetry SELECT * FROM t").fetchall()
                    cur.unregister("t")
                return n

        ours, rows = best_of(fleetcare_path)
        ceiling, _ = best_of(duckdb_ceiling)
        as_stored, _ = insert_rate(tables, tmp, "stored")
        no_links, _ = insert_rate([t.drop_columns(list(LINK_LISTS)) for t in tables], tmp,
                                  "nolinks")
        scalars, _ = insert_rate([link_scalars(t, c) for t, c in zip(tables, chunks,
                                                                      strict=True)],
                                 tmp, "scalars")
    assert rows == n
    report("ingest_embedded", {"samples": n, "fleetcare_s": round(ours, 3),
                               "fleetcare_samples_per_s": round(n / ours),
                               "duckdb_bulk_insert_s": round(ceiling, 3),
                               "duckdb_samples_per_s": round(n / ceiling),
                               "ratio_of_ceiling": round(ceiling / ours, 3)})
    report("ingest_ceiling_link_lists", {
        "samples": n,
        "as_stored_samples_per_s": round(n / as_stored),
        "no_nvlink_columns_samples_per_s": round(n / no_links),
        "link_total_and_worst_samples_per_s": round(n / scalars),
        "as_stored_over_link_scalars": round(scalars / as_stored, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})


if __name__ == "__main__":
    main()
