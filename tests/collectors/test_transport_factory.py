"""open_bus: the Bus a URL names."""

from __future__ import annotations

import pytest

from fleetcare.collectors.transport import open_bus as exported
from fleetcare.collectors.transport.embedded import EmbeddedBus
from fleetcare.collectors.transport.factory import DEFAULT_SPOOL_DIR, bus_scheme, open_bus
from fleetcare.collectors.transport.kafka import KafkaBus


def test_exported_from_the_transport_package() -> None:
    assert exported is open_bus


def test_embedded_url_opens_an_embedded_bus_with_options(tmp_path) -> None:
    bus = open_bus(f"embedded://{tmp_path}/bus", max_bytes=12345)
    assert isinstance(bus, EmbeddedBus)
    assert bus.root == tmp_path / "bus"
    assert bus.max_bytes == 12345
    assert (tmp_path / "bus").is_dir()


def test_kafka_url_opens_a_kafka_bus_spooling_in_spool_dir(tmp_path) -> None:
    bus = open_bus("kafka://10.0.0.5:9093,10.0.0.6", spool_dir=tmp_path / "spool",
                   topic_prefix="t.", spool_max_bytes=1 << 20)
    try:
        assert isinstance(bus, KafkaBus)
        assert bus.bootstrap_servers == ["10.0.0.5:9093", "10.0.0.6:9092"]
        assert bus.spool.path == tmp_path / "spool"
        assert bus.spool.max_bytes == 1 << 20
        assert bus.topic_prefix == "t."
    finally:
        bus.spool.close()


def test_kafka_spool_dir_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEETCARE_SPOOL_DIR", str(tmp_path / "envspool"))
    bus = open_bus("kafka://127.0.0.1:1")
    try:
        assert bus.spool.path == tmp_path / "envspool"
    finally:
        bus.spool.close()
    assert DEFAULT_SPOOL_DIR == "/var/lib/fleetcare/spool"


@pytest.mark.parametrize("url", ["http://x:1", "embedded://", "kafka://", "var/bus", ""])
def test_other_urls_are_refused_naming_both_forms(url: str) -> None:
    with pytest.raises(ValueError) as err:
        open_bus(url)
    assert "embedded://PATH" in str(err.value)
    assert "kafka://HOST:PORT" in str(err.value)
    assert repr(url) in str(err.value)


def test_bus_scheme() -> None:
    assert bus_scheme("embedded://var/bus") == "embedded"
    assert bus_scheme("kafka://h:1") == "kafka"
