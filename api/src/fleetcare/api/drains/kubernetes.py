"""``KubernetesDrainer``: cordon, taint and flag a Node through the official client.

A drain, as three changes a human sees in ``kubectl describe node``:

- cordon: ``spec.unschedulable: true`` (what ``kubectl cordon`` does);
- taint ``fleetcare.io/failure-risk=high:NoSchedule`` (pods that tolerate cordons, such
  as DaemonSets, still respect it only if they do not tolerate it; schedulers and
  autoscalers can select on it), plus the annotation ``fleetcare.io/drain-reason``;
- node condition ``FleetcareFailureRisk`` = True with the reason as its message
  (``PATCH /api/v1/nodes/NAME/status``; the conditions list merges by ``type``).

``resume`` removes all three. Running pods are not evicted: like Slurm's DRAIN, running
work finishes (or checkpoints) and no new work lands; evicting is the operator's call.

Both patches are strategic-merge patches (``application/strategic-merge-patch+json``),
named explicitly rather than left to the generated client's choice of content type. The node patch carries the resourceVersion it
was computed from, so a concurrent change to the taints gives 409 and is retried on a
fresh read instead of being overwritten.

RBAC: ``get`` and ``patch`` on ``nodes`` and ``patch`` on ``nodes/status``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

from fleetcare.api.drains.drainer import (
    DOWN,
    DRAINED,
    IDLE,
    UNKNOWN,
    DrainerError,
    NodeState,
    clean_reason,
)

log = logging.getLogger(__name__)

STRATEGIC = "application/strategic-merge-patch+json"
TAINT_KEY = "fleetcare.io/failure-risk"
REASON_ANNOTATION = "fleetcare.io/drain-reason"
CONDITION = "FleetcareFailureRisk"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _field(obj: Any, name: str) -> Any:
    return getattr(obj, name, None) if obj is not None else None


class KubernetesDrainer:
    """``api`` is a ``kubernetes.client.CoreV1Api`` (default: in-cluster config, else
    ``~/.kube/config``)."""

    name = "kubernetes"

    def __init__(self, api: Any = None, *, taint_key: str = TAINT_KEY, taint_value: str = "high",
                 taint_effect: str = "NoSchedule", condition: str = CONDITION,
                 field_manager: str = "fleetcare", clock: Callable[[], dt.datetime] = _utcnow,
                 retries: int = 3) -> None:
        self.api = api if api is not None else _default_api()
        self.taint_key = taint_key
        self.taint_value = taint_value
        self.taint_effect = taint_effect
        self.condition = condition
        self.field_manager = field_manager
        self.clock = clock
        self.retries = retries

    # -- plumbing ------------------------------------------------------------------------------
    def _error(self, node: str, what: str, exc: Exception) -> DrainerError:
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException):
            message = exc.reason or ""
            try:
                message = json.loads(exc.body or "{}").get("message") or message
            except (ValueError, AttributeError):
                pass
            hint = {401: " Check the kubeconfig's credentials.",
                    403: " fleetcare's account needs get/patch on nodes and patch on "
                         "nodes/status (see drains/README.md, RBAC).",
                    404: " Check the name with `kubectl get nodes`.",
                    415: " The API server refused the patch type."}.get(exc.status or 0, "")
            return DrainerError(node, f"Kubernetes API: {what} {node}: {exc.status} "
                                      f"{exc.reason}: {message}.{hint}", detail=str(exc.body))
        host = getattr(getattr(self.api, "api_client", None), "configuration", None)
        return DrainerError(node, f"Kubernetes API at {getattr(host, 'host', '?')} unreachable "
                                  f"({what} {node}): {exc}. Check the kubeconfig / "
                                  "KUBERNETES_SERVICE_HOST.")

    def _read(self, node: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_node(node)
        except ApiException as exc:
            raise self._error(node, "read node", exc) from None
        except Exception as exc:  # urllib3 connection errors
            raise self._error(node, "read node", exc) from None

    def _patch(self, node: str, body: dict[str, Any], *, status: bool = False) -> None:
        from kubernetes.client.exceptions import ApiException

        call = self.api.patch_node_status if status else self.api.patch_node
        try:
            call(node, body, field_manager=self.field_manager, _content_type=STRATEGIC)
        except ApiException:
            raise
        except Exception as exc:
            raise self._error(node, "patch node", exc) from None

    def _patch_spec(self, node: str, make: Callable[[Any], dict[str, Any] | None]) -> None:
        """Read the node, build a patch from it, send it with the read resourceVersion;
        on 409 (someone changed it meanwhile) read again, up to ``retries`` times."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(self.retries):
            current = self._read(node)
            body = make(current)
            if body is None:
                return
            body.setdefault("metadata", {})["resourceVersion"] = current.metadata.resource_version
            try:
                self._patch(node, body)
                return
            except ApiException as exc:
                if exc.status == 409 and attempt + 1 < self.retries:
                    log.info("drain.kubernetes.conflict node=%s attempt=%d", node, attempt + 1)
                    continue
                raise self._error(node, "patch node", exc) from None

    def _other_taints(self, n: Any) -> list[dict[str, Any]]:
        out = []
        for t in _field(n.spec, "taints") or []:
            if t.key == self.taint_key:
                continue
            d = {"key": t.key, "effect": t.effect}
            if t.value is not None:
                d["value"] = t.value
            if t.time_added is not None:
                d["timeAdded"] = t.time_added.isoformat().replace("+00:00", "Z")
            out.append(d)
        return out

    # -- Drainer -----------------------------------------------------------------------------------
    def state(self, node: str) -> NodeState:
        try:
            n = self._read(node)
        except DrainerError as exc:
            if '"code":404' in exc.detail.replace(" ", "") or ": 404 " in str(exc):
                return NodeState(node, UNKNOWN, None, "NotFound")
            raise
        conds = {c.type: c for c in (_field(n.status, "conditions") or [])}
        ready, ours = conds.get("Ready"), conds.get(self.condition)
        ours_on = ours is not None and ours.status == "True"
        ours_msg = _field(ours, "message")
        tainted = any(t.key == self.taint_key for t in (_field(n.spec, "taints") or []))
        cordoned = bool(_field(n.spec, "unschedulable"))
        raw = (f"Ready={_field(ready, 'status') or 'missing'} unschedulable={cordoned} "
               f"{self.taint_key}={'yes' if tainted else 'no'} {self.condition}="
               f"{_field(ours, 'status') or 'missing'}")
        reason = None
        if ours_on:
            reason = ours_msg
        elif tainted:
            annotations = _field(n.metadata, "annotations") or {}
            reason = annotations.get(REASON_ANNOTATION) or f"fleetcare: taint {self.taint_key}"
        if ready is None or ready.status != "True":
            why = reason or f"NotReady: {_field(ready, 'reason') or 'no Ready condition'}"
            return NodeState(node, DOWN, why, raw)
        if cordoned or tainted:
            return NodeState(node, DRAINED, reason or "cordoned (not by fleetcare)", raw)
        return NodeState(node, IDLE, None, raw)

    def drain(self, node: str, reason: str) -> None:
        reason = clean_reason(reason)
        ours = {"key": self.taint_key, "value": self.taint_value, "effect": self.taint_effect}
        self._patch_spec(node, lambda n: {
            "metadata": {"annotations": {REASON_ANNOTATION: reason}},
            "spec": {"unschedulable": True, "taints": [*self._other_taints(n), ours]}})
        now = self.clock().astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._set_condition(node, {"type": self.condition, "status": "True",
                                   "reason": "FailureRiskHigh", "message": reason,
                                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        log.info("drain.kubernetes.drained node=%s reason=%r", node, reason)

    def resume(self, node: str, reason: str) -> None:
        def make(n: Any) -> dict[str, Any]:
            return {"metadata": {"annotations": {REASON_ANNOTATION: None}},
                    "spec": {"unschedulable": None, "taints": self._other_taints(n) or None}}

        self._patch_spec(node, make)
        self._set_condition(node, {"type": self.condition, "$patch": "delete"})
        log.info("drain.kubernetes.resumed node=%s why=%r", node, reason)

    def _set_condition(self, node: str, condition: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._patch(node, {"status": {"conditions": [condition]}}, status=True)
        except ApiException as exc:
            raise self._error(node, "patch node status", exc) from None


def _default_api() -> Any:
    try:
        from kubernetes import client, config
    except ImportError as exc:  # pragma: no cover - a dependency of fleetcare-api
        raise DrainerError("-", "the kubernetes package is missing: pip install kubernetes") from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, FileNotFoundError, TypeError) as exc:
            raise DrainerError("-", f"no Kubernetes configuration: not in a cluster and no "
                                    f"usable kubeconfig ({exc}); set KUBECONFIG") from None
    return client.CoreV1Api()
