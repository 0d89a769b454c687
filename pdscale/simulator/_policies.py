"""Baseline scaling policies for comparison, all speaking controller's Policy interface.

* ``static``: fixed replicas (by default sized for the trace's peak, see :func:`size_for_peak`).
* ``reactive``: Kubernetes HPA v2 semantics on a utilisation metric per pool (prefill: GPU busy
  share; decode: the larger of KV-cache usage and batch occupancy, running requests over the
  ready replicas' largest batch), target 60 %: 15 s sync,
  10 % tolerance, scale-up at most max(4 pods, 100 %) per period, scale-down stabilisation
  300 s (the highest recommendation of the last 5 minutes).
* ``dynamo``: NVIDIA Dynamo's planner as published: every 180 s, predict the next interval's
  request rate, mean input and output length (constant predictor: the last recorded values,
  which are rates over the recording rules' 5-minute window where the planner queries its own
  interval), size prefill as rate x ISL x (1 - prefix hit) x min(1, TTFT correction) / prefill
  tokens/s per replica at that ISL, and decode as rate x OSL / decode tokens/s per replica at
  the ITL target (divided by the ITL correction); corrections are observed / expected latency.
  A fast loop adds one replica when the pool's latency is over its SLO and nothing is starting.
  No lead time, no model of start-up time.
* ``oracle``: knows the future arrivals and starts replicas exactly one cold start ahead of the
  demand in the next tick: the GPU-hour floor for meeting the SLO with this capacity model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdscale.controller import (
    HEADROOM,
    InstanceProfile,
    Observation,
    PoolDecision,
    PoolKey,
    decode_operating_point,
    prefill_capacity,
    uncached_prefill_demand,
)
from pdscale.simulator._trace import Trace
from pdscale.spec import Role
from pdscale.telemetry import Signal

__all__ = [
    "DynamoPolicy",
    "OraclePolicy",
    "ReactivePolicy",
    "StaticPolicy",
    "demand_plan",
    "size_for_peak",
]

@dataclass(frozen=True)
class DemandPlan:
    """Replicas each pool needs, per second of the trace (from the true future)."""

    prefill: npt.NDArray[np.int64]
    decode: npt.NDArray[np.int64]


def demand_plan(trace: Trace, prefill: InstanceProfile, decode: InstanceProfile,
                ttft_slo_s: float, itl_slo_s: float, *, prefix_hit: float = 0.0) -> DemandPlan:
    """Replicas needed second by second, from the true arrivals.

    Prefill: to keep TTFT within the SLO, the uncached prompt tokens arriving in any window of
    w seconds must be prefilled within w + s, where s is the slack the SLO leaves (80 % of it,
    less the engine's overhead): N >= tokens(w) / (throughput x (w + s)) for w = 1..64 s, at
    80 % of saturated throughput. Decode: concurrent sequences over the largest batch whose
    step time meets the ITL SLO."""
    n_s = math.ceil(trace.arrival_s[-1] + 1) if len(trace) else 1
    sec = np.minimum(trace.arrival_s.astype(np.int64), n_s - 1)
    tokens = np.bincount(sec, weights=uncached_prefill_demand(1.0, prefix_hit) *
                         trace.prompt_tokens, minlength=n_s)
    mean_l = float(trace.prompt_tokens.mean())
    mean_sq = float((trace.prompt_tokens.astype(np.float64) ** 2).mean())
    mu = prefill_capacity(prefill, mean_l, mean_sq)
    slack = max(0.05, ttft_slo_s * HEADROOM - prefill.overhead_ms(mean_l) / 1000)
    cum = np.concatenate([[0.0], np.cumsum(tokens)])
    p_need = np.zeros(n_s)
    for w in (1, 2, 4, 8, 16, 32, 64):
        # Tokens in the window of w seconds ending at each second (inclusive).
        hi = np.arange(1, n_s + 1)
        lo = np.maximum(hi - w, 0)
        in_window = cum[hi] - cum[lo]
        p_need = np.maximum(p_need, in_window / (mu * (w + slack)))
    # A window's need applies over the whole window it covers.
    p_need = _rolling_max(np.ceil(p_need), 64)
    ctx = mean_l + float(trace.output_tokens.mean()) / 2
    point = decode_operating_point(decode, itl_slo_s * HEADROOM, ctx)
    batch, step_s = point.batch, point.step_s
    start = np.minimum(sec, n_s - 1)
    end = np.minimum((trace.arrival_s + trace.output_tokens * step_s).astype(np.int64) + 1,
                     n_s)
    diff = np.zeros(n_s + 1)
    np.add.at(diff, start, 1)
    np.add.at(diff, end, -1)
    concurrency = np.cumsum(diff)[:n_s]
    d_need = np.ceil(concurrency / batch)
    return DemandPlan(np.maximum(p_need, 1).astype(np.int64),
                      np.maximum(d_need, 1).astype(np.int64))


def _rolling_max(values: npt.NDArray[np.float64], window: int) -> npt.NDArray[np.float64]:
    """Max over the trailing ``window`` seconds and the leading ones (a centred hold)."""
    out = values.copy()
    shift = 1
    while shift < window:
        out[shift:] = np.maximum(out[shift:], out[:-shift])
        shift *= 2
    return out


def size_for_peak(plan: DemandPlan) -> dict[Role, int]:
    return {Role.PREFILL: int(plan.prefill.max()), Role.DECODE: int(plan.decode.max())}


class StaticPolicy:
    name = "static"

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        return {}


class ReactivePolicy:
    """HPA-style: desired = ceil(ready x metric / target) with HPA's defaults."""

    name = "reactive"

    def __init__(self, *, target: float = 0.6, tolerance: float = 0.1,
                 stabilisation_s: float = 300.0, tick_s: float = 15.0,
                 decode_max_batch: int | None = None) -> None:
        self.target = target
        self.tolerance = tolerance
        self.window = max(1, int(stabilisation_s / tick_s))
        self.decode_max_batch = decode_max_batch
        self._history: dict[PoolKey, deque[int]] = {}

    def _metric(self, role: Role, signals: Mapping[Signal, float | None],
                ready: int) -> float | None:
        if role is Role.PREFILL:
            return signals.get(Signal.GPU_UTILIZATION_RATIO)
        kv = signals.get(Signal.KV_CACHE_USAGE_RATIO)
        running = signals.get(Signal.RUNNING_REQUESTS)
        # Occupancy over the replicas of the same sample (its scrape targets), not today's
        # ready count: after a scale-up the old sample's sequences would look spread thin.
        replicas = signals.get(Signal.TARGETS_UP) or ready
        occ = None
        if running is not None and self.decode_max_batch and replicas:
            occ = min(1.0, running / (replicas * self.decode_max_batch))
        values = [v for v in (kv, occ) if v is not None]
        return max(values) if values else None

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        out = {}
        for key, pool in observation.pools.items():
            current = max(pool.replicas.ready, 1)
            metric = self._metric(key[1], pool.signals, pool.replicas.ready)
            if metric is None:
                continue  # HPA skips a metric it cannot read
            ratio = metric / self.target
            recommended = current if abs(ratio - 1) <= self.tolerance else \
                math.ceil(current * ratio)
            history = self._history.setdefault(key, deque(maxlen=self.window))
            history.append(recommended)
            desired = max(history)  # scale-down stabilisation window
            limit = max(pool.replicas.active + 4, 2 * pool.replicas.active)
            desired = min(desired, limit)
            desired = max(pool.replicas.min_replicas, min(pool.replicas.max_replicas, desired))
            out[key] = PoolDecision(desired, (f"utilisation {metric:.2f} vs target "
                                              f"{self.target:.2f}",))
        return out


class DynamoPolicy:
    """Dynamo's planner (SLA mode) as published; see the module docstring."""

    name = "dynamo"

    def __init__(self, prefill: InstanceProfile, decode: InstanceProfile, *, ttft_slo_s: float,
                 itl_slo_s: float, interval_s: float = 180.0) -> None:
        self.prefill = prefill
        self.decode = decode
        self.ttft_slo_s = ttft_slo_s
        self.itl_slo_s = itl_slo_s
        self.interval_s = interval_s
        self._next = 0.0
        self._desired: dict[PoolKey, int] = {}

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        out: dict[PoolKey, PoolDecision] = {}
        now = observation.now_s
        prefill_key = next((k for k in observation.pools if k[1] is Role.PREFILL), None)
        decode_key = next((k for k in observation.pools if k[1] is Role.DECODE), None)
        if prefill_key is None or decode_key is None:
            return out
        p, d = observation.pools[prefill_key], observation.pools[decode_key]
        if now >= self._next:
            self._next = now + self.interval_s
            rate = p.signals.get(Signal.REQUEST_RATE)
            isl = p.signals.get(Signal.MEAN_PROMPT_TOKENS)
            osl = d.signals.get(Signal.MEAN_OUTPUT_TOKENS)
            hit = p.signals.get(Signal.PREFIX_CACHE_HIT_RATIO) or 0.0
            if rate is not None and isl is not None and osl is not None and rate > 0:
                ttft = p.signals.get(Signal.TTFT_P50_S)
                expected_ttft = self.prefill.prefill_ms(isl) / 1000
                ttft_corr = (ttft / expected_ttft) if ttft and expected_ttft else 1.0
                prefill_tps = isl / (self.prefill.prefill_ms(isl) / 1000)
                # The profile prices a replica (whatever its GPUs): no division by them.
                n_p = math.ceil(rate * isl * (1 - hit) * min(1.0, ttft_corr) / prefill_tps)
                itl = d.signals.get(Signal.ITL_P50_S)
                ctx = isl + osl / 2
                # The planner plans at the ITL target itself (no headroom), divided by how
                # far the observed ITL is from the one expected there.
                expected_itl = decode_operating_point(self.decode, self.itl_slo_s, ctx).step_s
                itl_corr = (itl / expected_itl) if itl and expected_itl else 1.0
                decode_tps = decode_operating_point(
                    self.decode, self.itl_slo_s / max(itl_corr, 1e-3), ctx).tokens_per_s
                n_d = math.ceil(rate * osl / decode_tps)
                self._desired[prefill_key] = n_p
                self._desired[decode_key] = n_d
                out[prefill_key] = PoolDecision(n_p, (f"predicted {rate:.2f} req/s, ISL "
                                                      f"{isl:.0f}", ))
                out[decode_key] = PoolDecision(n_d, (f"predicted {rate:.2f} req/s, OSL "
                                                     f"{osl:.0f}",))
        # Fast loop: one replica at a time while a pool misses its SLO and none is starting.
        for key, pool, signal, slo in ((prefill_key, p, Signal.TTFT_P95_S, self.ttft_slo_s),
                                       (decode_key, d, Signal.ITL_P95_S, self.itl_slo_s)):
            value = pool.signals.get(signal)
            if value is not None and value > slo and pool.replicas.starting == 0:
                base = out[key].desired_replicas if key in out else pool.replicas.active
                out[key] = PoolDecision(base + 1, (f"{signal.value} {value:.3f}s over SLO: +1",))
        for key, decision in list(out.items()):
            pool = observation.pools[key]
            clamped = max(pool.replicas.min_replicas,
                          min(pool.replicas.max_replicas, decision.desired_replicas))
            out[key] = PoolDecision(clamped, decision.reasons)
        return out


class OraclePolicy:
    """Starts replicas one cold start before the future demand needs them."""

    name = "oracle"

    def __init__(self, plan: DemandPlan, *, service: str, cold_start_s: Mapping[Role, float],
                 tick_s: float = 15.0) -> None:
        self.plan = plan
        self.service = service
        self.cold_start_s = cold_start_s
        self.tick_s = tick_s

    def need(self, role: Role, start_s: float, end_s: float) -> int:
        series = self.plan.prefill if role is Role.PREFILL else self.plan.decode
        lo = max(0, int(start_s))
        hi = max(lo + 1, math.ceil(end_s))
        if lo >= len(series):
            return 1
        return int(series[lo:hi].max())

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        out = {}
        now = observation.now_s
        for key, pool in observation.pools.items():
            role = key[1]
            lead = self.cold_start_s[role]
            # Replicas ready now cover [now, now + lead); new ones are ready at now + lead.
            want = max(self.need(role, now + lead, now + lead + self.tick_s),
                       min(pool.replicas.active, self.need(role, now, now + lead + self.tick_s)))
            want = max(pool.replicas.min_replicas, min(pool.replicas.max_replicas, want))
            out[key] = PoolDecision(want, ("future demand one cold start ahead",))
        return out
