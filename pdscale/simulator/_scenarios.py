"""Generated scenario families: the load shapes an autoscaler must handle, seeded.

Each family is a request-level :class:`~pdscale.simulator._trace.Trace` of at most two hours,
sized so that its peak needs roughly 10-40 prefill or decode replicas of the benchmark's
profile (Llama-3.1-8B on an H100), plus, where the family is about learning a daily pattern,
the per-minute demand of the earlier days (:attr:`Scenario.history`), which warms the
forecasters the way ``pdscale run`` warms them from Prometheus at start-up.

Arrivals are a doubly stochastic Poisson process: the family's rate curve times a gamma
factor per 10-second slot (mean 1, coefficient of variation :data:`BURST_CV`), the burstiness
measured in production traces at that scale. Prompt and output lengths are lognormal. The
same name and seed give the same requests.

| family | what it tests |
|---|---|
| ``daily-rise`` | a predictable morning rise (x2.5 in 40 minutes), three earlier days before it |
| ``flash-crowd`` | x5 within a minute, for ten minutes, unannounced |
| ``steps`` | steps up and down (x1, x2, x3, x1.5, x0.5) every ten minutes |
| ``slow-ramp`` | a steady climb from 20 % to 100 % over 50 minutes, then a plateau |
| ``length-shift`` | the same request rate, prompts four times longer from minute 25 |
| ``decode-heavy`` | short prompts, long outputs: decode carries the load |
| ``cold-morning`` | a near-idle night, then the morning arrives in 15 minutes |

``demo-day`` (``pdscale demo``'s, not in the suite) puts three of them into one working
morning: the predictable rise, a flash crowd and a prompt-length shift, with three earlier days
for the forecasters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdscale.simulator._trace import Trace, TraceError

__all__ = ["DEMO_SCENARIO", "SCENARIOS", "Scenario", "scenario"]

FloatArray = npt.NDArray[np.float64]

BURST_CV = 0.5
"""Coefficient of variation of the per-slot rate factor (10-second slots)."""
SLOT_S = 10.0
MINUTE_S = 60.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Lengths:
    """Lognormal token lengths: medians and log-space spreads."""

    prompt_median: float = 4000.0
    prompt_sigma: float = 0.8
    output_median: float = 120.0
    output_sigma: float = 0.8


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    trace: Trace
    history: tuple[FloatArray, FloatArray, FloatArray] | None = None
    """Per-minute history before t=0: (times_s, prompt tokens/s, output tokens/s), times
    negative; None where the family has no earlier days."""


@dataclass(frozen=True)
class _Family:
    description: str
    duration_s: float
    rate: Callable[[FloatArray], FloatArray]
    """Requests/s at each time (seconds from the window's start)."""
    lengths: tuple[tuple[float, Lengths], ...] = ((0.0, Lengths()),)
    """The lengths from each time on (seconds from the window's start), in time order."""
    history_days: int = 0
    day_offset_s: float = 0.0
    """Where the window starts within its day (for families with a daily pattern)."""
    daily: Callable[[FloatArray], FloatArray] | None = None
    """Requests/s by time of day (families with earlier days)."""


def _piecewise(points: list[tuple[float, float]]) -> Callable[[FloatArray], FloatArray]:
    xs = np.array([p[0] for p in points]) * MINUTE_S
    ys = np.array([p[1] for p in points])
    return lambda t: np.interp(t, xs, ys)


def _day_curve(t_of_day: FloatArray) -> FloatArray:
    """A working day's request rate (requests/s): 24 at night, rising from 07:00 to 60 by
    07:40, a midday plateau, an evening decline."""
    h = (t_of_day % DAY_S) / 3600.0
    return np.interp(h, [0, 6.5, 7.0, 7.67, 12, 17, 20, 24],
                     [24, 24, 24, 60, 60, 56, 32, 24])


BASE_RPS = 12.0
"""The families' quiet level (requests/s): with the default lengths about 2-3 prefill
replicas, so a x5 crowd needs 10-15."""

def _demo_day(t_of_day: FloatArray) -> FloatArray:
    """The demo's day: 40 % of :func:`_day_curve` (10-24 requests/s), sized with the demo's
    prompt lengths for the shipped example spec (examples/vllm.yaml: at most 16 prefill
    replicas)."""
    return 0.4 * _day_curve(t_of_day)


_DEMO_CROWD = _piecewise([(0, 1), (130, 1), (131, 2), (140, 2), (141, 1), (180, 1)])

_FAMILIES: dict[str, _Family] = {
    "daily-rise": _Family(
        "a predictable morning rise (x2.5 over 40 minutes); three earlier days to learn it from",
        duration_s=5400.0, rate=lambda t: _day_curve(t + 6.5 * 3600.0),
        history_days=3, day_offset_s=6.5 * 3600.0, daily=_day_curve),
    "flash-crowd": _Family(
        "a flash crowd: x5 within a minute at minute 20, for ten minutes",
        duration_s=3600.0,
        rate=_piecewise([(0, BASE_RPS), (20, BASE_RPS), (21, 5 * BASE_RPS), (31, 5 * BASE_RPS),
                         (32, BASE_RPS), (60, BASE_RPS)])),
    "steps": _Family(
        "steps up and down: x1, x2, x3, x1.5, x0.5, x1 every ten minutes",
        duration_s=3600.0,
        rate=_piecewise([(0, 1.5 * BASE_RPS), (10, 1.5 * BASE_RPS), (10.01, 3 * BASE_RPS),
                         (20, 3 * BASE_RPS), (20.01, 4.5 * BASE_RPS), (30, 4.5 * BASE_RPS),
                         (30.01, 2.25 * BASE_RPS), (40, 2.25 * BASE_RPS),
                         (40.01, 0.75 * BASE_RPS), (50, 0.75 * BASE_RPS),
                         (50.01, 1.5 * BASE_RPS), (60, 1.5 * BASE_RPS)])),
    "slow-ramp": _Family(
        "a slow ramp from 20 % to 100 % of the peak over 50 minutes, then a plateau",
        duration_s=4200.0,
        rate=_piecewise([(0, 0.8 * BASE_RPS), (50, 4 * BASE_RPS), (70, 4 * BASE_RPS)])),
    "length-shift": _Family(
        "the same request rate; from minute 25 prompts four times longer",
        duration_s=3000.0, rate=_piecewise([(0, 3 * BASE_RPS), (50, 3 * BASE_RPS)]),
        lengths=((0.0, Lengths(prompt_median=1500.0)),
                 (25 * MINUTE_S, Lengths(prompt_median=6000.0)))),
    "decode-heavy": _Family(
        "decode-heavy: short prompts, long outputs, a x2 swing",
        duration_s=2400.0,
        rate=_piecewise([(0, 2.5 * BASE_RPS), (15, 5 * BASE_RPS), (30, 5 * BASE_RPS),
                         (40, 2.5 * BASE_RPS)]),
        lengths=((0.0, Lengths(prompt_median=300.0, prompt_sigma=0.7, output_median=1000.0,
                                output_sigma=0.6)),)),
    "cold-morning": _Family(
        "a near-idle night (one request every few seconds), then the morning in 15 minutes",
        duration_s=4800.0,
        rate=_piecewise([(0, 0.3), (30, 0.3), (45, 4.5 * BASE_RPS), (80, 4.5 * BASE_RPS)])),
    "demo-day": _Family(
        "a working morning from 06:00: the rise from 07:00 to 07:40 (as on three earlier "
        "days), a flash crowd doubling the load at 08:10 for ten minutes, prompts 2.5 times "
        "as long from 08:30",
        duration_s=3 * 3600.0,
        rate=lambda t: _demo_day(t + 6 * 3600.0) * _DEMO_CROWD(t),
        lengths=((0.0, Lengths(prompt_median=2000.0)),
                 (150 * MINUTE_S, Lengths(prompt_median=5000.0))),
        history_days=3, day_offset_s=6 * 3600.0, daily=_demo_day),
}
DEMO_SCENARIO = "demo-day"
SCENARIOS: tuple[str, ...] = tuple(name for name in _FAMILIES if name != DEMO_SCENARIO)
"""The suite's families."""


def _arrivals(rate: Callable[[FloatArray], FloatArray], start_s: float, duration_s: float,
              rng: np.random.Generator) -> FloatArray:
    """Arrival times in [0, duration): per 10-second slot a Poisson count at the slot's mean
    rate times a gamma factor, spread uniformly within the slot."""
    slots = int(np.ceil(duration_s / SLOT_S))
    mid = np.asarray(start_s + (np.arange(slots) + 0.5) * SLOT_S, dtype=np.float64)
    shape = 1.0 / BURST_CV**2
    factor = rng.gamma(shape, 1.0 / shape, size=slots)
    counts = rng.poisson(np.maximum(rate(mid - start_s), 0.0) * factor * SLOT_S)
    starts = np.repeat(np.arange(slots) * SLOT_S, counts)
    out = np.sort(starts + rng.random(len(starts)) * SLOT_S)
    return out[out < duration_s]


def _lengths(family: _Family, arrivals: FloatArray, rng: np.random.Generator
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    prompts = np.empty(len(arrivals))
    outputs = np.empty(len(arrivals))
    starts = np.array([s for s, _ in family.lengths])
    which = np.searchsorted(starts, arrivals, side="right") - 1
    for i, (_, setting) in enumerate(family.lengths):
        idx = np.flatnonzero(which == i)
        prompts[idx] = rng.lognormal(np.log(setting.prompt_median), setting.prompt_sigma,
                                     len(idx))
        outputs[idx] = rng.lognormal(np.log(setting.output_median), setting.output_sigma,
                                     len(idx))
    clip = 32_000  # a 32k context
    return (np.clip(np.round(prompts), 16, clip).astype(np.int64),
            np.clip(np.round(outputs), 1, 4096).astype(np.int64))


def _history(family: _Family, rng: np.random.Generator
             ) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """Per-minute demand of the earlier days up to the window's start, with the same lengths
    and minute-level noise as the window itself (mean of the gamma factors over a minute)."""
    if family.daily is None or family.history_days == 0:
        return None
    span = family.history_days * DAY_S + family.day_offset_s
    times = np.asarray(-span + np.arange(int(span / MINUTE_S)) * MINUTE_S, dtype=np.float64)
    shape = 1.0 / BURST_CV**2
    noise = rng.gamma(shape * MINUTE_S / SLOT_S, SLOT_S / (shape * MINUTE_S), len(times))
    rps = family.daily(times + family.day_offset_s + MINUTE_S / 2) * noise
    mix = family.lengths[0][1]  # the lengths the window starts with
    mean_prompt = mix.prompt_median * np.exp(mix.prompt_sigma**2 / 2)
    mean_output = mix.output_median * np.exp(mix.output_sigma**2 / 2)
    return times, rps * mean_prompt, rps * mean_output


def scenario(name: str, *, seed: int = 0, scale: float = 1.0) -> Scenario:
    """The family ``name``'s trace for ``seed``; ``scale`` multiplies its request rate."""
    family = _FAMILIES.get(name)
    if family is None:
        raise TraceError(f"unknown scenario {name!r}; use one of "
                         f"{', '.join((*SCENARIOS, DEMO_SCENARIO))}")
    if not scale > 0:
        raise TraceError(f"a scenario's scale must be positive; got {scale!r}")
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    arrivals = _arrivals(lambda t: family.rate(t) * scale, 0.0, family.duration_s, rng)
    prompts, outputs = _lengths(family, arrivals, rng)
    trace = Trace(name=f"scenario:{name}", arrival_s=arrivals, prompt_tokens=prompts,
                  output_tokens=outputs, notes=(family.description,))
    history = _history(family, rng)
    if history is not None and scale != 1.0:
        history = (history[0], history[1] * scale, history[2] * scale)
    return Scenario(name, family.description, trace, history)
