"""The OTLP span source: ingest speed on one core, memory for many pools, and the quantile
error of the span sketch against Prometheus histograms.

    python bench/otlp.py [--pools 1000] [--spans 200000] [--out bench/results/otlp.json]

* ingest: vLLM-shaped request spans, 512 to an export request (the SDK's default batch),
  protobuf-decoded and taken by ``OtlpStore.ingest_traces``: what the receiver's ingest
  thread does per request, in this process on one core (the HTTP/gRPC servers' own cost is
  not in it).
* memory: RSS growth once every pool of ``--pools`` holds a full 5-minute window of spans.
* accuracy: TTFT samples (a log-normal body with a heavy tail, seeded) read as p50/p95/p99
  by the sketch and by ``histogram_quantile`` over vLLM's and Dynamo's default TTFT buckets,
  each against the exact order statistic (relative error).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdscale._engines import DYNAMO_BUCKET_DEFAULTS, ENGINE_HISTOGRAM_BUCKETS, dynamo_buckets
from pdscale.spec import parse_spec
from pdscale.telemetry import OtlpStore, Signal
from pdscale.telemetry._otlp_metrics import histogram_quantile


def _spec(pools: int) -> str:
    services = "\n".join(
        f"  - {{name: s{i}, namespace: ns{i}, engine: vllm, model_name: m, "
        f"slo: {{ttft_p95_s: 0.5, itl_p95_s: 0.05}}, pools: {{"
        f"prefill: {{target: {{name: s{i}-p}}, max_replicas: 4}}, "
        f"decode: {{target: {{name: s{i}-d}}, max_replicas: 4}}}}}}"
        for i in range((pools + 1) // 2))
    return f"version: 1\nservices:\n{services}\n"


def _requests(service: int, role: str, n: int, now: float, rng: random.Random) -> bytes:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({
        "k8s.namespace.name": f"ns{service}", "k8s.pod.name": f"s{service}-{role[0]}-0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.tracing.otel")
    for i in range(n):
        ttft = rng.lognormvariate(-1.5, 0.6)
        end = now - rng.uniform(0, 280)
        span = tracer.start_span("llm_request", start_time=int((end - ttft - 1) * 1e9))
        span.set_attributes({
            "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": ttft + 1.0,
            "gen_ai.latency.time_in_queue": ttft * 0.3,
            "gen_ai.latency.time_in_model_prefill": ttft * 0.6,
            "gen_ai.latency.time_in_model_decode": 1.0,
            "gen_ai.latency.time_in_model_inference": 1.0 + ttft * 0.6,
            "gen_ai.usage.prompt_tokens": 1000 + i, "gen_ai.usage.completion_tokens": 100,
            "gen_ai.request.id": f"r{i}"})
        span.end(end_time=int(end * 1e9))
    data: bytes = encode_spans(exporter.get_finished_spans()).SerializeToString()
    return data


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def ingest(total_spans: int, batch: int = 512) -> dict[str, float]:
    spec = parse_spec(_spec(2))
    now = time.time()
    store = OtlpStore(spec, started_s=now - 600)
    body = _requests(0, "prefill", batch, now, random.Random(1))
    n = max(1, total_spans // batch)
    per_request: list[float] = []
    start = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        store.ingest_traces(message, now)
        per_request.append(time.perf_counter() - t0)
    cpu = time.process_time() - start
    per_request.sort()
    return {"spans": n * batch, "spans_per_s_one_core": n * batch / cpu,
            "request_bytes": len(body), "batch": batch,
            "p50_request_ms": per_request[len(per_request) // 2] * 1e3,
            "p99_request_ms": per_request[int(0.99 * (len(per_request) - 1))] * 1e3}


def memory(pools: int, spans_per_pool: int = 300) -> dict[str, float]:
    spec = parse_spec(_spec(pools))
    now = time.time()
    rng = random.Random(2)
    bodies = [(_requests(i // 2, "prefill" if i % 2 == 0 else "decode", spans_per_pool, now,
                         rng)) for i in range(min(pools, 4))]
    gc.collect()
    before = _rss()
    store = OtlpStore(spec, started_s=now - 600)
    for i in range(pools):
        message = ExportTraceServiceRequest()
        message.ParseFromString(bodies[i % len(bodies)])
        # the same spans, re-homed to pool i's resource
        for rs in message.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key == "k8s.namespace.name":
                    kv.value.string_value = f"ns{i // 2}"
                if kv.key == "k8s.pod.name":
                    kv.value.string_value = f"s{i // 2}-{'p' if i % 2 == 0 else 'd'}-0"
        store.ingest_traces(message, now)
    gc.collect()
    grown = _rss() - before
    t0 = time.perf_counter()
    store.read(spec, [Signal.TTFT_P95_S, Signal.TTFT_P95_RECENT_S, Signal.ITL_P95_S,
                      Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S], at_s=now)
    read_s = time.perf_counter() - t0
    return {"pools": pools, "spans_per_pool": spans_per_pool,
            "rss_mib": grown / 2**20, "kib_per_pool": grown / pools / 1024,
            "read_all_pools_s": read_s, "accepted": store.accepted_spans}


def accuracy(samples: int = 200_000, seed: int = 0) -> list[dict[str, float | str]]:
    from fastdigest import TDigest

    rng = random.Random(seed)
    values = [rng.lognormvariate(math.log(0.3), 0.7) if rng.random() < 0.97
              else rng.lognormvariate(math.log(2.0), 0.5) for _ in range(samples)]
    exact = sorted(values)
    # The store keeps one digest per 30 s slot and merges ten of them for a 5 m window.
    slots = [TDigest(max_centroids=100) for _ in range(10)]
    for i, v in enumerate(values):
        slots[i % 10].update(v)
    merged = TDigest(max_centroids=100)
    for d in slots:
        merged.merge_inplace(d)
    tables = {"vllm": ENGINE_HISTOGRAM_BUCKETS["vllm"]["ttft"],
              "dynamo": dynamo_buckets(*DYNAMO_BUCKET_DEFAULTS["ttft"])}
    rows: list[dict[str, float | str]] = []
    for q in (0.5, 0.95, 0.99):
        truth = exact[min(len(exact) - 1, int(q * len(exact)))]
        row: dict[str, float | str] = {"quantile": f"p{round(q * 100)}", "exact_s": truth,
                                       "sketch_rel_err": merged.quantile(q) / truth - 1}
        for name, bounds in tables.items():
            counts = [0.0] * (len(bounds) + 1)
            for v in values:
                for i, b in enumerate(bounds):
                    if v <= b:
                        counts[i] += 1
                        break
                else:
                    counts[-1] += 1
            est = histogram_quantile(q, list(zip([*bounds, math.inf], counts, strict=True)))
            row[f"{name}_buckets_rel_err"] = (est or math.nan) / truth - 1
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--out", default="bench/results/otlp.json")
    args = parser.parse_args()
    result = {"ingest": ingest(args.spans), "memory": memory(args.pools),
              "accuracy": accuracy()}
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    i, m = result["ingest"], result["memory"]
    print(f"ingest: {i['spans_per_s_one_core']:,.0f} spans/s on one core "
          f"(512-span requests: p50 {i['p50_request_ms']:.1f} ms, p99 "
          f"{i['p99_request_ms']:.1f} ms)")
    print(f"memory: {m['rss_mib']:.0f} MiB for {m['pools']} pools "
          f"({m['kib_per_pool']:.0f} KiB each); reading them all: {m['read_all_pools_s']:.2f} s")
    print("quantile  exact (s)  sketch   vLLM buckets  Dynamo buckets")
    for row in result["accuracy"]:
        print(f"{row['quantile']:>8}  {row['exact_s']:9.3f}  {row['sketch_rel_err']:+7.2%}  "
              f"{row['vllm_buckets_rel_err']:+12.1%}  {row['dynamo_buckets_rel_err']:+14.1%}")


if __name__ == "__main__":
    main()
