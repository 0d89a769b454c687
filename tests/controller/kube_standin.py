"""An in-test stand-in for the Kubernetes API server's scale subresources and events.

It follows the API's semantics for what the actuator uses: Scale objects with a
resourceVersion that changes on every write, 409 Conflict on a stale resourceVersion, 404 for
unknown objects, 403 when a namespace is forbidden, 429 with Retry-After when throttling, and
Status bodies for errors. No real API server can run on these machines.
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


@dataclass
class ApiState:
    objects: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)
    """(namespace, plural, name) -> {"replicas": n, "rv": version}."""
    forbidden_namespaces: set[str] = field(default_factory=set)
    throttle: int = 0
    """Answer the next N requests with 429."""
    conflicts: int = 0
    """Bump the object's version before the next N writes (a concurrent writer)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    writes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, namespace: str, plural: str, name: str, replicas: int) -> None:
        self.objects[(namespace, plural, name)] = {"replicas": replicas, "rv": 1}


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

        def _route(self, method: str) -> None:
            with state.lock:
                if state.throttle > 0:
                    state.throttle -= 1
                    self._send(429, _status(429, "TooManyRequests", "slow down"),
                               {"Retry-After": "2"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                m = _EVENTS.match(self.path.split("?")[0])
                if m and method == "POST":
                    state.events.append(body)
                    self._send(201, body)
                    return
                m = _SCALE.match(self.path.split("?")[0])
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
                    self._send(200, self._scale(ns, name, obj, m["gv"]))
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
                obj["replicas"] = replicas
                obj["rv"] += 1
                state.writes += 1
                self._send(200, self._scale(ns, name, obj, m["gv"]))

        def do_GET(self) -> None:
            self._route("GET")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_POST(self) -> None:
            self._route("POST")

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
