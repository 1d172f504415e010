"""Repeat-failure risk from incident history alone (issue 16): facts known at a time, the
public trace as incidents, the shipped model rebuilt from it, reasons in plain words."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path

import numpy as np
import pytest

from fleetcare.models import recurrence as R
from fleetcare.pipeline.incident_import import CSV_COLUMNS, parse_csv

TRACE = Path(__file__).parents[2] / "bench" / "data" / "infinitehbd" / "fault_trace.json"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def day(d: float) -> dt.datetime:
    return T0 + dt.timedelta(days=d)


def history() -> R.History:
    rows = [(day(10), "a", "failure", "gpu_hbm3_memory"), (day(11), "a", "repair", "gpu_hbm3_memory"),
            (day(40), "a", "failure", "nic"), (day(41.5), "a", "repair", "nic"),
            (day(45), "b", "failure", "unknown"),
            (day(50), "c", "failure", "planned_maintenance"),
            (day(60), "a", "failure", "faulty_gpu")]
    return R.History.of(rows, nodes=["quiet"], origin=T0)


def test_facts_use_only_what_was_known_at_the_time():
    h = history()
    assert h.nodes == ("a", "b", "c", "quiet")
    f = dict(zip(R.FEATURES, R.features_at(h, 44.0)[0], strict=True))
    assert f["failures_ever"] == 2 and f["failures_7d"] == 1 and f["failures_30d"] == 1
    assert f["days_since_failure"] == pytest.approx(4.0)
    assert f["days_since_repair"] == pytest.approx(2.5)
    assert f["last_repair_h"] == pytest.approx(36.0) and f["median_repair_h"] == pytest.approx(30.0)
    assert f["last_network"] == 1 and f["in_repair"] == 0
    later = dict(zip(R.FEATURES, R.features_at(h, 60.0)[0], strict=True))
    assert later["failures_ever"] == 3 and later["in_repair"] == 1 and later["last_gpu"] == 1
    b = dict(zip(R.FEATURES, R.features_at(h, 44.0)[1], strict=True))
    assert b["failures_ever"] == 0 and np.isnan(b["days_since_failure"])  # b fails at 45
    c = dict(zip(R.FEATURES, R.features_at(h, 55.0)[2], strict=True))
    assert c["failures_ever"] == 0  # planned maintenance is not a failure
    assert list(R.labels_at(h, 44.0)) == [False, True, False, False]  # (44, 51]: b at 45
    assert list(R.labels_at(h, 53.0)) == [True, False, False, False]  # a at 60


def test_inputs_compare_nodes_on_record_for_different_spans():
    h = history()
    x = R.inputs(R.features_at(h, 44.0), 44.0)
    assert x[0, 1] == 0 and x[3, 1] == 1  # failed / never failed
    assert x[0, 0] == pytest.approx(np.log1p(4.0)) and x[3, 0] == pytest.approx(np.log1p(44.0))
    assert x[0, 2] == pytest.approx(2 / 44 * 30)
    early = R.inputs(R.features_at(h, 12.0), 12.0)  # under 30 days on record counts as 30
    assert early[0, 2] == pytest.approx(1.0) and early[3, 0] == pytest.approx(np.log1p(30.0))


def test_reasons_in_plain_words():
    h = history()
    f = R.features_at(h, 44.0)
    assert R.reasons(f[3]) == ["no failure on record"]
    words = R.reasons(f[0])
    assert words[0] == "last failed 4 days ago (network)"
    assert "failed 2 times in the last 90 days" in words
    assert words[2] == "repaired 2 days ago after 36 h in repair"
    assert R.reasons(R.features_at(h, 60.5)[0])[0].startswith("last failed 12 h ago")


def test_the_trace_is_what_the_csv_import_takes():
    events = json.loads(TRACE.read_text())
    rows = R.trace_incidents(events)
    assert len(rows) == 1168 and sum(r["kind"] == "failure" for r in rows) == 584
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    w.writeheader()
    for r in rows:
        w.writerow({**r, "ts": r["ts"].isoformat()})
    got = parse_csv(buf.getvalue())
    assert len(got) == 1168
    causes = {i.cause for i in got}
    assert {"gpu_hbm3_memory", "network_switch_cable", "nic", "unknown", "other"} <= causes
    assert R.trace_cause({"Level": "Hardware Failure", "Class": "GPU",
                          "Desc": "GPU DBE(Double Bit ECC) > Threshold"}) == "gpu_hbm3_memory"
    h = R.trace_history(events)
    assert len(h.nodes) == R.TRACE_SERVERS
    assert sum(1 for n in h.nodes if n.startswith("quiet-")) == 400 - 231


def test_the_shipped_model_is_rebuilt_from_the_trace_and_reported_on_its_later_part():
    model, report = R.build(TRACE)
    shipped = R.load()
    assert model.model_id == shipped.model_id  # the package holds what the build makes
    assert shipped.meta["later_part"] == report
    assert report["failures"] > 200 and report["alarms_per_day"] == R.ALARMS_PER_DAY
    assert "real" in shipped.meta["data"] and "first" not in report
    # what the README states: ahead of "most recent fault first" on both measures
    base = report["most_recent_fault_first"]
    assert report["model"]["roc_auc"] > base["roc_auc"]
    assert report["model"]["caught"] > base["caught"]
    lo, hi = report["roc_auc_difference_ci95"]
    assert lo < hi


def test_score_ranks_and_explains():
    h = history()
    ranked = R.score(h, day(44), R.load())
    assert [r["node"] for r in ranked][0] == "a"  # failed 4 days ago, twice on record
    assert ranked[-1]["reasons"] == ["no failure on record"]
    assert all(0 < r["risk_7d"] < 1 for r in ranked)
    assert len(R.score(h, day(44), R.load(), limit=2)) == 2
    assert R.score(R.History.of([]), day(1), R.load()) == []
