"""Stabilisation and bounds: a pool's need and its history -> the replicas to ask for.

Pure functions over an immutable :class:`PoolHistory` (the needs of the last
``stabilisation_s``, the loads of the last ``burst_window_s``, when the pool was first seen);
each returns the new history with its answer.

* Scale up at once (the cause is ``reactive`` when the reactive path asked for more than the
  sizing did, else ``forecast``).
* Scale down only once the need has stayed below the current replicas for the whole
  stabilisation window (and the pool has been watched that long), to the highest need seen in
  it, by at most ``max_step_down`` replicas a tick.
* Never below the pool's min or above its max (:func:`bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller._interface import Cause, PoolReplicas
from controller._sizing import Need

__all__ = ["PoolHistory", "Stabilised", "bound", "stabilise"]


@dataclass(frozen=True)
class PoolHistory:
    needs: tuple[tuple[float, int], ...] = ()
    """(time, replicas needed) over the stabilisation window."""
    loads: tuple[tuple[float, float], ...] = ()
    """(time, load sized for) over the burst window: the recent-burst floor."""
    first_seen_s: float | None = None

    def recent_peak(self, now_s: float, window_s: float) -> float:
        """The highest load of the last ``window_s`` (0 when none, or the window is off)."""
        if window_s <= 0:
            return 0.0
        return max((v for t, v in self.loads if t >= now_s - window_s), default=0.0)

    def remember_load(self, now_s: float, load: float, window_s: float) -> PoolHistory:
        if window_s <= 0:
            return self
        kept = tuple(e for e in self.loads if e[0] >= now_s - window_s)
        return PoolHistory(self.needs, (*kept, (now_s, load)), self.first_seen_s)


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


def stabilise(need: Need, history: PoolHistory, *, now_s: float, current: int,
              max_replicas: int, stabilisation_s: float, max_step_down: int) -> Stabilised:
    """Scale up at once, down after the window and in steps (see the module docstring)."""
    target = need.replicas
    first = history.first_seen_s if history.first_seen_s is not None else now_s
    needs = tuple(e for e in (*history.needs, (now_s, target))
                  if e[0] >= now_s - stabilisation_s)
    after = PoolHistory(needs, history.loads, first)
    if target > current:
        cause = Cause.REACTIVE if need.reactive > need.need else Cause.FORECAST
        return Stabilised(target, cause, (), after, asked=min(target, max_replicas))
    held = max(n for _, n in needs)
    window_full = now_s - first >= stabilisation_s
    desired = max(target, held, current - max_step_down) \
        if held < current and window_full else current
    if desired < current:
        return Stabilised(desired, Cause.SCALE_DOWN,
                          (f"scale down after {stabilisation_s:.0f}s below {current}, by at "
                           f"most {max_step_down}",), after, cancelled_above=desired)
    return Stabilised(desired, Cause.STEADY, (), after)


def bound(desired: int, replicas: PoolReplicas) -> tuple[int, str | None]:
    """``desired`` within the pool's min and max; which bound applied ("min", "max") or
    None."""
    bounded = max(replicas.min_replicas, min(replicas.max_replicas, desired))
    if bounded == desired:
        return bounded, None
    return bounded, "min" if bounded > desired else "max"
