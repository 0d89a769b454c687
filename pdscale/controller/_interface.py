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
from enum import StrEnum
from typing import Any, Literal, Protocol

from pdscale.spec import PoolKey
from pdscale.telemetry import Signal

__all__ = [
    "Actuator",
    "Cause",
    "DataState",
    "Detail",
    "Observation",
    "Policy",
    "PoolDecision",
    "PoolForecast",
    "PoolKey",
    "PoolObservation",
    "PoolReplicas",
]



DataState = Literal["ok", "idle", "departing", "degraded", "unavailable"]


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

    @property
    def gpus_held(self) -> int:
        """GPUs the pool holds or is about to: its desired count or what runs (draining
        included), whichever is more."""
        return max(self.desired, self.active + self.draining) * self.gpus_per_replica


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
    old, Prometheus unreadable), in words; None when they can. The policy never scales a
    degraded pool down."""
    data_state: DataState = "ok"
    """The data's state in one word: ``ok``; ``idle`` (every target up and fresh, but no
    request counted yet: the engine exports its request series from the first request);
    ``departing`` (the targets that are down are replicas a scale-down removed); ``degraded``
    (``degraded`` says why); ``unavailable`` (Prometheus could not be read)."""
    note: str | None = None
    """What an ``idle`` or ``departing`` state means for the pool, in words."""


@dataclass(frozen=True)
class Observation:
    now_s: float
    pools: Mapping[PoolKey, PoolObservation]


Detail = Mapping[str, float | str | None]


class Cause(StrEnum):
    """Why a pool's target is what it is, in one word (the ``reason`` label of
    ``pdscale_decisions_total``, the ``cause`` of a decision record)."""

    STEADY = "steady"
    """Nothing to change."""
    FORECAST = "forecast"
    """Sized up for the load (the demand now, its busiest minute or its forecast one lead
    ahead) and any backlog."""
    SCALE_DOWN = "scale_down"
    """The need stayed lower for the stabilisation window."""
    DEGRADED = "degraded"
    """The data cannot be trusted: held, never scaled down."""
    BOUND = "bound"
    """The pool's min or max replicas."""
    PLANNED = "planned"
    """A planned floor (the pool's ``floors``), from one lead before its window."""
    BUDGET = "budget"
    """The GPU budget shared across pools."""
    RATIO = "ratio"
    """A service's prefill:decode ratio bound."""
    REACTION = "reaction"
    """An alert reaction (webhook): a floor or a held scale-down."""


@dataclass(frozen=True)
class PoolForecast:
    """A pool's demand forecast as the policy used it: quantiles per horizon from ``at_s``."""

    at_s: float
    """When it was computed (the forecaster's last observation is the origin)."""
    horizons_s: tuple[float, ...]
    """Seconds ahead, one a resolution step, up to the lead."""
    quantiles: Mapping[float, tuple[float, ...]]
    """Quantile -> demand per horizon (prefill: prompt tokens/s; decode: generated
    tokens/s)."""
    sized_quantile: float
    """The quantile the pool is sized for (the spec's ``scale_up_quantile``)."""
    trained_horizons_s: tuple[float, float]
    """The horizons the model was trained for; beyond them it extrapolates."""

    @property
    def sized_value(self) -> float:
        """The highest demand at the sized quantile over the horizons: what is sized for."""
        return max(self.quantiles[self.sized_quantile])

    def as_dict(self) -> dict[str, Any]:
        """JSON for /v1/forecast and the forecast gauge."""
        return {"at_s": self.at_s, "horizons_s": list(self.horizons_s),
                "quantiles": {f"{q:g}": list(v) for q, v in self.quantiles.items()},
                "trained_horizons_s": list(self.trained_horizons_s)}


@dataclass(frozen=True)
class PoolDecision:
    desired_replicas: int
    reasons: tuple[str, ...] = field(default_factory=tuple)
    """Why, in words (Kubernetes Events, logs)."""
    cause: Cause = Cause.STEADY
    """Why, as one machine-readable word."""
    detail: Detail = field(default_factory=dict)
    """Why, machine-readable: the signal and its value, the forecast and its quantile, capacity
    per replica, lead, the bound or budget that applied."""
    forecast: PoolForecast | None = None
    """The forecast the decision used, if any (/v1/forecast, the forecast gauge)."""
    lead_s: float | None = None
    """How far ahead the pool was sized: its cold-start p90 plus one tick."""
    cold_start_p90_s: float | None = None
    """The pool's learned cold start (the cold-start gauge)."""


class Policy(Protocol):
    name: str

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        """Desired replicas per pool; pools left out keep their current target."""
        ...


class Actuator(Protocol):
    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        ...
