"""The OTLP span source: ingest speed, export latency through the receiver, memory for many
pools, and the quantile error of the span sketch against Prometheus histograms.

    python bench/otlp.py [--pools 1000] [--spans 200000] [--seconds 20] [--rate 20000]
                         [--trace PATH] [--out bench/results/otlp.json]

* ingest: vLLM-shaped request spans, 512 to an export request (the SDK's default batch),
  protobuf-decoded and taken by ``OtlpStore.ingest_traces``: what the receiver's ingest
  thread does per request, in this process on one core (no HTTP/gRPC server).
* export: the receiver (``OtlpReceiver``: its HTTP and gRPC servers, buffer and ingest
  thread) in a process pinned to one core, and the real OpenTelemetry SDK exporters
  (``OTLPSpanExporter``, gRPC and HTTP) in this process pinned to the other, over loopback.
  Offered load: each of ``--rates`` spans/s in 512-span exports, each due at its time (open
  loop, eight exporters, so a slow export delays the next due ones and shows in their
  latency); the latency of an export is from when it was due to when the receiver answered.
  Then a closed loop (eight exporters back to back) for the most the receiver's core takes,
  and the generator's own CPU use and encoding cost, to tell which side limits. The
  receiver's answer comes once a request is decoded and buffered; ingestion follows on the
  same core, so spans/s counts what the store took, over the wall time until it was idle.
  Then the same runs with the same export requests encoded once beforehand and sent as bytes
  (``grpc-raw``: gRPC's Export method; ``http-raw``: a POST of the protobuf), which takes the
  SDK's encoding (about 20 ms a 512-span export) off the generator's core: the latency left
  is the receiver's and the loopback's.
* memory: RSS growth once every pool of ``--pools`` holds a full 5-minute window of spans.
* accuracy: the per-request TTFTs of a replayed trace (``--trace``, default the Azure LLM
  inference 2023 code trace from the shared traces, replayed through the event simulator with
  examples/vllm.yaml's first service under pdscale's policy): per 5-minute window, as the
  controller reads them, p50/p95/p99 by the span sketch (the store's 30 s slots merged) and by
  ``histogram_quantile`` over vLLM's and Dynamo's default TTFT buckets, each against the exact
  order statistic (relative error); and over the whole run.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import math
import multiprocessing
import os
import queue
import random
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    _spans(provider, n, now, rng, spread_s=280)  # over the 5-minute window
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


_BATCH = 512
_EXPORTERS = 8


def _receiver(conn: Any, http_port: int, grpc_port: int, cpu: int) -> None:
    """The receiver process: the controller's OTLP receiver and store on one core."""
    from pdscale.controller._otlp_receiver import OtlpReceiver
    from pdscale.spec import OtlpSettings

    os.sched_setaffinity(0, {cpu})
    spec = parse_spec(_spec(2))
    store = OtlpStore(spec, started_s=time.time() - 600)
    rx = OtlpReceiver(store, OtlpSettings(), now=time.time)
    rx.expose("127.0.0.1")
    rx.start("127.0.0.1", http_port=http_port, grpc_port=grpc_port)
    conn.send("ready")
    while (message := conn.recv()) != "stop":
        if message == "mark":  # before a run: what was taken so far, and the CPU used
            rx.drain(60)
            conn.send((store.accepted_spans, time.process_time(), time.monotonic(),
                       rx.snapshot()["refused"], dict(store.drops)))
        elif message == "idle":  # after a run: wait until the store took everything
            rx.drain(120)
            conn.send((store.accepted_spans, time.process_time(), time.monotonic(),
                       rx.snapshot()["refused"], dict(store.drops)))
    rx.stop()


def _spans(provider: TracerProvider, n: int, now: float, rng: random.Random, *,
           spread_s: float = 5.0) -> None:
    """End ``n`` vLLM-shaped ``llm_request`` spans on ``provider``, ending within
    ``spread_s`` before ``now``."""
    tracer = provider.get_tracer("vllm.tracing.otel")
    for i in range(n):
        ttft = rng.lognormvariate(-1.5, 0.6)
        end = now - rng.uniform(0, spread_s)
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


def _batches(n: int, now: float) -> list[list[Any]]:
    """``n`` batches of vLLM-shaped finished spans (the SDK's ReadableSpans) of the first
    prefill pool of :func:`_spec`, one engine pod each."""
    rng = random.Random(3)
    out = []
    for b in range(n):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({
            "k8s.namespace.name": "ns0", "k8s.pod.name": f"s0-p-{b}"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _spans(provider, _BATCH, now, rng)
        out.append(list(exporter.get_finished_spans()))
    return out


class _RawExporter:
    """The same export requests, encoded once beforehand and sent as bytes (gRPC's Export
    method, or a POST of application/x-protobuf): what the receiver sees is unchanged, the
    SDK's per-export encoding is gone from the generator's core."""

    def __init__(self, transport: str, port: int) -> None:
        self.transport = transport
        if transport == "grpc-raw":
            import grpc

            self.rpc_error = grpc.RpcError
            self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            self.call = self.channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        else:
            import requests

            self.session = requests.Session()
            self.url = f"http://127.0.0.1:{port}/v1/traces"

    def export(self, body: bytes) -> bool:
        if self.transport == "grpc-raw":
            try:
                self.call(body, timeout=10)
                return True
            except self.rpc_error:  # counted as a failed export
                return False
        resp = self.session.post(self.url, data=body, timeout=10,
                                 headers={"Content-Type": "application/x-protobuf"})
        return bool(resp.status_code == 200)

    def shutdown(self) -> None:
        if self.transport == "grpc-raw":
            self.channel.close()
        else:
            self.session.close()


def _exporter(transport: str, port: int) -> Any:
    if transport.endswith("-raw"):
        return _RawExporter(transport, port)
    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Counts added between two snapshots (those that grew)."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def _run_exports(transport: str, port: int, batches: Sequence[Any], seconds: float,
                 rate: float | None) -> dict[str, Any]:
    """Export ``batches`` round robin for ``seconds``: each due at ``rate`` spans/s (open
    loop), or back to back (``rate`` None). Latencies are from due (or start) to answer."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    due: queue.Queue[float | None] = queue.Queue()
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()
    start = time.monotonic()

    def work(k: int) -> None:
        exporter = _exporter(transport, port)
        i = k
        while True:
            if rate is None:
                if time.monotonic() - start >= seconds:
                    break
                at = time.monotonic()
            else:
                got = due.get()
                if got is None:
                    break
                at = got
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            batch = batches[i % len(batches)]
            ok = exporter.export(batch) if isinstance(exporter, _RawExporter) \
                else exporter.export(batch) is SpanExportResult.SUCCESS
            took = time.monotonic() - at
            with lock:
                latencies.append(took)
                failed[0] += not ok
            i += _EXPORTERS
        exporter.shutdown()

    cpu0 = time.process_time()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(_EXPORTERS)]
    for t in threads:
        t.start()
    if rate is not None:
        interval = _BATCH / rate
        for n in range(int(seconds / interval)):
            due.put(start + n * interval)
        for _ in threads:
            due.put(None)
    for t in threads:
        t.join()
    return {"exports": len(latencies), "failed_exports": failed[0],
            "p50_export_ms": _pct(latencies, 0.5) * 1e3,
            "p99_export_ms": _pct(latencies, 0.99) * 1e3,
            "max_export_ms": max(latencies) * 1e3 if latencies else math.nan,
            "sent_spans": len(latencies) * _BATCH, "wall_s": time.monotonic() - start,
            "generator_cpu_s": time.process_time() - cpu0}


def export(seconds: float = 20.0, rates: Sequence[float] = (5_000.0, 10_000.0, 20_000.0)
           ) -> dict[str, Any]:
    """Real SDK exporters -> the receiver over loopback, each on its own core: open loop at
    each of ``rates`` spans/s, then closed loop, per transport."""
    from pdscale._servers import free_port

    cores = sorted(os.sched_getaffinity(0))
    receiver_cpu, generator_cpu = cores[0], cores[-1]
    http_port, grpc_port = free_port(), free_port()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(child, http_port, grpc_port, receiver_cpu))
    proc.start()
    out: dict[str, Any] = {"receiver_cpu": receiver_cpu, "generator_cpu": generator_cpu,
                           "batch": _BATCH, "exporters": _EXPORTERS, "seconds": seconds,
                           "load_average_1m_before": os.getloadavg()[0], "runs": []}
    try:
        assert parent.recv() == "ready"
        os.sched_setaffinity(0, {generator_cpu})
        batches = _batches(16, time.time())
        # Where the generator's time goes: the SDK's encoding of one batch.
        t0 = time.process_time()
        for batch in batches:
            encode_spans(batch).SerializeToString()
        out["encode_ms_per_batch"] = (time.process_time() - t0) / len(batches) * 1e3
        for transport, port in (("grpc", grpc_port), ("http", http_port),
                                ("grpc-raw", grpc_port), ("http-raw", http_port)):
            for offered in (*rates, None):
                # Spans end just before each run: older ones would leave the store's window.
                batches = _batches(16, time.time())
                payload: Sequence[Any] = batches if not transport.endswith("-raw") else \
                    [encode_spans(batch).SerializeToString() for batch in batches]
                parent.send("mark")
                taken0, cpu0, wall0, refused0, drops0 = parent.recv()
                run = _run_exports(transport, port, payload, seconds, offered)
                parent.send("idle")
                taken1, cpu1, wall1, refused1, drops1 = parent.recv()
                taken = taken1 - taken0
                run.update(transport=transport, offered_spans_per_s=offered,
                           taken_spans=taken, refused=_delta(refused1, refused0),
                           dropped=_delta(drops1, drops0),
                           ingested_spans_per_s=taken / (wall1 - wall0),
                           receiver_cpu_s=cpu1 - cpu0,
                           spans_per_receiver_cpu_s=taken / max(cpu1 - cpu0, 1e-9))
                out["runs"].append(run)
    finally:
        os.sched_setaffinity(0, set(cores))
        parent.send("stop")
        proc.join(timeout=30)
    out["load_average_1m_after"] = os.getloadavg()[0]
    return out


def replay_ttfts(trace: str) -> tuple[list[float], list[float]]:
    """Per-request (finish time, TTFT) of ``trace`` replayed through the event simulator
    (examples/vllm.yaml's first service, pdscale's policy)."""
    import numpy as np

    from pdscale.simulator import SimOptions, prepare, run_world, world_for
    from pdscale.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "examples" / "vllm.yaml")
    options = SimOptions(trace=trace, policy="pdscale", mode="event")
    prepared = prepare(spec, options)
    world = world_for(prepared, options)
    run_world(world, prepared.policy, spec=prepared.spec, forecasts=prepared.forecasts)
    sim = world.sim  # type: ignore[attr-defined]
    ttft = sim.first_token - sim.arrival
    done = ~np.isnan(ttft)
    return list(sim.first_token[done]), list(ttft[done])


def _estimates(values: Sequence[float], slots: Sequence[int]
               ) -> dict[str, dict[float, float]]:
    """p50/p95/p99 of ``values``: exact, the store's sketch (one t-digest per slot, merged),
    and histogram_quantile over vLLM's and Dynamo's default TTFT buckets."""
    from fastdigest import TDigest

    digests: dict[int, TDigest] = {}
    for v, slot in zip(values, slots, strict=True):
        digests.setdefault(slot, TDigest(max_centroids=100)).update(v)
    merged = TDigest(max_centroids=100)
    for d in digests.values():
        merged.merge_inplace(d)
    exact = sorted(values)
    qs = (0.5, 0.95, 0.99)
    out: dict[str, dict[float, float]] = {
        "exact": {q: exact[min(len(exact) - 1, int(q * len(exact)))] for q in qs},
        "sketch": {q: merged.quantile(q) for q in qs}}
    tables = {"vllm": ENGINE_HISTOGRAM_BUCKETS["vllm"]["ttft"],
              "dynamo": dynamo_buckets(*DYNAMO_BUCKET_DEFAULTS["ttft"])}
    for name, bounds in tables.items():
        counts = [0.0] * (len(bounds) + 1)
        for v in values:
            counts[bisect.bisect_left(bounds, v)] += 1  # the first bucket with v <= its bound
        per_bucket = list(zip([*bounds, math.inf], counts, strict=True))
        out[name] = {q: histogram_quantile(q, per_bucket) or math.nan for q in qs}
    return out


def replay_accuracy(trace: str, window_s: float = 300.0, slot_s: float = 30.0
                    ) -> dict[str, Any]:
    finish, ttft = replay_ttfts(trace)
    windows: dict[int, list[tuple[float, float]]] = {}
    for f, v in zip(finish, ttft, strict=True):
        windows.setdefault(int(f // window_s), []).append((f, v))
    per_window: dict[str, dict[float, list[float]]] = {}
    used = 0
    for rows in windows.values():
        if len(rows) < 200:  # too few requests for a p99 to mean anything
            continue
        used += 1
        est = _estimates([v for _, v in rows], [int(f // slot_s) for f, _ in rows])
        for name in ("sketch", "vllm", "dynamo"):
            for q, value in est[name].items():
                per_window.setdefault(name, {}).setdefault(q, []).append(
                    abs(value / est["exact"][q] - 1))
    whole = _estimates(ttft, [int(f // slot_s) for f in finish])
    rows_out = []
    for q in (0.5, 0.95, 0.99):
        row: dict[str, Any] = {"quantile": f"p{round(q * 100)}", "exact_s": whole["exact"][q]}
        for name in ("sketch", "vllm", "dynamo"):
            errs = per_window.get(name, {}).get(q, [])
            row[f"{name}_rel_err_whole"] = whole[name][q] / whole["exact"][q] - 1
            row[f"{name}_abs_rel_err_window_median"] = statistics.median(errs) if errs \
                else math.nan
            row[f"{name}_abs_rel_err_window_max"] = max(errs) if errs else math.nan
        rows_out.append(row)
    return {"trace": Path(trace).name, "requests": len(ttft), "windows": used,
            "window_s": window_s, "rows": rows_out}


def accuracy(samples: int = 200_000, seed: int = 0) -> list[dict[str, float | str]]:
    rng = random.Random(seed)
    values = [rng.lognormvariate(math.log(0.3), 0.7) if rng.random() < 0.97
              else rng.lognormvariate(math.log(2.0), 0.5) for _ in range(samples)]
    # The store keeps one digest per 30 s slot and merges ten of them for a 5 m window.
    est = _estimates(values, [i % 10 for i in range(samples)])
    rows: list[dict[str, float | str]] = []
    for q, truth in est["exact"].items():
        row: dict[str, float | str] = {"quantile": f"p{round(q * 100)}", "exact_s": truth,
                                       "sketch_rel_err": est["sketch"][q] / truth - 1}
        for name in ("vllm", "dynamo"):
            row[f"{name}_buckets_rel_err"] = est[name][q] / truth - 1
        rows.append(row)
    return rows


def _default_trace() -> str:
    shared = Path(os.environ.get("PDSCALE_SHARED") or
                  Path(__file__).resolve().parent.parent.parent / "shared")
    return str(shared / "traces" / "azure_llm_2023_code.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="length of each export run (open and closed loop, gRPC and HTTP)")
    parser.add_argument("--rates", default="5000,10000,20000",
                        help="offered spans/s of the open-loop export runs, comma-separated")
    parser.add_argument("--trace", default=_default_trace(),
                        help="trace replayed for the quantile-error table")
    parser.add_argument("--out", default="bench/results/otlp.json")
    parser.add_argument("--only", choices=["ingest", "export", "memory", "accuracy"],
                        help="run one part and print it (no JSON written)")
    args = parser.parse_args()
    parts = {"ingest": lambda: ingest(args.spans),
             "export": lambda: export(args.seconds,
                                      [float(r) for r in args.rates.split(",")]),
             "memory": lambda: memory(args.pools),
             "accuracy_replay": lambda: replay_accuracy(args.trace),
             "accuracy_synthetic": accuracy}
    if args.only:
        print(json.dumps({name: run() for name, run in parts.items()
                          if name.startswith(args.only)}, indent=2, sort_keys=True))
        return
    result = {name: run() for name, run in parts.items()}
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    i, m, e = result["ingest"], result["memory"], result["export"]
    print(f"ingest: {i['spans_per_s_one_core']:,.0f} spans/s on one core "
          f"(512-span requests: p50 {i['p50_request_ms']:.1f} ms, p99 "
          f"{i['p99_request_ms']:.1f} ms)")
    print(f"export (receiver on cpu {e['receiver_cpu']}, SDK exporters on cpu "
          f"{e['generator_cpu']}; load average {e['load_average_1m_before']:.1f}):")
    print("  transport  offered/s   sent/s   taken/s  per receiver CPU-s  generator CPU"
          "  p50 ms  p99 ms  refused")
    for r in e["runs"]:
        offered = "closed" if r["offered_spans_per_s"] is None \
            else f"{r['offered_spans_per_s']:,.0f}"
        print(f"  {r['transport']:<9} {offered:>9} {r['sent_spans'] / r['wall_s']:>8,.0f}"
              f" {r['ingested_spans_per_s']:>9,.0f} {r['spans_per_receiver_cpu_s']:>19,.0f}"
              f" {r['generator_cpu_s'] / r['wall_s']:>13.0%} {r['p50_export_ms']:>7.1f}"
              f" {r['p99_export_ms']:>7.1f} {sum(r['refused'].values()):>8}")
    print(f"  encoding one 512-span export in the SDK: {e['encode_ms_per_batch']:.1f} ms")
    print(f"memory: {m['rss_mib']:.0f} MiB for {m['pools']} pools "
          f"({m['kib_per_pool']:.0f} KiB each); reading them all: {m['read_all_pools_s']:.2f} s")
    a = result["accuracy_replay"]
    print(f"accuracy on {a['trace']} replayed ({a['requests']} requests, {a['windows']} "
          "5-minute windows): |relative error| per window, median (max)")
    print("quantile  exact (s)  sketch            vLLM buckets      Dynamo buckets")
    for row in a["rows"]:
        cells = "  ".join(f"{row[f'{n}_abs_rel_err_window_median']:6.1%} "
                          f"({row[f'{n}_abs_rel_err_window_max']:6.1%})"
                          for n in ("sketch", "vllm", "dynamo"))
        print(f"{row['quantile']:>8}  {row['exact_s']:9.3f}  {cells}")


if __name__ == "__main__":
    main()
