"""The generated scenario families: seeded, and shaped as their names say."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pdscale.simulator._scenarios import SCENARIOS, scenario
from pdscale.simulator._trace import TraceError


def _per_minute(name: str, seed: int = 0) -> np.ndarray:
    trace = scenario(name, seed=seed).trace
    return np.bincount((trace.arrival_s // 60).astype(int)) / 60.0


@pytest.mark.parametrize("name", SCENARIOS)
def test_same_seed_same_requests_other_seed_other(name: str) -> None:
    a, b, c = scenario(name, seed=3), scenario(name, seed=3), scenario(name, seed=4)
    assert np.array_equal(a.trace.arrival_s, b.trace.arrival_s)
    assert np.array_equal(a.trace.prompt_tokens, b.trace.prompt_tokens)
    assert not np.array_equal(a.trace.arrival_s[:100], c.trace.arrival_s[:100])
    assert np.all(np.diff(a.trace.arrival_s) >= 0)
    assert a.trace.span_s <= 2 * 3600
    assert a.trace.prompt_tokens.min() >= 1 and a.trace.output_tokens.min() >= 1


def test_flash_crowd_is_five_times_within_a_minute() -> None:
    rate = _per_minute("flash-crowd")
    before, during = rate[10:19].mean(), rate[22:30].mean()
    assert 4.0 < during / before < 6.0
    assert rate[21] / before > 3.5  # reached within the minute after it starts
    assert 0.7 < rate[35:55].mean() / before < 1.3  # and gone after ten minutes


def test_steps_go_up_then_down() -> None:
    rate = _per_minute("steps")
    levels = [rate[i * 10 + 2:i * 10 + 9].mean() for i in range(6)]
    assert levels[0] < levels[1] < levels[2]
    assert levels[2] > levels[3] > levels[4] < levels[5]


def test_slow_ramp_climbs_steadily() -> None:
    rate = _per_minute("slow-ramp")
    tens = [rate[i:i + 10].mean() for i in range(0, 50, 10)]
    assert all(b > a for a, b in itertools.pairwise(tens))
    assert 3.5 < rate[55:70].mean() / rate[0:5].mean() < 6.5


def test_length_shift_keeps_the_rate_and_lengthens_prompts() -> None:
    trace = scenario("length-shift").trace
    early = trace.arrival_s < 25 * 60
    rate = _per_minute("length-shift")
    assert 0.8 < rate[30:48].mean() / rate[2:23].mean() < 1.2
    ratio = np.median(trace.prompt_tokens[~early]) / np.median(trace.prompt_tokens[early])
    assert 3.0 < ratio < 5.0


def test_decode_heavy_has_short_prompts_and_long_outputs() -> None:
    trace = scenario("decode-heavy").trace
    assert np.median(trace.output_tokens) > 2 * np.median(trace.prompt_tokens)
    other = scenario("flash-crowd").trace
    assert np.median(trace.output_tokens) > 5 * np.median(other.output_tokens)


def test_cold_morning_is_near_idle_then_busy() -> None:
    rate = _per_minute("cold-morning")
    assert rate[:30].mean() < 1.0
    assert rate[50:].mean() > 40 * rate[:30].mean()


def test_daily_rise_has_earlier_days_with_the_same_rise() -> None:
    s = scenario("daily-rise")
    assert s.history is not None
    times, prompt, output = s.history
    assert times[-1] < 0 and times[0] <= -3 * 86400
    assert np.all(np.diff(times) == 60)
    assert np.all(prompt > 0) and np.all(output > 0)
    # The rise in the window (06:30 + t) is also in each earlier day at the same time.
    rate = _per_minute("daily-rise")
    assert rate[75:88].mean() > 2 * rate[5:25].mean()
    day_start = times[0]  # 00:00 of the first earlier day
    at = ((times - day_start) % 86400) / 3600
    for day in range(3):
        this_day = (times - day_start) // 86400 == day
        night = prompt[this_day & (at >= 6) & (at < 6.5)].mean()
        morning = prompt[this_day & (at >= 7.8) & (at < 8)].mean()
        assert morning > 2 * night
    assert scenario("flash-crowd").history is None


def test_scale_multiplies_the_rate_and_bad_names_say_what_exists() -> None:
    base = len(scenario("steps", seed=1).trace)
    double = len(scenario("steps", seed=1, scale=2.0).trace)
    assert 1.8 < double / base < 2.2
    with pytest.raises(TraceError, match="use one of daily-rise"):
        scenario("tsunami")
    with pytest.raises(TraceError, match="positive"):
        scenario("steps", scale=0)


def test_the_demo_morning_rises_crowds_and_shifts_its_lengths() -> None:
    """demo-day: the rise its earlier days show, a crowd they do not, then longer prompts; the
    earlier days' demand is at the lengths the window starts with."""
    from pdscale.simulator._scenarios import DEMO_SCENARIO

    assert DEMO_SCENARIO not in SCENARIOS  # the demo's, not the suite's
    from pdscale._cli import build_parser

    # pdscale demo names it without importing the generator (numpy) at start-up.
    assert build_parser().parse_args(["demo"]).trace == f"scenario:{DEMO_SCENARIO}"
    demo = scenario(DEMO_SCENARIO)
    rate = _per_minute(DEMO_SCENARIO)
    night, morning, crowd = rate[20:55].mean(), rate[105:125].mean(), rate[132:139].mean()
    assert 2.0 < morning / night < 3.0
    assert 1.7 < crowd / morning < 2.3
    prompts = demo.trace.prompt_tokens
    early = np.median(prompts[demo.trace.arrival_s < 150 * 60])
    late = np.median(prompts[demo.trace.arrival_s >= 150 * 60])
    assert 2.0 < late / early < 3.0
    assert demo.history is not None
    times, prompt_tps, _ = demo.history
    assert times[-1] < 0 and len(times) >= 3 * 1440
    history_rps_at_six = prompt_tps[-30:].mean() / prompts[demo.trace.arrival_s < 1800].mean()
    assert 0.8 < history_rps_at_six / rate[:30].mean() < 1.25
