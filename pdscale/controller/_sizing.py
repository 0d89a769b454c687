"""Sizing: a pool's demand, forecast, capacity and signals -> the replicas it needs, and why.

A pure function (:func:`size`) of :class:`SizingInputs`; the policy gathers them (capacity
from the capacity model, the forecast from the forecast stage, the burst hold from the pool's
history) and stabilises the result (:mod:`controller._stabilise`).

1. The load sized for: the demand now and its forecast at the scale-up quantile over the lead,
   whichever is higher; for decode also the sequences running (bursts of long prompts with
   short outputs fill the KV cache before they fill the step).
2. The burst hold: at least the decayed envelope of what recent bursts needed (load that came
   in bursts recently comes again, and a one-minute forecast cannot see sub-minute bursts).
   It remembers load, not a waiting queue, which drains within a minute; for prefill the load
   remembered is at least the peak one-minute demand within the rate window
   (``Signal.PROMPT_TOKENS_PEAK_PER_S``), which the 5-minute rate averages away.
   Prefill also serves a burst's backlog: the tokens waiting at a tick, within the TTFT SLO,
   at the profile's capacity, at most doubling the ready replicas a decision (sub-minute
   bursts leave queues that no per-minute rate shows); the burst hold then keeps the load.
   Where the forecaster has learned a day's season, the hold is kept to the highest demand it
   gives at the scale-up quantile over the next ten minutes (``hold_ceiling``): what bursts
   needed is kept while the forecast says such load may come, not after the day's load has
   turned down (ServeGen m-large: 1.4-2.7 % fewer GPU-hours at 30, 60 and 180 s, +0.02 to
   -0.05 points). The demand now and the peak minute still count above the ceiling.
   Where the replicas ready at the last tick could not carry the busiest minute's demand at
   the profile's plan, what still waits from that tick is an overload's pile-up, not a clump:
   only what joined the queue since counts, and the reactive path sizes the pile-up with the
   lead and the drain time.
3. Decode also holds its waiting sequences, up to as many as run (a larger backlog is the
   reactive path's, sized by its drain time).
4. need = ceil(sized load / capacity per replica).
5. The tail (prefill): the work that arrives within a window, at its 95th percentile (the
   SLO's), served at the profile's saturated throughput. The arrivals' measured index of
   dispersion (``Signal.PROMPT_TOKENS_DISPERSION``: half the mean squared difference of
   consecutive 5 s windows' prompt tokens over their mean, which is the variance over the
   mean for steady arrivals without what a trend adds) gives that percentile:
   load + z95 x sqrt(load x dispersion / window), the window the TTFT SLO or the 5 s the
   dispersion is measured over, whichever is longer (so for an SLO under 5 s it sizes for the
   5 s windows, the finest the measurement resolves, not for the SLO's own). This is the
   square-root staffing rule of a multi-server queue with the burstiness measured instead of
   assumed Poisson. Prompts that arrive in clumps within seconds (a conversation's turns, a
   batch client) need standing capacity no per-minute rate shows: on the Mooncake trace a
   queue of 38 prompts built at 18 replicas in a minute of ordinary mean load. Not scaled by
   the learned capacity correction (which misses lower and prefill slack raises; the larger
   of the two needs is taken), at most twice the need, and off (said in the detail) when the
   dispersion is unread: fluid-mode simulations, or a scrape interval over 2.5 s.
   The tail (decode): the running sequences at their 95th percentile. The policy reads the
   running sequences each tick; their spread between consecutive readings over the rate window
   (:func:`running_spread`: the median absolute change, over sqrt(2) as for independent
   readings, so one step of the load among a window's readings does not count as noise) gives
   their level + z95 x spread, in batches of the replicas' batch, the level being the load's
   replicas (demand and forecast, not the hold or the reading now, which carry swings
   already) or the readings' mean, whichever is higher. On the Mooncake trace decode sized on
   the mean rate ran 11-12 replicas where the oracle, knowing each second's sequences, ran 13-17:
   the wait for a batch slot came out in the TTFT. Off with fewer than
   :data:`SPREAD_READINGS` readings or no load, at most twice the need. The spread assumes
   readings further apart than a sequence's life (readings closer than that are correlated
   and read low) and a level without a steady ramp (whose every change reads as spread); a
   pool full to its batches reads flat (its excess waits in the queue, which the reactive
   path sizes: counting the waiting sequences too made ServeGen's rises, whose queues swing,
   hold capacity for nothing).
6. The reactive path, when latency p95 is over the SLO or a queue builds: one decision for the
   whole burst, not a replica per cold start. New replicas are ready one lead from now; until
   then the ready ones serve and the backlog grows by the arrivals they cannot serve. The pool
   needs the replicas that serve the arrival rate and drain that backlog within ``drain_s``
   (replicas already starting count towards them: the ask is a total). With latency over the
   SLO it asks for at least one more than are ready, but only while the last minute's p95
   (``Signal.TTFT_P95_RECENT_S``, prefill) is over the SLO too or unread: the 5-minute p95
   carries a burst for five minutes after it was served, and a "+1" on it each cold start
   climbed the demo's prefill pool from 2 to 7 replicas while every minute's TTFT p95 was
   0.19-0.28 s against a 0.5 s SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from pdscale.controller._observe import DEMAND_SIGNAL, LATENCY_SIGNAL
from pdscale.spec import Role
from pdscale.telemetry import DISPERSION_WINDOW_S

__all__ = ["SPREAD_READINGS", "TAIL_Z", "Need", "SizingInputs",
           "running_spread", "size"]

TAIL_Z = NormalDist().inv_cdf(0.95)
"""Standard normal quantile of the percentile the TTFT SLO names (p95)."""

SPREAD_READINGS = 4
"""Readings of the running sequences (three changes) before their spread is used."""
_MAD_TO_SIGMA = 1.4826 / math.sqrt(2)
"""The median absolute change of independent normal readings times this is their sigma."""


def running_spread(readings: Sequence[float]) -> float | None:
    """Decode: the running sequences' standard deviation, from the median absolute change
    between consecutive readings (a change of two independent readings has sqrt(2) sigma; the
    median keeps one step of the load, which moves the mean, from reading as noise); None with
    fewer than :data:`SPREAD_READINGS` readings."""
    if len(readings) < SPREAD_READINGS:
        return None
    return float(np.median(np.abs(np.diff(readings)))) * _MAD_TO_SIGMA


@dataclass(frozen=True)
class SizingInputs:
    role: Role
    demand: float
    """Prefill: uncached prompt tokens/s; decode: generated tokens/s."""
    forecast: float | None
    """The forecast at the scale-up quantile over the lead (None: none)."""
    forecast_note: str
    """How the forecast was (or was not) made, for the reasons."""
    per_replica: float
    """Demand one replica carries at the SLO (corrected)."""
    decode_batch: int
    """Sequences one decode replica holds at the ITL SLO."""
    running: float | None
    """Decode: sequences running."""
    queue: float
    """Requests waiting."""
    latency_s: float | None
    """The pool's latency p95, None when missing or when the miss is another pool's."""
    recent_latency_s: float | None
    """The same p95 over the last minute (prefill; None: unread, or decode)."""
    slo_s: float
    backlogged: bool
    per_request_tokens: float
    """Work a waiting request brings (prefill: prompt tokens; decode: output tokens)."""
    ready: int
    max_replicas: int
    starting: int
    """Replicas asked for and not yet ready."""
    hold: float
    """The burst hold: the decayed load recent bursts needed (0: none, or off)."""
    hold_ceiling: float | None
    """The forecast's highest demand at the scale-up quantile over the next ten minutes, where
    the forecaster has a day of history: the hold is kept to it (None: not capped)."""
    peak: float | None
    """Prefill: the highest one-minute demand within the rate window (None: unread)."""
    hold_half_life_s: float
    nominal_per_replica: float
    """Demand one replica carries at the SLO by the profile alone (no correction)."""
    drain_s: float
    lead_s: float
    quantile: float
    correction: float
    dispersion: float | None = None
    """Prefill: the index of dispersion of the arriving work in demand units (of the uncached
    tokens per ``dispersion_window_s``; None: unread)."""
    dispersion_window_s: float = DISPERSION_WINDOW_S
    saturated_per_replica: float = 0.0
    """Prefill: uncached tokens/s one replica computes saturated, by the profile alone."""
    running_spread: float | None = None
    """Decode: the running sequences' spread between readings
    (:func:`running_spread`; None: too few readings)..."""
    running_mean: float | None = None
    """... and their mean over the same readings."""
    queue_before: float = 0.0
    """Prefill: the requests waiting at the pool's previous tick (0: none, or unread)..."""
    ready_before: int = 0
    """... and the replicas ready then: where they could not carry the busiest minute's
    demand at the profile's plan, the burst need counts only what joined the queue since
    (:func:`_burst_need`)."""


@dataclass(frozen=True)
class Need:
    replicas: int
    """max(need, reactive): what the pool should have."""
    need: int
    reactive: int
    """Replicas the reactive path asks for (0: it did not fire)."""
    load: float
    """The load to remember in the burst hold: what was sized for before the hold (demand,
    forecast, running sequences) or the peak one-minute demand, whichever is higher."""

    reasons: tuple[str, ...]
    detail: dict[str, float | str | None]
    set_by: Literal["load", "burst", "tail"] = "load"
    """Which term set ``need``: the load's, the prefill backlog's (served within the SLO), or
    the tail model's (prefill: the arrivals'; decode: the running sequences'; each only where it
    asked for more than those before it)."""

    @property
    def tail(self) -> bool:
        return self.set_by == "tail"

    @property
    def burst(self) -> bool:
        return self.set_by == "burst"


def _load(x: SizingInputs) -> tuple[float, float, float | None]:
    """(load sized for before the burst hold, the waiting sequences' load, sequences)."""
    load = max(x.demand, x.forecast) if x.forecast is not None else x.demand
    if x.role is not Role.DECODE or x.running is None:
        return load, 0.0, None
    seqs = x.running + min(x.queue, max(x.running, x.decode_batch))
    load = max(load, x.running / x.decode_batch * x.per_replica)
    return load, seqs / x.decode_batch * x.per_replica, seqs


def _over(x: SizingInputs) -> bool:
    """The latency (over the recorded window) is over the SLO."""
    return x.latency_s is not None and x.latency_s > x.slo_s


def _missing_now(x: SizingInputs) -> bool:
    """The latency is over the SLO, and the last minute's is too or was not read."""
    return _over(x) and (x.recent_latency_s is None or x.recent_latency_s > x.slo_s)


def _reactive(x: SizingInputs) -> tuple[int, float]:
    """(replicas the reactive path asks for, 0 when it does not fire; the backlog when new
    replicas are ready, in demand units)."""
    if not (_over(x) or x.backlogged):
        return 0, 0.0
    if x.per_replica <= 0:
        return x.max_replicas, math.inf
    backlog = x.queue * x.per_request_tokens
    excess = max(0.0, x.demand - x.ready * x.per_replica)
    at_lead = backlog + excess * x.lead_s
    # Over the SLO or queueing, the ready replicas are busy whatever the model says: the
    # extra replicas serve the arrivals beyond the model's capacity of the ready ones and
    # drain the backlog they will have left when new replicas are ready.
    reactive = x.ready + math.ceil((excess + at_lead / x.drain_s) / x.per_replica - 1e-9)
    if _missing_now(x):
        reactive = max(reactive, x.ready + 1)
    return reactive, at_lead


def _piled_up(x: SizingInputs) -> bool:
    """Prefill: the replicas ready at the last tick could not carry the busiest minute's
    demand (the peak minute, or the demand where higher) at the profile's plan, so what
    waited then is an overload's pile-up (:func:`_burst_need`)."""
    busiest = max(x.demand, x.peak if x.peak is not None and math.isfinite(x.peak) else 0.0)
    return busiest > x.ready_before * x.nominal_per_replica


def _burst_need(x: SizingInputs) -> tuple[int, float]:
    """Prefill: (replicas that serve the backlog within the TTFT SLO, at most twice the ready
    ones a decision; that backlog in tokens). A burst that arrives within a second leaves a
    queue no per-minute rate shows; the queue seen at a tick measures it. Where the replicas
    ready at the last tick could not carry the busiest minute's demand at the profile's plan,
    what was already waiting then is arrivals they could not serve, not a clump: only what
    joined the queue since counts, and the reactive path sizes the rest (with the lead and
    the drain time). Read as a clump, ServeGen m-small's queues of 17k and 22k requests at
    consecutive ticks (minute 17,051, 11 ready at 0.8 of the busiest minute) asked for 22
    replicas a tick before the starting ones were ready, where the oracle ran 14-16. Where
    the ready replicas could carry it, the whole queue counts: on the Azure trace's start-up
    a queue of 100 then 130 prompts at 9-10 ready replicas with the busiest minute at two
    thirds of their plan was clumps, and sizing only its growth cost one seed at 30 s 1.5
    points. The bound keeps a backlog an under-sized pool piled up from asking for the
    pool's max at once (measured: holding such backlogs tripled the GPU-hours on the Azure
    trace)."""
    if x.role is not Role.PREFILL or x.nominal_per_replica <= 0:
        return 0, 0.0
    waiting = max(0.0, x.queue - x.queue_before) if _piled_up(x) else x.queue
    backlog = waiting * x.per_request_tokens
    need = math.ceil(backlog / (x.nominal_per_replica * x.slo_s) - 1e-9)
    return min(need, 2 * max(x.ready, 1)), backlog


def _tail_need(x: SizingInputs, load: float) -> tuple[int, float, float]:
    """Prefill: (replicas that serve the work arriving within the window at its 95th
    percentile, unbounded (:func:`size` keeps it to twice the need); that work per second;
    the window), 0s when the dispersion is unread or there is no load (see the module
    docstring)."""
    mu = x.saturated_per_replica
    if x.role is not Role.PREFILL or x.dispersion is None or x.dispersion <= 0 or mu <= 0 \
            or load <= 0:
        return 0, 0.0, 0.0
    window = max(x.slo_s, x.dispersion_window_s)
    p95 = load + TAIL_Z * math.sqrt(load * x.dispersion / window)
    return math.ceil(p95 / mu - 1e-9), p95, window


def _decode_tail_need(x: SizingInputs) -> tuple[int, float]:
    """Decode: (replicas whose batches hold the sequences at their 95th percentile, unbounded
    (:func:`size` keeps it to twice the need); the level it adds the spread to, in replicas),
    0s when the spread is unread or there is no load (see the module docstring)."""
    if x.role is not Role.DECODE or x.running_spread is None or x.per_replica <= 0 \
            or x.decode_batch <= 0:
        return 0, 0.0
    level = max(x.demand, x.forecast or 0.0) / x.per_replica
    if x.running_mean is not None:
        level = max(level, x.running_mean / x.decode_batch)
    if level <= 0:
        return 0, 0.0
    return math.ceil(level + TAIL_Z * x.running_spread / x.decode_batch - 1e-9), level


def _tail_term(x: SizingInputs, load: float) -> tuple[int, Callable[[int], str]] | None:
    """The role's tail model: (its need, unbounded; the reason for a need, bounded) or None
    while its measure is unread (prefill: the dispersion; decode: the running sequences'
    spread). Prefill sizes the arriving work at ``load``; decode adds the spread to its level."""
    if x.role is Role.PREFILL and x.dispersion is not None:
        need, work, window = _tail_need(x, load)
        return need, lambda n: (
            f"tail: arriving tokens dispersed {x.dispersion:.4g} (per "
            f"{x.dispersion_window_s:g}s window); the work arriving in {window:g}s at its 95th "
            f"percentile, {work:.4g}/s, needs {n} replicas at {x.saturated_per_replica:.4g}/s "
            "saturated (at most twice the need)")
    if x.role is Role.DECODE and x.running_spread is not None:
        spread = x.running_spread
        need, level = _decode_tail_need(x)
        return need, lambda n: (
            f"tail: running sequences move by {spread:.3g} between readings; their 95th "
            f"percentile adds {TAIL_Z:.4g} x that, {TAIL_Z * spread / x.decode_batch:.2f} "
            f"batches of {x.decode_batch}, to the level's {level:.2f} replicas -> need {n} "
            "(at most twice the need)")
    return None


def size(x: SizingInputs) -> Need:
    """The replicas the pool needs, with its reasons (see the module docstring)."""
    load, waiting, seqs = _load(x)
    peak = x.peak if x.peak is not None and x.hold_half_life_s > 0 else 0.0
    remembered = max(load, peak)
    held = x.hold
    if x.hold_ceiling is not None and x.hold_half_life_s > 0 \
            and x.hold > max(x.hold_ceiling, remembered):
        held = x.hold_ceiling
    capped = held != x.hold
    hold = max(held, remembered) if x.hold_half_life_s > 0 else 0.0
    sized_for = max(load, hold, waiting)
    need = math.ceil(sized_for / x.per_replica) if x.per_replica > 0 else x.max_replicas
    burst_need, burst_backlog = _burst_need(x)
    detail: dict[str, float | str | None] = {
        "signal": DEMAND_SIGNAL[x.role].value, "demand": x.demand, "forecast": x.forecast,
        "quantile": x.quantile if x.forecast is not None else None, "lead_s": x.lead_s,
        "capacity_per_replica": x.per_replica, "sequences": seqs, "burst_hold": hold,
        "hold_half_life_s": x.hold_half_life_s, "hold_ceiling": x.hold_ceiling,
        "hold_uncapped": x.hold if capped else None, "peak_1m": x.peak, "sized_for": sized_for,
        "capacity_correction": x.correction, "need": need}
    reasons = [f"demand {x.demand:.4g}/s, {x.forecast_note}"
               + (f" = {x.forecast:.4g}/s" if x.forecast is not None else "")
               + (f"; {seqs:.0f} sequences running or waiting" if seqs is not None else "")
               + (f"; burst hold {hold:.4g}/s (half-life {x.hold_half_life_s:.0f}s"
                  + (f"; peak minute {peak:.4g}/s" if peak > load else "") + ")"
                  if hold > load else "")
               + (f"; burst hold {x.hold:.4g}/s kept to the forecast's highest over the next "
                  f"10 minutes at q{x.quantile:g}, {x.hold_ceiling:.4g}/s (a day of history)"
                  if capped else ""),
               f"capacity {x.per_replica:.4g}/s per replica (correction "
               f"{x.correction:.2f}), lead {x.lead_s:.0f}s -> need {need}"]
    set_by: Literal["load", "burst", "tail"] = "load"
    if burst_need > need:
        joined = _piled_up(x) and x.queue_before > 0
        rest = ": the rest is the reactive path's" if _over(x) or x.backlogged else ""
        reasons.append(f"burst: {burst_backlog:.4g} tokens "
                       + ("that joined the queue since the last tick (the replicas ready "
                          f"then could not carry the busiest minute{rest})" if joined
                          else "waiting")
                       + f" are served within the {x.slo_s:g}s SLO by {burst_need} replicas "
                       "(at most twice the ready)")
        need, set_by = burst_need, "burst"
    tail = _tail_term(x, sized_for)
    tail_need = None
    if tail is not None:
        tail_need = min(tail[0], 2 * max(need, 1))
        if tail_need > need:
            reasons.append(tail[1](tail_need))
            need, set_by = tail_need, "tail"
    detail.update({"burst_backlog": burst_backlog, "burst_need": burst_need,
                   "queue_before": x.queue_before if x.role is Role.PREFILL else None,
                   "dispersion": x.dispersion if x.role is Role.PREFILL else None,
                   "running_spread": x.running_spread if x.role is Role.DECODE else None,
                   "tail_need": tail_need, "need": need})
    reactive, at_lead = _reactive(x)
    if _over(x) and not _missing_now(x):
        signal = LATENCY_SIGNAL[x.role]
        reasons.append(f"{signal.value} {x.latency_s:.3g}s over the SLO, but "
                       f"{x.recent_latency_s:.3g}s over the last minute: a miss that has "
                       "passed adds no replica")
        detail["recent_latency_p95_s"] = x.recent_latency_s
    if reactive:
        signal = LATENCY_SIGNAL[x.role]
        latency = "n/a" if x.latency_s is None else f"{x.latency_s:.3g}s"
        reasons.append(f"reactive: {signal.value} {latency} vs SLO {x.slo_s:g}s, queue "
                       f"{x.queue:.0f}; backlog when new replicas are ready (in {x.lead_s:.0f}s,"
                       f" {x.ready} ready, {x.starting} starting) {at_lead:.4g}, drained within "
                       f"{x.drain_s:.0f}s -> {reactive} in all")
        detail.update({"latency_signal": signal.value, "latency_p95_s": x.latency_s,
                       "slo_s": x.slo_s, "queue_depth": x.queue, "reactive": reactive,
                       "backlog_at_lead": at_lead, "starting": x.starting})
    return Need(max(need, reactive), need, reactive, remembered, tuple(reasons), detail,
                set_by=set_by)
