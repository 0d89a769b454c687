"""pdscale's policy: what each pool's decision reads, each pool sized by the queueing model
(:mod:`controller._queueing`), and the policy built from a spec (:func:`build_policy`).

Per pool and tick (docs/sizing.md has the equations and a worked example): read its cold
starts, demand (prompt tokens/s for prefill, generated tokens/s for decode) and latency (the
SLO's TTFT and ITL p95); a pool whose demand is missing or stale is held, never scaled down on
no data. Size for the larger of the demand now (plus the queue's growth; prefill's busiest
minute) and the forecast's quantile over the lead (the cold start p90 plus a tick; decode: at
least what prefill delivers), and for the backlog the new replicas will meet; learn one
correction of the profile's service rate from latency read with no backlog; scale up at once
and down to the stabilisation window's highest need, ``max_step_down`` a tick. A missing
optional signal has a stated fallback that the decision names.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import TypeGuard

import numpy as np
from scipy.optimize import brentq

from pdscale.controller._forecast import ForecastStage, NoForecast
from pdscale.controller._interface import Cause, Observation, PoolDecision, PoolForecast, PoolKey
from pdscale.controller._interface import PoolObservation as Pool
from pdscale.controller._perf import uncached_prefill_demand
from pdscale.controller._profiles import InstanceProfile, load_profile
from pdscale.controller._queueing import (
    DecodeLoad,
    PrefillLoad,
    Sized,
    decode_replicas,
    predicted_ttft_s,
    prefill_replicas,
)
from pdscale.spec import ControllerSettings, Role, Spec
from pdscale.telemetry import RATE_WINDOW_S, RECENT_WINDOW_S, Signal

__all__ = ["ColdStartTracker", "Correction", "PdscalePolicy", "build_forecasts", "build_policy"]

DEMAND_SIGNAL = {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S,
                 Role.DECODE: Signal.GENERATION_TOKENS_PER_S}
LATENCY_SIGNAL = {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}


def finite(reading: float | None) -> TypeGuard[float]:
    """A reading that is present and finite (a ratio of empty counters reads NaN)."""
    return reading is not None and math.isfinite(reading)


def usable_length(reading: float | None) -> TypeGuard[float]:
    """A length reading the policy can take: present, positive and finite (an engine with no
    request yet reads NaN, a broken counter ratio inf)."""
    return finite(reading) and reading > 0


@dataclass
class ColdStartTracker:
    """Time from a scale-up to the replicas being ready: ``p90_s``, the p90 of the last 50
    (the value given until three are timed). A rise in the active replicas (ready plus
    starting) is a start, timed until that many are ready."""

    p90_s: float
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    _pending: list[tuple[float, int]] = field(default_factory=list)  # (asked at, ready target)
    _active: int | None = None  # at the last look

    def asked(self, now_s: float, ready_target: int) -> None:
        self._pending.append((now_s, ready_target))

    def observe(self, now_s: float, ready: int, active: int | None = None) -> None:
        timed = [now_s - at for at, target in self._pending if ready >= target]
        self._pending = [(at, target) for at, target in self._pending if ready < target]
        self.samples.extend(timed)
        if timed and len(self.samples) >= 3:
            self.p90_s = float(np.percentile(np.array(self.samples), 90))
        if active is not None and self._active is not None and active > self._active:
            self.asked(now_s, active)
        self._active = active

    def forget_pending(self) -> None:
        """Drop the scale-ups still waiting to be ready: the pool went unobserved, so when
        they became ready is unknown (timed on its return, the gap would count as start-up)."""
        self._pending, self._active = [], None

    def cancel_above(self, target: int) -> None:
        self._pending = [(t, n) for t, n in self._pending if n <= target]


def prefix_hits(pool: Pool, prompt_tokens_per_s: float) -> float | None:
    """Prefill: the share of prompt tokens its prefix cache served, the engine's hit ratio or,
    where only the computed prompt tokens are counted, one minus their share of the prompt
    tokens; None where neither is read (no hits are assumed)."""
    hit = pool.signals.get(Signal.PREFIX_CACHE_HIT_RATIO)
    if not finite(hit):
        computed = pool.signals.get(Signal.PROMPT_TOKENS_COMPUTED_PER_S)
        if not finite(computed) or prompt_tokens_per_s <= 0:
            return None
        hit = 1 - computed / prompt_tokens_per_s
    return min(1.0, max(0.0, hit))


def forecast_for(forecasts: ForecastStage | None, key: PoolKey, now: float, lead: float,
                 quantile: float) -> tuple[PoolForecast | None, str]:
    """The pool's forecast over ``lead`` and the words a decision says of it (or why there is
    none: no forecast stage, or the stage's reason)."""
    if forecasts is None:
        return None, "forecast: off, sizing on the current demand"
    got = forecasts.forecast(key, now, lead)
    if isinstance(got, NoForecast):
        return None, got.reason
    return got, f"forecast q{quantile:g} over {lead:.0f}s"


def degraded_decision(key: PoolKey, pool: Pool,
                      cold_start_p90_s: float) -> PoolDecision:
    """Hold a pool whose demand is missing or stale: never scale it down on no data."""
    held, signal = max(pool.replicas.desired, pool.replicas.active), DEMAND_SIGNAL[key[1]].value
    return PoolDecision(held, (f"degraded: {signal} missing or stale; holding {held} replicas, "
                               "no scale-down",), cause=Cause.DEGRADED,
                        detail={"signal": signal, "held": held}, cold_start_p90_s=cold_start_p90_s)


PROMPT_TOKENS_UNREAD, OUTPUT_TOKENS_UNREAD = 1000.0, 200.0
"""The lengths planned for before the first length reading (the decision says so)."""
READ_QUANTILE = 0.95
"""The percentile of the latency readings the correction is learned from (p95)."""


@dataclass
class Correction:
    """One multiplicative correction of a pool's service rate, learned in log space."""

    value: float = 1.0
    spread: float = 0.0
    """Root mean square of the readings' log distance from the value (its uncertainty)."""
    readings: int = 0

    def learn(self, implied: float, *, rate: float, low: float, high: float) -> None:
        step = math.log(min(high, max(low, implied))) - math.log(self.value)
        self.spread = math.sqrt((1 - rate) * self.spread**2 + rate * step**2)
        self.value = min(high, max(low, self.value * math.exp(rate * step)))
        self.readings += 1


def _solve(predict: Callable[[float], float], observed: float, low: float,
           high: float) -> float:
    """The correction in [low, high] at which ``predict(k)``, falling in k, equals
    ``observed`` (the nearer end beyond the range), to 2e-5 in log k: Brent's method on the
    logs, an unstable queue's infinite prediction capped to keep the bracket finite."""
    target = math.log(observed)

    def f(x: float) -> float:  # falls as x grows; its root is the correction's log
        return min(math.log(predict(math.exp(x))) - target, 50.0)

    a, b = math.log(low), math.log(high)
    if f(a) <= 0:
        return low  # slower than even the lowest correction predicts
    if f(b) >= 0:
        return high
    return math.exp(brentq(f, a, b, xtol=2e-5))


@dataclass
class PoolModelState:
    profile: InstanceProfile
    slo_s: float
    cold_start: ColdStartTracker
    objective: float
    """The share of requests the SLO wants within its thresholds: the percentile sized at."""
    correction: Correction = field(default_factory=Correction)
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    queue_seen: tuple[float, float] | None = None  # (data time, queue) last read
    growth_rps: float = 0.0  # requests/s the queue grew by at the last reading
    queued_at: float = -math.inf  # data time a backlog was last seen
    serving: deque[tuple[float, int, int]] = field(default_factory=deque)
    """(time, ready, draining) at each tick of the last two rate windows: a reading is
    paired with the replicas that produced it, not those of now."""
    needs: deque[tuple[float, int]] = field(default_factory=deque)  # (time, need) in window
    prefix_aware: bool = False  # the router sends a prompt to the replica with its prefix

    def serving_at(self, t: float) -> tuple[int, int]:
        """(ready, draining) last seen at or before ``t`` (before the first look: its)."""
        for seen, r, d in reversed(self.serving):
            if seen <= t:
                return r, d
        return self.serving[0][1:] if self.serving else (0, 0)

    def prompt(self) -> float:
        return self.prompt_tokens or PROMPT_TOKENS_UNREAD

    def output(self) -> float:
        return self.output_tokens or OUTPUT_TOKENS_UNREAD


class PdscalePolicy:
    """See the module docstring. ``pools``: each pool's profile, SLO (s) and cold start p90
    (s); ``objective``: each service's ``slo.objective``."""

    name = "pdscale"

    def __init__(self, settings: ControllerSettings,
                 pools: Mapping[PoolKey, tuple[InstanceProfile, float, float]], *,
                 forecasts: ForecastStage | None, objective: Mapping[str, float],
                 prefix_aware: Collection[str] = ()) -> None:
        self.settings, self.forecasts = settings, forecasts
        self.tick_s = float(settings.tick)
        # Per service, this tick: the requests/s prefill is sized to deliver (decode's floor)
        # and the prompt tokens' index of dispersion over the mean prompt.
        self.service_rps: dict[str, float] = {}
        self.service_dispersion: dict[str, float] = {}
        self.state = {key: PoolModelState(profile, slo, ColdStartTracker(cold), objective[key[0]],
                                          prefix_aware=key[0] in prefix_aware)
                      for key, (profile, slo, cold) in pools.items()}

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        # Prompt lengths are read where prompts finish: prefill counts a request's prompt at
        # its prefill, decode at its last token.
        prompts = {key[0]: v for key, p in observation.pools.items() if key[1] is Role.PREFILL
                   and usable_length(v := p.signals.get(Signal.MEAN_PROMPT_TOKENS))}
        for key, st in self.state.items():
            if key not in observation.pools:
                st.cold_start.forget_pending()
        for key, pool in observation.pools.items():
            # A backlog: more prompts waiting than prefill replicas, or any sequence waiting
            # for a decode slot (decode is sized for none), which TTFT includes too.
            queue, decode = pool.signals.get(Signal.QUEUE_DEPTH) or 0.0, key[1] is Role.DECODE
            if queue > (0 if decode else pool.replicas.ready):
                for other in (key, (key[0], Role.PREFILL)) if decode else (key,):
                    if other in self.state:
                        self.state[other].queued_at = pool.data_time_s
        # Prefill first: decode's arrivals are at least what prefill is sized to deliver.
        self.service_rps, self.service_dispersion = {}, {}
        order = sorted((k for k in observation.pools if k in self.state),
                       key=lambda k: k[1] is not Role.PREFILL)
        return {key: self._decide(key, observation.pools[key], observation.now_s,
                                  prompts.get(key[0])) for key in order}

    def _decide(self, key: PoolKey, pool: Pool, now: float,
                service_prompt: float | None) -> PoolDecision:
        st, r = self.state[key], pool.replicas
        st.cold_start.observe(now, r.ready, r.active)
        st.serving.append((now, r.ready, r.draining))
        while st.serving and st.serving[0][0] < now - 2 * RATE_WINDOW_S:
            st.serving.popleft()
        demand = pool.signals.get(DEMAND_SIGNAL[key[1]])
        if not finite(demand):
            return degraded_decision(key, pool, st.cold_start.p90_s)
        notes: list[str] = []
        prefill = key[1] is Role.PREFILL
        hit = prefix_hits(pool, demand) if prefill else None
        self._read_lengths(st, pool, service_prompt, notes)
        lead = st.cold_start.p90_s + self.tick_s  # what a scale-up asked now must cover
        demand += self._queue_growth(st, pool, notes)
        if self.forecasts is not None:
            self.forecasts.observe(key, pool.data_time_s, demand)
        forecast, fc_note = forecast_for(self.forecasts, key, now, lead,
                                         self.settings.scale_up_quantile)
        # Prefill's busiest minute: the 5-minute mean lags a rise.
        peak = pool.signals.get(Signal.PROMPT_TOKENS_PEAK_PER_S) if prefill else 0.0
        if not finite(peak):
            notes.append("peak minute unread: the 5-minute mean rate")
        load = max(demand, peak if finite(peak) else 0.0, forecast.sized_value if forecast else 0.0)
        self._calibrate(st, pool, demand, hit, notes)
        queue = pool.signals.get(Signal.QUEUE_DEPTH)
        if queue is None:
            notes.append("queue unread: no backlog assumed")
        # The backlog replicas asked now meet: what waits, and its growth until they are ready.
        backlog = (queue or 0.0) + st.growth_rps * lead
        sized = (self._prefill_sized if prefill else self._decode_sized)(
            st, pool, load, hit, backlog, lead, notes)
        desired, cause, step_note = self._stabilise(st, sized.replicas, r.active, now)
        if (bounded := max(r.min_replicas, min(r.max_replicas, desired))) != desired:
            cause, step_note = Cause.BOUND, (f"{'min' if bounded > desired else 'max'}_"
                                             f"replicas {bounded} (the model asks {desired})")
            desired = bounded
        if finite(latency := pool.signals.get(LATENCY_SIGNAL[key[1]])):
            notes.insert(0, f"{LATENCY_SIGNAL[key[1]].value} {latency:.3g}s vs SLO "
                         f"{st.slo_s:g}s")
        c = st.correction
        reasons = [f"load {load:.4g}/s ({fc_note}; now {demand:.4g}/s)", sized.reason,
                   f"correction {c.value:.2f} (±{c.spread:.2f} in log, {c.readings} readings)",
                   *notes, *([step_note] if step_note else [])]
        detail = {"load": load, "demand": demand, "need": sized.replicas,
                  "predicted_s": sized.predicted_s, "slo_s": st.slo_s, "met": sized.met,
                  "correction": c.value, "correction_spread": c.spread, **sized.terms}
        return PoolDecision(desired, tuple(reasons), cause=cause, detail=detail, forecast=forecast,
                            lead_s=lead, cold_start_p90_s=st.cold_start.p90_s)

    @staticmethod
    def _queue_growth(st: PoolModelState, pool: Pool, notes: list[str]) -> float:
        """Arrivals a saturated pool's served rate does not show: the queue's growth since
        the last reading, in the demand's units (prompt or output tokens/s)."""
        queue = pool.signals.get(Signal.QUEUE_DEPTH)
        before, st.growth_rps = st.queue_seen, 0.0
        if not finite(queue):
            st.queue_seen = None
            return 0.0
        st.queue_seen = (pool.data_time_s, queue)
        if before is None or pool.data_time_s <= before[0] or queue <= before[1]:
            return 0.0
        per_s = st.growth_rps = (queue - before[1]) / (pool.data_time_s - before[0])
        notes.append(f"queue grew {queue - before[1]:.0f} in {pool.data_time_s - before[0]:.0f}"
                     f" s: {per_s:.3g} req/s more arrive than are served")
        return per_s * (st.prompt() if pool.key[1] is Role.PREFILL else st.output())

    @staticmethod
    def _read_lengths(st: PoolModelState, pool: Pool, service_prompt: float | None,
                      notes: list[str]) -> None:
        # The service's prompt is its prefill pool's reading: decode's own is the fallback.
        prompt = service_prompt if usable_length(service_prompt) else \
            pool.signals.get(Signal.MEAN_PROMPT_TOKENS)
        output = pool.signals.get(Signal.MEAN_OUTPUT_TOKENS)
        st.prompt_tokens = prompt if usable_length(prompt) else st.prompt_tokens
        st.output_tokens = output if usable_length(output) else st.output_tokens
        if st.prompt_tokens is None or (pool.key[1] is Role.DECODE and st.output_tokens is None):
            notes.append(f"lengths unread: {PROMPT_TOKENS_UNREAD:,.0f} prompt and "
                         f"{OUTPUT_TOKENS_UNREAD:,.0f} output tokens assumed")

    def _prefill(self, st: PoolModelState, pool: Pool, tokens_per_s: float, hit: float | None,
                 correction: float, quantile: float, notes: list[str]) -> PrefillLoad:
        """Prefill's load: prompts/s, the service time of their uncached part (prefix hits
        ``hit``) at the profile's throughput for the mix, the tokens' dispersion."""
        prompt, cv2 = st.prompt(), float(self.settings.sizing.prompt_length_cv2)
        uncached = max(1.0, uncached_prefill_demand(prompt, hit))
        rate = st.profile.prefill_tokens_per_s(uncached, uncached**2 * (1 + cv2)) * correction
        dispersion = pool.signals.get(Signal.PROMPT_TOKENS_DISPERSION)
        if finite(dispersion) and dispersion > 0:
            # Tokens' dispersion over the mean prompt: the prompts' ca2 + cs2 (and decode's v).
            variability = self.service_dispersion[pool.key[0]] = dispersion / prompt
        else:
            variability = float(self.settings.sizing.default_variability)
            notes.append(f"dispersion unread: ca2 + cs2 = {variability:g} assumed")
        sigma = math.sqrt(math.log1p(cv2))
        at_q = uncached * math.exp(NormalDist().inv_cdf(quantile) * sigma - sigma**2 / 2)
        return PrefillLoad(arrival_rps=tokens_per_s / prompt, mean_service_s=uncached / rate,
                           variability=variability,
                           fixed_s=(st.profile.overhead_ms(prompt)
                                    + st.profile.kv_transfer_ms(prompt)) / 1000,
                           quantile=quantile,
                           service_quantile_s=st.profile.prefill_ms(at_q) / 1000 / correction)

    def _decode_sized(self, st: PoolModelState, pool: Pool, load: float, hit: float | None,
                      backlog: float, lead: float, notes: list[str]) -> Sized:
        service = pool.key[0]
        variability = self.service_dispersion.get(service)
        if variability is None:  # decode's sequences vary as prefill's prompt tokens arrive
            variability = float(self.settings.sizing.default_variability)
            notes.append(f"dispersion unread: decode's variability {variability:g} assumed")
        arrivals = load / st.output()
        if (prefilled := self.service_rps.get(service, 0.0)) > arrivals:
            notes.append(f"arrivals {prefilled:.3g} req/s: what prefill is sized to deliver")
            arrivals = prefilled
        decode = DecodeLoad(arrival_rps=arrivals, mean_output_tokens=st.output(),
                            mean_context_tokens=st.prompt() + st.output() / 2,
                            variability=variability, quantile=st.objective)
        return decode_replicas(decode, st.profile, st.slo_s * st.correction.value,
                               max_replicas=pool.replicas.max_replicas, waiting=backlog,
                               drain_s=lead)

    def _prefill_sized(self, st: PoolModelState, pool: Pool, load: float, hit: float | None,
                       backlog: float, lead: float, notes: list[str]) -> Sized:
        """Prefill's replicas at the prefix hits expected at that count. A load-balanced
        router finds a prompt's cached prefix only on the replicas that served it: hits
        ``h`` read at ``r`` ready are about ``h r / c`` at ``c > r``, so the count is the
        fixed point of sizing at the hits it implies (prefix-aware routing: ``h`` holds)."""
        read_at = st.serving_at(pool.data_time_s)[0]
        at, counted = hit, dict[int, tuple[Sized, float | None]]()
        while True:
            fallbacks: list[str] = []
            model = self._prefill(st, pool, load, at, st.correction.value, st.objective,
                                  fallbacks)
            sized = prefill_replicas(model, st.slo_s, max_replicas=pool.replicas.max_replicas,
                                     queued=backlog, drain_s=lead)
            if st.prefix_aware or not hit or read_at < 1 or sized.replicas <= read_at \
                    or sized.replicas in counted:
                break
            counted[sized.replicas] = sized, at
            at = hit * read_at / sized.replicas
        if counted and max(counted) > sized.replicas:  # counts that cycle: the larger
            sized, at = counted[max(counted)]
        notes.extend(fallbacks)
        # What prefill delivers to decode: its arrivals and its backlog drained over the lead.
        self.service_rps[pool.key[0]] = model.arrival_rps + backlog / lead
        if hit is None:
            return sized
        if at != hit:
            notes.append(f"prefix hits {hit:.2f} read at {read_at} ready, {at:.2f} expected at "
                         f"{sized.replicas}: load-balanced routing finds a prompt's cached "
                         "prefix only where it was served before")
        return replace(sized, terms={**sized.terms, "prefix_hit_read": hit,
                                     "prefix_hit_sized": at or 0.0})

    def _calibrate(self, st: PoolModelState, pool: Pool, demand: float, hit: float | None,
                   notes: list[str]) -> None:
        """Learn the correction from the latency the pool reported at its own load and
        replicas, where its window held no backlog (a transient, not the rate)."""
        sizing, role = self.settings.sizing, pool.key[1]
        observed, window = pool.signals.get(LATENCY_SIGNAL[role]), RATE_WINDOW_S
        recent = pool.signals.get(Signal.TTFT_P95_RECENT_S)
        if role is Role.PREFILL and finite(recent):
            observed, window = recent, RECENT_WINDOW_S
        ready, draining = st.serving_at(pool.data_time_s)
        if not finite(observed) or observed <= 0 or ready < 1 or demand <= 0:
            return
        if role is Role.PREFILL and window == RATE_WINDOW_S:
            notes.append("last minute's TTFT p95 unread: the correction learns from the "
                         "5-minute p95")
        if pool.data_time_s - st.queued_at <= window:
            notes.append("correction not updated: a backlog within the latency's window")
            return
        low, high = sizing.calibration_min, sizing.calibration_max
        if role is Role.PREFILL:
            base = self._prefill(st, pool, demand, hit, 1.0, READ_QUANTILE, [])
            implied = _solve(lambda k: predicted_ttft_s(_corrected(base, k), ready), observed,
                             low, high)
        else:
            if not finite(running := pool.signals.get(Signal.RUNNING_REQUESTS)) or running <= 0:
                return
            if finite(median := pool.signals.get(Signal.ITL_P50_S)) and median > 0:
                observed = median  # the step at the mean batch predicts the median ITL
            else:
                notes.append("ITL p50 unread: the correction compares the p95 with the step at "
                             "the mean batch, which reads the engine slower than it is")
            per = running / (ready + draining)  # a draining decode replica still decodes
            # The step the profile predicts at the running batch, over the one read.
            implied = st.profile.decode_step_ms(per, per * (st.prompt() + st.output() / 2)
                                                ) / 1000 / observed
        st.correction.learn(implied, rate=sizing.calibration_rate, low=low, high=high)

    def _stabilise(self, st: PoolModelState, need: int, active: int, now: float
                   ) -> tuple[int, Cause, str | None]:
        """Up at once; down to the stabilisation window's highest need, ``max_step_down`` a
        tick at most."""
        window, most = float(self.settings.stabilisation), self.settings.max_step_down
        if not st.needs:
            st.needs.append((now, active))  # a first look: what runs was needed until now
        st.needs.append((now, need))
        while st.needs and st.needs[0][0] < now - window:
            st.needs.popleft()
        if need >= active:
            return need, Cause.FORECAST if need > active else Cause.STEADY, None
        if (highest := max(n for _, n in st.needs)) >= active:
            since = max(t for t, n in st.needs if n >= active)
            return active, Cause.STEADY, (
                f"holding {active} over the need {need}: the need was {highest} within the "
                f"stabilisation window, {since + window - now:.0f} s of {window:.0f} s left")
        step = min(active - highest, most)
        st.cold_start.cancel_above(active - step)
        note = f"down {step} to {active - step}: the window's highest need is {highest}"
        return active - step, Cause.SCALE_DOWN, note + (
            f" (at most {most} a tick)" if active - step > highest else "")


def _corrected(load: PrefillLoad, correction: float) -> PrefillLoad:
    """``load`` (planned at a correction of 1) with the prefill ``correction`` times faster."""
    q = load.service_quantile_s
    return replace(load, mean_service_s=load.mean_service_s / correction,
                   service_quantile_s=None if q is None else q / correction)


def _pools(spec: Spec, cold_start_s: Mapping[PoolKey, float] | None
           ) -> dict[PoolKey, tuple[InstanceProfile, float, float]]:
    """Each pool's profile, SLO (TTFT p95 for prefill, ITL p95 for decode) and cold start p90
    (``cold_start_p90_s``, or the caller's where it knows better, as the simulator does)."""
    return {(svc.name, role): (
        load_profile(pool.profile),
        svc.slo.ttft_p95_s if role is Role.PREFILL else svc.slo.itl_p95_s,
        (cold_start_s or {}).get((svc.name, role), pool.cold_start_p90_s))
        for svc in spec.services for role, pool in svc.pools.items()}


def build_forecasts(spec: Spec, *, cold_start_s: Mapping[PoolKey, float] | None = None
                    ) -> ForecastStage:
    """The forecast stage for every pool of the spec (its controller settings)."""
    return ForecastStage({key: cold + float(spec.controller.tick) for key, (_, _, cold)
                          in _pools(spec, cold_start_s).items()}, spec.controller)


def build_policy(spec: Spec, *, forecasts: ForecastStage | None,
                 cold_start_s: Mapping[PoolKey, float] | None = None) -> PdscalePolicy:
    """pdscale's policy for every pool of the spec; ``forecasts`` (from
    :func:`build_forecasts`; None: size on the current demand) is the stage the loop refits."""
    return PdscalePolicy(spec.controller, _pools(spec, cold_start_s), forecasts=forecasts,
                         prefix_aware={svc.name for svc in spec.services
                                       if svc.routing == "prefix_aware"},
                         objective={svc.name: svc.slo.objective for svc in spec.services})
