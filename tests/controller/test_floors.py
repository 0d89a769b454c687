"""Planned floors: a pool raised for a known peak from one lead before its window, through
the same constraints the controller and the simulator apply, and the spec's checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pdscale.controller import Cause, Observation, PoolDecision, PoolObservation, PoolReplicas
from pdscale.controller._constraints import Constraints, apply_constraints
from pdscale.spec import PlannedFloor, Role, SpecError, parse_spec

KEY = ("svc", Role.PREFILL)
NINE = datetime(2026, 12, 7, 9, 0, tzinfo=UTC).timestamp()  # a Monday
FLOOR = PlannedFloor(cron="0 9 * * 1-5", duration=7200, min_replicas=12)


def _decide(now: float, asked: int = 3, *, budget: int | None = None) -> PoolDecision:
    pool = PoolObservation(KEY, PoolReplicas(3, 0, 0, 3, 1, 16), {}, now)
    constraints = Constraints(budget, {}, {}, {}, max_gpus={KEY: 16}, floors={KEY: (FLOOR,)})
    decision = PoolDecision(asked, ("sized",), lead_s=90.0)
    return apply_constraints({KEY: decision}, Observation(now, {KEY: pool}), constraints)[KEY]


def test_the_floor_is_asked_one_lead_early_and_held_through_the_window() -> None:
    assert _decide(NINE - 120).desired_replicas == 3  # more than a lead before
    early = _decide(NINE - 60)
    assert early.desired_replicas == 12 and early.cause is Cause.PLANNED
    assert "planned floor 12 (cron '0 9 * * 1-5' UTC for 7200 s, asked 90 s ahead" in \
        early.reasons[-1]
    assert _decide(NINE + 7199).desired_replicas == 12
    assert _decide(NINE + 7200).desired_replicas == 3  # the window has ended
    assert _decide(NINE + 86400 * 5 + 60).desired_replicas == 3  # Saturday


def test_a_floor_never_lowers_a_pool_and_the_budget_still_bounds_it() -> None:
    above = _decide(NINE + 60, asked=14)
    assert above.desired_replicas == 14 and above.cause is not Cause.PLANNED
    assert _decide(NINE + 60, budget=8).desired_replicas <= 8


SPEC = """
version: 1
services:
  - name: svc
    namespace: ns
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill:
        target: {name: prefill}
        max_replicas: 8
        floors: [FLOOR]
      decode: {target: {name: decode}, max_replicas: 8}
"""


@pytest.mark.parametrize(("floor", "says"), [
    ("{cron: '0 9 * *', duration: 2h, min_replicas: 4}", "expected five fields"),
    ("{cron: '0 25 * * *', duration: 2h, min_replicas: 4}", "hour field '25'"),
    ("{cron: '0 9 * * *', duration: 2h, min_replicas: 9}", "over max_replicas 8"),
    ("{cron: '0 9 * * *', duration: 2h, min_replicas: 4, timezone: Mars/Base}",
     "not an IANA zone"),
])
def test_a_bad_floor_is_refused_with_what_to_fix(floor: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        parse_spec(SPEC.replace("FLOOR", floor))
    parse_spec(SPEC.replace("FLOOR", "{cron: '0 9 * * 1-5', duration: 2h, min_replicas: 6, "
                                     "timezone: Europe/Paris}"))
