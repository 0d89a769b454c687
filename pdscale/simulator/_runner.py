"""Event mode as a world for the production controller (:mod:`simulator._world`).

Every tick the discrete-event simulator (:mod:`simulator._event`) hands over what happened
since the last one (arrivals, prompt, cached and generated tokens, first-token times, an ITL
histogram, GPU-busy time); :class:`EventWorld` turns that into the catalog's signals as the
recording rules would compute them (rates and percentiles over ``telemetry.RATE_WINDOW_S``,
gauges at the tick) and keeps a per-minute time series. Results: per-request SLO attainment
(TTFT within its SLO and mean inter-token time within the ITL SLO), latency percentiles,
GPU-hours billed from each replica's request to its end.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdscale.controller import Policy, PoolReplicas, Refits
from pdscale.simulator._event import EventSimulator
from pdscale.simulator._setup import (
    SimSetup,
    _DecodeReplica,
    _PrefillReplica,
    _State,
    hist_quantile,
)
from pdscale.simulator._trace import Trace
from pdscale.simulator._world import (
    PoolSignals,
    SimClock,
    SimResult,
    World,
    build_reconciler,
    run_world,
)
from pdscale.spec import Role, Spec
from pdscale.telemetry import DISPERSION_WINDOW_S, RATE_WINDOW_S, RECENT_WINDOW_S, Signal

__all__ = ["EventWorld", "SimResult", "attach_reconciler", "run_event"]

FloatHist = np.ndarray[Any, np.dtype[np.float64]]


@dataclass
class _TickRaw:
    """What happened in one tick (the counters' increments)."""

    t: float
    arrivals: int
    finished: int
    """Requests that completed: a decode worker's request count."""
    prefilled: int
    """Requests whose prefill was taken up (their prompt tokens counted): a prefill
    worker's request count."""
    prompt_tokens: int
    cached_tokens: int
    generated: int
    first_tokens: list[float]
    itl_hist: FloatHist
    busy_s: dict[Role, float]


@dataclass
class _Minute:
    rows: list[dict[str, float]] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)
    itl: FloatHist | None = None


class EventWorld(World):
    """A trace through the event simulator, observed and scaled by the controller."""

    def __init__(self, setup: SimSetup, trace: Trace, *,
                 observation_delay_s: float = 30.0, idle_before: bool = False) -> None:
        super().__init__(setup, observation_delay_s=observation_delay_s)
        self.idle_before = idle_before
        self.sim = EventSimulator(setup, trace)
        self.sim.on_tick = self._on_sim_tick
        self.window_ticks = max(1, round(RATE_WINDOW_S / setup.tick_s))
        self.raw: deque[_TickRaw] = deque(maxlen=self.window_ticks)
        self.recent_ticks = max(1, round(RECENT_WINDOW_S / setup.tick_s))
        self.series: list[dict[str, float]] = []
        self.peak: dict[Role, int] = {Role.PREFILL: 0, Role.DECODE: 0}
        self._last_busy: dict[int, float] = {}
        self._arrivals_seen = 0
        self._minute = _Minute()
        self._sampled_at: float | None = None
        self._started = False

    # -- World ----------------------------------------------------------------------------

    def advance(self, until_s: float) -> bool:
        if not self._started:
            self.sim.start()
            self._started = True
        self._sampled_at = None
        self.sim.advance(until_s, settle=False)
        if self._sampled_at is None or abs(self._sampled_at - until_s) > 1e-6:
            self.sim.advance(math.inf)  # the trace is done: let the last work finish
            self.sim.close()
            return False
        return True

    def replicas(self, role: Role) -> PoolReplicas:
        c = self.sim.counts(role)
        ps = self.sim.pool_setup(role)
        return PoolReplicas(ready=c["ready"], starting=c["starting"], draining=c["draining"],
                            desired=self.sim.desired[role], min_replicas=ps.min_replicas,
                            max_replicas=ps.max_replicas, gpus_per_replica=ps.gpus_per_replica)

    def scale(self, role: Role, replicas: int) -> None:
        self.sim.set_replicas(role, replicas)

    def desired(self, role: Role) -> int:
        return self.sim.desired[role]

    @property
    def span_s(self) -> float:
        return float(self.sim.arrival[-1]) if len(self.sim.arrival) else 0.0

    def result(self, wall_s: float) -> SimResult:
        self._flush_minute()
        return SimResult(_summary(self, wall_s), self.series, self.decisions)

    # -- signals --------------------------------------------------------------------------

    def _busy_delta(self, role: Role) -> float:
        total = 0.0
        for r in self.sim.pool(role):
            prev = self._last_busy.get(r.id, 0.0)
            total += r.busy_s - prev
            self._last_busy[r.id] = r.busy_s
        return total

    def _on_sim_tick(self, sim: EventSimulator, now: float) -> None:
        """At every TICK event: take the tick's counters, sample the signals, record."""
        arrivals = sim.window_arrivals
        self._arrivals_seen += arrivals
        self.raw.append(_TickRaw(
            t=now, arrivals=arrivals, finished=sim.window_finished,
            prefilled=sim.window_prefilled,
            prompt_tokens=sim.window_prompt_tokens,
            cached_tokens=sim.window_cached_tokens, generated=sim.window_generated,
            first_tokens=list(sim.window_first_tokens), itl_hist=sim.window_itl_hist.copy(),
            busy_s={r: self._busy_delta(r) for r in Role}))
        signals = {Role.PREFILL: self._prefill_signals(), Role.DECODE: self._decode_signals()}
        # The first tick, at t=0, closes a window before the trace. By default the trace is a
        # window cut from continuous traffic that nothing measured: no data, as a scrape
        # before the first one would be (read as zeros, it told the reactive baseline to scale
        # the fleet to its minimum at t=0 and gave the forecaster a demand of 0 to learn
        # from). With ``idle_before`` the pools ran idle, measured, before the load reached
        # them (a fresh deployment, as on the real-stack benchmark): the zeros are the data.
        # (Fluid mode samples after its first step: its first sample is measured.)
        first = not self._snapshots
        self.sample(now, {} if first and not self.idle_before else signals)
        self._record(now, signals)
        self._sampled_at = now

    def _rates(self, role: Role) -> PoolSignals:
        """Rates over the rate window, counted as each pool's engines count them: a prefill
        worker counts a request and its prompt tokens together, as its prefill is taken up;
        a decode worker's requests finish with their last token, and its output tokens count
        as they are generated (vLLM's request_success_total, prompt_tokens_total and
        generation_tokens_total on P/D workers). Both pools carry all three, so each pool's
        mean lengths derive as in a cluster; a prefill pool's mean prompt is that of the
        prompts it prefilled, in a backlog too."""
        recent = self.raw
        span = max(len(recent) * self.setup.tick_s, 1e-9)
        done = sum((r.prefilled if role is Role.PREFILL else r.finished) for r in recent)
        return {Signal.REQUEST_RATE: done / span,
                Signal.PROMPT_TOKENS_PER_S: sum(r.prompt_tokens for r in recent) / span,
                Signal.GENERATION_TOKENS_PER_S: sum(r.generated for r in recent) / span}

    def _utilisation(self, role: Role, ready: int) -> float | None:
        """GPU-busy share of the last tick (DCGM's utilisation gauge at the scrape)."""
        if not ready:
            return None
        return min(1.0, self.raw[-1].busy_s[role] / (self.setup.tick_s * ready))

    def _peak_prompt_rate(self) -> float | None:
        """The highest prompt-token rate over ``RECENT_WINDOW_S`` within the rate window
        (None until the window holds one)."""
        n = self.recent_ticks
        tokens = [r.prompt_tokens for r in self.raw]
        if len(tokens) < n:
            return None
        sums = np.convolve(tokens, np.ones(n), mode="valid")
        return float(sums.max()) / (n * self.setup.tick_s)

    def _prompt_dispersion(self) -> float | None:
        """The index of dispersion of the prompt tokens counted (at prefill completion, as
        vLLM's counter counts them) per ``DISPERSION_WINDOW_S`` over the rate window, as the
        recording rule computes it: half the mean squared difference of consecutive windows'
        tokens over their mean. None until three windows have passed or while none counted."""
        sim = self.sim
        done = sim.prefilled
        start = max(0.0, sim.now - RATE_WINDOW_S)
        while done and done[0][0] < start:
            done.popleft()
        n = int((sim.now - start) // DISPERSION_WINDOW_S)
        if n < 3 or not done:
            return None
        end = sim.now - n * DISPERSION_WINDOW_S  # windows end at now, as the rule's steps do
        times = np.fromiter((t for t, _ in done), float, len(done))
        tokens = np.fromiter((k for _, k in done), float, len(done))
        keep = times > end
        bins = np.minimum(((times[keep] - end) // DISPERSION_WINDOW_S).astype(np.int64), n - 1)
        counted = np.bincount(bins, weights=tokens[keep], minlength=n)
        mean = float(counted.mean())
        if mean <= 0:
            return None
        return float(np.mean(np.diff(counted) ** 2)) / 2 / mean

    def _prefill_signals(self) -> PoolSignals:
        sim = self.sim
        pre = [r for r in sim.prefill if isinstance(r, _PrefillReplica)]
        ready = sum(1 for r in pre if r.state is _State.READY)
        prompt = sum(r.prompt_tokens for r in self.raw)
        cached = sum(r.cached_tokens for r in self.raw)
        firsts = [x for r in self.raw for x in r.first_tokens]
        recent = list(self.raw)[-self.recent_ticks:]
        return {**self._rates(Role.PREFILL),
                Signal.QUEUE_DEPTH: float(len(sim.shared_queue) + sum(len(r.queue) for r in pre)),
                Signal.RUNNING_REQUESTS: float(sum(len(r.active) for r in pre)),
                Signal.PREFIX_CACHE_HIT_RATIO: cached / prompt if prompt else None,
                Signal.TTFT_P50_S: float(np.percentile(firsts, 50)) if firsts else None,
                Signal.TTFT_P95_S: _p95(firsts),
                Signal.TTFT_P95_RECENT_S: _p95([x for r in recent for x in r.first_tokens]),
                Signal.PROMPT_TOKENS_PEAK_PER_S: self._peak_prompt_rate(),
                Signal.PROMPT_TOKENS_DISPERSION: self._prompt_dispersion(),
                Signal.GPU_UTILIZATION_RATIO: self._utilisation(Role.PREFILL, ready),
                Signal.TARGETS_UP: float(ready)}

    def _decode_signals(self) -> PoolSignals:
        sim = self.sim
        dec = [r for r in sim.decode if isinstance(r, _DecodeReplica)]
        live = [r for r in dec if r.state in (_State.READY, _State.DRAINING)]
        ready = sum(1 for r in dec if r.state is _State.READY)
        cap = self.setup.decode.profile.kv_capacity_tokens
        hist = np.sum([r.itl_hist for r in self.raw], axis=0)
        return {**self._rates(Role.DECODE),
                Signal.QUEUE_DEPTH: float(sum(len(r.waiting) for r in dec) + len(sim._orphans)),
                Signal.RUNNING_REQUESTS: float(sum(len(r.members) for r in dec)),
                Signal.KV_CACHE_USAGE_RATIO: (float(np.mean([r.kv() / cap for r in live]))
                                              if live else None),
                Signal.ITL_P50_S: hist_quantile(hist, sim.itl_edges, 0.5),
                Signal.ITL_P95_S: hist_quantile(hist, sim.itl_edges, 0.95),
                Signal.GPU_UTILIZATION_RATIO: self._utilisation(Role.DECODE, ready),
                Signal.TARGETS_UP: float(ready)}

    # -- the time series ------------------------------------------------------------------

    def _record(self, now: float, signals: dict[Role, PoolSignals]) -> None:
        sim = self.sim
        row: dict[str, float] = {"t": now}
        for role in Role:
            c = sim.counts(role)
            self.peak[role] = max(self.peak[role], c["ready"] + c["starting"] + c["draining"])
            row[f"{role.value}_ready"] = c["ready"]
            row[f"{role.value}_starting"] = c["starting"]
            row[f"{role.value}_desired"] = sim.desired[role]
        last = self.raw[-1]
        row["arrivals"] = last.arrivals
        row["prompt_tokens"] = last.prompt_tokens
        row["queue_prefill"] = signals[Role.PREFILL][Signal.QUEUE_DEPTH] or 0.0
        row["queue_decode"] = signals[Role.DECODE][Signal.QUEUE_DEPTH] or 0.0
        row["kv_usage"] = signals[Role.DECODE][Signal.KV_CACHE_USAGE_RATIO] or 0.0
        acc = self._minute
        if acc.rows and int(acc.rows[-1]["t"] // 60) != int(now // 60):
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
        span = len(rows) * self.setup.tick_s
        out = {
            "minute": float(int(rows[0]["t"] // 60)),
            "arrivals_rps": sum(r["arrivals"] for r in rows) / span,
            "prompt_tokens_per_s": sum(r["prompt_tokens"] for r in rows) / span,
        }
        for role in Role:
            for k in ("ready", "starting", "desired"):
                out[f"{role.value}_{k}"] = float(np.mean([r[f"{role.value}_{k}"] for r in rows]))
        for k in ("queue_prefill", "queue_decode", "kv_usage"):
            out[k] = float(np.mean([r[k] for r in rows]))
        out["ttft_p95_s"] = float(np.percentile(firsts, 95)) if firsts else math.nan
        q = hist_quantile(hist, self.sim.itl_edges, 0.95) if hist is not None else None
        out["itl_p95_s"] = q if q is not None else math.nan
        self.series.append(out)
        self._minute = _Minute()


def _pct(values: np.ndarray[Any, Any], q: float) -> float | None:
    v = values[~np.isnan(values)]
    return float(np.percentile(v, q)) if len(v) else None


def attach_reconciler(world: EventWorld, policy: Policy, *, spec: Spec | None = None,
                      forecasts: Refits | None = None) -> None:
    """Tick the production controller at every simulated tick of ``world`` while something
    else advances its simulator (live mode advances it with the wall clock)."""
    clock = SimClock()
    reconciler = build_reconciler(world, policy, clock=clock, spec=spec, forecasts=forecasts)
    collect = world._on_sim_tick

    def on_tick(sim: EventSimulator, now: float) -> None:
        collect(sim, now)
        clock.now_s = now
        world.record(reconciler.tick())

    world.sim.on_tick = on_tick


def run_event(setup: SimSetup, trace: Trace, policy: Policy, *,
              observation_delay_s: float = 30.0, spec: Spec | None = None,
              forecasts: Refits | None = None,
              progress: Callable[[float], None] | None = None) -> SimResult:
    """Replay ``trace`` in event mode with ``policy`` in the production reconcile loop."""
    world = EventWorld(setup, trace, observation_delay_s=observation_delay_s)
    return run_world(world, policy, spec=spec, forecasts=forecasts, progress=progress)


def _summary(world: EventWorld, wall_s: float) -> dict[str, Any]:
    sim = world.sim
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
            "peak_replicas": world.peak[role],
            "busy_share": sum(r.busy_s for r in sim.pool(role)) / max(seconds, 1e-9),
        }
    return {
        "requests": n,
        "finished": int(finished.sum()),
        # Requests no replica could ever hold (a prompt larger than a decode replica's KV
        # cache): dropped at once, counted here and among the SLO misses.
        "rejected": int(sim.rejected),
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
        "scale_actions": world.scale_actions,
        "preemptions": sim.preemptions,
        "rerouted_requests": sim.rerouted,
        "simulated_s": end,
        "wall_s": wall_s,
        "pools": pools,
        "failures": _failures(sim),
    }


def _failures(sim: EventSimulator) -> dict[str, int] | None:
    """The failures asked for (``--fail``): how many took a replica, found none ready, or came
    due after the run had ended (every request answered), so never happened; None: none
    asked."""
    asked = len(sim.setup.failures)
    if not asked:
        return None
    took = sum(1 for _, _, hit in sim.failed if hit)
    return {"asked": asked, "took_a_replica": took, "no_ready_replica": len(sim.failed) - took,
            "after_the_run": asked - len(sim.failed)}


def _p95(values: list[float]) -> float | None:
    return float(np.percentile(values, 95)) if values else None
