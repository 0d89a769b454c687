"""An in-test stand-in for the Kubernetes API server: scale subresources, workload status,
events, coordination.k8s.io Leases, and pods (list, get, label and annotation patches).

It follows the API's semantics for what pdscale uses: objects with a resourceVersion that
changes on every write, 409 Conflict on a stale resourceVersion or on creating an object that
exists, 404 for unknown objects, 403 when a namespace is forbidden, 429 with Retry-After when
throttling, 400 for a Lease time that is not RFC 3339 with microseconds (MicroTime), 5xx when
told to fail, and Status bodies for errors. No real API server can run on these machines.

Pods: a strategic-merge or JSON merge patch merges ``metadata.labels`` and
``metadata.annotations`` (a null value deletes the key); a ``metadata.resourceVersion`` in the
patch is a precondition (409 when the pod changed since). A workload added with
:meth:`ApiState.add_workload` owns pods, and its scale writes create and delete them as the
real controllers do: a ReplicaSet deletes not-ready pods first, then the lowest
``controller.kubernetes.io/pod-deletion-cost``, then the newest; a StatefulSet deletes its
highest ordinals. Every pod patch and scale write is appended to :attr:`ApiState.log`, so a
test can check the order of operations.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
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
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
_COST = "controller.kubernetes.io/pod-deletion-cost"
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
    pod_conflicts: int = 0
    """Change the pod (a concurrent writer) before each of the next N pod patches."""
    forbidden_pods: bool = False
    """403 on every pod call (the drain's RBAC not granted)."""
    log: list[tuple[str, ...]] = field(default_factory=list)
    """("patch", pod, what), ("scale", workload, replicas), ("delete", pod) in order."""
    selectors: dict[tuple[str, str, str], dict[str, str]] = field(default_factory=dict)
    """A workload's spec.selector.matchLabels (default {"app": name})."""
    template_labels: dict[tuple[str, str, str], dict[str, str]] = field(default_factory=dict)
    managed: set[tuple[str, str, str]] = field(default_factory=set)
    serial: int = 0
    clock: float = 1_800_000_000.0
    """Creation time of the next pod (advanced by one second per pod)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, namespace: str, plural: str, name: str, replicas: int) -> None:
        self.objects[(namespace, plural, name)] = {"replicas": replicas, "ready": replicas,
                                                   "rv": 1}

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], *,
                ready: bool = True, annotations: dict[str, str] | None = None) -> None:
        self.clock += 1
        stamp = _rfc3339(self.clock)
        self.pods[(namespace, name)] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "labels": dict(labels),
            "annotations": dict(annotations or {}), "resourceVersion": "1",
            "creationTimestamp": stamp},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}

    def add_workload(self, namespace: str, plural: str, name: str, replicas: int, *,
                     labels: dict[str, str] | None = None) -> list[str]:
        """A Deployment or StatefulSet that owns ``replicas`` ready pods (template labels
        ``app: <name>`` plus ``labels``); returns their names."""
        key = (namespace, plural, name)
        self.add(namespace, plural, name, replicas)
        self.managed.add(key)
        self.template_labels[key] = {"app": name, **(labels or {})}
        self._converge(key)
        return self.pod_names(namespace, name)

    def pod_names(self, namespace: str, workload: str) -> list[str]:
        return sorted(n for (ns, n), p in self.pods.items() if ns == namespace
                      and p["metadata"]["labels"].get("app") == workload)

    def set_ready(self, namespace: str, pod: str, ready: bool) -> None:
        self.pods[(namespace, pod)]["status"]["conditions"] = [
            {"type": "Ready", "status": "True" if ready else "False"}]

    def _converge(self, key: tuple[str, str, str]) -> None:
        namespace, plural, name = key
        want = self.objects[key]["replicas"]
        mine = [n for n in self.pod_names(namespace, name)]
        if plural == "statefulsets":
            ordinals = sorted(int(n.rsplit("-", 1)[1]) for n in mine)
            for i in range(want):
                if i not in ordinals:
                    self.add_pod(namespace, f"{name}-{i}", self.template_labels[key],
                                 ready=self.ready_follows)
            for i in ordinals:
                if i >= want:
                    self._delete(namespace, f"{name}-{i}")
            return
        for _ in range(want - len(mine)):
            self.serial += 1
            self.add_pod(namespace, f"{name}-{self.serial:05x}", self.template_labels[key],
                         ready=self.ready_follows)
        if len(mine) > want:
            def rank(pod_name: str) -> tuple[int, int, str]:
                pod = self.pods[(namespace, pod_name)]
                ready = pod["status"]["conditions"][0]["status"] == "True"
                cost = int(pod["metadata"]["annotations"].get(_COST, "0"))
                return (1 if ready else 0, cost, _negated(pod["metadata"]["creationTimestamp"]))
            for pod_name in sorted(mine, key=rank)[:len(mine) - want]:
                self._delete(namespace, pod_name)

    def _delete(self, namespace: str, pod: str) -> None:
        del self.pods[(namespace, pod)]
        self.log.append(("delete", pod))


def _rfc3339(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _negated(stamp: str) -> str:
    """Sorts the newest first (creation stamps are fixed-width)."""
    return "".join(chr(255 - ord(c)) for c in stamp)


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
            labels = state.selectors.get((ns, plural, name), {"app": name})
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

        def _pod(self, method: str, ns: str, name: str, body: Any) -> None:
            pod = state.pods.get((ns, name))
            if pod is None:
                self._send(404, _status(404, "NotFound", f"pods {name} not found"))
                return
            if method == "PATCH":
                kind = self.headers.get("Content-Type", "")
                if kind not in ("application/strategic-merge-patch+json",
                                "application/merge-patch+json") or not isinstance(body, dict):
                    self._send(415, _status(415, "UnsupportedMediaType",
                                            f"this stand-in takes object patches, not {kind}"))
                    return
                meta = pod["metadata"]
                if state.pod_conflicts > 0:  # a concurrent writer got there first
                    state.pod_conflicts -= 1
                    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                sent = body.get("metadata", {}).get("resourceVersion")
                if sent is not None and str(sent) != meta["resourceVersion"]:
                    self._send(409, _status(409, "Conflict", "the object has been modified; "
                                            "please apply your changes to the latest version"))
                    return
                changed = []
                for section in ("labels", "annotations"):
                    for k, v in (body.get("metadata", {}).get(section) or {}).items():
                        target = meta.setdefault(section, {})
                        if v is None:
                            target.pop(k, None)
                        else:
                            target[k] = str(v)
                        changed.append(f"{k}={v}")
                meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                state.log.append(("patch", name, ",".join(sorted(changed))))
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
                m = _PODS.match(path)
                if m and method == "GET":
                    if m["ns"] in state.forbidden_namespaces or state.forbidden_pods:
                        self._send(403, _status(403, "Forbidden", "cannot list pods"))
                        return
                    query = dict(q.split("=", 1) for q in self.path.partition("?")[2].split("&")
                                 if "=" in q)
                    wanted = dict(pair.split("=", 1) for pair in
                                  urllib.parse.unquote(query.get("labelSelector", "")).split(",")
                                  if "=" in pair)
                    items = [p for (ns, _), p in sorted(state.pods.items()) if ns == m["ns"]
                             and all(p["metadata"]["labels"].get(k) == v
                                     for k, v in wanted.items())]
                    state.lists += 1
                    self._send(200, {"apiVersion": "v1", "kind": "PodList", "items": items,
                                     "metadata": {"resourceVersion": "1"}})
                    return
                m = _POD.match(path)
                if m:
                    if m["ns"] in state.forbidden_namespaces or state.forbidden_pods:
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
                state.log.append(("scale", name, str(replicas)))
                if (ns, plural, name) in state.managed:
                    state._converge((ns, plural, name))
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
