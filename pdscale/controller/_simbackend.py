"""The controller against the simulator's live mode instead of Kubernetes (``pdscale up``):
replica counts from its ``GET /status``, scaling through its ``POST /scale``.

It offers what the controller asks of :class:`controller._kube.KubeScaleActuator` (statuses
for many pools, set replicas, record an event, prime), for the one service the simulator runs.
Events go to the log; there are no pods to relabel.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from pdscale.controller._interface import PoolKey
from pdscale.controller._kube import KubeRejected, KubeUnavailable, ScaleStatus

__all__ = ["SimBackend"]

log = logging.getLogger("pdscale.controller")


class SimBackend:
    def __init__(self, url: str, service: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.service = service
        self.timeout_s = timeout_s
        self.dry_run = False
        self.writes: list[tuple[PoolKey, int]] = []

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data,
                                     method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise KubeRejected(f"simulator {self.url}{path} answered {exc.code}: "
                               f"{exc.read()[:200]!r}") from exc
        except OSError as exc:
            raise KubeUnavailable(f"simulator {self.url} did not answer: {exc}") from exc

    def _check(self, key: PoolKey) -> None:
        if key[0] != self.service:
            raise KubeRejected(f"the live simulator runs service {self.service!r}, not "
                               f"{key[0]!r}")

    def read_statuses(self, keys: Sequence[PoolKey]) -> dict[PoolKey, ScaleStatus | Exception]:
        try:
            pools = self._call("/status")["pools"]
        except (KubeRejected, KubeUnavailable) as exc:
            return {key: exc for key in keys}
        out: dict[PoolKey, ScaleStatus | Exception] = {}
        for key in keys:
            if key[0] != self.service:
                out[key] = KubeRejected(f"the live simulator runs service {self.service!r}")
                continue
            p = pools[key[1].value]
            out[key] = ScaleStatus(int(p["desired"]), int(p["ready"]) + int(p["starting"]),
                                   int(p["ready"]))
        return out

    def read_status(self, key: PoolKey) -> ScaleStatus:
        status = self.read_statuses([key])[key]
        if isinstance(status, Exception):
            raise status
        return status

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        self._check(key)
        self._call("/scale", {"pool": key[1].value, "replicas": replicas})
        self.writes.append((key, replicas))
        log.info("scaled %s/%s to %d: %s", key[0], key[1].value, replicas, "; ".join(reasons))

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        log.info("event %s on %s/%s: %s", reason, key[0], key[1].value, message)

    def prime(self) -> None:
        return

    def label_pod(self, namespace: str, pod: str, label: str, value: str) -> None:
        raise KubeRejected("the live simulator has no pods to relabel")
