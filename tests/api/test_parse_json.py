"""``queries.parse_json``: JSON columns as the API gives them (non-finite numbers null)."""

from __future__ import annotations

import json

import pytest

from fleetcare.api.queries import finite, parse_json, reasons


@pytest.mark.parametrize("raw", [
    '[NaN, Infinity, -Infinity, 1e999, -1e999, 1.5, 2, "NaN", {"a": [NaN, {"b": 1e400}]}]',
    '{"x": NaN}', "NaN", "1e999", "0.25", '"text"', "null", "[]", '{"n": 3, "f": -0.0}',
])
def test_non_finite_numbers_are_null_as_the_walk_gives_them(raw):
    got = parse_json(raw, what="t")
    assert got == finite(json.loads(raw))
    assert json.dumps(got, allow_nan=False)  # nothing non-finite left


def test_unparseable_text_is_returned_as_is_and_reasons_are_strings():
    assert parse_json("{not json", what="t") == "{not json"
    assert parse_json(None, what="t") is None
    assert reasons('["a", NaN, 1.5]') == ["a", "null", "1.5"]
    assert reasons('{"why": Infinity}') == ['{"why": null}']
    assert reasons(None) == []
