"""The signal catalog: for each engine, each signal as PromQL over one pool's series.

Design. Alerts, dashboards and the controller never name an engine's metrics themselves: they
ask this module. Each engine's raw expressions are recorded once per pool by recording rules
named ``level:metric:operation`` (shared/REFERENCE.md §2), labelled with ``pdscale_service``,
``pdscale_pool`` and ``model_name`` from the spec, so that everything downstream queries one
engine-agnostic series per signal and all pools at once with a single query. A signal an
engine does not export is absent from its table, never guessed; asking for it raises
:class:`UnknownSignal` naming the engine and the signals it has.

Only current metric names are used, checked against the engines' released code and a running
engine (shared/REFERENCE.md §1 and §6; tests/telemetry/test_reference.py holds every generated
expression against the metric lists of vLLM 0.34.0, SGLang 0.5.23 and Dynamo 1.6.1). No engine
emits ``namespace`` or ``pod``: they come from the scrape (a PodMonitor adds them), which is why
the spec declares its scrape labels and ``pdscale validate`` refuses a selector on a label that
nothing provides. Where the pool's series come from:

* vLLM, SGLang: each pool's own pods, selected by ``namespace``, a ``pod`` regex (default
  ``<scale target name>-.*``), ``model_name`` and any extra labels in the spec. A prefill
  instance's TTFT is its queueing plus prefill time, which is what scaling prefill controls.
  The queue is the capacity backlog: vLLM's ``num_requests_waiting_by_reason{reason=
  "capacity"}`` (``num_requests_waiting`` where the engine predates it: it also counts requests
  deferred while their KV is transferred), SGLang's queue plus its P/D bootstrap (prefill) or
  prealloc (decode) queue; requests waiting for their KV transfer are a signal of their own.
  SGLang's queue and running gauges are read at ``priority=""`` (with priority scheduling they
  are written twice: the total and per priority). vLLM's error ratio counts
  ``finished_reason="error"`` (``abort`` is a client that went away).
* Dynamo: the frontend's series carry only ``model`` (plus ``endpoint``, ``request_type``,
  ``status``, ``error_type``): they are selected by the service's ``namespace`` (from the scrape)
  and ``model``. TTFT, prompt tokens and the prefix-cache ratio (from the frontend's cached-token
  histogram) belong to the prefill pool, ITL, output tokens and request duration to the decode
  pool, requests to both. A prefill worker exports no ``vllm:*`` series: its backlog is the
  work handler's in-flight gauge (``dynamo_component_inflight_requests``, selected by
  ``dynamo_namespace`` and ``dynamo_component``, which the runtime emits). The decode worker
  re-exports its backend's queue, running, KV and preemption series.
* TGI (unverified against a release): no TTFT histogram; ITL is TGI's per-request mean time per
  token; no KV-cache, prefix-cache or preemption series.
* GPUs: DCGM exporter series with the Kubernetes pod mapping (``namespace``, ``pod``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from string import Template
from typing import Literal

from pdscale.spec import Engine, Role, ServiceSpec, SignalSource, Spec

__all__ = [
    "CONTROL_PLANE_METRICS",
    "DISPERSION_WINDOW",
    "DISPERSION_WINDOW_S",
    "KNOWN_METRICS",
    "OPTIONAL_METRICS",
    "POOL_LABELS",
    "RATE_WINDOW",
    "RATE_WINDOW_S",
    "RECENT_WINDOW",
    "RECENT_WINDOW_S",
    "SLO_OBJECTIVE_RECORD",
    "SLO_THRESHOLD_RECORD",
    "SLO_WINDOWS",
    "SPAN_HISTOGRAM_SERIES",
    "STAGE_SIGNALS",
    "SeriesRef",
    "Signal",
    "SignalDef",
    "UnknownSignal",
    "derive_signals",
    "dispersion_window_samples",
    "engine_signals",
    "le_matcher",
    "metric_names_in",
    "pool_expr",
    "pool_query",
    "recorded_expr",
    "recorded_name",
    "series_refs",
    "signal_def",
    "slo_bucket_ref",
    "slo_error_ratio_expr",
    "slo_error_ratio_record",
    "slo_source",
    "span_signals",
]

POOL_LABELS = ("pdscale_service", "pdscale_pool")
"""Labels that the recording rules (and pdscale's own metrics) put on every pool series."""

RATE_WINDOW = "5m"
"""Window of every rate and latency percentile the recording rules record (the ``rate5m`` in
their names). The controller reads those series; the simulator computes its signals over the
same window, so a policy sees the same smoothing in both worlds."""
RATE_WINDOW_S = 300.0
""":data:`RATE_WINDOW` in seconds."""
RECENT_WINDOW = "1m"
"""Window of the recent signals: the TTFT p95 of the last minute (whether a miss the 5-minute
p95 still carries is still happening) and the highest one-minute prompt-token rate within the
rate window (what a burst needed, which a 5-minute rate averages away)."""
RECENT_WINDOW_S = 60.0
""":data:`RECENT_WINDOW` in seconds."""
DISPERSION_WINDOW = "5s"
"""Window over which counted prompt tokens are binned for their index of dispersion
(``Signal.PROMPT_TOKENS_DISPERSION``, prefill pools): half the mean squared difference of
consecutive windows' tokens over their mean, over the rate window (the variance over the mean
for steady arrivals, without the trend a ramp adds). Clumps of prompts that arrive within
seconds show there and in no per-minute rate. Each window's tokens are the counter's
difference between two instants 5 s apart (not a ``rate``, whose extrapolation over the
samples' span inflates the variance), so the recording rule needs two samples in a 5 s
window: a scrape interval of 2.5 s or less; at a coarser scrape the series is empty (the rule
checks the median window of every series) and the controller says the tail model is
unread."""
DISPERSION_WINDOW_S = 5.0
""":data:`DISPERSION_WINDOW` in seconds."""

SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
"""Windows of the SLO error-ratio recording rules used by the multi-window burn-rate alerts."""

SLO_OBJECTIVE_RECORD = "pdscale_pool:slo_objective:ratio"
"""The SLO objective as a constant series per pool, so dashboards can compute burn rates."""
SLO_THRESHOLD_RECORD = "pdscale_pool:slo_latency_threshold:seconds"
"""The pool's latency SLO threshold (TTFT for prefill, ITL for decode) as a constant series."""


class Signal(StrEnum):
    QUEUE_DEPTH = "queue_depth"
    KV_TRANSFER_WAITING = "kv_transfer_waiting"
    RUNNING_REQUESTS = "running_requests"
    TTFT_P50_S = "ttft_p50_s"
    TTFT_P95_S = "ttft_p95_s"
    TTFT_P95_RECENT_S = "ttft_p95_recent_s"
    TTFT_P99_S = "ttft_p99_s"
    # TTFT by stage, from the engines' request spans (the OTLP source).
    TTFT_QUEUE_P95_S = "ttft_queue_p95_s"
    TTFT_PREFILL_P95_S = "ttft_prefill_p95_s"
    TTFT_TRANSFER_P95_S = "ttft_transfer_p95_s"
    ITL_P50_S = "itl_p50_s"
    ITL_P95_S = "itl_p95_s"
    ITL_P95_RECENT_S = "itl_p95_recent_s"
    E2E_P95_S = "e2e_p95_s"
    REQUEST_RATE = "request_rate"
    PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"
    PROMPT_TOKENS_PEAK_PER_S = "prompt_tokens_peak_per_s"
    PROMPT_TOKENS_DISPERSION = "prompt_tokens_dispersion"
    PROMPT_TOKENS_COMPUTED_PER_S = "prompt_tokens_computed_per_s"
    GENERATION_TOKENS_PER_S = "generation_tokens_per_s"
    PREFIX_CACHE_HIT_RATIO = "prefix_cache_hit_ratio"
    EXTERNAL_PREFIX_CACHE_HIT_RATIO = "external_prefix_cache_hit_ratio"
    KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
    KV_CACHE_USAGE_MAX_RATIO = "kv_cache_usage_max_ratio"
    PREEMPTIONS_PER_S = "preemptions_per_s"
    ERROR_RATIO = "error_ratio"
    KV_TRANSFER_FAILURES_PER_S = "kv_transfer_failures_per_s"
    KV_HANDOFF_FAILURES_PER_S = "kv_handoff_failures_per_s"
    GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
    GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
    GPU_MEMORY_FREE_BYTES = "gpu_memory_free_bytes"
    GPU_MEMORY_USED_MAX_RATIO = "gpu_memory_used_max_ratio"
    GPU_TEMPERATURE_MAX_CELSIUS = "gpu_temperature_max_celsius"
    GPU_XID_ERRORS = "gpu_xid_errors"
    TARGETS_UP = "targets_up"
    TARGETS = "targets"
    SAMPLE_AGE_S = "sample_age_s"
    # The control plane's own series (exported by the controller, not recorded).
    DESIRED_REPLICAS = "desired_replicas"
    READY_REPLICAS = "ready_replicas"
    FORECAST_DEMAND = "forecast_demand"
    OBSERVED_DEMAND = "observed_demand"
    COLD_START_P90_S = "cold_start_p90_s"
    DECISIONS_PER_S = "decisions_per_s"
    LAST_DECISION_TIMESTAMP = "last_decision_timestamp"
    DATA_STALENESS_S = "data_staleness_s"
    GPUS_ALLOCATED = "gpus_allocated"
    GPU_BUDGET = "gpu_budget"
    # Derived from recorded signals by the reader's caller (:func:`derive_signals`).
    MEAN_PROMPT_TOKENS = "mean_prompt_tokens"
    MEAN_OUTPUT_TOKENS = "mean_output_tokens"


Scope = Literal["pool", "gpu", "control", "derived"]


@dataclass(frozen=True)
class SignalDef:
    """What a signal is: its recorded (or exported) series name, unit and help text."""

    signal: Signal
    series: str
    unit: str
    """Grafana unit id: 's', 'percentunit', 'reqps', 'short', 'bytes', 'celsius', ..."""
    help: str
    scope: Scope = "pool"
    rate: bool = False
    """True when the control-plane series is a counter to be read through rate()."""


def _d(signal: Signal, series: str, unit: str, help_: str, scope: Scope = "pool",
       rate: bool = False) -> SignalDef:
    return SignalDef(signal, series, unit, help_, scope, rate)


_DEFS: tuple[SignalDef, ...] = (
    _d(Signal.QUEUE_DEPTH, "pdscale_pool:requests_waiting:sum", "short",
       "Requests waiting in the engines' queues"),
    _d(Signal.KV_TRANSFER_WAITING, "pdscale_pool:requests_waiting_kv_transfer:sum", "short",
       "Requests waiting for their KV transfer (P/D decode), not for capacity"),
    _d(Signal.RUNNING_REQUESTS, "pdscale_pool:requests_running:sum", "short",
       "Requests being processed"),
    _d(Signal.TTFT_P50_S, "pdscale_pool:time_to_first_token_seconds:p50_rate5m", "s",
       "Time to first token, median over 5m"),
    _d(Signal.TTFT_P95_S, "pdscale_pool:time_to_first_token_seconds:p95_rate5m", "s",
       "Time to first token, 95th percentile over 5m"),
    _d(Signal.TTFT_P95_RECENT_S, "pdscale_pool:time_to_first_token_seconds:p95_rate1m", "s",
       "Time to first token, 95th percentile over the last minute"),
    _d(Signal.TTFT_P99_S, "pdscale_pool:time_to_first_token_seconds:p99_rate5m", "s",
       "Time to first token, 99th percentile over 5m"),
    _d(Signal.TTFT_QUEUE_P95_S, "pdscale_pool:ttft_queue_seconds:p95_rate5m", "s",
       "Time requests waited in the engine's queue before their prefill, 95th percentile "
       "over 5m (request spans)"),
    _d(Signal.TTFT_PREFILL_P95_S, "pdscale_pool:ttft_prefill_seconds:p95_rate5m", "s",
       "Prefill time to the first token, 95th percentile over 5m (request spans)"),
    _d(Signal.TTFT_TRANSFER_P95_S, "pdscale_pool:ttft_transfer_seconds:p95_rate5m", "s",
       "Time to first token outside the queue and the prefill (KV transfer in P/D, "
       "tokenisation), 95th percentile over 5m (request spans)"),
    _d(Signal.ITL_P50_S, "pdscale_pool:inter_token_latency_seconds:p50_rate5m", "s",
       "Inter-token latency, median over 5m"),
    _d(Signal.ITL_P95_S, "pdscale_pool:inter_token_latency_seconds:p95_rate5m", "s",
       "Inter-token latency, 95th percentile over 5m"),
    _d(Signal.ITL_P95_RECENT_S, "pdscale_pool:inter_token_latency_seconds:p95_rate1m", "s",
       "Inter-token latency, 95th percentile over the last minute"),
    _d(Signal.E2E_P95_S, "pdscale_pool:e2e_request_latency_seconds:p95_rate5m", "s",
       "End-to-end request latency, 95th percentile over 5m"),
    _d(Signal.REQUEST_RATE, "pdscale_pool:requests:rate5m", "reqps",
       "Finished requests per second"),
    _d(Signal.PROMPT_TOKENS_PER_S, "pdscale_pool:prompt_tokens:rate5m", "short",
       "Prompt tokens per second"),
    _d(Signal.PROMPT_TOKENS_PEAK_PER_S, "pdscale_pool:prompt_tokens:rate1m_max5m", "short",
       "Prompt tokens per second, the highest one-minute rate within the last 5m"),
    _d(Signal.PROMPT_TOKENS_DISPERSION, "pdscale_pool:prompt_tokens:dispersion5s_5m", "short",
       "Index of dispersion of counted prompt tokens: half the mean squared difference of "
       "consecutive 5s windows' tokens over their mean, over the last 5m (tokens; a Poisson "
       "stream of equal prompts reads one prompt's length; empty at a scrape over 2.5s)"),
    _d(Signal.PROMPT_TOKENS_COMPUTED_PER_S, "pdscale_pool:prompt_tokens_computed:rate5m",
       "short", "Prompt tokens computed per second (not served by a cache or a KV transfer): "
       "the exact prefill demand"),
    _d(Signal.GENERATION_TOKENS_PER_S, "pdscale_pool:generation_tokens:rate5m", "short",
       "Generated tokens per second"),
    _d(Signal.PREFIX_CACHE_HIT_RATIO, "pdscale_pool:prefix_cache_hits:ratio_rate5m",
       "percentunit", "Share of prompt tokens served from the prefix cache"),
    _d(Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO,
       "pdscale_pool:external_prefix_cache_hits:ratio_rate5m", "percentunit",
       "Share of prompt tokens served from the cross-instance (KV-connector) cache"),
    _d(Signal.KV_CACHE_USAGE_RATIO, "pdscale_pool:kv_cache_usage:avg", "percentunit",
       "KV-cache usage, mean over replicas"),
    _d(Signal.KV_CACHE_USAGE_MAX_RATIO, "pdscale_pool:kv_cache_usage:max", "percentunit",
       "KV-cache usage of the fullest replica"),
    _d(Signal.PREEMPTIONS_PER_S, "pdscale_pool:preemptions:rate5m", "short",
       "Preempted sequences per second"),
    _d(Signal.ERROR_RATIO, "pdscale_pool:request_errors:ratio_rate5m", "percentunit",
       "Share of requests that failed"),
    _d(Signal.KV_TRANSFER_FAILURES_PER_S, "pdscale_pool:kv_transfer_failures:rate5m", "short",
       "Failed P/D KV transfers per second"),
    _d(Signal.KV_HANDOFF_FAILURES_PER_S, "pdscale_pool:kv_handoff_failures:rate5m", "short",
       "P/D requests whose KV hand-off failed per second (expired before it was read, or "
       "the bootstrap failed)"),
    _d(Signal.GPU_UTILIZATION_RATIO, "pdscale_pool:gpu_utilization:avg", "percentunit",
       "GPU utilisation, mean over the pool's GPUs"),
    _d(Signal.GPU_MEMORY_USED_BYTES, "pdscale_pool:gpu_memory_used_bytes:sum", "bytes",
       "Framebuffer memory used"),
    _d(Signal.GPU_MEMORY_FREE_BYTES, "pdscale_pool:gpu_memory_free_bytes:sum", "bytes",
       "Framebuffer memory free"),
    _d(Signal.GPU_MEMORY_USED_MAX_RATIO, "pdscale_pool:gpu_memory_used:max_ratio",
       "percentunit", "Framebuffer memory used on the fullest GPU"),
    _d(Signal.GPU_TEMPERATURE_MAX_CELSIUS, "pdscale_pool:gpu_temperature_celsius:max",
       "celsius", "Temperature of the hottest GPU"),
    _d(Signal.GPU_XID_ERRORS, "pdscale_gpu:xid_errors:max", "none",
       "XID error code per GPU while it changed within the last 15 minutes (absent: none)",
       scope="gpu"),
    _d(Signal.TARGETS_UP, "pdscale_pool:targets_up:sum", "short",
       "Scrape targets of the pool that are up"),
    _d(Signal.TARGETS, "pdscale_pool:targets:count", "short",
       "Scrape targets of the pool"),
    _d(Signal.SAMPLE_AGE_S, "pdscale_pool:sample_age:seconds", "s",
       "Age of the newest engine sample of the pool (absent once every target is gone)"),
    _d(Signal.DESIRED_REPLICAS, "pdscale_desired_replicas", "short",
       "Replicas the controller wants", scope="control"),
    _d(Signal.READY_REPLICAS, "pdscale_ready_replicas", "short",
       "Replicas ready according to Kubernetes", scope="control"),
    _d(Signal.FORECAST_DEMAND, "pdscale_forecast_demand", "short",
       "Forecast demand at the pre-warm horizon, by quantile", scope="control"),
    _d(Signal.OBSERVED_DEMAND, "pdscale_observed_demand", "short",
       "Observed demand (prefill: prompt tokens/s; decode: generated tokens/s)",
       scope="control"),
    _d(Signal.COLD_START_P90_S, "pdscale_cold_start_p90_seconds", "s",
       "Learned 90th-percentile cold start", scope="control"),
    _d(Signal.DECISIONS_PER_S, "pdscale_decisions_total", "short",
       "Scaling decisions by direction and reason", scope="control", rate=True),
    _d(Signal.LAST_DECISION_TIMESTAMP, "pdscale_last_decision_timestamp_seconds", "dateTimeAsIso",
       "When the controller last decided for the pool", scope="control"),
    _d(Signal.DATA_STALENESS_S, "pdscale_data_staleness_seconds", "s",
       "Age of the newest sample behind each input signal", scope="control"),
    _d(Signal.GPUS_ALLOCATED, "pdscale_gpus_allocated", "short",
       "GPUs held by the pool's replicas", scope="control"),
    _d(Signal.GPU_BUDGET, "pdscale_gpu_budget", "short",
       "GPUs the spec allows across all pools", scope="control"),
    _d(Signal.MEAN_PROMPT_TOKENS, "", "short",
       "Mean prompt length over the rate window (prompt tokens/s over requests/s)",
       scope="derived"),
    _d(Signal.MEAN_OUTPUT_TOKENS, "", "short",
       "Mean output length over the rate window (generated tokens/s over requests/s)",
       scope="derived"),
)
_BY_SIGNAL = {d.signal: d for d in _DEFS}

_CONTROLLER_OWN = frozenset({
    "pdscale_tick_duration_seconds_bucket",
    "pdscale_tick_duration_seconds_count", "pdscale_tick_duration_seconds_sum",
    "pdscale_adapter_errors_total", "pdscale_leader", "pdscale_alert_reactions_total",
    "pdscale_alerts_received_total",
    # Scale-down drains (controller._drain).
    "pdscale_drain_replicas", "pdscale_drain_ended_total", "pdscale_drain_cut_requests_total",
    "pdscale_drain_timeouts_in_a_row"})
"""Series the controller exports about itself (not per pool): health, tick time, leadership,
alert reactions."""

CONTROL_PLANE_METRICS = frozenset(d.series for d in _DEFS if d.scope == "control") | \
    _CONTROLLER_OWN

SPAN_HISTOGRAM_SERIES = {
    "ttft": "pdscale_otlp_time_to_first_token_seconds",
    "queue": "pdscale_otlp_queue_time_seconds",
    "prefill": "pdscale_otlp_prefill_time_seconds",
    "transfer": "pdscale_otlp_transfer_time_seconds",
    "itl": "pdscale_otlp_inter_token_latency_seconds",
    "e2e": "pdscale_otlp_e2e_request_latency_seconds",
}
"""Latency stage -> the histogram pdscale re-exports from the engines' request spans (its OTLP
receiver), labelled with the pool, at the service's latency buckets (which hold its SLO
threshold); the recording rules read them where the spec reads a signal from OTLP."""

_OTLP_OWN = frozenset({
    "pdscale_otlp_accepted_total", "pdscale_otlp_dropped_total", "pdscale_otlp_refused_total",
    *(f"{series}{part}" for series in SPAN_HISTOGRAM_SERIES.values()
      for part in ("_bucket", "_count", "_sum"))})
"""Series the controller exports only while its OTLP receiver runs (controller._otlp_receiver:
what it took, dropped and refused; the span-derived stage histograms)."""


def derive_signals(values: Mapping[Signal, float | None]) -> dict[Signal, float | None]:
    """``values`` with the derived signals added: the mean prompt and output lengths over the
    rate window (for the queueing model's service times and decode context, and the Dynamo
    planner's sizing). None where the request rate or the token rate is missing or zero."""
    out = dict(values)
    rate = values.get(Signal.REQUEST_RATE)
    for derived, tokens in ((Signal.MEAN_PROMPT_TOKENS, Signal.PROMPT_TOKENS_PER_S),
                            (Signal.MEAN_OUTPUT_TOKENS, Signal.GENERATION_TOKENS_PER_S)):
        value = values.get(tokens)
        out[derived] = value / rate if rate and rate > 0 and value else None
    return out


class UnknownSignal(KeyError):
    """A signal the engine does not export. Give up: fix the caller or the spec."""

    def __init__(self, signal: str, engine: Engine, available: frozenset[Signal]) -> None:
        self.signal, self.engine = signal, engine
        names = ", ".join(sorted(s.value for s in available))
        super().__init__(
            f"signal {signal!r} is not exported by engine {engine.value!r}; "
            f"its signals are: {names}"
        )

    def __str__(self) -> str:
        return str(self.args[0])


# --------------------------------------------------------------------------------------------
# Engine tables. $eng: the pool's engine series; $wrk: a Dynamo worker's own runtime series;
# $fe: the Dynamo frontend; $gpu: DCGM series of the pool's pods; $tgt: the pool's scrape
# targets; $w: the rate window.


def _q(q: float, metric: str, sel: str = "$eng") -> str:
    return (f"histogram_quantile({q}, sum by (le, namespace) "
            f"(rate({metric}_bucket{{{sel}}}[$w])))")


def _rate(metric: str, sel: str = "$eng") -> str:
    return f"sum by (namespace) (rate({metric}{{{sel}}}[$w]))"


def _sum(metric: str, sel: str = "$eng") -> str:
    return f"sum by (namespace) ({metric}{{{sel}}})"


def _ratio(num: str, den: str) -> str:
    """A ratio that is empty, not zero or NaN, when the denominator saw no traffic."""
    return f"{num} / ({den} > 0)"


def _plus_where_exported(base: str, extra: str) -> str:
    """``base + extra``, where ``extra`` counts zero when the engine does not export it (a
    queue that only exists in P/D mode), so the sum is never empty because of it."""
    return f"{base} + ({extra} or {base} * 0)"


# vLLM V1 (0.34.0). Waiting requests by reason exist from 0.34: older engines only have the
# total, which also counts requests deferred while their KV is transferred.
# Per pod: the waiting-for-capacity count where the engine breaks its queue down by reason
# (vLLM 0.34+; the rest waits for a KV transfer), else its whole queue. Falling back per pod,
# not per pool, keeps the older pods' queues during a rolling upgrade.
_VLLM_QUEUE = ("sum by (namespace) (sum by (namespace, pod) "
               "(vllm:num_requests_waiting_by_reason{$eng,reason=\"capacity\"}) or "
               "sum by (namespace, pod) (vllm:num_requests_waiting{$eng}))")
_VLLM: dict[Signal, str] = {
    Signal.QUEUE_DEPTH: _VLLM_QUEUE,
    Signal.KV_TRANSFER_WAITING: _sum("vllm:num_requests_waiting_by_reason",
                                     '$eng,reason="deferred"'),
    Signal.RUNNING_REQUESTS: _sum("vllm:num_requests_running"),
    Signal.TTFT_P50_S: _q(0.5, "vllm:time_to_first_token_seconds"),
    Signal.TTFT_P95_S: _q(0.95, "vllm:time_to_first_token_seconds"),
    Signal.TTFT_P99_S: _q(0.99, "vllm:time_to_first_token_seconds"),
    Signal.ITL_P50_S: _q(0.5, "vllm:inter_token_latency_seconds"),
    Signal.ITL_P95_S: _q(0.95, "vllm:inter_token_latency_seconds"),
    Signal.E2E_P95_S: _q(0.95, "vllm:e2e_request_latency_seconds"),
    Signal.REQUEST_RATE: _rate("vllm:request_success_total"),
    Signal.PROMPT_TOKENS_PER_S: _rate("vllm:prompt_tokens_total"),
    # Tokens the engine computed itself: not from its prefix cache, not from a KV transfer.
    Signal.PROMPT_TOKENS_COMPUTED_PER_S: _rate("vllm:prompt_tokens_by_source_total",
                                               '$eng,source="local_compute"'),
    Signal.GENERATION_TOKENS_PER_S: _rate("vllm:generation_tokens_total"),
    Signal.PREFIX_CACHE_HIT_RATIO: _ratio(_rate("vllm:prefix_cache_hits_total"),
                                          _rate("vllm:prefix_cache_queries_total")),
    Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO: _ratio(
        _rate("vllm:external_prefix_cache_hits_total"),
        _rate("vllm:external_prefix_cache_queries_total")),
    Signal.KV_CACHE_USAGE_RATIO: "avg by (namespace) (vllm:kv_cache_usage_perc{$eng})",
    Signal.KV_CACHE_USAGE_MAX_RATIO: "max by (namespace) (vllm:kv_cache_usage_perc{$eng})",
    Signal.PREEMPTIONS_PER_S: _rate("vllm:num_preemptions_total"),
    # "error" is an internal failure (always a 500; e.g. a failed KV load in P/D); "abort" is
    # a client that went away and is not counted.
    Signal.ERROR_RATIO: _ratio(_rate("vllm:request_success_total", '$eng,finished_reason="error"'),
                               _rate("vllm:request_success_total")),
    # NIXL connector (P/D KV transfer): absent unless the pool uses it.
    Signal.KV_TRANSFER_FAILURES_PER_S: _rate("vllm:nixl_num_failed_transfers_total"),
    Signal.KV_HANDOFF_FAILURES_PER_S: _rate("vllm:nixl_num_kv_expired_reqs_total"),
}

# SGLang (0.5.23). Scheduler gauges are read at priority="" (the total; it also matches when
# priority scheduling is off and the label is absent).
_SG = '$eng,priority=""'
_SGLANG_QUEUE = _sum("sglang:num_queue_reqs", _SG)
_SGLANG: dict[Signal, str] = {
    Signal.RUNNING_REQUESTS: _sum("sglang:num_running_reqs", _SG),
    Signal.TTFT_P50_S: _q(0.5, "sglang:time_to_first_token_seconds"),
    Signal.TTFT_P95_S: _q(0.95, "sglang:time_to_first_token_seconds"),
    Signal.TTFT_P99_S: _q(0.99, "sglang:time_to_first_token_seconds"),
    Signal.ITL_P50_S: _q(0.5, "sglang:inter_token_latency_seconds"),
    Signal.ITL_P95_S: _q(0.95, "sglang:inter_token_latency_seconds"),
    Signal.E2E_P95_S: _q(0.95, "sglang:e2e_request_latency_seconds"),
    Signal.REQUEST_RATE: _rate("sglang:num_requests_total"),
    Signal.PROMPT_TOKENS_PER_S: _rate("sglang:prompt_tokens_total"),
    Signal.GENERATION_TOKENS_PER_S: _rate("sglang:generation_tokens_total"),
    # A windowed ratio; sglang:cache_hit_rate is only the last prefill batch's.
    Signal.PREFIX_CACHE_HIT_RATIO: _ratio(_rate("sglang:cached_tokens_total"),
                                          _rate("sglang:prompt_tokens_total")),
    Signal.KV_CACHE_USAGE_RATIO: f"avg by (namespace) (sglang:token_usage{{{_SG}}})",
    Signal.KV_CACHE_USAGE_MAX_RATIO: f"max by (namespace) (sglang:token_usage{{{_SG}}})",
    Signal.PREEMPTIONS_PER_S: _rate("sglang:num_retracted_requests_total"),
    Signal.ERROR_RATIO: _ratio(_rate("sglang:num_aborted_requests_total"),
                               _rate("sglang:num_requests_total")),
    Signal.KV_TRANSFER_FAILURES_PER_S: _rate("sglang:num_transfer_failed_reqs_total"),
    Signal.KV_HANDOFF_FAILURES_PER_S: _rate("sglang:num_bootstrap_failed_reqs_total"),
}
# P/D queues outside num_queue_reqs: a prefill pool's requests wait for the decode side's
# bootstrap; a decode pool's wait for KV memory (prealloc), then for the transfer itself.
_SGLANG_ROLE: dict[Role, dict[Signal, str]] = {
    Role.PREFILL: {Signal.QUEUE_DEPTH: _plus_where_exported(
        _SGLANG_QUEUE, _sum("sglang:num_prefill_bootstrap_queue_reqs", _SG))},
    Role.DECODE: {
        Signal.QUEUE_DEPTH: _plus_where_exported(
            _SGLANG_QUEUE, _sum("sglang:num_decode_prealloc_queue_reqs", _SG)),
        Signal.KV_TRANSFER_WAITING: _sum("sglang:num_decode_transfer_queue_reqs", _SG),
    },
}

# Dynamo (1.6.1): the frontend measures what users see; the decode worker re-exports its
# backend's series; the prefill worker exports only the runtime's own (no vllm:* at all).
_DYNAMO_FRONTEND: dict[Role, dict[Signal, str]] = {
    Role.PREFILL: {
        Signal.TTFT_P50_S: _q(0.5, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
        Signal.TTFT_P95_S: _q(0.95, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
        Signal.TTFT_P99_S: _q(0.99, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
        Signal.REQUEST_RATE: _rate("dynamo_frontend_requests_total", "$fe"),
        Signal.PROMPT_TOKENS_PER_S: _rate("dynamo_frontend_input_sequence_tokens_sum", "$fe"),
        Signal.PREFIX_CACHE_HIT_RATIO: _ratio(
            _rate("dynamo_frontend_cached_tokens_sum", "$fe"),
            _rate("dynamo_frontend_input_sequence_tokens_sum", "$fe")),
        # status="error" also counts requests the client got wrong or cancelled.
        Signal.ERROR_RATIO: _ratio(
            _rate("dynamo_frontend_requests_total",
                  '$fe,status="error",error_type!~"cancelled|not_found|validation"'),
            _rate("dynamo_frontend_requests_total", "$fe")),
        # The prefill workers' in-flight requests (waiting and in progress).
        Signal.QUEUE_DEPTH: _sum("dynamo_component_inflight_requests",
                                 '$wrk,dynamo_endpoint="generate"'),
    },
    Role.DECODE: {
        Signal.ITL_P50_S: _q(0.5, "dynamo_frontend_inter_token_latency_seconds", "$fe"),
        Signal.ITL_P95_S: _q(0.95, "dynamo_frontend_inter_token_latency_seconds", "$fe"),
        Signal.E2E_P95_S: _q(0.95, "dynamo_frontend_request_duration_seconds", "$fe"),
        Signal.REQUEST_RATE: _rate("dynamo_frontend_requests_total", "$fe"),
        Signal.GENERATION_TOKENS_PER_S: _rate("dynamo_frontend_output_tokens_total", "$fe"),
    },
}
_DYNAMO_DECODE_WORKER_SIGNALS = (
    Signal.QUEUE_DEPTH, Signal.RUNNING_REQUESTS, Signal.KV_CACHE_USAGE_RATIO,
    Signal.KV_CACHE_USAGE_MAX_RATIO, Signal.PREEMPTIONS_PER_S,
)

_TGI: dict[Signal, str] = {
    Signal.QUEUE_DEPTH: "sum by (namespace) (tgi_queue_size{$eng})",
    Signal.RUNNING_REQUESTS: "sum by (namespace) (tgi_batch_current_size{$eng})",
    Signal.ITL_P50_S: _q(0.5, "tgi_request_mean_time_per_token_duration"),
    Signal.ITL_P95_S: _q(0.95, "tgi_request_mean_time_per_token_duration"),
    Signal.E2E_P95_S: _q(0.95, "tgi_request_duration"),
    Signal.REQUEST_RATE: _rate("tgi_request_count"),
    Signal.PROMPT_TOKENS_PER_S: _rate("tgi_request_input_length_sum"),
    Signal.GENERATION_TOKENS_PER_S: _rate("tgi_request_generated_tokens_sum"),
    Signal.ERROR_RATIO: _ratio(_rate("tgi_request_failure"), _rate("tgi_request_count")),
}

_MIB = "1048576"
XID_WINDOW = "15m"
"""How long an XID event counts: longer than the XID alert's `for` (1 minute by default) and
a few scrapes, short enough that a pod later scheduled on the GPU does not inherit it."""
_GPU_AND_TARGETS: dict[Signal, str] = {
    Signal.GPU_UTILIZATION_RATIO: "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{$gpu}) / 100",
    Signal.GPU_MEMORY_USED_BYTES: f"sum by (namespace) (DCGM_FI_DEV_FB_USED{{$gpu}}) * {_MIB}",
    Signal.GPU_MEMORY_FREE_BYTES: f"sum by (namespace) (DCGM_FI_DEV_FB_FREE{{$gpu}}) * {_MIB}",
    # FB_RESERVED is in dcgm-exporter's default counters but not in older ones or every
    # custom counters file: without it the ratio reads used / (used + free) instead of
    # going empty (and the memory alert silent).
    Signal.GPU_MEMORY_USED_MAX_RATIO: (
        "max by (namespace) (DCGM_FI_DEV_FB_USED{$gpu} / (DCGM_FI_DEV_FB_USED{$gpu} + "
        "DCGM_FI_DEV_FB_FREE{$gpu} + (DCGM_FI_DEV_FB_RESERVED{$gpu} or "
        "DCGM_FI_DEV_FB_USED{$gpu} * 0)))"),
    Signal.GPU_TEMPERATURE_MAX_CELSIUS: "max by (namespace) (DCGM_FI_DEV_GPU_TEMP{$gpu})",
    # The gauge holds the last XID code, not a count: it stays set after the event, and a pod
    # scheduled on that GPU later would inherit it (and be drained). The code counts while it
    # changed within the window: the event, not the GPU's history. dcgm-exporter reports 0
    # until the first XID, so the first one is a change.
    Signal.GPU_XID_ERRORS: (
        f"max by (namespace, pod, gpu) (DCGM_FI_DEV_XID_ERRORS{{$gpu}} and "
        f"changes(DCGM_FI_DEV_XID_ERRORS{{$gpu}}[{XID_WINDOW}]) > 0)"),
    Signal.TARGETS_UP: "sum by (namespace) (up{$tgt})",
    Signal.TARGETS: "count by (namespace) (up{$tgt})",
}

# A gauge every replica of the pool exports on every scrape: the age of its newest sample is
# the age of the pool's data. Once a target dies Prometheus marks its series stale at the next
# failed scrape, so the age goes absent within one scrape interval, while a rate() over 5m of
# the same target would read as demand falling for five minutes.
_LIVENESS: dict[Engine, tuple[str, str]] = {
    Engine.VLLM: ("vllm:num_requests_running", "eng"),
    Engine.SGLANG: ("sglang:num_running_reqs", "eng"),
    Engine.TGI: ("tgi_queue_size", "eng"),
    # Both Dynamo workers export the runtime's gauge (a prefill worker has no vllm:* series).
    Engine.DYNAMO: ("dynamo_component_inflight_requests", "wrk"),
}


def _sample_age(metric: str, source: str) -> str:
    return f"time() - max by (namespace) (timestamp({metric}{{${source}}}))"

OPTIONAL_METRICS = frozenset({
    # Newer than some deployed engines: each has a fallback or is a signal of its own.
    "vllm:num_requests_waiting_by_reason", "vllm:prompt_tokens_by_source_total",
    # Only with a KV connector / in P/D mode.
    "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_kv_expired_reqs_total",
    "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs", "sglang:num_transfer_failed_reqs_total",
    "sglang:num_bootstrap_failed_reqs_total",
    # Counters that appear with their first event.
    "vllm:num_preemptions_total", "sglang:num_retracted_requests_total",
    "sglang:num_aborted_requests_total", "sglang:cached_tokens_total",
    "dynamo_frontend_cached_tokens_sum",
})
"""Raw series that may be absent without anything being wrong (an older engine, a feature not
in use, a counter with no event yet): ``pdscale check`` reports them without failing."""

# Histogram (base name) behind each SLO, per engine: the SLO error ratio is read at the bucket
# whose upper bound is the SLO threshold.
_SLO_HISTOGRAMS: dict[Engine, dict[str, tuple[str, str]]] = {
    Engine.VLLM: {"ttft": ("vllm:time_to_first_token_seconds", "$eng"),
                  "itl": ("vllm:inter_token_latency_seconds", "$eng")},
    Engine.SGLANG: {"ttft": ("sglang:time_to_first_token_seconds", "$eng"),
                    "itl": ("sglang:inter_token_latency_seconds", "$eng")},
    Engine.DYNAMO: {"ttft": ("dynamo_frontend_time_to_first_token_seconds", "$fe"),
                    "itl": ("dynamo_frontend_inter_token_latency_seconds", "$fe")},
    Engine.TGI: {"itl": ("tgi_request_mean_time_per_token_duration", "$eng")},
}
_SLO_ROLE = {"ttft": Role.PREFILL, "itl": Role.DECODE}


GPU_SIGNALS = frozenset({Signal.GPU_UTILIZATION_RATIO, Signal.GPU_MEMORY_USED_BYTES,
                         Signal.GPU_MEMORY_FREE_BYTES, Signal.GPU_MEMORY_USED_MAX_RATIO,
                         Signal.GPU_TEMPERATURE_MAX_CELSIUS, Signal.GPU_XID_ERRORS})
"""The gpu signal group: the DCGM exporter's series. A service that declares no GPU metrics
(``gpu_metrics: false``) has none of them: no recording rule, alert, check row or absence
alert reads them."""


def _engine_table(service: ServiceSpec, role: Role) -> dict[Signal, str]:
    if service.engine is Engine.VLLM:
        table = dict(_VLLM)
    elif service.engine is Engine.SGLANG:
        table = {**_SGLANG, **_SGLANG_ROLE[role]}
    elif service.engine is Engine.TGI:
        table = dict(_TGI)
    else:
        backend = {**_SGLANG, **_SGLANG_ROLE[role]} if service.dynamo is not None and \
            service.dynamo.backend == "sglang" else _VLLM
        table = {}
        if role is Role.DECODE:
            table = {s: backend[s] for s in _DYNAMO_DECODE_WORKER_SIGNALS if s in backend}
        table.update(_DYNAMO_FRONTEND[role])
    table.update({s: e for s, e in _GPU_AND_TARGETS.items()
                  if service.gpu_metrics or s not in GPU_SIGNALS})
    table[Signal.SAMPLE_AGE_S] = _sample_age(*_LIVENESS[service.engine])
    table.update(_recent(table, role))
    return table


def dispersion_window_samples(series: str, range_: str) -> str:
    """PromQL: per series, the samples the median :data:`DISPERSION_WINDOW` window held over
    ``range_`` (the dispersion needs two: what its recording rule and ``pdscale check`` read)."""
    w = DISPERSION_WINDOW
    return f"quantile_over_time(0.5, count_over_time({series}[{w}])[{range_}:{w}])"


_RATE_SUM = re.compile(r"sum by \((?P<by>[^)]*)\) \(rate\((?P<series>.+)\[\$w\]\)\)")


def _dispersion(rate: str) -> str | None:
    """The index of dispersion of the tokens a ``_rate`` expression counts, per
    :data:`DISPERSION_WINDOW` over the rate window (see there); None for another form.

    y(t) = the counter's increase over the window ending at t (clamped at 0: a restarted pod
    loses one window's tokens instead of adding a negative one); the dispersion is
    avg((y(t) - y(t - w))^2) / 2 / avg(y), at the window's resolution, kept only while the
    median window of every series held two samples (a coarser scrape aliases; the median, so
    a pod's first window, which may hold one, does not blank the pool for five minutes); an
    idle rate window records nothing."""
    found = _RATE_SUM.fullmatch(rate)
    if found is None:
        return None
    by, x, w = found["by"], found["series"], DISPERSION_WINDOW
    now = f"clamp_min({x} - {x} offset {w}, 0)"
    before = f"clamp_min({x} offset {w} - {x} offset {2 * DISPERSION_WINDOW_S:g}s, 0)"
    y = f"sum by ({by}) ({now})"
    dy = f"sum by ({by}) ({now} - {before})"
    return (f"avg_over_time(({dy} ^ 2)[$w:{w}]) / 2 / (avg_over_time(({y})[$w:{w}]) > 0) "
            f"and on () (min({dispersion_window_samples(x, '$w')}) >= 2)")


def _recent(table: Mapping[Signal, str], role: Role) -> dict[Signal, str]:
    """The recent signals, from the same expressions over :data:`RECENT_WINDOW`: the TTFT and
    ITL p95 of the last minute (what an alert reaction checks before it adds capacity), and the
    highest one-minute prompt-token rate over the rate window (a subquery at the rule group's
    evaluation interval); for prefill pools also the index of dispersion of the counted prompt
    tokens per :data:`DISPERSION_WINDOW` (:func:`_dispersion`), which only the prefill tail
    model reads."""
    def recent(signal: Signal) -> str:
        # Only the window: the selectors ($eng, $wrk, ...) stay for pool_expr to fill.
        return Template(table[signal]).safe_substitute(w=RECENT_WINDOW)

    out = {}
    if Signal.TTFT_P95_S in table:
        out[Signal.TTFT_P95_RECENT_S] = recent(Signal.TTFT_P95_S)
    if Signal.ITL_P95_S in table:
        out[Signal.ITL_P95_RECENT_S] = recent(Signal.ITL_P95_S)
    if Signal.PROMPT_TOKENS_PER_S in table:
        out[Signal.PROMPT_TOKENS_PEAK_PER_S] = \
            f"max_over_time(({recent(Signal.PROMPT_TOKENS_PER_S)})[$w:])"
        fine = _dispersion(table[Signal.PROMPT_TOKENS_PER_S])
        if role is Role.PREFILL and fine is not None:
            out[Signal.PROMPT_TOKENS_DISPERSION] = fine
    return out


def engine_signals(service: ServiceSpec, role: Role) -> frozenset[Signal]:
    """The signals that can be recorded for this pool of this service."""
    return frozenset(_engine_table(service, role))


def _matchers(pairs: list[tuple[str, str, str]]) -> str:
    return ",".join(f"{k}{op}{_quote(v)}" for k, op, v in pairs)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_DYNAMO_COMPONENT = {Role.PREFILL: "prefill", Role.DECODE: "backend"}
"""dynamo_component of a Dynamo worker by role (dynamo/vllm/args.py: decode is "backend")."""


def _selector_pairs(service: ServiceSpec, role: Role) -> dict[str, list[tuple[str, str, str]]]:
    pool = service.pools[role]
    ns = ("namespace", "=", service.namespace)
    pod = ("pod", "=~", pool.pod_regex)
    extra = [(k, "=", v) for k, v in sorted(pool.selector.match_labels.items())]
    eng = [ns, pod]
    if service.engine in (Engine.VLLM, Engine.SGLANG, Engine.DYNAMO):
        eng.append(("model_name", "=", service.model_name))
    wrk = [ns, pod]
    if service.dynamo is not None:
        # The runtime writes the namespace into its series' label with '-' as '_' (seen on
        # Dynamo 1.6.1: DYN_NAMESPACE=llama-disagg -> dynamo_namespace="llama_disagg").
        wrk.append(("dynamo_namespace", "=", dynamo_label_namespace(service.dynamo.namespace)))
    wrk.append(("dynamo_component", "=",
                pool.selector.dynamo_component or _DYNAMO_COMPONENT[role]))
    return {
        "eng": eng + extra,
        "wrk": wrk + extra,
        "fe": [ns, ("model", "=", service.model_name)],
        "gpu": [ns, pod],
        "tgt": [ns, pod],
        # pdscale's own re-export of the pool's request spans: its pool labels, exact.
        "otlp": [("pdscale_service", "=", service.name), ("pdscale_pool", "=", role.value)],
    }


def dynamo_label_namespace(namespace: str) -> str:
    """The ``dynamo_namespace`` label value Dynamo's runtime writes for a namespace."""
    return namespace.replace("-", "_")


def _selectors(service: ServiceSpec, role: Role) -> dict[str, str]:
    return {k: _matchers(v) for k, v in _selector_pairs(service, role).items()}


def pool_expr(signal: Signal | str, service: ServiceSpec, role: Role, *,
              window: str = RATE_WINDOW) -> str:
    """Raw PromQL for one signal of one pool, over the engine's own series."""
    table = _engine_table(service, role)
    try:
        key = Signal(signal)
    except ValueError:
        raise UnknownSignal(str(signal), service.engine, frozenset(table)) from None
    if key not in table:
        raise UnknownSignal(key.value, service.engine, frozenset(table))
    return Template(table[key]).substitute(_selectors(service, role), w=window)


Source = Literal["eng", "wrk", "fe", "gpu", "tgt", "otlp"]
SOURCE_NAMES: dict[str, str] = {
    "eng": "the pool's engine pods", "wrk": "the pool's Dynamo workers (runtime series)",
    "fe": "the Dynamo frontend", "gpu": "the DCGM exporter (the pool's GPUs)",
    "tgt": "the pool's scrape targets",
    "otlp": "pdscale's re-exported request-span histograms (its OTLP receiver)"}


@dataclass(frozen=True)
class SeriesRef:
    """One raw series a signal reads, with every label matcher that selects it."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]
    """(label, operator, value), in the order they are written."""
    source: Source
    optional: bool
    """May be absent with nothing wrong (see OPTIONAL_METRICS)."""

    def selector(self, matchers: Sequence[tuple[str, str, str]] | None = None) -> str:
        body = _matchers(list(self.matchers if matchers is None else matchers))
        return f"{self.metric}{{{body}}}"


_REF = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{\$(\w+)((?:,[^{}]*)?)\}")
_PAIR = re.compile(r'(\w+)(=~|!=|!~|=)"((?:[^"\\]|\\.)*)"')


def series_refs(signal: Signal | str, service: ServiceSpec, role: Role) -> list[SeriesRef]:
    """The raw series behind one signal of one pool (each once, in reading order)."""
    table = _engine_table(service, role)
    key = Signal(signal)
    if key not in table:
        raise UnknownSignal(key.value, service.engine, frozenset(table))
    pairs = _selector_pairs(service, role)
    out: list[SeriesRef] = []
    for match in _REF.finditer(table[key]):
        metric, source, extra = match.groups()
        matchers = [*pairs[source],
                    *((k, op, v.replace('\\"', '"')) for k, op, v in _PAIR.findall(extra))]
        ref = SeriesRef(metric, tuple(matchers), source,  # type: ignore[arg-type]
                        metric in OPTIONAL_METRICS)
        if ref not in out:
            out.append(ref)
    return out


def slo_bucket_ref(service: ServiceSpec, kind: Literal["ttft", "itl"]) -> SeriesRef | None:
    """The bucket series the SLO error ratio reads (with its ``le`` matcher), or None."""
    histogram = _SLO_HISTOGRAMS[service.engine].get(kind)
    if histogram is None:
        return None
    metric, sel = histogram
    threshold = service.slo.threshold_s(kind)
    pairs = _selector_pairs(service, _SLO_ROLE[kind])[sel.lstrip("$")]
    op, value = _le_pair(threshold)
    return SeriesRef(f"{metric}_bucket", (*pairs, ("le", op, value)),
                     sel.lstrip("$"), False)  # type: ignore[arg-type]


def _le_pair(threshold_s: float) -> tuple[str, str]:
    text = le_matcher(threshold_s)
    op = "=~" if text.startswith("le=~") else "="
    value = text.split('"', 1)[1].rsplit('"', 1)[0].replace("\\\\", "\\")
    return op, value


def le_matcher(threshold_s: float) -> str:
    """Match a bucket's ``le`` label whether the client wrote '1' or '1.0'."""
    text = f"{threshold_s:g}"
    if "e" in text:
        text = repr(float(threshold_s))
    if "." not in text:
        return f'le=~"{text}(\\\\.0)?"'
    return f'le="{text}"'


# --------------------------------------------------------------------------------------------
# Span-derived recording rules: the histograms pdscale re-exports from the engines' request
# spans (SPAN_HISTOGRAM_SERIES) read like an engine's, so alerts and dashboards run on span
# data where the spec reads latency from OTLP, and TTFT splits into its stages.

STAGE_SIGNALS: dict[Signal, str] = {
    Signal.TTFT_QUEUE_P95_S: "queue",
    Signal.TTFT_PREFILL_P95_S: "prefill",
    Signal.TTFT_TRANSFER_P95_S: "transfer",
}
"""TTFT by stage: signal -> the stage of the request span it is the 95th percentile of."""

_SPAN: dict[Signal, str] = {
    Signal.TTFT_P50_S: _q(0.5, SPAN_HISTOGRAM_SERIES["ttft"], "$otlp"),
    Signal.TTFT_P95_S: _q(0.95, SPAN_HISTOGRAM_SERIES["ttft"], "$otlp"),
    Signal.TTFT_P99_S: _q(0.99, SPAN_HISTOGRAM_SERIES["ttft"], "$otlp"),
    Signal.TTFT_P95_RECENT_S: Template(_q(0.95, SPAN_HISTOGRAM_SERIES["ttft"], "$otlp"))
    .safe_substitute(w=RECENT_WINDOW),
    **{signal: _q(0.95, SPAN_HISTOGRAM_SERIES[stage], "$otlp")
       for signal, stage in STAGE_SIGNALS.items()},
    Signal.ITL_P50_S: _q(0.5, SPAN_HISTOGRAM_SERIES["itl"], "$otlp"),
    Signal.ITL_P95_S: _q(0.95, SPAN_HISTOGRAM_SERIES["itl"], "$otlp"),
    Signal.E2E_P95_S: _q(0.95, SPAN_HISTOGRAM_SERIES["e2e"], "$otlp"),
}

_SPAN_STAGES: dict[Engine, frozenset[Signal]] = {
    Engine.VLLM: frozenset(STAGE_SIGNALS),
    Engine.SGLANG: frozenset({Signal.TTFT_PREFILL_P95_S}),
}
"""The TTFT stages each engine's request span gives (tests/telemetry/reference/
engine_spans.json): vLLM's ``llm_request`` has its queue and prefill time, the transfer is the
rest of TTFT; SGLang's request span has no queue time (its prefill counts from dispatch), so
neither a queue nor a transfer stage."""


def span_signals(spec: Spec, service: ServiceSpec, role: Role) -> frozenset[Signal]:
    """The signals of this pool whose recording rules read pdscale's re-exported span
    histograms: while the spec runs the OTLP receiver, TTFT by stage where the engine's spans
    give it, and each latency signal the spec reads from OTLP (or both)."""
    controller = spec.controller
    if not controller.otlp_receiving:
        return frozenset()
    sources = controller.signal_sources
    return _SPAN_STAGES.get(service.engine, frozenset()) | frozenset(
        s for s in _SPAN if s not in STAGE_SIGNALS and sources.source(s.value) != "prometheus")


def recorded_expr(spec: Spec, signal: Signal | str, service: ServiceSpec, role: Role) -> str:
    """PromQL of the recording rule of one signal of one pool: over the engine's series
    (:func:`pool_expr`), over the re-exported span histogram where the spec reads the signal
    from OTLP, or for ``both`` the span value where there is one and the engine's else (as the
    controller reads them)."""
    key = Signal(signal)
    if key not in span_signals(spec, service, role):
        return pool_expr(key, service, role)
    span = Template(_SPAN[key]).substitute(_selectors(service, role), w=RATE_WINDOW)
    if key in STAGE_SIGNALS or key not in _engine_table(service, role) or \
            spec.controller.signal_sources.source(key.value) == "otlp":
        return span
    return f"({span}) or ({pool_expr(key, service, role)})"


def slo_source(spec: Spec, kind: Literal["ttft", "itl"]) -> SignalSource:
    """Where the SLO error ratios of ``kind`` are read: the source of its p95 signal
    (``ttft_p95_s``, ``itl_p95_s``) while the OTLP receiver runs, else Prometheus."""
    if not spec.controller.otlp_receiving:
        return "prometheus"
    return spec.controller.signal_sources.source(f"{kind}_p95_s")


def slo_error_ratio_record(kind: Literal["ttft", "itl"], window: str) -> str:
    return f"pdscale_pool:{kind}_slo_errors:ratio_rate{window}"


def _slo_series(service: ServiceSpec, kind: Literal["ttft", "itl"], *, spans: bool = False
                ) -> tuple[str, str] | None:
    """The pool's SLO histogram series: its bucket at the SLO threshold and its count, as
    selectors (None when the engine has no histogram for ``kind``); with ``spans``, those of
    pdscale's re-exported span histogram."""
    histogram = (SPAN_HISTOGRAM_SERIES[kind], "$otlp") if spans \
        else _SLO_HISTOGRAMS[service.engine].get(kind)
    if histogram is None:
        return None
    metric, sel = histogram
    selectors = _selectors(service, _SLO_ROLE[kind])
    bucket = f"{metric}_bucket{{{sel},{le_matcher(service.slo.threshold_s(kind))}}}"
    return (Template(bucket).substitute(selectors),
            Template(f"{metric}_count{{{sel}}}").substitute(selectors))


def _from_sources(service: ServiceSpec, kind: Literal["ttft", "itl"], source: SignalSource,
                  expr: Callable[[tuple[str, str]], str]) -> str | None:
    """``expr`` over the SLO histogram ``source`` names: the engine's, the re-exported span
    histogram's, or for ``both`` the span value where there is one and the engine's else."""
    engine = _slo_series(service, kind)
    spans = _slo_series(service, kind, spans=True)
    assert spans is not None
    if source == "prometheus":
        return None if engine is None else expr(engine)
    if source == "otlp" or engine is None:
        return expr(spans)
    return f"({expr(spans)}) or ({expr(engine)})"


def slo_error_ratio_expr(service: ServiceSpec, kind: Literal["ttft", "itl"],
                         window: str, *, source: SignalSource = "prometheus") -> str | None:
    """Share of requests slower than the SLO threshold over a window, or None when the
    histogram ``source`` names (:func:`slo_source`) does not exist for it."""
    def ratio(series: tuple[str, str]) -> str:
        bucket, count = series
        good = f"sum by (namespace) (rate({bucket}[{window}]))"
        total = f"sum by (namespace) (rate({count}[{window}]))"
        return f"1 - ({good} / ({total} > 0))"
    return _from_sources(service, kind, source, ratio)


def slo_bucket_record(kind: Literal["ttft", "itl"]) -> str:
    return f"pdscale_pool:{kind}_slo_bucket:series"


def slo_bucket_expr(service: ServiceSpec, kind: Literal["ttft", "itl"], *,
                    source: SignalSource = "prometheus") -> str | None:
    """How many series of the SLO histogram have a bucket at the SLO threshold (None when the
    histogram ``source`` names does not exist for it). Absent while the histogram itself is
    there, the engine runs with buckets that miss the threshold and every SLO error ratio is
    empty."""
    return _from_sources(service, kind, source,
                         lambda series: f"count by (namespace) ({series[0]})")


def signal_def(signal: Signal | str) -> SignalDef:
    return _BY_SIGNAL[Signal(signal)]


def recorded_name(signal: Signal | str) -> str:
    return _BY_SIGNAL[Signal(signal)].series


def pool_query(signal: Signal | str, *, matchers: str = "", by: str = "") -> str:
    """A query over the recorded (or exported) series of a signal for every pool at once.

    ``matchers`` is added inside the braces (for example a Grafana variable filter).
    ``by`` lists extra grouping labels for control-plane counters read through rate().
    """
    d = _BY_SIGNAL[Signal(signal)]
    sel = "{" + matchers + "}" if matchers else ""
    if d.rate:
        group = ", ".join((*POOL_LABELS, *([by] if by else [])))
        return f"sum by ({group}) (rate({d.series}{sel}[$__rate_interval]))"
    return f"{d.series}{sel}"


def _metric_names_of(expr: str) -> set[str]:
    return metric_names_in(Template(expr).safe_substitute(
        eng="", wrk="", fe="", gpu="", tgt="", w="5m"))


_PROMQL_WORDS = frozenset({
    "sum", "avg", "max", "min", "count", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "offset", "bool", "rate", "irate", "increase",
    "delta", "idelta", "deriv", "histogram_quantile", "absent", "absent_over_time",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "quantile_over_time", "clamp_min", "clamp_max", "clamp", "time",
    "vector", "scalar", "label_replace", "label_join", "topk", "bottomk", "abs", "ceil",
    "floor", "round", "sort", "sort_desc", "predict_linear", "timestamp", "changes",
    "resets", "quantile", "stddev", "stdvar", "count_values", "group", "inf", "nan",
    "humanize", "humanizePercentage", "humanizeDuration",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (a lexical scan, enough for our own output)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _BRACKETS.sub("", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\$\w+", "", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word in _PROMQL_WORDS:
            continue
        # A function call is an identifier followed by '('.
        rest = text[match.end():].lstrip()
        if rest.startswith("(") and ":" not in word:
            continue
        names.add(word)
    return names


def _known_metrics() -> frozenset[str]:
    names: set[str] = set()
    tables = (_VLLM, _SGLANG, *_SGLANG_ROLE.values(), *_DYNAMO_FRONTEND.values(), _TGI,
              _GPU_AND_TARGETS)
    for table in tables:
        for expr in table.values():
            names |= _metric_names_of(expr)
    names |= {metric for metric, _ in _LIVENESS.values()}
    for hist in _SLO_HISTOGRAMS.values():
        for metric, _ in hist.values():
            names |= {metric + "_bucket", metric + "_count"}
    names |= {d.series for d in _DEFS if d.series} | _CONTROLLER_OWN | _OTLP_OWN
    names |= {slo_error_ratio_record(k, w) for k in ("ttft", "itl") for w in SLO_WINDOWS}
    names |= {slo_bucket_record(k) for k in ("ttft", "itl")}
    names |= {SLO_OBJECTIVE_RECORD, SLO_THRESHOLD_RECORD}
    return frozenset(names)


KNOWN_METRICS = _known_metrics()
"""Every metric name that pdscale's generated rules, dashboards and queries may read."""

