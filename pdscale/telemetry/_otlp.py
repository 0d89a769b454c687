"""The OTLP signal source: engines' request spans and OTLP metrics -> the catalog's signals per
pool, read like the Prometheus reader's (:meth:`OtlpStore.read` returns ``SignalValue``s).

Design:

* Pure over decoded OTLP requests (``opentelemetry-proto`` messages) and an explicit ``now``:
  the network is ``controller._otlp_receiver``'s. One lock: one ingest thread writes, the
  reconcile loop reads once a tick.
* Spans (``telemetry._otlp_spans``) land in time slots of ``resolution_s`` by their end time:
  per slot and pool a t-digest per latency stage (TTFT, queue, prefill, transfer, ITL, e2e;
  ``fastdigest``, mergeable, at most ``max_centroids`` centroids each) and the request, token,
  cache and failure counts. A window (the catalog's :data:`RATE_WINDOW` and
  :data:`RECENT_WINDOW`) is the slots it covers merged; a rate divides by the time the slots
  cover, and by no more than the store has been receiving. Memory per pool is bounded by the
  slots of one window: nothing grows with traffic.
* ITL is weighted by tokens: a request's mean inter-token latency counts once per gap
  (``completion_tokens - 1``), in the digest and the re-exported histogram, as the engines'
  own ITL histograms observe every gap. A request-weighted quantile would let one long
  generation count as much as a two-token answer, and read low where long outputs are slow.
* Metrics (``telemetry._otlp_metrics``) are kept per series and read as rates, gauges and
  histogram quantiles over the same windows.
* A pool's data age is that of its newest span or point: :data:`Signal.SAMPLE_AGE_S`, as the
  Prometheus rules' engine-sample age, so the controller's staleness guard works the same.
* What is dropped is counted by reason (``drops``) with the last reason's detail, never
  guessed: unknown or ambiguous pools, timings missing, negative or inconsistent, spans from
  a clock ahead of ours (``clock_skew``) or older than the windows (``too_old``).

Quantile error of the sketch against the exact value and against Prometheus histograms:
``python bench/otlp.py --only accuracy`` (docs/opentelemetry.md shows the table).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastdigest import TDigest

from pdscale.spec import PoolKey, Role, Spec
from pdscale.telemetry._catalog import (
    RATE_WINDOW_S,
    RECENT_WINDOW_S,
    Signal,
)
from pdscale.telemetry._otlp_metrics import (
    MetricSeries,
    explicit_buckets,
    exponential_buckets,
    histogram_quantile,
    measure_of,
    skip_point,
)
from pdscale.telemetry._otlp_pools import PoolMatcher
from pdscale.telemetry._otlp_spans import RequestTiming, SpanProblem, request_timing
from pdscale.telemetry._reader import SignalValue

__all__ = ["STAGES", "IngestResult", "OtlpStore", "StageHistogram", "anyvalue_text"]

STAGES = ("ttft", "queue", "prefill", "transfer", "itl", "e2e")
"""The latency stages a request span gives (seconds)."""

_SPAN_QUANTILES: dict[Signal, tuple[str, float, float]] = {
    Signal.TTFT_P50_S: ("ttft", 0.5, RATE_WINDOW_S),
    Signal.TTFT_P95_S: ("ttft", 0.95, RATE_WINDOW_S),
    Signal.TTFT_P99_S: ("ttft", 0.99, RATE_WINDOW_S),
    Signal.TTFT_P95_RECENT_S: ("ttft", 0.95, RECENT_WINDOW_S),
    Signal.TTFT_QUEUE_P95_S: ("queue", 0.95, RATE_WINDOW_S),
    Signal.TTFT_PREFILL_P95_S: ("prefill", 0.95, RATE_WINDOW_S),
    Signal.TTFT_TRANSFER_P95_S: ("transfer", 0.95, RATE_WINDOW_S),
    Signal.ITL_P50_S: ("itl", 0.5, RATE_WINDOW_S),
    Signal.ITL_P95_S: ("itl", 0.95, RATE_WINDOW_S),
    Signal.E2E_P95_S: ("e2e", 0.95, RATE_WINDOW_S),
}
_SPAN_RATES: dict[Signal, str] = {
    Signal.REQUEST_RATE: "requests",
    Signal.PROMPT_TOKENS_PER_S: "prompt",
    Signal.GENERATION_TOKENS_PER_S: "completion",
}
_METRIC_QUANTILES: dict[Signal, tuple[str, float, float]] = {
    s: v for s, v in _SPAN_QUANTILES.items() if v[0] in ("ttft", "itl", "e2e")}
_METRIC_RATES: dict[Signal, str] = {
    Signal.REQUEST_RATE: "requests", Signal.PROMPT_TOKENS_PER_S: "prompt_tokens",
    Signal.GENERATION_TOKENS_PER_S: "generation_tokens",
    Signal.PREEMPTIONS_PER_S: "preemptions"}
_METRIC_GAUGES: dict[Signal, tuple[str, str]] = {
    Signal.QUEUE_DEPTH: ("queue", "sum"), Signal.RUNNING_REQUESTS: ("running", "sum"),
    Signal.KV_CACHE_USAGE_RATIO: ("kv_usage", "avg"),
    Signal.KV_CACHE_USAGE_MAX_RATIO: ("kv_usage", "max"),
    Signal.GPU_UTILIZATION_RATIO: ("gpu_util", "avg")}
_MAX_SERIES_PER_POOL = 2000
"""OTLP metric series kept per pool (beyond: dropped, ``series_limit``)."""


def anyvalue_text(value: Any) -> str:
    """An OTLP AnyValue as text (resource attributes are matched as strings)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return str(value.string_value)
    if kind in ("int_value", "double_value", "bool_value"):
        v = getattr(value, kind)
        return str(v).lower() if kind == "bool_value" else str(v)
    return str(getattr(value, kind))


@dataclass
class IngestResult:
    """What one export request gave: items accepted, dropped by reason, ignored."""

    accepted: int = 0
    ignored: int = 0
    """Spans that are no request span (an engine's other spans), metrics the catalog does
    not read."""
    dropped: dict[str, int] = field(default_factory=dict)
    detail: str | None = None
    """The last drop's reason in words."""

    def drop(self, reason: str, detail: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n
        self.detail = detail


@dataclass
class StageHistogram:
    """A pool's span-derived latency histogram since the start (cumulative), for re-export
    on ``/metrics`` in Prometheus' form."""

    bounds: tuple[float, ...]
    counts: list[int]
    """Per bound, observations at or below it (cumulative); the +Inf bucket is ``count``."""
    count: int = 0
    sum_s: float = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        """Count ``value`` ``weight`` times (a request's ITL once per inter-token gap)."""
        self.count += weight
        self.sum_s += value * weight
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += weight


_FOLD_AT = 128
"""Weighted ITL values a slot buffers before folding them into its digest."""


class _Slot:
    __slots__ = ("cache_prompt", "cached", "completion", "digests", "failed", "index",
                 "itl_pending", "outcomes", "prompt", "requests")

    def __init__(self, index: int) -> None:
        self.index = index
        self.digests: dict[str, TDigest] = {}
        self.itl_pending: list[tuple[float, int]] = []
        """(ITL, inter-token gaps) not yet in ``digests["itl"]``: at most :data:`_FOLD_AT`."""
        self.requests = 0
        self.prompt = 0.0
        self.completion = 0.0
        self.cached = 0.0
        self.cache_prompt = 0.0
        self.failed = 0
        self.outcomes = 0

    def count(self, name: str) -> float:
        return float(getattr(self, name))


class _PoolSpans:
    __slots__ = ("histograms", "newest_s", "slots", "spans")

    def __init__(self, histograms: dict[str, StageHistogram]) -> None:
        self.slots: deque[_Slot] = deque()
        self.newest_s = -math.inf
        self.spans = 0
        self.histograms = histograms


class _PoolMetrics:
    __slots__ = ("newest_s", "points", "series")

    def __init__(self) -> None:
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], MetricSeries] = {}
        self.newest_s = -math.inf
        self.points = 0


def _export_bounds(spec: Spec, key: PoolKey, stage: str) -> tuple[float, ...]:
    """Buckets of a re-exported stage histogram: the service's latency buckets for the kind
    (TTFT's for the TTFT stages, ITL's for ITL), which hold its SLO threshold, else a
    log-spaced set around the threshold."""
    service = spec.service(key[0])
    kind: Literal["ttft", "itl"] = "itl" if stage == "itl" else "ttft"
    threshold = service.slo.threshold_s(kind)
    if stage == "e2e":
        return tuple(threshold * m for m in (1, 2, 5, 10, 20, 50, 100, 200))
    known = service.buckets(kind)
    bounds = set(known) if known else {threshold * 2.0 ** k for k in range(-6, 5)}
    bounds.add(threshold)
    return tuple(sorted(b for b in bounds if b > 0))


class OtlpStore:
    """Spans and metrics received over OTLP, per pool, read as the catalog's signals."""

    def __init__(self, spec: Spec, *, started_s: float, resolution_s: float = 30.0,
                 stale_after_s: float = 120.0, max_clock_skew_s: float = 60.0,
                 max_centroids: int = 100) -> None:
        if resolution_s <= 0 or RATE_WINDOW_S % resolution_s:
            raise ValueError(f"The 'resolution_s' parameter of OtlpStore must divide "
                             f"{RATE_WINDOW_S:g} s. Got {resolution_s!r} instead.")
        self.spec = spec
        self.started_s = started_s
        self.resolution_s = float(resolution_s)
        self.stale_after_s = float(stale_after_s)
        self.max_clock_skew_s = float(max_clock_skew_s)
        self.max_centroids = max_centroids
        self._window_slots = round(RATE_WINDOW_S / self.resolution_s)
        self._matcher = PoolMatcher(spec)
        self._lock = threading.Lock()
        keys = [(s.name, role) for s in spec.services for role in s.pools]
        self._spans = {k: _PoolSpans({stage: StageHistogram(b, [0] * len(b))
                                      for stage in STAGES
                                      for b in [_export_bounds(spec, k, stage)]})
                       for k in keys}
        self._metrics = {k: _PoolMetrics() for k in keys}
        self.drops: dict[str, int] = {}
        """Spans and points dropped since the start, by reason."""
        self.last_drop: str | None = None
        self.accepted_spans = 0
        self.accepted_points = 0

    # -- ingest ------------------------------------------------------------------------------

    def _pool(self, resource: Any) -> PoolKey | tuple[str, str]:
        """The resource's pool, or (drop reason, detail)."""
        attrs = tuple(sorted((kv.key, anyvalue_text(kv.value)) for kv in resource.attributes))
        found = self._matcher.match(attrs)
        if isinstance(found, str):
            shown = ", ".join(f"{k}={v}" for k, v in attrs
                              if k.startswith(("service.", "k8s.")))
            return found, (f"a resource ({shown or 'no service.* or k8s.* attributes'}) that "
                           f"{'no pool' if found == 'unknown_pool' else 'several pools'} of "
                           "the spec selects: set the pools' selector.resource_attributes, or "
                           "put k8s.namespace.name and k8s.pod.name on the engine's resource")
        return found

    def _when(self, t_s: float, now_s: float, result: IngestResult) -> float | None:
        """The time an item counts at, or None (dropped) when it is ahead of ``now_s`` by
        more than the allowed skew or older than the windows keep."""
        if t_s > now_s + self.max_clock_skew_s:
            result.drop("clock_skew", f"data stamped {t_s - now_s:.0f} s ahead of the "
                        f"controller's clock (allowed: {self.max_clock_skew_s:g} s): sync "
                        "the engine host's clock (NTP)")
            return None
        if t_s < now_s - RATE_WINDOW_S - self.resolution_s:
            result.drop("too_old", f"data stamped {now_s - t_s:.0f} s ago, older than the "
                        f"{RATE_WINDOW_S:g} s window: check the exporter's queue and the "
                        "engine host's clock")
            return None
        return min(t_s, now_s)

    def ingest_traces(self, request: Any, now_s: float) -> IngestResult:
        """Take an ``ExportTraceServiceRequest``'s request spans."""
        result = IngestResult()
        with self._lock:
            for rs in request.resource_spans:
                key: PoolKey | tuple[str, str] | None = None
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        timing = request_timing(span)
                        if timing is None:
                            result.ignored += 1
                            continue
                        if key is None:
                            key = self._pool(rs.resource)
                        if not isinstance(key[1], Role):
                            result.drop(*key)
                            continue
                        pool: PoolKey = key  # type: ignore[assignment]
                        if isinstance(timing, SpanProblem):
                            result.drop(timing.reason, f"{timing.detail}; span "
                                        f"{span.name!r} of {pool[0]}/{pool[1].value}")
                            continue
                        self._add_span(pool, timing, now_s, result)
            self._account(result)
            self.accepted_spans += result.accepted
        return result

    def _account(self, result: IngestResult) -> None:
        for reason, n in result.dropped.items():
            self.drops[reason] = self.drops.get(reason, 0) + n
        if result.detail is not None:
            self.last_drop = result.detail

    def _slot_for(self, slots: deque[_Slot], index: int, now_index: int) -> _Slot | None:
        keep_from = now_index - self._window_slots
        while slots and slots[0].index < keep_from:
            slots.popleft()
        for slot in reversed(slots):
            if slot.index == index:
                return slot
            if slot.index < index:
                break
        if index < keep_from:
            return None
        new = _Slot(index)
        slots.append(new)
        if len(slots) > 1 and slots[-2].index > index:  # late data: keep the deque ordered
            ordered = sorted(slots, key=lambda s: s.index)
            slots.clear()
            slots.extend(ordered)
        return new

    def _add_span(self, key: PoolKey, timing: RequestTiming, now_s: float,
                  result: IngestResult) -> None:
        t = self._when(timing.end_s, now_s, result)
        if t is None:
            return
        pool = self._spans[key]
        res = self.resolution_s
        slot = self._slot_for(pool.slots, int(t // res), int(now_s // res))
        if slot is None:
            result.drop("too_old", "data older than the window")
            return
        values = (("ttft", timing.ttft_s), ("queue", timing.queue_s),
                  ("prefill", timing.prefill_s), ("transfer", timing.transfer_s),
                  ("itl", timing.itl_s), ("e2e", timing.e2e_s))
        for stage, value in values:
            if value is None:
                continue
            if stage == "itl":  # weighted by its gaps; itl_s is set only where completion > 1
                gaps = (timing.completion_tokens or 2) - 1
                slot.itl_pending.append((value, gaps))
                if len(slot.itl_pending) >= _FOLD_AT:
                    self._fold_itl(slot)
                pool.histograms[stage].observe(value, gaps)
                continue
            digest = slot.digests.get(stage)
            if digest is None:
                digest = slot.digests[stage] = TDigest(max_centroids=self.max_centroids)
            digest.update(value)
            pool.histograms[stage].observe(value)
        slot.requests += 1
        if timing.prompt_tokens is not None:
            slot.prompt += timing.prompt_tokens
            if timing.cached_tokens is not None:
                slot.cached += timing.cached_tokens
                slot.cache_prompt += timing.prompt_tokens
        if timing.completion_tokens is not None:
            slot.completion += timing.completion_tokens
        if timing.failed is not None:
            slot.outcomes += 1
            slot.failed += int(timing.failed)
        pool.newest_s = max(pool.newest_s, t)
        pool.spans += 1
        result.accepted += 1

    def _fold_itl(self, slot: _Slot) -> None:
        """Fold the slot's buffered ITLs into its digest, each a centroid weighted by the
        request's inter-token gaps (the t-digest takes weights only as centroids)."""
        if not slot.itl_pending:
            return
        pending = sorted(slot.itl_pending)
        slot.itl_pending.clear()
        weighted = TDigest.from_dict({
            "max_centroids": self.max_centroids, "min": pending[0][0], "max": pending[-1][0],
            "centroids": [{"m": m, "c": float(c)} for m, c in pending]})
        digest = slot.digests.get("itl")
        if digest is None:
            slot.digests["itl"] = weighted
        else:
            digest.merge_inplace(weighted)

    def ingest_metrics(self, request: Any, now_s: float) -> IngestResult:
        """Take an ``ExportMetricsServiceRequest``'s points of the metrics the catalog
        reads."""
        result = IngestResult()
        res = self.resolution_s
        keep_from = int(now_s // res) - self._window_slots - 1
        with self._lock:
            for rm in request.resource_metrics:
                key: PoolKey | tuple[str, str] | None = None
                resource: tuple[tuple[str, str], ...] = ()
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        measure = measure_of(metric.name)
                        kind = metric.WhichOneof("data")
                        if measure is None or kind is None:
                            result.ignored += 1
                            continue
                        if key is None:
                            key = self._pool(rm.resource)
                            resource = tuple(sorted(
                                (kv.key, anyvalue_text(kv.value))
                                for kv in rm.resource.attributes))
                        if not isinstance(key[1], Role):
                            reason, detail = key
                            result.drop(reason, detail, len(getattr(metric, kind).data_points))
                            continue
                        self._add_metric(key, resource, metric,  # type: ignore[arg-type]
                                         kind, measure, now_s, keep_from, result)
            self._account(result)
            self.accepted_points += result.accepted
        return result

    def _add_metric(self, key: PoolKey, resource: tuple[tuple[str, str], ...], metric: Any,
                    kind: str, measure: tuple[str, str, float], now_s: float, keep_from: int,
                    result: IngestResult) -> None:
        name, want, scale = measure
        data = getattr(metric, kind)
        got = {"gauge": "gauge", "sum": "counter", "histogram": "histogram",
               "exponential_histogram": "histogram"}.get(kind)
        if got != want or (kind == "sum" and not data.is_monotonic):
            result.drop("wrong_type", f"{metric.name} is a {kind}, expected a "
                        f"{'monotonic sum' if want == 'counter' else want}")
            return
        delta = getattr(data, "aggregation_temporality", 2) == 1
        pool = self._metrics[key]
        for point in data.data_points:
            attrs = {kv.key: anyvalue_text(kv.value) for kv in point.attributes}
            if skip_point(metric.name, attrs):
                result.ignored += 1
                continue
            t = self._when(point.time_unix_nano / 1e9, now_s, result)
            if t is None:
                continue
            sid = (name, (*resource, *sorted(attrs.items()), ("__metric__", metric.name)))
            series = pool.series.get(sid)
            if series is None:
                if len(pool.series) >= _MAX_SERIES_PER_POOL:
                    result.drop("series_limit", f"{key[0]}/{key[1].value} has "
                                f"{_MAX_SERIES_PER_POOL} series already: drop high-"
                                "cardinality attributes in the Collector")
                    continue
                series = pool.series[sid] = MetricSeries(want, delta)  # type: ignore[arg-type]
            slot = int(t // self.resolution_s)
            if want == "histogram":
                buckets = exponential_buckets(point) if kind == "exponential_histogram" \
                    else explicit_buckets(point.explicit_bounds, point.bucket_counts)
                series.add_buckets(slot, t, buckets, keep_from)
            else:
                value = point.as_double if point.WhichOneof("value") == "as_double" \
                    else float(point.as_int)
                if not math.isfinite(value):
                    result.drop("invalid_value", f"{metric.name} is not finite")
                    continue
                series.add_number(slot, t, value * scale, keep_from)
            pool.newest_s = max(pool.newest_s, t)
            pool.points += 1
            result.accepted += 1

    # -- read --------------------------------------------------------------------------------

    def _window(self, at_s: float, window_s: float) -> tuple[int, float]:
        """(first slot of the window ending at ``at_s``, seconds the window covers, capped at
        the time the store has been receiving)."""
        res = self.resolution_s
        now_index = int(at_s // res)
        first = now_index - round(window_s / res) + 1
        covered = min(at_s - first * res, at_s - self.started_s)
        return first, covered

    def _span_signals(self, pool: _PoolSpans, signals: Sequence[Signal], at_s: float
                      ) -> dict[Signal, float | None]:
        out: dict[Signal, float | None] = {}
        if pool.newest_s == -math.inf:
            return out
        merged: dict[tuple[str, float], TDigest | None] = {}
        for sig in signals:
            if sig in _SPAN_QUANTILES:
                stage, q, window = _SPAN_QUANTILES[sig]
                if (stage, window) not in merged:
                    first, _ = self._window(at_s, window)
                    merged[(stage, window)] = self._merge(pool.slots, stage, first)
                digest = merged[(stage, window)]
                out[sig] = digest.quantile(q) if digest is not None else None
        first, covered = self._window(at_s, RATE_WINDOW_S)
        rows = [s for s in pool.slots if first <= s.index]
        if covered < self.resolution_s:
            return out
        for sig, name in _SPAN_RATES.items():
            if sig in signals:
                out[sig] = sum(s.count(name) for s in rows) / covered
        if Signal.PROMPT_TOKENS_PEAK_PER_S in signals:
            out[Signal.PROMPT_TOKENS_PEAK_PER_S] = self._peak(rows, at_s, first)
        if Signal.ERROR_RATIO in signals:
            outcomes = sum(s.outcomes for s in rows)
            out[Signal.ERROR_RATIO] = sum(s.failed for s in rows) / outcomes if outcomes \
                else None
        if Signal.PREFIX_CACHE_HIT_RATIO in signals:
            prompt = sum(s.cache_prompt for s in rows)
            out[Signal.PREFIX_CACHE_HIT_RATIO] = sum(s.cached for s in rows) / prompt \
                if prompt > 0 else None
        return out

    def _peak(self, rows: Sequence[_Slot], at_s: float, first: int) -> float | None:
        """The highest prompt-token rate over :data:`RECENT_WINDOW` within the window (the
        Prometheus rule's ``max_over_time`` of a one-minute rate)."""
        res = self.resolution_s
        per = round(RECENT_WINDOW_S / res)
        tokens = {s.index: s.prompt for s in rows}
        now_index = int(at_s // res)
        best: float | None = None
        for end in range(first + per - 1, now_index + 1):
            start = end - per + 1
            span_s = min((end + 1) * res, at_s) - max(start * res, self.started_s)
            if span_s < res:
                continue
            rate = sum(tokens.get(i, 0.0) for i in range(start, end + 1)) / span_s
            best = rate if best is None else max(best, rate)
        return best

    def _merge(self, slots: Iterable[_Slot], stage: str, first: int) -> TDigest | None:
        merged: TDigest | None = None
        for slot in slots:
            if stage == "itl":
                self._fold_itl(slot)
            digest = slot.digests.get(stage)
            if slot.index < first or digest is None:
                continue
            if merged is None:
                merged = TDigest(max_centroids=self.max_centroids)
            merged.merge_inplace(digest)
        return merged

    def _metric_signals(self, pool: _PoolMetrics, signals: Sequence[Signal], at_s: float
                        ) -> dict[Signal, float | None]:
        out: dict[Signal, float | None] = {}
        if pool.newest_s == -math.inf:
            return out
        fresh = [(sid, s) for sid, s in pool.series.items()
                 if s.newest_s >= at_s - self.stale_after_s]
        first, covered = self._window(at_s, RATE_WINDOW_S)

        def rate(name: str, first_slot: int = first) -> float | None:
            rates = [s.rate(first_slot, covered) for sid, s in fresh if sid[0] == name]
            known = [r for r in rates if r is not None]
            return sum(known) if known else None

        for sig, (name, how) in _METRIC_GAUGES.items():
            if sig in signals:
                values = [s.value for sid, s in fresh if sid[0] == name]
                out[sig] = None if not values else sum(values) if how == "sum" else \
                    max(values) if how == "max" else sum(values) / len(values)
        for sig, name in _METRIC_RATES.items():
            if sig in signals:
                out[sig] = rate(name)
        if Signal.PREFIX_CACHE_HIT_RATIO in signals:
            hits = rate("cache_hits")
            queries = rate("cache_queries") or rate("prompt_tokens")
            out[Signal.PREFIX_CACHE_HIT_RATIO] = hits / queries \
                if hits is not None and queries else None
        for sig, (name, q, window) in _METRIC_QUANTILES.items():
            if sig in signals:
                start, _ = self._window(at_s, window)
                buckets: list[tuple[float, float]] = []
                for sid, s in fresh:
                    if sid[0] == name:
                        got = s.window_buckets(start)
                        buckets.extend(got or ())
                out[sig] = histogram_quantile(q, buckets)
        return out

    def read(self, spec: Spec, signals: Sequence[Signal], *, at_s: float
             ) -> dict[PoolKey, dict[Signal, SignalValue]]:
        """The signals of every pool at ``at_s``, as :meth:`PrometheusReader.read` returns
        them: spans answer first (exact latency), metrics where spans have no value. A pool
        with no data, or none newer than ``stale_after_s``, reads None throughout, with
        :data:`Signal.SAMPLE_AGE_S` its data's age where it ever had any."""
        out: dict[PoolKey, dict[Signal, SignalValue]] = {
            (s.name, role): {} for s in spec.services for role in Role}
        with self._lock:
            for key in out:
                spans, metrics = self._spans.get(key), self._metrics.get(key)
                if spans is None or metrics is None:
                    continue
                newest = max(spans.newest_s, metrics.newest_s)
                age = at_s - newest if math.isfinite(newest) else None
                values: dict[Signal, float | None] = {}
                if age is not None and age <= self.stale_after_s:
                    values = self._metric_signals(metrics, signals, at_s)
                    for sig, v in self._span_signals(spans, signals, at_s).items():
                        if v is not None or values.get(sig) is None:
                            values[sig] = v
                row = out[key]
                for sig in signals:
                    if sig is Signal.SAMPLE_AGE_S:
                        row[sig] = SignalValue(age, 0.0 if age is not None else None)
                        continue
                    v = values.get(sig)
                    fine = v is not None and math.isfinite(v)
                    row[sig] = SignalValue(v if fine else None, age)
        for row in out.values():
            for sig in signals:
                row.setdefault(sig, SignalValue(None, None))
        return out

    # -- diagnostics and re-export -------------------------------------------------------------

    def histograms(self) -> dict[PoolKey, Mapping[str, StageHistogram]]:
        """Each pool's span-derived stage histograms since the start (copies)."""
        with self._lock:
            return {key: {stage: StageHistogram(h.bounds, list(h.counts), h.count, h.sum_s)
                          for stage, h in pool.histograms.items()}
                    for key, pool in self._spans.items() if pool.spans}

    def pool_status(self, at_s: float) -> dict[PoolKey, dict[str, float | int | None]]:
        """Per pool: spans and metric points taken, and the age of the newest of each."""
        with self._lock:
            return {key: {
                "spans": self._spans[key].spans,
                "span_age_s": at_s - self._spans[key].newest_s
                if math.isfinite(self._spans[key].newest_s) else None,
                "metric_points": self._metrics[key].points,
                "metric_age_s": at_s - self._metrics[key].newest_s
                if math.isfinite(self._metrics[key].newest_s) else None}
                for key in self._spans}
