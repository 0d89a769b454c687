"""The best fixed allocation in hindsight: the yardstick an autoscaler has to beat.

An operator who knew the whole trace in advance could hold a fixed number of prefill and
decode replicas for all of it. The best such allocation is the one with the fewest replicas in
all that still reaches the attainment target; an autoscaler earns its keep by reaching as much
on fewer GPU-hours, or more on as many.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

__all__ = ["ATTAINMENT_TARGET", "CEILING_MARGIN", "GENEROUS", "BestFixed", "best_fixed",
           "search_best_fixed"]

ATTAINMENT_TARGET = 0.99
"""The share of requests within the SLO a fixed allocation is asked to reach."""
CEILING_MARGIN = 0.003
"""Where even a generous allocation falls short of the target (requests no allocation serves
within the SLO), the target is what it reaches less this margin."""
GENEROUS = 1.5
"""The generous allocation: the oracle plan's peak need times this, plus one replica."""


def best_fixed(feasible: Callable[[int, int], bool], p_max: int, d_max: int, *,
               p_min: int = 1, d_min: int = 1) -> tuple[int, int] | None:
    """The allocation (prefill, decode) with the fewest replicas in all for which
    ``feasible`` holds, assuming more replicas of either pool never make it fail (ties: fewer
    prefill), at least (``p_min``, ``d_min``). None when even (p_max, d_max) fails.

    Under that monotonicity the feasible set's lower edge is a staircase: the fewest decode
    replicas d(p) falls as prefill grows. The search finds the fewest prefill p0 with all
    decode replicas, then walks p up from p0 while p - p0 can still beat the best total,
    binary-searching d(p) below the last one: O((p range + log d) evaluations), exact."""
    if p_min > p_max or d_min > d_max:
        raise ValueError(f"a lower bound above its upper one: prefill {p_min}-{p_max}, "
                         f"decode {d_min}-{d_max}")
    if not feasible(p_max, d_max):
        return None

    def lowest(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
        while lo < hi:  # the least x in [lo, hi] with ok(x); ok(hi) holds
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    p0 = lowest(p_min, p_max, lambda p: feasible(p, d_max))
    d_floor = lowest(d_min, d_max, lambda d: feasible(p_max, d))
    best = (p0, lowest(d_min, d_max, lambda d: feasible(p0, d)))
    d_prev = best[1]
    p = p0 + 1
    while p <= p_max and p + d_floor < sum(best) and d_prev > d_floor:
        d = lowest(d_floor, d_prev, partial(_at, feasible, p))
        if p + d < sum(best):
            best = (p, d)
        d_prev = d
        p += 1
    return best


def _at(feasible: Callable[[int, int], bool], p: int, d: int) -> bool:
    return feasible(p, d)


@dataclass(frozen=True)
class BestFixed:
    prefill: int
    decode: int
    target: float
    """The attainment every run had to reach."""
    ceiling: float
    """The lowest attainment of the generous allocation's runs."""
    evaluated: int
    """Allocations tried, the bounds' own included."""
    reached: bool = True
    """False when no allocation within the bounds reaches the target: then (prefill, decode)
    are the bounds themselves."""


def search_best_fixed(attainments: Callable[[int, int], Iterable[float]], p_max: int,
                      d_max: int, *, p_min: int = 1, d_min: int = 1,
                      target: float = ATTAINMENT_TARGET,
                      margin: float = CEILING_MARGIN) -> BestFixed:
    """The best fixed allocation within (``p_max``, ``d_max``): ``attainments(p, d)`` gives
    the attainment of each run (one per seed) of ``p`` prefill and ``d`` decode replicas held
    fixed, at least (``p_min``, ``d_min``); a generator lets the search stop at a candidate's
    first miss. The target is
    ``target``, or what the bounds themselves reach less ``margin`` where that is lower."""
    tried: dict[tuple[int, int], bool] = {}
    ceiling = min(attainments(p_max, d_max))
    goal = min(target, ceiling - margin)

    def reaches(p: int, d: int) -> bool:
        if (p, d) not in tried:
            tried[(p, d)] = all(a >= goal for a in attainments(p, d))
        return tried[(p, d)]

    found = best_fixed(reaches, p_max, d_max, p_min=p_min, d_min=d_min)
    if found is None:  # only when the runs are not deterministic: report the bounds
        return BestFixed(p_max, d_max, goal, ceiling, len(tried), reached=False)
    return BestFixed(found[0], found[1], goal, ceiling, len(tried))
