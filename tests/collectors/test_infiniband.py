"""The infiniband backend and ``parse-ib`` against fake sysfs trees (fixtures/infiniband,
sources in its SOURCES.md)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import msgspec
import pytest

from fleetcare.collectors.agent import Agent
from fleetcare.collectors.cli import main
from fleetcare.collectors.contract import (
    NIC_COUNTER_BITS,
    NicSample,
    decode_batch,
    encode_batch,
    nic_counter_max,
)
from fleetcare.collectors.infiniband import (
    InfinibandBackend,
    parse_counter,
    parse_named,
    parse_rate,
    read_ports,
)
from fleetcare.collectors.transport.embedded import EmbeddedBus, EmbeddedConsumer

TREE = Path(__file__).parent / "fixtures" / "infiniband" / "node_a"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NULL_COUNTERS = dict.fromkeys(NIC_COUNTER_BITS)


def by_device(samples: list[NicSample]) -> dict[str, NicSample]:
    return {s.device: s for s in samples}


def test_the_kernels_value_formats() -> None:
    assert parse_named("4: ACTIVE") == "ACTIVE"
    assert parse_named("5: LinkUp") == "LinkUp"
    assert parse_named("7: Phy Test") == "Phy Test"
    assert parse_named("") is None and parse_named(None) is None
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("garbage") is None
    assert parse_counter("255") == 255
    assert parse_counter("N/A (no PMA)") is None
    assert parse_counter("-1") is None and parse_counter("") is None
    assert parse_counter(str(2**64 - 1)) is None  # a sentinel, never a count


def test_counter_widths_are_the_kernels() -> None:
    # drivers/infiniband/core/sysfs.c: PORT_PMA_ATTR(name, counter, width, offset)
    assert NIC_COUNTER_BITS == {
        "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8,
        "port_rcv_errors": 16, "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
        "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4}
    assert nic_counter_max("link_downed") == 255
    assert nic_counter_max("excessive_buffer_overrun_errors") == 15


def test_every_port_of_the_tree_exact_values() -> None:
    got = by_device(read_ports(TREE, node="gpu-07", now=T0))
    assert list(got) == ["i40iw0", "mlx5_0", "mlx5_1", "mlx5_10"]
    # leptonai/gpud#943: link_downed 255, port_xmit_discards 65535 and
    # excessive_buffer_overrun_errors 15 sit at their maxima: saturated, not healthy
    assert got["mlx5_1"] == NicSample(
        ts=T0, node="gpu-07", device="mlx5_1", port=1, link_layer="InfiniBand",
        state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0,
        symbol_error=0, link_error_recovery=0, link_downed=255, port_rcv_errors=0,
        port_rcv_remote_physical_errors=0, port_rcv_switch_relay_errors=2,
        port_xmit_discards=65535, local_link_integrity_errors=0,
        excessive_buffer_overrun_errors=15,
        saturated=["link_downed", "port_xmit_discards", "excessive_buffer_overrun_errors"],
        hw_counter_names=["local_ack_timeout_err", "out_of_buffer", "out_of_sequence",
                          "rx_atomic_requests", "rx_read_requests", "rx_write_requests"],
        hw_counter_values=[3, 0, 0, 0, 0, 0])  # lifespan is not a counter: skipped
    # NVIDIA/nccl#1866: a RoCE port; no counters folder here -> every counter null
    assert got["mlx5_0"] == NicSample(
        ts=T0, node="gpu-07", device="mlx5_0", port=1, link_layer="Ethernet",
        state="ACTIVE", phys_state="LinkUp", rate_gbps=100.0, **NULL_COUNTERS)
    # leptonai/gpud#482: a port down, polling
    assert (got["mlx5_10"].state, got["mlx5_10"].phys_state, got["mlx5_10"].rate_gbps) == \
        ("DOWN", "Polling", 10.0)
    # prometheus/node_exporter#966: iWARP without a PMA, every counter "N/A (no PMA)"
    assert got["i40iw0"] == NicSample(ts=T0, node="gpu-07", device="i40iw0", port=1,
                                      **NULL_COUNTERS)


def test_unreadable_garbage_and_missing_never_crash(tmp_path: Path) -> None:
    shutil.copytree(TREE / "mlx5_1", tmp_path / "mlx5_1")
    port = tmp_path / "mlx5_1" / "ports" / "1"
    (port / "counters" / "link_downed").unlink()
    (port / "counters" / "link_downed").mkdir()          # read fails (EISDIR) -> null
    (port / "counters" / "symbol_error").write_text("12abc\n")  # garbage -> null
    (port / "rate").unlink()                              # missing -> null
    (port / "hw_counters" / "out_of_buffer").write_text("N/A\n")  # dropped from the lists
    (tmp_path / "mlx5_1" / "ports" / "not-a-port").mkdir()
    (tmp_path / "stray-file").write_text("x")
    [s] = read_ports(tmp_path, node="n", now=T0)
    assert (s.link_downed, s.symbol_error, s.rate_gbps) == (None, None, None)
    assert s.saturated == ["port_xmit_discards", "excessive_buffer_overrun_errors"]
    assert "out_of_buffer" not in (s.hw_counter_names or [])
    assert len(s.hw_counter_names or []) == len(s.hw_counter_values or []) == 5
    assert read_ports(tmp_path / "absent", node="n", now=T0) == []


def test_parse_ib_prints_one_contract_record_per_port(capsys) -> None:
    assert main(["parse-ib", str(TREE), "--node", "gpu-07"]) == 0
    lines = capsys.readouterr().out.splitlines()
    samples = [msgspec.json.decode(line, type=NicSample) for line in lines]
    assert [(s.device, s.port, s.node) for s in samples] == [
        ("i40iw0", 1, "gpu-07"), ("mlx5_0", 1, "gpu-07"), ("mlx5_1", 1, "gpu-07"),
        ("mlx5_10", 1, "gpu-07")]
    assert samples[2].saturated == ["link_downed", "port_xmit_discards",
                                    "excessive_buffer_overrun_errors"]


def test_parse_ib_refuses_stdin_and_missing_dirs(capsys, tmp_path: Path) -> None:
    assert main(["parse-ib", "-"]) == 2
    assert "'-' is not supported" in capsys.readouterr().err
    assert main(["parse-ib", str(tmp_path / "nope")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_agent_sends_nic_samples_beside_gpu_samples_on_the_bus(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path / "bus")
    agent = Agent([InfinibandBackend("gpu-07", TREE)], bus, node="gpu-07", interval_s=10)
    assert agent.tick(T0) == 1
    bus.flush()
    [rec] = EmbeddedConsumer(tmp_path / "bus").poll(0)
    batch = decode_batch(rec.value)
    assert (rec.key, batch.schema_version, len(batch.nics), batch.samples) == \
        ("gpu-07", 2, 4, [])
    assert agent.counters["nics_read"] == agent.counters["nics_sent"] == 4


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_gpu_only_batches_stay_version_1_and_nic_batches_round_trip(fmt) -> None:
    samples = read_ports(TREE, node="gpu-07", now=T0)
    agent = Agent([], None, node="gpu-07")  # type: ignore[arg-type]
    from fleetcare.collectors.backend import Reading

    [nic_batch] = agent.batches(Reading(nics=samples), T0)
    assert nic_batch.schema_version == 2
    assert decode_batch(encode_batch(nic_batch, fmt)) == nic_batch
    # a version-1 batch (written before NicSample existed) still decodes, with no nics
    old = b'{"schema_version": 1, "node": "n", "seq": 1, "sent_at": "2026-03-01T12:00:00Z"}'
    assert decode_batch(old).nics == []
