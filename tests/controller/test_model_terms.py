"""The model's load terms, each against the same observation without it: the backlog replicas
meet when ready, decode's arrivals from prefill, the KV cache as measured and the quiet
readings the correction learns from."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

from pdscale.controller import Observation, PoolObservation, PoolReplicas, load_profile
from pdscale.controller._model import PdscalePolicy, _corrected, _solve
from pdscale.controller._queueing import PrefillLoad, predicted_ttft_s
from pdscale.spec import ControllerSettings, Role
from pdscale.telemetry import Signal

H100 = load_profile("h100-80gb-llama-3.1-8b")
KEY_P, KEY_D = ("svc", Role.PREFILL), ("svc", Role.DECODE)


def _policy(**kw: Any) -> PdscalePolicy:
    return PdscalePolicy(ControllerSettings(**kw),
                         {KEY_P: (H100, 0.5, 60.0), KEY_D: (H100, 0.05, 60.0)},
                         forecasts=None, objective={"svc": 0.99})


def _obs(now: float, *, prompt: float = 40_000.0, gen: float = 3_000.0,
         ready: tuple[int, int] = (2, 2), queue: tuple[float, float] = (0.0, 0.0),
         ttft: float | None = None, decode: dict[str, float] | None = None) -> Observation:
    signals = (
        {"prompt_tokens_per_s": prompt, "prompt_tokens_peak_per_s": prompt,
         "queue_depth": queue[0], "mean_prompt_tokens": 2000.0, "ttft_p95_s": ttft},
        {"generation_tokens_per_s": gen, "queue_depth": queue[1], "mean_output_tokens": 200.0,
         **(decode or {})},
    )
    pools = {}
    for i, key in enumerate((KEY_P, KEY_D)):
        replicas = PoolReplicas(ready=ready[i], starting=0, draining=0, desired=ready[i],
                                min_replicas=1, max_replicas=64)
        pools[key] = PoolObservation(key, replicas,
                                     {Signal(k): v for k, v in signals[i].items()
                                      if v is not None}, now - 30)
    return Observation(now, pools)


def test_a_growing_backlog_is_sized_as_the_replicas_will_find_it() -> None:
    """The same queue, growing: replicas asked now meet it larger by the growth over the
    lead, so more are asked than for a queue that stands still."""
    growing, standing = _policy(), _policy()
    growing.decide(_obs(0, queue=(1000.0, 0.0)))
    standing.decide(_obs(0, queue=(4000.0, 0.0)))
    grew = growing.decide(_obs(15, queue=(4000.0, 0.0)))[KEY_P]
    stood = standing.decide(_obs(15, queue=(4000.0, 0.0)))[KEY_P]
    assert grew.desired_replicas > stood.desired_replicas
    assert "waiting drain within" in grew.reasons[1]


def test_a_growing_prefill_queue_counts_its_requests_once_whatever_the_cache_serves() -> None:
    """The queue's growth adds requests, in the demand's units: the prompt tokens prefill
    computes. With 80 % of every prompt served by the prefix cache, 100 more requests a
    second are 100 more a second, not five times as many."""
    def arrivals(hit: float) -> float:
        policy = _policy()
        for t, queue in ((0, 0.0), (15, 1500.0)):
            obs = _obs(t, prompt=40_000.0, queue=(queue, 0.0))
            obs.pools[KEY_P].signals[Signal.PREFIX_CACHE_HIT_RATIO] = hit
            decision = policy.decide(obs)[KEY_P]
        return float(decision.detail["arrival_rps"])

    # 20 req/s served (40k prompt tokens/s of 2000-token prompts) and 100 req/s of growth
    assert arrivals(0.0) == pytest.approx(120.0)
    assert arrivals(0.8) == pytest.approx(120.0)


def test_decode_is_sized_for_what_prefill_delivers() -> None:
    """A prefill burst reaches decode a prefill later: decode asks for it at once, before
    its own generated-token rate shows it."""
    calm = _policy().decide(_obs(0, prompt=40_000.0))[KEY_D]
    burst = _policy().decide(_obs(0, prompt=400_000.0))[KEY_D]
    assert burst.desired_replicas > calm.desired_replicas
    assert any("what prefill is sized to deliver" in r for r in burst.reasons)


def test_a_full_kv_cache_asks_more_decode_through_its_waiting_sequences() -> None:
    """Decode's batch is the profile's (the ITL's and its KV capacity's): a cache fuller than
    the profile says shows as sequences waiting for a slot, which the backlog sizes for; the
    usage reading itself moves nothing, so an engine that does not export it loses nothing."""
    def decode(queue: float = 0.0, **signals: float) -> Any:
        return _policy().decide(_obs(0, gen=40_000.0, prompt=10_000.0, queue=(0.0, queue),
                                     decode=signals))[KEY_D]

    unread = decode()
    assert decode(running_requests=40.0, kv_cache_usage_ratio=0.95).desired_replicas == \
        unread.desired_replicas
    waiting = decode(queue=4000.0, running_requests=40.0, kv_cache_usage_ratio=0.95)
    assert waiting.desired_replicas > unread.desired_replicas
    assert waiting.detail["backlog"] == 4000.0


def test_decode_holds_the_tail_of_arrivals_as_bursty_as_prefill_reads_them() -> None:
    """Decode's running sequences vary as the service's prompt tokens arrive: the dispersion
    prefill reads (over the mean prompt) widens decode's percentile, so clumped arrivals ask
    more decode replicas than Poisson ones; unread, the default, and the decision says so."""
    def decode(dispersion: float | None) -> Any:
        obs = _obs(0, gen=60_000.0, prompt=60_000.0)
        if dispersion is not None:
            obs.pools[KEY_P].signals[Signal.PROMPT_TOKENS_DISPERSION] = dispersion
        return _policy().decide(obs)[KEY_D]

    poisson, clumped, unread = decode(2000.0), decode(200_000.0), decode(None)
    assert clumped.desired_replicas > poisson.desired_replicas
    assert clumped.detail["running_quantile"] > poisson.detail["running_quantile"]
    assert poisson.detail["running"] == clumped.detail["running"]
    assert any("decode's variability 2 assumed" in r for r in unread.reasons)
    assert poisson.detail["running_quantile"] < unread.detail["running_quantile"] < \
        clumped.detail["running_quantile"]


def test_a_backlog_in_decode_teaches_prefill_nothing() -> None:
    """TTFT includes the wait for a decode slot: while decode has sequences waiting (and for
    the reading's window after), a high TTFT does not lower prefill's correction."""
    policy = _policy()
    for i in range(10):
        policy.decide(_obs(15 * i, ttft=20.0, queue=(0.0, 50.0), ready=(4, 2)))
    assert policy.state[KEY_P].correction.readings == 0
    out = policy.decide(_obs(150, ttft=20.0, ready=(4, 2)))[KEY_P]
    assert any("a backlog within the latency's window" in r for r in out.reasons)
    quiet = _policy()
    for i in range(10):
        quiet.decide(_obs(15 * i, ttft=20.0, ready=(4, 2)))
    assert quiet.state[KEY_P].correction.readings == 10
    assert quiet.state[KEY_P].correction.value < 1


def test_a_decision_carries_the_model_terms_it_said() -> None:
    """The reasons' numbers are in ``detail`` too (for /v1/decisions, Events and the
    simulator's decisions.json)."""
    out = _policy().decide(_obs(0, prompt=200_000.0, ttft=0.3))
    p, d = out[KEY_P].detail, out[KEY_D].detail
    assert "ttft_p95_s 0.3s vs SLO 0.5s" in out[KEY_P].reasons
    assert p["arrival_rps"] == pytest.approx(100.0)  # 200k tokens/s of 2,000-token prompts
    assert p["offered"] == pytest.approx(p["arrival_rps"] * p["mean_service_s"])
    assert p["replicas_for_slo"] == p["need"]
    assert f"{p['offered']:.2f} replicas busy" in out[KEY_P].reasons[1]
    assert d["running"] == pytest.approx(d["arrival_rps"] * 200.0 * d["step_s"])
    assert d["running_quantile"] > d["running"] and d["batch"] >= 1


def test_the_controller_reads_every_signal_the_policy_uses() -> None:
    """Each signal the policy's modules name is one the cluster source queries each tick (or
    derives from those): a signal dropped from the query reads as unread in production while
    the simulator, which computes every signal, would not show it."""
    import re
    from pathlib import Path

    from pdscale.controller import _model
    from pdscale.controller._cluster import POLICY_SIGNALS
    from pdscale.telemetry import derive_signals

    used = {Signal[name]
            for name in re.findall(r"Signal\.([A-Z0-9_]+)", Path(_model.__file__).read_text())}
    derived = set(derive_signals({}))
    assert used - set(POLICY_SIGNALS) - derived == set()


def test_a_reading_is_paired_with_the_replicas_that_made_it() -> None:
    """Readings are 30 s old: the running sequences a decode reading shows were shared by
    the replicas serving then, not by those that joined since; a prefill reading is paired
    with the replicas ready then (a draining one takes no new prompts)."""
    def decode(ready_then: int) -> Any:
        policy = _policy()
        for t in (0, 15, 30):
            policy.decide(_obs(t, ready=(4, ready_then)))
        return policy.decide(_obs(45, ready=(4, 8), gen=20_000.0, decode={
            "running_requests": 400.0, "itl_p95_s": 0.03}))[KEY_D]

    # 400 sequences on 2 replicas step slower by the profile than on 8: the same 30 ms read
    # says the replicas are faster than the profile (a correction above 1), not slower.
    assert decode(2).detail["correction"] > 1 > decode(8).detail["correction"]

    def prefill(drain_at: int) -> PdscalePolicy:
        policy = _policy()
        for i in range(8):
            obs = _obs(15 * i, ttft=0.4, ready=(4, 2))
            if i >= drain_at:
                pool = obs.pools[KEY_P]
                obs.pools[KEY_P] = dataclasses.replace(pool, replicas=dataclasses.replace(
                    pool.replicas, ready=3, draining=1, desired=3))
            policy.decide(obs)
        return policy

    drained = prefill(drain_at=6)
    assert drained.state[KEY_P].serving_at(15 * 7 - 30) == (4, 0)  # the reading's, not now's
    assert drained.state[KEY_P].serving_at(15 * 7) == (3, 1)
    # The same readings credited to 3 ready replicas instead of 4 imply a faster prefill.
    assert prefill(drain_at=0).state[KEY_P].correction.value > \
        prefill(drain_at=8).state[KEY_P].correction.value


def _with_hits(policy: PdscalePolicy, prompt: float, hit: float, ready: int = 2) -> Any:
    obs = _obs(0, prompt=prompt, ready=(ready, 2))
    obs.pools[KEY_P].signals[Signal.PREFIX_CACHE_HIT_RATIO] = hit
    return policy.decide(obs)[KEY_P]


def test_load_balanced_routing_expects_fewer_prefix_hits_on_a_larger_pool() -> None:
    """Hits of 0.8 read at 2 ready replicas: with a load-balanced router a prompt finds its
    prefix on the replica it lands on about 2 times in c at c replicas, so a pool that must
    grow is sized at those hits (more replicas than at 0.8); a prefix-aware router keeps a
    prompt with its cache, and the hits read hold."""
    balanced = _with_hits(_policy(), 500_000.0, 0.8)
    aware_policy = _policy()
    aware_policy.state[KEY_P].prefix_aware = True
    aware = _with_hits(aware_policy, 500_000.0, 0.8)
    c = balanced.desired_replicas
    assert aware.desired_replicas > 2  # the pool must grow, whatever the router
    assert c > aware.desired_replicas
    assert balanced.detail["prefix_hit_sized"] == pytest.approx(0.8 * 2 / c)
    assert aware.detail["prefix_hit_sized"] == pytest.approx(0.8)
    assert any("expected at" in r for r in balanced.reasons)
    # Both read the same arrivals: the hits change the work a prompt brings, not the prompts.
    assert balanced.detail["arrival_rps"] == pytest.approx(aware.detail["arrival_rps"])


def test_counts_that_cycle_under_expected_hits_end_at_the_larger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The count at the hits it implies is found by iteration; a sizing not monotone in a
    prompt's work (one whose criterion loosens once the percentile prompt's prefill passes
    the SLO) can make the counts alternate. The iteration stops at the first repeat and
    keeps the larger count, where it used to loop for ever."""
    from pdscale.controller import _model

    real, calls = _model.prefill_replicas, []

    def alternating(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return dataclasses.replace(real(*args, **kwargs), replicas=6 if len(calls) % 2 else 8)

    monkeypatch.setattr(_model, "prefill_replicas", alternating)
    decided = _with_hits(_policy(), 500_000.0, 0.8)
    assert decided.desired_replicas == 8 and len(calls) == 3
    assert decided.detail["prefix_hit_sized"] == pytest.approx(0.8 * 2 / 6)


def test_prefix_hits_read_hold_on_a_pool_that_does_not_grow() -> None:
    """A load the ready replicas serve: no count beyond them, so no fall in hits to plan."""
    quiet = _with_hits(_policy(), 2_000.0, 0.8, ready=4)
    assert quiet.desired_replicas <= 4
    assert quiet.detail["prefix_hit_sized"] == pytest.approx(0.8)


def test_the_pools_are_sized_at_the_slo_objective() -> None:
    """The spec's objective is the share of requests within the thresholds: a pool is sized
    for its latency at that percentile, so a stricter objective never asks fewer replicas,
    and the correction is still learned from the p95 readings."""
    def need(objective: float) -> tuple[int, int]:
        policy = _policy()
        for st in policy.state.values():
            st.objective = objective
        out = policy.decide(_obs(0, prompt=200_000.0, gen=20_000.0))
        return out[KEY_P].desired_replicas, out[KEY_D].desired_replicas

    needs = [need(q) for q in (0.9, 0.95, 0.99, 0.999)]
    for looser, stricter in itertools.pairwise(needs):
        assert stricter[0] >= looser[0] and stricter[1] >= looser[1]
    assert needs[-1][0] > needs[0][0] and needs[-1][1] > needs[0][1]


@pytest.mark.parametrize("ready,true_k,fixed,busy", [
    (1, 1.0, 0.0, 0.8), (3, 0.9, 0.05, 0.8), (8, 1.7, 0.2, 0.8), (20, 1.99, 0.1, 0.8),
    (2, 0.51, 0.0, 0.3), (3, 0.6, 0.05, 0.3)])
def test_the_correction_solved_reproduces_the_latency_read(ready: int, true_k: float,
                                                           fixed: float, busy: float) -> None:
    """The correction at which the model predicts the TTFT read is found to 2e-5 in log,
    also where low corrections leave the queue unstable (an infinite prediction), in fewer
    predictions than bisection's 18. ``busy``: the utilisation at a correction of 1."""
    load = PrefillLoad(arrival_rps=busy * ready / 0.2, mean_service_s=0.2,
                       variability=2.0, fixed_s=fixed, quantile=0.95,
                       service_quantile_s=0.5)
    calls: list[float] = []

    def predict(k: float) -> float:
        calls.append(k)
        return predicted_ttft_s(_corrected(load, k), ready)

    observed = predict(true_k)
    calls.clear()
    assert math.isinf(predict(0.5)) == (busy > 0.5)  # the queue unstable at the low end
    calls.clear()
    k = _solve(predict, observed, 0.5, 2.0)
    assert abs(math.log(k / true_k)) < 2e-5
    assert len(calls) < 18


def test_a_latency_beyond_the_range_gives_the_nearest_end() -> None:
    def predict(k: float) -> float:
        return 1.0 / k

    assert _solve(predict, 10.0, 0.5, 2.0) == 0.5  # slower than the lowest correction
    assert _solve(predict, 0.1, 0.5, 2.0) == 2.0
    assert _solve(predict, 1.0, 0.5, 2.0) == pytest.approx(1.0, rel=1e-4)


def test_decode_learns_its_correction_only_with_a_running_count() -> None:
    """Decode's correction compares the step the profile predicts at the running batch with
    the ITL read: without the running count there is no batch to predict at, so the reading
    teaches nothing and the decision is the one without a latency reading."""
    def decode(**signals: float) -> tuple[PdscalePolicy, Any]:
        policy = _policy()
        return policy, policy.decide(_obs(0, gen=20_000.0, decode=signals))[KEY_D]

    counted, _ = decode(itl_p95_s=0.03, running_requests=100.0)
    uncounted, without = decode(itl_p95_s=0.03)
    unreadable, _ = decode(itl_p95_s=0.03, running_requests=math.nan)  # empty counters' ratio
    assert counted.state[KEY_D].correction.readings == 1
    for policy in (uncounted, unreadable):
        assert policy.state[KEY_D].correction.readings == 0
        assert policy.state[KEY_D].correction.value == 1.0
    assert without.desired_replicas == decode()[1].desired_replicas


def test_decode_learns_from_the_median_itl_like_with_like() -> None:
    """The step at the mean running batch predicts the median ITL, not the p95 (the batch
    and the contexts vary around their means): an engine at exactly its profile's speed
    whose median ITL is that step keeps a correction of 1 whatever its p95 reads. Without
    the median the p95 is used, reads the engine slower than it is, and the decision says
    so."""
    running, ready = 100.0, 2
    per = running / ready
    step = H100.decode_step_ms(per, per * (2000.0 + 200.0 / 2)) / 1000

    def correction(**itl: float) -> tuple[float, tuple[str, ...]]:
        policy = _policy()
        decision = policy.decide(_obs(0, gen=20_000.0,
                                      decode={"running_requests": running, **itl}))[KEY_D]
        return policy.state[KEY_D].correction.value, decision.reasons

    exact, reasons = correction(itl_p50_s=step, itl_p95_s=1.5 * step)
    assert exact == pytest.approx(1.0, abs=1e-9)
    assert not any("ITL p50 unread" in r for r in reasons)
    slower, reasons = correction(itl_p95_s=1.5 * step)
    assert slower < 0.95  # a fifth of the way to 1 / 1.5
    assert any("ITL p50 unread" in r for r in reasons)
