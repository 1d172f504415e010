"""The evaluation report as one self-contained HTML file (images embedded as base64 PNG).

PR curves (model vs logistic regression, node level), the lead-time histogram, recall per
failure mode for each method, and the goodput comparison. Every page says SIMULATED DATA
when the report comes from the simulator.
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


def _figures(report: dict[str, Any]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve

    curves = report.get("_curves", {})
    out = {}
    fig, ax = plt.subplots(figsize=(5, 4))
    for name in ("model", "logistic"):
        y, s = curves.get(name, (np.zeros(0), np.zeros(0)))
        if len(y) and np.any(y) and not np.all(y):
            p, r, _ = precision_recall_curve(y, s)
            ax.plot(r, p, label=f"{'fleetcare' if name == 'model' else name}")
    ax.set(xlabel="recall (node-hours)", ylabel="precision", title="PR curve, test period")
    ax.legend()
    out["pr"] = _png(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    leads = curves.get("lead_times_h", [])
    ax.hist(leads, bins=12, range=(0, report.get("test_period", {}).get("window_h", 72)))
    ax.set(xlabel="lead time (h)", ylabel="failures",
           title=f"fleetcare lead time at the budget threshold (n={len(leads)})")
    out["lead"] = _png(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    by = {"fleetcare": report["model"]["recall_by_mode"],
          **{k: v["recall_by_mode"] for k, v in report["baselines"].items()}}
    modes = sorted({m for v in by.values() for m in v})
    w = 0.8 / max(len(by), 1)
    for i, (name, rec) in enumerate(by.items()):
        ax.bar(np.arange(len(modes)) + i * w, [rec.get(m) or 0.0 for m in modes], w, label=name)
    ax.set_xticks(np.arange(len(modes)) + 0.4 - w / 2, modes)
    ax.set(ylabel="recall at budget", ylim=(0, 1), title="recall per failure mode")
    ax.legend(fontsize=7)
    out["modes"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    names = ("no_action", "reactive_xid", "dcgm_thresholds", "fleetcare")
    g = report["goodput"]
    ax.bar(names, [g[n]["gpu_hours_lost"] for n in names],
           color=["grey", "tab:orange", "tab:green", "tab:blue"])
    ax.set(ylabel="GPU-hours lost", title="goodput: GPU-hours lost over the test period")
    out["goodput"] = _png(fig)
    return out


def render_html(report: dict[str, Any]) -> str:
    figs = _figures(report)
    simulated = report.get("simulated", True)
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
    img = "".join(f"<img alt='{k}' src=\"data:image/png;base64,{v}\">" for k, v in figs.items())
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
