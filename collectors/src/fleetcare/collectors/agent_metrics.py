"""The agent's own health as Prometheus metrics, on a tiny stdlib HTTP server.

No prometheus_client on the node: ``AgentMetrics.render()`` writes the text exposition
format (0.0.4) by hand — ``# HELP`` / ``# TYPE`` per family, counters end in ``_total``,
label values escaped — from what the agent, its backends and its bus already count::

    metrics = AgentMetrics(agent, backends=backends, bus=bus)
    server = serve_metrics(metrics, port=9450)     # GET /metrics, on a daemon thread
    ...
    server.close()

Families: ``fleetcare_agent_up``; from ``Agent.counters`` samples/events read, samples
and batches sent (accepted by the bus), samples dropped (batches the bus refused),
batches failed, ticks skipped, backend errors by backend; from ``NvmlBackend``
``fleetcare_agent_nvml_errors_total{function}``; from a ``KafkaBus`` the batch parts
(one per topic per batch) sent, spooled, replayed and dropped by the spool's bound, and
the spool's size in bytes and parts. Kafka counts parts, not samples, so the spool's
families are named after batches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "fleetcare_agent_"

# Agent.counters key -> (family name without prefix, help)
_AGENT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("samples_read", "samples_read_total", "GPU samples read from the backends."),
    ("events_read", "events_read_total", "XID and lost-GPU events read from the backends."),
    ("samples_sent", "samples_sent_total",
     "GPU samples the bus accepted (delivered, or spooled to disk to be delivered later)."),
    ("samples_dropped", "samples_dropped_total",
     "GPU samples of batches the bus refused (e.g. the bus or spool was full)."),
    ("nics_read", "nic_samples_read_total",
     "InfiniBand/RoCE port samples read (the infiniband backend)."),
    ("nics_sent", "nic_samples_sent_total", "InfiniBand/RoCE port samples the bus accepted."),
    ("batches_sent", "batches_sent_total", "Per-node batches the bus accepted."),
    ("batches_failed", "batches_failed_total", "Per-node batches the bus refused."),
    ("ticks_skipped", "ticks_skipped_total",
     "Ticks skipped because a tick overran its interval."),
)

# KafkaBus attribute -> (family, help); only when the bus has them
_BUS_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sent", "bus_batches_sent_total",
     "Batch parts (one per topic per batch) delivered to the broker directly."),
    ("spooled", "batches_spooled_total",
     "Batch parts written to the on-disk spool while the broker was away."),
    ("replayed", "batches_replayed_total", "Batch parts delivered from the spool."),
    ("dropped", "spool_dropped_batches_total",
     "Telemetry batch parts the spool's size bound pushed out (events are never dropped)."),
)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


@dataclass
class Family:
    """One metric family: ``samples`` are (labels, value)."""

    name: str
    kind: str  # "counter" | "gauge"
    help: str
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        yield f"# HELP {self.name} {_escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            if labels:
                inner = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
                yield f"{self.name}{{{inner}}} {_number(value)}"
            else:
                yield f"{self.name} {_number(value)}"


def exposition(families: Iterable[Family]) -> str:
    """The text format: every family's lines, newline-terminated."""
    return "".join(line + "\n" for fam in families for line in fam.lines())


class AgentMetrics:
    """Reads the live counters of ``agent``, ``backends`` and ``bus`` at every scrape."""

    def __init__(self, agent: Any, *, backends: Sequence[Any] = (), bus: Any = None) -> None:
        self.agent = agent
        self.backends = list(backends)
        self.bus = bus

    def families(self) -> list[Family]:
        counters = dict(self.agent.counters)  # one copy: a consistent view for this scrape
        fams = [Family(PREFIX + "up", "gauge", "1 while the agent runs.", [({}, 1)])]
        for key, name, text in _AGENT_COUNTERS:
            fams.append(Family(PREFIX + name, "counter", text, [({}, counters.get(key, 0))]))
        errors = Family(PREFIX + "backend_errors_total", "counter",
                        "Polls of a backend that raised (logged; the agent keeps running).")
        names = [b.name for b in self.backends]
        names += sorted(k.split(".", 1)[1] for k in counters
                        if k.startswith("backend_errors.") and k.split(".", 1)[1] not in names)
        for name in names:
            errors.samples.append(({"backend": name}, counters.get(f"backend_errors.{name}", 0)))
        fams.append(errors)
        nvml = Family(PREFIX + "nvml_errors_total", "counter",
                      "Failed NVML calls by function (an unsupported call fails once, "
                      "then is not retried).")
        for backend in self.backends:
            by_function = getattr(backend, "errors_by_function", None)
            if by_function is not None:
                for fn, n in sorted(dict(by_function).items()):
                    nvml.samples.append(({"function": fn}, n))
        fams.append(nvml)
        dropped = Family(PREFIX + "events_dropped_total", "counter",
                         "Events a backend's bounded queue had no room for.")
        for backend in self.backends:
            n = getattr(backend, "events_dropped", getattr(backend, "dropped", None))
            if isinstance(n, int):
                dropped.samples.append(({"backend": backend.name}, n))
        fams.append(dropped)
        fams.extend(self._bus_families())
        return fams

    def _bus_families(self) -> list[Family]:
        bus = self.bus
        spool = getattr(bus, "spool", None)
        if spool is None:
            return []
        fams = [Family(PREFIX + name, "counter", text, [({}, getattr(bus, attr))])
                for attr, name, text in _BUS_COUNTERS]
        fams.append(Family(PREFIX + "spool_bytes", "gauge",
                           "Bytes the on-disk spool holds.", [({}, spool.size_bytes)]))
        fams.append(Family(PREFIX + "spool_batches", "gauge",
                           "Batch parts waiting in the on-disk spool.", [({}, len(spool))]))
        return fams

    def render(self) -> str:
        return exposition(self.families())


class MetricsServer:
    """``GET /metrics`` (and ``/``) on a daemon thread; ``port`` is the bound port."""

    def __init__(self, metrics: AgentMetrics, host: str = "0.0.0.0", port: int = 9450) -> None:
        render = metrics.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = render().encode()
                except Exception:  # a scrape must never take the agent down
                    log.exception("metrics.render_failed")
                    self.send_error(500, "rendering metrics failed; see the agent's log")
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("metrics.request client=%s line=%r", self.client_address[0],
                          format % args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fleetcare-agent-metrics", daemon=True)
        self._thread.start()
        log.info("metrics.listening host=%s port=%d", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(metrics: AgentMetrics, *, host: str = "0.0.0.0", port: int = 9450
                  ) -> MetricsServer:
    """Start serving; ``port=0`` picks a free port (see ``.port``). Raises ``OSError``."""
    return MetricsServer(metrics, host, port)
