"""Cold starts drawn from a distribution: the spec's median and spread, the simulator's
deterministic draws, and replicas becoming ready at the drawn times."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pdscale.simulator import PoolSetup, SimSetup, load_profile, run_event
from pdscale.simulator._setup import ColdStarts
from pdscale.spec import Role, cold_start_quantile
from tests.conftest import ROOT
from tests.simulator.test_event import _Script, _trace

EXAMPLE = ROOT / "examples" / "dynamo.yaml"

H100 = load_profile("h100-80gb-llama-3.1-8b")


def _pool(spread: float, median: float = 60.0) -> PoolSetup:
    return PoolSetup(Role.DECODE, H100, 1, 1, 64, cold_start_s=median, cold_start_spread=spread)


def test_draws_follow_the_median_and_spread_and_repeat_for_a_seed() -> None:
    pool = _pool(0.3)
    draws = np.array(_many(pool, seed=7, n=4000))
    assert np.median(draws) == pytest.approx(60.0, rel=0.05)
    assert np.percentile(draws, 90) == pytest.approx(cold_start_quantile(60.0, 0.3, 0.9),
                                                     rel=0.05)
    assert draws.min() >= 20.0 and draws.max() <= 180.0  # clipped to [median/3, 3 x median]
    assert _many(pool, seed=7, n=50) == _many(pool, seed=7, n=50)
    assert _many(pool, seed=7, n=50) != _many(pool, seed=8, n=50)
    assert set(_many(_pool(0.0), seed=7, n=20)) == {60.0}  # no spread: the median, always


def _many(pool: PoolSetup, *, seed: int, n: int) -> list[float]:
    draws = ColdStarts(seed)
    return [draws.draw(pool) for _ in range(n)]


def test_replicas_become_ready_at_drawn_times() -> None:
    arrivals = np.linspace(0, 900, 3000)
    setup = SimSetup("svc", PoolSetup(Role.PREFILL, H100, 1, 1, 64),
                     _pool(0.5, median=90.0), 1.0, 0.05, tick_s=15.0, seed=3)
    policy = _Script({60.0: {Role.DECODE: 9}})
    run_event(setup, _trace(arrivals, 300, 50), policy)
    ready = {o.now_s: o.pools[("svc", Role.DECODE)].replicas.ready for o in policy.seen}
    # Eight replicas asked at 60 s arrive one by one around 60 + 90 s, not all at once.
    steps = sorted({t for t in ready if t > 60 and ready[t] > ready[t - 15]})
    assert len(steps) >= 3
    assert ready[max(ready)] == 9
    fixed = replace(setup, decode=replace(setup.decode, cold_start_spread=0.0))
    policy = _Script({60.0: {Role.DECODE: 9}})
    run_event(fixed, _trace(arrivals, 300, 50), policy)
    ready = {o.now_s: o.pools[("svc", Role.DECODE)].replicas.ready for o in policy.seen}
    assert ready[150.0] == 9 and ready[135.0] == 1  # all at 60 + 90 s


def test_the_spec_gives_a_spread_and_the_policy_plans_with_its_p90() -> None:
    from pdscale.controller import build_policy
    from pdscale.spec import SpecError, parse_spec

    text = (EXAMPLE.read_text())
    spec = parse_spec(text)
    pool = spec.services[0].pools[Role.PREFILL]
    assert pool.cold_start_spread == 0.2
    assert pool.cold_start_p90_s == pytest.approx(pool.cold_start * 1.2920, rel=1e-3)
    policy = build_policy(spec, forecasts=None)
    key = (spec.services[0].name, Role.PREFILL)
    assert policy.state[key].cold_start.p90_s == pytest.approx(pool.cold_start_p90_s)
    bad = text.replace("cold_start:", "cold_start_spread: -1\n        cold_start:", 1)
    with pytest.raises(SpecError, match="cold_start_spread"):
        parse_spec(bad)
