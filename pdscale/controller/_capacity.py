"""Capacity model: how much demand one replica serves at the SLO.

Prefill demand is uncached prompt tokens per second (prompt tokens x (1 - prefix hit rate));
a replica serves its saturated chunked-prefill throughput for the length mix, times a target
utilisation that leaves room for queueing within the TTFT SLO. Decode demand is generated
tokens per second; a replica serves B tokens per step, where B is the largest batch whose step
time stays within the ITL SLO (with headroom) and whose KV cache fits, so its capacity is
B / step(B) tokens per second. The arithmetic is the performance model's
(:mod:`controller._perf`); this module tracks the length mix and corrects it online.

Online correction (the standing need learned from the pool's own minutes): when a pool
misses its latency SLO at a load the model said it could carry, the model was optimistic for
this pool's arrivals (clumped arrivals need standing capacity the mean load does not show):
the correction moves a quarter of the way a tick towards 0.9 of the load the miss happened at
(the latency window's busiest minute where it is known), so it converges within minutes and
one bad minute moves it at most to just under the load it was seen at. A prefill latency miss
far under the planned load, with no backlog, is one the load cannot explain
(:data:`MIN_MISS_LOAD`) and teaches nothing.

Slack raises it. Prefill: within half the SLO, the p95 extrapolated by queueing (waiting grows
as rho / (1 - rho) with the utilisation rho) says how far the utilisation may rise before the
p95 reaches half the SLO (at most 95 % of the saturated throughput); the correction moves a
tenth of the way a tick towards it. Under half the profile's (uncorrected) plan the same
reading lifts a lowered correction, at most back to 1 (a pool the misses made large runs at a
low load, which is where it shows it is no longer short). The plan's
fixed headroom is a guess for unknown arrivals; the pool's own p95 at its own load measures it
(on ServeGen's smooth load a pool at 80-88 % of its saturated throughput read a TTFT p95 of
65-90 ms against a 0.5 s SLO). Decode: well within the SLO at or above the planned load, the
model was pessimistic (+10 %, slowly). Without misses a lowered correction relaxes back towards
1 over hours (what bursts needed is kept while they recur), or faster where the prefill p95
shows more slack than that; a tick that misses is no time without misses. The load per replica
is the latency window's (the policy averages the ready replicas over it). Bounded to [0.3, 1.5]
of the profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdscale.controller._observe import usable_length
from pdscale.controller._perf import (
    HEADROOM,
    DecodePoint,
    decode_batch_limit,
    decode_operating_point,
    prefill_capacity,
)
from pdscale.controller._profiles import InstanceProfile
from pdscale.spec import Role

__all__ = ["MIN_MISS_LOAD", "CapacityModel", "usable_length"]

MIN_MISS_LOAD = 0.5
"""A prefill latency miss (with no backlog) below this share of the planned load is not learned
from: see :meth:`CapacityModel.observe_latency`."""
SLACK_SHARE = 0.5
"""Prefill: the share of the TTFT SLO the queueing extrapolation plans the p95 at (see
:meth:`CapacityModel.observe_latency`)."""
MAX_UTILISATION = 0.95
"""Prefill: the highest share of the saturated throughput the extrapolation plans for."""
LENGTH_READINGS = 20
"""The length mix is the mean of the readings until there are this many, then moves 1/20 of the
way a reading: a pool is planned for its own lengths from its first reading on, and one
unrepresentative early reading (a warm-up prompt) weighs no more than the readings after it."""
RUNNING_SHOWN = 1.05
"""Decode: a miss's reason says how much of the plan's batch runs now when that is this much
over the window's mean load (both against the plan)."""
MIN_SLACK_LOAD = 0.5
"""Prefill: under this share of the uncorrected plan, slack lifts a lowered correction at most
back to 1 (see :meth:`CapacityModel._queueing_target`)."""

@dataclass
class CapacityModel:
    """Per-replica capacity of one pool, with a bounded online correction."""

    role: Role
    profile: InstanceProfile
    slo_s: float
    """TTFT SLO for prefill, ITL SLO for decode."""
    mean_prompt_tokens: float = 1500.0
    prompt_cv: float = 1.5
    """Coefficient of variation of prompt lengths (LLM prompts are heavy-tailed); with the
    mean it gives E[L^2], which sets the attention cost per token."""
    mean_output_tokens: float = 200.0
    correction: float = 1.0
    min_correction: float = 0.3
    max_correction: float = 1.5
    smoothing: float = 0.1
    """Step towards a higher estimate (prefill: the queueing extrapolation's; decode: ample
    slack at or above the planned load)."""
    learn_rate: float = 0.25
    """Step towards a lower estimate (a miss at or under the planned load)."""
    relax_s: float = 7200.0
    """Time constant of the relaxation back towards 1 without misses."""
    last_learned: str | None = None
    """What the latest correction learned from, for the decision's reasons."""
    _relaxed_at: float | None = field(default=None, repr=False)
    _prompt_n: int = field(default=0, repr=False)
    _output_n: int = field(default=0, repr=False)
    _point: tuple[tuple[float, float], DecodePoint] | None = field(default=None, repr=False)

    def observe_lengths(self, mean_prompt: float | None, mean_output: float | None) -> None:
        """Track the length mix (it changes the per-token cost): the mean of the readings so
        far until there are :data:`LENGTH_READINGS`, then slowly (each reading 1 /
        :data:`LENGTH_READINGS` of the way). A reading that is absent, not positive or not
        finite is skipped."""
        self.mean_prompt_tokens, self._prompt_n = _track(self.mean_prompt_tokens,
                                                         self._prompt_n, mean_prompt)
        self.mean_output_tokens, self._output_n = _track(self.mean_output_tokens,
                                                         self._output_n, mean_output)

    def nominal_per_replica(self) -> float:
        """Demand units per second one replica carries at the SLO, before correction."""
        if self.role is Role.PREFILL:
            return self._prefill_capacity(HEADROOM)
        return self._decode_point().tokens_per_s

    def _prefill_capacity(self, headroom: float) -> float:
        mean_sq = self.mean_prompt_tokens ** 2 * (1 + self.prompt_cv ** 2)
        return prefill_capacity(self.profile, self.mean_prompt_tokens, mean_sq,
                                headroom=headroom)

    def saturated_prefill(self) -> float:
        """Prefill: uncached prompt tokens/s one replica computes saturated, for the length
        mix, by the profile alone (no headroom, no correction)."""
        return self._prefill_capacity(1.0)

    def prefill_queue_s(self, queue: float, ready: int) -> float:
        """Prefill: seconds ``ready`` replicas need to work through ``queue`` waiting prompts
        of the mean length at the profile's saturated throughput (inf if it has none)."""
        saturated = self.saturated_prefill()
        if saturated <= 0:
            return math.inf
        return queue * self.mean_prompt_tokens / (max(ready, 1) * saturated)

    def _decode_point(self) -> DecodePoint:
        """The decode operating point at the ITL SLO with headroom, for the mean context of a
        decoding sequence (cached: the lengths move slowly)."""
        ctx = self.mean_prompt_tokens + self.mean_output_tokens / 2
        key = (round(ctx, 3), self.slo_s)
        if self._point is None or self._point[0] != key:
            self._point = (key, decode_operating_point(self.profile, self.slo_s * HEADROOM, ctx))
        return self._point[1]

    def decode_batch_limit(self) -> int:
        """The most sequences one decode replica holds at all (the engine's cap or its KV
        cache, for the mean context), whatever the ITL."""
        return decode_batch_limit(self.profile, self.mean_prompt_tokens +
                                  self.mean_output_tokens / 2)

    def decode_batch(self) -> int:
        """Sequences one decode replica holds at the ITL SLO (with the correction)."""
        return max(1, math.floor(self._decode_point().batch * min(self.correction, 1.0)))

    def per_replica(self) -> float:
        return self.nominal_per_replica() * self.correction

    def _queueing_target(self, latency_p95_s: float | None,
                         demand_per_replica: float) -> tuple[float, str] | None:
        """Prefill within the SLO: the higher correction at which the p95, extrapolated by
        queueing, would reach :data:`SLACK_SHARE` of the SLO, and the reason saying so (None
        when the minute says nothing, or allows no more than the correction already plans).

        The whole p95 is taken as waiting, which grows as rho / (1 - rho) with the utilisation
        rho of the saturated throughput (Kingman's heavy-traffic form, whatever the arrivals'
        burstiness): p95(rho) = p95_seen x f(rho) / f(rho_seen). Counting the prompts' own
        service time as waiting over-states the growth, so for a profile that is right the
        utilisation it allows is a lower bound; at most :data:`MAX_UTILISATION`. Read only
        under that utilisation (near saturation a 5-minute p95 is far from the queue's steady
        state, and an optimistic profile under-states rho) and with the p95 within
        :data:`SLACK_SHARE` of the SLO (over it, there is no slack to extrapolate). Slack only
        raises the correction: lowering it is the misses' to do.

        Under :data:`MIN_SLACK_LOAD` of the uncorrected plan the p95 is mostly the prompts' own
        service time, which the extrapolation counts as waiting (still a lower bound, if a
        loose one); a quiet pool's reading does not raise the plan over the profile's, but it
        does lift a correction the misses lowered, at most back to 1. That is where such a pool
        runs: after a rise from a quiet stretch (ServeGen's), misses that the starting
        replicas explain took the correction to 0.3-0.4 within minutes, the pool that it
        sized carried its load at a quarter of the profile's plan with a p95 a tenth of the
        SLO, and the correction waited on the relaxation, over hours, to rise."""
        saturated = self.saturated_prefill()
        nominal = self.nominal_per_replica()
        if latency_p95_s is None or not math.isfinite(latency_p95_s) or latency_p95_s <= 0 \
                or latency_p95_s > SLACK_SHARE * self.slo_s or saturated <= 0 \
                or nominal <= 0 or not 0 < demand_per_replica < math.inf:
            return None
        rho = demand_per_replica / saturated
        if rho >= MAX_UTILISATION:
            return None
        grow = SLACK_SHARE * self.slo_s / latency_p95_s * rho / (1.0 - rho)
        allowed = min(MAX_UTILISATION, grow / (1.0 + grow))
        target = min(self.max_correction, allowed * saturated / nominal)
        quiet = demand_per_replica < MIN_SLACK_LOAD * nominal
        if quiet:
            target = min(target, 1.0)
        if target < self.correction + 0.005:
            return None
        return target, (
            f"TTFT p95 {latency_p95_s:.3g}s at {rho:.0%} of the saturated throughput: "
            f"queueing (as rho/(1-rho)) keeps it within {SLACK_SHARE:.0%} of the SLO up to "
            f"{allowed:.0%}: capacity correction towards {target:.2f}"
            + (f" (at most the profile's under {MIN_SLACK_LOAD:.0%} of its plan)"
               if quiet else ""))

    def _plan_share(self, running_per_replica: float | None) -> float | None:
        """Decode: the sequences a replica runs now, as a share of the plan's batch (with the
        correction); None for prefill or when unread."""
        if self.role is not Role.DECODE or running_per_replica is None \
                or not math.isfinite(running_per_replica) or running_per_replica < 0:
            return None
        batch = self._decode_point().batch * self.correction
        return running_per_replica / batch if batch > 0 else None

    def observe_latency(self, *, latency_p95_s: float | None, demand_per_replica: float | None,
                        backlogged: bool = False, now_s: float | None = None,
                        peak_per_replica: float | None = None,
                        running_per_replica: float | None = None) -> None:
        """Correct towards what replicas actually deliver, only from informative minutes: a
        miss at or below planned load (optimistic model); for prefill, slack extrapolated
        by queueing (:meth:`_queueing_target`: the p95 over ``rho / (1 - rho)`` is what the
        arrivals' burstiness costs, so it says how far the load may rise; under half the
        profile's plan, at most back to the profile's); for decode, ample slack at or above
        the planned load (pessimistic model). Decode's slack below the planned load says
        nothing about the model (raising the estimate on it made pools shrink into overload
        and back, in a cycle): it only lets a lowered correction relax back over hours.

        A miss is learned at the load it most likely happened at: the larger of the latency
        window's mean load and its busiest minute's (``peak_per_replica``, prefill), both per
        replica averaged over the window. A prefill latency miss with no backlog below
        :data:`MIN_MISS_LOAD` of the planned load teaches nothing: the load cannot explain it
        (a clump within seconds, which the tail model sizes for, or a prompt too long for the
        SLO on any number of replicas). Learning from such misses moved the estimate an eighth
        lower (a quarter of the way to half) on every tick the miss stayed in the 5-minute
        window: one burst minute on the Azure code trace ran it down to its floor, 0.3 of the
        profile, for the whole hour. Decode has no peak signal (its tail model sizes for the
        running sequences' swings, not for a miss): its misses are learned at any load, as
        before; when the sequences a replica runs now
        (``running_per_replica``) are :data:`RUNNING_SHOWN` over the window's mean load, the
        reason says how many of the plan's run (:func:`_running_note`), and the lesson stands
        (learning at the load now instead cost ServeGen 0.11-0.13 points). A tick that misses,
        learned from or not, does not count towards the relaxation."""
        self.last_learned = None
        if demand_per_replica is None or demand_per_replica <= 0:
            return
        if latency_p95_s is None and not backlogged:
            return
        planned = self.per_replica()
        at_miss, busiest = demand_per_replica, ""
        if peak_per_replica is not None and math.isfinite(peak_per_replica) \
                and peak_per_replica > at_miss:
            at_miss, busiest = peak_per_replica, " (its busiest minute)"
        load = at_miss / planned
        over = latency_p95_s is not None and latency_p95_s > self.slo_s
        missed = backlogged or over
        what = "missed the SLO" if over else "a backlog built"
        since = self._relaxed_at if self._relaxed_at is not None else now_s
        if now_s is not None:
            # Relaxation is over the time since the last tick read, so a tick that misses,
            # learned from or not, is no time without misses.
            self._relaxed_at = now_s
        if missed and not backlogged and load < MIN_MISS_LOAD and self.role is Role.PREFILL:
            self.last_learned = (f"missed the SLO at {load:.0%} of the planned load{busiest}, "
                                 "which the load does not explain: capacity unchanged")
            return
        # Without misses, a lowered correction relaxes towards 1 over the time since the
        # last tick read (the prefill slack below may move it further, never less).
        relaxed = self.correction
        if not missed and now_s is not None and since is not None and self.correction < 1.0:
            relaxed += (1 - math.exp(-max(0.0, now_s - since) / self.relax_s)) * \
                (1.0 - self.correction)
        if missed and load <= 1.0:
            target = self.correction * max(0.5, 0.9 * load)
            new = self.correction + self.learn_rate * (target - self.correction)
            self.last_learned = (f"{what} at {load:.0%} of the planned load{busiest}"
                                 f"{_running_note(self._plan_share(running_per_replica), load)}: "
                                 f"capacity correction towards {target:.2f}")
        elif not missed and self.role is Role.PREFILL and \
                (queueing := self._queueing_target(latency_p95_s, demand_per_replica)) \
                is not None:
            target, self.last_learned = queueing
            new = max(relaxed, self.correction + self.smoothing * (target - self.correction))
        elif not missed and self.role is Role.DECODE and latency_p95_s is not None \
                and latency_p95_s < 0.5 * self.slo_s and demand_per_replica >= planned:
            new = self.correction + self.smoothing * 0.1 * self.correction
            self.last_learned = (f"ample slack at {demand_per_replica / planned:.0%} of the "
                                 "planned load")
        elif relaxed != self.correction:
            new = relaxed
        else:
            return
        self.correction = min(self.max_correction, max(self.min_correction, new))


def _running_note(share: float | None, load: float) -> str:
    """Decode: the words a miss's reason adds when the sequences running now (``share`` of the
    plan's batch) are :data:`RUNNING_SHOWN` over the load it is learned at (``load``, of the
    plan). A reading, not a verdict: more sequences than the window's mean load explains follow
    a rise of the load within the window, or replicas slower than the profile (a slower step
    holds more sequences at the same load), or a correction under 1 (a replica holds its whole
    batch, over the corrected plan's). The lesson is learned all the same: after a rise it is
    headroom for the next."""
    if share is None or share <= RUNNING_SHOWN * load:
        return ""
    return f", with {share:.0%} of the planned sequences running now"


def _track(mean: float, readings: int, reading: float | None) -> tuple[float, int]:
    """One length of the mix and the readings taken: the mean of the readings until there are
    :data:`LENGTH_READINGS`, then 1/:data:`LENGTH_READINGS` of the way a reading; a reading
    that is absent, not positive or not finite leaves both as they are."""
    if not usable_length(reading):
        return mean, readings
    readings += 1
    return mean + (reading - mean) / min(readings, LENGTH_READINGS), readings
