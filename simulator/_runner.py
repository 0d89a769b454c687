"""The closed loop: run a trace through the simulated pools with a policy, collect results.

Every tick (15 s) the simulator computes what Prometheus would show for each pool over the last
minute (the catalog's signals: queue depth, running requests, TTFT and ITL percentiles, request
and token rates, prefix-cache hit rate, KV-cache usage, GPU busy share) and hands the policy
the snapshot from ``observation_delay_s`` earlier (one scrape interval plus one rule
evaluation, 30 s by default). Decisions go through the same actuator interface the controller
uses. Results: per-request SLO attainment (TTFT within its SLO and mean inter-token time within
the ITL SLO), latency percentiles, GPU-hours billed from each replica's request to its end, and
a per-minute time series.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller import (
    Actuator,
    Observation,
    Policy,
    PoolDecision,
    PoolKey,
    PoolObservation,
    PoolReplicas,
)
from pdscale.spec import Role
from simulator._event import (
    EventSimulator,
    SimSetup,
    _DecodeReplica,
    _PrefillReplica,
    _State,
    hist_quantile,
)
from simulator._trace import Trace

__all__ = ["SimActuator", "SimResult", "attach_loop", "finish_loop", "run_event"]

WINDOW_TICKS = 4  # signals over the last minute (4 x 15 s), like a rate()[1m]


@dataclass
class _TickRaw:
    t: float
    arrivals: int
    prompt_tokens: int
    cached_tokens: int
    generated: int
    first_tokens: list[float]
    itl_hist: np.ndarray[Any, np.dtype[np.float64]]
    busy_s: dict[Role, float]
    prompt_sum: int
    output_sum: int


@dataclass
class _Minute:
    rows: list[dict[str, float]] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)
    itl: np.ndarray[Any, np.dtype[np.float64]] | None = None


@dataclass
class SimResult:
    summary: dict[str, Any]
    timeseries: list[dict[str, float]]
    decisions: list[dict[str, Any]] = field(default_factory=list)


class SimActuator:
    """The simulator's side of controller.Actuator: scale a pool of the simulated service."""

    def __init__(self, sim: EventSimulator) -> None:
        self.sim = sim

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        service, role = key
        if service != self.sim.setup.service:
            raise KeyError(f"no pool {key!r} here: this simulation runs service "
                           f"{self.sim.setup.service!r}")
        self.sim.set_replicas(role, replicas)


class _Loop:
    def __init__(self, sim: EventSimulator, policy: Policy, *, observation_delay_s: float,
                 interval_s: float) -> None:
        self.sim = sim
        self.policy = policy
        self.actuator: Actuator = SimActuator(sim)
        self.delay_ticks = max(0, round(observation_delay_s / sim.setup.tick_s))
        self.raw: deque[_TickRaw] = deque(maxlen=WINDOW_TICKS + self.delay_ticks + 16)
        self.snapshots: deque[tuple[float, dict[Role, dict[str, float | None]]]] = deque(
            maxlen=self.delay_ticks + 1)
        self.interval_ticks = max(1, int(interval_s / sim.setup.tick_s))
        self.series: list[dict[str, float]] = []
        self.decisions: list[dict[str, Any]] = []
        self.scale_actions = 0
        self.replica_seconds: dict[Role, float] = {Role.PREFILL: 0.0, Role.DECODE: 0.0}
        self.peak: dict[Role, int] = {Role.PREFILL: 0, Role.DECODE: 0}
        self._last_busy: dict[int, float] = {}
        self._arrival_index = 0
        self._minute = _Minute()

    def _busy_delta(self, role: Role) -> float:
        total = 0.0
        for r in self.sim.pool(role):
            prev = self._last_busy.get(r.id, 0.0)
            total += r.busy_s - prev
            self._last_busy[r.id] = r.busy_s
        return total

    def _collect(self, now: float) -> None:
        sim = self.sim
        # Lengths of the requests that arrived in this tick, for the Dynamo planner's means.
        end = int(np.searchsorted(sim.arrival, now, side="right"))
        sl = slice(self._arrival_index, end)
        self._arrival_index = end
        self.raw.append(_TickRaw(
            t=now, arrivals=end - sl.start, prompt_tokens=sim.window_prompt_tokens,
            cached_tokens=sim.window_cached_tokens, generated=sim.window_generated,
            first_tokens=list(sim.window_first_tokens), itl_hist=sim.window_itl_hist.copy(),
            busy_s={r: self._busy_delta(r) for r in Role},
            prompt_sum=int(sim.prompt[sl].sum()), output_sum=int(sim.output[sl].sum())))

    def _signals(self, now: float) -> dict[Role, dict[str, float | None]]:
        sim = self.sim
        recent = list(self.raw)[-WINDOW_TICKS:]
        span = max(len(recent) * sim.setup.tick_s, 1e-9)
        arrivals = sum(r.arrivals for r in recent)
        prompt = sum(r.prompt_tokens for r in recent)
        cached = sum(r.cached_tokens for r in recent)
        firsts = [x for r in recent for x in r.first_tokens]
        hist = sum((r.itl_hist for r in recent), np.zeros_like(sim.itl_hist))
        itl_p50 = hist_quantile(hist, sim.itl_edges, 0.5)
        itl_p95 = hist_quantile(hist, sim.itl_edges, 0.95)
        interval = list(self.raw)[-self.interval_ticks:]
        n_int = sum(r.arrivals for r in interval)
        int_span = max(len(interval) * sim.setup.tick_s, 1e-9)
        out: dict[Role, dict[str, float | None]] = {}
        for role in Role:
            ready = [r for r in sim.pool(role) if r.state is _State.READY]
            busy = sum(r.busy_s[role] for r in recent)
            util = busy / (span * max(len(ready), 1)) if ready else None
            s: dict[str, float | None] = {
                "request_rate": arrivals / span,
                "gpu_utilization_ratio": None if util is None else min(1.0, util),
                "targets_up": float(len(ready)),
                "request_rate_interval": n_int / int_span,
                "mean_input_tokens_interval": (sum(r.prompt_sum for r in interval) / n_int)
                if n_int else None,
                "mean_output_tokens_interval": (sum(r.output_sum for r in interval) / n_int)
                if n_int else None,
            }
            if role is Role.PREFILL:
                pre = [r for r in sim.prefill if isinstance(r, _PrefillReplica)]
                s["queue_depth"] = float(len(sim.shared_queue) + sum(len(r.queue) for r in pre))
                s["running_requests"] = float(sum(len(r.active) for r in pre))
                s["prompt_tokens_per_s"] = prompt / span
                s["prefix_cache_hit_ratio"] = cached / prompt if prompt else None
                s["ttft_p50_s"] = float(np.percentile(firsts, 50)) if firsts else None
                s["ttft_p95_s"] = float(np.percentile(firsts, 95)) if firsts else None
            else:
                dec = [r for r in sim.decode if isinstance(r, _DecodeReplica)]
                cap = sim.setup.decode.profile.kv_capacity_tokens
                live = [r for r in dec if r.state in (_State.READY, _State.DRAINING)]
                s["queue_depth"] = float(sum(len(r.waiting) for r in dec) + len(sim._orphans))
                s["running_requests"] = float(sum(len(r.members) for r in dec))
                s["generation_tokens_per_s"] = sum(r.generated for r in recent) / span
                s["kv_cache_usage_ratio"] = (float(np.mean([r.kv() / cap for r in live]))
                                             if live else None)
                max_batch = sim.setup.decode.profile.max_batch
                s["batch_occupancy_ratio"] = (float(np.mean([len(r.members) / max_batch
                                                             for r in live])) if live else None)
                s["itl_p50_s"] = itl_p50
                s["itl_p95_s"] = itl_p95
            out[role] = s
        return out

    def on_tick(self, sim: EventSimulator, now: float) -> None:
        self._collect(now)
        signals = self._signals(now)
        self.snapshots.append((now, signals))
        self._record(now, signals)
        data_time, delayed = self.snapshots[0]
        pools: dict[PoolKey, PoolObservation] = {}
        for role in Role:
            c = sim.counts(role)
            ps = sim.pool_setup(role)
            replicas = PoolReplicas(ready=c["ready"], starting=c["starting"],
                                    draining=c["draining"], desired=sim.desired[role],
                                    min_replicas=ps.min_replicas, max_replicas=ps.max_replicas,
                                    gpus_per_replica=ps.gpus_per_replica)
            key = (sim.setup.service, role)
            pools[key] = PoolObservation(key, replicas, delayed[role], data_time)
        decisions: Mapping[PoolKey, PoolDecision] = self.policy.decide(Observation(now, pools))
        for key, decision in decisions.items():
            role = key[1]
            before = sim.desired[role]
            self.actuator.set_replicas(key, decision.desired_replicas, decision.reasons)
            if sim.desired[role] != before:
                self.scale_actions += 1
                self.decisions.append({"t": now, "pool": role.value, "from": before,
                                       "to": sim.desired[role], "reasons": list(decision.reasons)})

    def _record(self, now: float, signals: Mapping[Role, Mapping[str, float | None]]) -> None:
        sim = self.sim
        tick = sim.setup.tick_s
        row: dict[str, float] = {"t": now}
        for role in Role:
            c = sim.counts(role)
            billed = c["ready"] + c["starting"] + c["draining"]
            self.replica_seconds[role] += billed * tick
            self.peak[role] = max(self.peak[role], billed)
            row[f"{role.value}_ready"] = c["ready"]
            row[f"{role.value}_starting"] = c["starting"]
            row[f"{role.value}_desired"] = sim.desired[role]
        last = self.raw[-1]
        row["arrivals"] = last.arrivals
        row["prompt_tokens"] = last.prompt_tokens
        row["queue_prefill"] = signals[Role.PREFILL]["queue_depth"] or 0.0
        row["queue_decode"] = signals[Role.DECODE]["queue_depth"] or 0.0
        row["kv_usage"] = signals[Role.DECODE]["kv_cache_usage_ratio"] or 0.0
        minute = int(now // 60)
        acc = self._minute
        if acc.rows and int(acc.rows[-1]["t"] // 60) != minute:
            self._flush_minute()
            acc = self._minute
        acc.rows.append(row)
        acc.first_tokens.extend(last.first_tokens)
        acc.itl = last.itl_hist.copy() if acc.itl is None else acc.itl + last.itl_hist

    def _flush_minute(self) -> None:
        rows = self._minute.rows
        if not rows:
            return
        firsts = self._minute.first_tokens
        hist = self._minute.itl
        span = len(rows) * self.sim.setup.tick_s
        out = {
            "minute": float(int(rows[0]["t"] // 60)),
            "arrivals_rps": sum(r["arrivals"] for r in rows) / span,
            "prompt_tokens_per_s": sum(r["prompt_tokens"] for r in rows) / span,
        }
        for role in Role:
            for k in ("ready", "starting", "desired"):
                out[f"{role.value}_{k}"] = float(np.mean([r[f"{role.value}_{k}"] for r in rows]))
        out["queue_prefill"] = float(np.mean([r["queue_prefill"] for r in rows]))
        out["queue_decode"] = float(np.mean([r["queue_decode"] for r in rows]))
        out["kv_usage"] = float(np.mean([r["kv_usage"] for r in rows]))
        out["ttft_p95_s"] = float(np.percentile(firsts, 95)) if firsts else math.nan
        q = hist_quantile(hist, self.sim.itl_edges, 0.95) if hist is not None else None
        out["itl_p95_s"] = q if q is not None else math.nan
        self.series.append(out)
        self._minute = _Minute()


def _pct(values: np.ndarray[Any, Any], q: float) -> float | None:
    v = values[~np.isnan(values)]
    return float(np.percentile(v, q)) if len(v) else None


def attach_loop(sim: EventSimulator, policy: Policy, *, observation_delay_s: float = 30.0,
                planner_interval_s: float = 180.0) -> _Loop:
    """Connect a policy to a simulator's ticks (used by the live mode)."""
    loop = _Loop(sim, policy, observation_delay_s=observation_delay_s,
                 interval_s=planner_interval_s)
    sim.on_tick = loop.on_tick
    return loop


def finish_loop(sim: EventSimulator, loop: _Loop, wall_s: float) -> SimResult:
    loop._flush_minute()
    return SimResult(_summary(sim, loop, wall_s), loop.series, loop.decisions)


def run_event(setup: SimSetup, trace: Trace, policy: Policy, *,
              observation_delay_s: float = 30.0, planner_interval_s: float = 180.0,
              progress: Callable[[float], None] | None = None) -> SimResult:
    started = time.perf_counter()
    sim = EventSimulator(setup, trace)
    loop = _Loop(sim, policy, observation_delay_s=observation_delay_s,
                 interval_s=planner_interval_s)
    sim.on_tick = loop.on_tick
    sim.run(progress=progress)
    loop._flush_minute()
    wall = time.perf_counter() - started
    return SimResult(_summary(sim, loop, wall), loop.series, loop.decisions)


def _summary(sim: EventSimulator, loop: _Loop, wall_s: float) -> dict[str, Any]:
    setup = sim.setup
    ttft = sim.first_token - sim.arrival
    tpot = np.where(sim.output > 1, (sim.finish - sim.first_token) /
                    np.maximum(sim.output - 1, 1), 0.0)
    finished = ~np.isnan(sim.finish)
    ttft_ok = finished & (ttft <= setup.slo_ttft_s)
    itl_ok = finished & (tpot <= setup.slo_itl_s)
    n = len(sim.arrival)
    end = sim.now
    pools: dict[str, Any] = {}
    total_gpu_h = 0.0
    for role in Role:
        ps = sim.pool_setup(role)
        seconds = sum(((r.gone_s if r.gone_s is not None else end) - r.requested_s)
                      for r in sim.pool(role))
        gpu_h = seconds * ps.gpus_per_replica / 3600
        total_gpu_h += gpu_h
        pools[role.value] = {
            "gpu_hours": gpu_h,
            "mean_replicas": seconds / max(end, 1e-9),
            "peak_replicas": loop.peak[role],
            "busy_share": sum(r.busy_s for r in sim.pool(role)) / max(seconds, 1e-9),
        }
    return {
        "requests": n,
        "finished": int(finished.sum()),
        "slo_attainment": float((ttft_ok & itl_ok).sum() / max(n, 1)),
        "ttft_attainment": float(ttft_ok.sum() / max(n, 1)),
        "itl_attainment": float(itl_ok.sum() / max(n, 1)),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p95_s": _pct(ttft, 95),
        "ttft_p99_s": _pct(ttft, 99),
        "itl_p50_s": sim.itl_quantile(0.5),
        "itl_p95_s": sim.itl_quantile(0.95),
        "tpot_p95_s": _pct(tpot[finished], 95),
        "gpu_hours": total_gpu_h,
        "scale_actions": loop.scale_actions,
        "preemptions": sim.preemptions,
        "rerouted_requests": sim.rerouted,
        "simulated_s": end,
        "wall_s": wall_s,
        "pools": pools,
    }


