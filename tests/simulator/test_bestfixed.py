"""The best fixed allocation in hindsight: an exact search of the feasible staircase."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from pdscale.simulator import ATTAINMENT_TARGET, best_fixed, search_best_fixed


def _exhaustive(feasible, p_max: int, d_max: int) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
    options = [(p, d) for p, d in itertools.product(range(1, p_max + 1), range(1, d_max + 1))
               if feasible(p, d)]
    return min(options, key=lambda a: (a[0] + a[1], a[0])) if options else None


CASES = {
    # Independent pools: each needs its own minimum.
    "corner": lambda p, d: p >= 7 and d >= 3,
    # Decode load spills into prefill (a longer TTFT when decode admits slowly): a staircase
    # whose best point is not the corner of the two minimums.
    "staircase": lambda p, d: p >= 4 and d >= 2 and p + 2 * d >= 14,
    "trade": lambda p, d: p * d >= 24 and p >= 2,
    "nothing": lambda p, d: False,
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_best_fixed_finds_the_smallest_allocation(case: str) -> None:
    feasible = CASES[case]
    calls: list[tuple[int, int]] = []

    def counted(p: int, d: int) -> bool:
        calls.append((p, d))
        return feasible(p, d)

    found = best_fixed(counted, 12, 9)
    assert found == _exhaustive(feasible, 12, 9)
    assert len(set(calls)) < 12 * 9 // 2  # a search, not a scan


def test_best_fixed_respects_lower_bounds_and_agrees_with_the_exhaustive_answer() -> None:
    """With the pools' minimums as lower bounds, the search's answer is the exhaustive one
    over the bounded box, its neighbours below fail, and bounds that cross are refused."""
    feasible = CASES["staircase"]
    found = best_fixed(feasible, 20, 20, p_min=6, d_min=3)
    box = [(p, d) for p, d in itertools.product(range(6, 21), range(3, 21)) if feasible(p, d)]
    assert found == min(box, key=lambda a: (a[0] + a[1], a[0]))
    assert found is not None and found[0] >= 6 and found[1] >= 3
    p, d = found
    assert (p == 6 or not feasible(p - 1, d)) and (d == 3 or not feasible(p, d - 1))
    with pytest.raises(ValueError, match="lower bound above"):
        best_fixed(feasible, 4, 20, p_min=6)


def test_search_targets_what_the_bounds_reach_and_stops_at_a_first_miss() -> None:
    """Where the generous allocation reaches less than the target, the target is what it
    reaches less the margin; a candidate's runs stop at the first that misses."""
    runs: list[tuple[int, int, int]] = []

    def attainments(p: int, d: int) -> Iterator[float]:
        for seed in range(3):
            runs.append((p, d, seed))
            yield min(0.97, 0.5 + 0.05 * p + 0.04 * d - 0.001 * seed)

    found = search_best_fixed(attainments, 12, 9, margin=0.003)
    assert found.reached and found.ceiling == pytest.approx(0.97)
    assert found.target == pytest.approx(0.967)
    assert (found.prefill, found.decode) == _exhaustive(
        lambda p, d: all(a >= found.target for a in attainments(p, d)), 12, 9)
    missed = [(p, d) for p, d, seed in runs if seed == 0 and
              0.5 + 0.05 * p + 0.04 * d < 0.967]
    assert missed and all((p, d, 1) not in runs for p, d in missed)


def test_search_keeps_the_target_where_the_bounds_exceed_it() -> None:
    found = search_best_fixed(lambda p, d: [1.0 if p >= 3 and d >= 2 else 0.5], 8, 8)
    assert found.target == ATTAINMENT_TARGET
    assert (found.prefill, found.decode, found.reached) == (3, 2, True)
