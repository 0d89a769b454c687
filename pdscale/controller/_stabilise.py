"""Stabilisation and bounds: a pool's need and its history -> the replicas to ask for.

Pure functions over an immutable :class:`PoolHistory` (the needs of the last
``stabilisation_s``, the burst hold, when the pool was first seen and last scaled down);
each returns the new history with its answer.

* Scale up at once (the cause is ``reactive`` when the reactive path asked for more than the
  sizing did or a prefill backlog set the sizing's need, else ``tail`` when a tail model set
  it (prefill's arrivals, decode's running sequences), else ``forecast``). A scale-up within
  the stabilisation window after a scale-down is a reversal: the scale-down forgot capacity
  a burst came back for, so the burst hold's half-life doubles (and relaxes back over hours
  without reversals).
* Scale down only once the need has stayed below the current replicas for the whole
  stabilisation window (and the pool has been watched that long), to the highest need seen in
  it, by at most ``max_step_down`` replicas a tick. Every replica kept above the need says
  why: the window (and the time left in it), the highest need within it, or the step.
* Never below the pool's min or above its max (:func:`bound`).

The burst hold (:meth:`PoolHistory.hold`) is a peak envelope: the load a burst needed, kept
whole for a half-life (a third of the burst window) and then halving every half-life. Bursts
that recur refresh it before it decays; one burst is forgotten smoothly, not held at its peak
for a fixed window and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pdscale.controller._interface import Cause, PoolReplicas
from pdscale.controller._sizing import Need

__all__ = ["PoolHistory", "Stabilised", "bound", "stabilise"]


MAX_HOLD_FACTOR = 4.0
"""The hold's half-life grows to at most this many burst windows while scale-downs are
reversed."""
HOLD_RELAX_S = 3600.0
"""Without reversals, the half-life's growth halves every this many seconds."""


@dataclass(frozen=True)
class PoolHistory:
    """What a pool's decisions remember: the needs of the stabilisation window, the burst hold
    (a peak envelope that decays), and the scale-downs that bursts reversed."""

    needs: tuple[tuple[float, int], ...] = ()
    """(time, replicas needed) over the stabilisation window."""
    hold_load: float = 0.0
    """The load a recent burst needed, as of ``hold_at_s`` (decays from there)."""
    hold_at_s: float = 0.0
    first_seen_s: float | None = None
    last_down_s: float | None = None
    """When the pool last scaled down."""
    reversals: int = 0
    """Scale-downs reversed within the stabilisation window, all time."""
    grown_half_life_s: float = 0.0
    """The hold's half-life after its latest growth (0: never grown)."""
    last_reversal_s: float = 0.0

    def half_life_s(self, now_s: float, window_s: float) -> float:
        """The hold's half-life: a third of the burst window, doubled by every reversed
        scale-down (at most :data:`MAX_HOLD_FACTOR` windows), relaxing back without them."""
        base = window_s / 3
        if self.grown_half_life_s <= base:
            return base
        relax = math.pow(0.5, max(0.0, now_s - self.last_reversal_s) / HOLD_RELAX_S)
        return base + (self.grown_half_life_s - base) * relax

    def _held(self, level: float, at_s: float, now_s: float, window_s: float) -> float:
        """An envelope raised to ``level`` at ``at_s``: whole for one half-life, then halving
        every half-life."""
        if window_s <= 0 or level <= 0:
            return 0.0
        half = self.half_life_s(now_s, window_s)
        return level * math.pow(0.5, max(0.0, now_s - at_s - half) / half)

    def hold(self, now_s: float, window_s: float) -> float:
        """The load held for bursts now: the decayed envelope of the loads they needed (0 when
        none, or the window is off)."""
        return self._held(self.hold_load, self.hold_at_s, now_s, window_s)

    def remember_load(self, now_s: float, load: float, window_s: float) -> PoolHistory:
        """Raise the hold to ``load`` where it is above the decayed envelope."""
        if window_s <= 0 or load <= self.hold(now_s, window_s):
            return self
        return replace(self, hold_load=load, hold_at_s=now_s)

    def seeded(self, points: Sequence[tuple[float, float]], now_s: float,
               window_s: float) -> PoolHistory:
        """The hold as if the pool had been watched over ``points`` (its demand history, at a
        start or restart): the highest decayed load among them."""
        out = self
        for t, v in sorted(points):
            if t <= now_s and math.isfinite(v):
                out = out.remember_load(t, v, window_s)
        return out

    def reversed_at(self, now_s: float, window_s: float) -> PoolHistory:
        """A scale-up reversed a recent scale-down: the hold's half-life doubles."""
        grown = min(2 * self.half_life_s(now_s, window_s), MAX_HOLD_FACTOR * window_s)
        return replace(self, reversals=self.reversals + 1, grown_half_life_s=grown,
                       last_reversal_s=now_s, last_down_s=None)


@dataclass(frozen=True)
class Stabilised:
    desired: int
    cause: Cause
    reasons: tuple[str, ...]
    history: PoolHistory
    asked: int | None = None
    """Scaling up to this many (the cold-start tracker times it)."""
    cancelled_above: int | None = None
    """Scaling down to this many (starts above it are no longer awaited)."""
    detail: Mapping[str, float | str | None] = field(default_factory=dict)
    """What holds the replicas above the need (``above_need``: stabilisation or
    max_step_down), by how many, and when a scale-down can come (``scale_down_in_s``)."""


def stabilise(need: Need, history: PoolHistory, *, now_s: float, current: int,
              max_replicas: int, stabilisation_s: float, max_step_down: int,
              burst_window_s: float = 0.0) -> Stabilised:
    """Scale up at once, down after the window and in steps (see the module docstring)."""
    target = need.replicas
    first = history.first_seen_s if history.first_seen_s is not None else now_s
    needs = tuple(e for e in (*history.needs, (now_s, target))
                  if e[0] >= now_s - stabilisation_s)
    after = replace(history, needs=needs, first_seen_s=first)
    if target > current:
        cause = Cause.REACTIVE if need.reactive > need.need or need.burst else \
            Cause.TAIL if need.tail else Cause.FORECAST
        reasons: tuple[str, ...] = ()
        down = history.last_down_s
        if down is not None and now_s - down <= stabilisation_s and burst_window_s > 0:
            after = after.reversed_at(now_s, burst_window_s)
            reasons = (f"reverses the scale-down of {now_s - down:.0f}s ago: the burst hold's "
                       f"half-life grows to {after.half_life_s(now_s, burst_window_s):.0f}s",)
        return Stabilised(target, cause, reasons, after, asked=min(target, max_replicas))
    held = max(n for _, n in needs)
    window_full = now_s - first >= stabilisation_s
    desired = max(target, held, current - max_step_down) \
        if held < current and window_full else current
    above = _above_need(target, desired, current, needs, first_s=first, now_s=now_s,
                        stabilisation_s=stabilisation_s, max_step_down=max_step_down)
    if desired < current:
        return Stabilised(desired, Cause.SCALE_DOWN,
                          (f"scale down after {stabilisation_s:.0f}s below {current}, by at "
                           f"most {max_step_down} a tick", *above[0]),
                          replace(after, last_down_s=now_s), cancelled_above=desired,
                          detail=above[1])
    return Stabilised(desired, Cause.STEADY, above[0], after, detail=above[1])


def _above_need(target: int, desired: int, current: int, needs: Sequence[tuple[float, int]], *,
                first_s: float, now_s: float, stabilisation_s: float, max_step_down: int
                ) -> tuple[tuple[str, ...], dict[str, float | str | None]]:
    """Why ``desired`` is above the need ``target`` (a reason and its detail: what holds the
    replicas above it, and when a scale-down can come), or nothing when it is not."""
    if desired <= target:
        return (), {}
    extra = desired - target
    if desired == current:
        # No scale-down yet: the window has not passed since a need this high, or since the
        # pool was first seen.
        last_high = max((t for t, n in needs if n >= current), default=first_s)
        since = max(last_high, first_s)
        left = max(0.0, since + stabilisation_s - now_s)
        if last_high > first_s:
            why = (f"{current} were needed {now_s - last_high:.0f}s ago, within the "
                   f"{stabilisation_s:.0f}s stabilisation window")
        else:
            why = (f"the pool has been watched {now_s - first_s:.0f}s of the "
                   f"{stabilisation_s:.0f}s stabilisation window")
        return ((f"stabilisation: {extra} above the need {target}; {why}: scale-down in "
                 f"{left:.0f}s if the need stays below {current}",),
                {"above_need": "stabilisation", "above_need_replicas": float(extra),
                 "scale_down_in_s": left})
    if desired == current - max_step_down and desired > max(n for _, n in needs):
        return ((f"max step: {extra} above the need {target}; down by at most "
                 f"{max_step_down} a tick",),
                {"above_need": "max_step_down", "above_need_replicas": float(extra)})
    return ((f"stabilisation: {extra} above the need {target}; {desired} were needed within "
             f"the last {stabilisation_s:.0f}s",),
            {"above_need": "stabilisation", "above_need_replicas": float(extra)})


def bound(desired: int, replicas: PoolReplicas) -> tuple[int, str | None]:
    """``desired`` within the pool's min and max; which bound applied ("min", "max") or
    None."""
    bounded = max(replicas.min_replicas, min(replicas.max_replicas, desired))
    if bounded == desired:
        return bounded, None
    return bounded, "min" if bounded > desired else "max"
