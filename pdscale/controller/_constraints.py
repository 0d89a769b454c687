"""Constraints across pools, applied after each pool's own decision: planned floors per pool,
P:D ratio bounds per service, then the GPU budget shared by every pool.

Both are pure functions of the decisions and the observation, so the simulator and the
in-cluster controller apply them the same way (:class:`ConstrainedPolicy`).

* **Planned floors** (``pools.<role>.floors``) raise a pool to a floor an operator planned
  for a known peak, from one lead before its window opens until the window ends.
* **Ratio bounds** raise the short pool (prefill when prefill:decode is below ``min``, decode
  when it is above ``max``), never cut one: a ratio bound must not cost SLO. A raise stops at
  the pool's ``max_replicas``; the reason says when the bound could not be met.
* **GPU budget**: when the pools want more GPUs than the budget, every pool first gets its
  minimum, then replicas are granted one at a time to the pool with the highest claim:
  ``priority x (1 + SLO deficit) x share of its request still unmet``, where the SLO deficit is
  how far its observed latency p95 is over the SLO (0 when within). A pool never gets more
  than it asked for, so the sum always fits the budget (the spec checks that the minimums do).
  A pool whose replicas could not be read this tick (its scale target's API call failed) still
  holds GPUs: they are counted as last seen, or at its max_replicas if never seen
  (:func:`unread_pools_gpus`), and a degraded pool keeps the replicas it has. Where the
  budget's grants leave a service outside its ratio bounds, the pool over the bound gives back
  what it may not keep and the other takes what that frees (:func:`_keep_ratios`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pdscale.controller._interface import (
    Cause,
    Observation,
    Policy,
    PoolDecision,
    PoolKey,
    PoolObservation,
)
from pdscale.spec import Cron, PlannedFloor, Role, Spec
from pdscale.telemetry import Signal

__all__ = ["ConstrainedPolicy", "Constraints", "apply_constraints", "hold_degraded"]

_LATENCY = {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}


@dataclass(frozen=True)
class Constraints:
    gpu_budget: int | None
    priority: Mapping[str, float]
    """Service -> weight in the budget."""
    slo_s: Mapping[PoolKey, float]
    ratio: Mapping[str, tuple[float | None, float | None]]
    """Service -> (min, max) prefill:decode replicas."""
    max_gpus: Mapping[PoolKey, int] = field(default_factory=dict)
    """Every pool the budget covers -> the GPUs it holds at its max_replicas (what a pool
    never read is assumed to hold)."""
    floors: Mapping[PoolKey, tuple[PlannedFloor, ...]] = field(default_factory=dict)
    """Planned floors of the pools that have any."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Constraints:
        return cls(
            gpu_budget=spec.gpu_budget,
            priority={s.name: s.priority for s in spec.services},
            slo_s={**{(s.name, Role.PREFILL): s.slo.ttft_p95_s for s in spec.services},
                   **{(s.name, Role.DECODE): s.slo.itl_p95_s for s in spec.services}},
            ratio={s.name: (s.pd_ratio.min, s.pd_ratio.max) for s in spec.services
                   if s.pd_ratio is not None},
            max_gpus={(s.name, role): p.max_replicas * p.gpus_per_replica
                      for s in spec.services for role, p in s.pools.items()},
            floors={(s.name, role): tuple(p.floors) for s in spec.services
                    for role, p in s.pools.items() if p.floors})


def _with(decision: PoolDecision, replicas: int, cause: Cause, reason: str,
          **detail: float | str | None) -> PoolDecision:
    return replace(decision, desired_replicas=replicas, cause=cause,
                   reasons=(*decision.reasons, reason), detail={**decision.detail, **detail})


def _apply_floors(decisions: dict[PoolKey, PoolDecision], observation: Observation,
                  constraints: Constraints) -> None:
    """Raise a pool to its planned floor from one lead before a window opens until it ends
    (the budget and the pool's max still bound it)."""
    for key, floors in constraints.floors.items():
        decision = decisions.get(key)
        if decision is None or decision.cause is Cause.DEGRADED:
            continue
        ahead = decision.lead_s or decision.cold_start_p90_s or 0.0
        active = [f for f in floors if Cron.parse(f.cron).active(
            observation.now_s, float(f.duration), ahead, f.timezone)]
        if not active:
            continue
        floor = max(active, key=lambda f: f.min_replicas)
        if floor.min_replicas > decision.desired_replicas:
            decisions[key] = _with(
                decision, floor.min_replicas, Cause.PLANNED,
                f"planned floor {floor.min_replicas} (cron '{floor.cron}' {floor.timezone} for "
                f"{float(floor.duration):.0f} s, asked {ahead:.0f} s ahead of its window)",
                planned_floor=floor.min_replicas)


def _apply_ratio(decisions: dict[PoolKey, PoolDecision], observation: Observation,
                 constraints: Constraints) -> None:
    for service, (lo, hi) in constraints.ratio.items():
        kp, kd = (service, Role.PREFILL), (service, Role.DECODE)
        if kp not in decisions or kd not in decisions:
            continue
        top_p = observation.pools[kp].replicas.max_replicas
        top_d = observation.pools[kd].replicas.max_replicas
        # Raising one pool can push the ratio past the other bound: repeat until it holds or
        # a pool is at its max (each step only raises, so this ends).
        for _ in range(top_p + top_d + 2):
            p, d = decisions[kp].desired_replicas, decisions[kd].desired_replicas
            if lo is not None and p < lo * d - 1e-9 and p < top_p:
                want = math.ceil(lo * d - 1e-9)
                got = min(want, top_p)
                note = "" if got == want else f" (capped at max_replicas {top_p}: bound not met)"
                decisions[kp] = _with(decisions[kp], got, Cause.RATIO,
                                      f"ratio: prefill:decode {p}:{d} below {lo:g} -> prefill "
                                      f"{got}{note}", ratio_bound="min")
            elif hi is not None and p > hi * d + 1e-9 and d < top_d:
                want = math.ceil(p / hi - 1e-9)
                got = min(want, top_d)
                note = "" if got == want else f" (capped at max_replicas {top_d}: bound not met)"
                decisions[kd] = _with(decisions[kd], got, Cause.RATIO,
                                      f"ratio: prefill:decode {p}:{d} above {hi:g} -> decode "
                                      f"{got}{note}", ratio_bound="max")
            else:
                break


def _deficit(key: PoolKey, observation: Observation, constraints: Constraints) -> float:
    pool = observation.pools.get(key)
    slo = constraints.slo_s.get(key)
    if pool is None or not slo:
        return 0.0
    latency = pool.signals.get(_LATENCY[key[1]])
    if latency is None or not math.isfinite(latency):
        return 0.0
    return max(0.0, latency / slo - 1.0)


def _held(pool: PoolObservation) -> int:
    """The replicas the budget must leave a pool: its minimum, or, while its data is
    degraded, what it has (``hold_degraded``)."""
    r = pool.replicas
    return max(r.min_replicas, r.desired, r.active) if pool.degraded is not None \
        else r.min_replicas


def _apply_budget(decisions: dict[PoolKey, PoolDecision], observation: Observation,
                  constraints: Constraints, reserved_gpus: int = 0) -> None:
    budget = constraints.gpu_budget
    if budget is None or not decisions:
        return
    gpus = {k: observation.pools[k].replicas.gpus_per_replica for k in decisions}
    asked = {k: d.desired_replicas for k, d in decisions.items()}
    # Pools without a decision this tick (their replicas unread) keep what they hold.
    available = budget - reserved_gpus
    if sum(asked[k] * gpus[k] for k in decisions) <= available:
        return
    # Every pool first gets its minimum; a degraded pool keeps the replicas it has (its
    # signals cannot say it needs fewer, and it is never scaled down), growing only within
    # the budget like the others.
    floor = {k: min(asked[k], _held(observation.pools[k])) for k in decisions}
    granted = dict(floor)
    left = available - sum(granted[k] * gpus[k] for k in decisions)
    weight = {k: constraints.priority.get(k[0], 1.0) *
              (1.0 + _deficit(k, observation, constraints)) for k in decisions}

    def claim(k: PoolKey) -> float:
        return weight[k] * (asked[k] - granted[k]) / max(asked[k], 1)

    # Max-heap on claim; ties broken by key so the allocation is deterministic.
    heap = [(-claim(k), str(k), k) for k in sorted(decisions, key=str) if asked[k] > granted[k]]
    heapq.heapify(heap)
    while heap:
        _, _, k = heapq.heappop(heap)
        if gpus[k] > left:
            continue  # does not fit; a smaller pool may still
        granted[k] += 1
        left -= gpus[k]
        if granted[k] < asked[k]:
            heapq.heappush(heap, (-claim(k), str(k), k))
    left = _keep_ratios(granted, asked, floor, gpus, left, constraints)
    for k, d in decisions.items():
        if granted[k] < asked[k]:
            decisions[k] = _with(
                d, granted[k], Cause.BUDGET,
                f"budget: {budget} GPUs shared"
                + (f" ({reserved_gpus} held by pools not read this tick)" if reserved_gpus
                   else "") + f"; granted {granted[k]} of {asked[k]} replicas "
                f"(priority {constraints.priority.get(k[0], 1.0):g}, SLO deficit "
                f"{_deficit(k, observation, constraints):.2f})",
                budget_gpus=budget, budget_asked=asked[k])


def _keep_ratios(granted: dict[PoolKey, int], asked: Mapping[PoolKey, int],
                 floor: Mapping[PoolKey, int], gpus: Mapping[PoolKey, int], left: int,
                 constraints: Constraints) -> int:
    """The budget grants replicas pool by pool; where that left a service's prefill:decode
    outside its bounds (the ratio step ran before), the pool over the bound gives back what
    the bound does not allow, and the other takes what it frees while the ratio and the
    budget hold (4:2 with a max of 1.5 becomes 3:3, not a lasting 4:2). Returns the GPUs
    left."""
    for service, (lo, hi) in constraints.ratio.items():
        kp, kd = (service, Role.PREFILL), (service, Role.DECODE)
        if kp not in granted or kd not in granted:
            continue
        p, d = granted[kp], granted[kd]
        if hi is not None and p > hi * d + 1e-9:
            new = max(floor[kp], math.floor(hi * d + 1e-9))
            left += (p - new) * gpus[kp]
            granted[kp] = p = new
        if lo is not None and p < lo * d - 1e-9:
            new = max(floor[kd], math.floor(p / lo + 1e-9))
            left += (d - new) * gpus[kd]
            granted[kd] = d = new
        # Grow the pool the budget cut, one replica at a time, while the bounds still hold.
        for k in (kd, kp):
            while granted[k] < asked[k] and gpus[k] <= left:
                p2 = granted[kp] + (k == kp)
                d2 = granted[kd] + (k == kd)
                if (hi is not None and p2 > hi * d2 + 1e-9) or \
                        (lo is not None and p2 < lo * d2 - 1e-9):
                    break
                granted[k] += 1
                left -= gpus[k]
    return left


def apply_constraints(decisions: Mapping[PoolKey, PoolDecision], observation: Observation,
                      constraints: Constraints, reserved_gpus: int = 0
                      ) -> dict[PoolKey, PoolDecision]:
    """The decisions within the ratio bounds and the GPU budget; ``reserved_gpus``: GPUs held
    by pools the budget covers that have no decision this tick (see
    :func:`unread_pools_gpus`)."""
    out = dict(decisions)
    _apply_floors(out, observation, constraints)
    _apply_ratio(out, observation, constraints)
    _apply_budget(out, observation, constraints, reserved_gpus)
    return out


def unread_pools_gpus(decisions: Mapping[PoolKey, PoolDecision], observation: Observation,
                      constraints: Constraints, last_gpus: Mapping[PoolKey, int]) -> int:
    """GPUs held by the budget's pools that have no decision this tick: as observed, else as
    last seen (``last_gpus``), else at their max_replicas (never read: assume the most)."""
    total = 0
    for key, most in constraints.max_gpus.items():
        if key in decisions:
            continue
        pool = observation.pools.get(key)
        total += pool.replicas.gpus_held if pool is not None else last_gpus.get(key, most)
    return total


class ConstrainedPolicy:
    """A policy whose decisions then go through the cross-pool constraints."""

    def __init__(self, inner: Policy, constraints: Constraints) -> None:
        self.inner = inner
        self.constraints = constraints
        self.name = inner.name

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        return apply_constraints(self.inner.decide(observation), observation, self.constraints)


def hold_degraded(decisions: dict[PoolKey, PoolDecision], observation: Observation) -> None:
    """A pool whose data is degraded (targets down, samples old) is never scaled down,
    whatever the policy read: its signals may be low because part of the pool went unseen."""
    for key, d in list(decisions.items()):
        pool = observation.pools.get(key)
        if pool is None or pool.degraded is None:
            continue
        held = max(pool.replicas.desired, pool.replicas.active)
        if d.desired_replicas < held:
            decisions[key] = replace(
                d, desired_replicas=held, cause=Cause.DEGRADED,
                reasons=(*d.reasons, f"degraded: {pool.degraded}; holding {held} replicas, "
                                     "no scale-down"),
                detail={**d.detail, "degraded": pool.degraded, "held": held})
        elif pool.degraded not in " ".join(d.reasons):
            decisions[key] = replace(d, reasons=(*d.reasons, f"degraded: {pool.degraded}"),
                                     detail={**d.detail, "degraded": pool.degraded})
