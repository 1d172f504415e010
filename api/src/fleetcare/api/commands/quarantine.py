"""``fleetcare quarantine list|stats``: what ingest refused, why, and the bytes it kept.

    fleetcare quarantine list --db PATH [--limit N] [--since T] [--code C] [--json]
    fleetcare quarantine stats --db PATH [--since T] [--json]

``--since`` takes an ISO 8601 time (``2026-03-01``, ``2026-03-01T12:00:00Z``; naive = UTC)
or a duration back from now (``24h``, ``7d``). ``--code`` is a reason code of
``fleetcare.pipeline.validate.CODES``. Rows are listed newest first.

``list --json`` prints one JSON object (the contract, checked by the tests)::

    {"quarantined": [                       newest first, at most --limit (default 100)
        {"received_at": "2026-03-01T12:00:00.123456+00:00",   ISO 8601, UTC
         "source": "fleetcare.telemetry/0@17#samples[2]",     topic/partition@offset[#record]
         "code": "temperature_out_of_range",  reason code; null for rows quarantined
                                              before codes existed
         "reason": "samples[2].gpu_temp_c = 10000.0 is outside ...",
         "raw_base64": "...",                 the stored bytes, base64 (standard alphabet)
         "raw_preview": "..."}],              see below
     "total": 3,                              rows matching the filters, ignoring --limit
     "by_code": {"temperature_out_of_range": 2, "undecodable": 1}}
                                              matching rows per code, ignoring --limit;
                                              rows without a code count under "uncoded"

``raw_preview``: the first 200 characters of a readable rendering of the raw bytes:
msgpack or JSON bytes that decode are shown as compact JSON (NaN and infinities written
``NaN``/``Infinity``, bytes as base64, timestamps ISO 8601); anything else as Python
escapes the bytes (``b'\\xff\\xfe junk'`` without the ``b''``). Longer previews end in
``…``.

``stats --json``: ``{"total": N, "by_code": {...}, "first_received_at": ISO|null,
"last_received_at": ISO|null}``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import re
from typing import Any

import msgspec

from fleetcare.collectors.durations import parse_duration

PREVIEW_CHARS = 200
UNCODED = "uncoded"

_DOC = __doc__ or ""
_CONTRACT = _DOC[_DOC.index("``list --json``"):].replace("``", "")
"""The JSON contract, shown by --help (generated from this docstring, not retyped)."""


def add_parser(subparsers: Any) -> None:
    q = subparsers.add_parser(
        "quarantine", help="list the records ingest refused, with why and their bytes",
        description="Records that ingest refused (undecodable, wrong types, absurd values, "
                    "timestamps far off) are kept in the quarantine table with a reason "
                    "code, the reason and their raw bytes.",
        epilog=_CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = q.add_subparsers(dest="quarantine_command", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="the quarantined records, newest first",
                        description="The quarantined records, newest first.",
                        epilog=_CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--limit", type=int, default=100, help="rows to print (default 100)")
    ls.add_argument("--code", default=None, help="only this reason code, e.g. undecodable")
    st = sub.add_parser("stats", help="counts of quarantined records by reason code")
    for p in (ls, st):
        p.add_argument("--db", help="DuckDB file (default: the [cli] db setting)")
        p.add_argument("--since", default=None,
                       help="only rows received since: ISO time (UTC) or a duration back "
                            "from now (24h, 7d)")
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import CliError, existing_db, print_json
    from fleetcare.pipeline.store import Store, StoreError, one_row

    if getattr(args, "limit", 1) < 0:
        raise CliError(f"--limit {args.limit} must be >= 0")
    since = parse_since(args.since) if args.since else None
    try:
        store = Store(existing_db(args.db or cfg.db), read_only=True)
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    span: tuple[Any, Any] = (None, None)
    try:
        cur = store.cursor()
        tables = {r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        cols = {r[0] for r in cur.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'quarantine'"
        ).fetchall()}
        if "quarantine" not in tables:
            rows: list[tuple[Any, ...]] = []
            by_code: dict[str, int] = {}
        else:
            code_col = "code" if "code" in cols else "NULL::VARCHAR"
            where, params = ["TRUE"], []
            if since is not None:
                where.append("received_at >= ?")
                params.append(since)
            if getattr(args, "code", None):
                where.append(f"{code_col} = ?")
                params.append(args.code)
            base = (f"SELECT received_at, source, {code_col} AS code, reason, raw "
                    f"FROM quarantine WHERE {' AND '.join(where)}")
            by_code = {(c if c is not None else UNCODED): int(n) for c, n in cur.execute(
                f"SELECT code, count(*) FROM ({base}) GROUP BY code ORDER BY count(*) DESC, "
                "code", params).fetchall()}
            rows = []
            if args.quarantine_command == "list":
                rows = cur.execute(f"{base} ORDER BY received_at DESC, source DESC LIMIT ?",
                                   [*params, args.limit]).fetchall()
            else:
                lo, hi = one_row(cur.execute(
                    f"SELECT min(received_at), max(received_at) FROM ({base})", params))
                span = (lo, hi)
        cur.close()
    finally:
        store.close()
    total = sum(by_code.values())
    if args.quarantine_command == "stats":
        first, last = span
        out = {"total": total, "by_code": by_code,
               "first_received_at": _iso(first), "last_received_at": _iso(last)}
        if args.json:
            print_json(out)
        else:
            print(f"{total} quarantined records"
                  + (f", {out['first_received_at']} .. {out['last_received_at']}" if total else ""))
            for code, n in by_code.items():
                print(f"  {code:28s} {n:8d}")
        return 0
    items = [row_json(r) for r in rows]
    if args.json:
        print_json({"quarantined": items, "total": total, "by_code": by_code})
    else:
        print(f"{'received_at':32s} {'code':26s} {'source':40s} reason")
        for it in items:
            print(f"{it['received_at']:32s} {it['code'] or UNCODED:26s} {it['source']:40s} "
                  f"{it['reason']}")
        print(f"({len(items)} of {total} shown)")
    return 0


def row_json(row: tuple[Any, ...]) -> dict[str, Any]:
    """One quarantine row (received_at, source, code, reason, raw) as the JSON contract."""
    received_at, source, code, reason, raw = row
    raw = bytes(raw or b"")
    return {"received_at": _iso(received_at), "source": source, "code": code, "reason": reason,
            "raw_base64": base64.b64encode(raw).decode("ascii"), "raw_preview": preview(raw)}


def preview(raw: bytes) -> str:
    """A readable rendering of stored bytes, at most ``PREVIEW_CHARS`` characters."""
    text = None
    for decode in (msgspec.json.decode, msgspec.msgpack.decode):
        try:
            obj = decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=True,
                          default=_json_default)
        break
    if text is None:
        text = repr(raw)[2:-1]
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, dt.datetime):
        return obj.isoformat()
    if isinstance(obj, msgspec.msgpack.Ext):
        return {"ext": obj.code, "data": base64.b64encode(obj.data).decode("ascii")}
    return repr(obj)


def _iso(ts: dt.datetime | None) -> str | None:
    if ts is None:
        return None
    return (ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)).isoformat()


def parse_since(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """``--since``: ISO time (naive = UTC) or a duration back from ``now``; naive UTC out."""
    if re.match(r"^\s*\d+(\.\d+)?\s*[smhdw]?\s*$", text) and not re.match(r"^\d{4}", text):
        now = now or dt.datetime.now(dt.UTC)
        since = now - dt.timedelta(seconds=parse_duration(text))
    else:
        try:
            since = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"--since {text!r} is neither an ISO 8601 time "
                             "(2026-03-01T12:00:00Z) nor a duration (24h, 7d)") from None
    if since.tzinfo is not None:
        since = since.astimezone(dt.UTC).replace(tzinfo=None)
    return since

