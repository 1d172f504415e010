"""Alerts: a hysteresis rule over node risk, routed to webhook sinks through a durable
outbox in DuckDB.

    from fleetcare.api.alerts import AlertEngine, load_config

    engine = AlertEngine.from_config(store, load_config(path))  # once, at start-up
    engine.evaluate(now)             # after each scoring run
    engine.outbox.deliver_due(now)   # then POST what is due (retries with backoff)

Modules: ``rules`` (the state machine), ``sinks`` (Alertmanager webhook and API v2, Slack,
PagerDuty, signed JSON; ``verify_signature`` for receivers), ``outbox`` (durable delivery), ``engine``
(scoring runs -> alert rows + outbox messages), ``config`` (``[alerts]`` TOML + env).

Exceptions::

    ConfigError (fleetcare.collectors.config)  (.key, .value)  bad [alerts] configuration

Delivery failures are not exceptions: they are rows (``alert_outbox.state``), log
events (``alerts.retry``, ``alerts.dead``) and counters (``Outbox.counters``).
"""

from fleetcare.api.alerts.config import AlertsConfig, Secret, SinkConfig
from fleetcare.api.alerts.config import load as load_config
from fleetcare.api.alerts.engine import AlertEngine, list_alerts
from fleetcare.api.alerts.outbox import Delivery, Outbox
from fleetcare.api.alerts.rules import Alert, Rule, Score
from fleetcare.api.alerts.sinks import AlertEvent, Sink, verify_signature

__all__ = ["Alert", "AlertEngine", "AlertEvent", "AlertsConfig", "Delivery", "Outbox", "Rule",
           "Score", "Secret", "Sink", "SinkConfig", "list_alerts", "load_config",
           "verify_signature"]
