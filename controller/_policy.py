"""pdscale's scaling policy: forecast-driven, pre-warming, prefill and decode independent.

For each pool, every tick:

1. Demand now (prefill: uncached prompt tokens/s; decode: generated tokens/s) and its forecast
   at the scale-up quantile over [now, now + lead], where lead = the pool's learned cold-start
   p90 + one tick: a replica asked for now is ready when that demand arrives.
2. Decode also holds sequences: the demand equivalent of the sequences running and waiting
   (bursts of long prompts with short outputs fill the KV cache before they fill the step).
3. A recent-burst floor: at least the highest of these seen over the last ``burst_window_s``
   (load that came in bursts recently comes again, and a one-minute forecast cannot see
   sub-minute bursts). It remembers load (demand, running sequences), not a waiting queue,
   which drains within a minute and should not hold replicas for the whole window.
4. Replicas = ceil(sized demand / capacity per replica at the SLO).
5. Fast reactive path: when observed TTFT/ITL p95 breaches the SLO or the queue grows, add the
   replicas that drain the backlog within ``drain_s`` (not +1), skipping stabilisation. TTFT
   includes the wait for a decode slot: while the service's decode pool has a backlog, a TTFT
   miss is decode's, and prefill neither reacts to it nor lowers its capacity estimate.
6. Scale up at once; scale down only when the need stayed lower for ``stabilisation_s``, and
   by at most ``max_step_down`` replicas a tick; never below min or above max.
7. Missing or stale demand data: hold (never scale down), and say so.

Every decision carries machine-readable reasons. The policy reads no clock and does no I/O:
time comes from the observation; the forecasters are fitted on the schedule the caller owns
(``refit_every_s``), from data the observations carried.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from controller._capacity import CapacityModel
from controller._interface import Observation, PoolDecision, PoolKey, PoolObservation
from controller._perf import uncached_prefill_demand
from controller._profiles import load_profile
from forecasting import OnlineForecaster, QuantileGBForecaster, SeriesError
from pdscale.spec import ControllerSettings, Role, Spec
from telemetry import Signal

__all__ = ["ColdStartTracker", "PdscalePolicy", "PoolPolicyState", "build_policy",
           "policy_settings"]

DEMAND_SIGNAL = {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S,
                 Role.DECODE: Signal.GENERATION_TOKENS_PER_S}
LATENCY_SIGNAL = {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}


@dataclass
class ColdStartTracker:
    """Time from a scale-up to the replicas being ready; a running p90 of recent ones."""

    default_s: float
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    _pending: list[tuple[float, int]] = field(default_factory=list)  # (asked at, ready target)
    _p90_cache: tuple[tuple[int, float], float] | None = None

    def asked(self, now_s: float, ready_target: int) -> None:
        self._pending.append((now_s, ready_target))

    def observe(self, now_s: float, ready: int) -> None:
        still = []
        for asked_at, target in self._pending:
            if ready >= target:
                self.samples.append(now_s - asked_at)
            else:
                still.append((asked_at, target))
        self._pending = still

    def cancel_above(self, target: int) -> None:
        self._pending = [(t, n) for t, n in self._pending if n <= target]

    @property
    def p90_s(self) -> float:
        if len(self.samples) < 3:
            return self.default_s
        key = (len(self.samples), self.samples[-1])
        if self._p90_cache is None or self._p90_cache[0] != key:
            self._p90_cache = (key, float(np.percentile(np.array(self.samples), 90)))
        return self._p90_cache[1]


@dataclass
class PoolPolicyState:
    capacity: CapacityModel
    cold_start: ColdStartTracker
    forecaster: OnlineForecaster | None
    needs: deque[tuple[float, int]] = field(default_factory=deque)
    recent: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, demand) over the last ``burst_window_s``: the recent-burst floor."""
    first_seen_s: float | None = None


def _backlogged(pool: PoolObservation) -> bool:
    """More than two requests waiting a ready replica."""
    return (pool.signals.get(Signal.QUEUE_DEPTH) or 0.0) > 2 * max(pool.replicas.ready, 1)


class PdscalePolicy:
    """See the module docstring."""

    name = "pdscale"

    def __init__(self, capacity: Mapping[PoolKey, CapacityModel],
                 cold_start_s: Mapping[PoolKey, float], *, tick_s: float = 15.0,
                 quantile: float = 0.9, stabilisation_s: float = 300.0,
                 max_step_down: int = 2, drain_s: float = 60.0,
                 refit_every_s: float = 900.0, resolution_s: float = 60.0,
                 min_history_s: float = 3600.0, forecast: bool = True,
                 forecast_every_s: float = 120.0, refit_inline: bool = True,
                 burst_window_s: float = 900.0) -> None:
        self.tick_s = tick_s
        self.quantile = quantile
        self.stabilisation_s = stabilisation_s
        self.max_step_down = max_step_down
        self.drain_s = drain_s
        self.resolution_s = resolution_s
        self.min_history_s = min_history_s
        self.refit_every_s = refit_every_s
        self.forecast_every_s = forecast_every_s
        self.refit_inline = refit_inline
        self.burst_window_s = burst_window_s
        self.last_forecast: dict[PoolKey, dict[str, object]] = {}
        self.state: dict[PoolKey, PoolPolicyState] = {}
        for key, model in capacity.items():
            forecaster = None
            if forecast:
                forecaster = OnlineForecaster(
                    QuantileGBForecaster(resolution_s=resolution_s, quantiles=(0.5, quantile),
                                         horizons_s=(60, 120, 300, 600), max_iter=60,
                                         max_train_rows=20_000),
                    refit_every_s=refit_every_s, history_s=3 * 86400)
            self.state[key] = PoolPolicyState(model, ColdStartTracker(cold_start_s[key]),
                                              forecaster)
        self._bucket: dict[PoolKey, tuple[float, list[float]]] = {}
        self._forecast_cache: dict[PoolKey, tuple[tuple[int, int], float, float]] = {}

    # -- forecasting ------------------------------------------------------------------------

    def _record(self, key: PoolKey, t: float, demand: float) -> None:
        """Feed the forecaster one point per resolution step (the mean of the ticks in it)."""
        st = self.state[key]
        if st.forecaster is None:
            return
        step = math.floor(t / self.resolution_s) * self.resolution_s
        current = self._bucket.get(key)
        if current is None or current[0] == step:
            values = current[1] if current else []
            values.append(demand)
            self._bucket[key] = (step, values)
            return
        with contextlib.suppress(SeriesError):  # at or before warmed-up history: skip
            st.forecaster.observe(current[0], float(np.mean(current[1])))
        self._bucket[key] = (step, [demand])

    def warm(self, key: PoolKey, times_s: list[float], values: list[float]) -> int:
        """Feed a pool's demand history (from Prometheus at start-up); returns points taken."""
        st = self.state.get(key)
        if st is None or st.forecaster is None:
            return 0
        taken = 0
        for t, v in zip(times_s, values, strict=True):
            if math.isfinite(v):
                with contextlib.suppress(SeriesError):
                    st.forecaster.observe(t, v)
                    taken += 1
        return taken

    def pending_refits(self, now: float) -> list[PoolKey]:
        """Pools whose forecaster is due a refit and has enough history (for a caller that
        refits off its tick path: ``refit_inline=False``)."""
        return [key for key, st in self.state.items()
                if st.forecaster is not None and st.forecaster.span_s >= self.min_history_s
                and st.forecaster.refit_due(now)]

    def refit(self, key: PoolKey, now: float) -> float:
        """Refit one pool's forecaster (thread-safe against decide); returns fit seconds."""
        fc = self.state[key].forecaster
        if fc is None:
            return 0.0
        fc.refit(now)
        return fc.fit_seconds

    def _compute_forecast(self, key: PoolKey, now: float, lead_s: float) -> float:
        fc = self.state[key].forecaster
        assert fc is not None and fc.fitted is not None
        horizons = np.arange(self.resolution_s, lead_s + self.resolution_s, self.resolution_s)
        table = fc.forecast(horizons)
        value = float(table[:, -1].max())
        self._forecast_cache[key] = (self._cache_key(fc, lead_s), value, now)
        self.last_forecast[key] = {
            "at_s": now, "horizons_s": [float(h) for h in horizons],
            "quantiles": {f"{q:g}": [float(x) for x in table[:, i]]
                          for i, q in enumerate(fc.model.quantiles)}}
        return value

    def lead_s(self, key: PoolKey) -> float:
        return self.state[key].cold_start.p90_s + self.tick_s

    @staticmethod
    def _cache_key(fc: OnlineForecaster, lead_s: float) -> tuple[int, int]:
        """A cached forecast holds for this fitted model and this lead only."""
        return id(fc.fitted), round(lead_s)

    def _fresh(self, key: PoolKey, fc: OnlineForecaster, lead_s: float, at_s: float) -> bool:
        """Whether the cached forecast still holds at ``at_s`` (same model and lead, younger
        than ``forecast_every_s``)."""
        cached = self._forecast_cache.get(key)
        return cached is not None and cached[0] == self._cache_key(fc, lead_s) and \
            at_s - cached[2] < self.forecast_every_s

    def stale_forecasts(self, now: float, within_s: float) -> list[PoolKey]:
        """Pools whose cached forecast expires within ``within_s`` (a caller may refresh them
        off its tick path with :meth:`refresh_forecast`)."""
        out = []
        for key, st in self.state.items():
            fc = st.forecaster
            if fc is None or fc.fitted is None:
                continue
            if not self._fresh(key, fc, self.lead_s(key), now + within_s):
                out.append(key)
        return out

    def refresh_forecast(self, key: PoolKey, now: float) -> None:
        fc = self.state[key].forecaster
        if fc is not None and fc.fitted is not None:
            with contextlib.suppress(SeriesError, ValueError):
                self._compute_forecast(key, now, self.lead_s(key))

    def _forecast_max(self, key: PoolKey, now: float, lead_s: float) -> tuple[float | None, str]:
        st = self.state[key]
        fc = st.forecaster
        if fc is None or fc.span_s < self.min_history_s:
            return None, "forecast: history too short, sizing on the current demand"
        try:
            if self.refit_inline and (fc.refit_due(now) or fc.fitted is None):
                fc.refit(now)
            if fc.fitted is None:
                return None, "forecast: first fit still running, sizing on the current demand"
            # A forecast is reused for forecast_every_s (new points arrive once a resolution
            # step; the current demand still enters every tick through max(demand, forecast)).
            cached = self._forecast_cache.get(key)
            if cached is not None and (self._fresh(key, fc, lead_s, now)
                                       or not self.refit_inline):
                # Off-tick mode: a caller's worker refreshes expiring forecasts
                # (stale_forecasts / refresh_forecast); until it has, the last one stands.
                value = cached[1]
            else:
                value = self._compute_forecast(key, now, lead_s)
        except (SeriesError, ValueError) as exc:
            return None, f"forecast unavailable ({exc}); sizing on the current demand"
        return value, f"forecast q{self.quantile:g} over {lead_s:.0f}s"

    def _burst_floor(self, st: PoolPolicyState, now: float, demand: float) -> float:
        """The highest demand seen over the last ``burst_window_s`` (0: off): load that came in
        bursts recently is likely to come again within a cold start, and a forecast at a
        one-minute resolution cannot see sub-minute bursts."""
        if self.burst_window_s <= 0:
            return 0.0
        st.recent.append((now, demand))
        while st.recent[0][0] < now - self.burst_window_s:
            st.recent.popleft()
        return max(d for _, d in st.recent)

    # -- decisions --------------------------------------------------------------------------

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        # TTFT includes the wait for a decode slot: while a service's decode pool has a
        # backlog, a TTFT miss is decode's, and its prefill pool neither reacts nor learns.
        decode_backlog = {key[0] for key, pool in observation.pools.items()
                          if key[1] is Role.DECODE and _backlogged(pool)}
        # A request's prompt length is the service's, whichever pool reports it (a decode
        # engine may not count prompt tokens; its KV use and step time depend on them).
        prompt_len: dict[str, float] = {}
        for key, pool in observation.pools.items():
            value = pool.signals.get(Signal.MEAN_PROMPT_TOKENS)
            if value is not None and value > 0:
                prompt_len.setdefault(key[0], value)
        out = {}
        for key, pool in observation.pools.items():
            if key in self.state:
                out[key] = self._decide_pool(key, pool, observation.now_s,
                                             key[0] in decode_backlog, prompt_len.get(key[0]))
        return out

    def _decide_pool(self, key: PoolKey, pool: PoolObservation, now: float,
                     decode_backlogged: bool = False,
                     service_prompt_len: float | None = None) -> PoolDecision:
        st = self.state[key]
        role = key[1]
        r = pool.replicas
        signals = pool.signals
        st.cold_start.observe(now, r.ready)
        current = r.active
        demand = signals.get(DEMAND_SIGNAL[role])
        hit = signals.get(Signal.PREFIX_CACHE_HIT_RATIO) or 0.0
        if role is Role.PREFILL and demand is not None:
            demand = uncached_prefill_demand(demand, hit)
        if demand is None:
            held = max(r.desired, current)
            return PoolDecision(held, (f"degraded: {DEMAND_SIGNAL[role]} missing or stale; "
                                       f"holding {held} replicas, no scale-down",),
                                cause="degraded",
                                detail={"signal": DEMAND_SIGNAL[role], "held": held})
        st.capacity.observe_lengths(signals.get(Signal.MEAN_PROMPT_TOKENS)
                                    or service_prompt_len,
                                    signals.get(Signal.MEAN_OUTPUT_TOKENS))
        per_replica = st.capacity.per_replica()
        latency = signals.get(LATENCY_SIGNAL[role])
        queue = signals.get(Signal.QUEUE_DEPTH) or 0.0
        # A queue of more than two requests a replica: requests wait for this pool (for
        # decode that wait shows in TTFT, not ITL), so it counts as a miss for the model.
        backlogged = _backlogged(pool)
        blame_note = None
        if role is Role.PREFILL and decode_backlogged and not backlogged and \
                latency is not None and latency > st.capacity.slo_s:
            blame_note = (f"{LATENCY_SIGNAL[role]} {latency:.3g}s over the SLO while decode is "
                          f"backlogged: decode's miss, not prefill's")
            latency = None  # no reaction and no learning here
        st.capacity.observe_latency(latency_p95_s=latency,
                                    demand_per_replica=demand / max(r.ready, 1),
                                    backlogged=backlogged)
        self._record(key, pool.data_time_s, demand)
        lead = self.lead_s(key)
        forecast, fc_reason = self._forecast_max(key, now, lead)
        sized_for = max(demand, forecast) if forecast is not None else demand
        # Decode also holds sequences: the replicas for the sequences running and waiting now
        # (bursts of long prompts with short outputs fill KV before they fill the step).
        seqs = None
        waiting_for = 0.0
        if role is Role.DECODE:
            running = signals.get(Signal.RUNNING_REQUESTS)
            if running is not None:
                batch = st.capacity.decode_batch()
                # Waiting sequences count up to as many as run (a backlog larger than that is
                # the reactive path's, sized by its drain time: a pool that was idle and is hit
                # at once would otherwise ask for a replica per batch of queued requests).
                seqs = running + min(queue, max(running, batch))
                sized_for = max(sized_for, running / batch * per_replica)
                waiting_for = seqs / batch * per_replica
        # The burst floor remembers load, not a backlog: a queue drained within a minute
        # should not hold replicas for the whole window.
        burst = self._burst_floor(st, now, sized_for)
        sized_for = max(sized_for, burst, waiting_for)
        need = math.ceil(sized_for / per_replica) if per_replica > 0 else r.max_replicas
        detail: dict[str, float | str | None] = {
            "signal": DEMAND_SIGNAL[role], "demand": demand, "prefix_cache_hit_ratio": hit,
            "forecast": forecast, "quantile": self.quantile if forecast is not None else None,
            "lead_s": lead, "capacity_per_replica": per_replica, "sequences": seqs,
            "recent_peak": burst, "sized_for": sized_for,
            "capacity_correction": st.capacity.correction, "need": need}
        reasons = [f"demand {demand:.4g}/s, {fc_reason}"
                   + (f" = {forecast:.4g}/s" if forecast is not None else "")
                   + (f"; {seqs:.0f} sequences running or waiting" if seqs is not None else "")
                   + (f"; highest of the last {self.burst_window_s:.0f}s {burst:.4g}/s"
                      if burst > 0 else ""),
                   f"capacity {per_replica:.4g}/s per replica (correction "
                   f"{st.capacity.correction:.2f}), lead {lead:.0f}s -> need {need}"]
        if blame_note is not None:
            reasons.append(blame_note)
            detail["blamed_on"] = "decode"
        # Fast reactive path: latency over the SLO or a queue: drain the backlog in drain_s.
        slo = st.capacity.slo_s
        reactive = 0
        if (latency is not None and latency > slo) or backlogged:
            per_request = (st.capacity.mean_prompt_tokens if role is Role.PREFILL
                           else st.capacity.mean_output_tokens)
            backlog = queue * per_request
            reactive = r.ready + math.ceil(backlog / (per_replica * self.drain_s)) \
                if per_replica > 0 else r.max_replicas
            if latency is not None and latency > slo:
                reactive = max(reactive, r.ready + 1)
            reasons.append(f"reactive: {LATENCY_SIGNAL[role]} "
                           f"{'n/a' if latency is None else f'{latency:.3g}s'} vs SLO {slo:g}s, "
                           f"queue {queue:.0f} -> {reactive}")
            detail.update({"latency_signal": LATENCY_SIGNAL[role], "latency_p95_s": latency,
                           "slo_s": slo, "queue_depth": queue, "reactive": reactive})
        target = max(need, reactive)
        st.needs.append((now, target))
        if st.first_seen_s is None:
            st.first_seen_s = now
        while st.needs and st.needs[0][0] < now - self.stabilisation_s:
            st.needs.popleft()
        window_full = now - st.first_seen_s >= self.stabilisation_s
        cause = "steady"
        if target > current:
            desired = target
            cause = "reactive" if reactive > need else "forecast"
            st.cold_start.asked(now, min(target, r.max_replicas))
        else:
            held = max(n for _, n in st.needs)
            desired = max(target, held, current - self.max_step_down) \
                if held < current and window_full else current
            if desired < current:
                cause = "scale_down"
                reasons.append(f"scale down after {self.stabilisation_s:.0f}s below "
                               f"{current}, by at most {self.max_step_down}")
                st.cold_start.cancel_above(desired)
        bounded = max(r.min_replicas, min(r.max_replicas, desired))
        if bounded != desired:
            which = "min" if bounded > desired else "max"
            reasons.append(f"bound: {which} replicas {bounded}")
            detail["bound"] = which
            if bounded != current:
                cause = "bound"
        return PoolDecision(bounded, tuple(reasons), cause=cause, detail=detail)


class PolicySettings(TypedDict):
    """:class:`PdscalePolicy`'s keyword arguments that the spec sets."""

    tick_s: float
    quantile: float
    stabilisation_s: float
    max_step_down: int
    drain_s: float
    refit_every_s: float
    burst_window_s: float


def policy_settings(settings: ControllerSettings) -> PolicySettings:
    """The policy's keyword arguments from the spec's ``controller`` section (for the
    in-cluster controller and the simulator alike)."""
    return {"tick_s": float(settings.tick), "quantile": settings.scale_up_quantile,
            "stabilisation_s": float(settings.stabilisation),
            "max_step_down": settings.max_step_down, "drain_s": float(settings.drain_time),
            "refit_every_s": float(settings.refit_every),
            "burst_window_s": float(settings.burst_window)}


def build_policy(spec: Spec, *, refit_inline: bool = False,
                 refit_every_s: float | None = None,
                 cold_start_s: Mapping[PoolKey, float] | None = None) -> PdscalePolicy:
    """pdscale's policy for every pool of the spec, with its controller settings."""
    capacity: dict[PoolKey, CapacityModel] = {}
    cold: dict[PoolKey, float] = {}
    for svc in spec.services:
        for role, pool in svc.pools.items():
            slo = svc.slo.ttft_p95_s if role is Role.PREFILL else svc.slo.itl_p95_s
            capacity[(svc.name, role)] = CapacityModel(role, load_profile(pool.profile), slo)
            cold[(svc.name, role)] = float(pool.cold_start)
    if cold_start_s:
        cold.update(cold_start_s)
    settings = policy_settings(spec.controller)
    if refit_every_s:
        settings["refit_every_s"] = float(refit_every_s)
    return PdscalePolicy(capacity, cold, refit_inline=refit_inline, **settings)
