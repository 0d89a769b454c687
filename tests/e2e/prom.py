"""Real Prometheus on loopback for end-to-end tests, and a small exporter of engine-named
series (the exporter stands in for vLLM, SGLang, Dynamo and DCGM pods)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pdscale._servers import alertmanager_argv, find_binary, prometheus_argv, wait_ready
from pdscale.telemetry import KNOWN_METRICS

_BUCKETS = (0.001, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _families(engine: str) -> list[str]:
    prefixes = {"vllm": ("vllm:",), "sglang": ("sglang:",), "dynamo": ("dynamo_frontend_",),
                "dynamo_worker": ("dynamo_component_",), "tgi": ("tgi_",),
                "dcgm": ("DCGM_",)}[engine]
    names = {n for n in KNOWN_METRICS if n.startswith(prefixes)}
    # vLLM's external-cache counters are catalogued; include every bucket family's base.
    return sorted(names)


def _fmt(name: str, labels: dict[str, str], value: float) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}} {value:.3f}"


def exposition(engine: str, labels: dict[str, str], now: float) -> str:
    """Text exposition for one pod: gauges, counters growing with time, histograms."""
    lines: list[str] = []
    done: set[str] = set()
    for name in _families(engine):
        if name.endswith(("_bucket", "_count")) or (name.endswith("_sum")
                                                    and not name.endswith("tokens_sum")):
            base = name.rsplit("_", 1)[0]
            if base in done:
                continue
            done.add(base)
            n = now * 2.0
            for i, le in enumerate((*_BUCKETS, float("inf"))):
                share = min(1.0, (i + 1) / len(_BUCKETS))
                le_text = "+Inf" if le == float("inf") else repr(le)
                lines.append(_fmt(f"{base}_bucket", {**labels, "le": le_text}, n * share))
            lines.append(_fmt(f"{base}_count", labels, n))
            lines.append(_fmt(f"{base}_sum", labels, n * 0.2))
        elif name.endswith(("_total", "tokens_sum")) or name in (
                "tgi_request_count", "tgi_request_failure"):
            extra = {"finished_reason": "stop"} if name == "vllm:request_success_total" \
                else {"status": "success"} if name.startswith("dynamo_") else {}
            lines.append(_fmt(name, {**labels, **extra}, now * 3.0))
        elif name.startswith("DCGM_"):
            value = 0.0 if name == "DCGM_FI_DEV_XID_ERRORS" else \
                40000.0 if name.startswith("DCGM_FI_DEV_FB") else 50.0
            lines.append(_fmt(name, {**labels, "gpu": "0"}, value))
        else:
            lines.append(_fmt(name, labels, 0.5))
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        engine = query.get("engine", ["vllm"])[0]
        labels = json.loads(query.get("labels", ["{}"])[0])
        body = exposition(engine, labels, time.time()).encode()
        if engine != "dcgm" and engine != "dynamo":
            body += exposition("dcgm", {}, time.time()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class Exporter(str):
    """The exporter's ``host:port``, and :meth:`close` to kill it mid-test (a dead target).
    Use ``str(address)`` where a plain string is needed (YAML configs)."""

    server: ThreadingHTTPServer

    def close(self) -> None:
        if self.server.socket.fileno() != -1:
            self.server.shutdown()
            self.server.server_close()


def _represent_exporter(dumper: Any, value: Exporter) -> Any:
    return dumper.represent_str(str(value))


def _yaml_knows_exporters() -> None:
    import yaml

    yaml.SafeDumper.add_representer(Exporter, _represent_exporter)


_yaml_knows_exporters()


@contextmanager
def exporter(port: int) -> Iterator[Exporter]:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = Exporter(f"127.0.0.1:{port}")
    address.server = server
    try:
        yield address
    finally:
        address.close()


@contextmanager
def _server(name: str, argv: list[str], workdir: Path, port: int,
            timeout_s: float) -> Iterator[str]:
    """Run a Prometheus-family server on loopback until its /-/ready answers; stop it after."""
    log_path = workdir / f"{name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(f"{url}/-/ready", timeout_s, proc):
            raise RuntimeError(f"{name} did not become ready: {log_path.read_text()}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _config(workdir: Path, name: str, config: dict[str, Any]) -> Path:
    import yaml

    path = workdir / f"{name}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def prometheus(config: dict[str, Any], workdir: Path, port: int,
               timeout_s: float = 30.0) -> Iterator[str]:
    """Start the distribution's Prometheus on loopback with ``config``; stop it after."""
    binary = find_binary("prometheus")
    assert binary is not None
    argv = prometheus_argv(binary, _config(workdir, "prometheus", config), workdir / "data",
                           port)
    with _server("prometheus", argv, workdir, port, timeout_s) as url:
        yield url


@contextmanager
def alertmanager(config: dict[str, Any], workdir: Path, port: int,
                 timeout_s: float = 30.0) -> Iterator[str]:
    """Start the distribution's Alertmanager on loopback (no HA cluster) with ``config``."""
    binary = find_binary("alertmanager")
    assert binary is not None
    argv = alertmanager_argv(binary, _config(workdir, "alertmanager", config),
                             workdir / "am-data", port)
    with _server("alertmanager", argv, workdir, port, timeout_s) as url:
        yield url


def eventually(check: Any, timeout_s: float = 30.0, what: str = "the condition",
               detail: Any = None, poll_s: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail after ``timeout_s``
    naming ``what`` and, if given, ``detail()`` (the state that explains the failure)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}"
                                 + (f"; {detail()}" if detail else ""))
        time.sleep(poll_s)


def api(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    query = "?" + urllib.parse.urlencode(params) if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=10) as resp:
        return json.loads(resp.read())
