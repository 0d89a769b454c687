"""An in-memory cluster for reconciler tests: it is both the observation source and the
actuator, replicas become ready after a cold start on the test's clock, and any adapter can be
told to fail."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdscale.controller import Observation, PoolKey, PoolObservation, PoolReplicas
from pdscale.controller._kube import KubeRejected, KubeUnavailable
from pdscale.controller._reconciler import AdapterError, SourceResult
from pdscale.spec import Role, Spec


class ManualClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        self.t += seconds
        return stop.is_set()


@dataclass
class MemPool:
    desired: int
    ready: int
    min_replicas: int
    max_replicas: int
    gpus: int = 1
    starting_since: list[float] = field(default_factory=list)


class MemoryCluster:
    def __init__(self, spec: Spec, clock: ManualClock, cold_start_s: float = 60.0) -> None:
        self.clock = clock
        self.cold_start_s = cold_start_s
        self.pools: dict[PoolKey, MemPool] = {}
        for svc in spec.services:
            for role, p in svc.pools.items():
                self.pools[(svc.name, role)] = MemPool(p.min_replicas, p.min_replicas,
                                                       p.min_replicas, p.max_replicas,
                                                       p.gpus_per_replica)
        self.signals: dict[PoolKey, dict[str, float | None]] = {k: {} for k in self.pools}
        self.prometheus_down = False
        self.reject: set[PoolKey] = set()
        self.unavailable: set[PoolKey] = set()
        self.writes: list[tuple[PoolKey, int, tuple[str, ...]]] = []

    def set_demand(self, key: PoolKey, value: float, **extra: float | None) -> None:
        name = "prompt_tokens_per_s" if key[1] is Role.PREFILL else "generation_tokens_per_s"
        self.signals[key] = {name: value, **extra}

    def _advance(self) -> None:
        now = self.clock.now()
        for p in self.pools.values():
            done = [t for t in p.starting_since if now - t >= self.cold_start_s]
            p.starting_since = [t for t in p.starting_since if now - t < self.cold_start_s]
            p.ready = min(p.desired, p.ready + len(done))

    def observe(self, now_s: float) -> SourceResult:
        self._advance()
        errors = []
        if self.prometheus_down:
            errors.append(AdapterError("prometheus", "unavailable", "connection refused",
                                       None, now_s))
        pools = {}
        for key, p in self.pools.items():
            replicas = PoolReplicas(ready=p.ready, starting=len(p.starting_since), draining=0,
                                    desired=p.desired, min_replicas=p.min_replicas,
                                    max_replicas=p.max_replicas, gpus_per_replica=p.gpus)
            signals = {} if self.prometheus_down else dict(self.signals[key])
            pools[key] = PoolObservation(key, replicas, signals, now_s - 30)
        return SourceResult(Observation(now_s, pools), errors, {})

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        if key in self.reject:
            raise KubeRejected(f"RBAC forbids update on {key[0]}")
        if key in self.unavailable:
            raise KubeUnavailable("API server answered 503", 2.0)
        p = self.pools[key]
        if replicas > p.desired:
            p.starting_since += [self.clock.now()] * (replicas - p.desired)
        else:
            p.ready = min(p.ready, replicas)
            p.starting_since = p.starting_since[:max(0, replicas - p.ready)]
        p.desired = replicas
        self.writes.append((key, replicas, tuple(reasons)))
