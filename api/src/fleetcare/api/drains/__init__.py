"""Drains: tell the scheduler to stop placing work on nodes about to fail.

Modules::

    drainer     the Drainer Protocol, NodeState, scheduler-neutral states, reasons
    slurm       SlurmDrainer (scontrol)
    kubernetes  KubernetesDrainer (official client: cordon, taint, node condition)
    simulated   SimulatedDrainer (the demo's simulated fleet, in memory)
    audit       drain_audit and drains tables (DuckDB)
    breaker     the circuit breaker: at most N nodes / 5 % of the fleet per hour
    controller  DrainController: dry-run by default; run_once(now) for the service loop

Errors::

    Exception
     ├── DrainerError     (.node, .detail)  a scheduler command / API call failed
     ├── ControllerError  (.node)           an operator request cannot be done
     └── ValueError
          └── BreakerError (.name, .value)  a breaker setting is out of range
"""

from fleetcare.api.drains.breaker import BreakerError, BreakerPolicy, CircuitBreaker
from fleetcare.api.drains.controller import (
    ControllerError,
    Decision,
    DrainController,
    DrainPolicy,
    RunReport,
)
from fleetcare.api.drains.drainer import Drainer, DrainerError, NodeState, drain_reason

__all__ = ["BreakerError", "BreakerPolicy", "CircuitBreaker", "ControllerError", "Decision",
           "DrainController", "DrainPolicy", "Drainer", "DrainerError", "NodeState",
           "RunReport", "drain_reason"]
