"""The newest sample of every GPU, held in memory: the telemetry part of ``GET
/v1/nodes/{node}`` without a DuckDB read per request.

``LatestSamples.for_node(cur, node, since)`` answers from memory what
``RawTelemetry.latest_samples(node=, since=)`` answers from the table: each GPU of the
node with a sample at or after ``since``, its newest one. The memory is brought up to date
every ``refresh_s`` (1 s): in the service by a keeper thread of its own (``keep``), else
by the request that finds it older:

- first use: every GPU's newest sample of the last ``WINDOW`` (15 minutes) before the
  newest telemetry; the memory is complete from there on (``floor``);
- after that, every second: a narrow read of which GPUs have rows after the newest ts
  seen, and at it which GPUs not held there yet (a fleet's samples of one second land over
  many polls; zone maps skip the rest); every ``SLACK_EVERY_S``, from ``SLACK`` before it
  for late arrivals, which GPUs' newest sample moved. Then the whole rows of only those
  (agents report once a minute: ~1/60 of the fleet a second), as ``contract_parts_sql``
  parts, the NVLink lists rebuilt here (``contract_sample``); their JSON is written
  (msgspec: ~7x ``json``, non-finite numbers as null) before the readers' lock is taken:
  readers never wait for it.

The refresh shares the service's interpreter and cores with every request, so it is kept
small: at 16,384 GPUs with a fleet tick landing over a minute, re-reading the ~16,000
GPUs already held at the newest ts every second to find the ~270 new ones (and writing
their JSON with ``json``) was ~40 ms of CPU a second, and requests arriving meanwhile
were the API's p99 (``bench/bench_api_load.py``); two reads (which GPUs moved, then
their rows with the lists built per row in SQL) ~22 ms, with the rows read as parts
~13 ms (``bench/bench_sample_memory.py``).

What it does not see, and what then happens: a sample that lands behind a newer sample of
another GPU shows within ``SLACK_EVERY_S`` (30 s); one that lands more than ``SLACK``
(2 minutes) behind, and is newer than its own GPU's held one (a
node whose agent spooled through an outage and replays: its held sample stays the one
before until its next live one, a minute later); ``since`` before ``floor`` and any
non-table telemetry source (the lake: ``for_node`` returns None and the caller reads the
source as before). New samples show within ``refresh_s`` (plus the refresh's own time
with a keeper).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from fleetcare.api import priority, queries
from fleetcare.pipeline.schema import (
    SCALAR_SAMPLE_COLUMNS,
    contract_parts_sql,
    contract_sample,
)
from fleetcare.pipeline.telemetry import sql_ts

log = logging.getLogger(__name__)
Cursor = duckdb.DuckDBPyConnection
WINDOW = dt.timedelta(minutes=15)
SLACK = dt.timedelta(minutes=2)
SLACK_EVERY_S = 30.0
REFRESH_S = 1.0
KEEPER_LATE = 3
"""With a keeper thread (``LatestSamples.keep``), a request refreshes only once the memory
is this many ``refresh_s`` old."""
_encode = msgspec.json.Encoder().encode  # NaN and infinities are written as null
_decode = msgspec.json.Decoder().decode
_UUID_AT = SCALAR_SAMPLE_COLUMNS.index("gpu_uuid")  # in a contract_parts_sql row


def _whole_rows(keys: str, since: str) -> str:
    """The samples named by the relation ``keys`` (columns ``g``: GPU, ``t``: ts) as
    ``contract_parts_sql`` parts, their NVLink lists rebuilt in ``_texts``. The keys are
    found on narrow columns first: filtering the wide rows themselves (and keeping each
    GPU's newest among them) cost more, and a refresh with nothing new read them all."""
    return contract_parts_sql(
        f"EXISTS (SELECT 1 FROM {keys} w WHERE w.g = t.gpu_uuid AND w.t = t.ts)", since=since)


class LatestSamples:
    """Each GPU's newest sample (JSON-ready, as ``queries._latest_samples`` gives it)."""

    def __init__(self, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self._samples: dict[str, bytes] = {}
        """GPU -> its newest sample as JSON: one object per GPU instead of ~70 (the
        garbage collector's full passes walk every long-lived object; see
        ``server.freeze_heap``)."""
        self._ts: dict[str, dt.datetime] = {}
        self._gpus_of: dict[str, set[str]] = {}
        self._node_of: dict[str, str] = {}
        self._mark: dt.datetime | None = None  # the newest ts seen
        self._at_mark: list[pa.Array] = []  # GPUs whose held sample is at _mark, per refresh
        self.floor: dt.datetime | None = None  # complete from here on
        self._checked = -math.inf
        self._slack_checked = -math.inf
        self._lock = threading.Lock()  # one refresher at a time
        self._data = threading.Lock()  # readers vs. the refresher's update (short)
        self.refreshes = 0
        self._kept = False  # a keeper thread refreshes (``keep``)
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    def for_node(self, cur: Cursor, node: str, since: dt.datetime,
                 kind: str = "table") -> list[dict[str, Any]] | None:
        """The node's GPUs' newest samples at or after ``since`` (sorted by GPU index,
        then UUID), or None when memory cannot tell (the caller reads the source)."""
        if kind != "table":
            return None
        self._refresh(cur)
        if self.floor is None or since < self.floor:
            return None
        with self._data:
            texts = [self._samples[g] for g in self._gpus_of.get(node, ())
                     if self._ts[g] >= since]
        out = [_decode(t) for t in texts]
        out.sort(key=lambda s: (s["gpu_index"] is None, s["gpu_index"] or 0, s["gpu_uuid"]))
        return out

    def warm(self, cur: Cursor) -> None:
        """Read the last ``WINDOW`` now (the service's start), not on the first request
        (0.2-0.9 s at 16,384 GPUs)."""
        self._checked = -math.inf
        self._refresh(cur)

    def keep(self, open_cursor: Callable[[], Cursor],
             background_nice: int = priority.BACKGROUND_NICE) -> threading.Thread:
        """Refresh from a daemon thread of its own every ``refresh_s`` (the service), so
        that no request pays for it: at 16,384 GPUs a refresh took 20-70 ms when one
        request a second paid it (0.5 % of requests at 200 a second: the API's p99). A
        request still refreshes once the memory is ``KEEPER_LATE`` intervals old (the
        keeper stopped). The thread ends at ``stop()`` or when the database closes. It runs
        ``background_nice`` below the API's threads in CPU priority (``priority``)."""
        priority.checked(background_nice)

        def run() -> None:
            priority.lower_this_thread(background_nice)
            try:
                cur = open_cursor()
            except duckdb.Error:
                return
            self._kept = True
            try:
                while not self._stop.wait(self.refresh_s):
                    self._refresh(cur, force=True)
            except duckdb.Error as exc:  # the database closed under it
                log.info("api.latest_samples_keeper_stopped error=%s", exc)
            finally:
                self._kept = False
                try:
                    cur.close()
                except duckdb.Error:
                    pass

        thread = threading.Thread(target=run, name="fleetcare-latest-samples", daemon=True)
        self._keeper = thread
        thread.start()
        return thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the keeper thread (``keep``), if any, and wait for it (at most
        ``timeout_s``): before the database closes, so no refresh runs while it does."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout_s)

    def _refresh(self, cur: Cursor, *, force: bool = False) -> None:
        """Bring the memory up to date if it is ``refresh_s`` old (``force``: now); a
        refresh already running elsewhere is not waited for: what is held is used."""
        now = self.clock()
        due = self.refresh_s * (KEEPER_LATE if self._kept else 1)
        if (not force and now - self._checked < due) or not self._lock.acquire(blocking=False):
            return  # fresh enough, or another thread is refreshing: use what is held
        try:
            self._checked = now
            floor = None
            if self._mark is None:
                newest = cur.execute("SELECT max(ts) FROM telemetry").fetchall()[0][0]
                if newest is None:
                    return
                lo = floor = newest - WINDOW
            elif now - self._slack_checked >= SLACK_EVERY_S:
                lo = self._mark - SLACK
                self._slack_checked = now
            else:
                lo = self._mark
            moved = (self._after_mark(cur, lo) if floor is None and lo == self._mark
                     else self._moved(cur, lo))
            if moved:
                self._take(cur, moved)
            if floor is not None:
                self.floor = floor  # complete from here on: only now may readers rely on it
            self.refreshes += 1
        finally:
            self._lock.release()

    def _moved(self, cur: Cursor, lo: dt.datetime) -> list[tuple[str, dt.datetime]]:
        """(GPU, newest ts) of the GPUs whose newest sample at or after ``lo`` is newer
        than the one held (the first load: every GPU's). The slack scan compares in
        DuckDB, so an unchanged fleet costs no Python per GPU."""
        if not self._ts:  # the first load
            sql = "SELECT gpu_uuid, max(ts) FROM telemetry WHERE ts >= $lo GROUP BY gpu_uuid"
            return [tuple(r) for r in cur.execute(sql, {"lo": lo}).fetchall()]
        with self._data:
            held = pa.table({"g": pa.array(list(self._ts), pa.string()),
                             "t": pa.array(list(self._ts.values()), pa.timestamp("us"))})
        cur.register("_fc_held", held)
        try:
            return cur.execute(
                "SELECT n.g, n.t FROM (SELECT gpu_uuid AS g, max(ts) AS t FROM telemetry "
                "WHERE ts >= ? GROUP BY gpu_uuid) n LEFT JOIN _fc_held h ON h.g = n.g "
                "WHERE h.t IS NULL OR n.t > h.t", [lo]).fetchall()
        finally:
            cur.unregister("_fc_held")

    def _after_mark(self, cur: Cursor, mark: dt.datetime) -> list[tuple[str, dt.datetime]]:
        """The every-second refresh's narrow read: (GPU, newest ts) of the GPUs with rows
        after ``mark`` (the newest ts seen) or, at it, not held there yet — those read only
        when more GPUs have a row there than are held there (a fleet's agents report at
        the same second; a tick's samples land over many polls). ``ts >= mark`` bounds
        the scan (zone maps); nothing new costs this read alone."""
        with self._data:
            held_at = pa.chunked_array(self._at_mark, pa.string())
        cur.register("_fc_at_mark", pa.table({"g": held_at}))
        try:
            return cur.execute(
                "SELECT gpu_uuid, max(ts) FROM telemetry WHERE ts >= $lo AND (ts > $lo "
                "OR ((SELECT count(*) FROM telemetry WHERE ts = $lo) > $held "
                "AND gpu_uuid NOT IN (SELECT g FROM _fc_at_mark))) GROUP BY gpu_uuid",
                {"lo": mark, "held": len(held_at)}).fetchall()
        finally:
            cur.unregister("_fc_at_mark")

    def _take(self, cur: Cursor, moved: list[tuple[str, dt.datetime]]) -> None:
        want = pa.table({"g": pa.array([g for g, _ in moved], pa.string()),
                         "t": pa.array([t for _, t in moved], pa.timestamp("us"))})
        lo = min(t for _, t in moved)
        cur.register("_fc_moved", want)
        try:
            rows = cur.execute(_whole_rows("_fc_moved", since=sql_ts(lo))).fetchall()
        finally:
            cur.unregister("_fc_moved")
        self._hold(rows)

    def _hold(self, rows: list[tuple[Any, ...]]) -> None:
        """Hold the samples of ``rows`` newer than the ones held, one per GPU (a key
        stored twice — a duplicated per-link row — gives its sample twice)."""
        one: dict[str, tuple[Any, ...]] = {}
        for r in rows:
            one.setdefault(r[_UUID_AT], r)
        taken = self._texts(list(one.values()))  # the costly part, outside the readers' lock
        with self._data:
            self._apply([t for t in taken if t[0] not in self._ts or t[2] > self._ts[t[0]]])

    @staticmethod
    def _texts(rows: list[tuple[Any, ...]]) -> list[tuple[str, str, dt.datetime, bytes]]:
        """(GPU, node, ts, sample as JSON) of each row."""
        out = []
        for r in rows:
            sample = contract_sample(r)
            ts: dt.datetime = sample["ts"]
            sample["ts"] = queries.iso_z(ts)
            # a NaN or infinity is written as null, as queries gives it (queries.finite)
            out.append((sample["gpu_uuid"], sample["node"], ts, _encode(sample)))
        return out

    def _apply(self, taken: list[tuple[str, str, dt.datetime, bytes]]) -> None:
        """Hold ``taken`` (``_texts``); the caller holds ``_data``: dictionary updates
        only, so readers wait microseconds, not for the JSON of a slack scan's catch-up."""
        at_mark: list[str] = []
        for gpu, node, ts, text in taken:
            was = self._node_of.get(gpu)
            if was is not None and was != node:  # the GPU moved to another node
                self._gpus_of.get(was, set()).discard(gpu)
            self._samples[gpu] = text
            self._node_of[gpu] = node
            self._ts[gpu] = ts
            self._gpus_of.setdefault(node, set()).add(gpu)
            if self._mark is None or ts > self._mark:
                self._mark = ts
                self._at_mark = []
                at_mark = []
            if ts == self._mark:
                at_mark.append(gpu)
        if at_mark:
            self._at_mark.append(pa.array(at_mark, pa.string()))
