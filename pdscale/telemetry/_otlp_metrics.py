"""OTLP metrics -> the catalog's measures: engines' series pushed over OTLP (by an OpenTelemetry
Collector scraping them, or by an engine's own OpenTelemetry SDK).

Design. Each metric the catalog reads from Prometheus is recognised by name (the engines'
released names, with or without the ``_total`` and ``_seconds`` suffixes a Collector's
Prometheus receiver may add or remove, and the OpenTelemetry GenAI server metrics
``gen_ai.server.*``), and kept per series (resource and point attributes) with the time of
its newest point:

* a gauge keeps its newest value; a pool's value is the sum (queues, running requests), mean
  and max (KV-cache usage, GPU utilisation) over its series that are fresh;
* a counter (a monotonic sum) is kept as one sample per resolution slot (cumulative
  temporality, resets counted as Prometheus' ``rate`` counts them) or as per-slot sums (delta
  temporality), and read as a rate over the catalog's window;
* a histogram, explicit or exponential, the same way, its buckets merged across series and
  read as ``histogram_quantile`` reads them (linear within a bucket). An exponential
  histogram's buckets become their upper bounds ``base ** (offset + i + 1)``.

A measure no series answers is None, never zero; a series whose newest point is older than
``stale_after`` no longer counts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

__all__ = [
    "METRIC_MEASURES",
    "MetricSeries",
    "explicit_buckets",
    "exponential_buckets",
    "histogram_quantile",
    "measure_of",
    "skip_point",
]

Kind = Literal["gauge", "counter", "histogram"]

_VLLM_SG = ("vllm:", "sglang:")
METRIC_MEASURES: dict[str, tuple[str, Kind, float]] = {
    # name (suffixes stripped) -> (measure, kind, scale)
    "vllm:num_requests_waiting": ("queue", "gauge", 1.0),
    "sglang:num_queue_reqs": ("queue", "gauge", 1.0),
    "vllm:num_requests_running": ("running", "gauge", 1.0),
    "sglang:num_running_reqs": ("running", "gauge", 1.0),
    "vllm:kv_cache_usage_perc": ("kv_usage", "gauge", 1.0),
    "sglang:token_usage": ("kv_usage", "gauge", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", "gauge", 0.01),
    "vllm:request_success": ("requests", "counter", 1.0),
    "sglang:num_requests": ("requests", "counter", 1.0),
    "vllm:prompt_tokens": ("prompt_tokens", "counter", 1.0),
    "sglang:prompt_tokens": ("prompt_tokens", "counter", 1.0),
    "vllm:generation_tokens": ("generation_tokens", "counter", 1.0),
    "sglang:generation_tokens": ("generation_tokens", "counter", 1.0),
    "vllm:prefix_cache_hits": ("cache_hits", "counter", 1.0),
    "vllm:prefix_cache_queries": ("cache_queries", "counter", 1.0),
    "sglang:cached_tokens": ("cache_hits", "counter", 1.0),
    "vllm:num_preemptions": ("preemptions", "counter", 1.0),
    "sglang:num_retracted_requests": ("preemptions", "counter", 1.0),
    "vllm:time_to_first_token": ("ttft", "histogram", 1.0),
    "sglang:time_to_first_token": ("ttft", "histogram", 1.0),
    "gen_ai.server.time_to_first_token": ("ttft", "histogram", 1.0),
    "vllm:inter_token_latency": ("itl", "histogram", 1.0),
    "sglang:inter_token_latency": ("itl", "histogram", 1.0),
    "gen_ai.server.time_per_output_token": ("itl", "histogram", 1.0),
    "vllm:e2e_request_latency": ("e2e", "histogram", 1.0),
    "sglang:e2e_request_latency": ("e2e", "histogram", 1.0),
    "gen_ai.server.request.duration": ("e2e", "histogram", 1.0),
}
"""The metrics read, by name without the ``_total`` and ``_seconds`` suffixes."""


def measure_of(name: str) -> tuple[str, Kind, float] | None:
    """The measure a metric name feeds, or None."""
    for suffix in ("_total", "_seconds"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return METRIC_MEASURES.get(name)


def skip_point(name: str, attrs: dict[str, str]) -> bool:
    """Points that would count twice: SGLang's per-priority copies of its scheduler series
    (the total is written under ``priority=""``, or without the label)."""
    return name.startswith(_VLLM_SG[1]) and attrs.get("priority", "") != ""


Buckets = tuple[tuple[float, float], ...]
"""(upper bound, count in the bucket), ascending; the last bound may be +inf."""


def explicit_buckets(bounds: Sequence[float], counts: Sequence[int]) -> Buckets:
    """An explicit histogram point's buckets (``counts`` has one more entry than
    ``bounds``: the +inf bucket)."""
    uppers = [*bounds, math.inf]
    return tuple((float(u), float(c)) for u, c in zip(uppers, counts, strict=False))


def exponential_buckets(point: Any) -> Buckets:
    """An exponential histogram point's buckets as upper bounds: the zero bucket at the zero
    threshold, each positive bucket i at ``base ** (offset + i + 1)`` (negative values,
    which no latency has, are left out)."""
    base = 2.0 ** (2.0 ** -point.scale)
    out: list[tuple[float, float]] = []
    if point.zero_count:
        out.append((float(point.zero_threshold), float(point.zero_count)))
    offset = point.positive.offset
    for i, count in enumerate(point.positive.bucket_counts):
        if count:
            out.append((base ** (offset + i + 1), float(count)))
    return tuple(out)


def _subtract(newer: Buckets, older: Buckets) -> Buckets | None:
    """Bucket counts gained between two cumulative points; None on a reset or when the
    bounds changed (an exponential histogram rescaled)."""
    old = dict(older)
    if set(old) - {u for u, _ in newer}:
        return None
    out = []
    for upper, count in newer:
        gained = count - old.get(upper, 0.0)
        if gained < 0:
            return None
        out.append((upper, gained))
    return tuple(out)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of merged buckets, interpolated linearly within its bucket (as
    PromQL's ``histogram_quantile``); None without observations."""
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    total = sum(merged.values())
    if total <= 0:
        return None
    rank = q * total
    seen, lower = 0.0, 0.0
    finite = [u for u in merged if math.isfinite(u)]
    for upper in sorted(merged):
        count = merged[upper]
        if seen + count >= rank and count > 0:
            if not math.isfinite(upper):
                return max(finite) if finite else None
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return max(finite) if finite else None


@dataclass
class MetricSeries:
    """One series' recent points: the newest value (gauges) or one sample per slot."""

    kind: Kind
    delta: bool
    newest_s: float = -math.inf
    value: float = math.nan
    samples: deque[tuple[int, float, float]] = field(default_factory=deque)
    """Counters: (slot, time, cumulative value or the slot's delta sum)."""
    hist: deque[tuple[int, float, Buckets]] = field(default_factory=deque)
    """Histograms: (slot, time, cumulative buckets or the slot's delta buckets)."""

    def add_number(self, slot: int, t_s: float, value: float, keep_from: int) -> None:
        if t_s >= self.newest_s:
            self.newest_s, self.value = t_s, value
        if self.kind == "gauge":
            return
        s = self.samples
        if s and s[-1][0] == slot:
            _, t0, v0 = s[-1]
            s[-1] = (slot, max(t0, t_s), v0 + value if self.delta else value)
        elif not s or slot > s[-1][0]:
            s.append((slot, t_s, value))
        while s and s[0][0] < keep_from:
            s.popleft()

    def add_buckets(self, slot: int, t_s: float, buckets: Buckets, keep_from: int) -> None:
        self.newest_s = max(self.newest_s, t_s)
        h = self.hist
        if h and h[-1][0] == slot:
            _, t0, b0 = h[-1]
            if self.delta:
                summed = dict(b0)
                for upper, count in buckets:
                    summed[upper] = summed.get(upper, 0.0) + count
                buckets = tuple(sorted(summed.items()))
            h[-1] = (slot, max(t0, t_s), buckets)
        elif not h or slot > h[-1][0]:
            h.append((slot, t_s, buckets))
        while h and h[0][0] < keep_from:
            h.popleft()

    def rate(self, first_slot: int, covered_s: float) -> float | None:
        """Increase per second over the slots from ``first_slot`` (None: not two samples of
        a cumulative counter, or no delta in the window)."""
        rows = [r for r in self.samples if r[0] >= first_slot]
        if self.delta:
            return sum(v for _, _, v in rows) / covered_s if rows and covered_s > 0 else None
        if len(rows) < 2:
            return None
        gained = 0.0
        for (_, _, before), (_, _, after) in pairwise(rows):
            gained += after - before if after >= before else after
        span = rows[-1][1] - rows[0][1]
        return gained / span if span > 0 else None

    def window_buckets(self, first_slot: int) -> Buckets | None:
        rows = [r for r in self.hist if r[0] >= first_slot]
        if not rows:
            return None
        if self.delta:
            summed: dict[float, float] = {}
            for _, _, buckets in rows:
                for upper, count in buckets:
                    summed[upper] = summed.get(upper, 0.0) + count
            return tuple(sorted(summed.items()))
        if len(rows) < 2:
            return None
        gained = _subtract(rows[-1][2], rows[0][2])
        return gained if gained is not None else rows[-1][2]
