"""Live mode: the event simulator in scaled real time, exporting real engine metrics.

``/metrics`` serves what a Prometheus scraping a vLLM P/D deployment with the DCGM exporter
would see, one set of series per simulated pod (only ready and draining replicas: a starting
pod has no metrics yet), labelled ``namespace``, ``pod`` (``<scale target>-<n>``, so the spec's
default pod regex matches) and ``model_name``; scrape it with ``honor_labels: true``. ``POST
/scale`` with ``{"pool": "prefill", "replicas": 3}`` scales a pool (the actuator a controller
uses); ``GET /status`` reports simulated time and replicas.

Metric values are computed from the simulator's state at scrape time: counters and histograms
are cumulative since the start, gauges are current. Names follow vLLM V1 and the DCGM
exporter's defaults; the TTFT histogram is attributed to the prefill pod that served the
request, ITL and end-to-end latency to the decode pod.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pdscale.spec import ENGINE_HISTOGRAM_BUCKETS, Engine, Role
from simulator._event import EventSimulator, _DecodeReplica, _PrefillReplica, _Replica, _State

__all__ = ["LiveCluster", "serve_live"]

_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_FB_TOTAL_MIB = 81559.0


class LiveCluster(Collector):
    """Owns the simulator, advances it with the wall clock, and collects its metrics."""

    def __init__(self, sim: EventSimulator, *, namespace: str, model_name: str,
                 pod_prefix: dict[Role, str], speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"--speed must be positive, got {speed!r}")
        self.sim = sim
        self.namespace = namespace
        self.model_name = model_name
        self.pod_prefix = pod_prefix
        self.speed = speed
        self.lock = threading.Lock()
        self._wall0: float | None = None
        self._last_busy: dict[int, tuple[float, float]] = {}
        self.scale_requests = 0

    # -- time -----------------------------------------------------------------------------

    def start(self, wall_now: float) -> None:
        with self.lock:
            self.sim.start()
            self._wall0 = wall_now

    def step(self, wall_now: float) -> bool:
        """Advance to the simulated time matching ``wall_now``; False when the trace is done."""
        assert self._wall0 is not None, "call start() first"
        with self.lock:
            self.sim.advance((wall_now - self._wall0) * self.speed)
            return not self.sim.done_running

    def scale(self, pool: str, replicas: int) -> dict[str, Any]:
        role = Role(pool)
        with self.lock:
            self.sim.set_replicas(role, replicas)
            self.scale_requests += 1
            return {"pool": role.value, "desired": self.sim.desired[role],
                    **self.sim.counts(role)}

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "simulated_s": self.sim.now,
                "finished": self.sim.finished,
                "requests": len(self.sim.arrival),
                "pools": {r.value: {"desired": self.sim.desired[r], **self.sim.counts(r)}
                          for r in Role},
            }

    # -- metrics --------------------------------------------------------------------------

    def _pod(self, role: Role, replica: _Replica) -> str:
        return f"{self.pod_prefix[role]}-{replica.id}"

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        sim = self.sim
        labels = ["namespace", "pod", "model_name", "engine"]
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting", labels=labels)
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests running", labels=labels)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage (0-1)", labels=labels)
        prompt = CounterMetricFamily("vllm:prompt_tokens", "Prefill tokens", labels=labels)
        gen = CounterMetricFamily("vllm:generation_tokens", "Generated tokens", labels=labels)
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix-cache queries (tokens)",
                                      labels=labels)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix-cache hits (tokens)",
                                   labels=labels)
        preempt = CounterMetricFamily("vllm:num_preemptions", "Preemptions", labels=labels)
        success = CounterMetricFamily("vllm:request_success", "Finished requests",
                                      labels=[*labels, "finished_reason"])
        ttft = HistogramMetricFamily("vllm:time_to_first_token_seconds", "TTFT", labels=labels)
        itl = HistogramMetricFamily("vllm:inter_token_latency_seconds", "ITL", labels=labels)
        e2e = HistogramMetricFamily("vllm:e2e_request_latency_seconds", "E2E latency",
                                    labels=labels)
        gpu_labels = ["namespace", "pod", "gpu", "UUID", "modelName", "Hostname"]
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
                                 labels=gpu_labels)
        fb_used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer used (MiB).",
                                    labels=gpu_labels)
        fb_free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer free (MiB).",
                                    labels=gpu_labels)
        fb_res = GaugeMetricFamily("DCGM_FI_DEV_FB_RESERVED", "Framebuffer reserved (MiB).",
                                   labels=gpu_labels)
        temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
                                 labels=gpu_labels)
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
                                  labels=gpu_labels)
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Last XID error.", labels=gpu_labels)

        ttft_b = ENGINE_HISTOGRAM_BUCKETS[Engine.VLLM]["ttft"]
        itl_b = ENGINE_HISTOGRAM_BUCKETS[Engine.VLLM]["itl"]
        first = ~np.isnan(sim.first_token)
        finished = ~np.isnan(sim.finish)
        ttft_all = sim.first_token - sim.arrival
        e2e_all = sim.finish - sim.arrival
        ready_prefill = [r for r in sim.prefill if r.state is _State.READY]
        shared_share = len(sim.shared_queue) // max(len(ready_prefill), 1)
        now = sim.now
        for role, pool in ((Role.PREFILL, sim.prefill), (Role.DECODE, sim.decode)):
            for r in pool:
                if r.state not in (_State.READY, _State.DRAINING):
                    continue
                pod = self._pod(role, r)
                lv = [self.namespace, pod, self.model_name, "0"]
                if isinstance(r, _PrefillReplica):
                    mine = sim.prefilled_by == r.id
                    done = mine & ~np.isnan(sim.prefill_end)
                    waiting.add_metric(lv, len(r.queue) + (shared_share if r.state is
                                                           _State.READY else 0))
                    running.add_metric(lv, len(r.active))
                    cap = sim.setup.prefill.profile.kv_capacity_tokens
                    kv.add_metric(lv, min(1.0, len(r.cache) * 512 / cap))
                    p_tokens = float(sim.prompt[done].sum())
                    prompt.add_metric(lv, p_tokens)
                    queries.add_metric(lv, p_tokens)
                    hits.add_metric(lv, float(sim.cached[done].sum()))
                    gen.add_metric(lv, 0.0)
                    success.add_metric([*lv, "length"], float(done.sum()))
                    ttft.add_metric(lv, *_histogram(ttft_all[mine & first], ttft_b))
                else:
                    assert isinstance(r, _DecodeReplica)
                    mine = sim.decoded_by == r.id
                    done = mine & finished
                    cap = sim.setup.decode.profile.kv_capacity_tokens
                    waiting.add_metric(lv, len(r.waiting))
                    running.add_metric(lv, len(r.members))
                    kv.add_metric(lv, min(1.0, r.kv() / cap))
                    prompt.add_metric(lv, 0.0)
                    gen.add_metric(lv, float(r.tokens))
                    preempt.add_metric(lv, float(r.preempted))
                    success.add_metric([*lv, "stop"], float(done.sum()))
                    itl.add_metric(lv, *_weighted_histogram(r.itl_hist, sim.itl_edges, itl_b))
                    e2e.add_metric(lv, *_histogram(e2e_all[done], _E2E_BUCKETS))
                busy = self._busy_share(r, now)
                gl = [self.namespace, pod, "0", f"GPU-sim-{r.id:08d}", "NVIDIA H100 80GB HBM3",
                      f"node-{r.id % 8}"]
                util.add_metric(gl, round(100 * busy))
                fb_used.add_metric(gl, round(_FB_TOTAL_MIB * 0.9))
                fb_free.add_metric(gl, round(_FB_TOTAL_MIB * 0.1) - 500)
                fb_res.add_metric(gl, 500.0)
                temp.add_metric(gl, round(35 + 40 * busy))
                power.add_metric(gl, round(90 + 600 * busy, 1))
                xid.add_metric(gl, 0.0)
        yield from (waiting, running, kv, prompt, gen, queries, hits, preempt, success, ttft,
                    itl, e2e, util, fb_used, fb_free, fb_res, temp, power, xid)

    def _busy_share(self, r: _Replica, now: float) -> float:
        last_t, last_busy = self._last_busy.get(r.id, (r.requested_s, 0.0))
        self._last_busy[r.id] = (now, r.busy_s)
        span = now - last_t
        return 0.0 if span <= 0 else max(0.0, min(1.0, (r.busy_s - last_busy) / span))


def _histogram(values: np.ndarray[Any, Any],
               bounds: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    counts = np.searchsorted(np.sort(values), np.array(bounds), side="right")
    buckets = [(repr(float(b)), float(c)) for b, c in zip(bounds, counts, strict=True)]
    buckets.append(("+Inf", float(len(values))))
    return buckets, float(values.sum())


def _weighted_histogram(hist: np.ndarray[Any, Any] | None, edges: np.ndarray[Any, Any],
                        bounds: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    if hist is None:
        return [(repr(float(b)), 0.0) for b in bounds] + [("+Inf", 0.0)], 0.0
    # Bucket i of the fine histogram holds values in (edges[i-1], edges[i]].
    centres = np.concatenate([[edges[0]], np.sqrt(edges[:-1] * edges[1:]), [edges[-1]]])
    cum = np.cumsum(hist)
    buckets = []
    for b in bounds:
        idx = int(np.searchsorted(edges, b, side="right"))
        buckets.append((repr(float(b)), float(cum[min(idx, len(cum) - 1)] if idx > 0 else 0)))
    buckets.append(("+Inf", float(cum[-1])))
    return buckets, float((hist * centres).sum())


class _Handler(BaseHTTPRequestHandler):
    cluster: LiveCluster
    registry: CollectorRegistry

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            data = generate_latest(self.registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path.startswith("/status"):
            self._json(200, self.cluster.status())
        else:
            self._json(404, {"error": "not found; try /metrics, /status or POST /scale"})

    def do_POST(self) -> None:
        if not self.path.startswith("/scale"):
            self._json(404, {"error": "not found; POST /scale"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > 4096:
            self._json(413, {"error": "body too large"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            pool, replicas = str(body["pool"]), int(body["replicas"])
            if replicas < 0:
                raise ValueError("replicas must be >= 0")
            self._json(200, self.cluster.scale(pool, replicas))
        except (KeyError, ValueError, TypeError) as exc:
            self._json(400, {"error": f"expected {{\"pool\": \"prefill\"|\"decode\", "
                                      f"\"replicas\": N}}: {exc}"})

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve_live(cluster: LiveCluster, *, host: str = "127.0.0.1", port: int = 0,
               stop: threading.Event | None = None, tick_wall_s: float = 0.05,
               ready: threading.Event | None = None,
               on_port: Any = None) -> None:
    """Serve metrics and scaling over HTTP while advancing the simulation; returns when the
    trace is done (or ``stop`` is set)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(cluster)
    handler = type("LiveHandler", (_Handler,), {"cluster": cluster, "registry": registry})
    server = ThreadingHTTPServer((host, port), handler)
    if on_port is not None:
        on_port(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop = stop or threading.Event()
    try:
        cluster.start(time.monotonic())
        if ready is not None:
            ready.set()
        while not stop.is_set():
            if not cluster.step(time.monotonic()):
                break
            stop.wait(tick_wall_s)
    finally:
        server.shutdown()
        server.server_close()
        with cluster.lock:
            cluster.sim.close()
