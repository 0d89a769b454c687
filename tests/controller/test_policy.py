"""pdscale's policy (the queueing model) on a simulated clock: observations built by hand."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdscale.controller import (
    ColdStartTracker,
    ForecastStage,
    Observation,
    PoolForecast,
    PoolObservation,
    PoolReplicas,
    load_profile,
)
from pdscale.controller._model import Correction, PdscalePolicy
from pdscale.controller._queueing import PrefillLoad, prefill_replicas
from pdscale.spec import ControllerSettings, Role

H100 = load_profile("h100-80gb-llama-3.1-8b")
KEY_P, KEY_D = ("svc", Role.PREFILL), ("svc", Role.DECODE)


def _policy(*, forecasts: ForecastStage | None = None, **kw: Any) -> PdscalePolicy:
    settings = ControllerSettings(**kw)
    return PdscalePolicy(settings, {KEY_P: (H100, 0.5, 60.0), KEY_D: (H100, 0.05, 60.0)},
                         forecasts=forecasts, objective={"svc": 0.99})


def _obs(now: float, *, prompt: float | None = 40_000.0, gen: float | None = 3_000.0,
         ready: tuple[int, int] = (2, 2), ttft: float | None = None, itl: float | None = None,
         queue: float | None = 0.0, dispersion: float | None = None,
         mean_prompt: float | None = 2000.0, extra: dict[str, float | None] | None = None,
         decode_extra: dict[str, float | None] | None = None,
         desired: tuple[int, int] | None = None, bounds: tuple[int, int] = (1, 64)
         ) -> Observation:
    """Both pools of one service; ``extra`` and ``decode_extra`` add or replace (None: drop)
    signals of prefill and decode."""
    signals_p: dict[str, float | None] = {
        "prompt_tokens_per_s": prompt, "ttft_p95_s": ttft, "queue_depth": queue,
        "mean_prompt_tokens": mean_prompt, "prompt_tokens_dispersion": dispersion,
        "prompt_tokens_peak_per_s": prompt, **(extra or {})}
    signals_d: dict[str, float | None] = {"generation_tokens_per_s": gen, "itl_p95_s": itl,
                                          "queue_depth": 0.0, "mean_output_tokens": 200.0,
                                          **(decode_extra or {})}
    desired = desired or ready
    pools = {}
    for i, (key, signals) in enumerate(((KEY_P, signals_p), (KEY_D, signals_d))):
        replicas = PoolReplicas(ready=ready[i], starting=0, draining=0, desired=desired[i],
                                min_replicas=bounds[0], max_replicas=bounds[1])
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
    assert "predicted TTFT p99" in burst.reasons[1]  # at the objective, 0.99 by default


def test_prefill_and_decode_are_sized_apart() -> None:
    policy = _policy()
    out = policy.decide(_obs(0, prompt=300_000.0, gen=500.0))
    assert out[KEY_P].desired_replicas > 5
    assert out[KEY_D].desired_replicas < out[KEY_P].desired_replicas
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
    load = PrefillLoad(arrival_rps=10.0, mean_service_s=0.1, variability=2.0, fixed_s=0.05,
                       quantile=0.95)
    assert prefill_replicas(load, 0.3, max_replicas=16).replicas == 3


def _with_starting(obs: Observation, key: tuple[str, Role], starting: int) -> Observation:
    pools = dict(obs.pools)
    pool = pools[key]
    r = pool.replicas
    replicas = PoolReplicas(ready=r.ready, starting=starting, draining=r.draining,
                            desired=r.ready + starting, min_replicas=r.min_replicas,
                            max_replicas=r.max_replicas)
    pools[key] = PoolObservation(key, replicas, pool.signals, pool.data_time_s)
    return Observation(obs.now_s, pools)


def _prefill_service_s(prompt: float) -> float:
    """E[S] of a prompt of the mix at the profile's throughput (no hits, cv2 1, correction 1):
    the queueing model's mean service time, from the profile directly."""
    return prompt / H100.prefill_tokens_per_s(prompt, prompt**2 * 2)


def test_a_backlog_is_drained_in_one_decision_and_the_ask_is_a_total() -> None:
    """40,000 prompts waiting on 2 replicas: one decision asks for what drains them within the
    lead (replicas asked now are ready only after it), not a replica a tick; replicas already
    starting count towards that total."""
    service_s = _prefill_service_s(2000.0)
    offered = 20_000.0 / 2000.0 * service_s  # 10 prompts/s
    lead = 60.0 + 15.0  # cold start + a tick
    drain = math.ceil(offered + 40_000 * service_s / lead)
    calm = _policy().decide(_obs(0, prompt=20_000.0))[KEY_P]
    assert drain > 2 * calm.desired_replicas  # the premise: the backlog sets the count
    out = _policy().decide(_obs(0, prompt=20_000.0, queue=40_000.0))[KEY_P]
    assert out.desired_replicas == drain and out.cause == "forecast"
    assert any(f"40000 waiting drain within {lead:g} s at {drain}" in r for r in out.reasons)
    starting = _with_starting(_obs(15, prompt=20_000.0, queue=40_000.0), KEY_P, drain - 2)
    again = _policy().decide(starting)[KEY_P]
    assert again.desired_replicas == drain  # not drain + what is already starting


def test_scale_down_waits_the_whole_window_then_steps_to_the_need() -> None:
    """After a burst the pool is held for the stabilisation window (300 s from the burst's
    decision), then steps down at most ``max_step_down`` a tick to what the load needs."""
    policy = _policy(stabilisation=300, max_step_down=2)
    up = policy.decide(_obs(0, prompt=300_000.0))[KEY_P].desired_replicas
    low = _policy().decide(_obs(0, prompt=10_000.0, ready=(1, 2)))[KEY_P].desired_replicas
    assert up - low > 4  # the premise: several steps down
    seen = {}
    ready = up
    for t in range(15, 1200, 15):
        ready = seen[t] = policy.decide(_obs(t, prompt=10_000.0, ready=(ready, 2)))[
            KEY_P].desired_replicas
    assert {seen[t] for t in range(15, 315, 15)} == {up}  # the burst's need is in the window
    assert seen[315] == up - 2
    steps = [a - b for a, b in itertools.pairwise(seen.values())]
    assert max(steps) <= 2 and min(steps) >= 0
    assert seen[1185] == low


def test_a_scale_up_is_timed_until_its_replicas_are_ready() -> None:
    """Replicas are timed from the tick they are seen starting until the pool reports that
    many ready: the cold starts learned set the lead (their p90 plus a tick; the pool's
    default until three are in)."""
    policy = _policy()
    first = policy.decide(_obs(0, prompt=200_000.0, ready=(1, 2)))[KEY_P]
    asked = first.desired_replicas
    assert asked > 1 and first.lead_s == 75.0 and first.cold_start_p90_s == 60.0
    for t in range(15, 120, 15):
        policy.decide(_with_starting(_obs(t, prompt=200_000.0, ready=(1, 2)), KEY_P,
                                     asked - 1))
    assert list(policy.state[KEY_P].cold_start.samples) == []
    policy.decide(_obs(120, prompt=200_000.0, ready=(asked, 2)))
    assert list(policy.state[KEY_P].cold_start.samples) == [105.0]
    after = policy.decide(_obs(135, prompt=200_000.0, ready=(asked, 2)))[KEY_P]
    assert after.lead_s == 75.0  # one sample: still the default


def test_an_ask_held_back_is_not_timed_as_a_cold_start() -> None:
    """A budget, a bound or a dry run keeps the pool at 1 for ten minutes: nothing started,
    so nothing is timed, and the replicas that start later are timed from their start."""
    policy = _policy()
    for t in range(0, 600, 15):
        assert policy.decide(_obs(t, prompt=200_000.0, ready=(1, 2)))[KEY_P].desired_replicas > 1
    policy.decide(_with_starting(_obs(600, prompt=200_000.0, ready=(1, 2)), KEY_P, 3))
    policy.decide(_obs(690, prompt=200_000.0, ready=(4, 2)))
    assert list(policy.state[KEY_P].cold_start.samples) == [90.0]


def test_cold_start_p90_is_learned() -> None:
    tracker = ColdStartTracker(p90_s=60.0)
    for start, delay in ((0, 100), (1000, 110), (2000, 120), (3000, 130)):
        tracker.asked(start, 3)
        tracker.observe(start + delay - 1, 2)
        tracker.observe(start + delay, 3)
    assert tracker.p90_s == pytest.approx(127, abs=1)  # numpy's p90 of 100..130: 127


def test_a_scale_up_is_not_timed_across_ticks_its_pool_went_unobserved() -> None:
    """A pool missing from an observation for a while: when its pending scale-up became ready
    is unknown, so its return does not record the gap as a cold start."""
    for missing, samples in ((False, [600.0]), (True, [])):
        policy = _policy()
        policy.decide(_obs(0, prompt=1000.0, ready=(1, 2)))
        policy.state[KEY_P].cold_start.asked(0, 2)
        if missing:
            only_decode = _obs(15, prompt=1000.0, ready=(1, 2))
            policy.decide(Observation(15, {KEY_D: only_decode.pools[KEY_D]}))
        policy.decide(_obs(600, prompt=1000.0, ready=(2, 2)))
        assert list(policy.state[KEY_P].cold_start.samples) == samples


def test_a_decision_carries_the_forecast_it_used_and_its_lead() -> None:
    """With a fitted forecaster the pool is sized for the higher of the demand now and the
    forecast at the scale-up quantile over the lead; the decision carries both and says so."""
    settings_ = ControllerSettings()
    stage = ForecastStage({KEY_P: 75.0, KEY_D: 75.0}, settings_)
    times = [60.0 * i for i in range(120)]
    stage.warm(KEY_P, times, [40_000.0 + 20_000.0 * math.sin(t / 600) for t in times])
    stage.refit(KEY_P, times[-1])
    policy = _policy(forecasts=stage)
    out = policy.decide(_obs(7200.0, prompt=40_000.0))[KEY_P]
    assert isinstance(out.forecast, PoolForecast) and out.lead_s == 75.0
    assert out.forecast.sized_quantile == 0.97 and out.forecast.horizons_s[-1] >= 75.0
    assert out.detail["load"] == max(40_000.0, out.forecast.sized_value)
    assert out.reasons[0].startswith(f"load {out.detail['load']:.4g}/s (forecast q0.97 over 75s")
    off = _policy().decide(_obs(0, prompt=40_000.0))[KEY_P]
    assert off.forecast is None and "forecast: off" in off.reasons[0]


def _prefix_aware() -> PdscalePolicy:
    """A policy whose service routes by prefix: the hits read hold at any count."""
    policy = _policy()
    policy.state[KEY_P].prefix_aware = True
    return policy


def test_prefix_hits_are_the_engines_computed_tokens_where_the_ratio_is_unread() -> None:
    """vLLM 0.34's prompt_tokens_by_source{source="local_compute"} gives the hits where the
    hit ratio is unread: 50k of 200k prompt tokens computed is a hit ratio of 0.75. The
    demand stays the prompt tokens (the prompts arriving); the hits shorten each one's
    prefill."""
    ratio = _prefix_aware().decide(_obs(0, prompt=200_000.0, extra={
        "prefix_cache_hit_ratio": 0.75}))[KEY_P]
    computed = _prefix_aware().decide(_obs(0, prompt=200_000.0, extra={
        "prompt_tokens_computed_per_s": 50_000.0}))[KEY_P]
    none = _prefix_aware().decide(_obs(0, prompt=200_000.0))[KEY_P]
    for out in (ratio, computed, none):
        assert out.detail["demand"] == 200_000.0
    assert computed.detail["prefix_hit_read"] == pytest.approx(0.75)
    assert computed.desired_replicas == ratio.desired_replicas < none.desired_replicas
    assert "prefix_hit_read" not in none.detail


def test_the_peak_minute_is_sized_in_prompt_tokens_and_the_hits_shorten_each_prompt() -> None:
    """A burst the 5-minute rate averages away sizes the pool through its busiest minute, in
    prompt tokens as the demand is; a cached share shortens each prompt's prefill, so fewer
    replicas serve the same burst."""
    seen = {}
    for label, extra in (("none", {"prompt_tokens_peak_per_s": None}), ("peak", {}),
                         ("cached", {"prefix_cache_hit_ratio": 0.5}),
                         ("computed", {"prompt_tokens_computed_per_s": 5_000.0})):
        peak = {} if label == "none" else {"prompt_tokens_peak_per_s": 400_000.0}
        out = _prefix_aware().decide(_obs(0, prompt=20_000.0, extra={**peak, **extra}))[KEY_P]
        seen[label] = (out.desired_replicas, out.detail["load"])
        assert any("peak minute unread" in r for r in out.reasons) is (label == "none")
    assert seen["none"][1] == 20_000.0
    assert seen["peak"][1] == seen["cached"][1] == seen["computed"][1] == 400_000.0
    # 5k of 20k computed: a hit ratio of 0.75, more than the 0.5 read in "cached"
    assert seen["peak"][0] > seen["cached"][0] > seen["computed"][0] >= seen["none"][0], seen


def test_a_dispersion_reading_is_taken_in_the_pool_s_units_and_a_broken_one_is_unread() -> None:
    """The prompt tokens' index of dispersion of Poisson arrivals of the planned mix is
    E[L^2] / E[L] = 2 x 2,000 tokens (cv2 1): it reads ca2 + cs2 = 2, the default, with or
    without a cached share (the dispersion scales with it as the tokens do). Clumped arrivals
    ask more; NaN or inf (an idle window's division by zero) is unread and says so."""
    def decide(value: float | None, **extra: float) -> Any:
        return _policy().decide(_obs(0, prompt=200_000.0, dispersion=value,
                                     extra=dict(extra)))[KEY_P]

    unread = decide(None)
    poisson = decide(4000.0)
    assert poisson.desired_replicas == unread.desired_replicas
    assert poisson.detail["predicted_s"] == pytest.approx(unread.detail["predicted_s"])
    assert not any("dispersion unread" in r for r in poisson.reasons)
    cached = decide(4000.0, prefix_cache_hit_ratio=0.5)
    cached_unread = decide(None, prefix_cache_hit_ratio=0.5)
    assert cached.detail["predicted_s"] == pytest.approx(cached_unread.detail["predicted_s"])
    assert decide(40_000.0).desired_replicas > unread.desired_replicas
    for broken in (math.nan, math.inf):
        got = decide(broken)
        assert got.desired_replicas == unread.desired_replicas
        assert any("dispersion unread" in r for r in got.reasons)


def test_a_decode_pool_without_a_prompt_length_of_its_own_takes_the_service_s() -> None:
    """Decode's context is the prompt plus half the output: read on prefill, the service's
    prompt length sizes decode as its own reading would; long prompts leave room for fewer
    sequences a step, so decode asks more replicas than the fallback length would."""
    def decode(prefill_prompt: float | None, decode_prompt: float | None) -> Any:
        return _policy().decide(_obs(0, gen=60_000.0, mean_prompt=prefill_prompt,
                                     decode_extra={"mean_prompt_tokens": decode_prompt})
                                )[KEY_D]

    shared = decode(8000.0, None)
    own = decode(None, 8000.0)
    assert shared.desired_replicas == own.desired_replicas
    assert shared.detail["predicted_s"] == pytest.approx(own.detail["predicted_s"])
    unread = decode(None, None)
    assert any("lengths unread" in r for r in unread.reasons)
    assert shared.desired_replicas > unread.desired_replicas


def test_prefill_calibrates_on_the_last_minute_s_ttft_where_read() -> None:
    """The recorded TTFT p95 is over five minutes and carries a served burst that long: where
    the last minute's p95 is read, the correction learns from it alone (what a pool reading
    only that would learn), so a passed miss adds no replica; unread, the 5-minute p95 counts."""
    def run(ttft: float, recent: float | None) -> PdscalePolicy:
        policy = _policy()
        for t in range(0, 300, 15):
            policy.decide(_obs(t, prompt=60_000.0, ready=(4, 2), ttft=ttft,
                               extra={"ttft_p95_recent_s": recent}))
        return policy

    passed = run(1.2, 0.2).state[KEY_P].correction
    assert passed.value == pytest.approx(run(0.2, None).state[KEY_P].correction.value)
    stale = run(1.2, None).state[KEY_P].correction
    assert stale.value < passed.value
    late = run(1.2, None).decide(_obs(300, prompt=60_000.0, ready=(4, 2), ttft=1.2))[KEY_P]
    kept = run(1.2, 0.2).decide(_obs(300, prompt=60_000.0, ready=(4, 2), ttft=1.2,
                                     extra={"ttft_p95_recent_s": 0.2}))[KEY_P]
    assert late.detail["need"] > kept.detail["need"]
    said = "last minute's TTFT p95 unread: the correction learns from the 5-minute p95"
    assert said in late.reasons and said not in kept.reasons


def test_no_flapping_under_constant_load() -> None:
    """A constant load and latency: one move to the model's count, then steady (the
    correction settles; it does not walk the pool up and down)."""
    policy = _policy()
    ready = (2, 2)
    history = []
    for t in range(0, 3600, 15):
        out = policy.decide(_obs(t, prompt=120_000.0, gen=20_000.0, ready=ready, ttft=0.2,
                                 itl=0.02, decode_extra={"running_requests": 100.0}))
        ready = (out[KEY_P].desired_replicas, out[KEY_D].desired_replicas)
        history.append(ready)
    changes = sum(1 for a, b in itertools.pairwise(history) if a != b)
    assert changes <= 2


@settings(max_examples=60, deadline=None)
@given(low=st.floats(0, 5e5), extra=st.floats(0, 5e5), gen=st.floats(0, 1e5))
def test_more_demand_never_fewer_replicas(low: float, extra: float, gen: float) -> None:
    a = _policy().decide(_obs(0, prompt=low, gen=gen))
    b = _policy().decide(_obs(0, prompt=low + extra, gen=gen + extra / 10))
    for key in (KEY_P, KEY_D):
        assert b[key].desired_replicas >= a[key].desired_replicas


@settings(max_examples=60, deadline=None)
@given(prompt=st.one_of(st.none(), st.floats(0, 1e7)), gen=st.one_of(st.none(), st.floats(0, 1e6)),
       ready=st.integers(1, 30), lo=st.integers(1, 5), hi=st.integers(5, 30),
       ttft=st.one_of(st.none(), st.floats(0, 30)), queue=st.floats(0, 1e4))
def test_bounds_always_hold_and_degraded_never_drops(prompt: float | None, gen: float | None,
                                                     ready: int, lo: int, hi: int,
                                                     ttft: float | None, queue: float) -> None:
    ready = min(max(ready, lo), hi)
    out = _policy().decide(_obs(0, prompt=prompt, gen=gen, ready=(ready, ready), ttft=ttft,
                                queue=queue, bounds=(lo, hi)))
    for key, signal in ((KEY_P, prompt), (KEY_D, gen)):
        n = out[key].desired_replicas
        assert lo <= n <= hi
        if signal is None:
            assert n >= ready and out[key].cause == "degraded"


def test_degraded_holds_what_was_asked_not_only_what_runs() -> None:
    """Demand missing while a scale-up is under way: held at the higher of the target and the
    active replicas, never lowered to what runs."""
    out = _policy().decide(_obs(0, prompt=None, gen=None, ready=(3, 2), desired=(7, 2)))
    assert out[KEY_P].desired_replicas == 7 and out[KEY_D].desired_replicas == 2
    assert out[KEY_P].reasons[0].startswith("degraded: prompt_tokens_per_s missing")


def test_every_replica_held_above_the_need_is_named_in_the_loop_s_words() -> None:
    """The reconcile loop logs (and records an Event) when a pool is held above its need,
    naming the reasons that hold it: the policy's stabilisation says so in words it reads."""
    from pdscale.controller._reconciler import DecisionRecord, _holding

    def record(t: float, ready: int) -> tuple[DecisionRecord, str | None]:
        d = policy.decide(_obs(t, prompt=10_000.0, ready=(ready, 2)))[KEY_P]
        rec = DecisionRecord(t, KEY_P, ready, ready, d.desired_replicas, "applied", d.cause,
                             d.reasons, d.detail)
        return rec, _holding(rec)

    policy = _policy(stabilisation=300, max_step_down=2)
    up = policy.decide(_obs(0, prompt=300_000.0))[KEY_P].desired_replicas
    held, why = record(15, up)
    assert held.desired == up > held.detail["need"]
    assert why is not None and why.startswith(f"holding {up} over the need")
    stepped, why = record(315, up)
    assert stepped.desired == up - 2 > stepped.detail["need"]
    assert why is not None and why.startswith(f"down 2 to {up - 2}")
