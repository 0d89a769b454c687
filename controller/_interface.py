"""What a scaling policy sees and returns, and how its decisions are applied.

The simulator and the in-cluster controller both speak these types: every control tick a
:class:`Policy` gets an :class:`Observation` (per pool: replica counts and the catalog's
signals as Prometheus would show them, with their age; a missing signal is None, never zero)
and returns a :class:`PoolDecision` per pool, which an :class:`Actuator` applies (the
simulator's cluster, the Kubernetes scale subresource, or a recommendation metric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdscale.spec import Role
from telemetry import Signal

__all__ = [
    "Actuator",
    "Detail",
    "Observation",
    "Policy",
    "PoolDecision",
    "PoolKey",
    "PoolObservation",
    "PoolReplicas",
]

PoolKey = tuple[str, Role]
"""(service name, role)."""


@dataclass(frozen=True)
class PoolReplicas:
    ready: int
    starting: int
    draining: int
    desired: int
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int = 1

    @property
    def active(self) -> int:
        """Replicas that count towards capacity now or soon (ready + starting)."""
        return self.ready + self.starting


@dataclass(frozen=True)
class PoolObservation:
    key: PoolKey
    replicas: PoolReplicas
    signals: Mapping[Signal, float | None]
    """The catalog's signals (derived ones included) -> value, None when missing or stale."""
    data_time_s: float
    """When the signals were true: the time of the pool's newest engine sample where the
    source knows it (not the recording rule's evaluation time)."""
    degraded: str | None = None
    """Why the signals cannot be trusted to shrink the pool (scrape targets down, data too
    old), in words; None when they can. The policy never scales a degraded pool down."""


@dataclass(frozen=True)
class Observation:
    now_s: float
    pools: Mapping[PoolKey, PoolObservation]


Detail = Mapping[str, float | str | None]


@dataclass(frozen=True)
class PoolDecision:
    desired_replicas: int
    reasons: tuple[str, ...] = field(default_factory=tuple)
    """Why, in words (Kubernetes Events, logs)."""
    cause: str = "steady"
    """Why, as one machine-readable word: forecast, reactive, scale_down, steady, degraded,
    bound, budget, ratio, reaction (the ``reason`` label of pdscale_decisions_total)."""
    detail: Detail = field(default_factory=dict)
    """Why, machine-readable: the signal and its value, the forecast and its quantile, capacity
    per replica, lead, the bound or budget that applied."""


class Policy(Protocol):
    name: str

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        """Desired replicas per pool; pools left out keep their current target."""
        ...


class Actuator(Protocol):
    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        ...
