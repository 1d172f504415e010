import pytest

from fleetcare.collectors.durations import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("45s", 45), ("10m", 600), ("24h", 86400),
                                               ("90d", 7776000), ("1.5h", 5400), ("60", 60), (10, 10)])
def test_parses(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "10x", "-5s", "0s"])
def test_rejects_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_bare_numbers_take_the_documented_unit_or_are_refused() -> None:
    assert parse_duration("2", bare="h") == 7200 and parse_duration("30m", bare="h") == 1800
    with pytest.raises(ValueError, match="has no unit: .*24h"):
        parse_duration("24", bare=None)
    assert parse_duration("24h", bare=None) == 86400


def test_duration_type_is_one_argparse_line_naming_the_flag(capsys) -> None:
    import argparse

    from fleetcare.collectors.durations import duration_type

    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--every", type=duration_type(bare="h", per="h"), default="1h")
    assert p.parse_args([]).every == 1.0
    assert p.parse_args(["--every", "30m"]).every == 0.5
    assert p.parse_args(["--every", "2"]).every == 2.0
    with pytest.raises(SystemExit):
        p.parse_args(["--every", "soon"])
    assert "argument --every: duration 'soon' is not understood" in capsys.readouterr().err
