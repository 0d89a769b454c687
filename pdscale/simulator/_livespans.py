"""Live mode's request spans: each simulated pod exports one vLLM-shaped ``llm_request`` span a
request over OTLP/HTTP, with the real OpenTelemetry SDK exporter, as vLLM does with
``--otlp-traces-endpoint`` (tests/telemetry/reference/engine_spans.json has the shape).

Design. In a P/D deployment a request passes through two engines, and each ends a span:

* its **prefill** pod's, when the first token is out (a P/D prefill request generates one
  token): time to first token from the request's arrival, ``time_in_queue`` until its prefill
  was taken up, ``time_in_model_prefill`` for the prefill itself, one completion token. TTFT
  beyond queue and prefill is the KV transfer and the hand-off to decode, the span reader's
  *transfer* stage. The same TTFT the live ``/metrics`` attributes to the prefill pod.
* its **decode** pod's, when the last token is out: time to first token, end to end, the
  decode time and the output tokens (so the reader's ITL is the request's mean gap). It has no
  queue or prefill time: those stages are the prefill pod's.

Span times are wall-clock (the controller's windows are), latencies simulated seconds (what
``/metrics`` reports too). Each pod is a resource with ``k8s.namespace.name`` and
``k8s.pod.name``, as OTEL_RESOURCE_ATTRIBUTES from the downward API gives a vLLM pod, so the
spec's default pool selectors find it. Spans go through the SDK's ``BatchSpanProcessor``: a
bounded queue exported every second from its own thread, dropping (and the SDK logging) what
does not fit, never blocking the simulation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdscale.simulator._event import EventSimulator
from pdscale.spec import Role

__all__ = ["SpanExport"]

_EXPORT_TIMEOUT_S = 2
"""An export's deadline, its retries included: loopback answers in milliseconds, and a
receiver that is gone holds a stopping simulator no longer than this (twice: the flush and
the export thread's last batch)."""
_MAX_QUEUE = 65536
"""Spans the batch processor holds before dropping (the SDK's default is 2048)."""


class SpanExport:
    """Ends the spans of the requests a step of the simulation finished, per simulated pod."""

    def __init__(self, sim: EventSimulator, *, endpoint: str, namespace: str,
                 pod_prefix: dict[Role, str], speed: float,
                 headers: dict[str, str] | None = None, processor: Any = None) -> None:
        """``processor``: the SDK span processor the pods' spans go to (default: a batch
        processor exporting to ``endpoint`` over OTLP/HTTP)."""
        self.sim = sim
        self.endpoint = endpoint
        self.namespace = namespace
        self.pod_prefix = pod_prefix
        self.speed = speed
        self.exporter: Any = None
        if processor is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self.exporter = OTLPSpanExporter(endpoint=endpoint, headers=headers,
                                             timeout=_EXPORT_TIMEOUT_S)
            processor = BatchSpanProcessor(self.exporter, max_queue_size=_MAX_QUEUE,
                                           schedule_delay_millis=1000)
        self.processor = processor
        self._tracers: dict[str, Any] = {}
        n = len(sim.arrival)
        self._sent = {Role.PREFILL: np.zeros(n, dtype=bool), Role.DECODE: np.zeros(n, dtype=bool)}
        self._first_unsent = {Role.PREFILL: 0, Role.DECODE: 0}
        self.spans = {Role.PREFILL: 0, Role.DECODE: 0}
        """Spans ended so far, per pool."""

    def _tracer(self, role: Role, replica: int) -> Any:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        pod = f"{self.pod_prefix[role]}-{replica}"
        tracer = self._tracers.get(pod)
        if tracer is None:
            provider = TracerProvider(resource=Resource.create({
                "service.name": self.pod_prefix[role], "k8s.namespace.name": self.namespace,
                "k8s.pod.name": pod, "vllm.instrumenting_module_name": "vllm.llm_engine"}))
            provider.add_span_processor(self.processor)
            tracer = self._tracers[pod] = provider.get_tracer("vllm.tracing.otel")
        return tracer

    def _due(self, role: Role, done_at: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Indices of requests done (``done_at`` set) whose ``role`` span is not out yet;
        requests finish roughly in arrival order, so the scan starts at the oldest unsent."""
        sim = self.sim
        lo = self._first_unsent[role]
        hi = int(np.searchsorted(sim.arrival, sim.now, side="right"))
        sent = self._sent[role]
        due = lo + np.flatnonzero(~np.isnan(done_at[lo:hi]) & ~sent[lo:hi])
        sent[due] = True
        unsent = np.flatnonzero(~sent[lo:hi])
        self._first_unsent[role] = lo + int(unsent[0]) if len(unsent) else hi
        return due

    def emit(self, wall_now_s: float) -> None:
        """End the spans of the requests that got their first token or finished since the
        last call (call with the simulator's lock held; the export runs on its own thread)."""
        from opentelemetry.trace import SpanKind

        sim = self.sim
        end_ns = int(wall_now_s * 1e9)
        for req in self._due(Role.PREFILL, sim.first_token):
            ttft = float(sim.first_token[req] - sim.arrival[req])
            queue = max(0.0, float(sim.prefill_start[req] - sim.arrival[req]))
            prefill = max(0.0, min(float(sim.prefill_end[req] - sim.prefill_start[req]),
                                   ttft - queue))
            span = self._tracer(Role.PREFILL, int(sim.prefilled_by[req])).start_span(
                "llm_request", kind=SpanKind.SERVER,
                start_time=end_ns - int(ttft / self.speed * 1e9))
            span.set_attributes({
                "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": ttft,
                "gen_ai.latency.time_in_queue": queue,
                "gen_ai.latency.time_in_model_prefill": prefill,
                "gen_ai.latency.time_in_model_decode": 0.0,
                "gen_ai.latency.time_in_model_inference": prefill,
                "gen_ai.usage.prompt_tokens": int(sim.prompt[req]),
                "gen_ai.usage.completion_tokens": 1,
                "gen_ai.request.id": f"cmpl-{req}", "gen_ai.request.max_tokens": 1})
            span.end(end_time=end_ns)
            self.spans[Role.PREFILL] += 1
        for req in self._due(Role.DECODE, sim.finish):
            ttft = float(sim.first_token[req] - sim.arrival[req])
            e2e = float(sim.finish[req] - sim.arrival[req])
            span = self._tracer(Role.DECODE, int(sim.decoded_by[req])).start_span(
                "llm_request", kind=SpanKind.SERVER,
                start_time=end_ns - int(e2e / self.speed * 1e9))
            span.set_attributes({
                "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                "gen_ai.latency.time_in_model_decode": max(0.0, e2e - ttft),
                "gen_ai.usage.prompt_tokens": int(sim.prompt[req]),
                "gen_ai.usage.completion_tokens": int(sim.output[req]),
                "gen_ai.request.id": f"cmpl-{req}"})
            span.end(end_time=end_ns)
            self.spans[Role.DECODE] += 1

    def close(self) -> None:
        """Export what is queued, then stop: each export gives up after its deadline (the
        receiver may be gone already, as when ``pdscale down`` stops the controller first),
        so a stopped simulator exits within its stop timeout; spans not sent by then are
        dropped."""
        self.processor.force_flush(timeout_millis=_EXPORT_TIMEOUT_S * 1000)
        if self.exporter is not None:
            self.exporter.shutdown()
        self.processor.shutdown()
