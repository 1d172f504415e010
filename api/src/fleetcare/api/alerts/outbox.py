"""The durable outbox: alert messages wait in DuckDB until their receiver takes them.

    outbox = Outbox(store, sinks, clock=time.time, rng=random.random)
    with store.transaction() as cur:          # the same transaction as the alert change
        outbox.enqueue(cur, sink, event, now)
    outbox.deliver_due(now)                   # each minute, from the service loop

Table ``alert_outbox`` (one row per message and sink)::

    id VARCHAR, sink VARCHAR, url VARCHAR, headers JSON, body BLOB, created_at TIMESTAMP,
    next_attempt_at TIMESTAMP, attempts INTEGER, last_error VARCHAR, delivered_at TIMESTAMP,
    alert_id VARCHAR, event VARCHAR, state VARCHAR  -- pending | delivered | dead
    sign BOOLEAN, seq BIGINT, ended_at TIMESTAMP  -- delivered or given up

Delivery: due messages are POSTed in order per sink (a sink's later message waits while an
earlier one is backing off, so a PagerDuty ``resolve`` never overtakes its ``trigger``).
2xx is delivered. A connection error, a timeout, 408, 429 or 5xx is retried after
``min(cap, base * 2**(attempts-1)) * (1 ± jitter)`` seconds (jitter from the injected rng);
other 4xx are permanent. A message is given up as ``dead`` when permanent, or when it is
still failing ``max_age_s`` after it was created: logged at ERROR (``alerts.dead``) and
counted, never dropped silently. Delivered and dead messages are kept ``keep_s`` (7 days)
after they ended, then pruned (hourly, from ``deliver_due``), except the newest firing
message of each alert still open, which the engine reads to decide repeats: the table
stays bounded. Across a crash between a POST and its bookkeeping the
message is sent again (at least once); receivers dedup on PagerDuty's dedup_key,
Alertmanager's fingerprint or ``X-Fleetcare-Delivery``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetcare.api.alerts.config import mask_url
from fleetcare.api.alerts.sinks import AlertEvent, SigningSink, Sink
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

DDL = """
CREATE SEQUENCE IF NOT EXISTS alert_outbox_seq;
CREATE TABLE IF NOT EXISTS alert_outbox (
  id VARCHAR NOT NULL, sink VARCHAR NOT NULL, url VARCHAR NOT NULL, headers JSON NOT NULL,
  body BLOB NOT NULL, created_at TIMESTAMP NOT NULL, next_attempt_at TIMESTAMP,
  attempts INTEGER NOT NULL DEFAULT 0, last_error VARCHAR, delivered_at TIMESTAMP,
  alert_id VARCHAR, event VARCHAR, state VARCHAR NOT NULL DEFAULT 'pending',
  sign BOOLEAN NOT NULL DEFAULT false, seq BIGINT DEFAULT nextval('alert_outbox_seq')
);
ALTER TABLE alert_outbox ADD COLUMN IF NOT EXISTS ended_at TIMESTAMP;
"""

KEEP_S = 7 * 86400.0
"""How long delivered and dead messages stay in the outbox (for `fleetcare alerts` and
/metrics), before ``prune``."""
PRUNE_EVERY_S = 3600.0

Post = Callable[[str, Mapping[str, str], bytes, float], int]
"""``post(url, headers, body, timeout_s) -> HTTP status``; raises OSError when no answer."""


def urllib_post(url: str, headers: Mapping[str, str], body: bytes, timeout_s: float) -> int:
    req = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read(65536)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read(65536)
        exc.close()
        return int(exc.code)


def to_naive_utc(now: float | dt.datetime) -> dt.datetime:
    if isinstance(now, dt.datetime):
        return now.astimezone(dt.UTC).replace(tzinfo=None) if now.tzinfo else now
    return dt.datetime.fromtimestamp(now, dt.UTC).replace(tzinfo=None)


def to_epoch(now: float | dt.datetime) -> float:
    if isinstance(now, dt.datetime):
        return (now if now.tzinfo else now.replace(tzinfo=dt.UTC)).timestamp()
    return float(now)


@dataclass(frozen=True)
class Delivery:
    """What one ``deliver_due`` call did."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0


_locks: dict[int, threading.Lock] = {}


def store_lock(store: Store) -> threading.Lock:
    """One lock per Store for alert bookkeeping (engine and outbox may run on two threads)."""
    return _locks.setdefault(id(store), threading.Lock())


def ensure_schema(cur: Any) -> None:
    cur.execute(DDL).fetchall()


class Outbox:
    def __init__(self, store: Store, sinks: Mapping[str, Sink], *, post: Post = urllib_post,
                 timeout_s: float = 10.0, base_s: float = 10.0, factor: float = 2.0,
                 cap_s: float = 600.0, jitter: float = 0.1, max_age_s: float = 86400.0,
                 batch: int = 100, rng: Callable[[], float] = random.random,
                 clock: Callable[[], float] = time.time, keep_s: float = KEEP_S) -> None:
        self.store = store
        self.sinks = dict(sinks)
        self.post = post
        self.timeout_s = timeout_s
        self.base_s, self.factor, self.cap_s, self.jitter = base_s, factor, cap_s, jitter
        self.max_age_s = max_age_s
        self.batch = batch
        self.rng = rng
        self.clock = clock
        self.keep_s = keep_s
        self._pruned_at: float | None = None
        self.counters = {"delivered": 0, "retried": 0, "dead": 0}
        """Since this process started; ``stats()`` counts from the table."""
        self._lock = store_lock(store)
        ensure_schema(store.cursor())

    # -- writing ------------------------------------------------------------------------------
    def enqueue(self, cur: Any, sink: Sink, event: AlertEvent, now: float | dt.datetime) -> str:
        """Render ``event`` for ``sink`` and store it, with ``cur`` (the caller's
        transaction). Returns the message id. Due at once."""
        url, headers, body = sink.render(event)
        msg_id = f"{event.event_id}:{sink.name}"
        when = to_naive_utc(now)
        cur.execute(
            "INSERT INTO alert_outbox (id, sink, url, headers, body, created_at, "
            "next_attempt_at, alert_id, event, sign) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [msg_id, sink.name, url, json.dumps(headers), body, when, when, event.alert_id,
             event.status, isinstance(sink, SigningSink)]).fetchall()
        log.info("alerts.enqueued id=%s sink=%s url=%s", msg_id, sink.name, mask_url(url))
        return msg_id

    # -- delivering -----------------------------------------------------------------------------
    def backoff_s(self, attempts: int) -> float:
        """Delay after the ``attempts``-th failed attempt (1, 2, ...)."""
        delay = min(self.cap_s, self.base_s * self.factor ** max(0, attempts - 1))
        return delay * (1.0 + self.jitter * (2.0 * self.rng() - 1.0))

    def deliver_due(self, now: float | dt.datetime | None = None) -> Delivery:
        """POST every due message (at most ``batch``), in order per sink; reschedule
        failures with backoff; give up (``dead``) past ``max_age_s``. Safe to call often."""
        epoch = to_epoch(self.clock() if now is None else now)
        when = to_naive_utc(epoch)
        delivered = retried = dead = 0
        with self._lock:
            rows = self.store.cursor().execute(
                "SELECT id, sink, url, headers, body, created_at, next_attempt_at, attempts, "
                "sign FROM alert_outbox WHERE state = 'pending' "
                "ORDER BY sink, created_at, seq").fetchall()
            blocked: set[str] = set()
            sent = 0
            for (msg_id, sink_name, url, headers, body, created_at, next_at, attempts,
                 sign) in rows:
                if sink_name in blocked or sent >= self.batch:
                    continue
                if next_at is not None and next_at > when:
                    blocked.add(sink_name)      # keep this sink's order
                    continue
                hdrs = json.loads(headers)
                body = bytes(body)
                if sign:
                    sink = self.sinks.get(sink_name)
                    if not isinstance(sink, SigningSink):
                        self._dead(msg_id, sink_name, url, attempts, when,
                                   f"sink {sink_name!r} is not configured any more, so "
                                   "this signed message cannot be signed")
                        dead += 1
                        continue
                    hdrs = sink.sign(hdrs, body, epoch)
                sent += 1
                attempts += 1
                try:
                    status = self.post(url, hdrs, body, self.timeout_s)
                    error = None if 200 <= status < 300 else f"HTTP {status}"
                    permanent = (error is not None and 400 <= status < 500
                                 and status not in (408, 429))
                except OSError as exc:   # refused, reset, timeout, DNS
                    error, permanent = f"{type(exc).__name__}: {exc}", False
                if error is None:
                    self._update(msg_id, state="delivered", attempts=attempts,
                                 delivered_at=when, ended_at=when, last_error=None)
                    log.info("alerts.delivered id=%s sink=%s url=%s attempts=%d",
                             msg_id, sink_name, mask_url(url), attempts)
                    delivered += 1
                    continue
                age = (when - created_at).total_seconds()
                if permanent or age + 0.0 >= self.max_age_s:
                    why = "refused for good" if permanent else f"still failing after {age:.0f}s"
                    self._dead(msg_id, sink_name, url, attempts, when, f"{error} ({why})")
                    dead += 1
                    continue
                delay = self.backoff_s(attempts)
                self._update(msg_id, attempts=attempts, last_error=error,
                             next_attempt_at=when + dt.timedelta(seconds=delay))
                log.warning("alerts.retry id=%s sink=%s url=%s attempts=%d error=%s "
                            "retry_in_s=%.1f", msg_id, sink_name, mask_url(url), attempts,
                            _mask_error(error, url), delay)
                retried += 1
                blocked.add(sink_name)
        self.counters["delivered"] += delivered
        self.counters["retried"] += retried
        self.counters["dead"] += dead
        if self._pruned_at is None or epoch - self._pruned_at >= PRUNE_EVERY_S:
            self.prune(epoch)
        return Delivery(delivered, retried, dead)

    def prune(self, now: float | dt.datetime) -> int:
        """Delete delivered and dead messages that ended more than ``keep_s`` before ``now``,
        but not the newest firing message per sink of an alert that is still open.
        Returns how many were deleted."""
        epoch = to_epoch(now)
        cutoff = to_naive_utc(epoch - self.keep_s)
        with self._lock, self.store.transaction() as cur:
            (open_alerts,) = cur.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = 'alerts'"
            ).fetchall()[0]
            keep = ("" if not open_alerts else
                    " AND NOT (o.event = 'firing' AND o.alert_id IN (SELECT id FROM alerts "
                    "WHERE state <> 'resolved') AND o.created_at = (SELECT max(p.created_at) "
                    "FROM alert_outbox p WHERE p.alert_id = o.alert_id AND p.sink = o.sink "
                    "AND p.event = 'firing'))")
            (n,) = cur.execute(
                "DELETE FROM alert_outbox o WHERE o.state IN ('delivered', 'dead') "
                "AND coalesce(o.ended_at, o.delivered_at, o.created_at) < ?" + keep,
                [cutoff]).fetchall()[0]
        self._pruned_at = epoch
        if n:
            log.info("alerts.pruned messages=%d older_than=%s", n, cutoff.isoformat())
        return n

    def _update(self, msg_id: str, **cols: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self.store.transaction() as cur:
            cur.execute(f"UPDATE alert_outbox SET {sets} WHERE id = ?",
                        [*cols.values(), msg_id]).fetchall()

    def _dead(self, msg_id: str, sink: str, url: str, attempts: int, when: dt.datetime,
              error: str) -> None:
        self._update(msg_id, state="dead", attempts=attempts, last_error=error,
                     next_attempt_at=None, ended_at=when)
        log.error("alerts.dead id=%s sink=%s url=%s attempts=%d error=%s", msg_id, sink,
                  mask_url(url), attempts, _mask_error(error, url))

    # -- reading ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Messages by state, from the table (so it survives restarts)."""
        rows = self.store.cursor().execute(
            "SELECT state, count(*) FROM alert_outbox GROUP BY state").fetchall()
        out = {"pending": 0, "delivered": 0, "dead": 0}
        out.update({s: int(n) for s, n in rows})
        return out


def _mask_error(error: str, url: str) -> str:
    """urllib errors can quote the URL; a Slack URL is a secret."""
    return error.replace(url, mask_url(url))
