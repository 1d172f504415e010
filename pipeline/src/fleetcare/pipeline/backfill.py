"""Backfill telemetry from the dcgm-exporter history a Prometheus server already holds.

``backfill(store, url, start, end)`` walks ``[start, end]`` in chunks (6 h by default)
on a grid of ``step`` seconds (the scrape interval). For each chunk it asks Prometheus'
HTTP API ``/api/v1/query_range`` once per mapped ``DCGM_FI_*`` metric (``FIELD_MAP`` and
``NVLINK_MAP`` of ``fleetcare.collectors.dcgm_exporter``), groups the points by
timestamp, turns them into GPU sample columns with the exporter's own rules
(``prom_columns.samples_table``: identity labels, DCGM blanks → null, MIG, per-link
NVLink; numpy per series, not Python per point) and inserts them through ``Store``
(idempotent by ``(gpu_uuid, ts)``).

Resumable: after each chunk is stored, the meta row ``backfill:<url>[<match>]:done_until``
records the end of the covered range (``...:from`` its start); a later run with the same
URL (and ``match``) whose start lies inside that range continues from ``done_until``, so
``--since 90d`` run daily catches up incrementally. A start before the covered range
fetches everything again (``restart=True`` forces that); rows already stored are skipped
by the store's natural key, so nothing is ever duplicated.

Semantics worth knowing: a range query evaluates each series at every grid point to
the latest sample at most 5 minutes old (Prometheus' lookback delta), so a point on the
grid carries the most recent scrape at or before it. Scraped data ends a vanished
series at once (staleness markers); data imported with ``promtool`` has none, so its
last value repeats for up to 5 minutes. One query returns at most 11,000 points per
series: ``chunk / step`` must stay below that.

Exceptions::

    BackfillError (ValueError)        (.url) bad arguments, unusable responses
     ├── PrometheusUnreachable        the server cannot be reached
     └── PrometheusApiError           (.http_status, .error_type) HTTP 4xx/5xx or
                                      ``"status": "error"``
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetcare.collectors.dcgm_exporter import FIELD_MAP, NVLINK_MAP, Fetch, urllib_fetch
from fleetcare.collectors.redact import mask_secrets
from fleetcare.pipeline.prom_columns import Matrix, decode_matrix, samples_table
from fleetcare.pipeline.store import Store

log = logging.getLogger(__name__)

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus refuses range queries with more points per series than this."""

Progress = Callable[[int, int], None]
"""``progress(chunks_done, chunks_total)``, called after each chunk."""


class BackfillError(ValueError):
    """``url`` is the URL as given; the message masks its credentials (it is printed)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(mask_secrets(message))
        self.url = url


class PrometheusUnreachable(BackfillError):
    pass


class PrometheusApiError(BackfillError):
    def __init__(self, url: str, message: str, *, http_status: int | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(url, message)
        self.http_status = http_status
        self.error_type = error_type


@dataclass(frozen=True, slots=True)
class BackfillResult:
    url: str
    start: dt.datetime          # first grid point fetched by this run
    end: dt.datetime            # last grid point covered
    chunks: int                 # chunks fetched by this run
    resumed: bool               # True if recorded progress moved the start
    points: int                 # (series, ts) values received
    samples: int                # GpuSample rows built
    added: int                  # rows new to the store
    seconds: float


# -- queries ------------------------------------------------------------------------------
def metric_queries(match: str = "") -> list[str]:
    """One PromQL selector per mapped dcgm-exporter metric, with extra label matchers.

    ``match`` is a comma-separated list of label matchers without braces, e.g.
    ``cluster="a",job="dcgm"``. NVLink counters match both the per-lane ``_L<n>``
    names and the link-entity name (``nvlink`` label).
    """
    extra = f",{match}" if match else ""
    queries = [f'{{__name__="{name}"{extra}}}' for name in FIELD_MAP]
    queries += [f'{{__name__=~"{name}(_L[0-9]+)?"{extra}}}' for name in NVLINK_MAP]
    return queries


def progress_key(url: str, match: str = "") -> str:
    return f"backfill:{url}{'[' + match + ']' if match else ''}:done_until"


def _grid(t: float, step: float) -> float:
    """The first grid point at or after ``t`` (grid: multiples of ``step`` since the epoch)."""
    return math.ceil(t / step - 1e-9) * step


def chunks(start: float, end: float, step: float, chunk: float
           ) -> Iterator[tuple[float, float]]:
    """(first, last) grid points of each chunk covering ``[start, end]``; no point twice."""
    per = max(1, int(chunk // step))
    t = _grid(start, step)
    while t <= end:
        last = min(t + (per - 1) * step, end)
        last = t + math.floor((last - t) / step + 1e-9) * step
        yield t, last
        t = last + step


# -- HTTP -----------------------------------------------------------------------------------
class PrometheusClient:
    """``query_range`` over Prometheus' HTTP API; ``fetch(url, timeout_s) -> bytes``."""

    def __init__(self, url: str, *, fetch: Fetch = urllib_fetch, timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise BackfillError(url, f"--prometheus {url!r} is not an http(s) URL; give the "
                                     "server's base URL, e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self._fetch = fetch
        self._timeout = timeout_s

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The ``result`` list of a matrix query: ``[{"metric": {...}, "values": [[t, "v"]]}]``."""
        return self._result(self._get(query, start, end, step), query)

    def query_matrix(self, query: str, start: float, end: float, step: float) -> Matrix:
        """The same answer as ``(labels, points)`` arrays (``prom_columns.decode_matrix``);
        anything but a clean matrix goes through ``query_range``'s checks and errors."""
        raw = self._get(query, start, end, step)
        got = decode_matrix(raw)
        if got is None:
            return [(dict(e.get("metric") or {}),
                     np.array([(float(t), float(v)) for t, v in e.get("values") or ()],
                              dtype=np.float64).reshape(-1, 2))
                    for e in self._result(raw, query)]
        matrix, warnings = got
        self._warn(warnings)
        return matrix

    def _get(self, query: str, start: float, end: float, step: float) -> bytes:
        params = urllib.parse.urlencode({"query": query, "start": _num(start),
                                         "end": _num(end), "step": _num(step)})
        req = f"{self.url}/api/v1/query_range?{params}"
        try:
            return self._fetch(req, self._timeout)
        except urllib.error.HTTPError as exc:
            body = _read(exc)
            raise self._api_error(exc.code, body, query) from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnreachable(
                self.url, f"cannot reach Prometheus at {self.url}: {reason}. Check the URL "
                          "(scheme, host, port; Prometheus listens on 9090 by default) and "
                          f"that the server is up: curl {self.url}/-/ready") from exc

    def _result(self, raw: bytes, query: str) -> list[dict[str, Any]]:
        doc = self._decode(raw, 200)
        if doc.get("status") != "success":
            raise self._api_error(200, raw, query)
        self._warn(doc.get("warnings") or ())
        data = doc.get("data") or {}
        if data.get("resultType") != "matrix":
            raise BackfillError(self.url, f"{self.url} answered a range query with resultType "
                                          f"{data.get('resultType')!r}, not 'matrix'; is this "
                                          "a Prometheus-compatible API?")
        return list(data.get("result") or [])

    def _warn(self, warnings: Iterable[str]) -> None:
        for w in warnings:
            log.warning("backfill.prometheus_warning url=%s warning=%s",
                        mask_secrets(self.url), w)

    def _decode(self, raw: bytes, http_status: int) -> dict[str, Any]:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if not isinstance(doc, dict):
            raise PrometheusApiError(
                self.url, f"{self.url} (HTTP {http_status}) did not answer with Prometheus API "
                          f"JSON: {raw[:200]!r}. Give the server's base URL (e.g. "
                          "http://prometheus:9090, plus any path prefix of a proxy), not a "
                          "dashboard or /metrics URL", http_status=http_status)
        return doc

    def _api_error(self, http_status: int, raw: bytes, query: str) -> PrometheusApiError:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if not isinstance(doc, dict):
            hint = (" Is this the server's base URL? The API lives under /api/v1 of it."
                    if http_status == 404 else "")
            return PrometheusApiError(
                self.url, f"Prometheus at {self.url} answered HTTP {http_status}: "
                          f"{raw[:200]!r}.{hint}", http_status=http_status)
        etype, err = doc.get("errorType"), doc.get("error", "")
        fix = ""
        if "maximum resolution" in err or "too many" in err.lower():
            fix = " Use a smaller --chunk or a larger --step."
        elif etype in ("timeout", "canceled") or http_status == 503 or "max-samples" in err:
            fix = " The query was too heavy for the server: use a smaller --chunk."
        elif etype == "bad_data":
            fix = " Check --match (label matchers such as cluster=\"a\")."
        return PrometheusApiError(
            self.url, f"Prometheus at {self.url} refused the query {query} (HTTP "
                      f"{http_status}, {etype}): {err}.{fix}", http_status=http_status, error_type=etype)


def _read(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read() or b""
    except OSError:
        return b""


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def _parse_meta(value: str) -> float:
    return dt.datetime.fromisoformat(value).timestamp()


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


# -- the backfill --------------------------------------------------------------------------------
def backfill(store: Store, url: str, start: dt.datetime, end: dt.datetime, *,
             step_s: float = 60.0, chunk_s: float = 6 * 3600.0, match: str = "",
             node_label: str | None = None, fetch: Fetch = urllib_fetch,
             timeout_s: float = 60.0, restart: bool = False,
             progress: Progress | None = None,
             clock: Callable[[], float] = time.monotonic) -> BackfillResult:
    """Copy dcgm-exporter history in ``[start, end]`` from Prometheus at ``url`` into ``store``."""
    if step_s <= 0 or chunk_s <= 0:
        raise BackfillError(url, f"--step ({step_s:g}s) and --chunk ({chunk_s:g}s) must be > 0")
    if chunk_s / step_s > MAX_POINTS_PER_SERIES:
        raise BackfillError(url, f"--chunk {chunk_s:g}s at --step {step_s:g}s asks for "
                                 f"{chunk_s / step_s:,.0f} points per series; Prometheus "
                                 f"returns at most {MAX_POINTS_PER_SERIES:,}: use a smaller "
                                 "--chunk or a larger --step")
    if end <= start:
        raise BackfillError(url, f"--until {end.isoformat()} is not after the start "
                                 f"{start.isoformat()}; widen --since or move --until")
    client = PrometheusClient(url, fetch=fetch, timeout_s=timeout_s)
    key = progress_key(client.url, match)
    from_key = key.removesuffix(":done_until") + ":from"
    a, b = start.timestamp(), end.timestamp()
    resumed = False
    done, done_from = store.get_meta(key), store.get_meta(from_key)
    if done and done_from and not restart:
        done_until, covered_from = _parse_meta(done), _parse_meta(done_from)
        if covered_from <= a + step_s and a < done_until:
            log.info("backfill.resume url=%s from=%s", mask_secrets(client.url), done)
            a, resumed = done_until, True
    if not resumed:
        store.set_meta(from_key, _iso(_grid(a, step_s)))
    plan = list(chunks(a, b, step_s, chunk_s))
    queries = metric_queries(match)
    t0 = clock()
    points = n_samples = added = 0
    if progress:
        progress(0, len(plan))
    for i, (c0, c1) in enumerate(plan):
        results = [client.query_matrix(q, c0, c1, step_s) for q in queries]
        points += sum(len(p) for r in results for _, p in r)
        rows = samples_table(results, node_label=node_label)
        n_samples += rows.num_rows
        new = store.insert_samples(rows)
        added += new
        store.set_meta(key, _iso(c1 + step_s))
        log.debug("backfill.chunk url=%s start=%s rows=%d added=%d", mask_secrets(client.url),
                  _num(c0), rows.num_rows, new)
        if progress:
            progress(i + 1, len(plan))
    first = plan[0][0] if plan else a
    last = plan[-1][1] if plan else min(a, b)
    log.info("backfill.done url=%s chunks=%d samples=%d added=%d", mask_secrets(client.url),
             len(plan),
             n_samples, added)
    return BackfillResult(url=client.url, start=dt.datetime.fromtimestamp(first, dt.UTC),
                          end=dt.datetime.fromtimestamp(last, dt.UTC), chunks=len(plan),
                          resumed=resumed, points=points, samples=n_samples, added=added,
                          seconds=clock() - t0)
