"""``fleetcare-agent``: run the node agent, or parse a saved kernel log / dcgm-exporter page.

    fleetcare-agent --backend nvml,kernel-log --bus kafka://broker:9092 --interval 10s
    fleetcare-agent --backend sim --nodes 3 --interval 1s --duration 45s --bus embedded://var/bus
    fleetcare-agent parse-kmsg /var/log/kern.log        # XIDs as JSON lines
    fleetcare-agent parse-dcgm metrics.txt              # GpuSamples as JSON lines
    fleetcare-agent parse-ib /sys/class/infiniband      # NicSamples (one per port) as JSON lines

Settings: flags over ``FLEETCARE_AGENT_<KEY>`` environment variables over the ``[agent]``
table of ``--config`` (or ``$FLEETCARE_CONFIG``) over defaults; ``[agent.xid]`` overrides
rows of the XID catalogue. Exit status: 0 done (also after SIGTERM/SIGINT, once the bus is
flushed and the backends closed), 1 an operational error (on stderr), 2 a usage or
configuration error that names the flag or key.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fleetcare.collectors.backend import BackendError, GpuBackend, Reading
from fleetcare.collectors.config import ENV_PREFIX, ConfigError, describe, load
from fleetcare.collectors.durations import parse_duration
from fleetcare.collectors.redact import MaskingFormatter, mask_secrets
from fleetcare.collectors.signals import on_signals
from fleetcare.collectors.transport.factory import DEFAULT_SPOOL_DIR, bus_scheme, open_bus
from fleetcare.collectors.transport.kafka import KafkaSecurityConfig
from fleetcare.collectors.xid import DEFAULT_CATALOG, XidCatalog

log = logging.getLogger("fleetcare.collectors.agent")

BACKENDS = ("nvml", "dcgm-exporter", "kernel-log", "sim", "infiniband")
SUBCOMMANDS = ("parse-kmsg", "parse-dcgm", "parse-ib")
SECTION = "agent"
SIM_HISTORY_S = 86400.0
"""The simulated fleet starts this long before now, so its counters have a history."""
SIM_PLAN_DAYS = 31.0


class UsageError(Exception):
    """A bad flag, environment variable or config key: exit 2. ``where`` names it."""

    def __init__(self, where: str, message: str, *, prefixed: bool = True) -> None:
        super().__init__(f"{where}: {message}" if prefixed else message)
        self.where = where


@dataclass(frozen=True)
class AgentConfig(KafkaSecurityConfig):
    """The ``[agent]`` table; every key is also ``FLEETCARE_AGENT_<KEY>`` and a flag."""

    backend: str = "nvml,kernel-log"
    bus: str = "embedded:///var/lib/fleetcare/bus"
    node: str = ""  # "" = this host's name
    interval: str = "10s"
    duration: str | None = None  # None = until SIGTERM
    metrics_port: int = 9450  # 0 = off
    metrics_host: str = "0.0.0.0"
    spool_dir: str = DEFAULT_SPOOL_DIR
    spool_max_bytes: int = 1 << 30
    topic_prefix: str = ""
    kafka_partitions: int = 6  # and the kafka_* security settings of KafkaSecurityConfig
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    kmsg_source: str = "/dev/kmsg"
    ib_root: str = "/sys/class/infiniband"
    nodes: int | None = None  # sim only
    seed: int | None = None  # sim only; default derived from the node name
    nic_ports: int = 0  # sim only: InfiniBand ports per simulated node
    log_level: str = "info"
    xid: dict = field(default_factory=dict)  # [agent.xid] "94" = {fatal = true}


@dataclass(frozen=True)
class Settings:
    """``AgentConfig`` validated and resolved."""

    config: AgentConfig
    backends: tuple[str, ...]
    node: str
    interval_s: float
    duration_s: float | None
    catalog: XidCatalog


# -- the command line -----------------------------------------------------------------

def version_text() -> str:
    """``fleetcare-agent 0.1.0``: the installed fleetcare-collectors distribution."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"fleetcare-agent {version('fleetcare-collectors')}"
    except PackageNotFoundError:
        return "fleetcare-agent (not installed as a distribution)"


def build_parser() -> argparse.ArgumentParser:
    d = AgentConfig()
    ap = argparse.ArgumentParser(
        prog="fleetcare-agent",
        description="The fleetcare node agent: reads every GPU of this node each tick "
                    "and sends per-node batches on the bus. Subcommands: "
                    "`fleetcare-agent parse-kmsg FILE|-`, `fleetcare-agent parse-dcgm "
                    "FILE|-` and `fleetcare-agent parse-ib DIR` (see their --help).",
        epilog="Every option is also a key of the [agent] table of --config and an "
               "environment variable FLEETCARE_AGENT_<KEY> (e.g. FLEETCARE_AGENT_BUS); "
               "flags win over the environment, which wins over the file. Exit status: "
               "0 done (also on SIGTERM/SIGINT, after flushing), 1 operational error, "
               "2 usage or configuration error.")
    a = ap.add_argument
    a("--version", action="version", version=version_text())
    a("--backend", action="append", metavar="NAME",
      help=f"telemetry source, repeatable or comma-separated: {', '.join(BACKENDS)} "
           f"(default {d.backend}: kernel-log then maps PCI ids to GPUs through NVML; add "
           "infiniband for the InfiniBand/RoCE ports of --ib-root, e.g. "
           "--backend nvml,kernel-log,infiniband)")
    a("--bus", metavar="URL", help="where batches go: kafka://HOST:PORT[,HOST:PORT] or "
      f"embedded://PATH (default {d.bus})")
    a("--node", metavar="NAME", help="node name on every record (default: this host's name)")
    a("--interval", metavar="DURATION", help=f"time between ticks, e.g. 10s, 1m "
      f"(default {d.interval})")
    a("--config", metavar="TOML", help="TOML file with an [agent] table (default "
      "$FLEETCARE_CONFIG; e.g. /etc/fleetcare/agent.toml)")
    a("--metrics-port", metavar="PORT", help="serve Prometheus metrics on this port "
      f"(default {d.metrics_port}; 0 = off)")
    a("--metrics-host", metavar="ADDR", help=f"address to serve metrics on "
      f"(default {d.metrics_host})")
    a("--spool-dir", metavar="DIR", help="on-disk spool for the Kafka bus while the broker "
      f"is away (default {d.spool_dir})")
    a("--spool-max-bytes", metavar="BYTES", help="bound of the spool; the oldest telemetry "
      f"is dropped first, XID events never (default {d.spool_max_bytes})")
    a("--topic-prefix", metavar="PREFIX", help="put before the Kafka topic names "
      "(one cluster, several fleets; default none)")
    a("--dcgm-url", metavar="URL", help=f"dcgm-exporter endpoint (default {d.dcgm_url})")
    a("--kmsg-source", metavar="SOURCE", help="kernel log to follow: /dev/kmsg, journalctl "
      f"or a FILE (default {d.kmsg_source})")
    a("--ib-root", metavar="DIR", help="infiniband backend: the sysfs tree of the "
      f"InfiniBand/RoCE ports (default {d.ib_root})")
    a("--duration", metavar="DURATION", help="stop after this long, flush and exit 0 "
      "(default: run until SIGTERM/SIGINT)")
    a("--nodes", metavar="N", help="sim only: simulate N nodes named <node>-0 .. <node>-(N-1) "
      "from this one process (default: one node named <node>)")
    a("--seed", metavar="S", help="sim only: random seed (default: derived from --node)")
    a("--nic-ports", metavar="N", help="sim only: InfiniBand ports per simulated node, each "
      "sending a NIC sample a tick as the infiniband backend does (default 0: none)")
    a("--log-level", metavar="LEVEL", help="debug, info, warning or error "
      f"(default {d.log_level})")
    a("--json", action="store_true", help="logs as JSON lines on stderr, and a JSON "
      "summary of the run on stdout at exit")
    a("--print-config", action="store_true", help="print the resolved settings (secrets "
      "masked) as JSON and exit")
    return ap


_FLAG_KEYS = ("bus", "node", "interval", "metrics_port", "metrics_host", "spool_dir",
              "spool_max_bytes", "topic_prefix", "dcgm_url", "kmsg_source", "ib_root", "duration",
              "nodes", "seed", "nic_ports", "log_level")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {k: getattr(args, k) for k in _FLAG_KEYS}
    if args.backend:
        out["backend"] = ",".join(args.backend)
    return out


def _where(key: str, overrides: Mapping[str, object], env: Mapping[str, str],
           config_path: str | None) -> str:
    """Which flag, variable or config key set ``key`` (for error messages)."""
    if overrides.get(key) is not None:
        return "--" + key.replace("_", "-")
    var = f"{ENV_PREFIX}{SECTION.upper()}_{key.upper()}"
    if var in env:
        return var
    if config_path:
        return f"[{SECTION}] {key} in {config_path}"
    return "--" + key.replace("_", "-")


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Flags + environment + TOML -> validated ``Settings``; ``UsageError`` otherwise."""
    env = os.environ if env is None else env
    overrides = _overrides(args)
    try:
        cfg = load(AgentConfig, section=SECTION, path=args.config, env=env, overrides=overrides)
    except ConfigError as exc:
        raise UsageError(exc.key, str(exc), prefixed=False) from None
    config_path = args.config or env.get("FLEETCARE_CONFIG")

    def where(key: str) -> str:
        return _where(key, overrides, env, config_path)

    names = tuple(b.strip() for b in cfg.backend.split(",") if b.strip())
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        raise UsageError(where("backend"), f"unknown backend {', '.join(unknown) or '(none)'!r}"
                         f"; use one or more of {', '.join(BACKENDS)}")
    names = tuple(dict.fromkeys(names))
    if "kernel-log" in names and "nvml" in names:  # nvml first: kernel-log maps PCI -> GPU
        names = ("nvml", *(b for b in names if b != "nvml"))
    try:
        bus_scheme(cfg.bus)
    except ValueError as exc:
        raise UsageError(where("bus"), str(exc)) from None
    durations: dict[str, float | None] = {}
    for key in ("interval", "duration"):
        raw = getattr(cfg, key)
        try:
            durations[key] = None if raw is None else parse_duration(raw)
        except ValueError as exc:
            raise UsageError(where(key), str(exc)) from None
    if not 0 <= cfg.metrics_port <= 65535:
        raise UsageError(where("metrics_port"), f"port {cfg.metrics_port} is not in 0..65535 "
                         "(0 turns the metrics server off)")
    if cfg.spool_max_bytes <= 0:
        raise UsageError(where("spool_max_bytes"), f"{cfg.spool_max_bytes} must be > 0")
    if cfg.nodes is not None:
        if "sim" not in names:
            raise UsageError(where("nodes"), "only the sim backend simulates several nodes; "
                             "add --backend sim or drop --nodes")
        if cfg.nodes < 1:
            raise UsageError(where("nodes"), f"{cfg.nodes} must be at least 1")
    if cfg.seed is not None and "sim" not in names:
        raise UsageError(where("seed"), "only the sim backend takes a seed")
    if cfg.nic_ports:
        if "sim" not in names:
            raise UsageError(where("nic_ports"), "only the sim backend simulates NIC ports "
                             "(the infiniband backend reads the real ones): add --backend sim")
        from fleetcare.collectors.sim.fleet import MAX_NIC_PORTS

        if not 0 <= cfg.nic_ports <= MAX_NIC_PORTS:
            raise UsageError(where("nic_ports"), f"{cfg.nic_ports} is not in "
                             f"0..{MAX_NIC_PORTS}")
    if cfg.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(where("log_level"), f"{cfg.log_level!r} is not one of debug, info, "
                         "warning, error")
    xid = cfg.xid
    if isinstance(xid, str):  # FLEETCARE_AGENT_XID='{"94": {"fatal": true}}'
        try:
            xid = json.loads(xid) if xid.strip() else {}
        except json.JSONDecodeError as exc:
            raise UsageError(where("xid"), f"is not a JSON object ({exc})") from None
    if not isinstance(xid, dict):
        raise UsageError(where("xid"), "must be a table of XID -> {severity, class, fatal, "
                         "action, name}, e.g. [agent.xid] 94 = {severity = \"fatal\"}")
    try:
        catalog = DEFAULT_CATALOG.with_overrides(xid)
    except (ValueError, AttributeError) as exc:
        raise UsageError(f"[{SECTION}.xid]", str(exc)) from None
    node = cfg.node or socket.gethostname()
    assert durations["interval"] is not None
    return Settings(config=cfg, backends=names, node=node, interval_s=durations["interval"],
                    duration_s=durations["duration"], catalog=catalog)


# -- logging --------------------------------------------------------------------------

_FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


class JsonFormatter(logging.Formatter):
    """``event k=v ...`` messages as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        event, _, rest = msg.partition(" ")
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname.lower(), "logger": record.name, "event": event}
        out.update({k: v.strip('"') for k, v in _FIELD.findall(rest)})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, as_json: bool) -> None:
    """stderr, plain or JSON lines; secrets in URLs masked (``redact.MaskingFormatter``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter(JsonFormatter() if as_json else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s")))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))


# -- backends -------------------------------------------------------------------------

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "fatal": logging.ERROR}


class Watched:
    """A backend whose events are logged with the site's XID catalogue, and whose node
    names may be rewritten (``rename``: the sim's ``node-00000`` -> ``<node>-0``)."""

    def __init__(self, inner: GpuBackend, catalog: XidCatalog,
                 rename: Mapping[str, str] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.catalog = catalog
        self.rename = dict(rename or {})

    def poll(self, now: dt.datetime) -> Reading:
        reading = self.inner.poll(now)
        if self.rename:
            reading = self._renamed(reading)
        for ev in reading.events:
            if ev.xid is None:
                log.error("gpu.lost node=%s gpu=%s pci=%s message=%r", ev.node, ev.gpu_uuid,
                          ev.pci_bus_id, ev.message)
                continue
            info = self.catalog.lookup(ev.xid)
            log.log(_LEVELS.get(info.severity, logging.WARNING),
                    "xid.seen node=%s gpu=%s pci=%s xid=%d class=%s severity=%s action=%r "
                    "source=%s", ev.node, ev.gpu_uuid, ev.pci_bus_id, ev.xid, info.xid_class,
                    info.severity, info.action, ev.source)
        return reading

    def _renamed(self, r: Reading) -> Reading:
        def re_node(rec: Any) -> Any:
            new = self.rename.get(rec.node)
            return rec if new is None else msgspec.structs.replace(rec, node=new)

        return Reading(samples=[re_node(s) for s in r.samples],
                       events=[re_node(e) for e in r.events],
                       incidents=[re_node(i) for i in r.incidents],
                       nics=[re_node(n) for n in r.nics])

    def close(self) -> None:
        self.inner.close()


def sim_backend(node: str, nodes: int | None, seed: int, now: dt.datetime, nic_ports: int = 0
                ) -> tuple[GpuBackend, dict[str, str]]:
    """A ``SimBackend`` of ``nodes`` nodes (named ``<node>-i``; one named ``<node>`` when
    ``nodes`` is None) whose fleet started ``SIM_HISTORY_S`` before ``now``."""
    from fleetcare.collectors.sim import FleetSimulator, FleetSpec, SimBackend, simulate_incidents

    start = (now - dt.timedelta(seconds=SIM_HISTORY_S)).replace(microsecond=0)
    spec = FleetSpec(nodes=nodes or 1, seed=seed, start=start, nic_ports=nic_ports)
    sim = FleetSimulator(spec, simulate_incidents(spec, days=SIM_PLAN_DAYS))
    names = sim.layout.node_names.tolist()
    rename = ({names[0]: node} if nodes is None
              else {old: f"{node}-{i}" for i, old in enumerate(names)})
    return SimBackend(sim), rename


def open_backends(s: Settings, now: dt.datetime) -> list[Watched]:
    """Open every backend of ``s`` (nvml first); on failure close those already open."""
    opened: list[Watched] = []
    nvml = None
    try:
        for name in s.backends:
            rename = None
            backend: Any
            if name == "nvml":
                from fleetcare.collectors.nvml import NvmlBackend

                backend = nvml = NvmlBackend(s.node)
            elif name == "kernel-log":
                from fleetcare.collectors.kernel_log import KernelLogBackend

                backend = KernelLogBackend(s.node, s.config.kmsg_source,
                                           pci_to_gpu=nvml.pci_to_gpu if nvml else None)
            elif name == "dcgm-exporter":
                from fleetcare.collectors.dcgm_exporter import DcgmExporterBackend

                backend = DcgmExporterBackend(s.config.dcgm_url, s.node)
            elif name == "infiniband":
                from fleetcare.collectors.infiniband import InfinibandBackend

                backend = InfinibandBackend(s.node, s.config.ib_root)
            else:
                seed = (s.config.seed if s.config.seed is not None
                        else zlib.crc32(s.node.encode()) & 0x7FFFFFFF)
                backend, rename = sim_backend(s.node, s.config.nodes, seed, now,
                                              s.config.nic_ports)
            opened.append(Watched(backend, s.catalog, rename))
            log.info("agent.backend_opened backend=%s node=%s", name, s.node)
    except BaseException:
        close_all(opened)
        raise
    return opened


def close_all(backends: Sequence[Any]) -> None:
    for b in reversed(backends):
        try:
            b.close()
        except Exception:  # closing must not hide the first error
            log.exception("agent.backend_close_failed backend=%s", b.name)


def bus_options(cfg: AgentConfig) -> dict[str, Any]:
    if bus_scheme(cfg.bus) == "embedded":
        return {}
    security = {k: v for k, v in cfg.kafka_security().items() if v}
    return {"spool_max_bytes": cfg.spool_max_bytes, "topic_prefix": cfg.topic_prefix,
            "partitions": cfg.kafka_partitions, "security": security or None}


# -- run ------------------------------------------------------------------------------

def run(s: Settings, *, as_json: bool = False) -> int:
    from fleetcare.collectors.agent import Agent
    from fleetcare.collectors.agent_metrics import AgentMetrics, serve_metrics

    cfg = s.config
    now = dt.datetime.now(dt.UTC)
    try:
        backends = open_backends(s, now)
    except (BackendError, OSError, ValueError) as exc:
        print(mask_secrets(f"fleetcare-agent: cannot open backend: {exc}"), file=sys.stderr)
        return 1
    bus: Any = None
    server = None
    try:
        try:
            bus = open_bus(cfg.bus, spool_dir=cfg.spool_dir, **bus_options(cfg))
        except (OSError, ValueError, ImportError) as exc:
            print(mask_secrets(f"fleetcare-agent: cannot open bus {cfg.bus}: {exc}"),
                  file=sys.stderr)
            return 1
        agent = Agent(backends, bus, node=s.node, interval_s=s.interval_s)
        if cfg.metrics_port:
            metrics = AgentMetrics(agent, backends=[b.inner for b in backends], bus=bus)
            try:
                server = serve_metrics(metrics, host=cfg.metrics_host, port=cfg.metrics_port)
            except OSError as exc:
                print(f"fleetcare-agent: cannot serve metrics on {cfg.metrics_host}:"
                      f"{cfg.metrics_port}: {exc} (pick another --metrics-port, or 0 for "
                      "none)", file=sys.stderr)
                return 1

        def on_signal(signum: int, _frame: object) -> None:
            log.info("agent.stopping signal=%s", signal.Signals(signum).name)
            agent.stop()

        log.info("agent.started node=%s backends=%s bus=%s interval_s=%g duration_s=%s",
                 s.node, ",".join(s.backends), mask_secrets(cfg.bus), s.interval_s,
                 s.duration_s)
        with on_signals(on_signal):
            agent.run(duration_s=s.duration_s)  # flushes the bus on the way out
        summary = {"node": s.node, "backends": list(s.backends), **dict(agent.counters)}
        for attr in ("sent", "spooled", "replayed", "dropped", "pending"):
            if hasattr(bus, attr) and hasattr(bus, "spool"):
                summary[f"bus_{attr}"] = getattr(bus, attr)
        log.info("agent.stopped %s", " ".join(f"{k}={v}" for k, v in summary.items()
                                               if not isinstance(v, list)))
        if as_json:
            print(json.dumps(summary), flush=True)
        return 0
    finally:
        if server is not None:
            server.close()
        close_all(backends)
        if bus is not None:
            try:
                bus.close()
            except Exception:
                log.exception("agent.bus_close_failed bus=%s", cfg.bus)


def main(argv: Sequence[str] | None = None) -> int:
    """The agent (or a parse subcommand); an error nobody foresaw is one line, not a
    traceback, and a reader that closes stdout early (``| head``) ends it quietly."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the flush at exit must not fail again
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        log.debug("agent.failed", exc_info=True)
        text = " ".join(str(exc).split())
        print(mask_secrets(f"fleetcare-agent: unexpected error ({type(exc).__name__}: {text}); "
                           "rerun with --log-level debug for the traceback, and report it"),
              file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "parse-kmsg":
        from fleetcare.collectors.kernel_log import main_parse_kmsg

        return main_parse_kmsg(argv[1:])
    if argv and argv[0] == "parse-dcgm":
        from fleetcare.collectors.dcgm_exporter import main_parse_dcgm

        return main_parse_dcgm(argv[1:])
    if argv and argv[0] == "parse-ib":
        from fleetcare.collectors.infiniband import main_parse_ib

        return main_parse_ib(argv[1:])
    parser = build_parser()
    if argv and not argv[0].startswith("-"):
        import difflib

        near = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"fleetcare-agent: error: unknown subcommand {argv[0]!r}{hint} (subcommands: "
              f"{', '.join(SUBCOMMANDS)}; the agent itself takes only --flags)",
              file=sys.stderr)
        return 2
    args = parser.parse_args(argv)  # exits 2 on an unknown flag, naming it
    try:
        settings = resolve(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(mask_secrets(f"fleetcare-agent: error: {exc}"), file=sys.stderr)
        return 2
    if args.print_config:
        shown = describe(settings.config)
        shown.update(node=settings.node, backend=",".join(settings.backends))
        print(json.dumps(shown, indent=2, default=str))
        return 0
    setup_logging(settings.config.log_level, args.json)
    return run(settings, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
