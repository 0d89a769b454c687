"""The OTLP receiver over loopback: real OpenTelemetry SDK exporters (HTTP and gRPC), OTLP/JSON,
and bad input (malformed, wrong type, oversized, unauthenticated, a full buffer)."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
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

from pdscale.controller._otlp_receiver import OtlpReceiver
from pdscale.spec import OtlpSettings, Role, Spec, WebhookAuth, load_spec
from pdscale.telemetry import OtlpStore, Signal
from tests.conftest import ROOT, free_port
from tests.telemetry.otlp_fixtures import Req, end_vllm_spans, trace_request, vllm_resource

PREFILL = ("llama-chat", Role.PREFILL)


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(ROOT / "examples" / "vllm.yaml")


@pytest.fixture(scope="module")
def receiver(spec: Spec) -> Iterator[OtlpReceiver]:
    """One receiver on loopback for the module (HTTP and gRPC)."""
    store = OtlpStore(spec, started_s=time.time() - 600)
    rx = OtlpReceiver(store, OtlpSettings(max_request_bytes=64 * 1024), now=time.time)
    rx.expose("127.0.0.1")
    rx.start("127.0.0.1", http_port=free_port(), grpc_port=free_port())
    yield rx
    rx.stop()


def _spans(n: int, ttft_s: float) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=vllm_resource("llama-chat-prefill-a"))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    now = time.time()
    end_vllm_spans(provider, [Req(end_s=now - 1 - i * 0.01, ttft_s=ttft_s) for i in range(n)])
    return exporter


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_exporters_deliver_vllm_spans(receiver: OtlpReceiver, spec: Spec,
                                          transport: str) -> None:
    before = receiver.store.accepted_spans
    spans = _spans(50, 0.25 if transport == "http" else 0.75).get_finished_spans()
    if transport == "http":
        exporter: Any = HttpSpanExporter(
            endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces")
    else:
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert receiver.drain()
    assert receiver.store.accepted_spans == before + 50
    p99 = receiver.store.read(spec, [Signal.TTFT_P99_S], at_s=time.time())[PREFILL][
        Signal.TTFT_P99_S].value
    # HTTP runs first (0.25 s spans); gRPC's 0.75 s spans then hold the tail.
    assert p99 == pytest.approx(0.25 if transport == "http" else 0.75, rel=0.01)


def test_otlp_json_with_hex_ids_and_gzip_are_read(receiver: OtlpReceiver) -> None:
    from google.protobuf import json_format

    message = trace_request({vllm_resource("llama-chat-prefill-a"): [
        Req(end_s=time.time() - 2, ttft_s=0.3)]})
    text = json_format.MessageToJson(message)
    span = message.resource_spans[0].scope_spans[0].spans[0]
    # OTLP/JSON writes ids as hex (the protobuf mapping would write base64)
    text = text.replace(json_format.MessageToDict(message)["resourceSpans"][0]["scopeSpans"][0][
        "spans"][0]["traceId"], span.trace_id.hex())
    before = receiver.store.accepted_spans
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    r = httpx.post(url, content=text, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json() == {}
    r = httpx.post(url, content=gzip.compress(message.SerializeToString()),
                   headers={"Content-Type": "application/x-protobuf",
                            "Content-Encoding": "gzip"})
    assert r.status_code == 200
    assert receiver.drain() and receiver.store.accepted_spans == before + 2


def _message(r: httpx.Response) -> str:
    """The refusal's message: a google.rpc.Status in the request's encoding."""
    from google.rpc.status_pb2 import Status

    if r.headers["content-type"].startswith("application/json"):
        return str(r.json()["message"])
    return str(Status.FromString(r.content).message)


@pytest.mark.parametrize(("body", "headers", "status", "says"), [
    (b"\x0a\xff\xff\xff", {"Content-Type": "application/x-protobuf"}, 400, "not a protobuf"),
    (b"{\"resourceSpans\": 7}", {"Content-Type": "application/json"}, 400, "OTLP/JSON"),
    (b"x", {"Content-Type": "text/plain"}, 415, "application/x-protobuf"),
    (b"x" * (64 * 1024 + 1), {"Content-Type": "application/x-protobuf"}, 413,
     "max_request_bytes"),
    (gzip.compress(b"\0" * (200 * 1024)), {"Content-Type": "application/x-protobuf",
                                           "Content-Encoding": "gzip"}, 413,
     "max_request_bytes"),
    (b"x", {"Content-Type": "application/x-protobuf", "Content-Encoding": "br"}, 415, "gzip"),
], ids=["malformed-protobuf", "malformed-json", "content-type", "oversized",
        "gzip-bomb", "encoding"])
def test_bad_http_requests_get_a_clear_4xx(receiver: OtlpReceiver, body: bytes,
                                           headers: dict[str, str], status: int,
                                           says: str) -> None:
    r = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", content=body,
                   headers=headers)
    assert r.status_code == status, r.text
    assert says in _message(r)
    assert receiver.snapshot()["last_refusal"] == _message(r)


def test_malformed_grpc_is_invalid_argument(receiver: OtlpReceiver) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        call = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x0a\xff\xff\xff", timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a protobuf" in info.value.details()


class _BlockedStore(OtlpStore):
    """Ingest waits for ``release``: the buffer fills."""

    release = threading.Event()

    def ingest_traces(self, request: Any, now_s: float) -> Any:
        self.release.wait(10)
        return super().ingest_traces(request, now_s)


def test_a_full_buffer_answers_429_and_resource_exhausted_with_retry(spec: Spec) -> None:
    store = _BlockedStore(spec, started_s=time.time() - 600)
    rx = OtlpReceiver(store, OtlpSettings(buffer_bytes=1 << 16), now=time.time)
    rx.expose("127.0.0.1")
    rx.start("127.0.0.1", http_port=free_port(), grpc_port=free_port())
    try:
        req = trace_request({vllm_resource("llama-chat-prefill-a"): [
            Req(end_s=time.time() - 1, ttft_s=0.1, prompt=i) for i in range(300)]})
        body = req.SerializeToString()
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        codes = [httpx.post(url, content=body, headers={
            "Content-Type": "application/x-protobuf"}) for _ in range(1 + (1 << 16) // len(body))]
        full = codes[-1]
        assert full.status_code == 429 and full.headers["Retry-After"] == "2"
        assert "buffer" in _message(full)
        with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel:
            call = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as info:
                call(body, timeout=5)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(info.value.trailing_metadata())
        from google.rpc.error_details_pb2 import RetryInfo

        retry = RetryInfo.FromString(trailing["google.rpc.retryinfo-bin"])
        assert retry.retry_delay.seconds == 2
        assert rx.snapshot()["refused"]["buffer_full"] == 2
    finally:
        _BlockedStore.release.set()
        rx.stop()


def test_authentication_and_the_exposure_rule(spec: Spec, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    store = OtlpStore(spec, started_s=time.time() - 600)
    rx = OtlpReceiver(store, OtlpSettings(auth=WebhookAuth(bearer_token_file=str(token))),
                      now=time.time)
    assert rx.expose("0.0.0.0") is None  # authenticated: any address
    rx.start("127.0.0.1", http_port=free_port(), grpc_port=0)
    try:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        body = trace_request({}).SerializeToString()
        ctype = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(url, content=body, headers=ctype).status_code == 401
        ok = httpx.post(url, content=body, headers={**ctype, "Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        exporter = HttpSpanExporter(endpoint=url, headers={"Authorization": "Bearer s3cret"})
        assert exporter.export(_spans(3, 0.1).get_finished_spans()) is SpanExportResult.SUCCESS
    finally:
        rx.stop()
    open_rx = OtlpReceiver(store, OtlpSettings(), now=time.time)
    refusal = open_rx.expose("0.0.0.0")
    assert refusal is not None and "--allow-unauthenticated-otlp" in refusal
    assert open_rx.expose("0.0.0.0", allow_unauthenticated=True) is None
    assert open_rx.expose("::1") is None
