"""fleetcare-agent: usage errors, config, subcommands, and real runs of the console script
(sim backend to an embedded bus, SIGTERM, and the issue's contract against real Kafka)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from fleetcare.collectors import cli
from fleetcare.collectors.backend import Reading
from fleetcare.collectors.contract import XidEvent, batch_version, decode_batch
from fleetcare.collectors.transport.embedded import EmbeddedConsumer

ROOT = Path(__file__).resolve().parents[2]
AGENT = str(Path(sys.executable).with_name("fleetcare-agent"))
FIX = Path(__file__).with_name("fixtures")
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("FLEETCARE_AGENT_", "FLEETCARE_CONFIG"))}


def usage_error(capsys, argv) -> str:
    assert cli.main(argv) == 2
    return capsys.readouterr().err.splitlines()[-1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith("FLEETCARE_AGENT_") or k == "FLEETCARE_CONFIG":
            monkeypatch.delenv(k)


# -- usage and config errors: exit 2, naming the flag / variable / key -----------------

def test_bad_interval_names_the_flag(capsys) -> None:
    err = usage_error(capsys, ["--backend", "sim", "--interval", "ten"])
    assert err.startswith("fleetcare-agent: error: --interval: duration 'ten' is not understood")


def test_bad_interval_from_env_names_the_variable(capsys, monkeypatch) -> None:
    monkeypatch.setenv("FLEETCARE_AGENT_INTERVAL", "0s")
    err = usage_error(capsys, ["--backend", "sim"])
    assert err == ("fleetcare-agent: error: FLEETCARE_AGENT_INTERVAL: duration '0s' must be "
                   "greater than zero")


def test_unknown_backend_lists_the_valid_ones(capsys) -> None:
    err = usage_error(capsys, ["--backend", "sim", "--backend", "nvml,gpud"])
    assert err == ("fleetcare-agent: error: --backend: unknown backend 'gpud'; use one or more "
                   "of nvml, dcgm-exporter, kernel-log, sim, infiniband")


def test_bad_config_key_names_it(capsys, tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nbackend = "sim"\nintervall = "10s"\n')
    err = usage_error(capsys, ["--config", str(cfg)])
    assert err.startswith("fleetcare-agent: error: config '[agent] intervall' = '10s': unknown "
                          "key; known keys: backend, bus, ")


def test_bad_config_value_names_the_file_key(capsys, tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nbackend = "sim"\nduration = "soon"\n')
    err = usage_error(capsys, ["--config", str(cfg)])
    assert err.startswith(f"fleetcare-agent: error: [agent] duration in {cfg}: duration 'soon'")


def test_other_usage_errors(capsys) -> None:
    assert "--bus: bus URL 'http://x' is not understood: use embedded://PATH" in usage_error(
        capsys, ["--backend", "sim", "--bus", "http://x"])
    assert "--nodes: only the sim backend" in usage_error(capsys, ["--backend", "nvml",
                                                                   "--nodes", "3"])
    assert "--nic-ports: only the sim backend simulates NIC ports" in usage_error(
        capsys, ["--backend", "infiniband", "--nic-ports", "8"])
    assert "--nic-ports: 99 is not in 0..16" in usage_error(
        capsys, ["--backend", "sim", "--nic-ports", "99"])
    assert usage_error(capsys, ["--backend", "sim", "--metrics-port", "x"]) == (
        "fleetcare-agent: error: config '--metrics-port' = 'x': expected int")
    assert "--metrics-port: port 70000" in usage_error(capsys, ["--backend", "sim",
                                                                "--metrics-port", "70000"])
    assert "config file" in usage_error(capsys, ["--config", "/nonexistent/agent.toml"])
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--no-such-flag"])
    assert exit_.value.code == 2


def test_help_explains_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--backend", "--bus", "--node", "--interval", "--config", "--metrics-port",
                 "--spool-dir", "--dcgm-url", "--kmsg-source", "--duration", "--nodes",
                 "--nic-ports",
                 "--seed", "--json", "parse-kmsg", "parse-dcgm", "FLEETCARE_AGENT_"):
        assert flag in out


def test_precedence_and_xid_overrides(tmp_path, capsys, monkeypatch) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nbackend = "sim"\ninterval = "30s"\nnode = "from-file"\n'
                   'kafka_sasl_plain_password = "hunter2"\n'
                   '[agent.xid]\n31 = { severity = "info" }\n94 = { fatal = true }\n')
    monkeypatch.setenv("FLEETCARE_AGENT_INTERVAL", "20s")
    args = cli.build_parser().parse_args(["--config", str(cfg), "--node", "from-flag"])
    s = cli.resolve(args)
    assert (s.backends, s.interval_s, s.node) == (("sim",), 20.0, "from-flag")
    assert s.catalog.lookup(31).severity == "info"
    assert s.catalog.lookup(94).fatal is True
    assert cli.main(["--config", str(cfg), "--print-config"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kafka_sasl_plain_password"] == "********"
    assert shown["interval"] == "20s"
    cfg.write_text('[agent]\nbackend = "sim"\n[agent.xid]\n31 = { severity = "loud" }\n')
    err = usage_error(capsys, ["--config", str(cfg)])
    assert err.startswith("fleetcare-agent: error: [agent.xid]: XID 31: severity 'loud'")


def test_nvml_goes_first_so_kernel_log_can_map_pci_ids() -> None:
    args = cli.build_parser().parse_args(["--backend", "kernel-log", "--backend", "nvml"])
    assert cli.resolve(args, env={}).backends == ("nvml", "kernel-log")


class OneXid:
    name = "nvml"

    def poll(self, now):
        return Reading(events=[XidEvent(ts=now, node="node-00000", xid=79, message="off the bus",
                                        source="nvml", gpu_uuid="GPU-1")])

    def close(self) -> None:
        pass


def test_watched_logs_xids_with_the_site_catalogue_and_renames(caplog) -> None:
    import datetime as dt

    from fleetcare.collectors.xid import DEFAULT_CATALOG

    w = cli.Watched(OneXid(), DEFAULT_CATALOG.with_overrides({79: {"severity": "warning"}}),
                    rename={"node-00000": "gpu-7-0"})
    with caplog.at_level(logging.INFO):
        r = w.poll(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert r.events[0].node == "gpu-7-0"
    [rec] = [r for r in caplog.records if r.getMessage().startswith("xid.seen")]
    assert rec.levelno == logging.WARNING
    assert "node=gpu-7-0 gpu=GPU-1" in rec.getMessage()
    assert "xid=79 class=bus severity=warning" in rec.getMessage()


# -- subcommands through the console script -------------------------------------------

def test_parse_kmsg_subcommand() -> None:
    out = subprocess.run([AGENT, "parse-kmsg", str(FIX / "kmsg" / "kernel_prefix_xid45.txt")],
                         capture_output=True, text=True, check=True, env=CLEAN_ENV).stdout
    assert out.splitlines() == [
        '{"xid": 45, "pci": "0000:dc:00", "pid": 1818990, "process": "python3", '
        '"message": "Ch 00000001 caused by previous Xid 149"}',
        '{"xid": 45, "pci": "0000:ed:00", "pid": 1818992, "process": "python3", '
        '"message": "Ch 0000000c caused by previous Xid 145"}']
    text = (FIX / "kmsg" / "dmesg_fallen_off_bus_sxid.txt").read_text()
    out = subprocess.run([AGENT, "parse-kmsg", "-"], input=text, capture_output=True, text=True,
                         check=True, env=CLEAN_ENV).stdout
    assert out == ('{"xid": 79, "pci": "0000:91:00", "pid": null, "process": null, '
                   '"message": "GPU has fallen off the bus."}\n')


def test_parse_dcgm_subcommand() -> None:
    out = subprocess.run([AGENT, "parse-dcgm", str(FIX / "dcgm" / "issue250_v100.txt")],
                         capture_output=True, text=True, check=True, env=CLEAN_ENV).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    for r in rows:
        assert r.pop("ts").endswith("Z")  # the time of parsing
    assert rows == [
        {"node": "r6i3n0", "gpu_uuid": "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd",
         "gpu_index": 0, "pci_bus_id": "", "model": "Tesla V100-SXM2-32GB", "sm_clock_mhz": 135},
        {"node": "r6i3n0", "gpu_uuid": "GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5",
         "gpu_index": 1, "pci_bus_id": "", "model": "Tesla V100-SXM2-32GB", "sm_clock_mhz": 135}]


# -- real runs of the sim backend -----------------------------------------------------

def read_embedded(path: Path) -> list:
    return [(rec.key, decode_batch(rec.value)) for rec in EmbeddedConsumer(path).poll(0)]


def check_ticks(batches, node: str, nodes: int) -> int:
    """Every node has seq 1..K in order, each tick all 8 GPUs; returns K."""
    by_node = defaultdict(list)
    for key, b in batches:
        assert key == b.node
        assert b.schema_version == batch_version(bool(b.nics)) == 1  # no NICs: version 1
        by_node[b.node].append(b)
    assert sorted(by_node) == [f"{node}-{i}" for i in range(nodes)]
    counts = {n: len(bs) for n, bs in by_node.items()}
    k = counts[f"{node}-0"]
    assert set(counts.values()) == {k}
    uuids = None
    for n, bs in by_node.items():
        assert [b.seq for b in bs] == list(range(1, k + 1))
        for b in bs:
            assert len(b.samples) == 8
            assert all(s.gpu_uuid and s.ts == b.sent_at and s.node == n for s in b.samples)
        assert len({tuple(s.gpu_uuid for s in b.samples) for b in bs}) == 1
        uuids = (uuids or set()) | {s.gpu_uuid for s in bs[0].samples}
    assert len(uuids) == 8 * nodes
    ticks = [[b.sent_at for b in bs] for bs in by_node.values()]
    assert all(t == ticks[0] for t in ticks)  # one tick, all nodes
    return k


def test_sim_nodes_to_embedded_bus(tmp_path) -> None:
    bus = tmp_path / "bus"
    proc = subprocess.run(
        [AGENT, "--backend", "sim", "--nodes", "3", "--interval", "1s", "--duration", "3s",
         "--bus", f"embedded://{bus}", "--node", "gpu-a", "--seed", "7", "--metrics-port", "0",
         "--json"], capture_output=True, text=True, timeout=60, env=CLEAN_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    k = check_ticks(read_embedded(bus), "gpu-a", 3)
    assert 2 <= k <= 3
    assert summary["batches_sent"] == 3 * k
    assert summary["samples_read"] == summary["samples_sent"] == 24 * k
    events = [json.loads(line)["event"] for line in proc.stderr.splitlines()]
    assert events[0] == "agent.backend_opened" and events[-1] == "agent.stopped"


def test_sim_nic_ports_send_a_nic_sample_per_port_and_tick(tmp_path) -> None:
    bus = tmp_path / "bus"
    proc = subprocess.run(
        [AGENT, "--backend", "sim", "--nodes", "2", "--nic-ports", "4", "--interval", "1s",
         "--duration", "2s", "--bus", f"embedded://{bus}", "--node", "ib", "--seed", "7",
         "--metrics-port", "0", "--json"], capture_output=True, text=True, timeout=60,
        env=CLEAN_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    batches = [b for _, b in read_embedded(bus)]
    nics = [n for b in batches for n in b.nics]
    assert summary["nics_sent"] == len(nics) == 4 * summary["samples_sent"] // 8 > 0
    assert {(n.node, n.device) for n in nics} == {
        (f"ib-{i}", f"mlx5_{p}") for i in range(2) for p in range(4)}
    assert all(b.schema_version == 2 for b in batches if b.nics)
    assert all(n.state == "ACTIVE" and n.rate_gbps == 400.0 for n in nics)


def _wait_for_records(bus: Path, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if bus.exists() and len(read_embedded(bus)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} records on {bus} after {timeout_s}s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_flushes_and_exits_0(tmp_path, sig) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bus = tmp_path / "bus"
    proc = subprocess.Popen(
        [AGENT, "--backend", "sim", "--nodes", "2", "--interval", "1s", "--bus",
         f"embedded://{bus}", "--node", "sig", "--metrics-port", str(port),
         "--metrics-host", "127.0.0.1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLEAN_ENV)
    try:
        _wait_for_records(bus, 4)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "fleetcare_agent_up 1\n" in text
        assert 'fleetcare_agent_backend_errors_total{backend="sim"} 0\n' in text
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    batches = read_embedded(bus)
    assert len(batches) == summary["batches_sent"]  # everything sent is on the bus
    check_ticks(batches, "sig", 2)
    assert f"agent.stopping signal={sig.name}" in err or f'"signal": "{sig.name}"' in err


# -- the contract against the real broker ---------------------------------------

@pytest.mark.kafka
@pytest.mark.slow
def test_contract_sim_three_nodes_45s_to_kafka(kafka_broker, tmp_path) -> None:
    from fleetcare.collectors.transport.kafka import KafkaConsumerSource

    node = f"contract-{uuid.uuid4().hex[:8]}"
    # The command line is exactly the contract's; the environment names this run's
    # nodes, puts the spool in tmp and turns the metrics port off.
    env = {**CLEAN_ENV, "FLEETCARE_AGENT_NODE": node,
           "FLEETCARE_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
           "FLEETCARE_AGENT_METRICS_PORT": "0"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [AGENT, "--backend", "sim", "--nodes", "3", "--interval", "1s", "--duration", "45s",
         "--bus", "kafka://127.0.0.1:9092"], capture_output=True, text=True, timeout=180,
        env=env)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert 45 <= elapsed < 120
    assert "agent.stopped" in proc.stderr
    src = KafkaConsumerSource.from_url(kafka_broker, group_id=f"{node}-check",
                                       topics=["fleetcare.telemetry"])
    got = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(got) < 3 * 45:
            for rec in src.poll(1.0):
                if rec.key.startswith(node + "-"):
                    got.append((rec.key, decode_batch(rec.value)))
        # a little longer: duplicates would show up here
        end = time.monotonic() + 3
        while time.monotonic() < end:
            got += [(r.key, decode_batch(r.value)) for r in src.poll(0.5)
                    if r.key.startswith(node + "-")]
    finally:
        src.close()
    k = check_ticks(got, node, 3)  # every batch once, per-node seq order
    assert 43 <= k <= 45


# -- deployment files ------------------------------------------------------------------

def test_daemonset_manifest_parses() -> None:
    yaml = pytest.importorskip("yaml")  # PyYAML is not a dependency; checked where present
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/fleetcare-agent-daemonset.yaml")
                                   .read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert pod["runtimeClassName"] == "nvidia"
    assert "--node=$(NODE_NAME)" in c["args"]
    assert {e["name"] for e in c["env"]} >= {"NODE_NAME", "NVIDIA_VISIBLE_DEVICES"}
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "kmsg": "/dev/kmsg", "spool": "/var/lib/fleetcare/spool"}


def test_systemd_unit_verifies(tmp_path) -> None:
    import shutil

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = (ROOT / "deploy/systemd/fleetcare-agent.service").read_text()
    (tmp_path / "fleetcare-agent.service").write_text(
        unit.replace("/opt/fleetcare/venv/bin/fleetcare-agent", "/bin/true"))
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "fleetcare-agent.service")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_agent_version_and_did_you_mean(capsys) -> None:
    from importlib.metadata import version

    from fleetcare.collectors.cli import main as agent_main

    with pytest.raises(SystemExit) as exc:
        agent_main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"fleetcare-agent {version('fleetcare-collectors')}"
    assert agent_main(["parse-kmgs", "kern.log"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'parse-kmsg'?" in err
