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

``tests/simulator/test_validation.py`` compares it with the event mode on the same inputs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from controller import Observation, Policy, PoolDecision, PoolKey, PoolObservation, PoolReplicas
from pdscale.spec import Role
from simulator._event import PoolSetup, SimSetup, hist_quantile
from simulator._runner import SimResult
from simulator._trace import Trace

__all__ = ["FluidLoad", "fluid_load_from_servegen", "fluid_load_from_trace", "run_fluid"]

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
                             scale: float = 1.0, samples: int = 256) -> FluidLoad:
    """ServeGen's aggregate rate per 600 s window (spread evenly over the steps in it) with
    length samples drawn from its 6-hour token-length quantiles."""
    from simulator._trace import _mix_lengths, _sample_lengths, servegen_load_series

    series = servegen_load_series(path)
    rng = np.random.default_rng(seed)
    rate = np.repeat(series["rate_rps"], int(series["bin_s"] // dt_s)) * scale
    requests = rate * dt_s
    lengths = series["lengths"]
    if lengths:
        prompts = tuple(_sample_lengths(w.input_q, samples, rng).astype(np.float64)
                        for w in lengths)
        outputs = tuple(np.maximum(_sample_lengths(w.output_q, samples, rng), 1)
                        .astype(np.float64) for w in lengths)
        starts = np.array([w.start_s for w in lengths])
        t = np.arange(len(requests)) * dt_s
        index = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(lengths) - 1)
    else:
        p, o = _mix_lengths(samples, rng)
        prompts, outputs = (p.astype(np.float64),), (o.astype(np.float64),)
        index = np.zeros(len(requests), dtype=np.int64)
    return FluidLoad(dt_s, requests, index.astype(np.int64), prompts, outputs)


@dataclass(frozen=True)
class _Mix:
    """Statistics of one length sample (prompts sorted ascending)."""

    mean_l: float
    mean_sq: float
    mean_unc: float
    mean_o: float
    s: FloatArray
    kv: FloatArray
    ctx: float
    scv: float
    mu: float


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


def run_fluid(setup: SimSetup, load: FluidLoad, policy: Policy, *,
              observation_delay_s: float = 30.0,
              progress: Callable[[float], None] | None = None) -> SimResult:
    started = time.perf_counter()
    pp, dp = setup.prefill.profile, setup.decode.profile
    pools = {Role.PREFILL: _Pool(setup.prefill, setup.prefill.initial_replicas, [], [],
                                 setup.prefill.initial_replicas),
             Role.DECODE: _Pool(setup.decode, setup.decode.initial_replicas, [], [],
                                setup.decode.initial_replicas)}
    dt = load.dt_s
    tick_every = max(1, round(setup.tick_s / dt))
    delay_steps = max(0, round(observation_delay_s / dt))
    ttft_hist = np.zeros(len(_EDGES) + 1)
    itl_hist = np.zeros(len(_EDGES) + 1)
    total = ok_ttft = ok_itl = ok_both = 0.0
    qp = qd = 0.0  # prefill backlog (tokens), decode admission backlog (requests)
    history: list[dict[Role, dict[str, float | None]]] = []  # one entry a tick
    delay_ticks = max(0, round(delay_steps / tick_every))
    decisions: list[dict[str, Any]] = []
    scale_actions = 0
    failures = sorted(setup.failures)
    # Length-mix statistics per sample, computed once. Samples are sorted by prompt length:
    # prefill time and KV transfer both grow with it, so TTFT is monotone in the sample index
    # and quantiles and SLO counts are lookups, not sorts.
    stats = []
    for p, o in zip(load.prompt_samples, load.output_samples, strict=True):
        order = np.argsort(p, kind="stable")
        p_sorted = p[order]
        s_vec = np.array([pp.prefill_ms(x) / 1000 for x in p_sorted])
        stats.append(_Mix(
            mean_l=float(p.mean()), mean_sq=float((p ** 2).mean()),
            mean_unc=float(p.mean() * (1 - load.prefix_hit)), mean_o=float(o.mean()),
            s=s_vec, kv=np.array([dp.kv_transfer_ms(x) / 1000 for x in p_sorted]),
            ctx=float(p.mean() + o.mean() / 2),
            scv=float(s_vec.var() / max(s_vec.mean() ** 2, 1e-12)),
            mu=pp.prefill_tokens_per_s(float(p.mean()), float((p ** 2).mean()))))
    n_steps = load.steps
    cols = ("arrivals", "prompt", "prefill_ready", "prefill_starting", "prefill_desired",
            "decode_ready", "decode_starting", "decode_desired", "queue_prefill",
            "queue_decode", "kv_usage", "ttft_p95_s", "itl_p95_s")
    rec = {c: np.zeros(n_steps) for c in cols}
    d0, d1, d2 = dp.decode_d0_ms / 1000, dp.decode_d1_ms / 1000, dp.decode_d2_ms / 1000
    overhead = pp.ttft_overhead_ms / 1000
    p_pool, d_pool = pools[Role.PREFILL], pools[Role.DECODE]
    for k in range(n_steps):
        t = k * dt
        # Lifecycle: replicas become ready, drained ones go, failures.
        for pool in (p_pool, d_pool):
            if pool.starting and min(pool.starting) <= t:
                pool.ready += sum(1 for x in pool.starting if x <= t)
                pool.starting = [x for x in pool.starting if x > t]
            if pool.draining and min(pool.draining) <= t:
                pool.draining = [x for x in pool.draining if x > t]
        while failures and failures[0][0] <= t:
            _, role = failures.pop(0)
            pool = pools[role]
            if pool.ready > 0:
                pool.ready -= 1
                pool.starting.append(t + pool.setup.cold_start_s)
        st = stats[int(load.sample_index[k])]
        n = float(load.requests[k])
        lam = n / dt
        # Prefill.
        n_p = p_pool.ready
        mu = st.mu
        cap_p = n_p * mu
        work = n * st.mean_unc
        rho = (work / dt) / cap_p if cap_p > 0 else math.inf
        qp_new = max(0.0, qp + work - cap_p * dt)
        backlog_wait = ((qp + qp_new) / 2) / cap_p if cap_p > 0 else math.inf
        wq = _mgc_wait(rho, n_p, st.mean_unc / mu, st.scv) if rho < 1 else 0.0
        prefill_wait = backlog_wait + (wq if math.isfinite(wq) else 0.0)
        qp = qp_new
        # Decode.
        n_d = d_pool.ready
        ctx = st.ctx
        b_max = float(max(1, min(dp.max_batch, int(dp.kv_capacity_tokens * 0.95 / ctx))))
        into_decode = min(lam, cap_p / max(st.mean_unc, 1.0)) if cap_p > 0 else 0.0
        thr_max = n_d * b_max / (st.mean_o * (d0 + d1 * b_max + d2 * b_max * ctx / 1000)) \
            if n_d > 0 else 0.0
        demand = into_decode * st.mean_o
        denominator = n_d - demand * (d1 + d2 * ctx / 1000) if n_d > 0 else -1.0
        batch = demand * d0 / denominator if denominator > 0 else math.inf
        if qd > 0 or not batch <= b_max:
            batch = b_max
            qd = max(0.0, qd + (into_decode - thr_max) * dt)
        step_s = d0 + d1 * batch + d2 * batch * ctx / 1000
        decode_wait = qd / thr_max if thr_max > 0 else math.inf
        # TTFT over the step's length sample (sorted, so monotone in the index).
        ttft = (prefill_wait + overhead + decode_wait + step_s) + \
            st.s * (1 + min(max(rho, 0.0), 1.0)) + st.kv
        m = len(ttft)
        ttft_p95 = float(ttft[min(m - 1, int(0.95 * m))])
        if n > 0:
            per = n / m
            ttft_hist += np.bincount(np.searchsorted(_EDGES, np.minimum(ttft, 1e4)),
                                     minlength=len(_EDGES) + 1) * per
            itl_hist[int(np.searchsorted(_EDGES, step_s))] += demand * dt
            good_ttft = per * float(np.searchsorted(ttft, setup.slo_ttft_s, side="right"))
            itl_good = step_s <= setup.slo_itl_s
            total += n
            ok_ttft += good_ttft
            ok_itl += n if itl_good else 0.0
            ok_both += good_ttft if itl_good else 0.0
        # Billing and the time series.
        for pool in (p_pool, d_pool):
            billed = pool.billed()
            pool.replica_seconds += billed * dt
            if billed > pool.peak:
                pool.peak = billed
        kv_usage = min(1.0, batch * ctx / dp.kv_capacity_tokens)
        rec["arrivals"][k] = n
        rec["prompt"][k] = n * st.mean_l
        rec["prefill_ready"][k] = n_p
        rec["prefill_starting"][k] = len(p_pool.starting)
        rec["prefill_desired"][k] = p_pool.desired
        rec["decode_ready"][k] = n_d
        rec["decode_starting"][k] = len(d_pool.starting)
        rec["decode_desired"][k] = d_pool.desired
        rec["queue_prefill"][k] = qp / max(st.mean_unc, 1.0)
        rec["queue_decode"][k] = qd
        rec["kv_usage"][k] = kv_usage
        rec["ttft_p95_s"][k] = ttft_p95 if n > 0 else math.nan
        rec["itl_p95_s"][k] = step_s
        if k % tick_every:
            continue
        history.append({
            Role.PREFILL: {
                "request_rate": lam, "prompt_tokens_per_s": n * st.mean_l / dt,
                "queue_depth": rec["queue_prefill"][k],
                "gpu_utilization_ratio": min(1.0, rho) if math.isfinite(rho) else 1.0,
                "ttft_p95_s": ttft_p95 if n > 0 else None,
                "ttft_p50_s": float(ttft[m // 2]) if n > 0 else None,
                "prefix_cache_hit_ratio": load.prefix_hit,
                "targets_up": float(n_p), "request_rate_interval": lam,
                "mean_input_tokens_interval": st.mean_l,
            },
            Role.DECODE: {
                "request_rate": lam, "queue_depth": qd,
                "running_requests": batch * n_d if math.isfinite(batch) else None,
                "kv_cache_usage_ratio": kv_usage,
                "batch_occupancy_ratio": min(1.0, batch / dp.max_batch),
                "gpu_utilization_ratio": 1.0 if batch > 0 else 0.0,
                "itl_p95_s": step_s, "itl_p50_s": step_s,
                "generation_tokens_per_s": demand, "targets_up": float(n_d),
                "mean_input_tokens_interval": st.mean_l,
                "mean_output_tokens_interval": st.mean_o,
            },
        })
        if len(history) > delay_ticks + 1:
            history.pop(0)
        delayed = history[0]
        obs_pools: dict[PoolKey, PoolObservation] = {}
        for role, pool in pools.items():
            replicas = PoolReplicas(
                ready=pool.ready, starting=len(pool.starting), draining=len(pool.draining),
                desired=pool.desired, min_replicas=pool.setup.min_replicas,
                max_replicas=pool.setup.max_replicas,
                gpus_per_replica=pool.setup.gpus_per_replica)
            key = (setup.service, role)
            obs_pools[key] = PoolObservation(key, replicas, delayed[role],
                                             t - delay_ticks * tick_every * dt)
        out: Mapping[PoolKey, PoolDecision] = policy.decide(Observation(t, obs_pools))
        for key, decision in out.items():
            role = key[1]
            pool = pools[role]
            before = pool.desired
            drain_s = (st.mean_o * step_s if role is Role.DECODE else
                       min(60.0, qp / max(cap_p, 1e-9)))
            _scale(pool, decision.desired_replicas, t, drain_s)
            if pool.desired != before:
                scale_actions += 1
                decisions.append({"t": t, "pool": role.value, "from": before,
                                  "to": pool.desired, "reasons": list(decision.reasons)})
        if progress is not None and k % max(1, n_steps // 100) < tick_every:
            progress(k / n_steps)
    series = _minute_rows(rec, dt)
    end = n_steps * dt
    summary = _fluid_summary(setup, pools, ttft_hist, itl_hist, total, ok_ttft, ok_itl,
                             ok_both, scale_actions, end, time.perf_counter() - started)
    return SimResult(summary, series, decisions)


def _scale(pool: _Pool, desired: int, t: float, drain_s: float) -> None:
    desired = max(pool.setup.min_replicas, min(pool.setup.max_replicas, desired))
    pool.desired = desired
    active = pool.ready + len(pool.starting)
    if desired > active:
        pool.starting += [t + pool.setup.cold_start_s] * (desired - active)
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


def _fluid_summary(setup: SimSetup, pools: Mapping[Role, _Pool], ttft_hist: FloatArray,
                   itl_hist: FloatArray, total: float, ok_ttft: float, ok_itl: float,
                   ok_both: float, scale_actions: int, end: float,
                   wall: float) -> dict[str, Any]:
    pool_out: dict[str, Any] = {}
    gpu_h = 0.0
    for role, pool in pools.items():
        h = pool.replica_seconds * pool.setup.gpus_per_replica / 3600
        gpu_h += h
        pool_out[role.value] = {"gpu_hours": h, "mean_replicas": pool.replica_seconds / end,
                                "peak_replicas": pool.peak}
    denom = max(total, 1e-9)
    return {
        "requests": round(total),
        "slo_attainment": ok_both / denom,
        "ttft_attainment": ok_ttft / denom,
        "itl_attainment": ok_itl / denom,
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
