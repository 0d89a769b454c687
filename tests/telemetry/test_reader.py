"""The reader's connection handling against a loopback HTTP server that records requests."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pdscale.spec import load_spec
from pdscale.telemetry import (
    PrometheusAuth,
    PrometheusQueryError,
    PrometheusReader,
    PrometheusUnavailable,
    Signal,
)
from tests.conftest import ROOT, free_port

SPEC = load_spec(ROOT / "examples" / "vllm.yaml")


class _Recorder(BaseHTTPRequestHandler):
    status = 200
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": []}}).encode()
        if self.status != 200:
            body = json.dumps({"status": "error", "error": "nope"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Recorder", (_Recorder,), {"seen": [], "status": 200})
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_bearer_token_file_is_reread_when_it_changes(
        server: tuple[str, type[_Recorder]], tmp_path: Path) -> None:
    url, handler = server
    token = tmp_path / "token"
    token.write_text("first\n")
    reader = PrometheusReader(url, auth=PrometheusAuth(
        bearer_token_file=token, headers={"X-Scope-OrgID": "team-a"}), timeout_s=2)
    values = reader.read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    assert all(v[Signal.QUEUE_DEPTH].value is None for v in values.values())  # no data
    assert handler.seen[-1]["Authorization"] == "Bearer first"
    assert handler.seen[-1]["X-Scope-OrgID"] == "team-a"
    token.write_text("second\n")
    os.utime(token, (time.time() + 5, time.time() + 5))
    reader.read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    assert handler.seen[-1]["Authorization"] == "Bearer second"


def test_basic_auth(server: tuple[str, type[_Recorder]]) -> None:
    url, handler = server
    reader = PrometheusReader(url, auth=PrometheusAuth(basic_auth=("u", "p")), timeout_s=2)
    reader.read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    assert handler.seen[-1]["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()


def test_errors_split_by_what_to_do(server: tuple[str, type[_Recorder]]) -> None:
    url, handler = server
    handler.status = 503
    with pytest.raises(PrometheusUnavailable):
        PrometheusReader(url, timeout_s=2).read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    handler.status = 400
    with pytest.raises(PrometheusQueryError):
        PrometheusReader(url, timeout_s=2).read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnavailable) as info:
        PrometheusReader(down, timeout_s=1).read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())
    # The root cause, not the library's chain with the request's URL-encoded query.
    assert str(info.value) == f"cannot connect to {down} (Connection refused; is Prometheus up?)"


def test_an_answer_that_is_not_the_prometheus_api_is_a_query_error(
        server: tuple[str, type[_Recorder]]) -> None:
    """Grafana's address given by mistake answers 200 with an HTML page (and a proxy JSON
    without "data"): a query error naming the likely cause, not a JSONDecodeError."""
    url, handler = server

    def html(self: _Recorder) -> None:
        body = b"<!doctype html><title>Grafana</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    handler.do_GET = html  # type: ignore[method-assign]
    with pytest.raises(PrometheusQueryError, match="other than the Prometheus HTTP API"):
        PrometheusReader(url, timeout_s=2).read(SPEC, [Signal.QUEUE_DEPTH], at_s=time.time())


def test_unreadable_token_file_is_a_clear_error(tmp_path: Path) -> None:
    reader = PrometheusReader("http://127.0.0.1:9", auth=PrometheusAuth(
        bearer_token_file=tmp_path / "missing"))
    with pytest.raises(PrometheusQueryError, match="bearer token file"):
        reader.read(SPEC, [Signal.QUEUE_DEPTH], at_s=0)


class _Canned(BaseHTTPRequestHandler):
    """Answers every instant query with the same vector and records the queries."""

    rows: ClassVar[list[dict[str, Any]]] = []
    queries: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        from urllib.parse import parse_qs, urlsplit

        type(self).queries.append(parse_qs(urlsplit(self.path).query)["query"][0])
        body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": self.rows}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_pod_work_is_read_per_pod_in_one_query_and_stale_pods_are_unknown() -> None:
    from pdscale.spec import Role
    from pdscale.telemetry import pod_work_query, read_pod_work

    now = 1_800_000_000.0

    def row(pod: str, signal: str, value: str) -> dict[str, Any]:
        return {"metric": {"namespace": "llm", "pod": pod, "pdscale_pod_signal": signal},
                "value": [now, value]}

    handler = type("Canned", (_Canned,), {"queries": [], "rows": [
        row("p-0", "running", "2"), row("p-0", "waiting", "1"), row("p-0", "kv_usage", "0.25"),
        row("p-0", "sample_age_s", "3"),
        row("p-1", "running", "0"), row("p-1", "waiting", "NaN"),
        row("p-1", "sample_age_s", "4"),
        row("p-2", "running", "0"), row("p-2", "sample_age_s", "600"),  # stale: unknown
    ]})
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        service = SPEC.services[0]
        reader = PrometheusReader(f"http://127.0.0.1:{httpd.server_address[1]}", timeout_s=2,
                                  stale_after_s=120)
        work = read_pod_work(reader, service, Role.DECODE, at_s=now)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert handler.queries == [pod_work_query(service, Role.DECODE)]
    assert "by (namespace, pod)" in handler.queries[0]
    assert "by (namespace)" not in handler.queries[0]
    assert work["p-0"].running == 2 and work["p-0"].waiting == 1
    assert work["p-0"].kv_usage == 0.25 and work["p-0"].sample_time_s == now - 3
    assert work["p-1"].running == 0 and work["p-1"].waiting is None  # NaN is not zero
    assert work["p-2"].running is None and work["p-2"].sample_time_s == now - 600
def test_errors_belong_to_the_tree_the_reconciler_classifies_by() -> None:
    from pdscale.controller._reconciler import AdapterError
    from pdscale.errors import GiveUp, RetryLater

    assert issubclass(PrometheusUnavailable, RetryLater)
    assert issubclass(PrometheusQueryError, GiveUp)
    down = AdapterError.from_exception(PrometheusUnavailable("x"), None, 1.0)
    refused = AdapterError.from_exception(PrometheusQueryError("y"), None, 1.0)
    bug = AdapterError.from_exception(ZeroDivisionError("z"), None, 1.0, adapter="policy")
    assert (down.adapter, down.kind) == ("prometheus", "unavailable")
    assert (refused.adapter, refused.kind) == ("prometheus", "rejected")
    assert (bug.adapter, bug.kind, bug.message) == ("policy", "error", "ZeroDivisionError: z")
