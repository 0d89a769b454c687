"""The performance model: one place for headroom, the decode operating point and uncached
prefill demand, which the policy, the oracle, the Dynamo baseline and fluid mode share."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdscale.controller import (
    HEADROOM,
    builtin_profiles,
    decode_batch_limit,
    decode_operating_point,
    prefill_capacity,
    uncached_prefill_demand,
)
from tests.conftest import ROOT

PROFILES = sorted(builtin_profiles().values(), key=lambda p: p.name)


def _brute_force(profile: object, budget_s: float, ctx: float) -> int:
    """The largest batch, counted up one at a time (what the closed form must equal)."""
    best = 1
    for b in range(1, profile.max_batch + 1):  # type: ignore[attr-defined]
        if profile.decode_step_ms(b, b * ctx) > budget_s * 1000 or \
                b * ctx > profile.kv_capacity_tokens * 0.95:  # type: ignore[attr-defined]
            break
        best = b
    return best


@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
@given(budget_s=st.floats(0.001, 2.0), ctx=st.floats(1.0, 500_000.0))
def test_the_decode_operating_point_is_the_largest_batch_within_budget(
        profile: object, budget_s: float, ctx: float) -> None:
    point = decode_operating_point(profile, budget_s, ctx)  # type: ignore[arg-type]
    assert point.batch == _brute_force(profile, budget_s, ctx)
    assert point.step_s == pytest.approx(
        profile.decode_step_ms(point.batch, point.batch * ctx) / 1000)  # type: ignore[attr-defined]
    assert point.tokens_per_s == pytest.approx(point.batch / point.step_s)
    assert point.batch <= decode_batch_limit(profile, ctx)  # type: ignore[arg-type]


def test_uncached_demand_clamps_the_hit_ratio() -> None:
    assert uncached_prefill_demand(1000.0, 0.25) == 750.0
    assert uncached_prefill_demand(1000.0, None) == 1000.0
    assert uncached_prefill_demand(1000.0, math.nan) == 1000.0
    assert uncached_prefill_demand(1000.0, -0.5) == 1000.0
    assert uncached_prefill_demand(1000.0, 1.0) == pytest.approx(50.0)  # never sized to zero


def test_prefill_capacity_plans_for_the_headroom() -> None:
    profile = PROFILES[0]
    saturated = profile.prefill_tokens_per_s(1500.0, 1500.0 ** 2 * 3.25)
    assert prefill_capacity(profile, 1500.0, 1500.0 ** 2 * 3.25) == \
        pytest.approx(saturated * HEADROOM)


COPIES = {
    "a headroom constant": r"(HEADROOM|TARGET_UTILISATION)\s*=|\)\s*\*\s*0\.8\b",
    "the KV fill": r"kv_capacity_tokens\s*\*\s*0\.95",
    "the cache-hit clamp": r"1\s*-\s*min\(max\(",
    "a profile's throughput or step time used for sizing":
        r"\.(prefill_tokens_per_s|decode_step_ms)\(",
}
PHYSICS = {"pdscale/controller/_perf.py", "pdscale/controller/_profiles.py",
           "pdscale/controller/_queueing.py", "pdscale/controller/_model.py",
           "pdscale/simulator/_event.py", "pdscale/simulator/_decode.py",
           "pdscale/simulator/_fluid.py"}
"""The performance model itself, the queueing model's sizing from it, and the simulators, whose
physics are the profile's."""


def test_the_capacity_arithmetic_exists_once() -> None:
    """Outside the performance model nothing writes the headroom, the KV fill or the hit
    clamp again, or sizes replicas from a profile's raw throughput or step time."""
    found = []
    for package in ("pdscale/controller", "pdscale/simulator", "pdscale", "bench"):
        for path in sorted((ROOT / package).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            for what, pattern in COPIES.items():
                if rel in PHYSICS and what.startswith("a profile's"):
                    continue
                if rel == "pdscale/controller/_perf.py":
                    continue
                found += [f"{rel}: {what}" for _ in re.finditer(pattern, text)]
    assert found == []
