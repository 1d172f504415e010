"""The evaluation report as one self-contained HTML file (images embedded as base64 PNG).

PR curves (model vs logistic regression, node level), the lead-time histogram, recall per
failure mode for each method *at the false-drain budget* (a rule that breaks the budget
cannot run at it: its recall there is 0, whatever it catches unbudgeted), and the goodput
comparison. The report says in words where fleetcare loses to a baseline (``losses``).
Every page, and every plot's title, says simulated data when the report comes from the
simulator.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("fleetcare", "reactive_xid", "dcgm_thresholds", "logistic")


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def recall_by_mode_at_budget(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Recall per failure mode at the budget (<= 1 false drain / 1,000 node-days): the
    model and logistic regression are measured at their budget threshold already; a rule
    has one operating point, so over the budget its recall at the budget is 0."""
    by = dict(metrics.get("recall_by_mode") or {})
    if metrics.get("within_budget") is False:
        return {m: (0.0 if v is not None else None) for m, v in by.items()}
    return by


def _simulated(report: dict[str, Any]) -> bool:
    return bool(report.get("simulated", True))


def titled(title: str, report: dict[str, Any]) -> str:
    """A plot title, marked when its numbers come from the simulator."""
    return f"{title} (simulated data)" if _simulated(report) else title


BUDGET = "<= 1 false drain / 1,000 node-days"


def figures(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each plot: name -> (its title, base64 PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve

    curves = report.get("_curves", {})
    out = {}

    def keep(name: str, fig: Any, ax: Any, title: str) -> None:
        t = titled(title, report)
        ax.set_title(t, fontsize=9)
        out[name] = (t, _png(fig))

    fig, ax = plt.subplots(figsize=(5, 4))
    for name in ("model", "logistic"):
        y, s = curves.get(name, (np.zeros(0), np.zeros(0)))
        if len(y) and np.any(y) and not np.all(y):
            p, r, _ = precision_recall_curve(y, s)
            ax.plot(r, p, label=f"{'fleetcare' if name == 'model' else name}")
    ax.set(xlabel="recall (node-hours)", ylabel="precision")
    ax.legend()
    keep("pr", fig, ax, "PR curve, test period")

    fig, ax = plt.subplots(figsize=(5, 4))
    leads = curves.get("lead_times_h", [])
    ax.hist(leads, bins=12, range=(0, report.get("test_period", {}).get("window_h", 72)))
    ax.set(xlabel="lead time (h)", ylabel="failures")
    keep("lead", fig, ax, f"fleetcare lead time at the budget threshold (n={len(leads)})")

    fig, ax = plt.subplots(figsize=(7, 4))
    by = {"fleetcare": recall_by_mode_at_budget(report["model"]),
          **{k: recall_by_mode_at_budget(v) for k, v in report["baselines"].items()}}
    modes = sorted({m for v in by.values() for m in v})
    w = 0.8 / max(len(by), 1)
    for i, (name, rec) in enumerate(by.items()):
        ax.bar(np.arange(len(modes)) + i * w, [rec.get(m) or 0.0 for m in modes], w, label=name)
    ax.set_xticks(np.arange(len(modes)) + 0.4 - w / 2, modes)
    ax.set(ylabel=f"recall at {BUDGET}", ylim=(0, 1))
    ax.legend(fontsize=7)
    keep("modes", fig, ax, f"recall per failure mode at the budget ({BUDGET})")

    fig, ax = plt.subplots(figsize=(6, 4))
    names = ("no_action", "reactive_xid", "dcgm_thresholds", "fleetcare")
    g = report["goodput"]
    ax.bar(names, [g[n]["gpu_hours_lost"] for n in names],
           color=["grey", "tab:orange", "tab:green", "tab:blue"])
    ax.set(ylabel="GPU-hours lost")
    keep("goodput", fig, ax, "goodput: GPU-hours lost over the test period")
    return out


def losses(report: dict[str, Any]) -> list[str]:
    """Sentences saying where fleetcare does worse than a baseline on this report's
    numbers: recall at the budget (overall and per failure mode), PR-AUC, median lead
    time, and GPU-hours lost in the goodput simulation."""
    m = report["model"]
    out = []

    def worse(what: str, base: str, ours: float | None, theirs: float | None,
              higher_is_better: bool = True, fmt: str = "{:.3f}") -> None:
        if ours is None or theirs is None:
            return
        if (theirs > ours) if higher_is_better else (theirs < ours):
            out.append(f"{base} beats fleetcare on {what}: {fmt.format(theirs)} vs "
                       f"{fmt.format(ours)}.")

    for name, b in report["baselines"].items():
        worse(f"recall at the budget ({BUDGET})", name, m.get("recall_at_budget"),
              b.get("recall_at_budget"))
        if b.get("pr_auc") is not None:
            worse("PR-AUC", name, m.get("pr_auc"), b.get("pr_auc"))
        ours_modes = recall_by_mode_at_budget(m)
        for mode, r in sorted(recall_by_mode_at_budget(b).items()):
            worse(f"recall at the budget for {mode} failures", name, ours_modes.get(mode), r,
                  fmt="{:.2f}")
        # a longer lead only counts at a comparable recall: a rule over budget has none
        if b.get("within_budget") is not False and (b.get("recall_at_budget") or 0) > 0:
            worse("median lead time (h)", name, m.get("median_lead_time_h"),
                  b.get("median_lead_time_h"), fmt="{:.1f}")
    g = report.get("goodput", {})
    for name in ("reactive_xid", "dcgm_thresholds"):
        if name in g and "fleetcare" in g:
            worse("GPU-hours lost (goodput simulation)", name, g["fleetcare"]["gpu_hours_lost"],
                  g[name]["gpu_hours_lost"], higher_is_better=False, fmt="{:,.1f}")
    return out


def render_html(report: dict[str, Any]) -> str:
    figs = figures(report)
    simulated = _simulated(report)
    banner = ("<div class='banner'>SIMULATED DATA: every number below comes from the fleetcare "
              "simulator, not from a real fleet.</div>" if simulated else "")
    rows = []
    methods = {"fleetcare": report["model"], **report["baselines"]}
    for name, m in methods.items():
        cells = "".join(f"<td>{html.escape(_fmt(m.get(k)))}</td>" for k in (
            "pr_auc", "recall_at_budget", "false_drains_per_1000_node_days",
            "median_lead_time_h", "p10_lead_time_h"))
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    grows = []
    for name in ("no_action", "reactive_xid", "dcgm_thresholds", "fleetcare"):
        g = report["goodput"][name]
        cells = "".join(f"<td>{html.escape(_fmt(g.get(k)))}</td>" for k in (
            "gpu_hours_lost", "interruptions_avoided", "false_drains", "ettr"))
        grows.append(f"<tr><th>{name}</th>{cells}</tr>")
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    img = "".join(f"<img alt='{html.escape(t, quote=True)}' src=\"data:image/png;base64,{v}\">"
                  for t, v in figs.values())
    lost = losses(report)
    where = ("<p>Where fleetcare loses to a baseline in this run:</p><ul>"
             + "".join(f"<li>{html.escape(x)}</li>" for x in lost) + "</ul>" if lost else
             "<p>fleetcare loses to no baseline in this run on recall at the budget, "
             "recall per failure mode, PR-AUC, lead time or GPU-hours lost.</p>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>fleetcare evaluation (SIMULATED DATA)</title>
<style>body{{font-family:sans-serif;margin:2em}} .banner{{background:#b00;color:#fff;
padding:.6em;font-size:1.3em;font-weight:bold}} td,th{{padding:.2em .6em;text-align:right}}
img{{max-width:48%;margin:.5em}}</style></head><body>
{banner}
<h1>fleetcare evaluation</h1>
<p>{html.escape(str(report.get('setting', '')))}. Test period:
{html.escape(json.dumps(report.get('test_period', {})))}</p>
<h2>Prediction (node level, budget 1 false drain / 1,000 node-days)</h2>
<table><tr><th>method</th><th>PR-AUC</th><th>recall@budget</th><th>false drains /1000 nd</th>
<th>median lead h</th><th>p10 lead h</th></tr>{''.join(rows)}</table>
<h2>Where fleetcare loses</h2>
{where}
<h2>Goodput (job-level simulation)</h2>
<table><tr><th>policy</th><th>GPU-h lost</th><th>interruptions avoided</th><th>false drains</th>
<th>ETTR</th></tr>{''.join(grows)}</table>
{img}
<h2>Raw numbers</h2><pre>{html.escape(json.dumps(public, indent=1, default=str))}</pre>
{banner}
</body></html>
"""


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def write_html(report: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.write_text(render_html(report), encoding="utf-8")
    return p
