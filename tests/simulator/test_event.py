"""The event-mode simulator: queueing theory, KV pressure, replica life cycle, routing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from pdscale.controller import Observation, PoolDecision, PoolKey
from pdscale.simulator import EventSimulator, PoolSetup, SimSetup, Trace, load_profile, run_event
from pdscale.simulator._policies import StaticPolicy
from pdscale.spec import Role
from pdscale.telemetry import RATE_WINDOW_S, Signal
from tests.conftest import SHARED

H100 = load_profile("h100-80gb-llama-3.1-8b")


def _trace(arrivals: np.ndarray, prompt: int | np.ndarray, output: int | np.ndarray) -> Trace:
    n = len(arrivals)
    return Trace("test", np.asarray(arrivals, dtype=np.float64),
                 np.broadcast_to(np.asarray(prompt, dtype=np.int64), (n,)).copy(),
                 np.broadcast_to(np.asarray(output, dtype=np.int64), (n,)).copy())


def _setup(prefill: int = 1, decode: int = 1, *, profile=H100, **kw: object) -> SimSetup:
    return SimSetup("svc", PoolSetup(Role.PREFILL, profile, prefill, 1, 64),
                    PoolSetup(Role.DECODE, profile, decode, 1, 64), 1.0, 0.05, **kw)


def test_md1_mean_wait_matches_queueing_theory() -> None:
    """One prefill replica, Poisson arrivals, one fixed-length prompt an iteration: an M/D/1
    queue, whose mean wait is rho S / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    length = 2000
    profile = replace(H100, max_prefill_tokens_per_iter=length)
    service = profile.prefill_ms(length) / 1000
    rho = 0.7
    rng = np.random.default_rng(42)
    arrivals = np.cumsum(rng.exponential(service / rho, 60_000))
    sim = EventSimulator(_setup(profile=profile, decode=8), _trace(arrivals, length, 1))
    sim.run()
    waits = sim.prefill_end - sim.arrival - service
    expected = rho * service / (2 * (1 - rho))
    assert float(np.mean(waits)) == pytest.approx(expected, rel=0.05)


def test_light_load_latency_is_the_sum_of_its_parts() -> None:
    sim = EventSimulator(_setup(), _trace(np.array([0.0, 100.0]), 1000, 10))
    sim.run()
    ttft = sim.first_token[0] - sim.arrival[0]
    expected = (H100.prefill_ms(1000) + H100.ttft_overhead_ms + H100.kv_transfer_ms(1000) +
                H100.decode_step_ms(1, 1000)) / 1000
    assert ttft == pytest.approx(expected, rel=1e-6)
    tpot = (sim.finish[0] - sim.first_token[0]) / 9
    assert tpot == pytest.approx(H100.decode_step_ms(1, 1005) / 1000, rel=0.01)


def test_a_mocker_prefill_worker_runs_an_iteration_at_its_total_tokens() -> None:
    """A 32k-token prompt alone takes the mocker four full iterations; of four 2k prompts
    that arrive together, the first starts an iteration alone and the other three share the
    next, each waiting for all of its 6k tokens."""
    mocker = load_profile("dynamo-mocker-1.6.1")
    full = mocker.prefill_ms(8192) / 1000

    def frontend(tokens: int) -> float:
        return mocker.frontend_ms_per_1k_tokens * tokens / 1e6

    sim = EventSimulator(_setup(profile=mocker), _trace(np.array([0.0]), 32768, 2))
    sim.run()
    assert sim.prefill_end[0] - sim.arrival[0] == pytest.approx(4 * full + frontend(32768),
                                                                rel=1e-6)
    sim = EventSimulator(_setup(profile=mocker), _trace(np.zeros(4), 2048, 2))
    sim.run()
    first = mocker.prefill_ms(2048) / 1000
    shared = mocker.iteration_ms([(0.0, 2048.0)] * 3) / 1000
    assert shared == pytest.approx(mocker.prefill_ms(3 * 2048) / 1000)
    assert sim.prefill_end - sim.arrival - frontend(2048) == pytest.approx(
        [first, first + shared, first + shared, first + shared], rel=1e-6)


def test_round_robin_queues_behind_a_busy_worker_where_a_shared_queue_does_not() -> None:
    """Dynamo's default router sends each request to the next worker whatever its load: the
    third request waits behind the first one's 32k-token prompt on the first worker, where a
    shared queue gives it to the second worker as soon as that is free. (The frontend's time
    per prompt token is left out: it would let the short prompts overtake the long one.)"""
    mocker = replace(load_profile("dynamo-mocker-1.6.1"), frontend_ms_per_1k_tokens=0.0)
    trace = _trace(np.array([0.0, 0.001, 0.002, 0.003]), np.array([32768, 512, 512, 512]), 2)
    short = mocker.prefill_ms(512) / 1000
    ends = {}
    for router in ("least_loaded", "round_robin"):
        sim = EventSimulator(_setup(prefill=2, decode=2, profile=mocker, router=router), trace)
        sim.run()
        ends[router] = sim.prefill_end - sim.arrival
        assert ends[router][0] == pytest.approx(4 * mocker.prefill_ms(8192) / 1000, rel=1e-6)
    # Shared queue: the second worker serves requests 1, 2 and 3 one after another.
    assert ends["least_loaded"][1:] == pytest.approx(
        [short, short + mocker.prefill_ms(1024) / 1000 - 0.001,
         short + mocker.prefill_ms(1024) / 1000 - 0.002], abs=2e-3)
    # Round robin: request 2 follows request 0 on the first worker; 1 and 3 go to the second.
    assert ends["round_robin"][2] > ends["round_robin"][0]
    assert ends["round_robin"][1] == pytest.approx(short, rel=1e-6)
    # Request 3 follows request 1 on the second worker (sent 2 ms after it).
    assert ends["round_robin"][3] == pytest.approx(2 * short - 0.002, rel=1e-6)


def test_round_robin_serves_what_waited_for_a_ready_worker_first() -> None:
    """Requests that arrived while no prefill worker was ready (its only one failed) wait in
    the pool's shared queue; once a worker is ready they are served before the requests routed
    to its own queue after them."""
    setup = replace(_setup(prefill=1, decode=2, router="round_robin"),
                    failures=((1.0, Role.PREFILL),))
    setup = replace(setup, prefill=replace(setup.prefill, cold_start_s=5.0))
    arrivals = np.arange(0.0, 12.0, 0.05)
    sim = EventSimulator(setup, _trace(arrivals, 500, 2))
    sim.run()
    assert np.isfinite(sim.prefill_end).all()
    waited = (arrivals > 1.0) & (arrivals < 5.9)
    later = arrivals > 6.5
    # Served oldest first: the backlog is done before anything that came after it.
    assert sim.prefill_end[waited].max() <= sim.prefill_end[later].min() + 1e-9
    order = np.argsort(sim.prefill_end[waited | later], kind="stable")
    assert (np.diff(order) > 0).mean() > 0.9


def test_prompts_that_arrive_together_reach_a_worker_shortest_first() -> None:
    """With the frontend's time per prompt token, of four prompts sent at once the shortest
    starts an iteration alone (the worker is idle when it arrives) and the longest waits for the
    others; without it they are served in the order they were sent."""
    mocker = load_profile("dynamo-mocker-1.6.1")
    assert mocker.frontend_ms_per_1k_tokens > 0
    prompts = np.array([30000, 6000, 600, 3000])
    ends = {}
    for name, profile in (("frontend", mocker),
                          ("none", replace(mocker, frontend_ms_per_1k_tokens=0.0))):
        sim = EventSimulator(_setup(profile=profile), _trace(np.zeros(4), prompts, 2))
        sim.run()
        ends[name] = sim.prefill_end.copy()
    assert list(np.argsort(ends["frontend"])) == [2, 3, 1, 0]
    assert ends["frontend"][2] == pytest.approx(
        mocker.frontend_ms_per_1k_tokens * 0.6 / 1000 + mocker.prefill_ms(600) / 1000, rel=1e-6)
    # Sent order: the 30k prompt is first and fills the first iterations.
    assert ends["none"][0] < ends["none"][2]
    assert ends["frontend"][2] < ends["none"][2] / 5


def test_batching_makes_decode_steps_slower() -> None:
    arrivals = np.linspace(0, 1, 200)
    sim = EventSimulator(_setup(prefill=8), _trace(arrivals, 500, 400))
    sim.run()
    alone = H100.decode_step_ms(1, 500) / 1000
    assert sim.itl_quantile(0.5) > 2 * alone
    assert np.all(~np.isnan(sim.finish))


def test_kv_pressure_preempts_and_everything_still_finishes() -> None:
    small = replace(H100, kv_capacity_tokens=60_000)
    arrivals = np.linspace(0, 2, 60)
    sim = EventSimulator(_setup(prefill=4, profile=small), _trace(arrivals, 1500, 800))
    sim.run()
    assert sim.preemptions > 0
    assert np.all(~np.isnan(sim.finish))
    assert sim.finished == 60


def test_request_larger_than_the_kv_cache_is_rejected() -> None:
    small = replace(H100, kv_capacity_tokens=10_000)
    sim = EventSimulator(_setup(profile=small), _trace(np.array([0.0, 1.0]),
                                                       np.array([20_000, 100]), 5))
    sim.run()
    assert sim.rejected == 1
    assert np.isnan(sim.finish[0]) and not np.isnan(sim.finish[1])


class _Script:
    name = "script"

    def __init__(self, plan: Mapping[float, Mapping[Role, int]]) -> None:
        self.plan = plan
        self.seen: list[Observation] = []

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        self.seen.append(observation)
        wanted = self.plan.get(observation.now_s, {})
        return {("svc", role): PoolDecision(n, ("scripted",)) for role, n in wanted.items()}


def test_replicas_start_after_the_cold_start_and_bill_from_the_request() -> None:
    arrivals = np.linspace(0, 600, 3000)
    setup = _setup(prefill=1, decode=1, tick_s=15.0)
    setup = replace(setup, decode=replace(setup.decode, cold_start_s=90.0))
    policy = _Script({60.0: {Role.DECODE: 3}, 300.0: {Role.DECODE: 1}})
    result = run_event(setup, _trace(arrivals, 300, 50), policy)
    starting = [o.pools[("svc", Role.DECODE)].replicas for o in policy.seen]
    at = {o.now_s: r for o, r in zip(policy.seen, starting, strict=True)}
    assert at[75.0].starting == 2 and at[75.0].ready == 1
    assert at[165.0].ready == 3 and at[165.0].starting == 0  # ready at 60 + 90 = 150
    decode_hours = result.summary["pools"]["decode"]["gpu_hours"]
    end = result.summary["simulated_s"]
    # One replica all along, two more billed from 60 s until drained shortly after 300 s.
    assert decode_hours * 3600 == pytest.approx(end + 2 * 240, abs=2 * 20)
    assert result.summary["finished"] == 3000


def test_observations_are_delayed_like_prometheus() -> None:
    arrivals = np.concatenate([np.linspace(0, 100, 50), np.linspace(100, 200, 2000)])
    policy = _Script({})
    run_event(_setup(tick_s=15.0), _trace(arrivals, 300, 20), policy, observation_delay_s=30)
    for obs in policy.seen:
        pool = obs.pools[("svc", Role.PREFILL)]
        assert pool.data_time_s == max(0.0, obs.now_s - 30)
    rates = {o.now_s: o.pools[("svc", Role.PREFILL)].signals.get(Signal.REQUEST_RATE)
             for o in policy.seen}
    # The run's first sample (t=0, nothing measured yet) reads as no data until it is 30 s
    # old, never as a rate of 0.
    assert rates[0.0] is None and rates[15.0] is None and rates[30.0] is None
    # The burst starting at 100 s shows in the data 30 s later.
    assert rates[120.0] < 1 < rates[150.0]


def test_rates_are_over_the_recording_rules_window() -> None:
    """A rate the controller reads is the count over the last RATE_WINDOW_S seconds (what
    Prometheus' rate5m over the engines' counters gives), not over the last tick or minute.
    Requests count as they finish (vLLM's request_success_total): with replicas to spare they
    finish within a second of arriving, so the count is the window's arrivals up to those
    within a second of its edges."""
    rng = np.random.default_rng(3)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 900, 4000), rng.uniform(400, 460, 3000)]))
    policy = _Script({})
    run_event(_setup(prefill=4, decode=4, tick_s=15.0), _trace(arrivals, 200, 5), policy,
              observation_delay_s=0)
    checked = 0
    for obs in policy.seen:
        t = obs.pools[("svc", Role.PREFILL)].data_time_s
        if t < RATE_WINDOW_S or t > 900:
            continue
        expected = np.count_nonzero((arrivals > t - RATE_WINDOW_S) & (arrivals <= t))
        edges = np.count_nonzero((np.abs(arrivals - t) < 1) |
                                 (np.abs(arrivals - t + RATE_WINDOW_S) < 1))
        signals = obs.pools[("svc", Role.PREFILL)].signals
        assert abs(signals[Signal.REQUEST_RATE] * RATE_WINDOW_S - expected) <= edges
        assert signals[Signal.MEAN_PROMPT_TOKENS] == pytest.approx(
            signals[Signal.PROMPT_TOKENS_PER_S] / signals[Signal.REQUEST_RATE])
        checked += 1
    assert checked > 30
    # The one-minute burst of 3,000 requests lifts the rate for five minutes, by 10/s.
    burst = [o for o in policy.seen if 470 <= o.now_s <= 700]
    assert all(o.pools[("svc", Role.PREFILL)].signals[Signal.REQUEST_RATE] > 12 for o in burst)


def test_the_recent_signals_see_a_burst_the_rate_window_averages_away() -> None:
    """The peak one-minute prompt rate within the rate window shows a one-minute burst at its
    height for the whole window (the 5-minute rate shows a fifth of it); the last minute's
    TTFT p95 lets go of the burst a minute after it was served, the 5-minute p95 does not."""
    rng = np.random.default_rng(5)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 1200, 2400), rng.uniform(400, 460, 3000)]))
    policy = _Script({})
    run_event(_setup(prefill=2, decode=4, tick_s=15.0), _trace(arrivals, 2000, 5), policy,
              observation_delay_s=0)
    seen = {o.now_s: o.pools[("svc", Role.PREFILL)].signals for o in policy.seen}
    burst_rate = 3000 * 2000 / 60.0  # two replicas serve it within about 70 s
    during = [seen[t] for t in seen if 480 <= t <= 705]
    assert during and all(s[Signal.PROMPT_TOKENS_PEAK_PER_S] > 0.8 * burst_rate and
                          s[Signal.PROMPT_TOKENS_PER_S] < 0.4 * burst_rate for s in during)
    assert all(s[Signal.PROMPT_TOKENS_PEAK_PER_S] >= s[Signal.PROMPT_TOKENS_PER_S] - 1e-6
               for s in seen.values() if s.get(Signal.PROMPT_TOKENS_PEAK_PER_S) is not None)
    after = [seen[t] for t in seen if 900 <= t <= 1100]  # the window has let go of it
    assert after and all(s[Signal.PROMPT_TOKENS_PEAK_PER_S] < 0.2 * burst_rate for s in after)
    # The burst's queue is served by about 530 s: the 5-minute p95 still carries it, the
    # last minute's does not.
    served = [seen[t] for t in seen if 555 <= t <= 720]
    assert served and all(s[Signal.TTFT_P95_S] > 1.0 > s[Signal.TTFT_P95_RECENT_S]
                          for s in served)


def test_failure_loses_a_replica_and_its_work_is_redone() -> None:
    arrivals = np.linspace(0, 120, 600)
    setup = replace(_setup(prefill=2, decode=2), failures=((60.0, Role.DECODE),))
    result = run_event(setup, _trace(arrivals, 400, 200), StaticPolicy())
    assert result.summary["rerouted_requests"] > 0
    assert result.summary["finished"] == 600


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="../shared/traces is absent")
def test_prefix_aware_routing_raises_the_cache_hit_rate() -> None:
    from pdscale.simulator import load_trace

    trace = load_trace(SHARED / "traces" / "mooncake_fast25_conversation_trace.jsonl.gz")
    trace = trace.window(0, 900)
    hits = {}
    for router in ("least_loaded", "prefix"):
        sim = EventSimulator(_setup(prefill=6, decode=4, router=router), trace)
        sim.run()
        hits[router] = sim.cached.sum() / sim.prompt.sum()
    assert hits["prefix"] > 1.5 * hits["least_loaded"]


def test_a_settling_step_runs_events_in_order_after_the_work_is_done() -> None:
    """Live mode steps with a settling clock. Once every request was answered, the stop for
    replicas still starting skipped their readiness, the clock settled past it, and the next
    step ran it in the past (the clock went backwards)."""
    setup = _setup(tick_s=15.0)
    setup = replace(setup, prefill=replace(setup.prefill, cold_start_s=60.0,
                                           cold_start_spread=0.0))
    sim = EventSimulator(setup, _trace(np.linspace(0, 5, 10), 200, 5))
    sim.start()
    sim.advance(50.0)
    assert sim.finished == 10 and sim.now == 50.0
    sim.set_replicas(Role.PREFILL, 2)  # ready at 110 s
    clock = [sim.now]
    for until in (100.0, 120.0, 140.0):
        sim.advance(until)
        clock.append(sim.now)
        assert all(t > until for t, *_ in sim._events)  # nothing due is left behind
    assert clock == sorted(clock) and sim.counts(Role.PREFILL)["ready"] == 2


def test_the_dispersion_signal_sees_clumps_that_the_rates_do_not() -> None:
    """The same 2 prompts/s of 1,000 tokens, as a Poisson stream and as clumps of 20 prompts
    within 0.1 s at Poisson times (one every 10 s on average): the rates read the same, the
    index of dispersion of the tokens counted per 5 s reads about one prompt's length for the
    stream (independent arrivals) and about one clump's tokens (20,000) for the clumps; a
    stream whose rate climbs from 0 to 20 prompts/s reads like the steady one: consecutive
    windows' differences remove the trend, which alone would add about 1,800 to a variance over
    the mean (windows from 33k to 67k tokens across the rate window at minute 10). Four
    replicas serve each clump well within its window."""
    rng = np.random.default_rng(7)
    clumps = np.cumsum(rng.exponential(10.0, 120))
    clumps = clumps[clumps < 890]
    ramp = np.sqrt(rng.uniform(0, 1, 9000)) * 900  # 0 to 20 prompts/s, linearly
    streams = {"poisson": np.sort(rng.uniform(0, 900, 1800)), "ramp": np.sort(ramp),
               "clumped": np.sort(np.repeat(clumps, 20) + rng.uniform(0, 0.1, 20 * len(clumps)))}
    seen = {}
    for name, arrivals in streams.items():
        policy = _Script({})
        run_event(_setup(prefill=4, decode=4, tick_s=15.0), _trace(arrivals, 1000, 5), policy,
                  observation_delay_s=0)
        seen[name] = {o.now_s: o.pools[("svc", Role.PREFILL)].signals for o in policy.seen
                      if RATE_WINDOW_S <= o.now_s <= 885}
    assert len(seen["clumped"]) > 30
    rates = [s[Signal.PROMPT_TOKENS_PER_S] for s in seen["clumped"].values()]
    assert 1000 < np.mean(rates) < 3000  # about the same mean load as the stream's 2,000/s
    for name, low, high in (("poisson", 500, 1800), ("ramp", 500, 1800),
                            ("clumped", 8000, 50_000)):
        values = [s[Signal.PROMPT_TOKENS_DISPERSION] for s in seen[name].values()]
        assert low < np.median(values) < high, (name, np.median(values))
    at_10m = [s for t, s in seen["ramp"].items() if 585 <= t <= 615]
    assert at_10m and all(s[Signal.PROMPT_TOKENS_PER_S] > 8 * 1000 for s in at_10m)


def test_mean_lengths_in_a_backlog_are_the_served_requests_not_a_share_of_the_arrivals() -> None:
    """One prefill replica, several times more prompt tokens arriving than it prefills: the
    queue grows, and the mean prompt length derived from the counters stays the prompts' (a
    request rate of arrivals over a token rate of what was served read a fraction of it)."""
    length = 8000
    service = H100.prefill_ms(length) / 1000
    arrivals = np.arange(0, 900, service / 8)
    policy = _Script({})
    run_event(_setup(prefill=1, decode=4, tick_s=15.0), _trace(arrivals, length, 20), policy,
              observation_delay_s=0)
    late = [o.pools[("svc", Role.PREFILL)] for o in policy.seen
            if 2 * RATE_WINDOW_S <= o.pools[("svc", Role.PREFILL)].data_time_s <= 900]
    assert late
    for pool in late:
        assert pool.signals[Signal.QUEUE_DEPTH] > 100
        assert pool.signals[Signal.REQUEST_RATE] < 0.5 * len(arrivals) / 900
        assert pool.signals[Signal.MEAN_PROMPT_TOKENS] == pytest.approx(length, rel=0.05)
