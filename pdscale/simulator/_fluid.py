"""Fluid (time-stepped) simulation for multi-day traces.

Each step (``dt_s``, 5 s by default) moves aggregates instead of requests:

* Prefill: uncached prompt tokens join a backlog served at the pool's saturated throughput
  (``InstanceProfile.prefill_tokens_per_s`` for the step's length mix). A request's TTFT is
  the backlog's drain time, plus an M/G/c waiting time when the pool is not saturated
  (Allen-Cunneen with Sakasegawa's approximation, tokens as work), plus its own prefill time
  stretched by the share of each iteration other requests take (1 + utilisation), plus the
  engine overhead, the KV transfer, the wait for decode admission and the first decode step.
* Decode: the batch per replica is the fixed point of Little's law, B = (rate x output tokens
  / replicas) x step(B), with step(B) = d0 + d1 B + d2 B ctx / 1000; when that exceeds the
  largest batch (engine cap or KV capacity) the pool is saturated and admissions queue.
  Every token of the step has that step time; a request meets the ITL SLO when it is within.
* Latency distributions are kept as weighted histograms, so memory does not grow with the
  trace. Replicas start, become ready after the cold start, and drain as in event mode.
* :class:`FluidWorld` is the mode's world for the production controller
  (:mod:`simulator._world`): rates and latency percentiles over the recording rules' window
  (sums over the window's steps, updated in O(1) a step), gauges at the tick.

``tests/simulator/test_validation.py`` compares it with the event mode on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pdscale.controller import (
    Policy,
    PoolReplicas,
    Refits,
    decode_batch_limit,
    uncached_prefill_demand,
)
from pdscale.simulator._event import PoolSetup, SimSetup, hist_quantile
from pdscale.simulator._setup import ColdStarts
from pdscale.simulator._trace import Trace, TraceError, check_max_prompt_tokens
from pdscale.simulator._world import PoolSignals, SimResult, World, run_world
from pdscale.spec import Role, Spec
from pdscale.telemetry import RATE_WINDOW_S, RECENT_WINDOW_S, Signal

__all__ = ["FluidLoad", "FluidWorld", "fluid_load_from_servegen", "fluid_load_from_trace",
           "run_fluid"]

FloatArray = npt.NDArray[np.float64]
_EDGES = np.geomspace(1e-4, 1e4, 1601)


@dataclass(frozen=True)
class FluidLoad:
    """Per step: requests and a sample of their lengths (sample weights add up to them)."""

    dt_s: float
    requests: FloatArray
    sample_index: npt.NDArray[np.int64]
    """Per step, which length sample describes its requests."""
    prompt_samples: tuple[FloatArray, ...]
    output_samples: tuple[FloatArray, ...]
    prefix_hit: float = 0.0

    @property
    def steps(self) -> int:
        return int(self.requests.shape[0])

    def clipped(self, max_prompt_tokens: int) -> FluidLoad:
        """Prompt samples longer than ``max_prompt_tokens`` cut to it, as
        :meth:`Trace.clipped` cuts a trace's prompts."""
        check_max_prompt_tokens(max_prompt_tokens)
        return replace(self, prompt_samples=tuple(np.minimum(p, max_prompt_tokens)
                                                  for p in self.prompt_samples))


def fluid_load_from_trace(trace: Trace, *, dt_s: float = 5.0,
                          sample_every_s: float = 300.0, prefix_hit: float = 0.0) -> FluidLoad:
    """Bin a request trace: counts per step, length samples per ``sample_every_s``."""
    n_steps = max(1, math.ceil((float(trace.arrival_s[-1]) + 1e-9) / dt_s))
    step = np.minimum((trace.arrival_s / dt_s).astype(np.int64), n_steps - 1)
    requests = np.bincount(step, minlength=n_steps).astype(np.float64)
    group = np.minimum((trace.arrival_s / sample_every_s).astype(np.int64),
                       math.ceil(n_steps * dt_s / sample_every_s) - 1)
    n_groups = int(group.max()) + 1
    prompts: list[FloatArray] = []
    outputs: list[FloatArray] = []
    bounds = np.searchsorted(group, np.arange(n_groups + 1))
    for g in range(n_groups):
        lo, hi = bounds[g], bounds[g + 1]
        if hi == lo:  # no requests: reuse the previous mix (or the trace's)
            p = prompts[-1] if prompts else trace.prompt_tokens.astype(np.float64)[:256]
            o = outputs[-1] if outputs else trace.output_tokens.astype(np.float64)[:256]
        else:
            p = trace.prompt_tokens[lo:hi].astype(np.float64)
            o = np.maximum(trace.output_tokens[lo:hi], 1).astype(np.float64)
        prompts.append(p)
        outputs.append(o)
    index = np.minimum((np.arange(n_steps) * dt_s / sample_every_s).astype(np.int64),
                       n_groups - 1)
    return FluidLoad(dt_s, requests, index, tuple(prompts), tuple(outputs), prefix_hit)


def fluid_load_from_servegen(path: Path, *, dt_s: float = 5.0, seed: int = 0,
                             scale: float = 1.0, samples: int = 256, start_s: float = 0.0,
                             duration_s: float | None = None) -> FluidLoad:
    """ServeGen's aggregate rate per 600 s window (spread evenly over the steps in it) with
    length samples drawn from its 6-hour token-length quantiles, over ``duration_s`` from
    ``start_s`` (default: the whole trace) on a clock starting at 0."""
    from pdscale.simulator._servegen import _sample_lengths, servegen_load_series
    from pdscale.simulator._trace import _mix_lengths

    series = servegen_load_series(path)
    rng = np.random.default_rng(seed)
    rate = np.repeat(series["rate_rps"], int(series["bin_s"] // dt_s)) * scale
    first = int(start_s // dt_s)
    last = len(rate) if duration_s is None else min(len(rate),
                                                     math.ceil((start_s + duration_s) / dt_s))
    if first >= last or not rate[first:last].any():
        end = "the end" if duration_s is None else f"{start_s + duration_s:g}s"
        raise TraceError(f"{path}: no requests between {start_s:g}s and {end} (the trace "
                         f"spans {len(rate) * dt_s:g}s); give a --start and --duration "
                         "inside it")
    requests = rate[first:last] * dt_s
    lengths = series["lengths"]
    if lengths:
        prompts = tuple(_sample_lengths(w.input_q, samples, rng).astype(np.float64)
                        for w in lengths)
        outputs = tuple(np.maximum(_sample_lengths(w.output_q, samples, rng), 1)
                        .astype(np.float64) for w in lengths)
        starts = np.array([w.start_s for w in lengths])
        t = (first + np.arange(len(requests))) * dt_s
        index = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(lengths) - 1)
    else:
        p, o = _mix_lengths(samples, rng)
        prompts, outputs = (p.astype(np.float64),), (o.astype(np.float64),)
        index = np.zeros(len(requests), dtype=np.int64)
    return FluidLoad(dt_s, requests, index.astype(np.int64), prompts, outputs)


@dataclass(frozen=True)
class _Mix:
    """Statistics of one length sample (prompts sorted ascending) and the pools' constants."""

    mean_l: float
    mean_sq: float
    mean_unc: float
    mean_o: float
    s: FloatArray
    kv: FloatArray
    ctx: float
    scv: float
    mu: float
    b_max: float
    """Largest decode batch: the engine's cap, or what 95 % of the KV cache holds."""
    decode_ms: tuple[float, float, float]
    """The decode step's d0, d1, d2 in seconds."""
    overhead_s: float
    kv_capacity: float


def _mixes(setup: SimSetup, load: FluidLoad) -> list[_Mix]:
    """Length-mix statistics per sample, computed once. Samples are sorted by prompt length:
    prefill time and KV transfer both grow with it, so TTFT is monotone in the sample index
    and quantiles and SLO counts are lookups, not sorts."""
    pp, dp = setup.prefill.profile, setup.decode.profile
    out = []
    for p, o in zip(load.prompt_samples, load.output_samples, strict=True):
        p_sorted = p[np.argsort(p, kind="stable")]
        s_vec = np.array([pp.prefill_ms(x) / 1000 for x in p_sorted])
        ctx = float(p.mean() + o.mean() / 2)
        out.append(_Mix(
            mean_l=float(p.mean()), mean_sq=float((p ** 2).mean()),
            mean_unc=uncached_prefill_demand(float(p.mean()), load.prefix_hit),
            mean_o=float(o.mean()),
            # Per sample, beyond its prefill: the KV transfer and the frontend's share.
            s=s_vec, kv=np.array([(dp.kv_transfer_ms(x) + pp.frontend_ms(x)) / 1000
                                  for x in p_sorted]), ctx=ctx,
            scv=float(s_vec.var() / max(s_vec.mean() ** 2, 1e-12)),
            mu=pp.prefill_tokens_per_s(float(p.mean()), float((p ** 2).mean())),
            b_max=float(decode_batch_limit(dp, ctx)),
            decode_ms=(dp.decode_d0_ms / 1000, dp.decode_d1_ms / 1000, dp.decode_d2_ms / 1000),
            overhead_s=pp.ttft_overhead_ms / 1000, kv_capacity=float(dp.kv_capacity_tokens)))
    return out


@dataclass(frozen=True)
class _PrefillStep:
    capacity: float
    """Uncached prompt tokens/s the ready replicas prefill."""
    rho: float
    wait_s: float


@dataclass(frozen=True)
class _DecodeStep:
    batch: float
    step_s: float
    wait_s: float
    demand: float
    """Generated tokens/s."""
    ready: int


@dataclass(frozen=True)
class _Tally:
    total: float
    ok_ttft: float
    ok_itl: float
    ok_both: float


class _Window:
    """Sums over the last ``size`` steps (the rate window): requests, prompt and generated
    tokens, and the TTFT and ITL histograms, updated in O(1) a step."""

    def __init__(self, size: int, bins: int) -> None:
        self.size = size
        self.steps = 0
        self._scalars = np.zeros((size, 3))
        self._ttft_ring = np.zeros((size, bins))
        self._itl_bin = np.full(size, -1, dtype=np.int64)
        self._itl_weight = np.zeros(size)
        self.ttft = np.zeros(bins)
        self._bins = bins
        self._slot = 0

    def push(self, requests: float, prompt_tokens: float, generated: float,
             ttft_hist: FloatArray | None, itl_bin: int) -> None:
        i = self._slot
        self.ttft -= self._ttft_ring[i]
        if ttft_hist is None:
            self._ttft_ring[i] = 0.0
        else:
            self._ttft_ring[i] = ttft_hist
            self.ttft += ttft_hist
        self._scalars[i] = (requests, prompt_tokens, generated)
        self._itl_bin[i], self._itl_weight[i] = itl_bin, generated
        self._slot = (i + 1) % self.size
        self.steps = min(self.steps + 1, self.size)

    def _order(self) -> list[int]:
        """Ring slots of the steps held, oldest first."""
        return [(self._slot - self.steps + j) % self.size for j in range(self.steps)]

    def recent_ttft(self, steps: int) -> FloatArray:
        """The TTFT histogram of the last ``steps`` steps."""
        out: FloatArray = self._ttft_ring[self._order()[-steps:]].sum(axis=0)
        return out

    def peak_prompt_tokens(self, steps: int) -> float | None:
        """The most prompt tokens in ``steps`` consecutive steps within the window (None
        until it holds that many)."""
        if self.steps < steps:
            return None
        cum = np.concatenate([[0.0], np.cumsum(self._scalars[self._order(), 1])])
        return float((cum[steps:] - cum[:-steps]).max())

    @property
    def requests(self) -> float:
        return float(self._scalars[:, 0].sum())

    @property
    def prompt_tokens(self) -> float:
        return float(self._scalars[:, 1].sum())

    @property
    def generated(self) -> float:
        return float(self._scalars[:, 2].sum())

    def itl_hist(self) -> FloatArray:
        used = self._itl_bin >= 0
        return np.bincount(self._itl_bin[used], weights=self._itl_weight[used],
                           minlength=self._bins).astype(np.float64)


_COLUMNS = ("arrivals", "prompt", "prefill_ready", "prefill_starting", "prefill_desired",
            "decode_ready", "decode_starting", "decode_desired", "queue_prefill",
            "queue_decode", "kv_usage", "ttft_p95_s", "itl_p95_s")


@dataclass
class _Pool:
    setup: PoolSetup
    ready: int
    starting: list[float]  # ready times
    draining: list[float]  # gone times
    desired: int
    replica_seconds: float = 0.0
    peak: int = 0

    def billed(self) -> int:
        return self.ready + len(self.starting) + len(self.draining)


def _mgc_wait(rho: float, c: int, mean_s: float, scv: float) -> float:
    """Mean wait in an M/G/c queue (Allen-Cunneen, Sakasegawa's P(wait))."""
    if rho >= 1 or c <= 0:
        return math.inf
    p_wait: float = math.pow(rho, math.sqrt(2 * (c + 1)) - 1)
    wait: float = p_wait / (c * (1 - rho)) * (1 + scv) / 2 * mean_s
    return wait


class FluidWorld(World):
    """A fluid load through the aggregate model, observed and scaled by the controller."""

    def __init__(self, setup: SimSetup, load: FluidLoad, *,
                 observation_delay_s: float = 30.0) -> None:
        super().__init__(setup, observation_delay_s=observation_delay_s)
        self.load = load
        self.cold_starts = ColdStarts(setup.seed)
        self.dt = load.dt_s
        self.tick_every = max(1, round(setup.tick_s / self.dt))
        self.pools = {role: _Pool(ps, ps.initial_replicas, [], [], ps.initial_replicas)
                      for role, ps in ((Role.PREFILL, setup.prefill), (Role.DECODE, setup.decode))}
        self.mixes = _mixes(setup, load)
        self.k = 0
        self.qp = self.qd = 0.0  # prefill backlog (tokens), decode admission backlog (requests)
        self.failures = sorted(setup.failures)
        self.ttft_hist = np.zeros(len(_EDGES) + 1)
        self.itl_hist = np.zeros(len(_EDGES) + 1)
        self.total = self.ok_ttft = self.ok_itl = self.ok_both = 0.0
        self.rec = {c: np.zeros(load.steps) for c in _COLUMNS}
        self.window = _Window(max(1, round(RATE_WINDOW_S / self.dt)), len(_EDGES) + 1)
        self._drain_s = {Role.PREFILL: 0.0, Role.DECODE: 0.0}

    # -- World ----------------------------------------------------------------------------

    def advance(self, until_s: float) -> bool:
        sampled = False
        while self.k < self.load.steps and self.k * self.dt <= until_s + 1e-9:
            sampled = self._step(self.k)
            self.k += 1
        return sampled and abs((self.k - 1) * self.dt - until_s) < 1e-6

    def replicas(self, role: Role) -> PoolReplicas:
        pool = self.pools[role]
        return PoolReplicas(ready=pool.ready, starting=len(pool.starting),
                            draining=len(pool.draining), desired=pool.desired,
                            min_replicas=pool.setup.min_replicas,
                            max_replicas=pool.setup.max_replicas,
                            gpus_per_replica=pool.setup.gpus_per_replica)

    def scale(self, role: Role, replicas: int) -> None:
        _scale(self.pools[role], replicas, (self.k - 1) * self.dt, self._drain_s[role],
               self.cold_starts)

    def desired(self, role: Role) -> int:
        return self.pools[role].desired

    @property
    def span_s(self) -> float:
        return self.load.steps * self.dt

    def result(self, wall_s: float) -> SimResult:
        end = self.load.steps * self.dt
        summary = _fluid_summary(self.pools, self.ttft_hist, self.itl_hist,
                                 _Tally(self.total, self.ok_ttft, self.ok_itl, self.ok_both),
                                 self.scale_actions, end, wall_s)
        return SimResult(summary, _minute_rows(self.rec, self.dt), self.decisions)

    # -- one step -------------------------------------------------------------------------

    def _lifecycle(self, t: float) -> None:
        """Replicas become ready, drained ones go, failures take a ready one (replaced)."""
        for pool in self.pools.values():
            if pool.starting and min(pool.starting) <= t:
                pool.ready += sum(1 for x in pool.starting if x <= t)
                pool.starting = [x for x in pool.starting if x > t]
            if pool.draining and min(pool.draining) <= t:
                pool.draining = [x for x in pool.draining if x > t]
        while self.failures and self.failures[0][0] <= t:
            _, role = self.failures.pop(0)
            pool = self.pools[role]
            if pool.ready > 0:
                pool.ready -= 1
                pool.starting.append(t + self.cold_starts.draw(pool.setup))

    def _step(self, k: int) -> bool:
        """Advance one step; at a tick, sample the signals. Returns whether it sampled."""
        dt = self.dt
        t = k * dt
        self._lifecycle(t)
        st = self.mixes[int(self.load.sample_index[k])]
        n = float(self.load.requests[k])
        pre = self._prefill(st, n, t)
        dec = self._decode(st, n / dt, pre.capacity, t)
        # TTFT over the step's length sample (sorted, so monotone in the index).
        ttft = (pre.wait_s + st.overhead_s + dec.wait_s + dec.step_s) + \
            st.s * (1 + min(max(pre.rho, 0.0), 1.0)) + st.kv
        self._account(st, n, ttft, dec)
        self._record(k, st, n, ttft, dec)
        self._drain_s = {Role.DECODE: st.mean_o * dec.step_s,
                         Role.PREFILL: min(60.0, self.qp / max(pre.capacity, 1e-9))}
        if k % self.tick_every:
            return False
        self.sample(t, self._signals(st, pre, dec))
        return True

    def _until_one_ready(self, role: Role, t: float) -> float:
        """Seconds until a replica of a pool with none ready is ready: the first one starting
        (a failure's replacement, a scale-up), else never."""
        starting = self.pools[role].starting
        return max(0.0, min(starting) - t) if starting else math.inf

    def _prefill(self, st: _Mix, n: float, t: float) -> _PrefillStep:
        n_p = self.pools[Role.PREFILL].ready
        cap_p = n_p * st.mu
        work = n * st.mean_unc
        rho = (work / self.dt) / cap_p if cap_p > 0 else math.inf
        qp_new = max(0.0, self.qp + work - cap_p * self.dt)
        # With none ready, the queue waits for the first replica starting, then for one
        # replica to work through it (infinite only when none is coming).
        backlog_wait = ((self.qp + qp_new) / 2) / cap_p if cap_p > 0 else \
            self._until_one_ready(Role.PREFILL, t) + ((self.qp + qp_new) / 2) / st.mu
        wq = _mgc_wait(rho, n_p, st.mean_unc / st.mu, st.scv) if rho < 1 else 0.0
        self.qp = qp_new
        return _PrefillStep(cap_p, rho, backlog_wait + (wq if math.isfinite(wq) else 0.0))

    def _decode(self, st: _Mix, lam: float, cap_p: float, t: float) -> _DecodeStep:
        """The decode batch as the fixed point of Little's law, or the largest batch (KV or
        engine cap) with an admission queue when the pool cannot keep up."""
        n_d = self.pools[Role.DECODE].ready
        d0, d1, d2 = st.decode_ms
        b_max = st.b_max
        into_decode = min(lam, cap_p / max(st.mean_unc, 1.0)) if cap_p > 0 else 0.0
        thr_max = n_d * b_max / (st.mean_o * (d0 + d1 * b_max + d2 * b_max * st.ctx / 1000)) \
            if n_d > 0 else 0.0
        demand = into_decode * st.mean_o
        denominator = n_d - demand * (d1 + d2 * st.ctx / 1000) if n_d > 0 else -1.0
        batch = demand * d0 / denominator if denominator > 0 else math.inf
        if self.qd > 0 or not batch <= b_max:
            batch = b_max
            self.qd = max(0.0, self.qd + (into_decode - thr_max) * self.dt)
        step_s = d0 + d1 * batch + d2 * batch * st.ctx / 1000
        if thr_max > 0:
            wait = self.qd / thr_max
        else:  # none ready: the first replica starting, then one replica's throughput
            one = b_max / (st.mean_o * (d0 + d1 * b_max + d2 * b_max * st.ctx / 1000))
            wait = self._until_one_ready(Role.DECODE, t) + self.qd / one
        return _DecodeStep(batch, step_s, wait, demand, n_d)

    def _account(self, st: _Mix, n: float, ttft: FloatArray, dec: _DecodeStep) -> None:
        """Latency histograms (run and rate window) and SLO counts."""
        m = len(ttft)
        step_hist: FloatArray | None = None
        if n > 0:
            per = n / m
            step_hist = np.bincount(np.searchsorted(_EDGES, np.minimum(ttft, 1e4)),
                                    minlength=len(_EDGES) + 1).astype(np.float64) * per
            self.ttft_hist += step_hist
            self.itl_hist[int(np.searchsorted(_EDGES, dec.step_s))] += dec.demand * self.dt
            good_ttft = per * float(np.searchsorted(ttft, self.setup.slo_ttft_s, side="right"))
            itl_good = dec.step_s <= self.setup.slo_itl_s
            self.total += n
            self.ok_ttft += good_ttft
            self.ok_itl += n if itl_good else 0.0
            self.ok_both += good_ttft if itl_good else 0.0
        self.window.push(n, n * st.mean_l, dec.demand * self.dt, step_hist,
                         int(np.searchsorted(_EDGES, dec.step_s)) if dec.demand > 0 else -1)

    def _record(self, k: int, st: _Mix, n: float, ttft: FloatArray, dec: _DecodeStep) -> None:
        """Billing and the per-step time series."""
        rec = self.rec
        for pool in self.pools.values():
            billed = pool.billed()
            pool.replica_seconds += billed * self.dt
            pool.peak = max(pool.peak, billed)
        p_pool, d_pool = self.pools[Role.PREFILL], self.pools[Role.DECODE]
        m = len(ttft)
        rec["arrivals"][k] = n
        rec["prompt"][k] = n * st.mean_l
        rec["prefill_ready"][k] = p_pool.ready
        rec["prefill_starting"][k] = len(p_pool.starting)
        rec["prefill_desired"][k] = p_pool.desired
        rec["decode_ready"][k] = d_pool.ready
        rec["decode_starting"][k] = len(d_pool.starting)
        rec["decode_desired"][k] = d_pool.desired
        rec["queue_prefill"][k] = self.qp / max(st.mean_unc, 1.0)
        rec["queue_decode"][k] = self.qd
        rec["kv_usage"][k] = min(1.0, dec.batch * st.ctx / st.kv_capacity)
        rec["ttft_p95_s"][k] = float(ttft[min(m - 1, int(0.95 * m))]) if n > 0 else math.nan
        rec["itl_p95_s"][k] = dec.step_s

    def _signals(self, st: _Mix, pre: _PrefillStep, dec: _DecodeStep) -> dict[Role, PoolSignals]:
        """The signals at a tick: rates and percentiles over the rate window, gauges now."""
        w = self.window
        span = max(w.steps, 1) * self.dt
        rates: PoolSignals = {Signal.REQUEST_RATE: w.requests / span,
                              Signal.PROMPT_TOKENS_PER_S: w.prompt_tokens / span,
                              Signal.GENERATION_TOKENS_PER_S: w.generated / span}
        itl = w.itl_hist()
        recent = max(1, round(RECENT_WINDOW_S / self.dt))
        peak = w.peak_prompt_tokens(recent)
        k = self.k
        n_p = self.pools[Role.PREFILL].ready
        return {
            Role.PREFILL: {
                **rates, Signal.QUEUE_DEPTH: float(self.rec["queue_prefill"][k]),
                Signal.GPU_UTILIZATION_RATIO: min(1.0, pre.rho) if math.isfinite(pre.rho)
                else 1.0,
                Signal.TTFT_P95_S: hist_quantile(w.ttft, _EDGES, 0.95),
                Signal.TTFT_P95_RECENT_S: hist_quantile(w.recent_ttft(recent), _EDGES, 0.95),
                Signal.PROMPT_TOKENS_PEAK_PER_S: (None if peak is None
                                                  else peak / (recent * self.dt)),
                Signal.TTFT_P50_S: hist_quantile(w.ttft, _EDGES, 0.5),
                Signal.PREFIX_CACHE_HIT_RATIO: self.load.prefix_hit,
                Signal.TARGETS_UP: float(n_p)},
            Role.DECODE: {
                **rates, Signal.QUEUE_DEPTH: self.qd,
                Signal.RUNNING_REQUESTS: dec.batch * dec.ready
                if math.isfinite(dec.batch) else None,
                Signal.KV_CACHE_USAGE_RATIO: float(self.rec["kv_usage"][k]),
                Signal.GPU_UTILIZATION_RATIO: 1.0 if dec.batch > 0 else 0.0,
                Signal.ITL_P95_S: hist_quantile(itl, _EDGES, 0.95),
                Signal.ITL_P50_S: hist_quantile(itl, _EDGES, 0.5),
                Signal.TARGETS_UP: float(dec.ready)},
        }


def run_fluid(setup: SimSetup, load: FluidLoad, policy: Policy, *,
              observation_delay_s: float = 30.0, spec: Spec | None = None,
              forecasts: Refits | None = None,
              progress: Callable[[float], None] | None = None) -> SimResult:
    """Replay ``load`` in fluid mode with ``policy`` in the production reconcile loop."""
    world = FluidWorld(setup, load, observation_delay_s=observation_delay_s)
    return run_world(world, policy, spec=spec, forecasts=forecasts, progress=progress)


def _scale(pool: _Pool, desired: int, t: float, drain_s: float,
           cold_starts: ColdStarts) -> None:
    desired = max(pool.setup.min_replicas, min(pool.setup.max_replicas, desired))
    pool.desired = desired
    active = pool.ready + len(pool.starting)
    if desired > active:
        pool.starting += [t + cold_starts.draw(pool.setup) for _ in range(desired - active)]
        return
    excess = active - desired
    while excess and pool.starting:  # cancel the newest starting replicas first
        pool.starting.pop()
        excess -= 1
    while excess and pool.ready:
        pool.ready -= 1
        pool.draining.append(t + drain_s)
        excess -= 1


def _minute_rows(rec: Mapping[str, FloatArray], dt: float) -> list[dict[str, float]]:
    per = max(1, round(60 / dt))
    n = len(rec["arrivals"])
    rows = []
    for lo in range(0, n, per):
        hi = min(n, lo + per)
        span = (hi - lo) * dt
        row = {"minute": float(lo // per),
               "arrivals_rps": float(rec["arrivals"][lo:hi].sum() / span),
               "prompt_tokens_per_s": float(rec["prompt"][lo:hi].sum() / span)}
        for key in ("prefill_ready", "prefill_starting", "prefill_desired", "decode_ready",
                    "decode_starting", "decode_desired", "queue_prefill", "queue_decode",
                    "kv_usage"):
            row[key] = float(rec[key][lo:hi].mean())
        ttft = rec["ttft_p95_s"][lo:hi]
        row["ttft_p95_s"] = float(np.nanmax(ttft)) if np.any(~np.isnan(ttft)) else math.nan
        row["itl_p95_s"] = float(rec["itl_p95_s"][lo:hi].max())
        rows.append(row)
    return rows


def _fluid_summary(pools: Mapping[Role, _Pool], ttft_hist: FloatArray, itl_hist: FloatArray,
                   tally: _Tally, scale_actions: int, end: float, wall: float
                   ) -> dict[str, Any]:
    pool_out: dict[str, Any] = {}
    gpu_h = 0.0
    for role, pool in pools.items():
        h = pool.replica_seconds * pool.setup.gpus_per_replica / 3600
        gpu_h += h
        pool_out[role.value] = {"gpu_hours": h, "mean_replicas": pool.replica_seconds / end,
                                "peak_replicas": pool.peak}
    denom = max(tally.total, 1e-9)
    return {
        "requests": round(tally.total),
        "slo_attainment": tally.ok_both / denom,
        "ttft_attainment": tally.ok_ttft / denom,
        "itl_attainment": tally.ok_itl / denom,
        "ttft_p50_s": hist_quantile(ttft_hist, _EDGES, 0.5),
        "ttft_p95_s": hist_quantile(ttft_hist, _EDGES, 0.95),
        "ttft_p99_s": hist_quantile(ttft_hist, _EDGES, 0.99),
        "itl_p50_s": hist_quantile(itl_hist, _EDGES, 0.5),
        "itl_p95_s": hist_quantile(itl_hist, _EDGES, 0.95),
        "gpu_hours": gpu_h,
        "scale_actions": scale_actions,
        "simulated_s": end,
        "wall_s": wall,
        "pools": pool_out,
    }
