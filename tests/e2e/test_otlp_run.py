"""``pdscale run`` on engines' request spans: real OpenTelemetry SDK exporters (HTTP and gRPC)
send vLLM-shaped ``llm_request`` spans over loopback to the controller's OTLP receiver; the
Kubernetes API stand-in records the scale-ups.

Two runs share the module: one with OTLP as its only source (no Prometheus read), and a mixed
one, where a real Prometheus answers the KV-cache, queue and GPU signals (scraping the engine
and DCGM stand-in) and spans answer latency; that Prometheus also scrapes the controller's
``/metrics`` and evaluates the rules generated from the spec on the re-exported span
histograms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdscale._servers import write_rule_files
from pdscale.alerts import alert_files
from pdscale.spec import parse_spec
from tests.conftest import free_port, need_tool
from tests.controller.kube_standin import ApiState, api_standin
from tests.e2e.prom import api as prom_api
from tests.e2e.prom import exporter, prometheus
from tests.telemetry.otlp_fixtures import Req, end_vllm_spans, sglang_span, vllm_resource

pytestmark = pytest.mark.e2e

SPEC = """
version: 1
services:
  - name: llama-chat
    namespace: llm
    engine: vllm
    model_name: meta-llama/Llama-3.1-8B-Instruct
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill:
        target: {name: llama-chat-prefill}
        min_replicas: 1
        max_replicas: 16
      decode:
        target: {name: llama-chat-decode}
        min_replicas: 1
        max_replicas: 16
  - name: qwen-sgl          # SGLang servers, their spans selected by service.name
    namespace: sgl
    engine: sglang
    model_name: Qwen/Qwen2.5-7B-Instruct
    slo: {ttft_p95_s: 0.6, itl_p95_s: 0.06}   # boundaries of SGLang's default buckets
    pools:
      prefill:
        target: {name: qwen-sgl-prefill}
        min_replicas: 1
        max_replicas: 16
        selector: {resource_attributes: {service.name: qwen-sgl-prefill}}
      decode:
        target: {name: qwen-sgl-decode}
        min_replicas: 1
        max_replicas: 16
        selector: {resource_attributes: {service.name: qwen-sgl-decode}}
controller:
  tick: 1s
  leader_election: {enabled: false}
  signal_sources: {default: otlp}
"""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One ``pdscale run`` for the module, its OTLP receiver on loopback."""
    tmp = tmp_path_factory.mktemp("otlp-run")
    spec = tmp / "spec.yaml"
    spec.write_text(SPEC)
    state = ApiState()
    state.add("llm", "deployments", "llama-chat-prefill", 1)
    state.add("llm", "deployments", "llama-chat-decode", 1)
    state.add("sgl", "deployments", "qwen-sgl-prefill", 1)
    state.add("sgl", "deployments", "qwen-sgl-decode", 1)
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    api, http, grpc_port = sorted(ports)
    with api_standin(state) as server:
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "s", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}]}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pdscale", "run", "--spec", str(spec), "--kubeconfig",
             str(kubeconfig), "--listen", f"127.0.0.1:{api}", "--otlp-http-port", str(http),
             "--otlp-grpc-port", str(grpc_port), "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
            env={**os.environ, "POD_NAMESPACE": "pdscale-system"})
        base = f"http://127.0.0.1:{api}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if _get(f"{base}/v1/status")["ticks"] >= 1:
                        break
                except OSError:
                    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
            yield {"base": base, "http": http, "grpc": grpc_port, "state": state,
                   "proc": proc, "spec": spec}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"OTLP on http 127.0.0.1:{http}, grpc 127.0.0.1:{grpc_port}" in out


def _export(transport: str, port: int, pod: str, reqs: list[Req], namespace: str = "llm"
            ) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=vllm_resource(pod, namespace))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    end_vllm_spans(provider, reqs)
    exporter: Any = HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces") \
        if transport == "http" else GrpcSpanExporter(endpoint=f"127.0.0.1:{port}",
                                                     insecure=True)
    spans = list(memory.get_finished_spans())
    for i in range(0, len(spans), 500):
        assert exporter.export(spans[i:i + 500]) is SpanExportResult.SUCCESS
    exporter.shutdown()


def _wait(base: str, until: Any, timeout_s: float = 30,
          proc: subprocess.Popen[str] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            status = _get(f"{base}/v1/status")
        except OSError:
            assert proc is None or proc.poll() is None, \
                proc.stdout.read() if proc.stdout else ""
            time.sleep(0.3)
            continue
        if until(status):
            return status
        time.sleep(0.3)
    pools = status.get("pools", {})
    raise AssertionError(json.dumps({"pools": pools, **status}, indent=1)[:6000])


def test_before_any_span_the_pools_hold_on_missing_data(controller: dict[str, Any]) -> None:
    status = _get(f"{controller['base']}/v1/status")
    assert status["otlp"]["serving"] and status["otlp"]["accepted_spans"] == 0
    assert {p["cause"] for p in status["pools"].values()} == {"degraded"}
    assert controller["state"].writes == 0


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_controller_scales_prefill_on_span_demand(controller: dict[str, Any],
                                                      transport: str) -> None:
    """A burst of long prompts whose TTFT is twice the SLO: the prefill pool scales up, on
    spans alone, whichever transport carried them."""
    now = time.time()
    reqs = [Req(end_s=now - 0.5 - i * 0.002, ttft_s=1.0, queue_s=0.7, prefill_s=0.25,
                prompt=6000, completion=2) for i in range(1500)]
    port = controller["http"] if transport == "http" else controller["grpc"]
    pod = f"llama-chat-prefill-{transport}-0"
    _export(transport, port, pod, reqs)
    _export(transport, port, f"llama-chat-decode-{transport}-0",
            [Req(end_s=now - 0.5 - i * 0.01, ttft_s=0.2, decode_s=2.0, completion=201)
             for i in range(100)])
    # Rates need one 30 s slot of receiving, and this is the module's first export: the
    # controller may have started less than 30 s ago.
    status = _wait(controller["base"], lambda s: s["pools"]["llama-chat/prefill"]["desired"]
                   > 1 and s["otlp"]["accepted_spans"] >= 1600, timeout_s=60)
    prefill = status["pools"]["llama-chat/prefill"]
    assert prefill["cause"] != "degraded"
    answered = status["signal_sources"]["llama-chat/prefill"]
    assert answered["ttft_p95_s"] == "otlp" and answered["prompt_tokens_per_s"] == "otlp"
    assert answered["queue_depth"] is None  # a gauge: spans cannot give it, and none is made up
    assert controller["state"].writes >= 1
    with urllib.request.urlopen(f"{controller['base']}/metrics", timeout=3) as resp:
        metrics = resp.read().decode()
    assert 'pdscale_otlp_queue_time_seconds_bucket{' in metrics
    assert "pdscale_otlp_accepted_total" in metrics


def test_sglang_spans_scale_its_pools_and_give_cache_hits(
        controller: dict[str, Any]) -> None:
    """SGLang 0.5.23's root request spans (``"prefill Req <rid>"``, no queue time, the finish
    reason in the span) from its default gRPC exporter, its servers told apart by
    ``service.name``: the prefill pool scales on TTFT, and the span's cached tokens give the
    prefix-cache hit ratio vLLM's spans cannot."""
    now = time.time()
    memory = InMemorySpanExporter()
    prefill = TracerProvider(resource=Resource.create({"service.name": "qwen-sgl-prefill"}))
    prefill.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(600):
        sglang_span(prefill, Req(end_s=now - 0.5 - i * 0.004, ttft_s=1.2, prefill_s=1.1,
                                 decode_s=0.02, prompt=6000, completion=2),
                    finish="abort" if i % 10 == 0 else "stop")
    decode = TracerProvider(resource=Resource.create({"service.name": "qwen-sgl-decode"}))
    decode.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(100):
        sglang_span(decode, Req(end_s=now - 0.5 - i * 0.01, ttft_s=0.2, decode_s=2.0,
                                completion=201))
    exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{controller['grpc']}", insecure=True)
    spans = list(memory.get_finished_spans())
    for i in range(0, len(spans), 500):
        assert exporter.export(spans[i:i + 500]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    status = _wait(controller["base"], lambda s: s["pools"]["qwen-sgl/prefill"]["desired"] > 1)
    answered = status["signal_sources"]["qwen-sgl/prefill"]
    assert answered["ttft_p95_s"] == answered["prefix_cache_hit_ratio"] == "otlp"
    assert "queue_depth" in answered and answered["queue_depth"] is None
    with urllib.request.urlopen(f"{controller['base']}/metrics", timeout=3) as resp:
        metrics = resp.read().decode()
    # SGLang's prefill time is re-exported; it has no queue time, so no queue histogram.
    labels = ('{model_name="Qwen/Qwen2.5-7B-Instruct",namespace="sgl",pdscale_pool="prefill",'
              'pdscale_service="qwen-sgl"}')
    assert f"pdscale_otlp_prefill_time_seconds_count{labels} 600.0" in metrics
    assert f"pdscale_otlp_queue_time_seconds_count{labels}" not in metrics
    assert controller["state"].objects[("sgl", "deployments", "qwen-sgl-prefill")][
        "replicas"] > 1


def test_check_reports_which_source_answered_and_how_fresh(
        controller: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``pdscale check --controller``: with OTLP as the only source, Prometheus is not
    checked; every signal the pools are decided on was answered by spans, seconds old."""
    from pdscale.cli import main

    now = time.time()
    for role in ("prefill", "decode"):
        _export("grpc", controller["grpc"], f"llama-chat-{role}-check-0",
                [Req(end_s=now - 0.5 - i * 0.01, ttft_s=0.2, decode_s=1.0, completion=101)
                 for i in range(50)])
    # Rates need one 30 s slot of receiving: a fresh controller has none before.
    _wait(controller["base"], lambda s: all(
        s["signal_sources"].get(f"{service}/{r}", {}).get(sig) == "otlp"
        for service in ("llama-chat", "qwen-sgl")
        for r, sig in (("prefill", "ttft_p95_s"), ("decode", "itl_p95_s"),
                       ("prefill", "prompt_tokens_per_s"),
                       ("decode", "generation_tokens_per_s"))), timeout_s=60)
    capsys.readouterr()
    code = main(["check", str(controller["spec"]), "--controller", controller["base"]])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Prometheus not checked: the spec reads no signal from it" in out
    assert "every signal the controller needs has a fresh source" in out
    code = main(["check", str(controller["spec"]), "--controller", controller["base"],
                 "--json"])
    report = json.loads(capsys.readouterr().out.split("\nPrometheus not checked")[0])
    assert code == 0 and report["sources_ready"] is True
    rows = {(r["service"], r["pool"], r["signal"]): r for r in report["sources"]}
    for service in ("llama-chat", "qwen-sgl"):  # vLLM's spans and SGLang's
        for pool, name in (("prefill", "ttft_p95_s"), ("prefill", "prompt_tokens_per_s"),
                           ("decode", "itl_p95_s"), ("decode", "generation_tokens_per_s")):
            row = rows[(service, pool, name)]
            assert (row["configured"], row["answered"], row["status"]) == \
                ("otlp", "otlp", "ok"), row
            assert row["needed_by"] == "controller" and 0 <= row["age_s"] < 60, row
    queue = rows[("llama-chat", "prefill", "queue_depth")]  # spans give no gauge: none made up
    assert queue["answered"] is None and queue["status"] == "missing"


def test_spans_from_an_unknown_pod_are_counted_not_used(controller: dict[str, Any]) -> None:
    _export("http", controller["http"], "someone-else-0", [Req(end_s=time.time(), ttft_s=0.1)])
    status = _wait(controller["base"], lambda s: s["otlp"]["dropped"].get("unknown_pool"))
    assert status["otlp"]["dropped"]["unknown_pool"] == 1
    assert "selector.resource_attributes" in status["otlp"]["last_drop"]


MIXED_SPEC = """
version: 1
services:
  - name: llama-mixed
    namespace: llm-mixed
    engine: vllm
    model_name: meta-llama/Llama-3.1-8B-Instruct
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill:
        target: {name: llama-mixed-prefill}
        min_replicas: 1
        max_replicas: 16
      decode:
        target: {name: llama-mixed-decode}
        min_replicas: 1
        max_replicas: 16
controller:
  tick: 1s
  leader_election: {enabled: false}
  signal_sources:
    default: prometheus
    signals: {ttft_p50_s: otlp, ttft_p95_s: otlp, ttft_p95_recent_s: otlp, ttft_p99_s: otlp,
              itl_p50_s: otlp, itl_p95_s: otlp, e2e_p95_s: otlp}
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Prometheus (engine and DCGM stand-in, and the controller's /metrics, with the generated
    rules) and a ``pdscale run`` that reads gauges from it and latency from spans."""
    need_tool("prometheus")
    tmp = tmp_path_factory.mktemp("otlp-mixed")
    (tmp / "spec.yaml").write_text(MIXED_SPEC)
    spec = parse_spec(MIXED_SPEC)
    state = ApiState()
    state.add("llm-mixed", "deployments", "llama-mixed-prefill", 1)
    state.add("llm-mixed", "deployments", "llama-mixed-decode", 1)
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(free_port())
    api_port, http, grpc_port, prom_port = sorted(ports)
    labels = json.dumps({"model_name": spec.services[0].model_name})
    with exporter(free_port()) as engines, api_standin(state) as server:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": write_rule_files(alert_files(spec), tmp / "rules"),
            "scrape_configs": [
                {"job_name": "engines", "static_configs": [
                    {"targets": [str(engines)], "labels": {
                        "namespace": "llm-mixed", "pod": f"llama-mixed-{role}-0",
                        "__param_engine": "vllm", "__param_labels": labels}}
                    for role in ("prefill", "decode")]},
                {"job_name": "pdscale", "honor_labels": True,
                 "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}]}],
        }
        with prometheus(config, tmp, prom_port) as prom_url:
            kubeconfig = tmp / "kubeconfig"
            kubeconfig.write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "s", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}]}))
            proc = subprocess.Popen(
                [sys.executable, "-m", "pdscale", "run", "--spec", str(tmp / "spec.yaml"),
                 "--kubeconfig", str(kubeconfig), "--listen", f"127.0.0.1:{api_port}",
                 "--prometheus-url", prom_url, "--otlp-http-port", str(http),
                 "--otlp-grpc-port", str(grpc_port), "--log-level", "warning"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                env={**os.environ, "POD_NAMESPACE": "pdscale-system"})
            base = f"http://127.0.0.1:{api_port}"
            try:
                _wait(base, lambda s: s["ticks"] >= 1, timeout_s=60, proc=proc)
                yield {"base": base, "http": http, "grpc": grpc_port, "prometheus": prom_url,
                       "state": state}
            finally:
                proc.send_signal(signal.SIGTERM)
                out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def _recorded(url: str, record: str, pool: str) -> float | None:
    rows = prom_api(url, "/api/v1/query", {"query": (
        f'{record}{{pdscale_service="llama-mixed",pdscale_pool="{pool}"}}')})["data"]["result"]
    return float(rows[0]["value"][1]) if rows else None


def test_a_mixed_run_reads_gauges_from_prometheus_and_latency_from_spans(
        mixed: dict[str, Any]) -> None:
    now = time.time()
    # Every request queued 0.6 s and prefilled 0.3 s of a 1.0 s TTFT (the SLO is 0.5 s).
    reqs = [Req(end_s=now - 0.5 - i * 0.01, ttft_s=1.0, queue_s=0.6, prefill_s=0.3,
                prompt=3000, completion=2) for i in range(200)]
    _export("grpc", mixed["grpc"], "llama-mixed-prefill-0", reqs[:100], "llm-mixed")
    # The re-exported series exist from the first spans on; the rest arrive after Prometheus
    # has scraped them, so rate() sees them grow.
    _wait_prom(mixed["prometheus"], "pdscale_otlp_queue_time_seconds_count"
               '{pdscale_service="llama-mixed",pdscale_pool="prefill"}')
    _export("http", mixed["http"], "llama-mixed-prefill-0", reqs[100:], "llm-mixed")
    gauges = ("queue_depth", "running_requests")

    def answered_by_both(status: dict[str, Any]) -> bool:
        answered = status["signal_sources"].get("llama-mixed/prefill", {})
        return status["otlp"]["accepted_spans"] >= 200 and \
            answered.get("ttft_p95_s") == "otlp" and \
            all(answered.get(g) == "prometheus" for g in gauges) and \
            status["pools"]["llama-mixed/prefill"]["cause"] != "degraded"

    status = _wait(mixed["base"], answered_by_both)
    answered = status["signal_sources"]["llama-mixed/prefill"]
    # The data's age is the fresher source's, whichever that is at the read.
    assert {s for s, src in answered.items() if src == "otlp"} - {"sample_age_s"} <= \
        set(parse_spec(MIXED_SPEC).controller.signal_sources.signals)
    # Both sources are fresh, so the pool is decided on, not held; its TTFT is the spans' 1 s.
    reasons = " ".join(status["pools"]["llama-mixed/prefill"]["reasons"])
    assert "ttft_p95_s 1s vs SLO 0.5s" in reasons, reasons
    # The generated rules, evaluated by Prometheus on the controller's re-exported histograms:
    # TTFT and its stages fall in the buckets that hold them, every request misses the SLO.
    url = mixed["prometheus"]
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        got = {r: _recorded(url, r, "prefill") for r in (
            "pdscale_pool:time_to_first_token_seconds:p95_rate5m",
            "pdscale_pool:ttft_queue_seconds:p95_rate5m",
            "pdscale_pool:ttft_prefill_seconds:p95_rate5m",
            "pdscale_pool:ttft_slo_errors:ratio_rate5m")}
        if all(v is not None and v == v for v in got.values()):
            break
        time.sleep(1)
    assert 0.75 < got["pdscale_pool:time_to_first_token_seconds:p95_rate5m"] <= 1.0, got
    assert 0.5 < got["pdscale_pool:ttft_queue_seconds:p95_rate5m"] <= 0.75, got
    assert 0.25 < got["pdscale_pool:ttft_prefill_seconds:p95_rate5m"] <= 0.5, got
    assert got["pdscale_pool:ttft_slo_errors:ratio_rate5m"] == pytest.approx(1.0), got
    # Gauges recorded by the same rules from the engines' and DCGM's own series.
    assert _recorded(url, "pdscale_pool:kv_cache_usage:avg", "prefill") is not None
    assert _recorded(url, "pdscale_pool:gpu_utilization:avg", "prefill") is not None


def _wait_prom(url: str, query: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if prom_api(url, "/api/v1/query", {"query": query})["data"]["result"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never saw {query}")
