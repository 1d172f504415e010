"""The HTML evaluation report: recall per mode at the budget, where fleetcare loses, and
simulated data named in every plot."""

from __future__ import annotations

import re

import numpy as np

from fleetcare.models.report import figures, losses, recall_by_mode_at_budget, render_html


def _report(**over):
    report = {
        "simulated": True,
        "model": {"pr_auc": 0.41, "recall_at_budget": 0.5, "median_lead_time_h": 20.0,
                  "false_drains_per_1000_node_days": 0.9,
                  "recall_by_mode": {"hbm": 0.8, "nvlink": 0.2, "none": 0.0}},
        "baselines": {
            "reactive_xid": {"pr_auc": None, "recall_at_budget": 0.0, "within_budget": False,
                             "median_lead_time_h": 0.0, "false_drains_per_1000_node_days": 9.0,
                             "recall_by_mode": {"hbm": 1.0, "nvlink": 1.0, "none": 0.5}},
            "dcgm_thresholds": {"pr_auc": None, "recall_at_budget": 0.6, "within_budget": True,
                                "median_lead_time_h": 30.0,
                                "false_drains_per_1000_node_days": 0.5,
                                "recall_by_mode": {"hbm": 0.4, "nvlink": 0.9, "none": 0.0}},
            "logistic": {"pr_auc": 0.2, "recall_at_budget": 0.3, "median_lead_time_h": 5.0,
                         "false_drains_per_1000_node_days": 1.0,
                         "recall_by_mode": {"hbm": 0.6, "nvlink": 0.0, "none": 0.0}}},
        "goodput": {k: {"gpu_hours_lost": v, "interruptions_avoided": 0, "false_drains": 0,
                        "ettr": 0.9}
                    for k, v in (("no_action", 1000.0), ("reactive_xid", 1000.0),
                                 ("dcgm_thresholds", 700.0), ("fleetcare", 800.0))},
        "test_period": {"window_h": 72.0},
        "_curves": {"model": (np.array([0, 1, 0, 1]), np.array([0.1, 0.9, 0.3, 0.6])),
                    "logistic": (np.array([0, 1, 0, 1]), np.array([0.2, 0.5, 0.4, 0.3])),
                    "lead_times_h": [5.0, 20.0, 40.0]},
    }
    report.update(over)
    return report


def test_a_rule_over_the_budget_has_zero_recall_per_mode_at_the_budget():
    r = _report()
    assert recall_by_mode_at_budget(r["baselines"]["reactive_xid"]) == {
        "hbm": 0.0, "nvlink": 0.0, "none": 0.0}
    assert recall_by_mode_at_budget(r["baselines"]["dcgm_thresholds"]) == {
        "hbm": 0.4, "nvlink": 0.9, "none": 0.0}
    assert recall_by_mode_at_budget(r["model"]) == r["model"]["recall_by_mode"]


def test_losses_say_where_a_baseline_does_better():
    lost = losses(_report())
    assert ("dcgm_thresholds beats fleetcare on recall at the budget (<= 1 false drain / "
            "1,000 node-days): 0.600 vs 0.500.") in lost
    assert ("dcgm_thresholds beats fleetcare on recall at the budget for nvlink failures: "
            "0.90 vs 0.20.") in lost
    assert "dcgm_thresholds beats fleetcare on median lead time (h): 30.0 vs 20.0." in lost
    assert ("dcgm_thresholds beats fleetcare on GPU-hours lost (goodput simulation): 700.0 vs "
            "800.0.") in lost
    # over its budget the reactive rule's unbudgeted 1.0 per mode is no win
    assert not any(x.startswith("reactive_xid") for x in lost), lost
    assert not any(x.startswith("logistic") for x in lost), lost
    better = _report()
    better["baselines"].pop("dcgm_thresholds")
    better["goodput"]["dcgm_thresholds"]["gpu_hours_lost"] = 900.0
    assert losses(better) == []


def test_html_names_simulated_data_in_every_plot_and_the_losses():
    r = _report()
    figs = figures(r)
    assert set(figs) == {"pr", "lead", "modes", "goodput"}
    for title, png in figs.values():
        assert title.endswith("(simulated data)"), title
        assert png
    assert "at the budget (<= 1 false drain / 1,000 node-days)" in figs["modes"][0]
    page = render_html(r)
    alts = re.findall(r"<img alt='([^']*)'", page)
    assert len(alts) == 4 and all(a.endswith("(simulated data)") for a in alts)
    assert "Where fleetcare loses" in page and "dcgm_thresholds beats fleetcare" in page
    real = figures(_report(simulated=False))
    assert not any("simulated" in t for t, _ in real.values())
