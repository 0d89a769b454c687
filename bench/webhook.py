"""Alertmanager webhook throughput, latency and memory under a flood of distinct alerts.

    .venv/bin/python bench/webhook.py [--rate 1000] [--duration 600] [--connections 16]

The controller's API (uvicorn, the same app as ``pdscale run``) runs in its own process pinned
to one core (CPU 0), with Kubernetes behind the API stand-in and no Prometheus; the load
generator (asyncio, keep-alive connections) runs pinned to the other core and sends
``--rate`` deliveries per second, open loop, each a version-4 payload with one critical alert
whose fingerprint is new (so deduplication memory is exercised, not bypassed). Reactions run
under the default guards, so almost every alert ends rate-limited after the first few actions.

Reported: deliveries per second achieved, latency p50/p99/max (from when each delivery was due
to its full response), non-200
answers, the server's RSS each 10 s (first and last minute compared: flat memory means the
bounded dedupe table stopped growing). Targets (issue 6): >= 1,000 deliveries/s with p99
< 50 ms on one core; flat memory through a 10-minute flood.
Prints a table and writes bench/results/webhook.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SERVER = r'''
import sys, threading
sys.path.insert(0, {root!r})
from kubernetes import client as k8s
import uvicorn
from pdscale.controller._api import create_app
from pdscale.controller._runtime import Controller, reader_from_spec
from pdscale.spec import parse_spec
from tests.controller.kube_standin import ApiState, api_standin
spec = parse_spec(open({spec!r}).read())
state = ApiState()
state.add("llm", "deployments", "chat-prefill", 2)
state.add("llm", "deployments", "chat-decode", 2)
with api_standin(state) as url:
    conf = k8s.Configuration(host=url)
    conf.retries = False
    controller = Controller(spec, k8s.ApiClient(conf), reader_from_spec(spec),
                            leader_election=False)
    controller.warm()  # as pdscale run does before it is ready
    controller.receiver.start()
    uvicorn.run(create_app(controller), host="127.0.0.1", port={port}, log_level="error",
                access_log=False)
'''

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, max_replicas: 20}
      decode: {target: {name: chat-decode}, max_replicas: 20}
controller:
  prometheus: {url: "http://127.0.0.1:9", timeout: 1s}
reactions:
  auth: {bearer_token_env: PDSCALE_BENCH_TOKEN}
"""


def _body(i: int) -> bytes:
    alert = {"status": "firing", "labels": {
        "alertname": "LLMQueueBacklogHigh", "severity": "critical", "namespace": "llm",
        "pdscale_service": "chat", "pdscale_pool": "prefill" if i % 2 else "decode",
        "shard": str(i)}, "annotations": {"summary": "bench"},
        "startsAt": "2026-12-02T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph", "fingerprint": f"{i:016x}"}
    return json.dumps({"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0,
                       "status": "firing", "receiver": "pdscale", "groupLabels": {},
                       "commonLabels": alert["labels"], "commonAnnotations": {},
                       "externalURL": "http://alertmanager", "alerts": [alert]}).encode()


sends: list[tuple[float, float, float]] = []


async def _connection(port: int, queue: asyncio.Queue[tuple[int, float] | None],
                      latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while True:
        item = await queue.get()
        if item is None:
            writer.close()
            return
        i, due = item
        body = _body(i)
        head = (f"POST /v1/alerts/alertmanager HTTP/1.1\r\nHost: bench\r\n"
                f"Content-Type: application/json\r\nAuthorization: Bearer bench-token\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        started = time.perf_counter()
        writer.write(head + body)
        status_line = await reader.readline()
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        # From when the delivery was due, not when it was sent: a server that falls behind
        # shows up as latency (no coordinated omission).
        latencies.append(time.perf_counter() - min(started, due))
        sends.append((due, started - due, time.perf_counter() - started))
        code = int(status_line.split()[1])
        if code != 200:
            errors.append(code)


async def _load(port: int, rate: float, duration: float, connections: int,
                on_second: Any) -> tuple[list[float], list[int], float, int]:
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    latencies: list[float] = []
    errors: list[int] = []
    workers = [asyncio.create_task(_connection(port, queue, latencies, errors))
               for _ in range(connections)]
    start = time.perf_counter()
    sent = 0
    next_report = 1.0
    while (now := time.perf_counter() - start) < duration:
        due = int(now * rate)
        while sent < due:
            queue.put_nowait((sent, start + sent / rate))
            sent += 1
        if now >= next_report:
            on_second(now)
            next_report += 1.0
        await asyncio.sleep(0.002)
    while not queue.empty():
        await asyncio.sleep(0.01)
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    return latencies, errors, time.perf_counter() - start, sent


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def heap_check(alerts: int) -> list[tuple[int, float]]:
    """In process, without HTTP: validate and handle ``alerts`` distinct alerts and sample
    Python's traced heap (tracemalloc) every tenth of the way. A bounded heap means the
    receiver's tables stop growing; RSS steps beyond that are the allocator's."""
    import tracemalloc

    from kubernetes import client as k8s

    from pdscale.controller._runtime import Controller, reader_from_spec
    from pdscale.controller._webhook import AlertmanagerPayload
    from pdscale.spec import parse_spec
    from tests.controller.kube_standin import ApiState, api_standin

    spec = parse_spec(SPEC)
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 2)
    state.add("llm", "deployments", "chat-decode", 2)
    samples = []
    with api_standin(state) as url:
        conf = k8s.Configuration(host=url)
        conf.retries = False
        controller = Controller(spec, k8s.ApiClient(conf), reader_from_spec(spec),
                                leader_election=False)
        controller.kube.prime()
        tracemalloc.start()
        step = max(1, alerts // 10)
        for i in range(alerts):
            payload = AlertmanagerPayload.model_validate(json.loads(_body(i)))
            controller.receiver.submit(payload)
            controller.receiver.drain_queue()
            if (i + 1) % step == 0:
                samples.append((i + 1, tracemalloc.get_traced_memory()[0] / 1e6))
                print(f"  {i + 1:>8} alerts: traced heap {samples[-1][1]:6.1f} MB",
                      file=sys.stderr, flush=True)
        tracemalloc.stop()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--heap", type=int, metavar="ALERTS",
                        help="instead: handle this many distinct alerts in process and sample "
                             "the traced Python heap (writes bench/results/webhook-heap.json)")
    args = parser.parse_args()
    if args.heap:
        samples = heap_check(args.heap)
        print(f"{'alerts':>8} {'traced heap MB':>15}")
        for n, mb in samples:
            print(f"{n:>8} {mb:>15.1f}")
        out = ROOT / "bench" / "results" / "webhook-heap.json"
        out.write_text(json.dumps({"bench": "webhook-heap", "command": "bench/webhook.py "
                                   + " ".join(sys.argv[1:]), "samples": samples}, indent=2)
                       + "\n")
        print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
        return 0
    from tests.conftest import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pdscale-webhook-bench-") as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(SPEC)
        script = Path(tmp) / "server.py"
        script.write_text(SERVER.format(root=str(ROOT), spec=str(spec), port=port))
        env = {**os.environ, "PDSCALE_BENCH_TOKEN": "bench-token"}
        cores = os.cpu_count() or 1
        pin = ["taskset", "-c", "0"] if cores > 1 else []
        server = subprocess.Popen([*pin, sys.executable, str(script)], env=env)
        try:
            deadline = time.monotonic() + 60
            import urllib.request

            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("the controller API did not start") from None
                    time.sleep(0.3)
            if cores > 1:
                os.sched_setaffinity(0, {1})
            rss: list[tuple[float, float]] = [(0.0, _rss_mb(server.pid))]

            def on_second(t: float) -> None:
                if int(t) % 10 == 0:
                    rss.append((t, _rss_mb(server.pid)))
                    print(f"  {t:5.0f}s  server RSS {rss[-1][1]:6.1f} MB", file=sys.stderr,
                          flush=True)

            latencies, errors, wall, _sent = asyncio.run(
                _load(port, args.rate, args.duration, args.connections, on_second))
            rss.append((wall, _rss_mb(server.pid)))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as r:
                status = json.loads(r.read())["webhook"]
        finally:
            server.terminate()
            server.wait(timeout=10)
    if os.environ.get("PDSCALE_BENCH_DEBUG"):
        t0 = sends[0][0] if sends else 0
        worst = sorted(sends, key=lambda x: -(x[1] + x[2]))[:15]
        for d, wait, service in worst:
            print(f"due +{d - t0:7.3f}s  client wait {wait * 1000:7.1f} ms  "
                  f"server {service * 1000:7.1f} ms", file=sys.stderr)
    lat = sorted(latencies)
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1000
    first = [m for t, m in rss if t <= 60]
    last = [m for t, m in rss if t >= wall - 60]
    row = {"rate_target": args.rate, "duration_s": round(wall, 1), "deliveries": len(lat),
           "deliveries_per_s": len(lat) / wall, "latency_ms_p50": statistics.median(lat) * 1000,
           "latency_ms_p99": p99, "latency_ms_max": lat[-1] * 1000, "non_200": len(errors),
           "server_rss_mb_first_minute_max": max(first), "server_rss_mb_last_minute_max":
           max(last), "rss_samples": rss, "received": status["received"],
           "server_cpu": "pinned to 1 core" if (os.cpu_count() or 1) > 1 else "unpinned"}
    print(f"{'deliveries/s':>13} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'non-200':>8} "
          f"{'RSS 1st min MB':>15} {'RSS last min MB':>16}")
    print(f"{row['deliveries_per_s']:>13.0f} {row['latency_ms_p50']:>8.1f} {p99:>8.1f} "
          f"{row['latency_ms_max']:>8.1f} {row['non_200']:>8} {max(first):>15.1f} "
          f"{max(last):>16.1f}")
    out = ROOT / "bench" / "results" / "webhook.json"
    out.write_text(json.dumps({"bench": "webhook", "machine": platform.machine(),
                               "python": platform.python_version(),
                               "command": "bench/webhook.py " + " ".join(sys.argv[1:]),
                               "targets": {"deliveries_per_s": 1000, "p99_ms": 50},
                               "result": row}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
