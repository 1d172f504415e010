from __future__ import annotations

import pytest

from fleetcare.collectors.xid import DEFAULT_CATALOG, lookup


def test_fatal_xids_match_design() -> None:
    assert DEFAULT_CATALOG.fatal_xids() == {48, 62, 64, 74, 79, 95, 119, 120, 140, 143}


@pytest.mark.parametrize(("xid", "cls", "sev", "fatal"), [
    (13, "application", "warning", False),
    (31, "application", "warning", False),
    (48, "memory", "fatal", True),
    (63, "memory", "info", False),
    (74, "link", "fatal", True),
    (79, "bus", "fatal", True),
    (94, "memory", "warning", False),
    (95, "memory", "fatal", True),
    (119, "firmware", "fatal", True),
    (121, "link", "info", False),
])
def test_rows(xid: int, cls: str, sev: str, fatal: bool) -> None:
    info = lookup(xid)
    assert (info.xid, info.xid_class, info.severity, info.fatal) == (xid, cls, sev, fatal)
    assert info.action


def test_unknown_xid_is_other_warning() -> None:
    info = lookup(999)
    assert (info.xid_class, info.severity, info.fatal) == ("other", "warning", False)


def test_overrides_return_a_new_catalog() -> None:
    site = DEFAULT_CATALOG.with_overrides({"94": {"fatal": True, "severity": "fatal"},
                                           999: {"class": "bus", "name": "vendor"}})
    assert site.lookup(94).fatal and site.lookup(94).severity == "fatal"
    assert site.lookup(94).xid_class == "memory"
    assert site.lookup(999).xid_class == "bus" and site.lookup(999).name == "vendor"
    assert not DEFAULT_CATALOG.lookup(94).fatal


@pytest.mark.parametrize(("override", "msg"), [
    ({79: {"severity": "bad"}}, "severity 'bad'"),
    ({79: {"class": "gpu"}}, "class 'gpu'"),
    ({79: {"fatal": "yes"}}, "fatal must be"),
    ({79: {"colour": 1}}, "unknown field 'colour'"),
    ({"x": {}}, "not an integer"),
])
def test_bad_overrides_say_what_is_wrong(override: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        DEFAULT_CATALOG.with_overrides(override)
