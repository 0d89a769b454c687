"""OTLP metrics -> signals: an engine's series pushed over OTLP (gauges, counters as rates,
explicit and exponential histograms), missing as None, with the data's age."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m

from pdscale.spec import Role, Spec, load_spec
from pdscale.telemetry import OtlpStore, Signal
from pdscale.telemetry._otlp_metrics import histogram_quantile
from tests.conftest import ROOT

T0 = 1_700_000_000.0
PREFILL = ("llama-chat", Role.PREFILL)
CUMULATIVE, DELTA = 2, 1


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(ROOT / "examples" / "vllm.yaml")


def _kv(k: str, v: str) -> KeyValue:
    return KeyValue(key=k, value=AnyValue(string_value=v))


def _request(metrics: list[Any], pod: str = "llama-chat-prefill-a") -> Any:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend([_kv("k8s.namespace.name", "llm"), _kv("k8s.pod.name", pod)])
    rm.scope_metrics.add().metrics.extend(metrics)
    return req


def _gauge(name: str, value: float, t: float, **attrs: str) -> Any:
    metric = m.Metric(name=name)
    metric.gauge.data_points.add(as_double=value, time_unix_nano=int(t * 1e9),
                                 attributes=[_kv(k, v) for k, v in attrs.items()])
    return metric


def _counter(name: str, value: float, t: float, temporality: int = CUMULATIVE) -> Any:
    metric = m.Metric(name=name)
    metric.sum.is_monotonic = True
    metric.sum.aggregation_temporality = temporality
    metric.sum.data_points.add(as_double=value, time_unix_nano=int(t * 1e9))
    return metric


def _histogram(name: str, bounds: list[float], counts: list[int], t: float) -> Any:
    metric = m.Metric(name=name)
    metric.histogram.aggregation_temporality = CUMULATIVE
    metric.histogram.data_points.add(explicit_bounds=bounds, bucket_counts=counts,
                                     count=sum(counts), time_unix_nano=int(t * 1e9))
    return metric


def test_gauges_counters_and_histograms_become_signals(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    bounds = [0.1, 0.25, 0.5, 1.0]
    for i, t in enumerate((T0 - 240, T0 - 120, T0 - 5)):
        store.ingest_metrics(_request([
            _gauge("vllm:num_requests_waiting", 3 + i, t),
            _gauge("vllm:kv_cache_usage_perc", 0.5, t),
            _counter("vllm:prompt_tokens_total", 1000.0 * (t - T0 + 300), t),
            _counter("vllm:request_success_total", 2.0 * (t - T0 + 300), t),
            _histogram("vllm:time_to_first_token_seconds", bounds,
                       [0, 10 * i, 80 * i, 10 * i, 0], t)]), T0)
        store.ingest_metrics(_request([_gauge("vllm:num_requests_waiting", 1, t)],
                                      pod="llama-chat-prefill-b"), T0)
    row = store.read(spec, [Signal.QUEUE_DEPTH, Signal.KV_CACHE_USAGE_RATIO,
                            Signal.PROMPT_TOKENS_PER_S, Signal.REQUEST_RATE, Signal.TTFT_P50_S,
                            Signal.TTFT_P95_S, Signal.RUNNING_REQUESTS,
                            Signal.SAMPLE_AGE_S], at_s=T0)[PREFILL]
    assert row[Signal.QUEUE_DEPTH].value == 5 + 1  # the newest of each pod's series, summed
    assert row[Signal.KV_CACHE_USAGE_RATIO].value == 0.5
    assert row[Signal.PROMPT_TOKENS_PER_S].value == pytest.approx(1000.0)
    assert row[Signal.REQUEST_RATE].value == pytest.approx(2.0)
    # The window's buckets are the newest cumulative point less the oldest in the window.
    want = histogram_quantile(0.5, list(zip([*bounds, float("inf")], [0, 20, 160, 20, 0],
                                            strict=True)))
    assert row[Signal.TTFT_P50_S].value == pytest.approx(want)
    assert 0.25 < row[Signal.TTFT_P50_S].value < 0.5
    assert row[Signal.RUNNING_REQUESTS].value is None  # never sent: missing, not zero
    assert row[Signal.SAMPLE_AGE_S].value == pytest.approx(5)


def test_a_counter_reset_counts_like_prometheus_rate(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    for t, v in ((T0 - 200, 1000.0), (T0 - 100, 2000.0), (T0 - 50, 100.0), (T0 - 10, 500.0)):
        store.ingest_metrics(_request([_counter("vllm:generation_tokens", v, t)]), T0)
    rate = store.read(spec, [Signal.GENERATION_TOKENS_PER_S], at_s=T0)[PREFILL][
        Signal.GENERATION_TOKENS_PER_S].value
    assert rate == pytest.approx((1000 + 100 + 400) / 190)


def test_delta_counters_and_exponential_histograms(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    for t in (T0 - 100, T0 - 40):
        metric = m.Metric(name="gen_ai.server.time_to_first_token")
        metric.exponential_histogram.aggregation_temporality = DELTA
        point = metric.exponential_histogram.data_points.add(
            scale=3, zero_count=0, time_unix_nano=int(t * 1e9), count=100)
        # base 2**(1/8): bucket index -9 is (0.458, 0.5]; all 100 requests there
        point.positive.offset = -9
        point.positive.bucket_counts.extend([100])
        store.ingest_metrics(_request([metric, _counter("sglang:prompt_tokens", 600.0, t,
                                                        DELTA)]), T0)
    row = store.read(spec, [Signal.TTFT_P95_S, Signal.PROMPT_TOKENS_PER_S], at_s=T0)[PREFILL]
    assert 2 ** (-9 / 8) < row[Signal.TTFT_P95_S].value <= 2 ** (-8 / 8)
    assert row[Signal.PROMPT_TOKENS_PER_S].value == pytest.approx(1200 / 300, rel=0.11)


def test_wrong_types_stale_series_and_unknown_metrics(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600, stale_after_s=60)
    got = store.ingest_metrics(_request([
        _counter("vllm:num_requests_waiting", 3, T0 - 1),       # a gauge sent as a counter
        _gauge("process_cpu_seconds_total", 1, T0 - 1),          # not read: ignored
        _gauge("sglang:num_queue_reqs", 9, T0 - 1, priority="1"),  # a per-priority copy
        _gauge("vllm:num_requests_running", 4, T0 - 90)]), T0)
    assert got.dropped == {"wrong_type": 1} and got.ignored == 2 and got.accepted == 1
    row = store.read(spec, [Signal.QUEUE_DEPTH, Signal.RUNNING_REQUESTS], at_s=T0)[PREFILL]
    # The only point is 90 s old, over stale_after: the pool reads as missing, with its age.
    assert row[Signal.RUNNING_REQUESTS].value is None
    assert row[Signal.RUNNING_REQUESTS].age_s == pytest.approx(90)
