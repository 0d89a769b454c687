"""``pdscale run`` scaling on engines' request spans: real OpenTelemetry SDK exporters (HTTP
and gRPC) send vLLM-shaped ``llm_request`` spans over loopback to the controller's OTLP
receiver; no Prometheus is read; the Kubernetes API stand-in records the scale-ups."""

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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import free_port
from tests.controller.kube_standin import ApiState, api_standin
from tests.telemetry.otlp_fixtures import Req, end_vllm_spans, vllm_resource

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
                   "proc": proc}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"OTLP on http 127.0.0.1:{http}, grpc 127.0.0.1:{grpc_port}" in out


def _export(transport: str, port: int, pod: str, reqs: list[Req]) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=vllm_resource(pod))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    end_vllm_spans(provider, reqs)
    exporter: Any = HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces") \
        if transport == "http" else GrpcSpanExporter(endpoint=f"127.0.0.1:{port}",
                                                     insecure=True)
    spans = list(memory.get_finished_spans())
    for i in range(0, len(spans), 500):
        assert exporter.export(spans[i:i + 500]) is SpanExportResult.SUCCESS
    exporter.shutdown()


def _wait(base: str, until: Any, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = _get(f"{base}/v1/status")
        if until(status):
            return status
        time.sleep(0.3)
    raise AssertionError(json.dumps(status, indent=1)[:4000])


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
    status = _wait(controller["base"], lambda s: s["pools"]["llama-chat/prefill"]["desired"]
                   > 1 and s["otlp"]["accepted_spans"] >= 1600)
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


def test_spans_from_an_unknown_pod_are_counted_not_used(controller: dict[str, Any]) -> None:
    _export("http", controller["http"], "someone-else-0", [Req(end_s=time.time(), ttft_s=0.1)])
    status = _wait(controller["base"], lambda s: s["otlp"]["dropped"].get("unknown_pool"))
    assert status["otlp"]["dropped"]["unknown_pool"] == 1
    assert "selector.resource_attributes" in status["otlp"]["last_drop"]
