"""pdscale's policy on a simulated clock: no mocks, observations built by hand."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdscale.controller import (
    CapacityModel,
    ColdStartTracker,
    ForecastStage,
    Observation,
    PdscalePolicy,
    PoolObservation,
    PoolReplicas,
    load_profile,
)
from pdscale.controller._capacity import LENGTH_READINGS, MIN_MISS_LOAD
from pdscale.controller._perf import HEADROOM
from pdscale.controller._policy import KV_GATE, LATENCY_GATE_SHARE, QUEUE_WAIT_SHARE
from pdscale.spec import ControllerSettings, Role
from pdscale.telemetry import Signal

H100 = load_profile("h100-80gb-llama-3.1-8b")
KEY_P, KEY_D = ("svc", Role.PREFILL), ("svc", Role.DECODE)


def _policy(**kw: float) -> PdscalePolicy:
    """The policy without forecasts; ``kw``: ControllerSettings fields."""
    capacity = {KEY_P: CapacityModel(Role.PREFILL, H100, 0.5),
                KEY_D: CapacityModel(Role.DECODE, H100, 0.05)}
    return PdscalePolicy(ControllerSettings(**kw), capacity, {KEY_P: 60.0, KEY_D: 60.0},
                         forecasts=None)


def _obs(now: float, *, prompt: float | None = 20_000.0, gen: float | None = 3_000.0,
         ready: tuple[int, int] = (2, 2), starting: tuple[int, int] = (0, 0),
         desired: tuple[int, int] | None = None, ttft: float | None = 0.2,
         itl: float | None = 0.02, queue: float = 0.0, bounds: tuple[int, int] = (1, 40)
         ) -> Observation:
    desired = desired or (ready[0] + starting[0], ready[1] + starting[1])
    pools = {}
    for i, (key, signals) in enumerate((
            (KEY_P, {"prompt_tokens_per_s": prompt, "ttft_p95_s": ttft, "queue_depth": queue,
                     "prefix_cache_hit_ratio": 0.0}),
            (KEY_D, {"generation_tokens_per_s": gen, "itl_p95_s": itl, "queue_depth": 0.0}))):
        replicas = PoolReplicas(ready=ready[i], starting=starting[i], draining=0,
                                desired=desired[i], min_replicas=bounds[0],
                                max_replicas=bounds[1])
        pools[key] = PoolObservation(key, replicas, signals, now - 30)
    return Observation(now, pools)


def _desired(decisions: Mapping[object, object], key: object) -> int:
    return decisions[key].desired_replicas  # type: ignore[index,attr-defined]


def test_prefill_and_decode_are_sized_independently() -> None:
    policy = _policy()
    out = policy.decide(_obs(0, prompt=200_000.0, gen=500.0))
    per_p = policy.state[KEY_P].capacity.per_replica()
    assert _desired(out, KEY_P) == pytest.approx(200_000 / per_p, abs=1)
    assert _desired(out, KEY_D) == 2  # decode load is light: it keeps its replicas
    assert any("capacity" in r for r in out[KEY_P].reasons)


def test_missing_data_holds_and_never_scales_down() -> None:
    policy = _policy()
    out = policy.decide(_obs(0, prompt=None, gen=None, ready=(6, 5)))
    assert _desired(out, KEY_P) == 6 and _desired(out, KEY_D) == 5
    assert out[KEY_P].reasons[0].startswith("degraded:")


def test_reactive_path_drains_the_backlog_not_plus_one() -> None:
    policy = _policy()
    # 4,000 waiting prompts of ~1,500 tokens: 6 M tokens to drain within a minute.
    out = policy.decide(_obs(0, prompt=20_000.0, ttft=2.0, queue=4000.0, ready=(2, 2)))
    per_replica = out[KEY_P].detail["capacity_per_replica"]  # planned with, before learning
    lead = 60.0 + 15.0  # cold start + a tick: when new replicas are ready
    excess = max(0.0, 20_000.0 - 2 * per_replica)  # arrivals beyond the ready replicas
    backlog = 4000 * 1500 + excess * lead
    expected = 2 + math.ceil((excess + backlog / 60) / per_replica)
    assert _desired(out, KEY_P) == expected and expected >= 4
    assert out[KEY_P].detail["backlog_at_lead"] == pytest.approx(backlog)
    assert any(r.startswith("reactive:") for r in out[KEY_P].reasons)


def test_the_burst_need_carries_the_queue_and_the_ready_replicas_to_the_next_tick() -> None:
    """The policy carries each pool's queue and ready replicas to its next tick: a queue the
    ready replicas piled up (the load over their plan) is the reactive path's backlog, and
    only its growth is a clump served within the SLO; under their plan it is all clumps."""
    for prompt, piled in ((400_000.0, True), (20_000.0, False)):
        policy = _policy()
        first = policy.decide(_obs(0, prompt=prompt, ttft=2.0, queue=400.0, ready=(2, 2)))
        plan = 2 * policy.state[KEY_P].capacity.nominal_per_replica()
        assert (prompt > plan) is piled  # the premise
        assert first[KEY_P].detail["queue_before"] == 0.0
        again = policy.decide(_obs(15, prompt=prompt, ttft=2.0, queue=410.0, ready=(2, 2)))
        tokens = policy.state[KEY_P].capacity.mean_prompt_tokens
        assert again[KEY_P].detail["queue_before"] == 400.0
        assert again[KEY_P].detail["burst_backlog"] == pytest.approx(
            (10 if piled else 410) * tokens)
        assert again[KEY_P].detail["reactive"] >= 3  # the whole queue is the reactive path's
        assert policy.state[KEY_P].queue_seen == 410.0
        assert policy.state[KEY_P].ready_seen_last == 2
        # A degraded tick forgets them: the tick after reads its whole queue, as at a start.
        policy.decide(_obs(30, prompt=None, ttft=2.0, queue=420.0, ready=(2, 2)))
        after = policy.decide(_obs(45, prompt=prompt, ttft=2.0, queue=430.0, ready=(2, 2)))
        assert after[KEY_P].detail["queue_before"] == 0.0
        assert after[KEY_P].detail["burst_backlog"] == pytest.approx(430 * tokens)
        # So does a tick the pool is missing from (a source that lost it): not decided, its
        # carried queue is no longer the last tick's.
        assert policy.state[KEY_P].queue_seen == 430.0
        full = _obs(60, prompt=prompt, ttft=2.0, queue=440.0, ready=(2, 2))
        out = policy.decide(Observation(60, {KEY_D: full.pools[KEY_D]}))
        assert KEY_P not in out and policy.state[KEY_P].queue_seen == 0.0
        assert policy.state[KEY_P].ready_seen_last == 0
        back = policy.decide(_obs(75, prompt=prompt, ttft=2.0, queue=450.0, ready=(2, 2)))
        assert back[KEY_P].detail["queue_before"] == 0.0
        assert back[KEY_P].detail["burst_backlog"] == pytest.approx(450 * tokens)


def test_a_prefill_queue_is_a_backlog_only_when_it_takes_a_share_of_the_slo_to_clear(
) -> None:
    """Queued prompts the ready replicas clear well within the TTFT SLO are no backlog: no
    reactive ask and nothing learned; the same queue is one against a tight SLO."""
    for slo, fires in ((20.0, False), (0.01, True)):
        capacity = {KEY_P: CapacityModel(Role.PREFILL, H100, slo),
                    KEY_D: CapacityModel(Role.DECODE, H100, 0.05)}
        policy = PdscalePolicy(ControllerSettings(burst_window=0), capacity,
                               {KEY_P: 60.0, KEY_D: 60.0}, forecasts=None)
        cap = policy.state[KEY_P].capacity
        saturated = cap.nominal_per_replica() / HEADROOM
        wait = 10 * cap.mean_prompt_tokens / (2 * saturated)
        assert cap.prefill_queue_s(10, 2) == pytest.approx(wait)
        assert (wait > QUEUE_WAIT_SHARE * slo) is fires  # the premise: 10 queued on 2 ready
        out = policy.decide(_obs(0, prompt=20_000.0, ttft=0.001, queue=10.0, ready=(2, 2)))
        reasons = out[KEY_P].reasons
        assert any(r.startswith("reactive:") for r in reasons) is fires
        assert any(r.startswith("a backlog built") for r in reasons) is fires
        assert (cap.correction < 1.0) is fires
    # Two requests a ready replica or fewer are never a backlog, however long.
    policy = _policy()
    out = policy.decide(_obs(0, prompt=20_000.0, ttft=0.001, queue=4.0, ready=(2, 2)))
    assert not any(r.startswith("reactive:") for r in out[KEY_P].reasons)


def test_a_queue_cleared_within_the_slo_is_a_backlog_only_while_the_tail_shows_it() -> None:
    """A prefill queue that takes the ready replicas between a quarter and the whole TTFT SLO
    to clear is a backlog while the TTFT p95 is over half the SLO, or unread; with the tail
    well inside the SLO it is not (no reactive ask, nothing learned)."""
    probe = CapacityModel(Role.PREFILL, H100, 1.0)
    slo = 2 * probe.prefill_queue_s(10, 2)  # 10 queued on 2 ready clear in half the SLO
    assert QUEUE_WAIT_SHARE * slo < slo / 2 < slo
    for ttft, fires in ((0.2 * slo, False), (0.9 * LATENCY_GATE_SHARE * slo, False),
                        (1.1 * LATENCY_GATE_SHARE * slo, True), (None, True)):
        capacity = {KEY_P: CapacityModel(Role.PREFILL, H100, slo),
                    KEY_D: CapacityModel(Role.DECODE, H100, 0.05)}
        policy = PdscalePolicy(ControllerSettings(burst_window=0), capacity,
                               {KEY_P: 60.0, KEY_D: 60.0}, forecasts=None)
        out = policy.decide(_obs(0, prompt=20_000.0, ttft=ttft, queue=10.0, ready=(2, 2)))
        reasons = out[KEY_P].reasons
        assert any(r.startswith("reactive:") for r in reasons) is fires, (ttft, reasons)
        assert any(r.startswith("a backlog built") for r in reasons) is fires


def test_a_decode_queue_is_a_backlog_only_while_step_time_or_memory_is_short() -> None:
    """A decode queue over the count (3 waiting on 1 ready) is a backlog while the ITL p95 is
    over the step share the capacity model plans for (HEADROOM of the SLO), the KV cache is
    KV_GATE full or the running sequences fill that share of the batch the replica holds, or
    any of these is unread; with step time, memory and batch to spare it is not (on the real
    stack such queues added decode workers three times, for nothing)."""
    slo = 0.05
    limit = CapacityModel(Role.DECODE, H100, slo).decode_batch_limit()
    few = 0.5 * limit
    cases = ((0.5 * slo, 0.4, few, False), (0.9 * HEADROOM * slo, 0.9 * KV_GATE, few, False),
             (0.5 * slo, 0.4, 0.9 * KV_GATE * limit, False),
             (1.1 * HEADROOM * slo, 0.4, few, True), (0.5 * slo, KV_GATE, few, True),
             (0.5 * slo, 0.4, float(limit), True),
             (None, 0.4, few, True), (0.5 * slo, None, few, True), (0.5 * slo, 0.4, None, True))
    for itl, kv, running, fires in cases:
        policy = _policy(burst_window=0)
        obs = _obs(0, gen=500.0, itl=itl, ready=(2, 1))
        signals = obs.pools[KEY_D].signals
        signals["queue_depth"] = 3.0  # type: ignore[index]
        if kv is not None:
            signals["kv_cache_usage_ratio"] = kv  # type: ignore[index]
        if running is not None:
            signals["running_requests"] = running  # type: ignore[index]
        out = policy.decide(obs)
        reasons = out[KEY_D].reasons
        assert any(r.startswith("reactive:") for r in reasons) is fires, (itl, kv, running,
                                                                          reasons)
        assert (policy.state[KEY_D].capacity.correction < 1.0) is fires


def test_a_decode_pools_running_sequences_are_weighed_against_its_draining_replicas_too(
) -> None:
    """The running count covers draining replicas (the engines' and the event simulator's), so
    the batch gate weighs it against the room of ready and draining replicas: 1.2 batches'
    worth of KV_GATE running on 1 ready + 1 draining is not full (the ready-only gate had called
    it a backlog and taught the model a false miss); 2.1 batches' worth is."""
    limit = CapacityModel(Role.DECODE, H100, 0.05).decode_batch_limit()
    for share, fires in ((1.2, False), (2.1, True)):
        policy = _policy(burst_window=0)
        obs = _obs(0, gen=500.0, itl=0.01, ready=(2, 1))
        pool = obs.pools[KEY_D]
        pool.signals.update({"queue_depth": 3.0, "kv_cache_usage_ratio": 0.4,  # type: ignore[attr-defined]
                             "running_requests": share * KV_GATE * limit})
        obs.pools[KEY_D] = dataclasses.replace(  # type: ignore[index]
            pool, replicas=dataclasses.replace(pool.replicas, draining=1))
        reasons = policy.decide(obs)[KEY_D].reasons
        assert any(r.startswith("reactive:") for r in reasons) is fires, (share, reasons)
        assert (policy.state[KEY_D].capacity.correction < 1.0) is fires


def test_decode_learns_its_running_sequences_spread_from_its_own_readings() -> None:
    """The policy keeps the running sequences it reads over the rate window: swinging
    readings size decode for their 95th percentile (a "tail" reason, once four readings are
    in); a sample read again at a later tick is not a new reading, and readings older than the
    window leave it."""
    policy = _policy(burst_window=0)
    swing = (100.0, 400.0, 100.0, 400.0, 100.0)
    for i, running in enumerate(swing):
        obs = _obs(15 * i, gen=500.0)
        obs.pools[KEY_D].signals["running_requests"] = running  # type: ignore[index]
        out = policy.decide(obs)
        tailed = any(r.startswith("tail: running sequences") for r in out[KEY_D].reasons)
        assert tailed is (i >= 3), (i, out[KEY_D].reasons)
    assert out[KEY_D].detail["running_spread"] == pytest.approx(300 * 1.4826 / math.sqrt(2))
    state = policy.state[KEY_D]
    assert len(state.running_seen) == 5
    # The same sample again (its data time unchanged) adds no reading.
    last = state.running_seen[-1][0]
    assert len(state.running_readings(last, 400.0, 300.0)) == 5
    # Within half a second it is the same sample (its time is the tick's less its age).
    assert len(state.running_readings(last + 0.3, 400.0, 300.0)) == 5
    assert len(state.running_readings(last + 1.0, 400.0, 300.0)) == 6
    last += 1.0
    assert len(state.running_readings(last + 15, math.nan, 300.0)) == 6  # unread: none added
    # Ten minutes on, the old readings have left the window.
    assert state.running_readings(last + 600, 250.0, 300.0) == [250.0]


def test_scale_down_waits_for_stabilisation_and_steps() -> None:
    policy = _policy(stabilisation=300, max_step_down=2, burst_window=0)
    high = policy.decide(_obs(0, prompt=300_000.0))
    up = _desired(high, KEY_P)
    seen = []
    for t in range(15, 900, 15):
        out = policy.decide(_obs(t, prompt=10_000.0, ready=(up, 2)))
        seen.append(_desired(out, KEY_P))
        up = _desired(out, KEY_P)
    assert seen[0] == seen[15] == _desired(high, KEY_P)  # held for the window
    steps = [a - b for a, b in itertools.pairwise(seen)]
    assert max(steps) <= 2 and seen[-1] < seen[0]


def test_a_recent_burst_holds_capacity_that_decays_then_lets_go() -> None:
    policy = _policy(stabilisation=120, max_step_down=8, burst_window=600)  # half-life 200 s
    up = _desired(policy.decide(_obs(0, prompt=300_000.0)), KEY_P)
    seen = {}
    for t in range(15, 1800, 15):
        out = policy.decide(_obs(t, prompt=10_000.0, ready=(up, 2)))
        up = seen[t] = _desired(out, KEY_P)
        if t == 300:
            assert any("burst hold" in r for r in out[KEY_P].reasons)
    # Whole for a half-life (200 s) plus stabilisation (120 s), then halving every half-life:
    # about half the burst's replicas one half-life later, not the whole peak for a fixed
    # window and nothing after it.
    assert seen[315] == seen[15]
    assert seen[15] > seen[525] > seen[915] > seen[1785] == 1
    assert seen[525] >= seen[15] // 2 - 1


def test_decode_is_sized_for_the_sequences_it_holds() -> None:
    policy = _policy(burst_window=0)
    obs = _obs(0, gen=3_000.0, ready=(2, 2))
    batch = policy.state[KEY_D].capacity.decode_batch()
    obs.pools[KEY_D].signals["running_requests"] = 3.0 * batch  # type: ignore[index]
    obs.pools[KEY_D].signals["queue_depth"] = 2.5 * batch  # type: ignore[index]
    out = policy.decide(obs)
    # 3,000 tokens/s alone fits one replica; 5.5 batches of sequences need six.
    assert _desired(out, KEY_D) == 6
    assert out[KEY_D].detail["sequences"] == pytest.approx(5.5 * batch)
    # A flood on an idle pool: the queue counts up to what runs; the rest is the backlog the
    # reactive path drains, not a replica per queued batch.
    obs.pools[KEY_D].signals["running_requests"] = float(batch)  # type: ignore[index]
    obs.pools[KEY_D].signals["queue_depth"] = 100.0 * batch  # type: ignore[index]
    flood = policy.decide(obs)[KEY_D]
    assert flood.detail["sequences"] == pytest.approx(2 * batch)
    assert flood.desired_replicas < 40 and flood.cause == "reactive"


def test_a_drained_decode_queue_does_not_hold_replicas_for_the_burst_window() -> None:
    policy = _policy(stabilisation=120, max_step_down=8, burst_window=900)
    batch = policy.state[KEY_D].capacity.decode_batch()

    def decode(t: float, running: float, queue: float, ready: int) -> int:
        obs = _obs(t, gen=3_000.0, ready=(2, ready))
        obs.pools[KEY_D].signals["running_requests"] = running  # type: ignore[index]
        obs.pools[KEY_D].signals["queue_depth"] = queue  # type: ignore[index]
        return _desired(policy.decide(obs), KEY_D)

    # A minute of backlog (prefill just caught up): 4 batches running, 4 waiting.
    ready = decode(0, 4.0 * batch, 4.0 * batch, 4)
    assert ready >= 8
    # The queue is gone and one batch runs: scaled down once stabilisation has passed,
    # long before the burst window (which remembers the 4 running batches, not the 8).
    seen = {}
    for t in range(15, 600, 15):
        ready = seen[t] = decode(t, float(batch), 0.0, ready)
    # Back to about the running load the window remembers (4 batches; the backlog also
    # lowered the capacity estimate a little), where the queue would have held 8 or more.
    assert seen[15] >= 8 and seen[300] <= 5


def test_a_ttft_miss_while_decode_is_backlogged_is_not_prefill_s() -> None:
    def run(decode_queue: float) -> tuple[int, tuple[str, ...], float]:
        policy = _policy(burst_window=0)
        for t in range(0, 300, 15):  # at 70 % of the planned load, which a miss teaches
            obs = _obs(t, prompt=100_000.0, ttft=3.0, ready=(4, 2))
            obs.pools[KEY_D].signals["queue_depth"] = decode_queue  # type: ignore[index]
            out = policy.decide(obs)
        return (_desired(out, KEY_P), out[KEY_P].reasons,
                policy.state[KEY_P].capacity.correction)

    alone, reasons, correction = run(decode_queue=0.0)
    assert alone == 5 and correction < 1.0  # prefill's own miss: one more, a lower estimate
    blamed, reasons, correction = run(decode_queue=500.0)
    assert blamed == 4 and correction == 1.0
    assert any("decode's miss" in r for r in reasons)


def test_a_ttft_miss_soon_after_a_decode_backlog_is_still_decode_s() -> None:
    """The recorded TTFT p95 is over 5 minutes: once decode catches up it still carries the
    waits for decode slots, and prefill must not react to them; after the window it does."""
    policy = _policy(burst_window=0)
    for t in range(0, 120, 15):  # decode backlogged, TTFT high
        obs = _obs(t, prompt=20_000.0, ttft=3.0, ready=(4, 2))
        obs.pools[KEY_D].signals["queue_depth"] = 500.0  # type: ignore[index]
        policy.decide(obs)
    for t in range(120, 400, 15):  # decode caught up; TTFT p95 still high from its waits
        out = policy.decide(_obs(t, prompt=20_000.0, ttft=3.0, ready=(4, 2)))
        if t < 120 + 300 - 15:
            assert _desired(out, KEY_P) <= 4, (t, out[KEY_P].reasons)  # no reaction
            assert any("decode's miss" in r for r in out[KEY_P].reasons)
    later = policy.decide(_obs(500, prompt=20_000.0, ttft=3.0, ready=(4, 2)))
    assert _desired(later, KEY_P) == 5  # a miss of prefill's own, well after the backlog


def test_decode_capacity_uses_the_service_prompt_length_when_decode_lacks_it() -> None:
    def decode_capacity(where: str) -> float:
        policy = _policy()
        for t in range(0, 600, 15):
            obs = _obs(t)
            obs.pools[KEY_D if where == "decode" else KEY_P].signals[  # type: ignore[index]
                Signal.MEAN_PROMPT_TOKENS] = 200.0
            policy.decide(obs)
        return policy.state[KEY_D].capacity.per_replica()

    default = _policy().state[KEY_D].capacity.per_replica()  # 1,500-token prompts assumed
    assert decode_capacity("prefill") == pytest.approx(decode_capacity("decode"))
    assert decode_capacity("prefill") > 1.2 * default


def test_a_waiting_queue_at_planned_load_lowers_the_capacity_estimate() -> None:
    model = CapacityModel(Role.DECODE, H100, 0.05)
    planned = model.per_replica()
    for i in range(20):  # ITL is fine, but requests wait for a decode slot
        model.observe_latency(latency_p95_s=0.02, demand_per_replica=0.5 * planned,
                              backlogged=True)
        if i == 0:
            assert model.last_learned is not None
            assert model.last_learned.startswith("a backlog built at 50%")
    assert model.correction < 0.8
    slack = CapacityModel(Role.DECODE, H100, 0.05)
    for _ in range(20):  # decode's slack below the planned load is the headroom, not an error
        slack.observe_latency(latency_p95_s=0.01, demand_per_replica=0.8 * slack.per_replica())
    assert slack.correction == 1.0
    # A backlog above the planned load is not slack, however low the p95 still is.
    busy = CapacityModel(Role.PREFILL, H100, 0.5)
    for _ in range(20):
        busy.observe_latency(latency_p95_s=0.05, demand_per_replica=1.5 * busy.per_replica(),
                             backlogged=True)
    assert busy.correction == 1.0 and busy.last_learned is None


def test_misses_at_the_planned_load_teach_a_standing_need_within_minutes() -> None:
    """Clumped arrivals miss the SLO at a mean load the profile says fits: a steady pool that
    misses at 75 % of its planned load learns, within two minutes, to plan under that load."""
    model = CapacityModel(Role.PREFILL, H100, 0.5)
    planned = model.per_replica()
    model.observe_latency(latency_p95_s=0.9, demand_per_replica=0.75 * planned,
                          now_s=0.0)
    assert model.last_learned is not None and "75% of the planned load" in model.last_learned
    t = 15.0
    for _ in range(7):  # two minutes of 15 s ticks
        model.observe_latency(latency_p95_s=0.9, demand_per_replica=0.75 * planned,
                              now_s=t)
        t += 15
    assert model.correction == pytest.approx(0.75 * 0.9, abs=0.06)
    # Bounded by the load it was seen at: many more misses there do not run it down further.
    for _ in range(100):
        model.observe_latency(latency_p95_s=0.9, demand_per_replica=0.75 * planned,
                              now_s=t)
        t += 15
    assert model.correction >= 0.6
    # Hours without misses give it back slowly (about 1 - e^-1 of the way in two hours).
    low = model.correction
    for _ in range(480):
        model.observe_latency(latency_p95_s=0.2, demand_per_replica=0.5 * model.per_replica(),
                              now_s=t)
        t += 15
    assert low < model.correction < 1.0
    assert model.correction == pytest.approx(1 - (1 - low) * math.exp(-1), abs=0.02)


def test_the_load_a_miss_is_learned_at_is_the_latency_window_s() -> None:
    """The p95 of a window that straddles a scale-up still carries the smaller pool's misses:
    the load per replica it is compared with is averaged over the same window."""
    policy = _policy(burst_window=0)
    for t in range(0, 300, 15):  # 2 ready for 300 s, latency fine
        policy.decide(_obs(t, prompt=50_000.0, ttft=0.2, ready=(2, 2)))
    for t in range(300, 360, 15):  # 4 ready for the last minute; the window's p95 misses
        out = policy.decide(_obs(t, prompt=50_000.0, ttft=0.9, ready=(4, 2)))
    seen = [n for _, n in policy.state[KEY_P].ready_seen]
    mean = sum(seen) / len(seen)
    assert 2 < mean < 3  # 16 ticks of 2 and 4 of 4 (inside 300 s, ending at the last tick)
    planned = out[KEY_P].detail["capacity_per_replica"]
    learned = next(r for r in out[KEY_P].reasons if "missed the SLO at" in r)
    assert f"at {50_000.0 / mean / planned:.0%} of the planned load: capacity correction" \
        in learned  # per 4 ready it would read under MIN_MISS_LOAD and teach nothing


def test_a_miss_the_mean_load_cannot_explain_teaches_nothing() -> None:
    """A latency miss with no backlog far under the planned load (a clump within seconds, or
    a prompt too long for the SLO) says nothing about the mean capacity: the estimate stays,
    however long the miss stays in the latency window. It used to move halfway down on every
    such tick, so one burst ran it to its floor (0.3) for the hour."""
    model = CapacityModel(Role.PREFILL, H100, 0.5)
    planned = model.per_replica()
    for t in range(0, 300, 15):
        model.observe_latency(latency_p95_s=9.0, demand_per_replica=0.2 * planned,
                              now_s=float(t))
    assert model.correction == 1.0
    assert model.last_learned is not None
    assert "at 20% of the planned load, which the load does not explain" in \
        model.last_learned and "capacity unchanged" in model.last_learned
    # At the gate's share it learns; a backlog teaches at any load (the queue explains it).
    at_gate = CapacityModel(Role.PREFILL, H100, 0.5)
    at_gate.observe_latency(latency_p95_s=9.0, demand_per_replica=MIN_MISS_LOAD * planned)
    assert at_gate.correction < 1.0
    queued = CapacityModel(Role.PREFILL, H100, 0.5)
    queued.observe_latency(latency_p95_s=9.0, demand_per_replica=0.2 * planned,
                           backlogged=True)
    assert queued.correction < 1.0
    # Decode has no tail model: its misses are learned at any load, as before.
    decode = CapacityModel(Role.DECODE, H100, 0.05)
    decode.observe_latency(latency_p95_s=0.09, demand_per_replica=0.2 * decode.per_replica())
    assert decode.correction < 1.0 and decode.last_learned is not None
    assert "capacity correction towards" in decode.last_learned


def test_ticks_that_miss_are_not_time_without_misses() -> None:
    """The correction relaxes back towards 1 over hours without misses; an hour of misses it
    learned nothing from (under the gate, or over the planned load) is not such an hour."""
    def relaxed_after(latency: float, demand_share: float) -> float:
        model = CapacityModel(Role.PREFILL, H100, 0.5)
        model.correction = 0.5
        model.observe_latency(latency_p95_s=0.2, demand_per_replica=0.1 * model.per_replica(),
                              now_s=0.0)
        for t in range(15, 3600, 15):
            model.observe_latency(latency_p95_s=latency,
                                  demand_per_replica=demand_share * model.per_replica(),
                                  now_s=float(t))
        assert latency < model.slo_s or model.correction == 0.5  # misses taught nothing
        model.observe_latency(latency_p95_s=0.2, demand_per_replica=0.1 * model.per_replica(),
                              now_s=3600.0)
        return model.correction

    one_tick = 0.5 + 0.5 * (1 - math.exp(-15 / 7200))
    assert relaxed_after(9.0, 0.2) == pytest.approx(one_tick)  # misses under the gate
    assert relaxed_after(9.0, 1.5) == pytest.approx(one_tick)  # misses over the planned load
    hour = 0.5 + 0.5 * (1 - math.exp(-3600 / 7200))
    assert relaxed_after(0.2, 0.1) == pytest.approx(hour)  # an hour within the SLO


def test_slack_is_read_at_the_mean_load_not_the_busiest_minute() -> None:
    """Slack raises the estimate by what the window's mean load allows: a busy minute within a
    quieter window that met the SLO says little about capacity. At 64 % of the saturated
    throughput (0.8 of the plan) a p95 of 0.2 s against 0.5 s allows no more than the plan;
    read at the busiest minute's 92 % it would have allowed 93 %."""
    model = CapacityModel(Role.PREFILL, H100, 0.5)
    planned = model.per_replica()
    for _ in range(20):
        model.observe_latency(latency_p95_s=0.2, demand_per_replica=0.8 * planned,
                              peak_per_replica=1.15 * planned)
    assert model.correction == 1.0 and model.last_learned is None
    model.observe_latency(latency_p95_s=0.1, demand_per_replica=1.15 * planned)
    assert model.correction > 1.0 and model.last_learned is not None
    assert model.last_learned.startswith("TTFT p95 0.1s at 92% of the saturated throughput")
    decode = CapacityModel(Role.DECODE, H100, 0.05)
    decode.observe_latency(latency_p95_s=0.01, demand_per_replica=1.2 * decode.per_replica())
    assert decode.correction > 1.0 and decode.last_learned is not None
    assert decode.last_learned.startswith("ample slack at 120%")


def test_a_decode_backlog_reason_says_how_much_of_the_plan_runs_and_teaches_as_before() -> None:
    """A decode backlog read over a window whose mean load is under the plan while the
    sequences running now fill more than the plan's batch (a rise within the window, replicas
    slower than the profile, or a correction under 1): the reason says how much of the plan
    runs, and the lesson is the one the window's mean load teaches without the running count
    (lowering the estimate after ServeGen's rises keeps headroom for the next: learning at the
    load now cost 0.11-0.13 points)."""
    def backlog(running: float | None) -> CapacityModel:
        model = CapacityModel(Role.DECODE, H100, 0.05)
        model.observe_latency(latency_p95_s=0.02, demand_per_replica=0.82 * model.per_replica(),
                              backlogged=True, running_per_replica=running)
        return model

    batch = CapacityModel(Role.DECODE, H100, 0.05)._decode_point().batch
    full, steady, unread = backlog(1.36 * batch), backlog(0.8 * batch), backlog(None)
    assert full.correction == steady.correction == unread.correction < 1.0
    assert full.last_learned is not None and steady.last_learned is not None
    assert full.last_learned.startswith("a backlog built at 82% of the planned load, with 136% "
                                        "of the planned sequences running now: capacity "
                                        "correction towards")
    assert "running now" not in steady.last_learned
    assert steady.last_learned == unread.last_learned


def test_the_policy_reads_the_running_sequences_into_a_decode_lesson() -> None:
    """The policy hands the decode model the sequences each serving replica runs now (the
    engines' count covers draining replicas too): two ready replicas and one draining, full at
    the plan's batch, a queue and a full cache, at 80 % of the planned load over the
    window."""
    policy = _policy()
    cap = policy.state[KEY_D].capacity
    batch = cap._decode_point().batch
    obs = _obs(0, gen=0.8 * 2 * cap.per_replica())
    signals = dict(obs.pools[KEY_D].signals)
    signals.update({Signal.QUEUE_DEPTH: 50.0, Signal.KV_CACHE_USAGE_RATIO: 0.99,
                    Signal.RUNNING_REQUESTS: 3.0 * batch})
    pool = obs.pools[KEY_D]
    replicas = PoolReplicas(ready=2, starting=0, draining=1, desired=2, min_replicas=1,
                            max_replicas=40)
    obs = Observation(0, {**obs.pools, KEY_D: PoolObservation(KEY_D, replicas, signals,
                                                              pool.data_time_s)})
    out = policy.decide(obs)
    assert any(r.startswith("a backlog built at 80% of the planned load, with 100% of the "
                            "planned sequences running now") for r in out[KEY_D].reasons), \
        out[KEY_D].reasons
    assert cap.correction < 1.0


def test_the_length_mix_is_the_mean_of_the_first_readings_then_tracked_slowly() -> None:
    """A pool of 12k-token prompts is planned for them from its first reading: the length mix
    is the mean of the readings so far, not a walk from the model's default (1,500 + 200
    tokens), from which 5 % a tick took Mooncake's prefill model about ten minutes to reach its
    prompts, sizing its pool meanwhile as if they were short. One unrepresentative early
    reading (a warm-up prompt of 5 tokens) weighs no more than those after it; after
    LENGTH_READINGS readings each moves the mix 1/LENGTH_READINGS of the way."""
    model = CapacityModel(Role.PREFILL, H100, 5.0)
    default = model.saturated_prefill()
    for skipped in (None, 0.0, -1.0, math.nan, math.inf):
        model.observe_lengths(skipped, skipped)
    assert (model.mean_prompt_tokens, model.mean_output_tokens) == (1500.0, 200.0)
    model.observe_lengths(12_000.0, None)
    assert (model.mean_prompt_tokens, model.mean_output_tokens) == (12_000.0, 200.0)
    assert model.saturated_prefill() < 0.8 * default
    model.observe_lengths(13_000.0, 300.0)
    assert model.mean_prompt_tokens == pytest.approx(12_500.0)
    assert model.mean_output_tokens == 300.0
    warm = CapacityModel(Role.PREFILL, H100, 5.0)
    for prompt in (5.0, *[12_000.0] * 9):
        warm.observe_lengths(prompt, None)
    assert warm.mean_prompt_tokens == pytest.approx((5 + 9 * 12_000) / 10)
    for _ in range(LENGTH_READINGS):
        warm.observe_lengths(12_000.0, None)
    settled = warm.mean_prompt_tokens
    warm.observe_lengths(14_000.0, None)
    assert warm.mean_prompt_tokens == pytest.approx(settled + (14_000 - settled) / LENGTH_READINGS)


def test_a_decode_pool_without_a_prompt_length_of_its_own_takes_the_services() -> None:
    """Decode engines may export no prompt length (or a NaN one, 0/0 over an idle window): the
    decode model then takes the length its service's prefill pool reads, so both plan for the
    same prompts. The service's length is the first usable one, whichever pool is listed first:
    a decode pool reading inf before its prefill pool does not stand for the service."""
    for own, order in itertools.product((None, math.nan, 0.0, math.inf),
                                        ((KEY_P, KEY_D), (KEY_D, KEY_P))):
        policy = _policy()
        obs = _obs(0)
        pools = {}
        for key in order:
            pool = obs.pools[key]
            length = 12_000.0 if key == KEY_P else own
            signals = {**pool.signals, Signal.MEAN_PROMPT_TOKENS: length}
            pools[key] = PoolObservation(key, pool.replicas, signals, pool.data_time_s)
        policy.decide(Observation(0, pools))
        assert policy.state[KEY_D].capacity.mean_prompt_tokens == 12_000.0, (own, order)


def _kingman_allows(p95: float, slo: float, rho: float) -> float:
    """The utilisation at which p95 x f(rho') / f(rho) reaches half the SLO, f = x / (1 - x)."""
    grow = 0.5 * slo / p95 * rho / (1 - rho)
    return grow / (1 + grow)


def test_prefill_slack_raises_the_estimate_as_far_as_queueing_allows() -> None:
    """A prefill pool well within its TTFT SLO near its planned load learns, within minutes,
    to plan for the utilisation at which its p95, grown as queueing grows it (rho / (1 -
    rho)), would reach half the SLO; no further however long the slack lasts, never past 95 %
    of the saturated throughput, and not at all from a quiet pool or a p95 already near the
    SLO. Misses still lower it."""
    model = CapacityModel(Role.PREFILL, H100, 0.5)
    saturated, planned = model.saturated_prefill(), model.per_replica()
    assert planned == pytest.approx(HEADROOM * saturated)
    demand = 0.8 * planned  # 64 % of the saturated throughput
    allowed = _kingman_allows(0.08, 0.5, demand / saturated)
    assert HEADROOM < allowed < 0.95
    for _ in range(40):  # ten minutes of 15 s ticks at a p95 of 80 ms
        model.observe_latency(latency_p95_s=0.08, demand_per_replica=demand)
    assert model.correction == pytest.approx(allowed / HEADROOM, rel=0.02)
    for _ in range(400):  # settled: no further
        model.observe_latency(latency_p95_s=0.08, demand_per_replica=demand)
    assert model.correction <= allowed / HEADROOM + 1e-9
    assert model.per_replica() <= allowed * saturated + 1e-6

    capped = CapacityModel(Role.PREFILL, H100, 0.5)
    for _ in range(400):  # a p95 of 10 ms at 90 % of saturated would allow more: capped
        capped.observe_latency(latency_p95_s=0.01, demand_per_replica=0.9 * saturated)
    assert 0.94 * saturated < capped.per_replica() <= 0.95 * saturated

    # A quiet pool (at 0.4 of the plan a p95 of 5 ms would allow the cap), a p95 over half
    # the SLO, a pool near saturation, and a p95 that is not a number teach nothing.
    for p95, demand in ((0.005, 0.4 * planned), (0.3, 0.8 * planned),
                        (0.2, 0.96 * saturated), (math.nan, 0.8 * planned)):
        still = CapacityModel(Role.PREFILL, H100, 0.5)
        for _ in range(40):
            still.observe_latency(latency_p95_s=p95, demand_per_replica=demand)
        assert still.correction == 1.0 and still.last_learned is None

    for _ in range(8):  # two minutes of misses at the raised plan's load
        model.observe_latency(latency_p95_s=0.9, demand_per_replica=0.9 * model.per_replica())
    assert model.correction < 1.0


def test_prefill_slack_lifts_a_lowered_estimate_only_as_far_as_it_shows() -> None:
    """An estimate the misses lowered (0.6) rises again where the p95 shows slack at the load,
    to what the queueing extrapolation allows, not to 1 whatever the p95; with a p95 over half
    the SLO only the relaxation over hours moves it."""
    def ten_minutes(p95: float, share: float) -> CapacityModel:
        model = CapacityModel(Role.PREFILL, H100, 0.5)
        model.correction = 0.6
        for t in range(0, 600, 15):
            model.observe_latency(latency_p95_s=p95,
                                  demand_per_replica=share * model.nominal_per_replica(),
                                  now_s=float(t))
        return model

    assert ten_minutes(0.06, 0.7).correction > 1.0
    near = ten_minutes(0.2, 0.6)
    nominal, saturated = near.nominal_per_replica(), near.saturated_prefill()
    # At 48 % of the saturated throughput a p95 of 0.2 s allows 54 %, 0.67 of the plan: more
    # than ten minutes' relaxation gives (0.63), far from 1.
    allowed = _kingman_allows(0.2, 0.5, 0.6 * nominal / saturated)
    assert near.correction == pytest.approx(allowed * saturated / nominal, abs=0.006)
    relaxed = 1 - 0.4 * math.exp(-585 / 7200)
    assert relaxed < near.correction < 0.7
    assert ten_minutes(0.3, 0.6).correction == pytest.approx(relaxed, abs=1e-3)


def test_prefill_slack_under_half_the_plan_lifts_a_lowered_estimate_back_to_the_profile() -> None:
    """After a rise from a quiet stretch, misses the starting replicas explain lower the
    estimate (0.35), and the pool it sizes carries its load at a quarter of the profile's plan
    with a p95 a tenth of the SLO: that slack lifts the estimate within minutes, not over the
    hours the relaxation takes; never past the profile's (1) at such a load, however small
    the p95, and not at all with a p95 over half the SLO or no load."""
    def minutes(p95: float | None, share: float, start: float, n: int = 40) -> CapacityModel:
        model = CapacityModel(Role.PREFILL, H100, 0.5)
        model.correction = start
        for t in range(0, 15 * n, 15):
            model.observe_latency(latency_p95_s=p95,
                                  demand_per_replica=share * model.nominal_per_replica(),
                                  now_s=float(t))
        return model

    relaxed = 1 - 0.65 * math.exp(-585 / 7200)  # ten minutes' relaxation alone: 0.40
    lifted = minutes(0.05, 0.25, 0.35)
    # At 20 % of the saturated throughput a p95 of 50 ms allows 56 %: 0.69 of the plan.
    allowed = _kingman_allows(0.05, 0.5, 0.25 * HEADROOM)
    assert lifted.correction == pytest.approx(allowed / HEADROOM, abs=0.01)
    assert lifted.correction > relaxed + 0.25
    assert lifted.last_learned is not None and "at most the profile's" in lifted.last_learned
    # A p95 of 5 ms would allow 95 %: at a quarter of the plan, only back to 1.
    settled = minutes(0.005, 0.25, 0.35, n=400).correction
    assert 0.99 < settled <= 1.0
    quiet = minutes(0.005, 0.25, 1.0)
    assert quiet.correction == 1.0 and quiet.last_learned is None
    above = minutes(0.005, 0.25, 1.2)  # what slack at the plan's load raised stays
    assert above.correction == 1.2 and above.last_learned is None
    at_half = minutes(0.005, 0.5, 1.0)  # from half the plan on, the plan may rise over it
    assert at_half.correction > 1.1
    assert minutes(0.3, 0.25, 0.35).correction == pytest.approx(relaxed, abs=1e-3)
    idle = minutes(0.05, 0.0, 0.35)  # no load: no reading at all
    assert idle.correction == 0.35 and idle.last_learned is None


def test_prefill_slack_never_loses_the_relaxation_it_overlaps() -> None:
    """A lowered estimate relaxes over the time since the last tick read; a tick whose slack
    allows a little more moves it at least as far as the relaxation would have (an hour
    without a latency reading, then one such tick)."""
    def after_an_hour(p95: float) -> float:
        model = CapacityModel(Role.PREFILL, H100, 0.5)
        model.correction = 0.5
        nominal = model.nominal_per_replica()
        model.observe_latency(latency_p95_s=0.2, demand_per_replica=0.1 * nominal, now_s=0.0)
        for t in range(15, 3600, 15):  # latency unread: no lesson, the clock runs
            model.observe_latency(latency_p95_s=None, demand_per_replica=0.6 * nominal,
                                  now_s=float(t))
        model.observe_latency(latency_p95_s=p95, demand_per_replica=0.6 * nominal,
                              now_s=3600.0)
        return model.correction

    hour = 0.5 + 0.5 * (1 - math.exp(-3600 / 7200))
    assert after_an_hour(0.2) == pytest.approx(hour)  # slack allows 0.67: relaxation's larger
    assert after_an_hour(0.3) == pytest.approx(hour)  # no slack: the relaxation alone


def test_a_miss_is_learned_at_its_busiest_minute_s_load() -> None:
    """The latency window's p95 most likely missed in its busiest minute: the load a miss is
    learned at is the larger of the window's mean and that minute's, so the estimate moves
    towards 0.9 of what a replica carried then (and stops once the plan no longer carries that
    minute: a miss over the planned load was expected), not of the window's quieter mean."""
    model = CapacityModel(Role.PREFILL, H100, 0.5)
    planned = model.per_replica()
    for t in range(0, 600, 15):
        model.observe_latency(latency_p95_s=2.0, demand_per_replica=0.1 * planned,
                              peak_per_replica=0.8 * planned, now_s=float(t))
    assert 0.9 * 0.8 <= model.correction <= 0.8
    assert model.last_learned is None  # settled: the busiest minute is over the planned load
    once = CapacityModel(Role.PREFILL, H100, 0.5)
    once.observe_latency(latency_p95_s=2.0, demand_per_replica=0.1 * planned,
                         peak_per_replica=0.8 * planned)
    assert once.last_learned is not None and "at 80% of the planned load (its busiest " \
        "minute): capacity correction towards 0.72" in once.last_learned
    # A peak under the mean, or unreadable, is not the load: the mean is.
    for peak in (0.05 * planned, math.nan, math.inf):
        other = CapacityModel(Role.PREFILL, H100, 0.5)
        other.observe_latency(latency_p95_s=2.0, demand_per_replica=0.7 * planned,
                              peak_per_replica=peak)
        assert other.last_learned is not None
        assert "at 70% of the planned load: capacity correction towards 0.63" in \
            other.last_learned


def test_one_burst_minute_in_the_latency_window_does_not_run_the_estimate_down() -> None:
    """A burst minute misses the SLO on a pool whose 5-minute mean load is low; the 5-minute
    p95 keeps the miss for five minutes. The estimate settles at the burst minute's load per
    replica (the peak minute's rate), and without that signal it is not moved at all."""
    def run(peak: float | None) -> tuple[float, list[str]]:
        policy = _policy(burst_window=0)
        reasons: list[str] = []
        for t in range(0, 300, 15):
            obs = _with(_obs(t, prompt=15_000.0, ttft=9.0, ready=(6, 2)), KEY_P,
                        prompt_tokens_peak_per_s=peak)
            reasons += policy.decide(obs)[KEY_P].reasons
        return policy.state[KEY_P].capacity.correction, reasons

    planned = _policy().state[KEY_P].capacity.per_replica()
    busiest = 150_000.0 / 6 / planned
    correction, reasons = run(150_000.0)
    assert 0.9 * busiest - 0.01 <= correction <= busiest  # run to the floor before
    assert any("(its busiest minute)" in r for r in reasons)
    correction, reasons = run(None)
    assert correction == 1.0
    assert any("does not explain" in r for r in reasons)


def test_the_busiest_minute_is_per_replica_of_the_latency_window() -> None:
    """The peak minute is divided by the ready replicas averaged over the latency window, as
    the mean load is: the window's p95 carries the smaller pool's misses."""
    policy = _policy(burst_window=0)
    for t in range(0, 240, 15):  # 2 ready, latency fine
        policy.decide(_with(_obs(t, prompt=10_000.0, ttft=0.2, ready=(2, 2)), KEY_P,
                            prompt_tokens_peak_per_s=10_000.0))
    for t in range(240, 300, 15):  # 4 ready; a busy minute in the window, the p95 misses
        out = policy.decide(_with(_obs(t, prompt=10_000.0, ttft=0.9, ready=(4, 2)), KEY_P,
                                  prompt_tokens_peak_per_s=60_000.0))
    seen = [n for _, n in policy.state[KEY_P].ready_seen]
    mean = sum(seen) / len(seen)
    assert 2 < mean < 3
    planned = out[KEY_P].detail["capacity_per_replica"]
    learned = next(r for r in out[KEY_P].reasons if "missed the SLO at" in r)
    assert f"at {60_000.0 / mean / planned:.0%} of the planned load (its busiest minute)" \
        in learned  # per the 4 ready now: under MIN_MISS_LOAD, and nothing learned


def test_a_restarted_controller_sizes_from_history_at_once() -> None:
    """A start (or restart) reads the demand history the forecasts are warmed with: a burst
    10 minutes ago is held (decayed) from the first decision, not re-learned from the
    minimum over cold starts."""
    settings = ControllerSettings(burst_window=900)  # half-life 300 s
    stage = ForecastStage({KEY_P: 75.0, KEY_D: 75.0}, settings)
    times = [float(t) for t in range(0, 3600, 60)]
    stage.warm(KEY_P, times, [200_000.0 if t == 3000 else 20_000.0 for t in times])
    capacity = {KEY_P: CapacityModel(Role.PREFILL, H100, 0.5),
                KEY_D: CapacityModel(Role.DECODE, H100, 0.05)}
    policy = PdscalePolicy(settings, capacity, {KEY_P: 60.0, KEY_D: 60.0}, forecasts=stage)
    out = policy.decide(_obs(3600.0, prompt=20_000.0, ready=(1, 2)))
    per_replica = policy.state[KEY_P].capacity.per_replica()
    held = 200_000.0 * 0.5 ** ((600 - 300) / 300)  # whole for a half-life, then halving
    assert _desired(out, KEY_P) == math.ceil(held / per_replica) > 1
    assert out[KEY_P].detail["burst_hold"] == pytest.approx(held)
    cold = _policy(burst_window=900).decide(_obs(3600.0, prompt=20_000.0, ready=(1, 2)))
    assert _desired(cold, KEY_P) < _desired(out, KEY_P)  # without history: demand alone


def test_cold_start_p90_is_learned() -> None:
    tracker = ColdStartTracker(default_s=60.0)
    for start, delay in ((0, 100), (1000, 110), (2000, 120), (3000, 130)):
        tracker.asked(start, 3)
        tracker.observe(start + delay - 1, 2)
        tracker.observe(start + delay, 3)
    assert tracker.p90_s == pytest.approx(127, abs=1)


def test_a_scale_up_is_not_timed_across_ticks_its_pool_went_unobserved() -> None:
    """A pool missing from an observation for a while: when its pending scale-up became ready
    is unknown, so its return does not record the gap as a cold start."""
    for missing, samples in ((False, [600.0]), (True, [])):
        policy = _policy()
        policy.decide(_obs(0, ready=(1, 2)))
        policy.state[KEY_P].cold_start.asked(0, 2)
        if missing:
            only_decode = _obs(15, ready=(1, 2))
            policy.decide(Observation(15, {KEY_D: only_decode.pools[KEY_D]}))
        policy.decide(_obs(600, ready=(2, 2)))
        assert list(policy.state[KEY_P].cold_start.samples) == samples


@settings(max_examples=60, deadline=None)
@given(low=st.floats(0, 5e5), extra=st.floats(0, 5e5), gen=st.floats(0, 1e5))
def test_more_demand_never_fewer_replicas(low: float, extra: float, gen: float) -> None:
    a = _policy().decide(_obs(0, prompt=low, gen=gen))
    b = _policy().decide(_obs(0, prompt=low + extra, gen=gen + extra / 10))
    assert _desired(b, KEY_P) >= _desired(a, KEY_P)
    assert _desired(b, KEY_D) >= _desired(a, KEY_D)


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
        n = _desired(out, key)
        assert lo <= n <= hi
        if signal is None:
            assert n >= ready


def test_no_flapping_under_constant_load() -> None:
    policy = _policy()
    ready = (2, 2)
    history = []
    for t in range(0, 3600, 15):
        out = policy.decide(_obs(t, prompt=120_000.0, gen=20_000.0, ready=ready))
        ready = (_desired(out, KEY_P), _desired(out, KEY_D))
        history.append(ready)
    changes = sum(1 for a, b in itertools.pairwise(history) if a != b)
    assert changes <= 2  # one move to the right size, then steady


def test_prefill_demand_is_the_engines_computed_tokens_where_exported() -> None:
    """vLLM 0.34's prompt_tokens_by_source{source="local_compute"} is the exact prefill demand:
    it replaces prompt tokens x (1 - hit), and its absence falls back to that estimate."""
    sized = []
    for computed in (50_000.0, None):
        policy = _policy()
        obs = _obs(0, prompt=200_000.0)
        signals = dict(obs.pools[KEY_P].signals)
        signals["prompt_tokens_computed_per_s"] = computed
        pools = dict(obs.pools)
        pools[KEY_P] = PoolObservation(KEY_P, obs.pools[KEY_P].replicas, signals,
                                       obs.pools[KEY_P].data_time_s)
        out = policy.decide(Observation(0, pools))
        sized.append(_desired(out, KEY_P))
    assert sized[0] < sized[1]


def _with(obs: Observation, key: object, **signals: float | None) -> Observation:
    pools = dict(obs.pools)
    pool = obs.pools[key]  # type: ignore[index]
    pools[key] = PoolObservation(key, pool.replicas, {**pool.signals, **signals},  # type: ignore[index,arg-type]
                                 pool.data_time_s)
    return Observation(obs.now_s, pools)


def test_the_peak_minute_is_held_in_the_units_the_pool_is_sized_in() -> None:
    """A burst averaged away by the 5-minute rate sizes the pool through its peak minute, in
    the demand's units: the prompt tokens the pool computes itself (the engine's count where
    exported, else prompt tokens x (1 - hit)), so a cached share is not sized for."""
    sized = {}
    for label, peak, extra in (("none", None, {}), ("peak", 400_000.0, {}),
                               ("cached", 400_000.0, {"prefix_cache_hit_ratio": 0.5}),
                               ("computed", 400_000.0, {"prompt_tokens_computed_per_s": 5_000.0})):
        policy = _policy(burst_window=600)
        obs = _with(_obs(0, prompt=20_000.0), KEY_P, prompt_tokens_peak_per_s=peak, **extra)
        out = policy.decide(obs)
        sized[label] = (_desired(out, KEY_P), out[KEY_P].detail.get("peak_1m"))
    assert sized["none"][1] is None and sized["peak"][1] == 400_000.0
    assert sized["cached"][1] == pytest.approx(200_000.0)
    assert sized["computed"][1] == pytest.approx(100_000.0)
    assert sized["peak"][0] > sized["cached"][0] > sized["computed"][0] >= sized["none"][0], sized
    # The burst hold off: no hold, no peak.
    off = _policy(burst_window=0).decide(_with(_obs(0), KEY_P, prompt_tokens_peak_per_s=1e6))
    assert _desired(off, KEY_P) == _desired(_policy(burst_window=0).decide(_obs(0)), KEY_P)


def test_the_dispersion_is_sized_in_the_units_the_pool_is_sized_in() -> None:
    """The arriving tokens' index of dispersion is scaled, as the demand is, by the share of
    prompt tokens the pool computes itself; clumped arrivals add replicas, unread or broken
    values (an idle window's division by zero) leave the tail model off and say so."""
    seen = {}
    for label, value, extra in (("none", None, {}), ("clumped", 2e5, {}),
                                ("cached", 2e5, {"prefix_cache_hit_ratio": 0.5}),
                                ("nan", math.nan, {}), ("inf", math.inf, {})):
        out = _policy().decide(_with(_obs(0, prompt=200_000.0), KEY_P,
                                     prompt_tokens_dispersion=value, **extra))
        seen[label] = (_desired(out, KEY_P), out[KEY_P].detail["dispersion"],
                       out[KEY_P].detail["tail_need"])
    assert seen["none"][1:] == (None, None) == seen["nan"][1:] == seen["inf"][1:]
    assert seen["nan"][0] == seen["inf"][0] == seen["none"][0]
    # 200k/s at 35.5k/s a replica (44.3k saturated) needs 6; clumped, the p95 of the work
    # arriving in 5 s is 200k + 1.645 x sqrt(200k x 2e5 / 5) = 347k/s: 8. Half of it cached:
    # 100k + 1.645 x sqrt(100k x 1e5 / 5) = 174k/s: 4 (its need: 3).
    assert seen["none"][0] == 6
    assert seen["clumped"][1:] == (2e5, 8) and seen["clumped"][0] == 8
    assert seen["cached"][1] == pytest.approx(1e5) and seen["cached"][2] == 4


def test_a_stale_ttft_miss_does_not_climb_a_replica_each_cold_start() -> None:
    """The 5-minute TTFT p95 carries a served burst for five minutes: with the last minute's
    p95 within the SLO the pool stays; with it over (or unread) the latency alone adds one."""
    for recent, grows in ((0.2, False), (0.9, True), (None, True)):
        policy, ready, seen = _policy(), 2, []
        for t in range(0, 300, 15):
            obs = _with(_obs(t, ttft=1.2, ready=(ready, 2)), KEY_P, ttft_p95_recent_s=recent)
            out = policy.decide(obs)
            ready = _desired(out, KEY_P)  # the replicas come at once: worst case for a climb
            seen.append(ready)
        assert (seen[-1] > 2) is grows, (recent, seen)
        if not grows:
            assert any("a miss that has passed adds no replica" in r for r in out[KEY_P].reasons)
