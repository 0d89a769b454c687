"""Self-instrumentation of the controller: OpenTelemetry metrics, exported in Prometheus format on
``/metrics``, and a trace span per tick with a child span per step.

Metric names are those the generated autoscaler dashboard and alerts query
(``telemetry.CONTROL_PLANE_METRICS``); every pool series carries ``namespace``, ``model_name``,
``pdscale_service`` and ``pdscale_pool``. Each controller gets its own registry, so two in one
process (tests) do not mix. Spans go to an OTLP exporter when one is configured
(``OTEL_EXPORTER_OTLP_ENDPOINT`` and the ``opentelemetry-exporter-otlp`` package), and to any
span processor a caller adds (tests use an in-memory one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NoOpTracer, Tracer
from prometheus_client import CollectorRegistry, generate_latest

from pdscale.spec import PoolKey, Spec
from pdscale.telemetry._catalog import SPAN_HISTOGRAM_SERIES, Signal
from pdscale.telemetry._otlp import OtlpStore

__all__ = ["SPAN_HISTOGRAMS", "ControllerTelemetry"]


SPAN_HISTOGRAMS = {stage: (SPAN_HISTOGRAM_SERIES[stage], help_) for stage, help_ in (
    ("ttft", "Time to first token from the engines' request spans"),
    ("queue", "Time in the engine's queue before the prefill, from request spans"),
    ("prefill", "Prefill time to the first token, from request spans"),
    ("transfer", "Time to first token outside the queue and the prefill (KV transfer, "
                 "tokenisation), from request spans"),
    ("itl", "Mean time per output token of each request, from request spans"),
    ("e2e", "End-to-end request latency from request spans"))}
"""Stage -> (series, help) of the re-exported span histograms."""


class _SpanHistograms:
    """A prometheus_client collector over the OTLP store's stage histograms."""

    def __init__(self, store: OtlpStore, labels: Any) -> None:
        self._store = store
        self._labels = labels

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import HistogramMetricFamily

        histograms = self._store.histograms()
        for stage, (name, help_) in SPAN_HISTOGRAMS.items():
            family = HistogramMetricFamily(name, help_, labels=[
                "namespace", "model_name", "pdscale_service", "pdscale_pool"])
            for key, stages in sorted(histograms.items()):
                h = stages[stage]
                if not h.count:  # a stage this pool's spans do not give: no series, not zeros
                    continue
                labels = self._labels(key)
                # ``le`` as Python clients write it (0.5, 1.0), which le_matcher matches.
                buckets = [(repr(float(b)), float(c))
                           for b, c in zip(h.bounds, h.counts, strict=True)]
                buckets.append(("+Inf", float(h.count)))
                family.add_metric([labels.get("namespace", ""), labels.get("model_name", ""),
                                   key[0], key[1].value], buckets, h.sum_s)
            yield family


class _Gauge:
    """A gauge whose values are read at collection time (an OpenTelemetry observable gauge):
    setting one during a tick is a dict write, not an SDK call (100 pools x a dozen gauges
    would otherwise cost tens of milliseconds a tick)."""

    def __init__(self, meter: Any, name: str, *, unit: str = "", description: str) -> None:
        self._values: dict[tuple[tuple[str, str], ...], float] = {}
        meter.create_observable_gauge(name, callbacks=[self._observe], unit=unit,
                                      description=description)

    def set(self, value: float, attributes: Mapping[str, str]) -> None:
        self._values[tuple(sorted(attributes.items()))] = float(value)

    def discard(self, attributes: Mapping[str, str]) -> None:
        self._values.pop(tuple(sorted(attributes.items())), None)

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, dict(k)) for k, v in list(self._values.items())]


log = logging.getLogger("pdscale.controller")

_ERROR_KINDS = (("prometheus", "unavailable"), ("prometheus", "rejected"),
                ("prometheus", "warmup"), ("kubernetes", "unavailable"),
                ("kubernetes", "rejected"), ("forecaster", "error"), ("actuator", "error"),
                ("lease", "unavailable"), ("lease", "rejected"), ("policy", "error"),
                ("source", "error"))
_TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)
_DRAIN_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class ControllerTelemetry:
    def __init__(self, spec: Spec | None, *, identity: str = "pdscale",
                 span_processors: tuple[SpanProcessor, ...] = ()) -> None:
        self.registry = CollectorRegistry()
        resource = Resource.create({"service.name": "pdscale", "service.instance.id": identity})
        reader = PrometheusMetricReader(registry=self.registry, disable_target_info=True)
        self.meter_provider = MeterProvider(metric_readers=[reader], resource=resource)
        self.tracer_provider = TracerProvider(resource=resource)
        for processor in span_processors:
            self.tracer_provider.add_span_processor(processor)
        exporting = self._maybe_otlp() or bool(span_processors)
        # Spans nobody receives cost a tick 0.5 ms of SDK work (a 14-day simulation, 40 s):
        # without an exporter or a processor the tracer records nothing.
        self.tracer: Tracer = self.tracer_provider.get_tracer("pdscale.controller") \
            if exporting else NoOpTracer()
        self._labels: dict[PoolKey, dict[str, str]] = {}
        self._sample_seen: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}
        """Per engine-sample-age series: (when its age was last known, that age)."""
        for svc in spec.services if spec is not None else ():
            for role in svc.pools:
                self._labels[(svc.name, role)] = {
                    "namespace": svc.namespace, "model_name": svc.model_name,
                    "pdscale_service": svc.name, "pdscale_pool": role.value}
        m = self.meter_provider.get_meter("pdscale.controller")
        self.desired = _Gauge(m, "pdscale_desired_replicas",
                              description="Replicas the controller wants")
        self.ready = _Gauge(m, "pdscale_ready_replicas",
                            description="Replicas ready according to Kubernetes")
        self.forecast = _Gauge(
            m,
            "pdscale_forecast_demand",
            description="Forecast demand per horizon (seconds ahead) and quantile; prefill in "
                        "prompt tokens/s, decode in generated tokens/s")
        self.observed = _Gauge(m, "pdscale_observed_demand",
                               description="Demand the last decision saw")
        self.cold_start = _Gauge(m, "pdscale_cold_start_p90_seconds", unit="s",
                                 description="Learned 90th-percentile cold start")
        self.decisions = m.create_counter(
            "pdscale_decisions", description="Decisions by cause (reason) and direction")
        self.last_decision = _Gauge(
            m,
            "pdscale_last_decision_timestamp_seconds", unit="s",
            description="When the controller last decided for the pool")
        self.staleness = _Gauge(
            m,
            "pdscale_data_staleness_seconds", unit="s",
            description="Age of the newest sample behind each input signal")
        self.gpus = _Gauge(m, "pdscale_gpus_allocated",
                           description="GPUs held by the pool's replicas")
        self.budget = _Gauge(m, "pdscale_gpu_budget",
                             description="GPUs the spec allows across all pools")
        self.tick_duration = m.create_histogram(
            "pdscale_tick_duration_seconds", unit="s", description="Reconcile tick duration",
            explicit_bucket_boundaries_advisory=list(_TICK_BUCKETS))
        self.adapter_errors = m.create_counter(
            "pdscale_adapter_errors", description="Failed calls by adapter (prometheus, "
            "kubernetes, forecaster, lease) and kind")
        self.leader = _Gauge(m, "pdscale_leader",
                             description="1 while this replica holds the lease")
        self.reactions = m.create_counter(
            "pdscale_alert_reactions",
            description="Alertmanager webhook reactions by action, alert and outcome")
        self.alerts_received = m.create_counter(
            "pdscale_alerts_received", description="Alerts received by severity and status")
        self._drain_instruments(m)
        self.otlp_accepted = m.create_counter(
            "pdscale_otlp_accepted", description="Request spans and metric points the OTLP "
            "receiver took, by item (spans, points)")
        self.otlp_dropped = m.create_counter(
            "pdscale_otlp_dropped", description="Request spans and metric points the OTLP "
            "receiver dropped, by item and reason (unknown_pool, invalid_timing, clock_skew, "
            "...)")
        self.otlp_refused = m.create_counter(
            "pdscale_otlp_refused", description="OTLP export requests refused, by reason "
            "(auth, malformed, content_type, too_large, buffer_full, exposed)")
        if spec is not None and spec.gpu_budget is not None:
            self.budget.set(spec.gpu_budget, {})
        # Counters start at 0 (Prometheus practice), so the first error shows up in rate().
        for adapter, kind in _ERROR_KINDS:
            self.adapter_errors.add(0, {"adapter": adapter, "kind": kind})

    def _maybe_otlp(self) -> bool:
        """Export spans over OTLP when the environment asks for it; whether it does."""
        if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return True

    def labels(self, key: PoolKey) -> dict[str, str]:
        return self._labels.get(key, {"pdscale_service": key[0], "pdscale_pool": key[1].value})

    def record_decision(self, key: PoolKey, *, desired: int, cause: str,
                        detail: Mapping[str, Any], current: int, ready: int,
                        gpus_per_replica: int, cold_start_p90_s: float | None,
                        forecast: Mapping[str, Any] | None, now_s: float) -> None:
        labels = self.labels(key)
        self.desired.set(desired, labels)
        self.ready.set(ready, labels)
        self.gpus.set(current * gpus_per_replica, labels)
        self.last_decision.set(now_s, labels)
        direction = "up" if desired > current else "down" if desired < current else "hold"
        self.decisions.add(1, {**labels, "reason": cause, "direction": direction})
        demand = detail.get("demand")
        if isinstance(demand, int | float):
            self.observed.set(demand, labels)
        if cold_start_p90_s is not None:
            self.cold_start.set(cold_start_p90_s, labels)
        if forecast:
            horizons = forecast.get("horizons_s", [])
            for quantile, values in forecast.get("quantiles", {}).items():
                for horizon, value in zip(horizons, values, strict=False):
                    self.forecast.set(value, {**labels, "quantile": quantile,
                                              "horizon_s": f"{horizon:g}"})

    def record_staleness(self, key: PoolKey, signal: Signal, age_s: float | None, *,
                         now_s: float) -> None:
        """The age of a signal's newest sample at ``now_s``. For the pool's engine samples
        (``Signal.SAMPLE_AGE_S``) an unknown age (Prometheus unreachable, every target gone)
        keeps growing from the last one known (or from the first tick that had none), so
        ``PDScaleControlPlaneDegraded`` fires instead of reading the last good age forever.
        For another signal, an unknown age drops its series (an optional signal the engine
        does not export has no age)."""
        labels = {**self.labels(key), "signal": signal.value}
        if signal is Signal.SAMPLE_AGE_S:
            self._sample_age(labels, age_s, now_s)
        elif age_s is not None:
            self.staleness.set(age_s, labels)
        else:
            self.staleness.discard(labels)

    def _sample_age(self, labels: dict[str, str], age_s: float | None, now_s: float) -> None:
        k = tuple(sorted(labels.items()))
        if age_s is not None:
            self._sample_seen[k] = (now_s, age_s)
        else:
            seen_at, age = self._sample_seen.setdefault(k, (now_s, 0.0))
            age_s = age + max(0.0, now_s - seen_at)
        self.staleness.set(age_s, labels)

    def staleness_unknown(self, now_s: float) -> None:
        """The source failed as a whole this tick: every pool that has reported its engine
        samples' age reports it unknown (see :meth:`record_staleness`)."""
        for k in list(self._sample_seen):
            self._sample_age(dict(k), None, now_s)

    def record_error(self, adapter: str, kind: str) -> None:
        self.adapter_errors.add(1, {"adapter": adapter, "kind": kind})

    def _drain_instruments(self, m: Any) -> None:
        """Scale-down drains (controller._drain): the ``pdscale_drain_*`` series."""
        self.drain_replicas = _Gauge(m, "pdscale_drain_replicas",
                                     description="Replicas out of routing, draining before "
                                                 "their removal")
        self.drain_ended = m.create_counter(
            "pdscale_drain_ended", description="Drains ended, by outcome: drained, timeout "
            "(removed still holding work), taken_back, abandoned")
        self.drain_duration = m.create_histogram(
            "pdscale_drain_duration_seconds", unit="s",
            description="From leaving routing to the end of the drain, by outcome",
            explicit_bucket_boundaries_advisory=list(_DRAIN_BUCKETS))
        self.drain_cut_requests = m.create_counter(
            "pdscale_drain_cut_requests", description="Requests still running or waiting on "
            "replicas removed at the drain timeout")
        self.drain_timeouts_in_a_row = _Gauge(
            m, "pdscale_drain_timeouts_in_a_row",
            description="The pool's drains in a row that ended at the timeout")
        # Every pool's series exist from the start (at 0), so the first drain shows in
        # increase() and the dashboards and alerts never read an absent series as no drain.
        for labels in self._labels.values():
            self.drain_replicas.set(0, labels)
            self.drain_timeouts_in_a_row.set(0, labels)
            self.drain_cut_requests.add(0, labels)
            for outcome in ("drained", "timeout"):
                self.drain_ended.add(0, {**labels, "outcome": outcome})

    def record_drain(self, key: PoolKey, *, outcome: str, duration_s: float | None,
                     held_requests: float | None, timeouts_in_a_row: int) -> None:
        labels = self.labels(key)
        self.drain_ended.add(1, {**labels, "outcome": outcome})
        if duration_s is not None:
            self.drain_duration.record(max(0.0, duration_s), {**labels, "outcome": outcome})
        if held_requests:
            self.drain_cut_requests.add(held_requests, labels)
        self.drain_timeouts_in_a_row.set(timeouts_in_a_row, labels)

    def record_draining(self, key: PoolKey, replicas: int) -> None:
        self.drain_replicas.set(replicas, self.labels(key))

    def export_span_histograms(self, store: OtlpStore) -> None:
        """Re-export the OTLP store's span-derived latency histograms on ``/metrics``
        (``pdscale_otlp_*_seconds``, buckets at the service's latency buckets, which hold its
        SLO threshold), so recording rules and alerts can read span data too."""
        self.registry.register(_SpanHistograms(store, self.labels))

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
