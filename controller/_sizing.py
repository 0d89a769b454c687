"""Sizing: a pool's demand, forecast, capacity and signals -> the replicas it needs, and why.

A pure function (:func:`size`) of :class:`SizingInputs`; the policy gathers them (capacity
from the capacity model, the forecast from the forecast stage, the recent peak from the pool's
history) and stabilises the result (:mod:`controller._stabilise`).

1. The load sized for: the demand now and its forecast at the scale-up quantile over the lead,
   whichever is higher; for decode also the sequences running (bursts of long prompts with
   short outputs fill the KV cache before they fill the step).
2. A recent-burst floor: at least the highest load of the last ``burst_window_s`` (load that
   came in bursts recently comes again, and a one-minute forecast cannot see sub-minute
   bursts). It remembers load, not a waiting queue, which drains within a minute.
3. Decode also holds its waiting sequences, up to as many as run (a larger backlog is the
   reactive path's, sized by its drain time).
4. need = ceil(sized load / capacity per replica).
5. The reactive path: latency p95 over the SLO or a backlog adds the replicas that drain the
   backlog within ``drain_s`` (at least one more when latency is over), not +1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdscale.spec import Role
from telemetry import Signal

__all__ = ["DEMAND_SIGNAL", "LATENCY_SIGNAL", "Need", "SizingInputs", "size"]

DEMAND_SIGNAL = {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S,
                 Role.DECODE: Signal.GENERATION_TOKENS_PER_S}
LATENCY_SIGNAL = {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}


@dataclass(frozen=True)
class SizingInputs:
    role: Role
    demand: float
    """Prefill: uncached prompt tokens/s; decode: generated tokens/s."""
    forecast: float | None
    """The forecast at the scale-up quantile over the lead (None: none)."""
    forecast_note: str
    """How the forecast was (or was not) made, for the reasons."""
    per_replica: float
    """Demand one replica carries at the SLO (corrected)."""
    decode_batch: int
    """Sequences one decode replica holds at the ITL SLO."""
    running: float | None
    """Decode: sequences running."""
    queue: float
    """Requests waiting."""
    latency_s: float | None
    """The pool's latency p95, None when missing or when the miss is another pool's."""
    slo_s: float
    backlogged: bool
    per_request_tokens: float
    """Work a waiting request brings (prefill: prompt tokens; decode: output tokens)."""
    ready: int
    max_replicas: int
    recent_peak: float
    """The highest load sized for over the burst window before now (0: none, or off)."""
    burst_window_s: float
    drain_s: float
    lead_s: float
    quantile: float
    correction: float


@dataclass(frozen=True)
class Need:
    replicas: int
    """max(need, reactive): what the pool should have."""
    need: int
    reactive: int
    """Replicas the reactive path asks for (0: it did not fire)."""
    load: float
    """The load to remember in the burst window (demand, forecast, running sequences)."""
    reasons: tuple[str, ...]
    detail: dict[str, float | str | None]


def _load(x: SizingInputs) -> tuple[float, float, float | None]:
    """(load sized for before the burst floor, the waiting sequences' load, sequences)."""
    load = max(x.demand, x.forecast) if x.forecast is not None else x.demand
    if x.role is not Role.DECODE or x.running is None:
        return load, 0.0, None
    seqs = x.running + min(x.queue, max(x.running, x.decode_batch))
    load = max(load, x.running / x.decode_batch * x.per_replica)
    return load, seqs / x.decode_batch * x.per_replica, seqs


def _reactive(x: SizingInputs) -> int:
    if not ((x.latency_s is not None and x.latency_s > x.slo_s) or x.backlogged):
        return 0
    if x.per_replica <= 0:
        return x.max_replicas
    backlog = x.queue * x.per_request_tokens
    reactive = x.ready + math.ceil(backlog / (x.per_replica * x.drain_s))
    if x.latency_s is not None and x.latency_s > x.slo_s:
        reactive = max(reactive, x.ready + 1)
    return reactive


def size(x: SizingInputs) -> Need:
    """The replicas the pool needs, with its reasons (see the module docstring)."""
    load, waiting, seqs = _load(x)
    burst = max(x.recent_peak, load) if x.burst_window_s > 0 else 0.0
    sized_for = max(load, burst, waiting)
    need = math.ceil(sized_for / x.per_replica) if x.per_replica > 0 else x.max_replicas
    detail: dict[str, float | str | None] = {
        "signal": DEMAND_SIGNAL[x.role].value, "demand": x.demand, "forecast": x.forecast,
        "quantile": x.quantile if x.forecast is not None else None, "lead_s": x.lead_s,
        "capacity_per_replica": x.per_replica, "sequences": seqs, "recent_peak": burst,
        "sized_for": sized_for, "capacity_correction": x.correction, "need": need}
    reasons = [f"demand {x.demand:.4g}/s, {x.forecast_note}"
               + (f" = {x.forecast:.4g}/s" if x.forecast is not None else "")
               + (f"; {seqs:.0f} sequences running or waiting" if seqs is not None else "")
               + (f"; highest of the last {x.burst_window_s:.0f}s {burst:.4g}/s"
                  if burst > 0 else ""),
               f"capacity {x.per_replica:.4g}/s per replica (correction "
               f"{x.correction:.2f}), lead {x.lead_s:.0f}s -> need {need}"]
    reactive = _reactive(x)
    if reactive:
        signal = LATENCY_SIGNAL[x.role]
        latency = "n/a" if x.latency_s is None else f"{x.latency_s:.3g}s"
        reasons.append(f"reactive: {signal.value} {latency} vs SLO {x.slo_s:g}s, "
                       f"queue {x.queue:.0f} -> {reactive}")
        detail.update({"latency_signal": signal.value, "latency_p95_s": x.latency_s,
                       "slo_s": x.slo_s, "queue_depth": x.queue, "reactive": reactive})
    return Need(max(need, reactive), need, reactive, load, tuple(reasons), detail)
