"""Request spans shaped as vLLM 0.34.0 and SGLang 0.5.23 end them (reference/engine_spans.json),
made with the real OpenTelemetry SDK and encoded by its OTLP encoder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

REFERENCE = json.loads((Path(__file__).parent / "reference" / "engine_spans.json").read_text())


@dataclass(frozen=True)
class Req:
    """One finished request's timings (seconds) and tokens."""

    end_s: float
    ttft_s: float
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.5
    prompt: int = 1000
    completion: int = 101
    e2e_s: float | None = None


def vllm_attributes(r: Req) -> dict[str, Any]:
    """vLLM 0.34.0's ``do_tracing`` attributes (vllm/v1/engine/output_processor.py)."""
    e2e = r.e2e_s if r.e2e_s is not None else r.ttft_s + r.decode_s
    return {
        "gen_ai.latency.time_to_first_token": r.ttft_s,
        "gen_ai.latency.e2e": e2e,
        "gen_ai.latency.time_in_queue": r.queue_s,
        "gen_ai.usage.prompt_tokens": r.prompt,
        "gen_ai.usage.completion_tokens": r.completion,
        "gen_ai.latency.time_in_model_prefill": r.prefill_s,
        "gen_ai.latency.time_in_model_decode": r.decode_s,
        "gen_ai.latency.time_in_model_inference": r.prefill_s + r.decode_s,
        "gen_ai.request.id": f"cmpl-{int(r.end_s * 1e6)}",
        "gen_ai.request.max_tokens": 256,
    }


def vllm_resource(pod: str, namespace: str = "llm", **extra: str) -> Resource:
    return Resource.create({"vllm.instrumenting_module_name": "vllm.llm_engine",
                            "vllm.process_id": "4242", "k8s.namespace.name": namespace,
                            "k8s.pod.name": pod, **extra})


def end_vllm_spans(provider: TracerProvider, reqs: Sequence[Req]) -> None:
    """End one ``llm_request`` span per request on ``provider``, as vLLM does."""
    tracer = provider.get_tracer("vllm.tracing.otel")
    for r in reqs:
        e2e = r.e2e_s if r.e2e_s is not None else r.ttft_s + r.decode_s
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER,
                                 start_time=int((r.end_s - e2e) * 1e9))
        span.set_attributes(vllm_attributes(r))
        span.end(end_time=int(r.end_s * 1e9))


def sglang_span(provider: TracerProvider, r: Req, *, finish: str = "stop") -> None:
    """SGLang 0.5.23's root request span (no queue time; prefill includes the queue)."""
    tracer = provider.get_tracer("sglang")
    span = tracer.start_span(f"prefill Req {int(r.end_s * 1e6) % 10**8:08d}",
                             start_time=int((r.end_s - r.ttft_s - r.decode_s) * 1e9),
                             attributes={"rid": "abc", "module": "sglang::request"})
    span.set_attributes({
        "gen_ai.usage.completion_tokens": r.completion, "gen_ai.usage.prompt_tokens": r.prompt,
        "gen_ai.usage.cached_tokens": r.prompt // 4, "gen_ai.request.id": "abc",
        "gen_ai.response.model": "m", "gen_ai.response.finish_reasons": json.dumps([finish]),
        "gen_ai.latency.time_to_first_token": r.ttft_s,
        "gen_ai.latency.e2e": r.ttft_s + r.decode_s,
        "gen_ai.latency.time_in_model_decode": r.decode_s,
        "gen_ai.latency.time_in_model_prefill": r.prefill_s})
    span.end(end_time=int(r.end_s * 1e9))


def recorded(resource: Resource) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def trace_request(groups: Mapping[Resource, Sequence[Req]], *,
                  raw: Sequence[tuple[Resource, dict[str, Any], str, float]] = (),
                  status_error: bool = False) -> Any:
    """An ``ExportTraceServiceRequest`` with vLLM spans for each resource, plus ``raw``
    spans (resource, attributes, name, end time) as given."""
    spans: list[ReadableSpan] = []
    for resource, reqs in groups.items():
        provider, exporter = recorded(resource)
        end_vllm_spans(provider, reqs)
        spans.extend(exporter.get_finished_spans())
    for resource, attrs, name, end_s in raw:
        provider, exporter = recorded(resource)
        span = provider.get_tracer("x").start_span(name, start_time=1)
        span.set_attributes(attrs)
        if status_error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=int(end_s * 1e9))
        spans.extend(exporter.get_finished_spans())
    return encode_spans(spans)
