"""One simulation from a spec: pick the service, profiles, trace and policy; run; render.

``simulate`` returns the result; ``result_files`` renders it as files (summary.json, a
per-minute timeseries.csv, decisions.json and PNG plots) for the CLI to write atomically.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pdscale.controller import (
    HEADROOM,
    ForecastStage,
    Policy,
    decode_operating_point,
    load_profile,
    prefill_capacity,
    uncached_prefill_demand,
)
from pdscale.simulator._event import PoolSetup, SimSetup
from pdscale.simulator._fluid import (
    FluidLoad,
    FluidWorld,
    fluid_load_from_servegen,
    fluid_load_from_trace,
)
from pdscale.simulator._policies import (
    DemandPlan,
    DynamoPolicy,
    OraclePolicy,
    ReactivePolicy,
    StaticPolicy,
    demand_plan,
    size_for_peak,
)
from pdscale.simulator._runner import EventWorld
from pdscale.simulator._setup import Router
from pdscale.simulator._trace import Trace, TraceError, detect_format, load_trace
from pdscale.simulator._world import SimResult, World, run_world
from pdscale.spec import Role, ServiceSpec, Spec

__all__ = ["POLICIES", "Prepared", "SimOptions", "prepare", "result_files", "simulate",
           "world_for"]

POLICIES = ("static", "reactive", "dynamo", "oracle", "pdscale")
Mode = Literal["event", "fluid", "auto"]
EVENT_LIMIT_REQUESTS = 3_000_000
EVENT_LIMIT_SPAN_S = 6 * 3600.0


@dataclass(frozen=True)
class SimOptions:
    trace: str = "synthetic"
    fmt: str | None = None
    policy: str = "static"
    mode: Mode = "auto"
    cold_start_s: float | None = None
    seed: int = 0
    scale: float = 1.0
    service: str | None = None
    router: Router | None = None
    """How prefill work reaches the workers (None: the service's routing, ``prefix`` where the
    spec says ``prefix_aware``, else ``least_loaded``)."""
    start_s: float = 0.0
    duration_s: float | None = None
    skip_bad_rows: bool = False
    failures: tuple[tuple[float, Role], ...] = ()
    observation_delay_s: float = 30.0
    prefix_hit: float | None = None
    """Prefix-cache hit rate assumed by the fluid mode (event mode simulates it)."""
    max_prompt_tokens: int | None = None
    """Prompts longer than this are clipped to it (None: as recorded), as a deployment's
    context limit clips them; a replay against a real stack clips them the same way."""
    initial_replicas: tuple[int, int] | None = None
    """(prefill, decode) replicas ready at the start, the same for every policy; None: the
    pools' minimum replicas (a cold start: a quiet night, a new service), except for
    ``static``, which holds the allocation it starts with and so starts sized for the trace's
    peak. Each is kept within its pool's bounds."""
    idle_before: bool = False
    """Event mode: the pools ran idle, and were measured, before the trace starts (a fresh
    deployment the load then reaches, as on the real-stack benchmark): the first sample, at
    t=0, reads the idle pools. By default the trace is a window cut from continuous traffic
    and that sample is no data. Fluid mode's first sample follows its first step, measured,
    so the option is refused there."""


def _plan_from_load(load: FluidLoad, setup: SimSetup) -> DemandPlan:
    """The oracle's plan for a fluid load: per step, replicas for its token rate and its
    decode concurrency (Little's law at the batch that meets the ITL SLO)."""
    pp, dp = setup.prefill.profile, setup.decode.profile
    # Per length sample: prefill replica-seconds a request costs, and decode replica-seconds
    # a request holds (its output tokens at the operating point's cost per token).
    prefill_cost = np.zeros(len(load.prompt_samples))
    decode_cost = np.zeros(len(load.prompt_samples))
    for g, (prompts, outputs) in enumerate(zip(load.prompt_samples, load.output_samples,
                                               strict=True)):
        mean_l = float(prompts.mean())
        mu = prefill_capacity(pp, mean_l, float((prompts ** 2).mean()))
        prefill_cost[g] = uncached_prefill_demand(mean_l, load.prefix_hit) / mu
        ctx = mean_l + float(outputs.mean()) / 2
        point = decode_operating_point(dp, setup.slo_itl_s * HEADROOM, ctx)
        decode_cost[g] = outputs.mean() * point.replica_s_per_token
    rate = load.requests / load.dt_s
    p_need = rate * prefill_cost[load.sample_index]
    d_need = rate * decode_cost[load.sample_index]
    per_s = max(1, int(load.dt_s))
    p = np.repeat(np.maximum(np.ceil(p_need), 1), per_s).astype(np.int64)
    d = np.repeat(np.maximum(np.ceil(d_need), 1), per_s).astype(np.int64)
    return DemandPlan(p, d)


def _pdscale(setup: SimSetup, spec: Spec) -> tuple[Policy, ForecastStage]:
    """pdscale's policy and forecast stage, built from the spec as ``pdscale run`` builds
    them (its controller settings, the pools' profiles), with the simulation's cold start."""
    from pdscale.controller import build_forecasts, build_policy

    cold = {(setup.service, Role.PREFILL): setup.prefill.cold_start_quantile(0.9),
            (setup.service, Role.DECODE): setup.decode.cold_start_quantile(0.9)}
    forecasts = build_forecasts(spec, cold_start_s=cold)
    return build_policy(spec, forecasts=forecasts, cold_start_s=cold), forecasts


History = tuple[Any, Any, Any]
"""Per-minute (times_s, prompt tokens/s, output tokens/s) before the run, times negative."""


def _warm(forecasts: ForecastStage, service: str, history: History) -> None:
    """Feed the earlier days' demand to the forecasters, as ``pdscale run`` feeds its history
    from Prometheus at start-up (prefill: prompt tokens/s; decode: generated tokens/s)."""
    times, prompt, output = history
    forecasts.warm((service, Role.PREFILL), list(times), list(prompt))
    forecasts.warm((service, Role.DECODE), list(times), list(output))


def _policy(name: str, setup: SimSetup, plan: DemandPlan) -> Policy:
    """A baseline policy ``name`` for the simulated service."""
    if name == "static":
        return StaticPolicy()
    if name == "reactive":
        return ReactivePolicy(tick_s=setup.tick_s,
                              decode_max_batch=setup.decode.profile.max_batch)
    if name == "dynamo":
        return DynamoPolicy(setup.prefill.profile, setup.decode.profile,
                            ttft_slo_s=setup.slo_ttft_s, itl_slo_s=setup.slo_itl_s)
    if name == "oracle":
        return OraclePolicy(plan, service=setup.service,
                            cold_start_s={Role.PREFILL: setup.prefill.cold_start_quantile(0.99),
                                          Role.DECODE: setup.decode.cold_start_quantile(0.99)},
                            tick_s=setup.tick_s)
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")


def _router(service: ServiceSpec, options: SimOptions) -> Router:
    if options.router is not None:
        return options.router
    return "prefix" if service.routing == "prefix_aware" else "least_loaded"


def _setup(service: ServiceSpec, options: SimOptions, initial: Mapping[Role, int], *,
           tick_s: float) -> SimSetup:
    pools = {}
    for role in Role:
        pool = service.pools[role]
        profile = load_profile(pool.profile)
        cold = options.cold_start_s if options.cold_start_s is not None else pool.cold_start
        pools[role] = PoolSetup(role=role, profile=profile,
                                initial_replicas=max(pool.min_replicas,
                                                     min(pool.max_replicas, initial[role])),
                                min_replicas=pool.min_replicas, max_replicas=pool.max_replicas,
                                gpus_per_replica=pool.gpus_per_replica, cold_start_s=cold,
                                cold_start_spread=pool.cold_start_spread)
    return SimSetup(service=service.name, prefill=pools[Role.PREFILL],
                    decode=pools[Role.DECODE], slo_ttft_s=service.slo.ttft_p95_s,
                    slo_itl_s=service.slo.itl_p95_s, router=_router(service, options),
                    tick_s=tick_s, failures=options.failures, seed=options.seed)


def _resolve_mode(options: SimOptions, trace: Trace | None) -> str:
    if options.mode != "auto":
        return options.mode
    if trace is None:
        return "fluid"
    if len(trace) > EVENT_LIMIT_REQUESTS or trace.span_s > EVENT_LIMIT_SPAN_S:
        return "fluid"
    return "event"


@dataclass(frozen=True)
class Prepared:
    setup: SimSetup
    policy: Policy
    spec: Spec
    """The spec narrowed to the simulated service: its constraints and telemetry."""
    forecasts: ForecastStage | None
    """pdscale's forecast stage (the loop refits it); None for the baselines."""
    mode: str
    trace: Trace | None
    load: FluidLoad | None
    meta: dict[str, Any]


def _within_budget(initial: dict[Role, int], spec: Spec, service: Any
                   ) -> tuple[dict[Role, int], int | None]:
    """(the starting sizes, the GPU budget) for ``service`` simulated alone: the spec's other
    services hold their minimums out of a shared budget (not left to this one), and the start,
    like a static allocation, is cut to what is left (the pool holding more GPUs above its
    minimum gives one replica at a time)."""
    if spec.gpu_budget is None:
        return initial, None
    budget = spec.gpu_budget - sum(p.min_replicas * p.gpus_per_replica for s in spec.services
                                   if s.name != service.name for p in s.pools.values())
    out = dict(initial)
    pools = service.pools

    def gpus() -> int:
        return sum(out[r] * pools[r].gpus_per_replica for r in Role)

    while gpus() > budget:
        above = [r for r in Role if out[r] > pools[r].min_replicas]
        if not above:
            break  # the minimums alone (the spec checks they fit)
        role = max(above, key=lambda r: ((out[r] - pools[r].min_replicas)
                                         * pools[r].gpus_per_replica, r.value))
        out[role] -= 1
    return out, budget


def _failures_outside(options: SimOptions, trace: Trace | None, load: FluidLoad | None
                      ) -> str | None:
    """Why a failure time falls outside the replay, or None. The replay spans
    [0, --duration), or the trace's length without --duration; a failure after it would
    extend the run with idle replicas and inflate its GPU-hours."""
    if not options.failures:
        return None
    if options.duration_s is not None:
        end, what = options.duration_s, "--duration"
    elif trace is not None:
        end, what = trace.span_s, "the trace's length"
    else:
        assert load is not None
        end, what = load.steps * load.dt_s, "the trace's length"
    late = [f"{when:g}:{role.value}" for when, role in options.failures if when >= end]
    if not late:
        return None
    end_text = f"{end:.3f}".rstrip("0").rstrip(".")
    return (f"--fail {', '.join(late)}: failure times must be within [0, {end_text}) seconds "
            f"({what}); give a time inside the replay")


SCENARIO_PREFIX = "scenario:"
"""``--trace scenario:NAME`` replays a generated scenario family (simulator._scenarios)."""


def _workload(options: SimOptions, fmt: str | None
              ) -> tuple[Trace | None, FluidLoad | None, History | None]:
    """The run's requests: a trace (scaled, clipped, windowed), or for a ServeGen run in fluid
    mode over its whole length, its rates as a fluid load; and, for a scenario with earlier
    days, their per-minute demand."""
    history = None
    if options.trace.startswith(SCENARIO_PREFIX):
        from pdscale.simulator._scenarios import scenario

        generated = scenario(options.trace[len(SCENARIO_PREFIX):], seed=options.seed,
                             scale=options.scale)  # generated at its scale
        trace, history = generated.trace, generated.history
        if options.start_s or options.duration_s is not None:
            trace = trace.window(options.start_s, options.duration_s or math.inf)
    elif fmt == "servegen" and (options.mode == "fluid" or (
            options.mode == "auto" and (options.duration_s or math.inf) > EVENT_LIMIT_SPAN_S)):
        # Its rate windows as a fluid load: no request is materialised, however long.
        load = fluid_load_from_servegen(Path(options.trace), seed=options.seed,
                                        scale=options.scale, start_s=options.start_s,
                                        duration_s=options.duration_s)
        if options.max_prompt_tokens is not None:
            load = load.clipped(options.max_prompt_tokens)
        return None, load, None
    else:
        duration = options.duration_s
        if fmt == "servegen" and duration is None:
            duration = 3600.0  # event mode: one hour unless asked otherwise
        trace = load_trace(options.trace, fmt, skip_bad_rows=options.skip_bad_rows,
                           seed=options.seed, start_s=options.start_s, duration_s=duration)
        trace = trace.scaled(options.scale, seed=options.seed)
    if options.max_prompt_tokens is not None:
        trace = trace.clipped(options.max_prompt_tokens)
    if len(trace) == 0:
        raise TraceError("the trace has no requests after --scale and the time window")
    return trace, None, history

def prepare(spec: Spec, options: SimOptions) -> Prepared:
    """Pick the service, load the trace, size the pools and build the policy."""
    if options.policy not in POLICIES:
        raise ValueError(f"unknown policy {options.policy!r}; use one of {', '.join(POLICIES)}")
    service = spec.service(options.service) if options.service else spec.services[0]
    fmt = options.fmt
    if options.trace.startswith(SCENARIO_PREFIX):
        fmt = "scenario"
    elif options.trace != "synthetic" and fmt is None:
        fmt = detect_format(Path(options.trace))
    trace, load, history = _workload(options, fmt)
    mode = _resolve_mode(options, trace)
    if mode == "fluid" and load is None:
        assert trace is not None
        load = fluid_load_from_trace(trace, prefix_hit=options.prefix_hit or 0.0)
    late = _failures_outside(options, trace, load)
    if late is not None:
        raise ValueError(late)
    if options.idle_before and mode == "fluid":
        raise ValueError("--idle-before is for event mode: a fluid run's first sample follows "
                         "its first step and is measured already; drop it, or pass --mode "
                         "event (traces up to hours)")
    # Size the pools: the oracle's plan gives the static peak and everyone's start.
    tick_s = float(spec.controller.tick)
    probe = _setup(service, options, {Role.PREFILL: 1, Role.DECODE: 1}, tick_s=tick_s)
    if trace is not None:
        # --prefix-hit is fluid mode's assumption; event mode replays the prompts' own
        # prefixes, so sizing its start on an assumed hit rate would undersize it.
        plan = demand_plan(trace, probe.prefill.profile, probe.decode.profile,
                           probe.slo_ttft_s, probe.slo_itl_s,
                           prefix_hit=(options.prefix_hit or 0.0) if mode == "fluid" else 0.0)
    else:
        assert load is not None
        plan = _plan_from_load(load, probe)
    if options.initial_replicas is not None:
        initial = {Role.PREFILL: options.initial_replicas[0],
                   Role.DECODE: options.initial_replicas[1]}
    elif options.policy == "static":
        initial = size_for_peak(plan)
    else:
        initial = {role: service.pools[role].min_replicas for role in Role}
    # The simulated service alone: the controller's cross-pool constraints (P:D ratio
    # bounds, a GPU budget that counts this service's pools) and its telemetry, as in a
    # cluster running this one service.
    initial, budget = _within_budget(initial, spec, service)
    setup = _setup(service, options, initial, tick_s=tick_s)
    one = spec.model_copy(update={"services": (service,), "gpu_budget": budget})
    forecasts = None
    if options.policy == "pdscale":
        policy, forecasts = _pdscale(setup, one)
        if history is not None:
            _warm(forecasts, service.name, history)
    else:
        policy = _policy(options.policy, setup, plan)
    # Whether the trace's peak needs more than max_replicas (whatever the policy: the start
    # of an autoscaled run covers only its first cold start).
    peak = size_for_peak(plan)
    capped = {role.value: peak[role] > service.pools[role].max_replicas for role in Role}
    meta: dict[str, Any] = {
        "service": service.name,
        "trace": options.trace,
        "format": fmt or "synthetic",
        "policy": options.policy,
        "mode": mode,
        "seed": options.seed,
        "scale": options.scale,
        "max_prompt_tokens": options.max_prompt_tokens,
        "router": setup.router,
        "initial_replicas": {r.value: getattr(setup, r.value).initial_replicas for r in Role},
        "warmed_minutes": 0 if history is None else len(history[0]),
        "cold_start_s": {r.value: getattr(setup, r.value).cold_start_s for r in Role},
        "cold_start_spread": {r.value: getattr(setup, r.value).cold_start_spread for r in Role},
        "profiles": {r.value: getattr(setup, r.value).profile.name for r in Role},
        "slo": {"ttft_p95_s": setup.slo_ttft_s, "itl_p95_s": setup.slo_itl_s},
        "peak_need_exceeds_max_replicas": capped,
        "peak_need": {role.value: peak[role] for role in Role},
    }
    if trace is not None and trace.notes:
        meta["trace_notes"] = list(trace.notes)
    return Prepared(setup, policy, one, forecasts, mode, trace, load, meta)


def world_for(prepared: Prepared, options: SimOptions) -> World:
    """The prepared run's world: event or fluid mode."""
    if prepared.mode == "event":
        assert prepared.trace is not None
        return EventWorld(prepared.setup, prepared.trace,
                          observation_delay_s=options.observation_delay_s,
                          idle_before=options.idle_before)
    assert prepared.load is not None
    return FluidWorld(prepared.setup, prepared.load,
                      observation_delay_s=options.observation_delay_s)


def simulate(spec: Spec, options: SimOptions, *, policy: Policy | None = None,
             progress: Callable[[float], None] | None = None) -> tuple[SimResult, dict[str, Any]]:
    """Run one simulation (the production reconcile loop over the simulated service); returns
    the result and a description of what was run. ``policy`` replaces the one
    ``options.policy`` names (a baseline at other settings)."""
    prepared = prepare(spec, options)
    result = run_world(world_for(prepared, options), policy or prepared.policy,
                       spec=prepared.spec, progress=progress,
                       forecasts=prepared.forecasts if policy is None else None)
    result.summary.update(prepared.meta)
    return result, prepared.meta


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def _plots(result: SimResult) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.timeseries
    if not rows:
        return {}
    minutes = np.array([r["minute"] for r in rows])
    x = minutes / 60.0
    trace_name = Path(str(result.summary.get("trace", ""))).name
    title = (f"{result.summary.get('policy', '')} on {trace_name} "
             f"({result.summary.get('mode', '')} mode)")
    out: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(x, [r["arrivals_rps"] for r in rows], color="tab:blue", lw=1)
    ax.set_ylabel("requests/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["prompt_tokens_per_s"] for r in rows], color="tab:gray", lw=0.8, alpha=0.7)
    ax2.set_ylabel("prompt tokens/s", color="tab:gray")
    ax.set_xlabel("hours")
    ax.set_title(f"Load: {title}")
    out["plots/load.png"] = _png(fig)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for ax, role in zip(axes, ("prefill", "decode"), strict=True):
        ax.plot(x, [r[f"{role}_ready"] for r in rows], label="ready", lw=1.2)
        ax.plot(x, [r[f"{role}_ready"] + r[f"{role}_starting"] for r in rows],
                label="ready + starting", lw=0.8, ls="--")
        ax.plot(x, [r[f"{role}_desired"] for r in rows], label="desired", lw=0.8, alpha=0.7)
        ax.set_ylabel(f"{role} replicas")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("hours")
    axes[0].set_title(f"Replicas: {title}")
    out["plots/replicas.png"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 3))
    ttft = [r["ttft_p95_s"] for r in rows]
    ax.plot(x, ttft, lw=1, label="TTFT p95 (per minute)")
    slo = result.summary.get("slo", {}).get("ttft_p95_s")
    if slo:
        ax.axhline(slo, color="tab:red", ls="--", lw=1, label=f"SLO {slo:g}s")
    finite = [v for v in ttft if v == v and math.isfinite(v)]
    if finite and max(finite) > 20 * (slo or 1):
        ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_xlabel("hours")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"TTFT p95 against the SLO: {title}")
    out["plots/ttft.png"] = _png(fig)
    plt.close(fig)
    return out


def _csv(rows: list[dict[str, float]]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buffer.getvalue()


def result_files(result: SimResult, *, plots: bool = True) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {
        "summary.json": json.dumps(result.summary, indent=2, sort_keys=True, default=str) + "\n",
        "timeseries.csv": _csv(result.timeseries),
        "decisions.json": json.dumps(result.decisions, indent=1) + "\n",
    }
    if plots:
        files.update(_plots(result))
    return files
