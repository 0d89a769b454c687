"""The policy's stages, each on its own: sizing (pure), stabilisation and bounds (pure, history
in and out), and the forecast stage (forecasters, refits, typed forecasts)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pdscale.controller import (
    Cause,
    ForecastStage,
    NoForecast,
    PoolForecast,
    PoolHistory,
    PoolReplicas,
    SizingInputs,
    bound,
    size,
    stabilise,
)
from pdscale.controller._sizing import running_spread
from pdscale.spec import ControllerSettings, Role

KEY = ("svc", Role.PREFILL)
BASE = SizingInputs(role=Role.PREFILL, demand=30_000.0, forecast=None, forecast_note="off",
                    per_replica=10_000.0, decode_batch=64, running=None, queue=0.0,
                    latency_s=0.2, recent_latency_s=None, slo_s=0.5, backlogged=False,
                    per_request_tokens=1500.0, ready=3, starting=0, max_replicas=40, hold=0.0,
                    hold_ceiling=None,
                    peak=None, hold_half_life_s=300.0,
                    nominal_per_replica=10_000.0,
                    drain_s=60.0, lead_s=75.0, quantile=0.9, correction=1.0,
                    saturated_per_replica=12_500.0)


# -- sizing -----------------------------------------------------------------------------------


def test_sizing_covers_the_higher_of_demand_and_forecast() -> None:
    assert size(BASE).need == 3
    assert size(replace(BASE, forecast=45_000.0)).need == 5
    assert size(replace(BASE, forecast=10_000.0)).need == 3  # demand now still counts
    low = size(replace(BASE, forecast=45_000.0))
    assert low.load == 45_000.0 and low.reactive == 0 and low.replicas == 5
    assert "= 4.5e+04/s" in low.reasons[0]


def test_the_burst_hold_sizes_the_pool_but_not_when_off() -> None:
    held = size(replace(BASE, hold=80_000.0))
    assert held.need == 8 and any("burst hold 8e+04/s" in r for r in held.reasons)
    assert size(replace(BASE, hold=80_000.0, hold_half_life_s=0.0)).need == 3
    # What is remembered is the load, not the hold: the hold decays on its own.
    assert held.load == 30_000.0


def test_the_burst_hold_is_kept_to_the_forecast_ceiling_where_there_is_one() -> None:
    """Where the forecaster has a day of history, the hold is kept to the highest demand it
    gives over the next ten minutes; the demand now and the peak minute still count above it,
    and without a ceiling (less history) or with the hold off, nothing changes."""
    held = size(replace(BASE, hold=80_000.0, hold_ceiling=50_000.0))
    assert held.need == 5 and held.detail["burst_hold"] == 50_000.0
    assert held.detail["hold_uncapped"] == 80_000.0 and held.detail["hold_ceiling"] == 50_000.0
    assert any("burst hold 8e+04/s kept to the forecast's highest over the next 10 minutes at "
               "q0.9, 5e+04/s" in r for r in held.reasons)
    assert held.load == 30_000.0  # what is remembered is unchanged: the hold is not cut
    assert size(replace(BASE, hold=80_000.0, hold_ceiling=None)).need == 8
    assert size(replace(BASE, hold=40_000.0, hold_ceiling=50_000.0)).need == 4  # under it
    below = size(replace(BASE, hold=80_000.0, hold_ceiling=10_000.0, peak=60_000.0))
    assert below.need == 6 and below.detail["burst_hold"] == 60_000.0  # the peak minute counts
    now = size(replace(BASE, demand=70_000.0, hold=80_000.0, hold_ceiling=10_000.0))
    assert now.need == 7  # so does the demand now
    off = size(replace(BASE, hold=80_000.0, hold_ceiling=10_000.0, hold_half_life_s=0.0))
    assert off.need == 3 and off.detail["hold_uncapped"] is None


def test_the_burst_hold_remembers_the_peak_minute() -> None:
    """A burst within a minute is averaged away by the 5-minute rate; the peak minute is what
    it needed, and what the hold remembers (not when the hold is off)."""
    peaked = size(replace(BASE, peak=70_000.0))
    assert peaked.load == 70_000.0 and peaked.need == 7 and peaked.detail["peak_1m"] == 70_000.0
    assert any("peak minute 7e+04/s" in r for r in peaked.reasons)
    assert size(replace(BASE, peak=20_000.0)).load == 30_000.0  # under the demand: no effect
    off = size(replace(BASE, peak=70_000.0, hold_half_life_s=0.0))
    assert off.need == 3 and off.load == 30_000.0


def test_the_tail_sizes_for_clumped_arrivals_within_the_slo() -> None:
    """The work arriving within the SLO (or the 5 s dispersion window) at its p95: load + 1.645
    x sqrt(load x dispersion / window), at the saturated 12,500/s a replica. Clumps need
    standing replicas the mean load does not show; a small pool needs proportionally more than
    a large one (square-root staffing); a longer SLO spreads a clump; unread, it is off."""
    unread = size(BASE)
    assert unread.need == 3 and unread.detail["tail_need"] is None
    assert not any(r.startswith("tail") for r in unread.reasons)
    clumped = size(replace(BASE, dispersion=60_000.0))  # 30k + 1.645 x 18,974 = 61,212/s
    assert clumped.need == 5 and clumped.detail["tail_need"] == 5
    assert clumped.tail and not unread.tail
    # A decision the tail drove says so in its cause (the reactive path's still wins).
    up = stabilise(clumped, PoolHistory(), now_s=0.0, current=3, max_replicas=40,
                   stabilisation_s=600.0, max_step_down=2)
    assert (up.desired, up.cause) == (5, Cause.TAIL)
    missed = replace(clumped, replicas=7, reactive=7)
    assert stabilise(missed, PoolHistory(), now_s=0.0, current=3, max_replicas=40,
                     stabilisation_s=600.0, max_step_down=2).cause is Cause.REACTIVE
    # A backlog's own need over the tail's is not the tail's: it is the burst's, a reactive
    # cause (a queue sized to be served within the SLO).
    queued = size(replace(BASE, dispersion=60_000.0, latency_s=2.0, queue=2_000.0))
    assert queued.need == 6 > queued.detail["tail_need"] and not queued.tail  # type: ignore[operator]
    assert queued.burst and not clumped.burst and not unread.burst
    assert stabilise(replace(queued, replicas=6, reactive=0), PoolHistory(), now_s=0.0,
                     current=3, max_replicas=40, stabilisation_s=600.0,
                     max_step_down=2).cause is Cause.REACTIVE
    # A tail over the burst's need is the tail's.
    over = size(replace(BASE, dispersion=60_000.0, queue=12.0, latency_s=2.0))
    assert over.detail["burst_need"] == 4 and over.need == 5 and over.tail and not over.burst
    assert any(r.startswith("tail:") and "6.121e+04/s" in r and "needs 5 replicas" in r
               for r in clumped.reasons)
    # Independent arrivals of 1,500-token prompts (cv 1.5) on a hundredfold load: the p95 of
    # the arrivals is within the planned headroom, the tail adds nothing.
    large = size(replace(BASE, demand=3e6, dispersion=1500 * (1 + 1.5 ** 2)))
    assert large.need == 300 and large.detail["tail_need"] == 248 and not large.tail
    assert not any(r.startswith("tail") for r in large.reasons)
    # A 20 s SLO spreads the same clumps over four times the window: 45,605/s -> 4.
    assert size(replace(BASE, dispersion=60_000.0, slo_s=20.0)).need == 4
    # One wild window asks for at most twice the need.
    wild = size(replace(BASE, dispersion=1e7))
    assert wild.need == 6 and "at most twice the need" in wild.reasons[-1]
    # Decode has no arrivals' tail term (its own is the running sequences', below).
    decode = size(replace(BASE, role=Role.DECODE, running=0.0, dispersion=60_000.0))
    assert decode.detail["tail_need"] is None and decode.need == 3


def test_decode_sizes_for_the_running_sequences_95th_percentile() -> None:
    """Decode's tail: the level (the load's replicas from demand and forecast, or the readings'
    mean in batches, whichever is higher) plus 1.645 x the running sequences' spread in
    batches of the replicas' batch; off while the spread is unread or with no load, at most
    twice the need, never a prefill term; a reading now at a swing's high, or the burst hold,
    which carry swings already, do not raise the level it is added to."""
    decode = replace(BASE, role=Role.DECODE, demand=15_000.0, running=None, decode_batch=64,
                     per_replica=5_000.0)  # 3 replicas' worth
    assert size(decode).need == 3 and size(decode).detail["tail_need"] is None
    swinging = size(replace(decode, running_spread=50.0))  # 3 + 82.2 / 64 = 4.28 -> 5
    assert swinging.need == 5 and swinging.tail and swinging.detail["tail_need"] == 5
    assert swinging.detail["running_spread"] == 50.0
    assert any(r.startswith("tail: running sequences move by 50") and "adds 1.645 x that" in r
               and "1.29 batches of 64, to the level's 3.00 replicas -> need 5" in r
               for r in swinging.reasons)
    # The readings' mean over the load's level raises it: 256 sequences = 4 batches -> 6.
    assert size(replace(decode, running_spread=50.0, running_mean=256.0)).need == 6
    assert size(replace(decode, running_spread=50.0, running_mean=100.0)).need == 5  # under
    # A forecast over the demand is the level.
    assert size(replace(decode, running_spread=50.0, forecast=25_000.0)).need == 7
    # A reading now at a swing's high sizes the load as before, and the tail is not stacked
    # on it: 300 running = 4.69 batches -> 5; the tail's 4.28 -> 5 adds nothing.
    high = size(replace(decode, running=300.0, running_spread=50.0))
    assert high.need == 5 and not high.tail
    # Nor on the burst hold: the hold's 8 replicas stand, the tail asks for 5.
    held = size(replace(decode, running_spread=50.0, hold=40_000.0))
    assert held.need == 8 and not held.tail
    # Steady readings add nothing where the load's batches have room for their swing.
    steady = size(replace(decode, demand=14_000.0, running_spread=3.0))
    assert steady.need == 3 and not steady.tail
    wild = size(replace(decode, running_spread=1e4))
    assert wild.need == 6 and "at most twice the need" in wild.reasons[-1]
    # No load, no tail (the swing of an idle pool's few sequences is no demand).
    idle = size(replace(decode, demand=0.0, running_spread=20.0))
    assert idle.detail["tail_need"] == 0 and not idle.tail
    # Prefill ignores a spread of running sequences.
    assert size(replace(BASE, running_spread=50.0, running_mean=500.0)).need == 3


def test_the_running_sequences_spread_is_robust_to_a_step() -> None:
    """The spread is the median absolute change between readings, scaled to a normal sigma:
    noise of a known sigma reads back near it, while one step of the load among steady
    readings reads as no spread (a step moves the mean; the forecast and hold carry it)."""
    assert running_spread([100.0, 110.0, 95.0]) is None  # three readings: too few
    rng = np.random.default_rng(0)
    noisy = list(200 + 20 * rng.standard_normal(2_000))
    assert running_spread(noisy) == pytest.approx(20.0, rel=0.05)
    step = [200.0] * 10 + [400.0] * 10
    assert running_spread(step) == 0.0
    assert running_spread([200.0, 180.0, 220.0, 200.0]) == pytest.approx(20 * 1.4826
                                                                         / math.sqrt(2))


def test_a_latency_miss_that_has_passed_adds_no_replica() -> None:
    """The 5-minute p95 carries a burst for five minutes after it was served: the "+1" on
    latency alone needs the last minute's p95 over the SLO too (or unread)."""
    stale = size(replace(BASE, latency_s=0.8, recent_latency_s=0.2))
    assert stale.replicas == 3 and stale.reactive <= 3
    assert any("0.2s over the last minute: a miss that has passed" in r for r in stale.reasons)
    assert stale.detail["recent_latency_p95_s"] == 0.2
    assert size(replace(BASE, latency_s=0.8, recent_latency_s=0.7)).replicas == 4  # still on
    assert size(replace(BASE, latency_s=0.8, recent_latency_s=None)).replicas == 4  # unread
    # A backlog is sized from the queue whatever the last minute says.
    queued = size(replace(BASE, latency_s=2.0, recent_latency_s=0.2, queue=800.0))
    assert queued.reactive == 5
    # Demand beyond what the ready replicas carry is sized too (the model, not a guess).
    over = size(replace(BASE, demand=45_000.0, latency_s=0.8, recent_latency_s=0.2))
    assert over.reactive > 3 and over.replicas >= 5


def test_decode_counts_running_and_waiting_sequences() -> None:
    decode = replace(BASE, role=Role.DECODE, demand=1_000.0, running=128.0, queue=64.0,
                     decode_batch=64, per_replica=5_000.0)
    got = size(decode)
    assert got.detail["sequences"] == 192.0 and got.need == 3
    flood = size(replace(decode, queue=10_000.0))  # counted up to what runs, no more
    assert flood.detail["sequences"] == 256.0 and flood.need == 4


def test_the_reactive_path_drains_the_backlog_within_drain_time() -> None:
    miss = size(replace(BASE, latency_s=2.0, queue=800.0))
    # 800 prompts x 1,500 tokens = 1.2 M tokens at 10,000/s a replica within 60 s: +2.
    assert miss.reactive == 3 + 2
    # ... while serving that burst within the 0.5 s SLO would take 240: at most twice the
    # ready replicas a decision.
    assert miss.need == 6 and miss.replicas == 6 and miss.detail["burst_need"] == 6
    assert any(r.startswith("burst: 1.2e+06 tokens waiting") for r in miss.reasons)
    assert size(replace(BASE, queue=2.0)).need == 3  # a small queue fits the ready ones
    assert size(replace(BASE, role=Role.DECODE, queue=800.0)).detail["burst_need"] == 0
    assert any(r.startswith("reactive: ttft_p95_s 2s") for r in miss.reasons)
    assert size(replace(BASE, latency_s=0.6)).reactive == 4  # over the SLO: one more at least
    assert size(replace(BASE, latency_s=None)).reactive == 0  # blamed elsewhere, or missing


def test_the_burst_need_reads_only_what_joined_a_queue_the_ready_replicas_piled_up() -> None:
    """Where the replicas ready at the last tick could not carry the busiest minute at the
    profile's plan, the queue still waiting from then is an overload's pile-up the reactive
    path sizes (lead and drain), not a clump to serve within the SLO: read as one, ServeGen
    m-small's consecutive queues asked for 22 replicas where the oracle ran 14-16. Where they
    could carry it, the whole queue is clumps (Azure's start-up) and counts."""
    # 30k/s against 2 ready x 10k/s at the last tick: piled up.
    piled = replace(BASE, latency_s=2.0, queue=800.0, queue_before=700.0, ready_before=2)
    got = size(piled)
    # 100 new prompts x 1,500 tokens = 150k tokens within 0.5 s at 10k/s a replica: 30, at
    # most twice the 3 ready.
    assert got.detail["burst_backlog"] == pytest.approx(150_000.0)
    assert got.detail["burst_need"] == 6 and got.burst and got.detail["queue_before"] == 700.0
    assert any("joined the queue since the last tick" in r and "reactive path's" in r
               for r in got.reasons)
    # Within the SLO and no backlog, the reactive path does not fire, and no reason says so.
    quiet = size(replace(piled, latency_s=0.1))
    assert quiet.reactive == 0
    assert not any("reactive path's" in r for r in quiet.reasons)
    nearly = replace(piled, queue_before=799.0)
    small = size(nearly)
    assert small.detail["burst_backlog"] == pytest.approx(1_500.0)
    assert small.detail["burst_need"] == 1
    # ... while the reactive path still sizes the whole backlog.
    assert small.reactive == size(replace(BASE, latency_s=2.0, queue=800.0)).reactive == 5
    assert small.need == 3 and small.replicas == 5 and not small.burst
    # The busiest minute decides, where it is over the demand.
    assert size(replace(nearly, ready_before=3)).detail["burst_backlog"] == 1.2e6
    assert size(replace(nearly, ready_before=3, peak=31_000.0)).detail["burst_need"] == 1
    # Ready replicas that carried it: the whole queue is clumps, as before.
    carried = size(replace(piled, ready_before=3))
    assert carried.detail["burst_backlog"] == pytest.approx(1.2e6)
    assert any(r.startswith("burst: 1.2e+06 tokens waiting") for r in carried.reasons)
    # A queue that shrank adds nothing.
    assert size(replace(BASE, queue=10.0, queue_before=50.0,
                        ready_before=1)).detail["burst_need"] == 0


def test_a_burst_is_sized_in_one_decision_over_the_lead() -> None:
    """Arrivals above what the ready replicas serve pile up until new ones are ready: the ask
    covers that backlog too, at once, not a replica per cold start."""
    burst = replace(BASE, demand=50_000.0, latency_s=2.0, queue=100.0)
    got = size(burst)
    # 150k tokens waiting + (50k - 30k)/s x 75 s = 1.65 M at the lead; 50k/s + 1.65 M / 60 s
    # = 77.5k/s at 10k/s a replica -> 8 replicas in all.
    assert got.reactive == 8 and got.detail["backlog_at_lead"] == pytest.approx(1.65e6)
    # A shorter lead leaves less backlog: fewer replicas.
    assert size(replace(burst, lead_s=15.0)).reactive < 8
    # The ask is a total: replicas already starting count towards it, nothing is added.
    starting = replace(burst, starting=5)
    assert size(starting).reactive == 8
    out = stabilise(size(starting), PoolHistory(first_seen_s=0.0), now_s=60.0, current=8,
                    max_replicas=40, stabilisation_s=300.0, max_step_down=2)
    assert out.desired == 8 and out.asked is None


# -- stabilisation and bounds -----------------------------------------------------------------


def _need(replicas: int, reactive: int = 0) -> object:
    return replace(size(BASE), replicas=replicas, need=replicas if not reactive else 1,
                   reactive=reactive)


def test_scale_up_is_immediate_and_says_why() -> None:
    up = stabilise(_need(6), PoolHistory(), now_s=0.0, current=3, max_replicas=40,  # type: ignore[arg-type]
                   stabilisation_s=300.0, max_step_down=2)
    assert (up.desired, up.cause, up.asked) == (6, Cause.FORECAST, 6)
    hot = stabilise(_need(6, reactive=6), PoolHistory(), now_s=0.0, current=3,  # type: ignore[arg-type]
                    max_replicas=5, stabilisation_s=300.0, max_step_down=2)
    assert (hot.cause, hot.asked) == (Cause.REACTIVE, 5)  # the tracker waits for what can come


def test_scale_down_waits_the_window_then_steps() -> None:
    history = PoolHistory()
    current, seen = 10, []
    for t in range(0, 600, 15):
        out = stabilise(_need(2), history, now_s=float(t), current=current,  # type: ignore[arg-type]
                        max_replicas=40, stabilisation_s=300.0, max_step_down=3)
        history, current = out.history, out.desired
        seen.append((t, out.desired, out.cause))
    assert all(d == 10 and c is Cause.STEADY for t, d, c in seen if t < 300)
    assert [d for t, d, _ in seen if 300 <= t <= 345] == [7, 4, 2, 2]
    assert len(history.needs) == 21  # only the window is kept
    assert history.first_seen_s == 0.0


def test_a_high_need_in_the_window_holds_the_pool() -> None:
    history = PoolHistory(needs=((100.0, 8),), first_seen_s=0.0)
    out = stabilise(_need(2), history, now_s=390.0, current=10, max_replicas=40,  # type: ignore[arg-type]
                    stabilisation_s=300.0, max_step_down=5)
    assert out.desired == 8 and out.cause is Cause.SCALE_DOWN and out.cancelled_above == 8


def test_the_burst_hold_decays_and_recurring_bursts_refresh_it() -> None:
    h = PoolHistory()
    h1 = h.remember_load(0.0, 80.0, 900.0)  # half-life 300 s
    assert h.hold(0.0, 900.0) == 0.0 and h1.hold(0.0, 900.0) == 80.0  # immutable
    assert h1.hold(300.0, 900.0) == 80.0  # whole for a half-life
    assert h1.hold(600.0, 900.0) == pytest.approx(40.0)  # then halving every half-life
    assert h1.hold(900.0, 900.0) == pytest.approx(20.0)
    assert h1.remember_load(300.0, 30.0, 900.0) is h1  # under the envelope: nothing new
    again = h1.remember_load(600.0, 70.0, 900.0)  # a burst recurs: the envelope rises
    assert again.hold(600.0, 900.0) == 70.0 and again.hold(900.0, 900.0) == 70.0
    assert h1.remember_load(5.0, 1.0, 0.0) is h1 and h1.hold(0.0, 0.0) == 0.0  # off


def test_a_reversed_scale_down_makes_the_hold_last_longer() -> None:
    history = PoolHistory(needs=((0.0, 3),), first_seen_s=0.0)
    down = stabilise(_need(3), history, now_s=400.0, current=5, max_replicas=40,  # type: ignore[arg-type]
                     stabilisation_s=300.0, max_step_down=2, burst_window_s=900.0)
    assert down.cause is Cause.SCALE_DOWN and down.history.last_down_s == 400.0
    back = stabilise(_need(5), down.history, now_s=520.0, current=3, max_replicas=40,  # type: ignore[arg-type]
                     stabilisation_s=300.0, max_step_down=2, burst_window_s=900.0)
    assert back.history.reversals == 1 and "reverses the scale-down" in back.reasons[0]
    assert back.history.half_life_s(520.0, 900.0) == pytest.approx(600.0)
    # Hours without reversals relax it back towards a third of the window.
    assert back.history.half_life_s(520.0 + 3600.0, 900.0) == pytest.approx(450.0)
    # A scale-up long after the scale-down is not a reversal.
    late = stabilise(_need(5), down.history, now_s=2000.0, current=3, max_replicas=40,  # type: ignore[arg-type]
                     stabilisation_s=300.0, max_step_down=2, burst_window_s=900.0)
    assert late.history.reversals == 0 and late.reasons == ()


def test_a_start_seeds_the_hold_from_history() -> None:
    points = [(t, 10.0) for t in range(0, 3600, 60)] + [(3000.0, 60.0)]
    seeded = PoolHistory().seeded(points, 3600.0, 900.0)
    assert seeded.hold(3600.0, 900.0) == pytest.approx(60.0 * 0.5)


@pytest.mark.parametrize(("desired", "expected"), [(0, (1, "min")), (5, (5, None)),
                                                    (99, (20, "max"))],
                         ids=["below", "within", "above"])
def test_bounds(desired: int, expected: tuple[int, str | None]) -> None:
    replicas = PoolReplicas(ready=3, starting=0, draining=0, desired=3, min_replicas=1,
                            max_replicas=20)
    assert bound(desired, replicas) == expected


# -- the forecast stage -----------------------------------------------------------------------


def _stage(**kw: float) -> ForecastStage:
    return ForecastStage({KEY: 75.0}, ControllerSettings(scale_up_quantile=0.9), **kw)


def _feed(stage: ForecastStage, minutes: int, start: float = 0.0) -> None:
    for i in range(minutes * 4):  # a tick every 15 s
        t = start + 15.0 * i
        stage.observe(KEY, t, 10_000.0 + 2_000.0 * math.sin(t / 3600))


def test_a_forecaster_with_a_day_of_history_gives_the_hold_its_ceiling() -> None:
    """Under a day of history there is no ceiling; from a day on, the forecast carries the
    highest sized quantile up to the longest trained horizon (ten minutes), while its horizons
    and quantiles stay those of the lead."""
    stage = _stage()
    _feed(stage, 23 * 60)
    stage.refit(KEY, 23 * 3600.0)
    short = stage.forecast(KEY, 23 * 3600.0, 150.0)
    assert isinstance(short, PoolForecast) and short.ceiling is None
    assert short.as_dict()["ceiling"] is None
    _feed(stage, 70, start=23 * 3600.0)
    now = 23 * 3600.0 + 70 * 60.0
    stage.refit(KEY, now)
    stage.refresh_forecast(KEY, now)  # what the worker does after a refit
    got = stage.forecast(KEY, now, 150.0)
    assert isinstance(got, PoolForecast) and got.horizons_s == (60.0, 120.0, 180.0)
    fc = stage.forecasters[KEY]
    table = fc.forecast(np.arange(60.0, 660.0, 60.0))
    assert got.ceiling == pytest.approx(float(np.max(table[:, -1])))
    assert got.ceiling_horizon_s == 600.0 and got.as_dict()["ceiling"] == got.ceiling
    assert got.quantiles[0.9] == pytest.approx(tuple(table[:3, -1]))  # the lead's, unchanged
    longer = stage._compute(KEY, fc, now, 900.0)  # a lead past ten minutes: the ceiling's own
    assert longer.horizons_s[-1] == 900.0 and longer.ceiling == pytest.approx(got.ceiling)


def test_no_forecast_until_there_is_history_and_a_fit() -> None:
    stage = _stage()
    assert stage.min_history_s == 600.0  # minutes of history, not an hour
    _feed(stage, 9)
    got = stage.forecast(KEY, 540.0, 75.0)
    assert isinstance(got, NoForecast) and "history too short" in got.reason
    assert stage.pending_refits(540.0) == []
    _feed(stage, 60, start=540.0)
    got = stage.forecast(KEY, 4140.0, 75.0)
    assert isinstance(got, NoForecast) and "first fit" in got.reason
    assert stage.pending_refits(4140.0) == [KEY]


def test_a_fitted_stage_returns_a_typed_forecast_and_reuses_it() -> None:
    stage = _stage()
    _feed(stage, 120)
    stage.refit(KEY, 7200.0)
    got = stage.forecast(KEY, 7200.0, 150.0)
    assert isinstance(got, PoolForecast)
    assert got.horizons_s == (60.0, 120.0, 180.0) and set(got.quantiles) == {0.5, 0.9}
    assert got.sized_quantile == 0.9 and got.trained_horizons_s == (60.0, 600.0)
    assert got.sized_value == max(got.quantiles[0.9])
    assert all(np.isfinite(v) for q in got.quantiles.values() for v in q)
    assert stage.forecast(KEY, 7215.0, 150.0) is got  # cached until the worker refreshes
    assert stage.stale_forecasts(7215.0, within_s=15.0) == []
    assert stage.stale_forecasts(7310.0, within_s=15.0) == [KEY]  # forecast_every_s passed
    stage.refresh_forecast(KEY, 7320.0)
    fresh = stage.forecast(KEY, 7320.0, 150.0)
    assert isinstance(fresh, PoolForecast) and fresh.at_s == 7320.0
    assert fresh.as_dict()["quantiles"]["0.9"] == list(fresh.quantiles[0.9])


def test_every_replica_kept_above_the_need_says_why() -> None:
    """Held by the window (and for how long yet), by the highest need in it, or by the step:
    each says so in the reasons and the detail."""
    watched = stabilise(_need(4), PoolHistory(first_seen_s=0.0), now_s=120.0, current=8,  # type: ignore[arg-type]
                        max_replicas=40, stabilisation_s=600.0, max_step_down=2)
    assert watched.desired == 8 and watched.cause is Cause.STEADY
    assert watched.reasons == ("stabilisation: 4 above the need 4; the pool has been watched "
                               "120s of the 600s stabilisation window: scale-down in 480s if "
                               "the need stays below 8",)
    assert watched.detail == {"above_need": "stabilisation", "above_need_replicas": 4.0,
                              "scale_down_in_s": 480.0}
    recent = PoolHistory(needs=((500.0, 8),), first_seen_s=0.0)
    held = stabilise(_need(4), recent, now_s=700.0, current=8, max_replicas=40,  # type: ignore[arg-type]
                     stabilisation_s=600.0, max_step_down=2)
    assert held.desired == 8 and held.detail["scale_down_in_s"] == 400.0
    assert "8 were needed 200s ago" in held.reasons[0]
    stepping = stabilise(_need(2), PoolHistory(first_seen_s=0.0), now_s=900.0, current=8,  # type: ignore[arg-type]
                         max_replicas=40, stabilisation_s=600.0, max_step_down=2)
    assert (stepping.desired, stepping.cause) == (6, Cause.SCALE_DOWN)
    assert stepping.reasons[-1] == "max step: 4 above the need 2; down by at most 2 a tick"
    at_need = stabilise(_need(8), PoolHistory(first_seen_s=0.0), now_s=900.0, current=8,  # type: ignore[arg-type]
                        max_replicas=40, stabilisation_s=600.0, max_step_down=2)
    assert at_need.reasons == () and at_need.detail == {}
