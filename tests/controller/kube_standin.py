"""An in-test stand-in for the Kubernetes API server: scale subresources, workload status,
events, coordination.k8s.io Leases and pod label patches.

It follows the API's semantics for what pdscale uses: objects with a resourceVersion that
changes on every write, 409 Conflict on a stale resourceVersion or on creating an object that
exists, 404 for unknown objects, 403 when a namespace is forbidden, 429 with Retry-After when
throttling, 400 for a Lease time that is not RFC 3339 with microseconds (MicroTime), 5xx when
told to fail, and Status bodies for errors. No real API server can run on these machines.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SCALE = re.compile(r"^/apis/(?P<gv>[^/]+/[^/]+|apps/v1)/namespaces/(?P<ns>[^/]+)/"
                    r"(?P<plural>[^/]+)/(?P<name>[^/]+)/scale$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
_OBJECT = re.compile(r"^/apis/(?P<gv>[^/]+/[^/]+|apps/v1)/namespaces/(?P<ns>[^/]+)/"
                     r"(?P<plural>[^/]+)/(?P<name>[^/]+)$")
_LIST = re.compile(r"^/apis/(?P<gv>[^/]+/[^/]+|apps/v1)/namespaces/(?P<ns>[^/]+)/"
                   r"(?P<plural>[^/]+)$")
_LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases"
                     r"(?:/(?P<name>[^/]+))?$")
_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
_MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


@dataclass
class ApiState:
    objects: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)
    """(namespace, plural, name) -> {"replicas": n, "ready": n, "rv": version}."""
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> pod object (metadata.labels is what patches change)."""
    fail_next: int = 0
    """Answer the next N requests with 503."""
    on_scale: Any = None
    """Called as on_scale(namespace, plural, name, replicas) after each scale write (an e2e
    test forwards it to the simulator)."""
    ready_follows: bool = True
    """Ready replicas follow spec.replicas at once; False: a test moves them (cold start)."""
    forbidden_namespaces: set[str] = field(default_factory=set)
    throttle: int = 0
    """Answer the next N requests with 429."""
    conflicts: int = 0
    """Bump the object's version before the next N writes (a concurrent writer)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    writes: int = 0
    lists: int = 0
    dry_runs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, namespace: str, plural: str, name: str, replicas: int) -> None:
        self.objects[(namespace, plural, name)] = {"replicas": replicas, "ready": replicas,
                                                   "rv": 1}

    def add_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.pods[(namespace, name)] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "labels": dict(labels),
            "resourceVersion": "1"}}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}


def make_handler(state: ApiState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _scale(self, ns: str, name: str, obj: dict[str, int], gv: str) -> dict[str, Any]:
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {"name": name, "namespace": ns,
                                 "resourceVersion": str(obj["rv"])},
                    "spec": {"replicas": obj["replicas"]},
                    "status": {"replicas": obj["replicas"]}}

        def _object(self, ns: str, plural: str, name: str, obj: dict[str, int],
                    gv: str) -> dict[str, Any]:
            labels = {"app": name}
            spec: dict[str, Any] = {
                "replicas": obj["replicas"], "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                             "spec": {"containers": [{"name": "engine", "image": "vllm"}]}}}
            if plural == "statefulsets":
                spec["serviceName"] = name
            return {"apiVersion": gv, "kind": plural[:-1].capitalize(),
                    "metadata": {"name": name, "namespace": ns,
                                 "resourceVersion": str(obj["rv"])},
                    "spec": spec,
                    "status": {"replicas": obj["replicas"], "readyReplicas": obj["ready"]}}

        def _lease(self, method: str, ns: str, name: str | None, body: dict[str, Any]) -> None:
            if method == "POST":
                name = str(body.get("metadata", {}).get("name", ""))
                if (ns, name) in state.leases:
                    self._send(409, _status(409, "AlreadyExists", f"lease {name} exists"))
                    return
            elif name is None or (ns, name) not in state.leases:
                self._send(404, _status(404, "NotFound", f"lease {name} not found"))
                return
            if method == "GET":
                self._send(200, state.leases[(ns, name)])
                return
            for stamp in ("acquireTime", "renewTime"):
                value = body.get("spec", {}).get(stamp)
                if value is not None and not _MICROTIME.match(str(value)):
                    self._send(400, _status(400, "BadRequest",
                                            f"spec.{stamp}: {value!r} is not a MicroTime"))
                    return
            if method == "PUT":
                current = state.leases[(ns, name)]
                if state.conflicts > 0:  # a concurrent writer got there first
                    state.conflicts -= 1
                    meta = current["metadata"]
                    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                sent = str(body.get("metadata", {}).get("resourceVersion", ""))
                if sent != current["metadata"]["resourceVersion"]:
                    self._send(409, _status(409, "Conflict", "the object has been modified"))
                    return
                version = int(current["metadata"]["resourceVersion"]) + 1
            else:
                version = 1
            stored = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                      "metadata": {"name": name, "namespace": ns,
                                   "resourceVersion": str(version)},
                      "spec": body.get("spec", {})}
            state.leases[(ns, name)] = stored
            self._send(201 if method == "POST" else 200, stored)

        def _pod(self, method: str, ns: str, name: str, body: dict[str, Any]) -> None:
            pod = state.pods.get((ns, name))
            if pod is None:
                self._send(404, _status(404, "NotFound", f"pods {name} not found"))
                return
            if method == "PATCH":
                labels = body.get("metadata", {}).get("labels", {})
                for k, v in labels.items():
                    if v is None:
                        pod["metadata"]["labels"].pop(k, None)
                    else:
                        pod["metadata"]["labels"][k] = v
                rv = int(pod["metadata"]["resourceVersion"]) + 1
                pod["metadata"]["resourceVersion"] = str(rv)
            self._send(200, pod)

        def _route(self, method: str) -> None:
            with state.lock:
                if state.throttle > 0:
                    state.throttle -= 1
                    self._send(429, _status(429, "TooManyRequests", "slow down"),
                               {"Retry-After": "2"})
                    return
                if state.fail_next > 0:
                    state.fail_next -= 1
                    self._send(503, _status(503, "ServiceUnavailable", "etcd is sad"))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                path = self.path.split("?")[0]
                # Server-side dry run: validated and answered, never stored.
                dry_run = method != "GET" and "dryRun=All" in self.path
                if dry_run:
                    state.dry_runs += 1
                m = _EVENTS.match(path)
                if m and method == "POST":
                    if not dry_run:
                        state.events.append(body)
                    self._send(201, body)
                    return
                m = _LEASES.match(path)
                if m:
                    if m["ns"] in state.forbidden_namespaces:
                        self._send(403, _status(403, "Forbidden", "cannot touch leases"))
                        return
                    self._lease(method, m["ns"], m["name"], body)
                    return
                m = _POD.match(path)
                if m:
                    if m["ns"] in state.forbidden_namespaces:
                        self._send(403, _status(403, "Forbidden", "cannot patch pods"))
                        return
                    self._pod(method, m["ns"], m["name"], body)
                    return
                m = _LIST.match(path)
                if m and method == "GET":
                    if m["ns"] in state.forbidden_namespaces:
                        self._send(403, _status(403, "Forbidden", f"cannot list {m['plural']}"))
                        return
                    items = [self._object(ns, plural, name, obj, m["gv"])
                             for (ns, plural, name), obj in state.objects.items()
                             if ns == m["ns"] and plural == m["plural"]]
                    state.lists += 1
                    self._send(200, {"apiVersion": m["gv"], "kind": "List", "items": items,
                                     "metadata": {"resourceVersion": "1"}})
                    return
                scale = _SCALE.match(path)
                m = scale or _OBJECT.match(path)
                if not m:
                    self._send(404, _status(404, "NotFound", f"no route {self.path}"))
                    return
                ns, plural, name = m["ns"], m["plural"], m["name"]
                if ns in state.forbidden_namespaces:
                    self._send(403, _status(403, "Forbidden",
                                            f"cannot {method.lower()} {plural}/scale in {ns}"))
                    return
                obj = state.objects.get((ns, plural, name))
                if obj is None:
                    self._send(404, _status(404, "NotFound", f"{plural} {name} not found"))
                    return
                if method == "GET":
                    self._send(200, self._scale(ns, name, obj, m["gv"]) if scale
                               else self._object(ns, plural, name, obj, m["gv"]))
                    return
                if not scale:
                    self._send(405, _status(405, "MethodNotAllowed", "only the scale "
                                            "subresource is written here"))
                    return
                if state.conflicts > 0:
                    state.conflicts -= 1
                    obj["rv"] += 1
                sent = str(body.get("metadata", {}).get("resourceVersion", ""))
                if sent and sent != str(obj["rv"]):
                    self._send(409, _status(409, "Conflict", "the object has been modified"))
                    return
                replicas = body.get("spec", {}).get("replicas")
                if not isinstance(replicas, int) or replicas < 0:
                    self._send(422, _status(422, "Invalid", "spec.replicas must be >= 0"))
                    return
                if dry_run:
                    self._send(200, self._scale(ns, name, obj, m["gv"]))
                    return
                obj["replicas"] = replicas
                if state.ready_follows:
                    obj["ready"] = replicas
                else:
                    obj["ready"] = min(obj["ready"], replicas)
                obj["rv"] += 1
                state.writes += 1
                if state.on_scale is not None:
                    state.on_scale(ns, plural, name, replicas)
                self._send(200, self._scale(ns, name, obj, m["gv"]))

        def do_GET(self) -> None:
            self._route("GET")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PATCH(self) -> None:
            self._route("PATCH")

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextmanager
def api_standin(state: ApiState) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
