"""The queueing-model policy on a simulated clock: observations built by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pdscale.controller import Observation, PoolObservation, PoolReplicas, load_profile
from pdscale.controller._model import Correction, QueueingPolicy
from pdscale.controller._queueing import PrefillLoad, prefill_replicas
from pdscale.spec import ControllerSettings, Role

H100 = load_profile("h100-80gb-llama-3.1-8b")
KEY_P, KEY_D = ("svc", Role.PREFILL), ("svc", Role.DECODE)


def _policy(**kw: Any) -> QueueingPolicy:
    settings = ControllerSettings(**kw)
    return QueueingPolicy(settings, {KEY_P: H100, KEY_D: H100}, {KEY_P: 0.5, KEY_D: 0.05},
                          {KEY_P: 60.0, KEY_D: 60.0}, forecasts=None)


def _obs(now: float, *, prompt: float | None = 40_000.0, gen: float | None = 3_000.0,
         ready: tuple[int, int] = (2, 2), ttft: float | None = None, itl: float | None = None,
         queue: float | None = 0.0, dispersion: float | None = None,
         mean_prompt: float | None = 2000.0, extra: dict[str, float] | None = None
         ) -> Observation:
    signals_p: dict[str, float | None] = {
        "prompt_tokens_per_s": prompt, "ttft_p95_s": ttft, "queue_depth": queue,
        "mean_prompt_tokens": mean_prompt, "prompt_tokens_dispersion": dispersion,
        "prompt_tokens_peak_per_s": prompt, **(extra or {})}
    signals_d: dict[str, float | None] = {"generation_tokens_per_s": gen, "itl_p95_s": itl,
                                          "queue_depth": 0.0, "mean_output_tokens": 200.0}
    pools = {}
    for i, (key, signals) in enumerate(((KEY_P, signals_p), (KEY_D, signals_d))):
        replicas = PoolReplicas(ready=ready[i], starting=0, draining=0, desired=ready[i],
                                min_replicas=1, max_replicas=64)
        pools[key] = PoolObservation(key, replicas,
                                     {k: v for k, v in signals.items() if v is not None},
                                     now - 30)
    return Observation(now, pools)  # type: ignore[arg-type]


def test_a_burst_is_asked_for_in_one_decision() -> None:
    """Five times the load: the model's count at once, not one replica a tick."""
    policy = _policy()
    calm = policy.decide(_obs(0))[KEY_P].detail["need"]
    burst = policy.decide(_obs(15, prompt=200_000.0))[KEY_P]
    assert burst.desired_replicas >= 2 * calm and burst.cause == "forecast"
    assert burst.detail["met"] and burst.detail["predicted_s"] <= 0.5
    assert "predicted TTFT p95" in burst.reasons[1]


def test_prefill_and_decode_are_sized_apart() -> None:
    policy = _policy()
    out = policy.decide(_obs(0, prompt=300_000.0, gen=500.0))
    assert out[KEY_P].desired_replicas > 5
    assert out[KEY_D].desired_replicas == 2  # light decode: held for the window, not grown
    heavy = _policy().decide(_obs(0, prompt=10_000.0, gen=60_000.0))
    assert heavy[KEY_D].desired_replicas > heavy[KEY_P].desired_replicas


def test_missing_demand_holds_and_says_so() -> None:
    out = _policy().decide(_obs(0, prompt=None, gen=None, ready=(6, 5)))
    assert out[KEY_P].desired_replicas == 6 and out[KEY_D].desired_replicas == 5
    assert out[KEY_P].cause == "degraded"


@pytest.mark.parametrize("missing", ["dispersion", "queue", "lengths", "peak", "hit"])
def test_each_optional_signal_missing_falls_back_and_says_so(missing: str) -> None:
    """Without the signal the decision stays sane (within a factor of the full reading's)
    and names its fallback."""
    full = _policy().decide(_obs(0, prompt=120_000.0, dispersion=4000.0))[KEY_P]
    kw: dict[str, Any] = {"prompt": 120_000.0, "dispersion": 4000.0}
    said = {"dispersion": "dispersion unread", "queue": "queue unread",
            "lengths": "lengths unread", "peak": "peak minute unread", "hit": ""}[missing]
    if missing == "dispersion":
        kw["dispersion"] = None
    elif missing == "queue":
        kw["queue"] = None
    elif missing == "lengths":
        kw["mean_prompt"] = None
    elif missing == "peak":
        kw["extra"] = {"prompt_tokens_peak_per_s": math.nan}
    got = _policy().decide(_obs(0, **kw))[KEY_P]
    assert 1 <= got.desired_replicas <= 64
    assert full.desired_replicas / 3 <= got.desired_replicas <= 3 * full.desired_replicas
    assert said in " ".join(got.reasons)


def test_a_growing_queue_counts_as_arrivals_the_counters_miss() -> None:
    policy = _policy()
    policy.decide(_obs(0, queue=0.0))
    steady = _policy()
    steady.decide(_obs(0, queue=0.0))
    grown = policy.decide(_obs(15, queue=300.0))[KEY_P]
    same = steady.decide(_obs(15, queue=0.0))[KEY_P]
    assert grown.desired_replicas > same.desired_replicas
    assert any("queue grew 300 in 15 s" in r for r in grown.reasons)


def test_scale_down_waits_for_the_window_then_steps() -> None:
    policy = _policy(stabilisation=300, max_step_down=2)
    policy.decide(_obs(0, prompt=300_000.0, ready=(12, 2)))
    holding = policy.decide(_obs(15, prompt=20_000.0, ready=(12, 2)))[KEY_P]
    assert holding.desired_replicas == 12
    assert any("stabilisation" in r and "s left" in r for r in holding.reasons)
    down = policy.decide(_obs(330, prompt=20_000.0, ready=(12, 2)))[KEY_P]
    assert down.desired_replicas == 10 and down.cause == "scale_down"
    assert any("at most 2 a tick" in r for r in down.reasons)


def test_the_correction_learns_a_slower_pool_within_its_bounds() -> None:
    """A pool whose TTFT reads twice the model's prediction at its own load learns a
    correction under 1, bounded, and then asks more replicas for the same load."""
    policy = _policy()
    first = policy.decide(_obs(0, prompt=60_000.0, ready=(4, 2)))[KEY_P]
    predicted = first.detail["predicted_s"]
    for i in range(1, 30):
        out = policy.decide(_obs(15 * i, prompt=60_000.0, ready=(4, 2), ttft=3 * predicted))
    k = policy.state[KEY_P].correction
    assert 0.5 <= k.value < 0.9 and k.readings == 29
    assert out[KEY_P].detail["need"] > first.detail["need"]
    fast = _policy(sizing={"calibration_min": 0.5, "calibration_max": 1.2})
    for i in range(30):
        fast.decide(_obs(15 * i, prompt=60_000.0, ready=(4, 2), ttft=0.001))
    assert fast.state[KEY_P].correction.value == pytest.approx(1.2, rel=1e-3)


def test_correction_moves_a_share_of_the_way_in_log_space() -> None:
    c = Correction()
    c.learn(0.5, rate=0.5, low=0.25, high=2.0)
    assert c.value == pytest.approx(math.sqrt(0.5))
    c.learn(10.0, rate=1.0, low=0.25, high=2.0)
    assert c.value == 2.0 and c.spread > 0


def test_more_load_never_asks_fewer_replicas() -> None:
    asked = [_policy().decide(_obs(0, prompt=p))[KEY_P].desired_replicas
             for p in (0.0, 10_000.0, 50_000.0, 150_000.0, 400_000.0)]
    assert asked == sorted(asked)
    load = PrefillLoad(10.0, 0.1, 1.0, 1.0, 0.05, 0.95)
    assert prefill_replicas(load, 0.3, max_replicas=16).replicas == 3
