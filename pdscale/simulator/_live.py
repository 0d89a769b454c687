"""Live mode: the event simulator in scaled real time, exporting real engine metrics.

``/metrics`` serves what a Prometheus scraping a P/D deployment of the service's engine with
the DCGM exporter would see, one set of series per simulated pod (only ready and draining
replicas: a starting pod has no metrics yet), with the shapes each engine's release really
exports (vLLM 0.34.0, SGLang 0.5.23, Dynamo 1.6.1: see :class:`LiveCluster`), labelled
``namespace`` and ``pod`` (``<scale target>-<n>``, so the spec's default pod regex matches) as
a PodMonitor would; scrape it with ``honor_labels: true``. ``POST /scale`` with ``{"pool":
"prefill", "replicas": 3}`` scales a pool (the actuator a controller uses); ``GET /status``
reports simulated time and replicas.

Metric values are computed from the simulator's state at scrape time: counters and histograms
are cumulative since the start, gauges are current. The TTFT histogram is attributed to the
prefill pod that served the request, ITL and end-to-end latency to the decode pod (Dynamo: both
to the frontend, with the buckets the spec declares for it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pdscale.simulator._event import (
    EventSimulator,
    _DecodeReplica,
    _PrefillReplica,
    _Replica,
    _State,
)
from pdscale.spec import ENGINE_HISTOGRAM_BUCKETS, Engine, Role, ServiceSpec
from pdscale.telemetry import dynamo_label_namespace

if TYPE_CHECKING:
    from pdscale.simulator._livespans import SpanExport

__all__ = ["LiveCluster", "serve_live"]

_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                       80.0, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)
_TOKEN_BUCKETS = (0.0, 10.0, 100.0, 1000.0, 4000.0, 8000.0, 16000.0, 32000.0, 64000.0)
_FB_TOTAL_MIB = 81559.0
_NONE: np.ndarray[Any, Any] = np.zeros(0)
_DYNAMO_COMPONENT = {Role.PREFILL: "prefill", Role.DECODE: "backend"}


class _Families:
    """Metric families created on first use, yielded in creation order."""

    def __init__(self) -> None:
        self._by_name: dict[str, Any] = {}

    def add(self, kind: str, name: str, labels: Mapping[str, str], *values: Any) -> None:
        family = self._by_name.get(name)
        if family is None:
            cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
                   "histogram": HistogramMetricFamily}[kind]
            family = cls(name, name.replace("_", " "), labels=list(labels))
            self._by_name[name] = family
        family.add_metric(list(labels.values()), *values)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


class LiveCluster(Collector):
    """Owns the simulator, advances it with the wall clock, and collects its metrics.

    ``engine`` picks the series exported, as each engine's release exports them
    (shared/REFERENCE.md §1, §6): vLLM V1 per pod; SGLang per pod (scheduler gauges, tokenizer
    counters, P/D queues); Dynamo as a frontend (``dynamo_frontend_*``, labelled only
    ``model``) plus workers, where a prefill worker exports only the runtime's
    ``dynamo_component_*`` series (no ``vllm:*`` at all) and a decode worker re-exports vLLM's
    gauges labelled ``engine`` and ``model_name`` only. ``namespace`` and ``pod`` stand in for
    the scrape's target labels (scrape with ``honor_labels: true``)."""

    def __init__(self, sim: EventSimulator, *, namespace: str, model_name: str,
                 pod_prefix: dict[Role, str], speed: float = 1.0,
                 engine: Engine = Engine.VLLM, dynamo_namespace: str = "dynamo",
                 buckets: Mapping[str, tuple[float, ...]] | None = None,
                 frontend_pod: str = "frontend-0") -> None:
        if speed <= 0:
            raise ValueError(f"--speed must be positive, got {speed!r}")
        if engine is Engine.TGI:
            raise ValueError("the live simulator exports vLLM, SGLang or Dynamo series; "
                             "got engine 'tgi'")
        self.sim = sim
        self.namespace = namespace
        self.model_name = model_name
        self.pod_prefix = pod_prefix
        self.speed = speed
        self.engine = engine
        self.dynamo_namespace = dynamo_namespace
        defaults = ENGINE_HISTOGRAM_BUCKETS[engine if engine is not Engine.DYNAMO
                                            else Engine.VLLM]
        self.buckets = {k: tuple(b for b in (buckets or {}).get(k, defaults[k]) if b > 0)
                        for k in ("ttft", "itl")}
        self.frontend_pod = frontend_pod
        self.lock = threading.Lock()
        self._wall0: float | None = None
        self._last_busy: dict[int, tuple[float, float]] = {}
        self.scale_requests = 0
        self.spans: SpanExport | None = None
        """Set (:meth:`export_spans`): the pods also end a request span each over OTLP."""

    @classmethod
    def for_service(cls, sim: EventSimulator, service: ServiceSpec, *,
                    speed: float = 1.0) -> LiveCluster:
        """Export what the service's engine exports, with the buckets its spec declares."""
        kinds: tuple[Literal["ttft", "itl"], ...] = ("ttft", "itl")
        buckets: dict[str, tuple[float, ...]] = {k: b for k in kinds
                   if (b := service.buckets(k)) is not None}
        if service.engine is Engine.DYNAMO:
            # The frontend's buckets follow its DYN_METRICS_* settings (declared in the spec's
            # dynamo.histograms, else Dynamo's defaults), whatever histogram_buckets claims.
            for k in kinds:
                buckets[k] = service.frontend_buckets(k)
        return cls(sim, namespace=service.namespace, model_name=service.model_name,
                   pod_prefix={r: service.pools[r].target.name for r in Role}, speed=speed,
                   engine=service.engine,
                   dynamo_namespace=dynamo_label_namespace(service.dynamo.namespace)
                   if service.dynamo else "dynamo",
                   buckets=buckets, frontend_pod=f"{service.name}-frontend-0")

    def export_spans(self, endpoint: str, headers: dict[str, str] | None = None) -> None:
        """Have every pod export vLLM-shaped request spans to ``endpoint`` (OTLP/HTTP,
        ``.../v1/traces``) beside its metrics (``simulator._livespans``)."""
        from pdscale.simulator._livespans import SpanExport

        self.spans = SpanExport(self.sim, endpoint=endpoint, namespace=self.namespace,
                                pod_prefix=self.pod_prefix, speed=self.speed, headers=headers)

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
            if self.spans is not None:
                self.spans.emit(time.time())
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
                **({"spans": {"endpoint": self.spans.endpoint,
                              **{r.value: n for r, n in self.spans.spans.items()}}}
                   if self.spans is not None else {}),
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
        out = _Families()
        first = ~np.isnan(sim.first_token)
        finished = ~np.isnan(sim.finish)
        ttft_all = sim.first_token - sim.arrival
        e2e_all = sim.finish - sim.arrival
        ready_prefill = [r for r in sim.prefill if r.state is _State.READY]
        ready_decode = [r for r in sim.decode if r.state is _State.READY]
        shared_share = len(sim.shared_queue) // max(len(ready_prefill), 1)
        # Prefilled, not yet producing tokens, not waiting at a decode replica: in transfer.
        decode_waiting = sum(len(r.waiting) for r in sim.decode)
        in_transfer = int(((~np.isnan(sim.prefill_end)) & ~first).sum()) - decode_waiting
        transfer_share = max(0, in_transfer) // max(len(ready_decode), 1)
        now = sim.now
        for role, pool in ((Role.PREFILL, sim.prefill), (Role.DECODE, sim.decode)):
            for r in pool:
                if r.state not in (_State.READY, _State.DRAINING):
                    continue
                pod = self._pod(role, r)
                if isinstance(r, _PrefillReplica):
                    mine = sim.prefilled_by == r.id
                    done = mine & ~np.isnan(sim.prefill_end)
                    waiting = len(r.queue) + (shared_share if r.state is _State.READY else 0)
                    cap = sim.setup.prefill.profile.kv_capacity_tokens
                    prefill = {
                        "waiting": waiting, "running": len(r.active),
                        "kv": min(1.0, len(r.cache) * 512 / cap),
                        "prompt": float(sim.prompt[done].sum()),
                        "cached": float(sim.cached[done].sum()), "done": float(done.sum()),
                        "ttft": _histogram(ttft_all[mine & first], self.buckets["ttft"]),
                    }
                    self._prefill_pod(out, pod, r.id, prefill)
                else:
                    assert isinstance(r, _DecodeReplica)
                    mine = sim.decoded_by == r.id
                    done = mine & finished
                    cap = sim.setup.decode.profile.kv_capacity_tokens
                    decode = {
                        "waiting": len(r.waiting), "running": len(r.members),
                        "kv": min(1.0, r.kv() / cap), "tokens": float(r.tokens),
                        "preempted": float(r.preempted), "done": float(done.sum()),
                        "transfer": transfer_share if r.state is _State.READY else 0,
                        "itl": _weighted_histogram(r.itl_hist, sim.itl_edges,
                                                   self.buckets["itl"]),
                        "e2e": _histogram(e2e_all[done], _E2E_BUCKETS if self.engine is not
                                          Engine.SGLANG else _SGLANG_E2E_BUCKETS),
                    }
                    self._decode_pod(out, pod, r.id, decode)
                self._gpu(out, pod, r, now)
        if self.engine is Engine.DYNAMO:
            self._frontend(out, first, finished, ttft_all, e2e_all)
        yield from out

    # vLLM V1 (0.34.0): model_name and engine on every series.
    def _vllm_labels(self, pod: str) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": pod, "model_name": self.model_name,
                "engine": "0"}

    # SGLang (0.5.23): scheduler labels (no priority label: priority scheduling is off).
    def _sglang_labels(self, pod: str, role: Role) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": pod, "model_name": self.model_name,
                "engine_type": role.value, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}

    def _worker_labels(self, pod: str, role: Role, replica_id: int) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": pod,
                "dynamo_namespace": self.dynamo_namespace,
                "dynamo_component": _DYNAMO_COMPONENT[role], "dynamo_endpoint": "generate",
                "worker_id": f"{replica_id:016x}"}

    def _prefill_pod(self, out: _Families, pod: str, rid: int, v: dict[str, Any]) -> None:
        if self.engine is Engine.VLLM:
            lv = self._vllm_labels(pod)
            out.add("gauge", "vllm:num_requests_waiting", lv, v["waiting"])
            for reason, n in (("capacity", v["waiting"]), ("deferred", 0)):
                out.add("gauge", "vllm:num_requests_waiting_by_reason",
                        {**lv, "reason": reason}, n)
            out.add("gauge", "vllm:num_requests_running", lv, v["running"])
            out.add("gauge", "vllm:kv_cache_usage_perc", lv, v["kv"])
            out.add("counter", "vllm:prompt_tokens", lv, v["prompt"])
            for source, n in (("local_compute", v["prompt"] - v["cached"]),
                              ("local_cache_hit", v["cached"])):
                out.add("counter", "vllm:prompt_tokens_by_source", {**lv, "source": source}, n)
            out.add("counter", "vllm:prefix_cache_queries", lv, v["prompt"])
            out.add("counter", "vllm:prefix_cache_hits", lv, v["cached"])
            out.add("counter", "vllm:generation_tokens", lv, 0.0)
            out.add("counter", "vllm:num_preemptions", lv, 0.0)
            for reason, n in (("length", v["done"]), ("error", 0.0)):
                out.add("counter", "vllm:request_success", {**lv, "finished_reason": reason}, n)
            out.add("histogram", "vllm:time_to_first_token_seconds", lv, *v["ttft"])
            # Every vLLM pod exports every series, whatever its role.
            out.add("histogram", "vllm:inter_token_latency_seconds", lv,
                    *_histogram(_NONE, self.buckets["itl"]))
            out.add("histogram", "vllm:e2e_request_latency_seconds", lv,
                    *_histogram(_NONE, _E2E_BUCKETS))
        elif self.engine is Engine.SGLANG:
            lv = self._sglang_labels(pod, Role.PREFILL)
            tok = {**lv, "is_streaming": "true"}
            out.add("gauge", "sglang:num_queue_reqs", lv, v["waiting"])
            out.add("gauge", "sglang:num_prefill_bootstrap_queue_reqs", lv, 0)
            out.add("gauge", "sglang:num_running_reqs", lv, v["running"])
            out.add("gauge", "sglang:token_usage", lv, v["kv"])
            out.add("counter", "sglang:prompt_tokens_total", tok, v["prompt"])
            out.add("counter", "sglang:cached_tokens_total", {**lv, "cache_source": "device"},
                    v["cached"])
            out.add("counter", "sglang:generation_tokens_total", tok, 0.0)
            out.add("counter", "sglang:num_requests_total", tok, v["done"])
            out.add("counter", "sglang:num_aborted_requests_total", lv, 0.0)
            out.add("counter", "sglang:num_retracted_requests_total", lv, 0.0)
            out.add("counter", "sglang:num_transfer_failed_reqs_total", lv, 0.0)
            out.add("counter", "sglang:num_bootstrap_failed_reqs_total", lv, 0.0)
            out.add("histogram", "sglang:time_to_first_token_seconds", tok, *v["ttft"])
            out.add("histogram", "sglang:inter_token_latency_seconds", lv,
                    *_histogram(_NONE, self.buckets["itl"]))
            out.add("histogram", "sglang:e2e_request_latency_seconds", tok,
                    *_histogram(_NONE, _SGLANG_E2E_BUCKETS))
        else:
            # A Dynamo prefill worker: the runtime's own series only, no vllm:* at all.
            lw = self._worker_labels(pod, Role.PREFILL, rid)
            out.add("gauge", "dynamo_component_inflight_requests", lw,
                    v["waiting"] + v["running"])
            out.add("counter", "dynamo_component_requests_total", lw, v["done"])

    def _decode_pod(self, out: _Families, pod: str, rid: int, v: dict[str, Any]) -> None:
        if self.engine is Engine.VLLM:
            lv = self._vllm_labels(pod)
            out.add("gauge", "vllm:num_requests_waiting", lv, v["waiting"] + v["transfer"])
            for reason, n in (("capacity", v["waiting"]), ("deferred", v["transfer"])):
                out.add("gauge", "vllm:num_requests_waiting_by_reason",
                        {**lv, "reason": reason}, n)
            out.add("gauge", "vllm:num_requests_running", lv, v["running"])
            out.add("gauge", "vllm:kv_cache_usage_perc", lv, v["kv"])
            out.add("counter", "vllm:prompt_tokens", lv, 0.0)
            for source in ("local_compute", "local_cache_hit"):
                out.add("counter", "vllm:prompt_tokens_by_source", {**lv, "source": source},
                        0.0)
            out.add("counter", "vllm:prefix_cache_queries", lv, 0.0)
            out.add("counter", "vllm:prefix_cache_hits", lv, 0.0)
            out.add("histogram", "vllm:time_to_first_token_seconds", lv,
                    *_histogram(_NONE, self.buckets["ttft"]))
            out.add("counter", "vllm:generation_tokens", lv, v["tokens"])
            out.add("counter", "vllm:num_preemptions", lv, v["preempted"])
            for reason, n in (("stop", v["done"]), ("error", 0.0)):
                out.add("counter", "vllm:request_success", {**lv, "finished_reason": reason}, n)
            out.add("histogram", "vllm:inter_token_latency_seconds", lv, *v["itl"])
            out.add("histogram", "vllm:e2e_request_latency_seconds", lv, *v["e2e"])
        elif self.engine is Engine.SGLANG:
            lv = self._sglang_labels(pod, Role.DECODE)
            tok = {**lv, "is_streaming": "true"}
            out.add("gauge", "sglang:num_queue_reqs", lv, 0)
            out.add("gauge", "sglang:num_decode_prealloc_queue_reqs", lv, v["waiting"])
            out.add("gauge", "sglang:num_decode_transfer_queue_reqs", lv, v["transfer"])
            out.add("gauge", "sglang:num_running_reqs", lv, v["running"])
            out.add("gauge", "sglang:token_usage", lv, v["kv"])
            out.add("counter", "sglang:prompt_tokens_total", tok, 0.0)
            out.add("counter", "sglang:cached_tokens_total", {**lv, "cache_source": "device"},
                    0.0)
            out.add("histogram", "sglang:time_to_first_token_seconds", tok,
                    *_histogram(_NONE, self.buckets["ttft"]))
            out.add("counter", "sglang:generation_tokens_total", tok, v["tokens"])
            out.add("counter", "sglang:num_requests_total", tok, v["done"])
            out.add("counter", "sglang:num_aborted_requests_total", lv, 0.0)
            out.add("counter", "sglang:num_retracted_requests_total", lv, v["preempted"])
            out.add("counter", "sglang:num_transfer_failed_reqs_total", lv, 0.0)
            out.add("counter", "sglang:num_bootstrap_failed_reqs_total", lv, 0.0)
            out.add("histogram", "sglang:inter_token_latency_seconds", lv, *v["itl"])
            out.add("histogram", "sglang:e2e_request_latency_seconds", tok, *v["e2e"])
        else:
            # A Dynamo decode worker re-exports vLLM's gauges, labelled engine and model_name
            # only (no dynamo_component), beside the runtime's own series.
            lv = self._vllm_labels(pod)
            out.add("gauge", "vllm:num_requests_waiting", lv, v["waiting"])
            out.add("gauge", "vllm:num_requests_running", lv, v["running"])
            out.add("gauge", "vllm:kv_cache_usage_perc", lv, v["kv"])
            out.add("counter", "vllm:num_preemptions", lv, v["preempted"])
            out.add("histogram", "vllm:inter_token_latency_seconds", lv, *v["itl"])
            lw = self._worker_labels(pod, Role.DECODE, rid)
            out.add("gauge", "dynamo_component_inflight_requests", lw,
                    v["waiting"] + v["running"])
            out.add("counter", "dynamo_component_requests_total", lw, v["done"])

    def _frontend(self, out: _Families, first: np.ndarray[Any, Any],
                  finished: np.ndarray[Any, Any], ttft_all: np.ndarray[Any, Any],
                  e2e_all: np.ndarray[Any, Any]) -> None:
        """Dynamo's frontend (one process for the service): only the `model` label."""
        sim = self.sim
        lf = {"namespace": self.namespace, "pod": self.frontend_pod, "model": self.model_name}
        arrived = sim.arrival <= sim.now
        out.add("gauge", "dynamo_frontend_queued_requests", lf, float((arrived & ~first).sum()))
        out.add("gauge", "dynamo_frontend_inflight_requests", lf,
                float((arrived & ~finished).sum()))
        for status, error_type, n in (("success", "", float(finished.sum())),
                                      ("error", "internal", 0.0)):
            out.add("counter", "dynamo_frontend_requests",
                    {**lf, "endpoint": "chat_completions", "request_type": "stream",
                     "status": status, "error_type": error_type}, n)
        out.add("histogram", "dynamo_frontend_time_to_first_token_seconds", lf,
                *_histogram(ttft_all[first], self.buckets["ttft"], zero=True))
        out.add("histogram", "dynamo_frontend_inter_token_latency_seconds", lf,
                *_weighted_histogram(sim.itl_hist, sim.itl_edges, self.buckets["itl"],
                                     zero=True))
        out.add("histogram", "dynamo_frontend_input_sequence_tokens", lf,
                *_histogram(sim.prompt[first].astype(float), _TOKEN_BUCKETS))
        out.add("histogram", "dynamo_frontend_cached_tokens", lf,
                *_histogram(sim.cached[first].astype(float), _TOKEN_BUCKETS))
        out.add("counter", "dynamo_frontend_output_tokens", lf,
                float(sum(r.tokens for r in sim.decode)))
        out.add("histogram", "dynamo_frontend_request_duration_seconds", lf,
                *_histogram(e2e_all[finished], _E2E_BUCKETS))

    def _gpu(self, out: _Families, pod: str, r: _Replica, now: float) -> None:
        busy = self._busy_share(r, now)
        gl = {"namespace": self.namespace, "pod": pod, "gpu": "0", "UUID": f"GPU-sim-{r.id:08d}",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": f"node-{r.id % 8}"}
        out.add("gauge", "DCGM_FI_DEV_GPU_UTIL", gl, round(100 * busy))
        out.add("gauge", "DCGM_FI_DEV_FB_USED", gl, round(_FB_TOTAL_MIB * 0.9))
        out.add("gauge", "DCGM_FI_DEV_FB_FREE", gl, round(_FB_TOTAL_MIB * 0.1) - 500)
        out.add("gauge", "DCGM_FI_DEV_FB_RESERVED", gl, 500.0)
        out.add("gauge", "DCGM_FI_DEV_GPU_TEMP", gl, round(35 + 40 * busy))
        out.add("gauge", "DCGM_FI_DEV_POWER_USAGE", gl, round(90 + 600 * busy, 1))
        out.add("gauge", "DCGM_FI_DEV_XID_ERRORS", gl, 0.0)

    def _busy_share(self, r: _Replica, now: float) -> float:
        last_t, last_busy = self._last_busy.get(r.id, (r.requested_s, 0.0))
        self._last_busy[r.id] = (now, r.busy_s)
        span = now - last_t
        return 0.0 if span <= 0 else max(0.0, min(1.0, (r.busy_s - last_busy) / span))


def _le(bound: float, zero: bool) -> str:
    """``le`` as the client writes it: Python clients '0.5', '1.0'; Dynamo's Rust client
    '0.47', '1' (shortest form)."""
    return f"{bound:g}" if zero else repr(float(bound))


def _histogram(values: np.ndarray[Any, Any], bounds: tuple[float, ...], *,
               zero: bool = False) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets; ``zero``: Dynamo's histograms, whose first boundary is 0."""
    bounds = (0.0, *(b for b in bounds if b > 0)) if zero else bounds
    counts = np.searchsorted(np.sort(values), np.array(bounds), side="right")
    buckets = [(_le(b, zero), float(c)) for b, c in zip(bounds, counts, strict=True)]
    buckets.append(("+Inf", float(len(values))))
    return buckets, float(values.sum())


def _weighted_histogram(hist: np.ndarray[Any, Any] | None, edges: np.ndarray[Any, Any],
                        bounds: tuple[float, ...], *, zero: bool = False
                        ) -> tuple[list[tuple[str, float]], float]:
    bounds = (0.0, *(b for b in bounds if b > 0)) if zero else bounds
    if hist is None:
        return [(_le(b, zero), 0.0) for b in bounds] + [("+Inf", 0.0)], 0.0
    # Bucket i of the fine histogram holds values in (edges[i-1], edges[i]].
    centres = np.concatenate([[edges[0]], np.sqrt(edges[:-1] * edges[1:]), [edges[-1]]])
    cum = np.cumsum(hist)
    buckets = []
    for b in bounds:
        idx = int(np.searchsorted(edges, b, side="right"))
        buckets.append((_le(b, zero), float(cum[min(idx, len(cum) - 1)] if idx > 0 else 0)))
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
    trace is done (or ``stop`` is set). A port outside 0-65535 is a ValueError; one that
    cannot be listened on (taken, or a host not of this machine) the socket's OSError, raised
    before ``on_port`` is called and before the simulation starts."""
    if not 0 <= port <= 65535:  # the socket module says OverflowError, naming no port
        raise ValueError(f"port must be from 0 (any free port) to 65535, got {port}")
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
        if cluster.spans is not None:
            cluster.spans.close()
        with cluster.lock:
            cluster.sim.close()
