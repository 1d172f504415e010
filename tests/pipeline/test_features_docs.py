"""docs/features.md is generated from the catalogue; fail when it is stale."""

from __future__ import annotations

from pathlib import Path

from fleetcare.pipeline import features

DOC = Path(__file__).resolve().parents[2] / "docs" / "features.md"


def test_features_md_is_current():
    assert DOC.read_text() == features.render_docs(), (
        "docs/features.md is stale: regenerate it with "
        "`python -m fleetcare.pipeline.features > docs/features.md`")


def test_every_feature_is_documented_once():
    names = [f.name for f in features.FEATURES]
    assert len(names) == len(set(names))
    assert all(f.definition and f.unit and f.window for f in features.FEATURES)
