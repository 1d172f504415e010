"""``open_bus(url)``: the ``Bus`` a URL names, for the agent and the demo.

    open_bus("embedded://var/bus")                               # EmbeddedBus
    open_bus("kafka://10.0.0.5:9092", spool_dir="/var/lib/fleetcare/spool")   # KafkaBus

Options (``**opts``) go to the bus's constructor unchanged (e.g. ``max_bytes=`` for the
embedded bus; ``topic_prefix=``, ``security=``, ``spool_max_bytes=`` for Kafka). The
Kafka spool lives in ``spool_dir``, else ``$FLEETCARE_SPOOL_DIR``, else
``/var/lib/fleetcare/spool``. Raises ``ValueError`` for a URL of any other form.
"""

from __future__ import annotations

import os
from typing import Any

from fleetcare.collectors.redact import mask_secrets
from fleetcare.collectors.transport import Bus
from fleetcare.collectors.transport.embedded import EmbeddedBus

DEFAULT_SPOOL_DIR = "/var/lib/fleetcare/spool"
SPOOL_DIR_ENV = "FLEETCARE_SPOOL_DIR"
BUS_FORMS = ("embedded://PATH", "kafka://HOST:PORT[,HOST:PORT]")


CREDENTIALS_IN_URL = (
    "credentials in a kafka:// URL are not used (and would be printed): give the user and "
    "password as kafka_sasl_plain_username / kafka_sasl_plain_password (with "
    "kafka_security_protocol and kafka_sasl_mechanism) in the config file or environment")


def bus_scheme(url: str) -> str:
    """``"embedded"`` or ``"kafka"``; ``ValueError`` naming both forms otherwise, or when a
    kafka:// URL carries credentials (see ``CREDENTIALS_IN_URL``)."""
    scheme, sep, rest = url.partition("://")
    if sep and rest and scheme in ("embedded", "kafka"):
        if scheme == "kafka" and "@" in rest.split("/", 1)[0]:
            raise ValueError(f"bus URL {mask_secrets(url)!r}: {CREDENTIALS_IN_URL}")
        return scheme
    raise ValueError(f"bus URL {mask_secrets(url)!r} is not understood: use {BUS_FORMS[0]} "
                     f"(one host, no broker) or {BUS_FORMS[1]} (Apache Kafka)")


def open_bus(url: str, *, spool_dir: str | os.PathLike[str] | None = None,
             **opts: Any) -> Bus:
    """The bus ``url`` names (see the module docstring)."""
    if bus_scheme(url) == "embedded":
        return EmbeddedBus.from_url(url, **opts)
    from fleetcare.collectors.transport.kafka import KafkaBus  # needs the `kafka` extra only here

    spool = spool_dir or os.environ.get(SPOOL_DIR_ENV) or DEFAULT_SPOOL_DIR
    return KafkaBus.from_url(url, spool=spool, **opts)
