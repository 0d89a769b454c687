"""What every pool's decision reads before it is sized: its demand and latency signals, its
cold starts, its forecast over the lead, and the hold on missing demand.

Demand is prompt tokens/s for prefill (the policy takes the uncached share) and generated
tokens/s for decode; latency is the SLO's own percentile, TTFT p95 for prefill and ITL p95 for
decode. A pool whose demand is missing or stale is held (:func:`degraded_decision`): no data is
never a reason to scale down. The lead is the pool's learned cold-start p90
(:class:`ColdStartTracker`) plus a tick: what a scale-up asked now has to cover.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TypeGuard

import numpy as np

from pdscale.controller._forecast import ForecastStage, NoForecast
from pdscale.controller._interface import (
    Cause,
    PoolDecision,
    PoolForecast,
    PoolKey,
    PoolObservation,
)
from pdscale.spec import Role
from pdscale.telemetry import Signal

__all__ = ["DEMAND_SIGNAL", "LATENCY_SIGNAL", "ColdStartTracker", "degraded_decision",
           "finite", "forecast_for", "prefix_hits", "usable_length"]

DEMAND_SIGNAL = {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S,
                 Role.DECODE: Signal.GENERATION_TOKENS_PER_S}
LATENCY_SIGNAL = {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}


def finite(reading: float | None) -> TypeGuard[float]:
    """A reading that is present and finite (a ratio of empty counters reads NaN)."""
    return reading is not None and math.isfinite(reading)


def usable_length(reading: float | None) -> TypeGuard[float]:
    """A length reading the policy can take: present, positive and finite (an engine with no
    request yet reads NaN, a broken counter ratio inf)."""
    return finite(reading) and reading > 0


@dataclass
class ColdStartTracker:
    """Time from a scale-up to the replicas being ready: ``p90_s``, the p90 of the last 50
    (the value given until three are timed). A rise in the active replicas (ready plus
    starting) is a start, timed until that many are ready."""

    p90_s: float
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    _pending: list[tuple[float, int]] = field(default_factory=list)  # (asked at, ready target)
    _active: int | None = None  # at the last look

    def asked(self, now_s: float, ready_target: int) -> None:
        self._pending.append((now_s, ready_target))

    def observe(self, now_s: float, ready: int, active: int | None = None) -> None:
        timed = [now_s - at for at, target in self._pending if ready >= target]
        self._pending = [(at, target) for at, target in self._pending if ready < target]
        self.samples.extend(timed)
        if timed and len(self.samples) >= 3:
            self.p90_s = float(np.percentile(np.array(self.samples), 90))
        if active is not None and self._active is not None and active > self._active:
            self.asked(now_s, active)
        self._active = active

    def forget_pending(self) -> None:
        """Drop the scale-ups still waiting to be ready: the pool went unobserved, so when
        they became ready is unknown (timed on its return, the gap would count as start-up)."""
        self._pending, self._active = [], None

    def cancel_above(self, target: int) -> None:
        self._pending = [(t, n) for t, n in self._pending if n <= target]


def prefix_hits(pool: PoolObservation, prompt_tokens_per_s: float) -> float | None:
    """Prefill: the share of prompt tokens its prefix cache served, the engine's hit ratio or,
    where only the computed prompt tokens are counted, one minus their share of the prompt
    tokens; None where neither is read (no hits are assumed)."""
    hit = pool.signals.get(Signal.PREFIX_CACHE_HIT_RATIO)
    if finite(hit):
        return min(1.0, max(0.0, hit))
    computed = pool.signals.get(Signal.PROMPT_TOKENS_COMPUTED_PER_S)
    if not finite(computed) or prompt_tokens_per_s <= 0:
        return None
    return min(1.0, max(0.0, 1 - computed / prompt_tokens_per_s))


def forecast_for(forecasts: ForecastStage | None, key: PoolKey, now: float, lead: float,
                 quantile: float) -> tuple[PoolForecast | None, str]:
    """The pool's forecast over ``lead`` and the words a decision says of it (or why there is
    none: no forecast stage, or the stage's reason)."""
    if forecasts is None:
        return None, "forecast: off, sizing on the current demand"
    got = forecasts.forecast(key, now, lead)
    if isinstance(got, NoForecast):
        return None, got.reason
    return got, f"forecast q{quantile:g} over {lead:.0f}s"


def degraded_decision(key: PoolKey, pool: PoolObservation,
                      cold_start_p90_s: float) -> PoolDecision:
    """Hold a pool whose demand is missing or stale: never scale it down on no data."""
    r = pool.replicas
    held = max(r.desired, r.active)
    signal = DEMAND_SIGNAL[key[1]].value
    return PoolDecision(held, (f"degraded: {signal} missing or stale; holding {held} "
                               "replicas, no scale-down",), cause=Cause.DEGRADED,
                        detail={"signal": signal, "held": held},
                        cold_start_p90_s=cold_start_p90_s)
