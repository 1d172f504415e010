"""``fleetcare evaluate``: the model against the baselines, in drains and GPU-hours.

    fleetcare evaluate --db PATH [--horizon 24h] [--window 72h] [--json] [--html report.html]
                       [--job-gpus 8,64,512,1024,4096] [--checkpoint-interval 1h]
                       [--restart-overhead 15m] [--drain-cost 24] [--seed 0]
    fleetcare evaluate --train-db A --test-db B [...]
    fleetcare evaluate --db shard0.duckdb --db shard1.duckdb [...]   # one fleet in shards

With ``--db`` a fresh model is trained on the store's own train period (the first 60 % of
its time; nothing is registered, the current model is not used) and every method is
measured on the last 25 %. With ``--train-db``/``--test-db`` the model is trained on all
of fleet A and measured on fleet B's last 25 %.

The model predicts failure within the horizon H (24 h); its alarms are judged over the
warning window W (72 h): a drain is false unless its node fails within W, so a GPU whose
HBM errors ramp for two days is rightly drained 40 h early. An alarm in the first row
after its node's failure reacts to the failure (the node is down): not a false drain.
The day after each failure neither trains nor calibrates the model (it shows the failure
itself); the test period keeps every row.

``--json`` prints one JSON object (the contract, checked by the tests)::

    {"simulated": true,
     "fleet": {"nodes", "gpus", "test_node_days", "failures", "failures_with_precursors",
               "simulation": [the simulator's settings of each store] | null},
     "model": {"pr_auc", "recall_at_budget", "recall_ci95": [lo, hi] (Wilson, 95 %),
               "n_failures", "detected", "false_drains_per_1000_node_days",
               "median_lead_time_h", "p10_lead_time_h", "recall_by_mode": {...}, "ece",
               "network_head": {"train_positives", "cal_positives", "calibration",
                                "features", "horizon_h"} | null, ...},
                (network_head: the node-level model of cable/switch and NIC failures fitted
                beside the GPU model when the fleet reports InfiniBand ports and had
                network failures; node risks above combine both)
     "prior": {...the model's keys, "model_id", "at_shipped_threshold": {...}} | null,
                the fleet prior shipped with fleetcare on the same test rows
     "baselines": {"reactive_xid": {...same keys...}, "dcgm_thresholds": {...},
                   "logistic": {...}},
     "goodput": {"no_action": {"gpu_hours_lost", ...},
                 "reactive_xid": {...}, "dcgm_thresholds": {...},
                 "fleetcare": {"gpu_hours_lost", "interruptions_avoided", "false_drains",
                               "ettr", "threshold", ...},
                 "cost_model": {...}},
     "test_period": {...}, "setting": "..."}
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

_DOC = __doc__ or ""
_CONTRACT = _DOC[_DOC.index("``--json``"):].replace("``", "")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "evaluate", help="evaluate the model against reactive XID rules, DCGM thresholds "
                         "and logistic regression, with a goodput simulation",
        description=_DOC[:_DOC.index("``--json``")].replace("``", ""),
        epilog=_CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", action="append",
                   help="DuckDB file to evaluate on (default: the [cli] db setting); repeat "
                        "it for the shards of one fleet (same time, different nodes)")
    p.add_argument("--lake", default=None,
                   help="read raw telemetry from this Parquet lake (`fleetcare ingest --lake` "
                        "workers); the one --db is the state DB (rollups, models)")
    p.add_argument("--train-db", action="append",
                   help="train on this fleet (all of its time; repeatable for shards) ...")
    p.add_argument("--test-db", action="append",
                   help="... and test on this fleet's last 25 %% (repeatable for shards)")
    p.add_argument("--horizon", default=None, help="prediction horizon H: what the model's "
                   "probability means, and its training label (default 24h)")
    p.add_argument("--window", default=None,
                   help="warning window W: a drain is false unless its node fails within W, "
                        "and a failure counts as detected when an alarm came within W before "
                        "it (default 72h; at least the horizon)")
    p.add_argument("--seed", type=int, default=None, help="model seed")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--html", default=None, metavar="PATH", help="write a self-contained HTML report")
    p.add_argument("--job-gpus", default="8,64,512,1024,4096",
                   help="job sizes in GPUs the fleet's nodes serve, comma-separated "
                        "(default 8,64,512,1024,4096)")
    p.add_argument("--checkpoint-interval", default="1h", help="checkpoint interval Δ (default 1h)")
    p.add_argument("--restart-overhead", default="15m", help="restart overhead u0 (default 15m)")
    p.add_argument("--drain-cost", type=float, default=24.0,
                   help="GPU-hours a planned drain costs (default 24)")


def _job_sizes(text: str) -> tuple[int, ...]:
    from fleetcare.api.commands.common import CliError

    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise CliError(f"--job-gpus {text!r} must be one or more GPU counts >= 1, "
                       "comma-separated, e.g. 8,64,1024")
    return sizes


def run(args: argparse.Namespace, cfg: Any) -> int:
    from fleetcare.api.commands.common import CliError, open_store, print_json, progress_steps
    from fleetcare.collectors.durations import parse_duration
    from fleetcare.models import evaluation as E
    from fleetcare.models.goodput import CostModel, GoodputError
    from fleetcare.pipeline.store import StoreError

    if bool(args.train_db) != bool(args.test_db):
        raise CliError("--train-db and --test-db go together: give both, or --db alone")
    if args.train_db and args.db:
        raise CliError("--db cannot be combined with --train-db/--test-db")
    if args.lake and (args.train_db or len(args.db or []) > 1):
        raise CliError("--lake goes with one --db (the state DB over the lake)")
    def hours(flag: str, text: str) -> float:
        try:
            return parse_duration(text, bare=None) / 3600
        except ValueError as exc:
            raise CliError(f"{flag}: {exc}") from exc

    try:
        cost = CostModel(job_gpus=max(_job_sizes(args.job_gpus)),
                         checkpoint_interval_h=hours("--checkpoint-interval",
                                                     args.checkpoint_interval),
                         restart_overhead_h=hours("--restart-overhead", args.restart_overhead),
                         drain_cost_gpu_h=args.drain_cost)
    except GoodputError as exc:
        flag = {"checkpoint_interval_h": "--checkpoint-interval",
                "restart_overhead_h": "--restart-overhead",
                "drain_cost_gpu_h": "--drain-cost"}.get(exc.name, "--job-gpus")
        raise CliError(f"{flag}: {exc}") from exc
    horizon_h = hours("--horizon", args.horizon or getattr(cfg, "horizon", "24h"))
    window_h = hours("--window", args.window or "72h")
    if window_h < horizon_h:
        raise CliError(f"--window {window_h:g}h is shorter than the horizon {horizon_h:g}h: "
                       "an alarm must be judged over at least what it predicts")
    seed = args.seed if args.seed is not None else getattr(cfg, "seed", 0)
    ecfg = E.EvalConfig(horizon_h=horizon_h, window_h=window_h, seed=seed, cost=cost,
                        job_sizes=_job_sizes(args.job_gpus))
    # timed steps on stderr (as before, in text mode; --json keeps stderr quiet)
    say = progress_steps("evaluate", enabled=True) if not args.json else None
    try:
        with contextlib.ExitStack() as stack:
            def open_all(paths: list[str]) -> list[Any]:
                out = []
                for path in paths:
                    st = open_store(path, lake=args.lake, create=bool(args.lake),
                                    sync=True)
                    stack.callback(st.close)
                    out.append(st)
                return out

            if args.train_db:
                report = E.evaluate_cross(open_all(args.train_db), open_all(args.test_db),
                                          ecfg, progress=say)
            else:
                report = E.evaluate_store(open_all(args.db or [cfg.db]), ecfg, progress=say)
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    except Exception as exc:  # TrainError / FitError: say what the store lacks
        if type(exc).__name__ in ("TrainError", "FitError"):
            raise CliError(str(exc)) from exc
        raise
    if args.html:
        from fleetcare.models.report import write_html

        write_html(report, args.html)
    out = E.public(report)
    if args.json:
        print_json(out)
    else:
        _print_text(out, args.html)
    return 0


def _fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def _ci(m: dict[str, Any]) -> str:
    ci = m.get("recall_ci95")
    return f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"


def _print_text(out: dict[str, Any], html: str | None) -> None:
    f = out.get("fleet") or {}
    print("SIMULATED DATA" + (f": {'; '.join(f['simulation'])}" if f.get("simulation") else ""))
    print(f"test period: {f.get('nodes')} nodes, {f.get('test_node_days')} node-days, "
          f"{f.get('failures')} failures ({f.get('failures_with_precursors')} with "
          "precursors); one failure is "
          f"{1 / f['failures']:.2f} of recall" if f.get("failures") else "")
    rows = [("fleetcare", out["model"])]
    if out.get("prior"):
        rows.append(("fleet prior", out["prior"]))
    rows += list(out["baselines"].items())
    print(f"{'method':<16} {'pr_auc':>7} {'recall@budget':>13} {'95% CI':>10} {'fd/1000nd':>9} "
          f"{'lead_h':>7}")
    for name, m in rows:
        print(f"{name:<16} {_fmt(m.get('pr_auc')):>7} {_fmt(m.get('recall_at_budget')):>13} "
              f"{_ci(m):>10} {_fmt(m.get('false_drains_per_1000_node_days')):>9} "
              f"{_fmt(m.get('median_lead_time_h')):>7}")
    head = out["model"].get("network_head")
    if head:
        print(f"(fleetcare's node risks include its network head: fitted on "
              f"{head['train_positives']} node-hours before a cable/switch or NIC failure)")
    if out.get("prior"):
        s = out["prior"]["at_shipped_threshold"]
        net = s.get("network_threshold")
        print(f"(fleet prior at its shipped threshold {_fmt(s['threshold'])}"
              + (f", its network head at {_fmt(net)}" if net is not None else "") + ": recall "
              f"{_fmt(s['recall_at_budget'])} [{_ci(s)}], "
              f"{_fmt(s['false_drains_per_1000_node_days'])} false drains / 1,000 node-days)")
    print(f"\n{'goodput':<16} {'GPU-h lost':>10} {'avoided':>8} {'false drains':>12} {'ETTR':>6}")
    for name in ("no_action", "reactive_xid", "dcgm_thresholds", "fleetcare"):
        g = out["goodput"][name]
        print(f"{name:<16} {g['gpu_hours_lost']:>10.1f} {g['interruptions_avoided']:>8} "
              f"{g['false_drains']:>12} {g['ettr']:>6.3f}")
    from fleetcare.models.report import losses

    lost = losses(out)
    print("\nwhere fleetcare loses to a baseline in this run:" if lost else
          "\nfleetcare loses to no baseline in this run.")
    for line in lost:
        print(f"  {line}")
    if html:
        print(f"\nreport written to {html}")
