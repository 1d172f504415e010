"""Embedded ingest vs DuckDB's own bulk insert of the same Arrow table (simulated data).

The ceiling is ``INSERT INTO telemetry SELECT * FROM arrow_table`` on a fresh database:
what DuckDB does with no idempotency check, no conversion. fleetcare's path converts
the simulator's columns to Arrow and inserts with the natural-key duplicate check.

    .venv/bin/python bench/bench_ingest.py [--nodes 64] [--hours 24]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import tempfile
from pathlib import Path

from _common import best_of, report

from fleetcare.collectors.sim import FleetSpec, simulate_incidents
from fleetcare.collectors.sim.telemetry import FleetSimulator
from fleetcare.pipeline import schema
from fleetcare.pipeline.store import Store, columns_to_arrow


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
    assert rows == n
    report("ingest_embedded", {"samples": n, "fleetcare_s": round(ours, 3),
                               "fleetcare_samples_per_s": round(n / ours),
                               "duckdb_bulk_insert_s": round(ceiling, 3),
                               "duckdb_samples_per_s": round(n / ceiling),
                               "ratio_of_ceiling": round(ceiling / ours, 3)})


if __name__ == "__main__":
    main()
