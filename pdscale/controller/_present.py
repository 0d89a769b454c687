"""Is a pool short of capacity now? The check an alert reaction that adds capacity passes when
the alert arrives and on every tick its floor stands.

An alert judges a window that has passed: a burn-rate alert looks back hours (6 h and 30 min
for the second critical tier) and waits its ``for`` (15 min) before it fires, so it can fire
well after the shortage it measured has gone; an alert also resolves only an evaluation and a
delivery after its condition clears. A floor that lasts as long as the alert adds capacity
nothing needs. So a ``scale_up`` reaction acts only while the shortage it answers
(``ReactionRule.condition``) shows in the pool's own recent signals, read when the alert is
processed (``Reconciler.observe_pool``) and on every tick its floor stands:

* ``latency``: the pool's latency p95 over the last minute (``TTFT_P95_RECENT_S`` for prefill,
  ``ITL_P95_RECENT_S`` for decode) above its SLO;
* ``queue``: more than :data:`QUEUE_PER_READY` requests waiting per ready replica now.

A signal that cannot be read confirms nothing: no latency over the last minute (no request
finished in it) or no queue reading is not a shortage. The reaction then adds nothing and
says why; a pool whose data is missing is held by the loop anyway, never scaled down. A
shortage read on a pool with some scrape targets down still counts: what the remaining
replicas and the frontend measure is real.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdscale.controller._interface import PoolObservation
from pdscale.spec import Role, ShortageCondition, Spec
from pdscale.telemetry import Signal

__all__ = ["QUEUE_PER_READY", "Shortage", "ShortageCheck", "shortage_now"]

QUEUE_PER_READY = 2.0
"""Requests waiting per ready replica above which a queue is a shortage."""

RECENT_LATENCY = {Role.PREFILL: (Signal.TTFT_P95_RECENT_S, "TTFT"),
                  Role.DECODE: (Signal.ITL_P95_RECENT_S, "ITL")}
"""The latency each pool answers for, over the last minute, and its name in reasons."""


@dataclass(frozen=True)
class Shortage:
    """What the pool's recent signals say about a shortage."""

    holds: bool
    """True only when a signal read now shows it; False when they show none or cannot tell."""
    reason: str
    """The readings behind the answer, in words (e.g. "TTFT p95 over the last minute 0.92s
    above the SLO 0.47s")."""


@dataclass(frozen=True)
class ShortageCheck:
    """One reaction's condition on one pool, with the SLO it compares against."""

    condition: ShortageCondition
    role: Role
    slo_s: float

    @classmethod
    def for_pool(cls, spec: Spec, service: str, role: Role,
                 condition: ShortageCondition) -> ShortageCheck:
        slo = spec.service(service).slo
        return cls(condition, role, slo.ttft_p95_s if role is Role.PREFILL else slo.itl_p95_s)

    def __call__(self, pool: PoolObservation | None) -> Shortage:
        return shortage_now(pool, self.condition, role=self.role, slo_s=self.slo_s)


def _latency(pool: PoolObservation, role: Role, slo_s: float) -> tuple[bool | None, str]:
    signal, name = RECENT_LATENCY[role]
    value = pool.signals.get(signal)
    if value is None:
        return None, f"no {name} p95 over the last minute (no request finished in it)"
    if value > slo_s:
        return True, f"{name} p95 over the last minute {value:.3g}s above the SLO {slo_s:g}s"
    return False, f"{name} p95 over the last minute {value:.3g}s within the SLO {slo_s:g}s"


def _queue(pool: PoolObservation) -> tuple[bool | None, str]:
    value = pool.signals.get(Signal.QUEUE_DEPTH)
    if value is None:
        return None, "no queue reading"
    ready = pool.replicas.ready
    limit = QUEUE_PER_READY * max(ready, 1)
    said = f"{value:.0f} waiting on {ready} ready"
    if value > limit:
        return True, f"{said} (more than {QUEUE_PER_READY:g} a replica)"
    return False, f"{said} (at most {QUEUE_PER_READY:g} a replica)"


def shortage_now(pool: PoolObservation | None, condition: ShortageCondition, *, role: Role,
                 slo_s: float) -> Shortage:
    """Whether ``condition`` holds in the pool's signals (None: the pool was not read)."""
    if pool is None:
        return Shortage(False, "the pool has not been read recently")
    parts: list[tuple[bool | None, str]] = []
    if condition in (ShortageCondition.LATENCY, ShortageCondition.LATENCY_OR_QUEUE):
        parts.append(_latency(pool, role, slo_s))
    if condition in (ShortageCondition.QUEUE, ShortageCondition.LATENCY_OR_QUEUE):
        parts.append(_queue(pool))
    holding = [why for ok, why in parts if ok]
    if holding:
        return Shortage(True, "; ".join(holding))
    return Shortage(False, "; ".join(why for _, why in parts))
