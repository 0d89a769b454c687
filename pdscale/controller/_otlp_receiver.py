"""The OTLP receiver: OTLP/HTTP (protobuf and JSON) and OTLP/gRPC, for traces and metrics, on
ports of their own, feeding :class:`telemetry.OtlpStore`.

Design, after the OTLP specification (opentelemetry-proto's ``docs/specification.md``):

* Requests are decoded with ``opentelemetry-proto``'s messages (JSON through protobuf's
  JSON mapping, with OTLP's one difference: trace and span ids are hex, not base64). A body
  that does not decode is refused at once (400 / ``INVALID_ARGUMENT``) with what was
  expected; a wrong content type is 415, an unknown encoding 415, a body over
  ``max_request_bytes`` (after gzip) 413 / ``RESOURCE_EXHAUSTED``.
* Decoded requests wait in a buffer bounded in bytes for the one ingest thread. A full buffer
  answers 429 with ``Retry-After`` (HTTP) or ``RESOURCE_EXHAUSTED`` with a ``RetryInfo``
  (gRPC: in ``grpc-status-details-bin``, and in ``google.rpc.retryinfo-bin``, which the
  Python exporter reads), the retryable answers of the specification: exporters back off
  and retry, nothing grows without bound.
* Authentication is the webhook's (``WebhookAuthenticator``: bearer token or basic auth from
  files or the environment), with its rule: without authentication the receiver answers only
  on a loopback address unless ``allow_unauthenticated`` says the exposure is deliberate; a
  refused receiver answers 403 / ``PERMISSION_DENIED`` saying why.
* What the store drops (unknown pools, bad timings, clock skew) is counted by reason on
  ``pdscale_otlp_dropped_total`` and ``/v1/status``: the export itself succeeded.

HTTP is served by uvicorn with a small FastAPI app (its own port; the API module's rules);
gRPC by grpcio's server with generic handlers over raw bytes, so that decoding is ours.
"""

from __future__ import annotations

import base64
import logging
import queue
import re
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from pdscale.controller._webhook import WebhookAuthenticator
from pdscale.spec import OtlpSettings
from pdscale.telemetry import ControllerTelemetry, IngestResult, OtlpStore

__all__ = ["OtlpReceiver", "Refused", "decode_export"]

log = logging.getLogger("pdscale.otlp")

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_KINDS: dict[str, tuple[type[Message], type[Message]]] = {
    "traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}
_GRPC_METHODS = {
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export": "traces",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export": "metrics",
}
_HEX_ID = re.compile(r'"(traceId|spanId|parentSpanId)"\s*:\s*"([0-9a-fA-F]*)"')
RETRY_AFTER_S = 2
"""Seconds an exporter is told to wait when the buffer is full: the ingest thread drains a
full default buffer (64 MiB) in about that long (bench/otlp.py)."""


@dataclass(frozen=True)
class Refused(Exception):
    """An export request refused: the HTTP status, the gRPC code and what to do."""

    http_status: int
    grpc_code: grpc.StatusCode
    message: str

    def __str__(self) -> str:
        return self.message


def _hex_ids_to_base64(text: str) -> str:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as
    base64."""
    def swap(m: re.Match[str]) -> str:
        raw = bytes.fromhex(m.group(2)) if len(m.group(2)) % 2 == 0 else b""
        return f'"{m.group(1)}": "{base64.b64encode(raw).decode()}"'

    return _HEX_ID.sub(swap, text)


def decode_export(kind: str, body: bytes, content_type: str) -> Message:
    """An export request of ``kind`` (traces, metrics) from its body, or :class:`Refused`."""
    request_type = _KINDS[kind][0]
    message = request_type()
    if content_type == _PROTOBUF:
        try:
            message.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise Refused(400, grpc.StatusCode.INVALID_ARGUMENT,
                          f"the body is not a protobuf {request_type.__name__} ({exc}): "
                          "send OTLP/HTTP protobuf, as the OpenTelemetry exporters do") from exc
        return message
    try:
        text = body.decode("utf-8")
        json_format.Parse(_hex_ids_to_base64(text), message, ignore_unknown_fields=True)
    except (json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Refused(400, grpc.StatusCode.INVALID_ARGUMENT,
                      f"the body is not an OTLP/JSON {request_type.__name__} "
                      f"({str(exc)[:200]})") from exc
    return message


@dataclass
class _Counts:
    received: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    last_refusal: str | None = None


class OtlpReceiver:
    """Buffer, ingest thread and the two servers (each optional)."""

    def __init__(self, store: OtlpStore, settings: OtlpSettings, *,
                 now: Callable[[], float], telemetry: ControllerTelemetry | None = None,
                 authenticator: WebhookAuthenticator | None = None) -> None:
        self.store = store
        self.settings = settings
        self.now = now
        self.telemetry = telemetry
        self.authenticator = authenticator or WebhookAuthenticator(settings.auth)
        self.refusal: str | None = None
        """Why every request is refused (unauthenticated on a non-loopback address)."""
        self._queue: queue.Queue[tuple[str, Message, int] | None] = queue.Queue()
        self._buffered = 0
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._worker: threading.Thread | None = None
        self._http: Any = None
        self._http_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None

    # -- what every transport does ---------------------------------------------------------

    def expose(self, host: str, *, allow_unauthenticated: bool = False) -> str | None:
        """The webhook's rule for ``host``: without authentication, a loopback address or an
        explicit allowance. Returns the refusal (None when it serves)."""
        from pdscale.controller._runtime import is_loopback

        allowed = allow_unauthenticated or self.settings.auth.allow_unauthenticated
        if self.authenticator.configured or allowed or is_loopback(host):
            self.refusal = None
            return None
        self.refusal = (
            f"the OTLP receiver refuses every export: no authentication is configured and it "
            f"listens on {host}, where anyone who reaches the port could feed the controller "
            "the signals it scales on. Set spec.controller.otlp.auth (a bearer token file; "
            "exporters send it in the Authorization header), listen on 127.0.0.1, or pass "
            "--allow-unauthenticated-otlp if the exposure is deliberate")
        log.warning("%s", self.refusal)
        return self.refusal

    def _refuse(self, why: str, refused: Refused) -> Refused:
        with self._lock:
            self._counts.refused[why] = self._counts.refused.get(why, 0) + 1
            self._counts.last_refusal = refused.message
        if self.telemetry is not None:
            self.telemetry.otlp_refused.add(1, {"reason": why})
        return refused

    def check_access(self, authorization: str | None) -> None:
        if self.refusal is not None:
            raise self._refuse("exposed", Refused(403, grpc.StatusCode.PERMISSION_DENIED,
                                                  self.refusal))
        if not self.authenticator.check(authorization):
            raise self._refuse("auth", Refused(
                401, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials: send "
                "the bearer token (or basic auth) of spec.controller.otlp.auth in the "
                "Authorization header (OTEL_EXPORTER_OTLP_HEADERS)"))

    def check_size(self, size: int) -> None:
        limit = self.settings.max_request_bytes
        if size > limit:
            raise self._refuse("too_large", Refused(
                413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"export request of {size} bytes or more, over {limit}: lower the "
                "exporter's batch size (OTEL_BSP_MAX_EXPORT_BATCH_SIZE) or raise "
                "spec.controller.otlp.max_request_bytes"))

    def submit(self, kind: str, body: bytes, content_type: str) -> Message:
        """Decode and queue one export request; the empty response to send, or
        :class:`Refused`."""
        try:
            message = decode_export(kind, body, content_type)
        except Refused as refused:
            raise self._refuse("malformed", refused) from None
        size = len(body)
        with self._lock:
            if self._buffered + size > self.settings.buffer_bytes:
                full = True
            else:
                full = False
                self._buffered += size
                self._counts.received[kind] = self._counts.received.get(kind, 0) + 1
        if full:
            raise self._refuse("buffer_full", Refused(
                429, grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the receiver's buffer ({self.settings.buffer_bytes} bytes) is full: retry "
                f"after {RETRY_AFTER_S} s"))
        self._queue.put((kind, message, size))
        return _KINDS[kind][1]()

    def _ingest_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, message, size = item
            try:
                now = self.now()
                result = self.store.ingest_traces(message, now) if kind == "traces" \
                    else self.store.ingest_metrics(message, now)
                self._record(kind, result)
            except Exception:  # a bug must not stop ingestion: log, count, go on
                log.exception("OTLP ingest failed")
                self._record(kind, IngestResult(dropped={"error": 1},
                                                detail="ingest failed (see the log)"))
            finally:
                with self._lock:
                    self._buffered -= size

    def _record(self, kind: str, result: IngestResult) -> None:
        if self.telemetry is None:
            return
        item = "spans" if kind == "traces" else "points"
        self.telemetry.otlp_accepted.add(result.accepted, {"item": item})
        for reason, n in result.dropped.items():
            self.telemetry.otlp_dropped.add(n, {"item": item, "reason": reason})

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Wait until the buffer is empty (tests, shutdown); whether it is."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._buffered == 0 and self._queue.empty():
                    return True
            time.sleep(0.01)
        return False

    def snapshot(self) -> dict[str, Any]:
        """For /v1/status and ``pdscale check``."""
        with self._lock:
            counts = self._counts
            out: dict[str, Any] = {
                "http_port": self.http_port, "grpc_port": self.grpc_port,
                "auth": self.authenticator.describe(), "serving": self.refusal is None,
                "refusal": self.refusal, "received": dict(counts.received),
                "refused": dict(counts.refused), "last_refusal": counts.last_refusal,
                "buffered_bytes": self._buffered}
        out.update(accepted_spans=self.store.accepted_spans,
                   accepted_points=self.store.accepted_points, dropped=dict(self.store.drops),
                   last_drop=self.store.last_drop)
        return out

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, host: str, *, http_port: int | None = None,
              grpc_port: int | None = None) -> None:
        """Start the ingest thread and the servers (a port of 0 or None: that transport
        off; ports default to the settings')."""
        http_port = self.settings.http_port if http_port is None else http_port
        grpc_port = self.settings.grpc_port if grpc_port is None else grpc_port
        self._worker = threading.Thread(target=self._ingest_loop, name="pdscale-otlp-ingest",
                                        daemon=True)
        self._worker.start()
        if grpc_port:
            self._start_grpc(host, grpc_port)
        if http_port:
            self._start_http(host, http_port)

    def stop(self) -> None:
        if self._http is not None:
            self._http.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(timeout=10)
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(5)
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=10)
        self._http = self._http_thread = self._grpc = self._worker = None

    # -- OTLP/HTTP ---------------------------------------------------------------------------

    def _start_http(self, host: str, port: int) -> None:
        import time

        import uvicorn

        config = uvicorn.Config(create_otlp_app(self), host=host, port=port, log_level="warning",
                                access_log=False, limit_concurrency=64)
        self._http = uvicorn.Server(config)
        self._http_thread = threading.Thread(target=self._http.run, name="pdscale-otlp-http",
                                             daemon=True)
        self._http_thread.start()
        deadline = time.monotonic() + 10
        while not self._http.started and self._http_thread.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._http.started:
            raise OSError(f"the OTLP/HTTP receiver could not listen on {host}:{port}")
        self.http_port = port

    # -- OTLP/gRPC ---------------------------------------------------------------------------

    def _start_grpc(self, host: str, port: int) -> None:
        from concurrent import futures

        receiver = self

        def export(kind: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
            def handle(body: bytes, context: grpc.ServicerContext) -> bytes:
                metadata = dict(context.invocation_metadata())
                try:
                    receiver.check_access(metadata.get("authorization"))
                    receiver.check_size(len(body))
                    response = receiver.submit(kind, body, _PROTOBUF)
                except Refused as refused:
                    _abort(context, refused)
                out: bytes = response.SerializeToString()
                return out
            return handle

        class Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                kind = _GRPC_METHODS.get(details.method)
                if kind is None:
                    return None
                return grpc.unary_unary_rpc_method_handler(export(kind))

        limit = self.settings.max_request_bytes
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4,
                                                        thread_name_prefix="pdscale-otlp-grpc"),
                             handlers=[Handler()], maximum_concurrent_rpcs=64,
                             options=[("grpc.max_receive_message_length", limit),
                                      # a port in use is an error, not silently shared
                                      ("grpc.so_reuseport", 0)])
        bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"the OTLP/gRPC receiver could not listen on {host}:{port}")
        server.start()
        self._grpc = server
        self.grpc_port = bound


def _abort(context: grpc.ServicerContext, refused: Refused) -> None:
    status = status_pb2.Status(code=refused.grpc_code.value[0], message=refused.message)
    trailing: list[tuple[str, bytes]] = []
    if refused.http_status == 429:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.seconds = RETRY_AFTER_S
        status.details.add().Pack(retry)
        trailing.append(("google.rpc.retryinfo-bin", retry.SerializeToString()))
    if status.code == code_pb2.OK:  # never: every refusal has an error code
        status.code = code_pb2.UNKNOWN
    trailing.append(("grpc-status-details-bin", status.SerializeToString()))
    context.set_trailing_metadata(trailing)
    context.abort(refused.grpc_code, refused.message)


def create_otlp_app(receiver: OtlpReceiver) -> FastAPI:
    """The OTLP/HTTP endpoints: ``POST /v1/traces`` and ``POST /v1/metrics``."""
    app = FastAPI(title="pdscale OTLP receiver", openapi_url=None, docs_url=None,
                  redoc_url=None)

    async def export(kind: str, request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        reply_type = ctype if ctype in (_PROTOBUF, _JSON) else _JSON
        try:
            receiver.check_access(request.headers.get("authorization"))
            if ctype not in (_PROTOBUF, _JSON):
                raise receiver._refuse("content_type", Refused(
                    415, grpc.StatusCode.INVALID_ARGUMENT,
                    f"expected Content-Type {_PROTOBUF} or {_JSON}, got {ctype or 'none'!r}"))
            body = await _read_body(request, receiver)
            response = receiver.submit(kind, body, ctype)
        except Refused as refused:
            return _http_problem(refused, reply_type)
        payload = response.SerializeToString() if reply_type == _PROTOBUF \
            else json_format.MessageToJson(response).encode()
        return Response(payload, media_type=reply_type)

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        return await export("traces", request)

    @app.post("/v1/metrics")
    async def metrics(request: Request) -> Response:
        return await export("metrics", request)

    return app


async def _read_body(request: Request, receiver: OtlpReceiver) -> bytes:
    limit = receiver.settings.max_request_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit():
        receiver.check_size(int(length) if request.headers.get("content-encoding") is None
                            else 0)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        receiver.check_size(len(body))
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("identity", ""):
        return bytes(body)
    if encoding != "gzip":
        raise receiver._refuse("content_type", Refused(
            415, grpc.StatusCode.INVALID_ARGUMENT,
            f"expected Content-Encoding gzip or none, got {encoding!r}"))
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(bytes(body), limit + 1)
    except zlib.error as exc:
        raise receiver._refuse("malformed", Refused(
            400, grpc.StatusCode.INVALID_ARGUMENT, f"the body is not gzip ({exc})")) from exc
    receiver.check_size(len(out))
    return out


def _http_problem(refused: Refused, reply_type: str) -> Response:
    """A refusal as OTLP/HTTP answers it: a ``google.rpc.Status`` in the request's encoding,
    ``Retry-After`` on 429."""
    status = status_pb2.Status(code=refused.grpc_code.value[0], message=refused.message)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if refused.http_status == 429 else None
    payload = status.SerializeToString() if reply_type == _PROTOBUF \
        else json_format.MessageToJson(status).encode()
    return Response(payload, status_code=refused.http_status, media_type=reply_type,
                    headers=headers)

