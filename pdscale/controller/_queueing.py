"""The sizing model: a pool's replicas from a queueing model an operator can follow on paper
(docs/sizing.md gives the equations with their sources, a worked example and the limits).

**Prefill** is an M/G/c queue: prompts at ``lambda``/s, each ``E[S]`` s of a replica's work
(the profile's throughput for the length mix times the pool's correction), ``a = lambda E[S]``
replicas busy. A prompt waits with probability Erlang C, ``C(c, a)``, and then about
exponentially with Allen-Cunneen's mean ``(ca2 + cs2) / 2 / (c / E[S] - lambda)``, so the
SLO percentile's TTFT is ``max(0, ln(C / (1 - q))) x that mean + S_q + t0``: ``S_q`` the
prefill of the percentile's prompt (lognormal lengths), ``t0`` overhead and KV transfer.
The pool needs the fewest ``c`` that meets the SLO.

**Decode** holds ``N = lambda E[O] t_step`` running sequences (Little's law), their
percentile ``N + z_q sqrt(N v)`` (``v`` the arriving prompt tokens' dispersion over the mean
prompt), in batches of the largest ``B`` whose step meets the ITL SLO and whose KV fits:
``ceil(N_q / B)`` replicas.

**A backlog** of ``Q`` prompts drains within ``H`` (the SLO, or the lead where longer) at
``c >= a + Q E[S] / H``; ``W`` sequences waiting for decode add ``W E[O] t_step / H``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

from pdscale.controller._perf import decode_batch_limit, decode_operating_point
from pdscale.controller._profiles import InstanceProfile

__all__ = ["DecodeLoad", "PrefillLoad", "Sized", "decode_replicas", "erlang_c",
           "predicted_ttft_s", "prefill_replicas", "wait_quantile_s"]


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with ``servers`` servers and
    ``offered`` load (arrival rate x mean service time); 1 when ``offered >= servers``.
    Computed through the Erlang B recursion, which is stable for any size."""
    if servers < 1:
        raise ValueError(f"servers must be at least 1; got {servers}")
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


@dataclass(frozen=True, kw_only=True)
class PrefillLoad:
    """What the prefill model needs, each from the profile, the SLO or a measurement."""

    arrival_rps: float
    """Prompts arriving per second (the load sized for)."""
    mean_service_s: float
    """E[S]: seconds one replica takes for a prompt of the mix, corrected."""
    variability: float
    """ca2 + cs2: the squared coefficients of variation of the arrivals and of the service
    times (2 for Poisson arrivals of exponentially varied prompts)."""
    fixed_s: float
    """TTFT beyond queueing and prefill: the engine's overhead and the KV transfer."""
    quantile: float
    """The SLO's percentile, as a fraction (0.95 for p95)."""
    service_quantile_s: float | None = None
    """S_q: the prefill time of the prompt at the SLO's percentile (None: the mean's)."""

    @property
    def offered(self) -> float:
        """a = lambda E[S]: replicas' worth of work arriving."""
        return self.arrival_rps * self.mean_service_s

    @property
    def floor_s(self) -> float:
        """The TTFT no replica count lowers: the percentile's prefill and the fixed overhead."""
        q = self.service_quantile_s
        return (self.mean_service_s if q is None else q) + self.fixed_s


def wait_quantile_s(load: PrefillLoad, replicas: int) -> float:
    """The wait's ``load.quantile``-quantile at ``replicas`` replicas (inf when they cannot
    keep up)."""
    if load.arrival_rps <= 0:
        return 0.0
    slack = replicas / load.mean_service_s - load.arrival_rps
    if slack <= 0:
        return math.inf
    waits, tail = erlang_c(replicas, load.offered), 1 - load.quantile
    # Waits beyond the percentile's wait: C exp(-t / mean wait), the mean Allen-Cunneen's.
    return math.log(waits / tail) * (load.variability / 2 / slack) if waits > tail else 0.0


def predicted_ttft_s(load: PrefillLoad, replicas: int) -> float:
    """TTFT at the SLO's percentile: the wait's quantile plus the prefill of the percentile's
    prompt and the fixed overhead."""
    return wait_quantile_s(load, replicas) + load.floor_s


@dataclass(frozen=True)
class Sized:
    """A pool's replicas from the model, the prediction at that count, and why."""

    replicas: int
    predicted_s: float
    """The predicted latency at the SLO's percentile (TTFT for prefill, ITL for decode)."""
    met: bool
    """Whether the prediction meets the SLO within the pool's maximum."""
    reason: str
    terms: Mapping[str, float] = field(default_factory=dict)
    """The model's terms, machine-readable (a decision's ``detail``)."""


def prefill_replicas(load: PrefillLoad, slo_s: float, *, max_replicas: int,
                     queued: float = 0.0, drain_s: float | None = None) -> Sized:
    """The fewest replicas (1 to ``max_replicas``) whose predicted TTFT meets ``slo_s``, and
    enough to drain ``queued`` waiting prompts within ``drain_s`` (default: the SLO)."""
    a = load.offered
    horizon = max(slo_s, drain_s or 0.0)
    drain = math.ceil(a + queued * load.mean_service_s / horizon) if queued > 0 else 0
    late = load.floor_s >= slo_s  # the prefill alone misses: no count helps; keep prompts unqueued
    c = math.floor(a) + 1 if a > 0 else 1
    while c < max_replicas and (wait_quantile_s(load, c) > 0 if late
                                else predicted_ttft_s(load, c) > slo_s):
        c += 1
    predicted = predicted_ttft_s(load, c)
    met = predicted <= slo_s and not late
    replicas = min(max_replicas, max(c, drain))
    reason = (f"lambda {load.arrival_rps:.3g} req/s x E[S] {1000 * load.mean_service_s:.0f} ms "
              f"= {a:.2f} replicas busy; predicted TTFT p{100 * load.quantile:g} "
              f"{predicted:.3g} s at {c} {'<=' if met else '>'} {slo_s:g} s")
    if late:
        reason += f" (the prefill alone takes {load.floor_s:.3g} s)"
    if drain > c:
        reason += f"; {queued:.0f} waiting drain within {horizon:.3g} s at {replicas}"
    if replicas == max_replicas and (drain > max_replicas or not met):
        reason += f"; held to the maximum, {max_replicas}"
    terms = {"arrival_rps": load.arrival_rps, "mean_service_s": load.mean_service_s, "offered": a,
             "variability": load.variability, "ttft_floor_s": load.floor_s, "replicas_for_slo": c,
             "backlog": queued, "replicas_to_drain": drain, "drain_s": horizon}
    return Sized(replicas, predicted, met and drain <= max_replicas, reason, terms)


@dataclass(frozen=True, kw_only=True)
class DecodeLoad:
    arrival_rps: float
    """Requests starting decode per second (the load sized for)."""
    mean_output_tokens: float
    mean_context_tokens: float
    """A running sequence's mean context (prompt plus half its output)."""
    variability: float
    """v: the running sequences' variance over their mean (the arriving prompt tokens' index
    of dispersion over the mean prompt)."""
    quantile: float


def decode_replicas(load: DecodeLoad, profile: InstanceProfile, itl_slo_s: float, *,
                    max_replicas: int, waiting: float = 0.0, drain_s: float = 60.0) -> Sized:
    """The fewest replicas whose batches (the largest within the ITL SLO whose KV fits the
    profile's cache) hold the running sequences' SLO percentile, and ``waiting`` sequences
    started within ``drain_s``."""
    point = decode_operating_point(profile, itl_slo_s, load.mean_context_tokens)
    running = load.arrival_rps * load.mean_output_tokens * point.step_s
    z = NormalDist().inv_cdf(load.quantile)
    tail = running + z * math.sqrt(running * max(load.variability, 0.0)) if running > 0 else 0.0
    backlog = max(waiting, 0.0) * load.mean_output_tokens * point.step_s / max(drain_s,
                                                                              point.step_s)
    want = tail + backlog
    c = max(1, math.ceil(want / point.batch - 1e-9))
    replicas = min(max_replicas, c)
    per = want / replicas
    predicted = profile.decode_step_ms(per, per * load.mean_context_tokens) / 1000
    met = c <= max_replicas and predicted <= itl_slo_s + 1e-12
    bound = (f"at ITL {1000 * itl_slo_s:.3g} ms"
             if point.batch < decode_batch_limit(profile, load.mean_context_tokens)
             else "(the engine's max batch)" if point.batch == profile.max_batch
             else f"(what the KV cache holds at {load.mean_context_tokens:,.0f}-token contexts)")
    reason = (f"{running:.0f} running (lambda {load.arrival_rps:.3g} req/s x "
              f"{load.mean_output_tokens:.0f} tokens x {1000 * point.step_s:.0f} ms), "
              f"p{100 * load.quantile:g} {tail:.0f}"
              + (f" + {backlog:.0f} for {waiting:.0f} waiting within {drain_s:.3g} s"
                 if waiting > 0 else "")
              + f"; batch <= {point.batch} {bound}: predicted ITL {1000 * predicted:.0f} ms "
              f"at {replicas}")
    if c > max_replicas:
        reason += f"; held to the maximum, {max_replicas}"
    terms = {"arrival_rps": load.arrival_rps, "running": running, "running_quantile": tail,
             "backlog": waiting, "backlog_running": backlog, "batch": point.batch,
             "step_s": point.step_s, "drain_s": drain_s}
    return Sized(replicas, predicted, met, reason, terms)
