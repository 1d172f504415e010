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
