"""Retention: drop raw telemetry once its hours are rolled up; keep everything else.

Raw telemetry is wherever ``store.raw`` keeps it: rows of the ``telemetry`` table, or
whole hour partitions of the Parquet lake.

``apply(store, keep_raw=30 days)`` deletes ``telemetry`` rows older than ``now -
keep_raw`` (cut at an hour boundary), but never a row whose hour is not rolled up for
good: the cut never passes the hour of the rollup watermark (that hour is rebuilt by the
next refresh) nor the hour of the oldest sample inserted since the last refresh (late
data waiting to be rolled up). Rollups (``telemetry_hourly``), XID events, incidents,
scores and models are kept, so features read from rollups do not change. Raw NIC samples
(``nic_telemetry``) are cut at the same time, as far as ``nic_rollup.prune`` allows.

The cut is recorded in ``meta`` (``rollup.RAW_FROM_KEY``): rollups before it are never
rebuilt from the (now partial) raw rows, and samples arriving later than that are ignored
by the rollup.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass

from fleetcare.pipeline import nic_rollup, rollup
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

DEFAULT_KEEP_RAW = dt.timedelta(days=30)


@dataclass(frozen=True)
class RetentionResult:
    cutoff: dt.datetime | None   # raw rows with ts < cutoff are (or would be) deleted
    wanted_cutoff: dt.datetime   # hour_floor(now - keep_raw)
    held_back_by: str | None     # why cutoff < wanted_cutoff: 'rollup' / 'late-data' / None
    deleted: int                 # rows deleted (dry run: rows that would be)
    kept: int                    # raw rows left
    dry_run: bool
    nic_deleted: int = 0         # raw NIC port samples deleted (``nic_rollup.prune``)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        for k in ("cutoff", "wanted_cutoff"):
            d[k] = d[k].isoformat() + "Z" if d[k] else None
        return d


def apply(store: Store, keep_raw: dt.timedelta = DEFAULT_KEEP_RAW, *,
          now: dt.datetime | None = None, dry_run: bool = False) -> RetentionResult:
    """Delete raw telemetry older than ``keep_raw`` that is safely rolled up."""
    if keep_raw <= dt.timedelta(0):
        raise ValueError(f"keep_raw={keep_raw} must be positive (e.g. 30d)")
    now_n = rollup._ts(now or dt.datetime.now(dt.UTC))
    wanted = rollup.hour_floor(now_n - keep_raw)
    cur = store.cursor()
    try:
        rollup.ensure_tables(cur)
        mark = rollup.watermark(cur)
        dirty = rollup.dirty_since(cur)
        cutoff: dt.datetime | None = wanted
        held: str | None = None
        if mark is None:
            cutoff, held = None, "rollup"
        else:
            if rollup.hour_floor(mark) < wanted:
                cutoff, held = rollup.hour_floor(mark), "rollup"
            if dirty is not None and rollup.hour_floor(dirty) < cutoff:  # type: ignore[operator]
                cutoff, held = rollup.hour_floor(dirty), "late-data"
        n, total = store.raw.count_before(cur, cutoff)
        if n and not dry_run:
            with store.transaction() as tx:
                store.raw.delete_before(tx, cutoff)  # type: ignore[arg-type]
                prev = rollup._meta_ts(tx, rollup.RAW_FROM_KEY)
                if prev is None or cutoff > prev:  # type: ignore[operator]
                    tx.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                               [rollup.RAW_FROM_KEY, cutoff.isoformat()]).fetchall()  # type: ignore[union-attr]
            log.info("retention.applied cutoff=%s deleted=%d", cutoff, n)
    finally:
        cur.close()
    nic_n = nic_rollup.prune(store, cutoff, dry_run=dry_run) if cutoff is not None else 0
    return RetentionResult(cutoff=cutoff, wanted_cutoff=wanted, held_back_by=held,
                           deleted=int(n), kept=int(total - (0 if dry_run else n)),
                           dry_run=dry_run, nic_deleted=nic_n)
