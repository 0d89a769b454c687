"""The fluid mode against the event mode on the same inputs.

Tolerances reached (also stated in docs/simulator.md): with the same replica schedule (static,
or the oracle's open-loop plan), SLO attainment within 2 points, TTFT p95 within 25 %, ITL p95
within 15 %, GPU-hours within 3 %. Closed-loop policies (reactive, dynamo) amplify small differences
through their own feedback and are not held to these tolerances.
"""

from __future__ import annotations

import pytest

from pdscale.simulator import (
    OraclePolicy,
    PoolSetup,
    SimSetup,
    StaticPolicy,
    demand_plan,
    fluid_load_from_trace,
    load_profile,
    run_event,
    run_fluid,
    size_for_peak,
    synthetic_trace,
)
from pdscale.spec import Role

H100 = load_profile("h100-80gb-llama-3.1-8b")


@pytest.mark.parametrize("policy", ["static", "oracle"])
def test_fluid_agrees_with_event(policy: str) -> None:
    trace = synthetic_trace(duration_s=3600, mean_rps=20, seed=1)
    plan = demand_plan(trace, H100, H100, 1.0, 0.05)
    initial = size_for_peak(plan) if policy == "static" else {
        Role.PREFILL: int(plan.prefill[:120].max()), Role.DECODE: int(plan.decode[:120].max())}
    setup = SimSetup("svc", PoolSetup(Role.PREFILL, H100, initial[Role.PREFILL], 1, 64),
                     PoolSetup(Role.DECODE, H100, initial[Role.DECODE], 1, 64), 1.0, 0.05)

    def make() -> StaticPolicy | OraclePolicy:
        if policy == "static":
            return StaticPolicy()
        return OraclePolicy(plan, service="svc", cold_start_s={Role.PREFILL: 60.0,
                                                                Role.DECODE: 60.0})

    event = run_event(setup, trace, make()).summary
    fluid = run_fluid(setup, fluid_load_from_trace(trace), make()).summary
    assert fluid["requests"] == event["requests"]
    assert fluid["slo_attainment"] == pytest.approx(event["slo_attainment"], abs=0.02)
    assert fluid["ttft_p95_s"] == pytest.approx(event["ttft_p95_s"], rel=0.25)
    assert fluid["itl_p95_s"] == pytest.approx(event["itl_p95_s"], rel=0.15)
    assert fluid["gpu_hours"] == pytest.approx(event["gpu_hours"], rel=0.03)


def test_fluid_sees_overload() -> None:
    # At the daily peak (1.6 x 40 req/s of ~1,900-token prompts): far beyond one replica.
    trace = synthetic_trace(duration_s=1800, mean_rps=40, phase_s=43200, seed=2)
    setup = SimSetup("svc", PoolSetup(Role.PREFILL, H100, 1, 1, 1),
                     PoolSetup(Role.DECODE, H100, 1, 1, 1), 0.5, 0.05)
    fluid = run_fluid(setup, fluid_load_from_trace(trace), StaticPolicy()).summary
    event = run_event(setup, trace, StaticPolicy()).summary
    assert fluid["slo_attainment"] < 0.5 and event["slo_attainment"] < 0.5
