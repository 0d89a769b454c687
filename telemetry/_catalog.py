"""The signal catalog: for each engine, each signal as PromQL over one pool's series.

Design. Alerts, dashboards and the controller never name an engine's metrics themselves: they
ask this module. Each engine's raw expressions are recorded once per pool by recording rules
named ``level:metric:operation`` (shared/REFERENCE.md §2), labelled with ``pdscale_service``,
``pdscale_pool`` and ``model_name`` from the spec, so that everything downstream queries one
engine-agnostic series per signal and all pools at once with a single query. A signal an
engine does not export is absent from its table, never guessed; asking for it raises
:class:`UnknownSignal` naming the engine and the signals it has.

Only current metric names are used (vLLM V1, SGLang, Dynamo frontend, TGI, DCGM exporter
defaults; shared/REFERENCE.md §1). Where the pool's series come from:

* vLLM, SGLang: each pool's own pods, selected by ``namespace``, a ``pod`` regex (default
  ``<scale target name>-.*``), ``model_name`` and any extra labels in the spec. A prefill
  instance's TTFT is its queueing plus prefill time, which is what scaling prefill controls.
* Dynamo: latency, request and token signals from the frontend (``dynamo_frontend_*``,
  selected by ``dynamo_namespace``), attributed to the prefill pool for TTFT and to the decode
  pool for ITL; queue, KV and prefix-cache signals from the workers, which re-export their
  backend engine's series.
* TGI: no TTFT histogram; ITL is TGI's per-request mean time per token; no KV-cache, prefix-
  cache or preemption series.
* GPUs: DCGM exporter series with the Kubernetes pod mapping (``namespace``, ``pod``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from string import Template
from typing import Literal

from pdscale.spec import Engine, Role, ServiceSpec

__all__ = [
    "CONTROL_PLANE_METRICS",
    "KNOWN_METRICS",
    "POOL_LABELS",
    "RATE_WINDOW",
    "RATE_WINDOW_S",
    "SLO_OBJECTIVE_RECORD",
    "SLO_THRESHOLD_RECORD",
    "SLO_WINDOWS",
    "Signal",
    "SignalDef",
    "UnknownSignal",
    "derive_signals",
    "engine_signals",
    "le_matcher",
    "metric_names_in",
    "pool_expr",
    "pool_query",
    "recorded_name",
    "signal_def",
    "slo_error_ratio_expr",
    "slo_error_ratio_record",
]

POOL_LABELS = ("pdscale_service", "pdscale_pool")
"""Labels that the recording rules (and pdscale's own metrics) put on every pool series."""

RATE_WINDOW = "5m"
"""Window of every rate and latency percentile the recording rules record (the ``rate5m`` in
their names). The controller reads those series; the simulator computes its signals over the
same window, so a policy sees the same smoothing in both worlds."""
RATE_WINDOW_S = 300.0
""":data:`RATE_WINDOW` in seconds."""

SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
"""Windows of the SLO error-ratio recording rules used by the multi-window burn-rate alerts."""

SLO_OBJECTIVE_RECORD = "pdscale_pool:slo_objective:ratio"
"""The SLO objective as a constant series per pool, so dashboards can compute burn rates."""
SLO_THRESHOLD_RECORD = "pdscale_pool:slo_latency_threshold:seconds"
"""The pool's latency SLO threshold (TTFT for prefill, ITL for decode) as a constant series."""


class Signal(StrEnum):
    QUEUE_DEPTH = "queue_depth"
    RUNNING_REQUESTS = "running_requests"
    TTFT_P50_S = "ttft_p50_s"
    TTFT_P95_S = "ttft_p95_s"
    TTFT_P99_S = "ttft_p99_s"
    ITL_P50_S = "itl_p50_s"
    ITL_P95_S = "itl_p95_s"
    E2E_P95_S = "e2e_p95_s"
    REQUEST_RATE = "request_rate"
    PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"
    GENERATION_TOKENS_PER_S = "generation_tokens_per_s"
    PREFIX_CACHE_HIT_RATIO = "prefix_cache_hit_ratio"
    EXTERNAL_PREFIX_CACHE_HIT_RATIO = "external_prefix_cache_hit_ratio"
    KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
    KV_CACHE_USAGE_MAX_RATIO = "kv_cache_usage_max_ratio"
    PREEMPTIONS_PER_S = "preemptions_per_s"
    ERROR_RATIO = "error_ratio"
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
    _d(Signal.RUNNING_REQUESTS, "pdscale_pool:requests_running:sum", "short",
       "Requests being processed"),
    _d(Signal.TTFT_P50_S, "pdscale_pool:time_to_first_token_seconds:p50_rate5m", "s",
       "Time to first token, median over 5m"),
    _d(Signal.TTFT_P95_S, "pdscale_pool:time_to_first_token_seconds:p95_rate5m", "s",
       "Time to first token, 95th percentile over 5m"),
    _d(Signal.TTFT_P99_S, "pdscale_pool:time_to_first_token_seconds:p99_rate5m", "s",
       "Time to first token, 99th percentile over 5m"),
    _d(Signal.ITL_P50_S, "pdscale_pool:inter_token_latency_seconds:p50_rate5m", "s",
       "Inter-token latency, median over 5m"),
    _d(Signal.ITL_P95_S, "pdscale_pool:inter_token_latency_seconds:p95_rate5m", "s",
       "Inter-token latency, 95th percentile over 5m"),
    _d(Signal.E2E_P95_S, "pdscale_pool:e2e_request_latency_seconds:p95_rate5m", "s",
       "End-to-end request latency, 95th percentile over 5m"),
    _d(Signal.REQUEST_RATE, "pdscale_pool:requests:rate5m", "reqps",
       "Finished requests per second"),
    _d(Signal.PROMPT_TOKENS_PER_S, "pdscale_pool:prompt_tokens:rate5m", "short",
       "Prompt tokens per second"),
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
       "Last XID error code per GPU (0: none)", scope="gpu"),
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
       "Observed demand (prefill: uncached prompt tokens/s; decode: sequences)",
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
    "pdscale_capacity_per_replica", "pdscale_tick_duration_seconds_bucket",
    "pdscale_tick_duration_seconds_count", "pdscale_tick_duration_seconds_sum",
    "pdscale_adapter_errors_total", "pdscale_leader", "pdscale_alert_reactions_total",
    "pdscale_alerts_received_total"})
"""Series the controller exports about itself (not per pool): health, tick time, leadership,
alert reactions."""

CONTROL_PLANE_METRICS = frozenset(d.series for d in _DEFS if d.scope == "control") | \
    _CONTROLLER_OWN


def derive_signals(values: Mapping[Signal, float | None]) -> dict[Signal, float | None]:
    """``values`` with the derived signals added: the mean prompt and output lengths over the
    rate window (for the capacity model's attention and KV terms, and the Dynamo planner's
    sizing). None where the request rate or the token rate is missing or zero."""
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
# Engine tables. $eng: the pool's engine series; $fe: the Dynamo frontend; $gpu: DCGM series of
# the pool's pods; $tgt: the pool's scrape targets; $w: the rate window.


def _q(q: float, metric: str, sel: str = "$eng") -> str:
    return (f"histogram_quantile({q}, sum by (le, namespace) "
            f"(rate({metric}_bucket{{{sel}}}[$w])))")


def _rate(metric: str, sel: str = "$eng") -> str:
    return f"sum by (namespace) (rate({metric}{{{sel}}}[$w]))"


def _ratio(num: str, den: str) -> str:
    """A ratio that is empty, not zero or NaN, when the denominator saw no traffic."""
    return f"{num} / ({den} > 0)"


_VLLM: dict[Signal, str] = {
    Signal.QUEUE_DEPTH: "sum by (namespace) (vllm:num_requests_waiting{$eng})",
    Signal.RUNNING_REQUESTS: "sum by (namespace) (vllm:num_requests_running{$eng})",
    Signal.TTFT_P50_S: _q(0.5, "vllm:time_to_first_token_seconds"),
    Signal.TTFT_P95_S: _q(0.95, "vllm:time_to_first_token_seconds"),
    Signal.TTFT_P99_S: _q(0.99, "vllm:time_to_first_token_seconds"),
    Signal.ITL_P50_S: _q(0.5, "vllm:inter_token_latency_seconds"),
    Signal.ITL_P95_S: _q(0.95, "vllm:inter_token_latency_seconds"),
    Signal.E2E_P95_S: _q(0.95, "vllm:e2e_request_latency_seconds"),
    Signal.REQUEST_RATE: _rate("vllm:request_success_total"),
    Signal.PROMPT_TOKENS_PER_S: _rate("vllm:prompt_tokens_total"),
    Signal.GENERATION_TOKENS_PER_S: _rate("vllm:generation_tokens_total"),
    Signal.PREFIX_CACHE_HIT_RATIO: _ratio(_rate("vllm:prefix_cache_hits_total"),
                                          _rate("vllm:prefix_cache_queries_total")),
    Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO: _ratio(
        _rate("vllm:external_prefix_cache_hits_total"),
        _rate("vllm:external_prefix_cache_queries_total")),
    Signal.KV_CACHE_USAGE_RATIO: "avg by (namespace) (vllm:kv_cache_usage_perc{$eng})",
    Signal.KV_CACHE_USAGE_MAX_RATIO: "max by (namespace) (vllm:kv_cache_usage_perc{$eng})",
    Signal.PREEMPTIONS_PER_S: _rate("vllm:num_preemptions_total"),
    # vLLM counts finished requests by reason; an aborted request is the failure it exports.
    Signal.ERROR_RATIO: _ratio(_rate("vllm:request_success_total", '$eng,finished_reason="abort"'),
                               _rate("vllm:request_success_total")),
}

_SGLANG: dict[Signal, str] = {
    Signal.QUEUE_DEPTH: "sum by (namespace) (sglang:num_queue_reqs{$eng})",
    Signal.RUNNING_REQUESTS: "sum by (namespace) (sglang:num_running_reqs{$eng})",
    Signal.TTFT_P50_S: _q(0.5, "sglang:time_to_first_token_seconds"),
    Signal.TTFT_P95_S: _q(0.95, "sglang:time_to_first_token_seconds"),
    Signal.TTFT_P99_S: _q(0.99, "sglang:time_to_first_token_seconds"),
    Signal.ITL_P50_S: _q(0.5, "sglang:inter_token_latency_seconds"),
    Signal.ITL_P95_S: _q(0.95, "sglang:inter_token_latency_seconds"),
    Signal.E2E_P95_S: _q(0.95, "sglang:e2e_request_latency_seconds"),
    Signal.REQUEST_RATE: _rate("sglang:num_requests_total"),
    Signal.PROMPT_TOKENS_PER_S: _rate("sglang:prompt_tokens_total"),
    Signal.GENERATION_TOKENS_PER_S: _rate("sglang:generation_tokens_total"),
    Signal.PREFIX_CACHE_HIT_RATIO: "avg by (namespace) (sglang:cache_hit_rate{$eng})",
    Signal.KV_CACHE_USAGE_RATIO: "avg by (namespace) (sglang:token_usage{$eng})",
    Signal.KV_CACHE_USAGE_MAX_RATIO: "max by (namespace) (sglang:token_usage{$eng})",
    Signal.ERROR_RATIO: _ratio(_rate("sglang:num_aborted_requests_total"),
                               _rate("sglang:num_requests_total")),
}

# Dynamo: the frontend measures what users see; workers re-export their backend's series.
_DYNAMO_FRONTEND: dict[Signal, str] = {
    Signal.TTFT_P50_S: _q(0.5, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
    Signal.TTFT_P95_S: _q(0.95, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
    Signal.TTFT_P99_S: _q(0.99, "dynamo_frontend_time_to_first_token_seconds", "$fe"),
    Signal.ITL_P50_S: _q(0.5, "dynamo_frontend_inter_token_latency_seconds", "$fe"),
    Signal.ITL_P95_S: _q(0.95, "dynamo_frontend_inter_token_latency_seconds", "$fe"),
    Signal.REQUEST_RATE: _rate("dynamo_frontend_requests_total", "$fe"),
    Signal.PROMPT_TOKENS_PER_S: _rate("dynamo_frontend_input_sequence_tokens_sum", "$fe"),
    Signal.GENERATION_TOKENS_PER_S: _rate("dynamo_frontend_output_sequence_tokens_sum", "$fe"),
    Signal.ERROR_RATIO: _ratio(_rate("dynamo_frontend_requests_total", '$fe,status="error"'),
                               _rate("dynamo_frontend_requests_total", "$fe")),
}
_DYNAMO_WORKER_SIGNALS = (
    Signal.QUEUE_DEPTH, Signal.RUNNING_REQUESTS, Signal.PREFIX_CACHE_HIT_RATIO,
    Signal.KV_CACHE_USAGE_RATIO, Signal.KV_CACHE_USAGE_MAX_RATIO, Signal.PREEMPTIONS_PER_S,
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
_GPU_AND_TARGETS: dict[Signal, str] = {
    Signal.GPU_UTILIZATION_RATIO: "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{$gpu}) / 100",
    Signal.GPU_MEMORY_USED_BYTES: f"sum by (namespace) (DCGM_FI_DEV_FB_USED{{$gpu}}) * {_MIB}",
    Signal.GPU_MEMORY_FREE_BYTES: f"sum by (namespace) (DCGM_FI_DEV_FB_FREE{{$gpu}}) * {_MIB}",
    Signal.GPU_MEMORY_USED_MAX_RATIO: (
        "max by (namespace) (DCGM_FI_DEV_FB_USED{$gpu} / (DCGM_FI_DEV_FB_USED{$gpu} + "
        "DCGM_FI_DEV_FB_FREE{$gpu} + DCGM_FI_DEV_FB_RESERVED{$gpu}))"),
    Signal.GPU_TEMPERATURE_MAX_CELSIUS: "max by (namespace) (DCGM_FI_DEV_GPU_TEMP{$gpu})",
    Signal.GPU_XID_ERRORS: "max by (namespace, pod, gpu) (DCGM_FI_DEV_XID_ERRORS{$gpu})",
    Signal.TARGETS_UP: "sum by (namespace) (up{$tgt})",
    Signal.TARGETS: "count by (namespace) (up{$tgt})",
}

# A gauge every replica of the pool exports on every scrape: the age of its newest sample is
# the age of the pool's data. Once a target dies Prometheus marks its series stale at the next
# failed scrape, so the age goes absent within one scrape interval, while a rate() over 5m of
# the same target would read as demand falling for five minutes.
_LIVENESS: dict[Engine, str] = {
    Engine.VLLM: "vllm:num_requests_running",
    Engine.SGLANG: "sglang:num_running_reqs",
    Engine.TGI: "tgi_queue_size",
    Engine.DYNAMO: "dynamo_component_inflight_requests",
}


def _sample_age(metric: str) -> str:
    return f"time() - max by (namespace) (timestamp({metric}{{$eng}}))"


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


def _engine_table(service: ServiceSpec, role: Role) -> dict[Signal, str]:
    if service.engine is Engine.VLLM:
        table = dict(_VLLM)
    elif service.engine is Engine.SGLANG:
        table = dict(_SGLANG)
    elif service.engine is Engine.TGI:
        table = dict(_TGI)
    else:
        backend = _VLLM if service.dynamo is None or service.dynamo.backend == "vllm" \
            else _SGLANG
        table = {s: backend[s] for s in _DYNAMO_WORKER_SIGNALS if s in backend}
        # Frontend latencies belong to the pool that controls them.
        for signal, expr in _DYNAMO_FRONTEND.items():
            if signal.value.startswith("ttft") and role is not Role.PREFILL:
                continue
            if signal.value.startswith("itl") and role is not Role.DECODE:
                continue
            if signal in (Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S,
                          Signal.GENERATION_TOKENS_PER_S, Signal.ERROR_RATIO) \
                    and role is not Role.PREFILL:
                # Service-wide frontend counters are recorded once, on the prefill pool.
                continue
            table[signal] = expr
    table.update(_GPU_AND_TARGETS)
    table[Signal.SAMPLE_AGE_S] = _sample_age(_LIVENESS[service.engine])
    return table


def engine_signals(service: ServiceSpec, role: Role) -> frozenset[Signal]:
    """The signals that can be recorded for this pool of this service."""
    return frozenset(_engine_table(service, role))


def _matchers(pairs: list[tuple[str, str, str]]) -> str:
    return ",".join(f"{k}{op}{_quote(v)}" for k, op, v in pairs)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _selectors(service: ServiceSpec, role: Role) -> dict[str, str]:
    pool = service.pools[role]
    ns = ("namespace", "=", service.namespace)
    pod = ("pod", "=~", pool.pod_regex)
    eng = [ns, pod]
    if service.engine in (Engine.VLLM, Engine.SGLANG):
        eng.append(("model_name", "=", service.model_name))
    if pool.selector.dynamo_component is not None:
        eng.append(("dynamo_component", "=", pool.selector.dynamo_component))
    eng += [(k, "=", v) for k, v in sorted(pool.selector.match_labels.items())]
    fe = [ns]
    if service.dynamo is not None:
        fe.append(("dynamo_namespace", "=", service.dynamo.namespace))
    return {
        "eng": _matchers(eng),
        "fe": _matchers(fe),
        "gpu": _matchers([ns, pod]),
        "tgt": _matchers([ns, pod]),
    }


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


def le_matcher(threshold_s: float) -> str:
    """Match a bucket's ``le`` label whether the client wrote '1' or '1.0'."""
    text = f"{threshold_s:g}"
    if "e" in text:
        text = repr(float(threshold_s))
    if "." not in text:
        return f'le=~"{text}(\\\\.0)?"'
    return f'le="{text}"'


def slo_error_ratio_record(kind: Literal["ttft", "itl"], window: str) -> str:
    return f"pdscale_pool:{kind}_slo_errors:ratio_rate{window}"


def slo_error_ratio_expr(service: ServiceSpec, kind: Literal["ttft", "itl"],
                         window: str) -> str | None:
    """Share of requests slower than the SLO threshold over a window, or None when the engine
    has no histogram for it."""
    histogram = _SLO_HISTOGRAMS[service.engine].get(kind)
    if histogram is None:
        return None
    metric, sel = histogram
    threshold = service.slo.ttft_p95_s if kind == "ttft" else service.slo.itl_p95_s
    selectors = _selectors(service, _SLO_ROLE[kind])
    good = Template(f"sum by (namespace) (rate({metric}_bucket{{{sel},{le_matcher(threshold)}}}"
                    f"[{window}]))").substitute(selectors)
    total = Template(f"sum by (namespace) (rate({metric}_count{{{sel}}}[{window}]))") \
        .substitute(selectors)
    return f"1 - ({good} / ({total} > 0))"


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
        eng="", fe="", gpu="", tgt="", w="5m"))


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
    for table in (_VLLM, _SGLANG, _DYNAMO_FRONTEND, _TGI, _GPU_AND_TARGETS):
        for expr in table.values():
            names |= _metric_names_of(expr)
    names |= set(_LIVENESS.values())
    for hist in _SLO_HISTOGRAMS.values():
        for metric, _ in hist.values():
            names |= {metric + "_bucket", metric + "_count"}
    names |= {d.series for d in _DEFS if d.series} | _CONTROLLER_OWN
    names |= {slo_error_ratio_record(k, w) for k in ("ttft", "itl") for w in SLO_WINDOWS}
    names |= {SLO_OBJECTIVE_RECORD, SLO_THRESHOLD_RECORD}
    return frozenset(names)


KNOWN_METRICS = _known_metrics()
"""Every metric name that pdscale's generated rules, dashboards and queries may read."""

