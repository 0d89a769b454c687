"""pdscale's scaling policy: forecast-driven, pre-warming, prefill and decode independent.

The policy is a chain of stages; this module is the thin shell that runs them for every pool
each tick and keeps each pool's state (its capacity model, cold-start tracker and history):

1. observe: the pool's cold starts (:class:`ColdStartTracker`), its demand (prefill:
   uncached prompt tokens/s; decode: generated tokens/s) and what its replicas deliver
   (the capacity model's online correction, :mod:`controller._capacity`); missing or stale
   demand holds the pool (never scales it down) and says so;
2. forecast (:mod:`controller._forecast`): the demand at the scale-up quantile over
   [now, now + lead], lead = the pool's learned cold-start p90 + one tick;
3. size (:mod:`controller._sizing`, pure): the replicas the load needs, with the
   burst hold (for prefill at least the peak one-minute demand of the rate window), a
   prefill burst's backlog, the TTFT tail given the measured dispersion of arriving prompt
   tokens (prefill) and the reactive path (whose latency-only "+1" needs the last
   minute's TTFT p95 over the SLO too, not only the 5-minute one);
4. stabilise and bound (:mod:`controller._stabilise`, pure): up at once, down after the
   window and in steps, within min and max.

TTFT includes the wait for a decode slot: while the service's decode pool has a backlog, and
for the recorded latency's window after it (``telemetry.RATE_WINDOW_S``: the p95 still carries
those waits; seen on a real Dynamo stack, TTFT p95 85 s a minute after decode caught up), a
TTFT miss is decode's, and prefill neither reacts to it nor lowers its capacity estimate.
Prefill demand is the engine's own count of computed (uncached) prompt tokens where it exports
one (vLLM 0.34+), else prompt tokens x (1 - prefix hit). A
request's prompt length is the service's, whichever pool reports it. Cross-pool constraints
(GPU budget, P:D ratio) follow in the reconcile loop (:mod:`controller._constraints`).

Every decision carries its reasons and what the loop and the API report (the forecast used,
the lead, the cold-start p90). The policy reads no clock and does no I/O: time comes from the
observation; the forecasters are fitted on the schedule the caller owns.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from pdscale.controller._capacity import CapacityModel
from pdscale.controller._forecast import ForecastStage
from pdscale.controller._interface import (
    Cause,
    Observation,
    PoolDecision,
    PoolKey,
    PoolObservation,
)
from pdscale.controller._observe import (
    DEMAND_SIGNAL,
    LATENCY_SIGNAL,
    ColdStartTracker,
    _computed_share,
    _peak_demand,
    degraded_decision,
    forecast_for,
    usable_length,
)
from pdscale.controller._perf import HEADROOM, uncached_prefill_demand
from pdscale.controller._profiles import load_profile
from pdscale.controller._sizing import SizingInputs, running_spread, size
from pdscale.controller._stabilise import PoolHistory, bound, stabilise
from pdscale.spec import ControllerSettings, Role, Spec
from pdscale.telemetry import DISPERSION_WINDOW_S, RATE_WINDOW_S, Signal

if TYPE_CHECKING:
    from pdscale.controller._model import QueueingPolicy

__all__ = ["ColdStartTracker", "PdscalePolicy", "PoolPolicyState", "build_forecasts",
           "build_policy"]


@dataclass
class PoolPolicyState:
    capacity: CapacityModel
    cold_start: ColdStartTracker
    history: PoolHistory = field(default_factory=PoolHistory)
    ready_seen: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, ready replicas) over the latency window."""
    running_seen: deque[tuple[float, float]] = field(default_factory=deque)
    """Decode: (data time, running sequences) over the rate window."""
    queue_seen: float = 0.0
    """The requests waiting at the pool's last decided tick..."""
    ready_seen_last: int = 0
    """... and the replicas ready then."""

    def forget_last_tick(self) -> None:
        """The pool's next decided tick reads its whole queue, as after a restart: what was
        seen before this tick (degraded, or the pool unobserved) is no longer the last tick's."""
        self.queue_seen, self.ready_seen_last = 0.0, 0

    def mean_ready(self, now_s: float, ready: int, window_s: float) -> float:
        """The ready replicas averaged over the latency window: the p95 of a window that
        straddles a scale-up still carries the smaller pool's latency, so the load it is
        compared with is per replica of that window, not of now."""
        self.ready_seen.append((now_s, ready))
        _drop_before(self.ready_seen, now_s - window_s)
        return sum(n for _, n in self.ready_seen) / len(self.ready_seen)

    def running_readings(self, at_s: float, running: float | None, window_s: float
                         ) -> list[float]:
        """Decode: the running sequences read over the rate window, one reading per sample
        (``at_s``, the sample's time: a sample read again at a later tick, within
        :data:`SAME_SAMPLE_S`, is not a new reading, or a controller ticking faster than the
        recording rule would read spreads of zero; unread or not finite, none is added)."""
        seen = self.running_seen
        if running is not None and math.isfinite(running) and running >= 0 \
                and (not seen or at_s > seen[-1][0] + SAME_SAMPLE_S):
            seen.append((at_s, running))
        _drop_before(seen, at_s - window_s)
        return [v for _, v in seen]

    def running_swing(self, pool: PoolObservation) -> tuple[float | None, float | None]:
        """Decode: the running sequences' spread (:func:`running_spread`) and mean over the
        rate window's readings, this tick's added (:meth:`running_readings`)."""
        readings = self.running_readings(
            pool.data_time_s, pool.signals.get(Signal.RUNNING_REQUESTS), RATE_WINDOW_S)
        return running_spread(readings), float(np.mean(readings)) if readings else None


T = TypeVar("T")


def _drop_before(seen: deque[tuple[float, T]], start_s: float) -> None:
    """Drop the (time, value) readings older than ``start_s`` (a window's start)."""
    while seen and seen[0][0] < start_s:
        seen.popleft()


SAME_SAMPLE_S = 0.5
"""Sample times closer than this are the same sample read again (its time is the tick's less
the sample's age, which rounding may move by a little)."""
QUEUE_WAIT_SHARE = 0.25
"""A prefill queue is a backlog only when the ready replicas need more than this share of the
TTFT SLO to work through it at the profile's saturated throughput..."""
LATENCY_GATE_SHARE = 0.5
"""... and, if they clear it within the SLO, only while the TTFT p95 is over this share of the
SLO (the queues seen over the latency window have been hurting the tail)."""
KV_GATE = 0.8
"""A decode queue is a backlog only while the ITL p95 is over the share of the ITL SLO the
capacity model plans a step for (``HEADROOM``: under it the pool has step time to admit more),
the decode pool's KV cache is at least this full (its waiting sequences wait for memory), or
its running sequences fill this share of the most its serving (ready and draining) replicas
hold (the engine's batch cap or the cache); with any of the three signals unread, any queue over
the count is one."""


def _backlogged(pool: PoolObservation, capacity: CapacityModel | None = None) -> bool:
    """More than two requests waiting a ready replica; for prefill (given its capacity model)
    also a queue the ready replicas need more than :data:`QUEUE_WAIT_SHARE` of the TTFT SLO
    to work through at the profile's saturated throughput, and, when they need less than the
    whole SLO, a TTFT p95 over :data:`LATENCY_GATE_SHARE` of it (or none read). Measured on a
    real Dynamo stack (Mooncake window, 12k-token prompts, TTFT SLO 4.7 s): queues of 5-8 on
    2-3 workers, cleared in well under a second, fired the reactive path three times and
    taught the capacity model "backlogs" at 11-53 % of the planned load, so pdscale ran 3.7
    prefill workers where static 2+1 met the SLO for every request; at a 30 s cold start,
    queues of 13 that 2-3 workers clear in 1.5-2 s, with the p95 at 1.75-2.08 s, added two
    workers the window never needed. For decode (given its capacity model) a queue over the
    count is a backlog only while the ITL p95 is over the planned share of its SLO (``HEADROOM``),
    the KV cache is :data:`KV_GATE` full or the running sequences fill that share of the
    batches the serving replicas hold (or any of these is unread): on the same stack decode queues
    of 3 on one worker, with the ITL p95 at a sixth to a half of its SLO and the cache far from
    full, added a decode worker three times (Azure at 900 s, Mooncake at 870 and 585 s), 9-17 %
    more worker-hours than static 2+1 for nothing; a decode pool short of memory (KV full) or of
    step time (ITL) still counts its queue."""
    queue = pool.signals.get(Signal.QUEUE_DEPTH) or 0.0
    ready = max(pool.replicas.ready, 1)
    if queue <= 2 * ready:
        return False
    if capacity is None:
        return True
    if capacity.role is Role.DECODE:
        itl = pool.signals.get(Signal.ITL_P95_S)
        kv = pool.signals.get(Signal.KV_CACHE_USAGE_RATIO)
        running = pool.signals.get(Signal.RUNNING_REQUESTS)
        if itl is None or kv is None or running is None:
            return True
        # The running count covers draining replicas too (the engines' and the event
        # simulator's), so their sequences are measured against their room as well. Draining
        # replicas admit nothing, so a full ready replica beside a draining one that has
        # nearly emptied reads as less than full (the ready-only room erred the other way,
        # a false backlog during every drain; the split of the count is not read).
        serving = max(pool.replicas.ready + pool.replicas.draining, 1)
        full = running >= KV_GATE * serving * capacity.decode_batch_limit()
        return itl > HEADROOM * capacity.slo_s or kv >= KV_GATE or full
    clear_s = capacity.prefill_queue_s(queue, ready)
    if clear_s <= QUEUE_WAIT_SHARE * capacity.slo_s:
        return False
    p95 = pool.signals.get(Signal.TTFT_P95_S)
    return clear_s > capacity.slo_s or p95 is None or p95 > LATENCY_GATE_SHARE * capacity.slo_s


def _dispersion(pool: PoolObservation, demand: float) -> float | None:
    """Prefill: the arriving prompt tokens' index of dispersion in demand units (all of it
    when no share is known); None when unread."""
    value = pool.signals.get(Signal.PROMPT_TOKENS_DISPERSION)
    if value is None or not math.isfinite(value) or value < 0:
        return None
    share = _computed_share(pool, demand)
    return value * (1.0 if share is None else share)


@dataclass(frozen=True)
class _Context:
    """What a pool's decision needs from the rest of its service this tick."""

    decode_backlogged: bool
    service_prompt_tokens: float | None


class PdscalePolicy:
    """See the module docstring."""

    name = "pdscale"

    def __init__(self, settings: ControllerSettings, capacity: Mapping[PoolKey, CapacityModel],
                 cold_start_s: Mapping[PoolKey, float], *,
                 forecasts: ForecastStage | None) -> None:
        self.settings = settings
        self.tick_s = float(settings.tick)
        self.forecasts = forecasts
        self.state = {key: PoolPolicyState(model, ColdStartTracker(cold_start_s[key]))
                      for key, model in capacity.items()}
        self.decode_backlog_at: dict[str, float] = {}
        """Per service, when its decode pool last had a backlog."""

    def lead_s(self, key: PoolKey) -> float:
        return self.state[key].cold_start.p90_s + self.tick_s

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        now = observation.now_s
        for key, pool in observation.pools.items():
            if key[1] is Role.DECODE and _backlogged(pool):
                self.decode_backlog_at[key[0]] = now
        decode_backlog = {service for service, at in self.decode_backlog_at.items()
                          if now - at <= RATE_WINDOW_S}
        prompt_len: dict[str, float] = {}
        for key, pool in observation.pools.items():
            value = pool.signals.get(Signal.MEAN_PROMPT_TOKENS)
            if usable_length(value):
                prompt_len.setdefault(key[0], value)
        for key, st in self.state.items():
            if key not in observation.pools:
                # Not decided this tick: its pending scale-ups are not timed either (when they
                # became ready is unseen).
                st.forget_last_tick()
                st.cold_start.forget_pending()
        return {key: self._decide_pool(key, pool, observation.now_s, _Context(
                    key[0] in decode_backlog, prompt_len.get(key[0])))
                for key, pool in observation.pools.items() if key in self.state}

    def _observe(self, key: PoolKey, pool: PoolObservation, ctx: _Context, demand: float,
                 peak: float | None) -> tuple[float, int, float | None, bool, str | None]:
        """Teach the capacity model the lengths and the latency (a miss at the larger of the
        demand and ``peak``, the prefill peak minute); returns the capacity per
        replica it planned with, the pool's own latency (None when the miss is decode's),
        whether it is backlogged, and the note saying so."""
        st = self.state[key]
        signals = pool.signals
        prompt = signals.get(Signal.MEAN_PROMPT_TOKENS)
        if not usable_length(prompt):  # unread here (decode): the service's
            prompt = ctx.service_prompt_tokens
        st.capacity.observe_lengths(prompt, signals.get(Signal.MEAN_OUTPUT_TOKENS))
        per_replica, batch = st.capacity.per_replica(), st.capacity.decode_batch()
        latency = signals.get(LATENCY_SIGNAL[key[1]])
        backlogged = _backlogged(pool, st.capacity)
        note = None
        if key[1] is Role.PREFILL and ctx.decode_backlogged and not backlogged and \
                latency is not None and latency > st.capacity.slo_s:
            note = (f"{LATENCY_SIGNAL[key[1]].value} {latency:.3g}s over the SLO while decode "
                    f"is or was backlogged (within {RATE_WINDOW_S:.0f}s): decode's miss, not "
                    "prefill's")
            latency = None  # no reaction and no learning here
        ready = max(st.mean_ready(pool.data_time_s, pool.replicas.ready, RATE_WINDOW_S), 1.0)
        # Decode's running sequences count every replica serving, draining ones too.
        running = signals.get(Signal.RUNNING_REQUESTS) if key[1] is Role.DECODE else None
        serving = pool.replicas.ready + pool.replicas.draining
        st.capacity.observe_latency(
            latency_p95_s=latency, demand_per_replica=demand / ready,
            peak_per_replica=None if peak is None else peak / ready,
            running_per_replica=None if running is None or serving < 1 else running / serving,
            backlogged=backlogged, now_s=pool.data_time_s)
        if st.capacity.last_learned is not None:
            note = st.capacity.last_learned if note is None else \
                f"{note}; {st.capacity.last_learned}"
        return per_replica, batch, latency, backlogged, note

    def _decide_pool(self, key: PoolKey, pool: PoolObservation, now: float,
                     ctx: _Context) -> PoolDecision:
        st = self.state[key]
        r = pool.replicas
        settings = self.settings
        st.cold_start.observe(now, r.ready)
        demand = pool.signals.get(DEMAND_SIGNAL[key[1]])
        hit = pool.signals.get(Signal.PREFIX_CACHE_HIT_RATIO) or 0.0
        if demand is None:
            st.forget_last_tick()
            return degraded_decision(key, pool, st.cold_start.p90_s)
        computed = pool.signals.get(Signal.PROMPT_TOKENS_COMPUTED_PER_S)
        if key[1] is Role.PREFILL and computed is not None:
            demand = computed  # the engine's own count of uncached tokens (vLLM 0.34+)
        elif key[1] is Role.PREFILL:
            demand = uncached_prefill_demand(demand, hit)
        prefill = key[1] is Role.PREFILL
        peak = _peak_demand(pool, demand) if prefill else None
        per_replica, batch, latency, backlogged, note = self._observe(key, pool, ctx, demand,
                                                                      peak)
        if self.forecasts is not None:
            self.forecasts.observe(key, pool.data_time_s, demand)
        lead = self.lead_s(key)
        forecast, fc_note = forecast_for(self.forecasts, key, now, lead,
                                         settings.scale_up_quantile)
        window = float(settings.burst_window)
        if st.history.first_seen_s is None and self.forecasts is not None:
            # A start or restart: the burst hold from the history the forecasts were warmed
            # with, so the pool is sized for what recent bursts needed at once.
            st.history = st.history.seeded(
                self.forecasts.recent(key, now - 4 * window), now, window)
        cap = st.capacity
        spread, in_flight = (None, None) if prefill else st.running_swing(pool)
        queue = pool.signals.get(Signal.QUEUE_DEPTH) or 0.0
        need = size(SizingInputs(
            role=key[1], demand=demand,
            forecast=forecast.sized_value if forecast is not None else None,
            forecast_note=fc_note, per_replica=per_replica, decode_batch=batch,
            running=pool.signals.get(Signal.RUNNING_REQUESTS),
            queue=queue, latency_s=latency,
            recent_latency_s=pool.signals.get(Signal.TTFT_P95_RECENT_S) if prefill else None,
            slo_s=cap.slo_s, backlogged=backlogged,
            per_request_tokens=(cap.mean_prompt_tokens if key[1] is Role.PREFILL
                                else cap.mean_output_tokens),
            ready=r.ready, starting=r.starting, max_replicas=r.max_replicas,
            hold=st.history.hold(now, window),
            hold_ceiling=forecast.ceiling if forecast is not None else None,
            peak=peak,
            nominal_per_replica=cap.nominal_per_replica(),
            hold_half_life_s=st.history.half_life_s(now, window) if window > 0 else 0.0,
            drain_s=float(settings.drain_time), lead_s=lead,
            quantile=settings.scale_up_quantile, correction=cap.correction,
            dispersion=_dispersion(pool, demand) if prefill else None,
            dispersion_window_s=DISPERSION_WINDOW_S,
            saturated_per_replica=cap.saturated_prefill() if prefill else 0.0,
            running_spread=spread, running_mean=in_flight, queue_before=st.queue_seen,
            ready_before=st.ready_seen_last))
        st.queue_seen, st.ready_seen_last = queue, r.ready
        history = st.history.remember_load(now, need.load, window)
        detail = {**need.detail, "prefix_cache_hit_ratio": hit}
        reasons = list(need.reasons)
        if note is not None:
            reasons.append(note)
        if ctx.decode_backlogged and latency is None and note is not None \
                and "decode's miss" in note:
            detail["blamed_on"] = "decode"
        out = stabilise(need, history, now_s=now, current=r.active,
                        max_replicas=r.max_replicas,
                        stabilisation_s=float(settings.stabilisation),
                        max_step_down=settings.max_step_down, burst_window_s=window)
        st.history = out.history
        if out.asked is not None:
            st.cold_start.asked(now, out.asked)
        if out.cancelled_above is not None:
            st.cold_start.cancel_above(out.cancelled_above)
        reasons += out.reasons
        detail.update(out.detail)
        bounded, which = bound(out.desired, r)
        cause = out.cause
        if which is not None:
            reasons.append(f"bound: {which} replicas {bounded}")
            detail["bound"] = which
            if bounded != r.active:
                cause = Cause.BOUND
        return PoolDecision(bounded, tuple(reasons), cause=cause, detail=detail,
                            forecast=forecast, lead_s=lead,
                            cold_start_p90_s=st.cold_start.p90_s)


def _pools(spec: Spec, cold_start_s: Mapping[PoolKey, float] | None
           ) -> dict[PoolKey, tuple[CapacityModel, float]]:
    out: dict[PoolKey, tuple[CapacityModel, float]] = {}
    for svc in spec.services:
        for role, pool in svc.pools.items():
            key = (svc.name, role)
            slo = svc.slo.ttft_p95_s if role is Role.PREFILL else svc.slo.itl_p95_s
            cold = pool.cold_start_p90_s
            if cold_start_s and key in cold_start_s:
                cold = cold_start_s[key]
            out[key] = (CapacityModel(role, load_profile(pool.profile), slo), cold)
    return out


def build_forecasts(spec: Spec, *, cold_start_s: Mapping[PoolKey, float] | None = None
                    ) -> ForecastStage:
    """The forecast stage for every pool of the spec (its controller settings)."""
    tick = float(spec.controller.tick)
    leads = {key: cold + tick for key, (_, cold) in _pools(spec, cold_start_s).items()}
    return ForecastStage(leads, spec.controller)


def build_policy(spec: Spec, *, forecasts: ForecastStage | None,
                 cold_start_s: Mapping[PoolKey, float] | None = None
                 ) -> PdscalePolicy | QueueingPolicy:
    """pdscale's policy for every pool of the spec, configured by its ``controller``
    section (``controller.sizing.model`` picks the sizing); ``forecasts`` (from
    :func:`build_forecasts`, None: size on the current demand) is the stage the reconcile loop
    refits."""
    pools = _pools(spec, cold_start_s)
    if spec.controller.sizing.model == "queueing":
        from pdscale.controller._model import QueueingPolicy

        return QueueingPolicy(spec.controller, {k: m.profile for k, (m, _) in pools.items()},
                              {k: m.slo_s for k, (m, _) in pools.items()},
                              {k: c for k, (_, c) in pools.items()}, forecasts=forecasts)
    return PdscalePolicy(spec.controller, {k: m for k, (m, _) in pools.items()},
                         {k: c for k, (_, c) in pools.items()}, forecasts=forecasts)
