"""``fleetcare models list|show|promote``: the model registry, and the promotion rule.

    fleetcare models list --db PATH [--json]
    fleetcare models show MODEL_ID --db PATH [--json]
    fleetcare models promote MODEL_ID --db PATH [--force] [--json]

``promote`` makes a model current (the one ``score`` and ``serve`` use) only if it beats
the current one on its own held-out test period: both models are scored there with the
same features, labels and metrics, and the higher node-level pr_auc wins, ties broken
by recall_at_budget (``fleetcare.models.promotion``). ``--force`` promotes without the
comparison. ``promote`` exits 0 when the model is current afterwards and 1 when it was
refused; the reason is printed either way.

``list --json`` prints one JSON object (the contract, checked by the tests)::

    {"current": "m-20250311T000000-1a2b3c4d",    the current model id, or null
     "models": [                                  newest first
        {"model_id": "m-20250311T000000-1a2b3c4d",
         "created_at": "2025-03-11T00:00:00+00:00",   ISO 8601, UTC
         "is_current": true,
         "origin": "fleet",                       fleet (its own data) or prior (shipped)
         "current_reason": "...",                 why it scores (null when not current)
         "horizon_h": 24.0,
         "train_range": [ISO, ISO], "cal_range": [ISO, ISO], "test_range": [ISO, ISO],
                                                  null ends where not recorded
         "n_features": 212,
         "pr_auc": 0.61, "recall_at_budget": 0.5}]}   held-out metrics at training, or null

``show --json``: the same object for one model, plus ``"features"`` (names, in model
order), ``"params"`` (hyperparameters) and ``"metrics"`` (all held-out metrics).

``promote --json``: ``{"model_id", "promoted": bool, "reason": "...",
"previous_model_id": id|null, "period": [ISO, ISO]|null, "new_metrics": {...}|null,
"current_metrics": {...}|null}`` where the metrics objects hold pr_auc,
recall_at_budget, false_drains_per_1000_node_days, median_lead_time_h, n_failures and
node_days of each model on the comparison period (null when no comparison ran).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

_DOC = __doc__ or ""
_CONTRACT = _DOC[_DOC.index("``list --json``"):].replace("``", "")
"""The JSON contract, shown by --help (generated from this docstring, not retyped)."""


def add_parser(subparsers: Any) -> None:
    m = subparsers.add_parser(
        "models", help="list, show and promote trained models (the model registry)",
        description=_DOC[_DOC.index("``promote`` makes"):_DOC.index("``list --json``")]
        .strip().replace("``", ""),
        epilog=_CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = m.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="every registered model, newest first",
                        epilog=_CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    sh = sub.add_parser("show", help="one model: ranges, features, parameters, metrics")
    sh.add_argument("model_id", metavar="MODEL_ID")
    pr = sub.add_parser("promote", help="make a model current if it beats the current one",
                        description="Score MODEL_ID and the current model on MODEL_ID's "
                                    "held-out test period; make MODEL_ID current only if "
                                    "its pr_auc is higher (ties: recall_at_budget). Exit 1 "
                                    "when refused.")
    pr.add_argument("model_id", metavar="MODEL_ID")
    pr.add_argument("--force", action="store_true",
                    help="make it current without comparing the models")
    for p in (ls, sh, pr):
        p.add_argument("--db", help="DuckDB file (default: the [cli] db setting)")
        p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import CliError

    # Operational errors are reported here rather than raised to cli.main: run as
    # ``python -m fleetcare.api.cli``, main's module is __main__ and its CliError is not
    # the class this module imports, so a raised CliError would escape as a traceback.
    try:
        return _run(args, cfg)
    except CliError as exc:
        print(f"fleetcare models: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import CliError, existing_db, print_json
    from fleetcare.models import registry
    from fleetcare.pipeline.store import Store, StoreError

    try:
        store = Store(existing_db(args.db or cfg.db))
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    try:
        if args.models_command == "list":
            recs = registry.list_models(store)
            cur = next((r.model_id for r in recs if r.is_current), None)
            if args.json:
                print_json({"current": cur, "models": [record_json(r) for r in recs]})
            else:
                _print_list(recs)
            return 0
        if args.models_command == "show":
            try:
                rec = registry.get(store, args.model_id)
            except registry.ModelNotFoundError as exc:
                raise CliError(_not_found(exc, store.path)) from None
            if args.json:
                print_json(record_json(rec, full=True))
            else:
                _print_show(rec)
            return 0
        return _promote(store, args)
    finally:
        store.close()


def _not_found(exc: Exception, db: str) -> str:
    mid = getattr(exc, "model_id", "?")
    return f"no model {mid!r} in the registry of {db}: see `fleetcare models list --db {db}`"


def _promote(store: Any, args: argparse.Namespace) -> int:
    from fleetcare.api.commands.common import CliError, print_json
    from fleetcare.models import promotion, registry

    progress = None if args.json else (lambda msg: print(f"  {msg}", file=sys.stderr))
    try:
        decision = promotion.consider(store, args.model_id, force=args.force,
                                      progress=progress)
    except registry.ModelNotFoundError as exc:
        raise CliError(_not_found(exc, store.path)) from None
    if args.json:
        print_json(decision.as_json())
    else:
        print(decision.reason)
        for name, m in (("new", decision.new_metrics), ("current", decision.current_metrics)):
            if m is not None:
                print(f"  {name:8s} pr_auc {_num(m.get('pr_auc'))}  recall_at_budget "
                      f"{_num(m.get('recall_at_budget'))}  failures {m.get('n_failures')}")
        if not decision.promoted:
            print(f"{args.model_id} stays a candidate; promote it anyway with --force",
                  file=sys.stderr)
    return 0 if decision.promoted else 1


def _iso(ts: dt.datetime | None) -> str | None:
    if ts is None:
        return None
    return (ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)).isoformat()


def record_json(rec: Any, *, full: bool = False) -> dict[str, Any]:
    """A ``registry.ModelRecord`` as the JSON contract (``show`` adds the full fields)."""
    out: dict[str, Any] = {
        "model_id": rec.model_id, "created_at": _iso(rec.created_at),
        "is_current": rec.is_current, "origin": rec.origin,
        "current_reason": rec.current_reason, "horizon_h": rec.horizon_h,
        "train_range": [_iso(t) for t in rec.train_range],
        "cal_range": [_iso(t) for t in rec.cal_range],
        "test_range": [_iso(t) for t in rec.test_range],
        "n_features": len(rec.features),
        "pr_auc": rec.metrics.get("pr_auc"),
        "recall_at_budget": rec.metrics.get("recall_at_budget"),
    }
    if full:
        out.update(features=rec.features, params=rec.params, metrics=rec.metrics)
    return out


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def _span(r: tuple[dt.datetime | None, dt.datetime | None]) -> str:
    a, b = r
    return f"{a:%Y-%m-%d %H:%M} .. {b:%Y-%m-%d %H:%M}" if a and b else "-"


def _print_list(recs: list[Any]) -> None:
    if not recs:
        print("no models yet: train one with `fleetcare train`")
        return
    print(f"  {'model_id':28s} {'origin':6s} {'created (UTC)':16s} {'horizon':>7s} "
          f"{'pr_auc':>7s} {'recall':>7s}  test period (UTC)")
    for r in recs:
        print(f"{'*' if r.is_current else ' '} {r.model_id:28s} {r.origin:6s} "
              f"{r.created_at:%Y-%m-%d %H:%M} {r.horizon_h:6g}h "
              f"{_num(r.metrics.get('pr_auc')):>7s} "
              f"{_num(r.metrics.get('recall_at_budget')):>7s}  {_span(r.test_range)}")
    cur = next((r for r in recs if r.is_current), None)
    if cur is not None and cur.current_reason:
        print(f"* scores because: {cur.current_reason}")
    point = cur.metrics if cur is not None else {}
    if point.get("hold_h") and point.get("threshold") is not None:
        hold, at_once = f"{point['hold_h']:g}", point.get("immediate")
        print(f"* its operating point: risk {point['threshold']:.3f} held {hold} h"
              + (f", or {at_once:g} at once" if at_once is not None else "")
              + " (alerts fire there unless [alerts] sets threshold, for or "
              "immediate_threshold: threshold = \"model\" follows the scoring model; the "
              f"same as a fixed rule: threshold = {point['threshold']:.3f}, "
              f"for = \"{hold}h\""
              + (f", immediate_threshold = {at_once:g}" if at_once is not None else "") + ")")
    head = (cur.metrics.get("network_head") or {}) if cur is not None else {}
    if head.get("threshold") is not None:
        v = head.get("validation") or {}
        by_mode = (v.get("detected_by_mode") or {}).values()
        caught, of = sum(c for c, _ in by_mode), sum(n for _, n in by_mode)
        print(f"* its network head's own operating threshold: P {head['threshold']:.4f} "
              f"of a network failure within 72 h from the InfiniBand ports alone (on its "
              f"simulated validation fleet {caught} of {of} caught at "
              f"{_num(v.get('false_drains_per_1000_node_days'))} false drains / 1,000 "
              "node-days; alerts with threshold = \"model\" fire there too, a fixed rule "
              "does not)")
    print("(recall = recall_at_budget on each model's own held-out data; the prior's on its "
          "simulated validation fleets)")


def _print_show(r: Any) -> None:
    from fleetcare.api.commands.common import print_metrics

    print(f"{r.model_id}{'  (current)' if r.is_current else ''}")
    print(f"  origin       {r.origin}"
          f"{' (the fleet prior shipped with fleetcare)' if r.origin == 'prior' else ''}")
    if r.current_reason:
        print(f"  current      {r.current_reason}")
    print(f"  created      {r.created_at:%Y-%m-%d %H:%M:%S} UTC")
    print(f"  horizon      {r.horizon_h:g} h")
    for name, rng in (("train", r.train_range), ("calibrate", r.cal_range),
                      ("test", r.test_range)):
        print(f"  {name:12s} {_span(rng)}")
    print(f"  features     {len(r.features)}: {', '.join(r.features[:6])}"
          f"{', ...' if len(r.features) > 6 else ''}")
    print(f"  params       {', '.join(f'{k}={v}' for k, v in sorted(r.params.items()) if k != 'monotone_increasing')}")
    print("  held-out metrics:")
    print_metrics(r.metrics, indent="    ")  # rounded for people; --json keeps them whole
