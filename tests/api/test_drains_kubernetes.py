"""KubernetesDrainer against recorded API responses, through the real kubernetes client.

No kube-apiserver can run here (Debian 12 does not package it; see
api/src/fleetcare/api/drains/README.md). Instead a small HTTP server on 127.0.0.1
answers like the API server: it serves a Node object in the exact shape
``kubectl get node -o json`` returns (v1.29 kubeadm worker, trimmed of images and
managedFields), applies strategic-merge patches the way the server does for the fields
fleetcare touches (``spec.taints`` replaced whole, ``status.conditions`` merged by
``type`` with ``$patch: delete``, ``null`` deletes a key, ``resourceVersion``
preconditions → 409), and answers errors with real ``Status`` bodies. Each test checks
the requests the real client sent: method, path, Content-Type, body.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from kubernetes import client  # noqa: E402

from fleetcare.api.drains.drainer import DrainerError  # noqa: E402
from fleetcare.api.drains.kubernetes import KubernetesDrainer  # noqa: E402

NODE = json.loads("""{
  "kind": "Node", "apiVersion": "v1",
  "metadata": {
    "name": "gpu-a01", "uid": "0d6c3c4e-6c2b-4f0e-9f55-3f2f7f5f0b11",
    "resourceVersion": "184467", "creationTimestamp": "2026-10-02T08:14:51Z",
    "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
               "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "gpu-a01",
               "kubernetes.io/os": "linux", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
               "nvidia.com/gpu.count": "8"},
    "annotations": {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
  },
  "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"],
           "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
  "status": {
    "capacity": {"cpu": "192", "ephemeral-storage": "3750157312Ki", "hugepages-1Gi": "0",
                 "hugepages-2Mi": "0", "memory": "2113442924Ki", "nvidia.com/gpu": "8", "pods": "110"},
    "allocatable": {"cpu": "192", "ephemeral-storage": "3456144650926", "hugepages-1Gi": "0",
                    "hugepages-2Mi": "0", "memory": "2113340524Ki", "nvidia.com/gpu": "8", "pods": "110"},
    "conditions": [
      {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-11-29T16:20:11Z",
       "lastTransitionTime": "2026-10-02T08:14:51Z", "reason": "KubeletHasSufficientMemory",
       "message": "kubelet has sufficient memory available"},
      {"type": "DiskPressure", "status": "False", "lastHeartbeatTime": "2026-11-29T16:20:11Z",
       "lastTransitionTime": "2026-10-02T08:14:51Z", "reason": "KubeletHasNoDiskPressure",
       "message": "kubelet has no disk pressure"},
      {"type": "PIDPressure", "status": "False", "lastHeartbeatTime": "2026-11-29T16:20:11Z",
       "lastTransitionTime": "2026-10-02T08:14:51Z", "reason": "KubeletHasSufficientPID",
       "message": "kubelet has sufficient PID available"},
      {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-29T16:20:11Z",
       "lastTransitionTime": "2026-10-02T08:15:23Z", "reason": "KubeletReady",
       "message": "kubelet is posting ready status"}],
    "addresses": [{"type": "InternalIP", "address": "10.0.3.11"},
                  {"type": "Hostname", "address": "gpu-a01"}],
    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    "nodeInfo": {"machineID": "4b1d6f0c2f8e4a4b9c1e0e2b7a6d5c4f",
                 "systemUUID": "2f1e0d4c-3b2a-1908-f7e6-d5c4b3a29180",
                 "bootID": "8a7b6c5d-4e3f-2a1b-0c9d-8e7f6a5b4c3d",
                 "kernelVersion": "5.15.0-122-generic", "osImage": "Ubuntu 22.04.4 LTS",
                 "containerRuntimeVersion": "containerd://1.7.12", "kubeletVersion": "v1.29.6",
                 "kubeProxyVersion": "v1.29.6", "operatingSystem": "linux", "architecture": "amd64"}
  }
}""")


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A metav1.Status body, as the API server sends with every error."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class FakeApiServer:
    """Nodes by name; ``requests`` records (method, path, content-type, body)."""

    def __init__(self) -> None:
        self.nodes = {"gpu-a01": copy.deepcopy(NODE)}
        self.requests: list[tuple[str, str, str, Any]] = []
        self.conflicts = 0  # answer this many node PATCHes with 409 first
        self.forbid = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, "", None))
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                if name not in outer.nodes:
                    return self._send(404, status(404, "NotFound", f'nodes "{name}" not found',
                                                  name=name, kind="nodes"))
                self._send(200, outer.nodes[name])

            def do_PATCH(self) -> None:
                ctype = self.headers.get("Content-Type", "")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                path = self.path.split("?")[0]
                outer.requests.append(("PATCH", self.path, ctype, copy.deepcopy(body)))
                parts = path.split("/")  # ['', 'api', 'v1', 'nodes', NAME, ('status')]
                name, sub = parts[4], parts[5] if len(parts) > 5 else ""
                if outer.forbid:
                    return self._send(403, status(
                        403, "Forbidden", f'nodes "{name}" is forbidden: User '
                        '"system:serviceaccount:fleetcare:fleetcare" cannot patch resource '
                        '"nodes" in API group "" at the cluster scope', name=name, kind="nodes"))
                if ctype != "application/strategic-merge-patch+json":
                    # what the server says when a JSON object arrives as a JSON patch
                    return self._send(400, status(
                        400, "BadRequest", "json: cannot unmarshal object into Go value of "
                        "type jsonpatch.Patch"))
                node = outer.nodes.get(name)
                if node is None:
                    return self._send(404, status(404, "NotFound", f'nodes "{name}" not found'))
                want_rv = body.get("metadata", {}).pop("resourceVersion", None)
                if not sub and outer.conflicts:
                    outer.conflicts -= 1
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                if want_rv is not None and want_rv != node["metadata"]["resourceVersion"]:
                    return self._send(409, status(
                        409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the '
                        "object has been modified; please apply your changes to the latest "
                        "version and try again", name=name, kind="nodes"))
                if sub == "status":
                    conds = node["status"]["conditions"]
                    for c in body["status"]["conditions"]:
                        conds[:] = [x for x in conds if x["type"] != c["type"]] + (
                            [] if c.get("$patch") == "delete" else
                            [{**next((x for x in conds if x["type"] == c["type"]), {}), **c}])
                else:
                    merge(node, body)
                node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                self._send(200, node)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def patches(self) -> list[tuple[str, str, str, Any]]:
        return [r for r in self.requests if r[0] == "PATCH"]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    s = FakeApiServer()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture
def drainer(server: FakeApiServer) -> KubernetesDrainer:
    cfg = client.Configuration(host=server.url)
    cfg.api_key = {"BearerToken": "test-token"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    api = client.CoreV1Api(client.ApiClient(cfg))
    clock = lambda: dt.datetime(2026, 11, 29, 16, 30, tzinfo=dt.UTC)  # noqa: E731
    return KubernetesDrainer(api, clock=clock)


REASON = "fleetcare: risk 0.83, GPU 3: HBM uncorrectable ECC errors 40x the fleet median"


def test_state_of_a_ready_node_is_idle(drainer: KubernetesDrainer) -> None:
    st = drainer.state("gpu-a01")
    assert (st.state, st.reason) == ("idle", None)
    assert st.raw == ("Ready=True unschedulable=False fleetcare.io/failure-risk=no "
                      "FleetcareFailureRisk=missing")


def test_drain_cordons_taints_and_sets_the_condition(drainer: KubernetesDrainer,
                                                      server: FakeApiServer) -> None:
    drainer.drain("gpu-a01", REASON)
    (m1, p1, c1, b1), (m2, p2, c2, b2) = server.patches()
    assert (m1, p1.split("?")[0], c1) == ("PATCH", "/api/v1/nodes/gpu-a01",
                                          "application/strategic-merge-patch+json")
    assert "fieldManager=fleetcare" in p1
    assert b1 == {"metadata": {"annotations": {"fleetcare.io/drain-reason": REASON},
                               "resourceVersion": "184467"},
                  "spec": {"unschedulable": True, "taints": [
                      {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                      {"key": "fleetcare.io/failure-risk", "value": "high",
                       "effect": "NoSchedule"}]}}
    assert (m2, p2.split("?")[0], c2) == ("PATCH", "/api/v1/nodes/gpu-a01/status",
                                          "application/strategic-merge-patch+json")
    assert b2 == {"status": {"conditions": [
        {"type": "FleetcareFailureRisk", "status": "True", "reason": "FailureRiskHigh",
         "message": REASON, "lastHeartbeatTime": "2026-11-29T16:30:00Z",
         "lastTransitionTime": "2026-11-29T16:30:00Z"}]}}
    st = drainer.state("gpu-a01")
    assert (st.state, st.reason, st.by_fleetcare) == ("drained", REASON, True)
    node = server.nodes["gpu-a01"]
    assert [c["type"] for c in node["status"]["conditions"]][-1] == "FleetcareFailureRisk"


def test_resume_removes_cordon_taint_annotation_and_condition(drainer: KubernetesDrainer,
                                                              server: FakeApiServer) -> None:
    drainer.drain("gpu-a01", REASON)
    server.requests.clear()
    drainer.resume("gpu-a01", "cleared by alice")
    (_, p1, c1, b1), (_, p2, c2, b2) = server.patches()
    assert b1 == {"metadata": {"annotations": {"fleetcare.io/drain-reason": None},
                               "resourceVersion": "184469"},
                  "spec": {"unschedulable": None, "taints": [
                      {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}
    assert b2 == {"status": {"conditions": [{"type": "FleetcareFailureRisk",
                                             "$patch": "delete"}]}}
    node = server.nodes["gpu-a01"]
    assert "unschedulable" not in node["spec"]
    assert node["spec"]["taints"] == NODE["spec"]["taints"]
    assert "fleetcare.io/drain-reason" not in node["metadata"]["annotations"]
    assert node["status"]["conditions"] == NODE["status"]["conditions"]
    assert drainer.state("gpu-a01").state == "idle"


def test_a_conflicting_change_is_retried_on_a_fresh_read(drainer: KubernetesDrainer,
                                                         server: FakeApiServer) -> None:
    server.conflicts = 1
    drainer.drain("gpu-a01", REASON)
    gets = [r for r in server.requests if r[0] == "GET"]
    assert len(gets) == 2  # read, 409, read again
    assert drainer.state("gpu-a01").state == "drained"


def test_not_ready_node_is_down_and_cordon_by_someone_else_is_not_ours(
        drainer: KubernetesDrainer, server: FakeApiServer) -> None:
    node = server.nodes["gpu-a01"]
    node["spec"]["unschedulable"] = True
    st = drainer.state("gpu-a01")
    assert (st.state, st.reason, st.by_fleetcare) == ("drained", "cordoned (not by fleetcare)",
                                                      False)
    node["status"]["conditions"][-1].update(status="Unknown", reason="NodeStatusUnknown")
    assert drainer.state("gpu-a01").state == "down"


def test_errors_say_what_and_how_to_fix(drainer: KubernetesDrainer,
                                        server: FakeApiServer) -> None:
    assert drainer.state("gpu-z99").state == "unknown"
    server.forbid = True
    with pytest.raises(DrainerError) as e:
        drainer.drain("gpu-a01", REASON)
    assert "403 Forbidden" in str(e.value) and "cannot patch resource" in str(e.value)
    assert "nodes/status" in str(e.value)
