"""pdscale's policy: each pool sized by the queueing model (:mod:`controller._queueing`).

Each tick, per pool (docs/sizing.md has the equations and a worked example): observe the
pool's cold starts, demand and latency (missing demand holds it); take as the load the largest
of the demand now (plus the queue's growth; prefill's busiest minute), the rate window's rising
trend carried to when replicas asked now are ready, and the forecast's quantile over the lead
(decode: at least what prefill is sized to deliver); size for that load and for the backlog
the new replicas will meet; learn one correction of the profile's service rate from latency
readings whose window held no backlog; scale up at once, down to the stabilisation window's
highest need at most ``max_step_down`` a tick, within min and max. Each optional signal has a
stated fallback, and the decision names it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from statistics import NormalDist

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
    degraded_decision,
    forecast_for,
    prefix_hits,
    usable_length,
)
from pdscale.controller._perf import uncached_prefill_demand
from pdscale.controller._profiles import InstanceProfile
from pdscale.controller._queueing import (
    DecodeLoad,
    PrefillLoad,
    Sized,
    decode_replicas,
    predicted_ttft_s,
    prefill_replicas,
)
from pdscale.spec import ControllerSettings, Role
from pdscale.telemetry import RATE_WINDOW_S, RECENT_WINDOW_S, Signal

__all__ = ["Correction", "PdscalePolicy"]

PROMPT_TOKENS_UNREAD = 1000.0
OUTPUT_TOKENS_UNREAD = 200.0
"""The lengths a pool is planned for before its first length reading (the decision says so)."""
KV_SAMPLE_ERROR = 0.25
"""The relative standard error of the running sequences' mean context from which the KV cache's
reading sets a decode replica's batch (fewer sequences in the pool: the profile's capacity)."""
READ_QUANTILE = 0.95
"""The percentile of the latency readings the correction is learned from (TTFT and ITL p95)."""


@dataclass
class Correction:
    """One multiplicative correction of a pool's service rate, learned in log space."""

    value: float = 1.0
    spread: float = 0.0
    """Root mean square of the readings' log distance from the value (its uncertainty)."""
    readings: int = 0

    def learn(self, implied: float, *, rate: float, low: float, high: float) -> None:
        implied = min(high, max(low, implied))
        step = math.log(implied) - math.log(self.value)
        self.spread = math.sqrt((1 - rate) * self.spread**2 + rate * step**2)
        self.value = min(high, max(low, self.value * math.exp(rate * step)))
        self.readings += 1


def _solve(predict: Callable[[float], float], observed: float, low: float,
           high: float) -> float:
    """The correction in [low, high] at which ``predict(k)`` (falling as k grows) equals
    ``observed``, by regula falsi on the logs of both (the Illinois variant, which keeps the
    root bracketed and converges in a few predictions; bisection where a correction leaves
    the queue unstable), to within 2e-5 in log k; the end nearest when the observation lies
    beyond what any correction in the range predicts."""
    target = math.log(observed)

    def f(x: float) -> float:  # falls as x grows; its root is the correction's log
        return math.log(predict(math.exp(x))) - target

    a, b = math.log(low), math.log(high)
    fa, fb = f(a), f(b)
    if fa <= 0:
        return low  # slower than even the lowest correction predicts
    if fb >= 0:
        return high
    kept = 0  # the end kept twice in a row has its value halved (Illinois)
    for _ in range(60):
        # Where the queue is unstable the prediction is infinite: halve the bracket there.
        x = (a * fb - b * fa) / (fb - fa) if math.isfinite(fa) else (a + b) / 2
        fx = f(x)
        if abs(fx) < 1e-9 or b - a < 2e-5:
            return math.exp(x)
        if fx > 0:
            a, fa = x, fx
            if kept == 1:
                fb /= 2
            kept = 1
        else:
            b, fb = x, fx
            if kept == -1:
                fa /= 2
            kept = -1
    return math.exp((a + b) / 2)


@dataclass
class PoolModelState:
    profile: InstanceProfile
    slo_s: float
    cold_start: ColdStartTracker
    objective: float
    """The share of requests the service's SLO wants within its thresholds: the percentile
    the pool is sized at."""
    correction: Correction = field(default_factory=Correction)
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    queue_seen: tuple[float, float] | None = None
    """(data time, queue) of the last reading: arrivals are what was served plus the queue's
    growth."""
    growth_rps: float = 0.0
    """Requests/s the queue grew by at the last reading (0 when it did not)."""
    queued_at: float = -math.inf
    """Data time a queue was last seen in this pool (for prefill: or in decode's admission)."""
    rates: deque[tuple[float, float]] = field(default_factory=deque)
    """(data time, demand) over the last rate window: the trend the load is extrapolated on."""
    active_seen: int | None = None
    """Ready plus starting replicas at the last tick: a rise is replicas starting."""
    serving: deque[tuple[float, int, int]] = field(default_factory=deque)
    """(time, ready, draining replicas) at each tick over the last two rate windows (a window
    and the data's delay): a reading is paired with the replicas that produced it, not those
    of now."""
    needs: deque[tuple[float, int]] = field(default_factory=deque)
    """The needs of the stabilisation window: the pool scales down to their highest."""
    kv_readings: deque[tuple[float, float, float]] = field(default_factory=deque)
    """(data time, running sequences, replicas' worth of KV they use) over the rate window."""
    prefix_aware: bool = False
    """Whether the service's router sends a prompt to the replica holding its prefix."""

    def serving_at(self, t: float) -> tuple[int, int]:
        """(ready, draining) at ``t``: the last counts seen at or before it (before the first
        look, what it saw: a reading from before it started was made by what ran)."""
        for seen, r, d in reversed(self.serving):
            if seen <= t:
                return r, d
        return self.serving[0][1:] if self.serving else (0, 0)

    def serving_changed(self, start: float, end: float) -> bool:
        """Whether replicas joined, began draining or left between ``start`` and ``end``."""
        before = self.serving_at(start)
        return any((r, d) != before for t, r, d in self.serving if start < t <= end)

    def prompt(self) -> float:
        """The mean prompt length last read, or the stated fallback before any."""
        return self.prompt_tokens or PROMPT_TOKENS_UNREAD

    def output(self) -> float:
        """The mean output length last read, or the stated fallback before any."""
        return self.output_tokens or OUTPUT_TOKENS_UNREAD


@dataclass(frozen=True)
class _Prefill:
    load: PrefillLoad
    rate_fallbacks: tuple[str, ...]


class PdscalePolicy:
    """See the module docstring."""

    name = "pdscale"

    def __init__(self, settings: ControllerSettings, profiles: Mapping[PoolKey, InstanceProfile],
                 slo_s: Mapping[PoolKey, float], cold_start_s: Mapping[PoolKey, float], *,
                 forecasts: ForecastStage | None, objective: Mapping[str, float],
                 prefix_aware: Collection[str] = ()) -> None:
        """``objective``: each service's SLO objective (``slo.objective``), the percentile
        its pools are sized at."""
        self.settings = settings
        self.tick_s = float(settings.tick)
        self.forecasts = forecasts
        self.service_rps: dict[str, float] = {}
        """Service -> requests/s its prefill is sized to deliver this tick (decode's floor)."""
        self.service_dispersion: dict[str, float] = {}
        """Service -> its prompt tokens' index of dispersion over the mean prompt, as read by
        its prefill pool this tick (decode's variability)."""
        self.state = {key: PoolModelState(profile, slo_s[key],
                                          ColdStartTracker(cold_start_s[key]), objective[key[0]],
                                          prefix_aware=key[0] in prefix_aware)
                      for key, profile in profiles.items()}

    def lead_s(self, key: PoolKey) -> float:
        return self.state[key].cold_start.p90_s + self.tick_s

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        # Prompt lengths are read where prompts finish: a prefill pool counts each request
        # and its prompt tokens at its prefill, a decode pool its requests at their last token.
        prompts = {key[0]: v for key, p in observation.pools.items() if key[1] is Role.PREFILL
                   and usable_length(v := p.signals.get(Signal.MEAN_PROMPT_TOKENS))}
        for key, st in self.state.items():
            if key not in observation.pools:
                st.cold_start.forget_pending()
                st.active_seen = None
        for key, pool in observation.pools.items():
            queue = pool.signals.get(Signal.QUEUE_DEPTH) or 0.0
            if key not in self.state or queue <= 0:
                continue
            # A backlog: more prompts waiting than prefill replicas, or any sequence waiting
            # for a decode slot (decode is sized for none), which a TTFT reading includes too.
            if key[1] is Role.DECODE:
                for other in (key, (key[0], Role.PREFILL)):
                    if other in self.state:
                        self.state[other].queued_at = pool.data_time_s
            elif queue > pool.replicas.ready:
                self.state[key].queued_at = pool.data_time_s
        # Prefill first: a request prefilled now decodes a prefill later, so decode's arrivals
        # are at least what its service's prefill is sized to deliver.
        self.service_rps = {}
        self.service_dispersion = {}
        order = sorted((k for k in observation.pools if k in self.state),
                       key=lambda k: k[1] is not Role.PREFILL)
        return {key: self._decide(key, observation.pools[key], observation.now_s,
                                  prompts.get(key[0])) for key in order}

    # -- one pool ---------------------------------------------------------------------------

    def _decide(self, key: PoolKey, pool: PoolObservation, now: float,
                service_prompt: float | None) -> PoolDecision:
        st = self.state[key]
        r = pool.replicas
        st.cold_start.observe(now, r.ready)
        if st.active_seen is not None and r.active > st.active_seen:
            # Replicas started since the last tick: timed from here until ready (not from an
            # ask that a budget, a bound or a dry run kept from being applied).
            st.cold_start.asked(now, r.active)
        st.active_seen = r.active
        st.serving.append((now, r.ready, r.draining))
        while st.serving and st.serving[0][0] < now - 2 * RATE_WINDOW_S:
            st.serving.popleft()
        demand = pool.signals.get(DEMAND_SIGNAL[key[1]])
        if demand is None or not math.isfinite(demand):
            return degraded_decision(key, pool, st.cold_start.p90_s)
        notes: list[str] = []
        hit = prefix_hits(pool, demand) if key[1] is Role.PREFILL else None
        self._read_lengths(st, pool, service_prompt, notes)
        lead = self.lead_s(key)
        rising = self._trend(st, pool.data_time_s, demand, lead, notes)
        demand += self._queue_growth(st, pool, notes)
        if self.forecasts is not None:
            self.forecasts.observe(key, pool.data_time_s, demand)
        forecast, fc_note = forecast_for(self.forecasts, key, now, lead,
                                         self.settings.scale_up_quantile)
        peak = self._peak(key, pool, demand, notes)
        load = max(demand, peak, rising, forecast.sized_value if forecast is not None else 0.0)
        self._calibrate(key, st, pool, demand, hit, notes)
        sized = self._size(key, st, pool, load, hit, lead, notes)
        desired, cause, step_note = self._stabilise(st, sized.replicas, r.active, now)
        bounded = max(r.min_replicas, min(r.max_replicas, desired))
        if bounded != desired:
            cause = Cause.BOUND
            step_note = (f"{'min' if bounded > desired else 'max'}_replicas {bounded} "
                         f"(the model asks {desired})")
            desired = bounded
        latency = pool.signals.get(LATENCY_SIGNAL[key[1]])
        if latency is not None and math.isfinite(latency):
            notes.insert(0, f"{LATENCY_SIGNAL[key[1]].value} {latency:.3g}s vs SLO "
                         f"{st.slo_s:g}s")
        reasons = [f"load {load:.4g}/s ({fc_note}; now {demand:.4g}/s)", sized.reason,
                   f"correction {st.correction.value:.2f} "
                   f"(±{st.correction.spread:.2f} in log, {st.correction.readings} readings)",
                   *notes]
        if step_note:
            reasons.append(step_note)
        detail = {"load": load, "demand": demand, "need": sized.replicas,
                  "predicted_s": sized.predicted_s, "slo_s": st.slo_s, "met": sized.met,
                  "correction": st.correction.value,
                  "correction_spread": st.correction.spread,
                  **sized.terms}
        return PoolDecision(desired, tuple(reasons), cause=cause, detail=detail,
                            forecast=forecast, lead_s=lead,
                            cold_start_p90_s=st.cold_start.p90_s)

    @staticmethod
    def _trend(st: PoolModelState, t: float, demand: float, lead: float,
               notes: list[str]) -> float:
        """The demand when replicas asked now are ready, on the rate window's trend: the
        window's mean is the rate half a window ago, so a rise of ``b``/s since then reaches
        ``mean + b (window / 2 + lead)``. Least squares over the window's readings; a falling
        trend extrapolates nothing (the stabilisation window handles a fall)."""
        st.rates.append((t, demand))
        while st.rates and st.rates[0][0] < t - RATE_WINDOW_S:
            st.rates.popleft()
        if len(st.rates) < 3 or t - st.rates[0][0] < RATE_WINDOW_S / 2:
            return demand
        mt = sum(x for x, _ in st.rates) / len(st.rates)
        my = sum(y for _, y in st.rates) / len(st.rates)
        slope = (sum((x - mt) * (y - my) for x, y in st.rates)
                 / sum((x - mt) ** 2 for x, _ in st.rates))
        if slope <= 0:
            return demand
        ahead = demand + slope * (RATE_WINDOW_S / 2 + lead)
        notes.append(f"rising {slope:.3g}/s: {ahead:.4g}/s when replicas asked now are ready")
        return ahead

    @staticmethod
    def _queue_growth(st: PoolModelState, pool: PoolObservation, notes: list[str]) -> float:
        """Arrivals the served rate does not show: a saturated pool's token counters count what
        it served, and the rest waits. Requests/s the queue grew by since the last reading,
        in the demand's units (prompt tokens for prefill, output tokens for decode)."""
        queue = pool.signals.get(Signal.QUEUE_DEPTH)
        if queue is None or not math.isfinite(queue):
            st.queue_seen = None
            return 0.0
        before, st.queue_seen = st.queue_seen, (pool.data_time_s, queue)
        st.growth_rps = 0.0
        if before is None or pool.data_time_s <= before[0] or queue <= before[1]:
            return 0.0
        per_s = st.growth_rps = (queue - before[1]) / (pool.data_time_s - before[0])
        tokens = st.prompt() if pool.key[1] is Role.PREFILL else st.output()
        notes.append(f"queue grew {queue - before[1]:.0f} in "
                     f"{pool.data_time_s - before[0]:.0f} s: {per_s:.3g} req/s more arrive "
                     "than are served")
        return per_s * tokens

    @staticmethod
    def _peak(key: PoolKey, pool: PoolObservation, demand: float, notes: list[str]) -> float:
        """Prefill: the busiest minute of the rate window in demand units (the 5-minute mean
        lags a rise by minutes); the mean where it is unread."""
        if key[1] is not Role.PREFILL:
            return demand
        peak = pool.signals.get(Signal.PROMPT_TOKENS_PEAK_PER_S)
        if peak is None or not math.isfinite(peak):
            notes.append("peak minute unread: the 5-minute mean rate")
            return demand
        return peak

    @staticmethod
    def _read_lengths(st: PoolModelState, pool: PoolObservation, service_prompt: float | None,
                      notes: list[str]) -> None:
        prompt = pool.signals.get(Signal.MEAN_PROMPT_TOKENS)
        if (pool.key[1] is Role.DECODE and usable_length(service_prompt)) or \
                not usable_length(prompt):
            prompt = service_prompt
        output = pool.signals.get(Signal.MEAN_OUTPUT_TOKENS)
        if usable_length(prompt):
            st.prompt_tokens = prompt
        if usable_length(output):
            st.output_tokens = output
        if st.prompt_tokens is None or (pool.key[1] is Role.DECODE and st.output_tokens is None):
            notes.append(f"lengths unread: {PROMPT_TOKENS_UNREAD:,.0f} prompt and "
                         f"{OUTPUT_TOKENS_UNREAD:,.0f} output tokens assumed")

    def _prefill(self, st: PoolModelState, pool: PoolObservation, tokens_per_s: float,
                 hit: float | None, correction: float, quantile: float) -> _Prefill:
        """The prefill model's load: prompts/s from prompt tokens/s, the service time of their
        uncached part (at prefix hits ``hit``) at the profile's throughput for the mix, the
        variability from the tokens' dispersion."""
        fallbacks = []
        prompt = st.prompt()
        uncached = max(1.0, uncached_prefill_demand(prompt, hit))
        mean_sq = uncached**2 * (1 + float(self.settings.sizing.prompt_length_cv2))
        rate = st.profile.prefill_tokens_per_s(uncached, mean_sq) * correction
        dispersion = pool.signals.get(Signal.PROMPT_TOKENS_DISPERSION)
        share = uncached / prompt
        if dispersion is not None and math.isfinite(dispersion) and dispersion > 0:
            variability = dispersion * share / uncached
            self.service_dispersion[pool.key[0]] = dispersion / prompt
        else:
            variability = float(self.settings.sizing.default_variability)
            fallbacks.append(f"dispersion unread: ca2 + cs2 = {variability:g} assumed")
        fixed = (st.profile.overhead_ms(prompt) + st.profile.kv_transfer_ms(prompt)) / 1000
        cv2 = float(self.settings.sizing.prompt_length_cv2)
        sigma = math.sqrt(math.log1p(cv2))
        at_quantile = uncached * math.exp(NormalDist().inv_cdf(quantile) * sigma
                                          - sigma**2 / 2)
        return _Prefill(PrefillLoad(arrival_rps=tokens_per_s / prompt,
                                    mean_service_s=uncached / rate, service_cv2=0.0,
                                    arrival_cv2=variability, fixed_s=fixed,
                                    quantile=quantile,
                                    service_quantile_s=st.profile.prefill_ms(at_quantile) / 1000
                                    / correction), tuple(fallbacks))

    def _decode(self, st: PoolModelState, service: str, tokens_per_s: float,
                notes: list[str]) -> DecodeLoad:
        """Decode's load: its running sequences, and their KV, vary as the service's prompt
        tokens arrive (their index of dispersion over the mean prompt, read by prefill)."""
        output, prompt = st.output(), st.prompt()
        variability = self.service_dispersion.get(service)
        if variability is None:
            variability = float(self.settings.sizing.default_variability)
            notes.append(f"dispersion unread: decode's variability {variability:g} assumed")
        return DecodeLoad(arrival_rps=tokens_per_s / output, mean_output_tokens=output,
                          mean_context_tokens=prompt + output / 2, arrival_cv2=variability,
                          quantile=st.objective)

    def _size(self, key: PoolKey, st: PoolModelState, pool: PoolObservation, load: float,
              hit: float | None, lead: float, notes: list[str]) -> Sized:
        queue = pool.signals.get(Signal.QUEUE_DEPTH)
        if queue is None:
            notes.append("queue unread: no backlog assumed")
        # The backlog replicas asked now meet: what waits, and what the queue gains at its
        # measured growth until they are ready.
        backlog = (queue or 0.0) + st.growth_rps * lead
        k = st.correction.value
        if key[1] is Role.PREFILL:
            return self._prefill_sized(st, pool, load, hit, backlog, lead, notes)
        decode = self._decode(st, key[0], load, notes)
        prefilled = self.service_rps.get(key[0], 0.0)
        if prefilled > decode.arrival_rps:
            notes.append(f"arrivals {prefilled:.3g} req/s: what prefill is sized to deliver")
            decode = replace(decode, arrival_rps=prefilled)
        return decode_replicas(decode, st.profile, st.slo_s * k,
                               max_replicas=pool.replicas.max_replicas, waiting=backlog,
                               drain_s=lead, kv_sequences=self._kv_sequences(st, pool, notes))

    def _prefill_sized(self, st: PoolModelState, pool: PoolObservation, load: float,
                       hit: float | None, backlog: float, lead: float, notes: list[str]
                       ) -> Sized:
        """Prefill's replicas at the prefix hits expected at that count. A load-balanced
        router (round robin, least loaded) sends a prompt to any replica, and its cached
        prefix is on the replicas that served it before: a hit ratio ``h`` read at ``r``
        ready replicas is about ``h r / c`` at ``c > r`` (the new replicas' caches start
        empty), so the count is the fixed point of sizing at the hits it implies. A
        prefix-aware router keeps a prompt with its cache: the hits read hold."""
        read_at = st.serving_at(pool.data_time_s)[0]
        at, counted = hit, None
        while True:
            model = self._prefill(st, pool, load, at, st.correction.value, st.objective)
            sized = prefill_replicas(model.load, st.slo_s,
                                     max_replicas=pool.replicas.max_replicas,
                                     queued=backlog, drain_s=lead)
            if st.prefix_aware or not hit or read_at < 1 or sized.replicas <= read_at \
                    or sized.replicas == counted:
                break
            counted = sized.replicas
            at = hit * read_at / counted
        notes.extend(model.rate_fallbacks)
        # What prefill delivers to decode: its arrivals and its backlog drained over the lead.
        self.service_rps[pool.key[0]] = model.load.arrival_rps + backlog / lead
        if hit is None:
            return sized
        if at != hit:
            notes.append(f"prefix hits {hit:.2f} read at {read_at} ready, {at:.2f} expected at "
                         f"{sized.replicas}: load-balanced routing finds a prompt's cached "
                         "prefix only where it was served before")
        return replace(sized, terms={**sized.terms, "prefix_hit_read": hit,
                                     "prefix_hit_sized": at or 0.0})

    def _kv_sequences(self, st: PoolModelState, pool: PoolObservation, notes: list[str]
                      ) -> float | None:
        """The sequences one replica's KV cache holds at the running mix: the running
        sequences over the replicas' worth of cache they use, summed over the rate window's
        readings (one reading of a few long contexts says little of the mix's); None (the
        profile's capacity) where unread, or where too few ran for their mean context to
        tell the mix's: with contexts as varied as the prompts (squared coefficient of
        variation ``prompt_length_cv2``), the mean of ``n`` has a relative standard error of
        ``sqrt(cv2 / n)``, and it is used from a quarter on (16 sequences at cv2 = 1)."""
        running = pool.signals.get(Signal.RUNNING_REQUESTS)
        usage = pool.signals.get(Signal.KV_CACHE_USAGE_RATIO)
        replicas = sum(st.serving_at(pool.data_time_s))  # draining ones hold sequences too
        if running is None or usage is None or not math.isfinite(usage) or replicas < 1:
            notes.append("KV usage unread: the profile's KV capacity")
            return None
        if usage > 0 and running > 0:
            st.kv_readings.append((pool.data_time_s, running, usage * replicas))
        while st.kv_readings and st.kv_readings[0][0] <= pool.data_time_s - RATE_WINDOW_S:
            st.kv_readings.popleft()
        sequences = sum(r for _, r, _ in st.kv_readings)
        enough = float(self.settings.sizing.prompt_length_cv2) / KV_SAMPLE_ERROR**2
        if sequences < enough:
            if sequences > 0:
                notes.append(f"KV usage read over {sequences:.0f} sequences: too few to tell "
                             f"the mix's context (from {enough:.0f}), the profile's KV "
                             "capacity")
            return None
        return sequences / sum(u for _, _, u in st.kv_readings)

    def _calibrate(self, key: PoolKey, st: PoolModelState, pool: PoolObservation,
                   demand: float, hit: float | None, notes: list[str]) -> None:
        """Learn the correction from the latency the pool reported at its own load."""
        sizing = self.settings.sizing
        observed = pool.signals.get(LATENCY_SIGNAL[key[1]])
        window = RATE_WINDOW_S
        if key[1] is Role.PREFILL:
            recent = pool.signals.get(Signal.TTFT_P95_RECENT_S)
            if recent is not None and math.isfinite(recent):
                observed, window = recent, RECENT_WINDOW_S
        ready, draining = st.serving_at(pool.data_time_s)
        if observed is None or not math.isfinite(observed) or observed <= 0 or ready < 1 \
                or demand <= 0:
            return
        if pool.data_time_s - st.queued_at <= window:
            # The reading's window held a backlog: it measures a transient, not the rate.
            notes.append("correction not updated: a backlog within the latency's window")
            return
        if st.serving_changed(pool.data_time_s - window, pool.data_time_s):
            # Replicas joined or left within the reading's window: it mixes two pool sizes.
            notes.append("correction not updated: replicas joined or left within the "
                         "latency's window")
            return
        low, high = sizing.calibration_min, sizing.calibration_max
        if key[1] is Role.PREFILL:
            base = self._prefill(st, pool, demand, hit, 1.0, READ_QUANTILE).load

            def predict(k: float) -> float:
                return predicted_ttft_s(_corrected(base, k), ready)

            implied = _solve(predict, observed, low, high)
        else:
            running = pool.signals.get(Signal.RUNNING_REQUESTS)
            if running is None or running <= 0:
                return
            per = running / (ready + draining)  # a draining decode replica still decodes
            ctx = st.prompt() + st.output() / 2
            # The step the profile predicts at the running batch, over the one read.
            implied = st.profile.decode_step_ms(per, per * ctx) / 1000 / observed
        st.correction.learn(implied, rate=sizing.calibration_rate, low=low, high=high)

    def _stabilise(self, st: PoolModelState, need: int, active: int, now: float
                   ) -> tuple[int, Cause, str | None]:
        """Up at once; down to the highest need of the stabilisation window, at most
        ``max_step_down`` a tick."""
        window = float(self.settings.stabilisation)
        if not st.needs:
            st.needs.append((now, active))  # a first look: what runs was needed until now
        st.needs.append((now, need))
        while st.needs and st.needs[0][0] < now - window:
            st.needs.popleft()
        if need > active:
            return need, Cause.FORECAST, None
        if need == active:
            return active, Cause.STEADY, None
        highest = max(n for _, n in st.needs)
        if highest >= active:
            since = max(t for t, n in st.needs if n >= active)
            return active, Cause.STEADY, (
                f"holding {active} over the need {need}: the need was {highest} within the "
                f"stabilisation window, {since + window - now:.0f} s of {window:.0f} s left")
        step = min(active - highest, self.settings.max_step_down)
        st.cold_start.cancel_above(active - step)
        note = f"down {step} to {active - step}: the window's highest need is {highest}"
        if active - step > highest:
            note += f" (at most {self.settings.max_step_down} a tick)"
        return active - step, Cause.SCALE_DOWN, note


def _corrected(load: PrefillLoad, correction: float) -> PrefillLoad:
    """``load`` (planned at a correction of 1) with the prefill ``correction`` times faster."""
    quantile = load.service_quantile_s
    return replace(load, mean_service_s=load.mean_service_s / correction,
                   service_quantile_s=None if quantile is None else quantile / correction)
