"""Spans and OTLP metrics -> the catalog's signals per pool (telemetry.OtlpStore)."""

from __future__ import annotations

import math
import random

import pytest
from opentelemetry.sdk.resources import Resource

from pdscale.spec import Role, Spec, load_spec
from pdscale.telemetry import OtlpStore, Signal
from tests.conftest import ROOT
from tests.telemetry.otlp_fixtures import (
    REFERENCE,
    Req,
    trace_request,
    vllm_attributes,
    vllm_resource,
)

T0 = 1_700_000_000.0
PREFILL = ("llama-chat", Role.PREFILL)
DECODE = ("llama-chat", Role.DECODE)
ALL = [Signal.TTFT_P50_S, Signal.TTFT_P95_S, Signal.TTFT_P99_S, Signal.TTFT_P95_RECENT_S,
       Signal.TTFT_QUEUE_P95_S, Signal.TTFT_PREFILL_P95_S, Signal.TTFT_TRANSFER_P95_S,
       Signal.ITL_P95_S, Signal.E2E_P95_S, Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S,
       Signal.GENERATION_TOKENS_PER_S, Signal.PROMPT_TOKENS_PEAK_PER_S, Signal.ERROR_RATIO,
       Signal.PREFIX_CACHE_HIT_RATIO, Signal.QUEUE_DEPTH, Signal.SAMPLE_AGE_S]


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(ROOT / "examples" / "vllm.yaml")


def test_fixture_spans_carry_exactly_the_attributes_vllm_034_writes() -> None:
    documented = {k for k in REFERENCE["vllm"]["attributes"]
                  if not REFERENCE["vllm"]["attributes"][k].startswith("optional")}
    written = set(vllm_attributes(Req(end_s=1.0, ttft_s=0.1)))
    assert documented <= written and written - documented == {"gen_ai.request.max_tokens"}


def test_span_percentiles_rates_and_stages_per_pool(spec: Spec) -> None:
    rng = random.Random(7)
    store = OtlpStore(spec, started_s=T0 - 600)
    ttfts = []
    reqs = []
    for i in range(3000):
        queue, prefill = rng.expovariate(1 / 0.05), rng.uniform(0.05, 0.3)
        ttft = queue + prefill + 0.01
        ttfts.append(ttft)
        reqs.append(Req(end_s=T0 - 290 + i * 0.09, ttft_s=ttft, queue_s=queue,
                        prefill_s=prefill, decode_s=1.0, completion=101, prompt=800))
    other = [Req(end_s=T0 - 10, ttft_s=9.0, decode_s=0.1)]
    req = trace_request({vllm_resource("llama-chat-prefill-7d9f-x2"): reqs,
                         vllm_resource("llama-chat-decode-7d9f-q1"): other})
    got = store.ingest_traces(req, now_s=T0)
    assert got.accepted == 3001 and not got.dropped
    row = store.read(spec, ALL, at_s=T0)
    v = {s: row[PREFILL][s].value for s in ALL}
    exact = sorted(ttfts)
    for sig, q in ((Signal.TTFT_P50_S, 0.5), (Signal.TTFT_P95_S, 0.95),
                   (Signal.TTFT_P99_S, 0.99)):
        want = exact[int(q * len(exact))]
        assert v[sig] == pytest.approx(want, rel=0.02), sig
    assert v[Signal.TTFT_QUEUE_P95_S] < v[Signal.TTFT_P95_S]
    assert v[Signal.TTFT_TRANSFER_P95_S] == pytest.approx(0.01, abs=0.002)
    assert v[Signal.ITL_P95_S] == pytest.approx(0.01, rel=0.01)  # 1.0 s over 100 tokens
    # 3000 requests within the last 300 s (the window covers 270-300 s at a 30 s resolution)
    assert v[Signal.REQUEST_RATE] == pytest.approx(3000 / 300, rel=0.12)
    assert v[Signal.PROMPT_TOKENS_PER_S] == pytest.approx(800 * v[Signal.REQUEST_RATE])
    assert v[Signal.GENERATION_TOKENS_PER_S] == pytest.approx(101 * v[Signal.REQUEST_RATE])
    assert v[Signal.PROMPT_TOKENS_PEAK_PER_S] >= v[Signal.PROMPT_TOKENS_PER_S]
    # vLLM's span records no outcome and no cached tokens: unknown, never zero.
    assert v[Signal.ERROR_RATIO] is None and v[Signal.PREFIX_CACHE_HIT_RATIO] is None
    assert v[Signal.QUEUE_DEPTH] is None  # a gauge: spans cannot tell
    assert v[Signal.SAMPLE_AGE_S] == pytest.approx(290 - 2999 * 0.09)  # the newest span's
    # The decode pool got its own span only.
    assert row[DECODE][Signal.TTFT_P95_S].value == pytest.approx(9.0)
    # Another service's pools saw nothing: None, no age.
    assert row[("llama-batch", Role.PREFILL)][Signal.TTFT_P95_S] == \
        row[("llama-batch", Role.PREFILL)][Signal.TTFT_P95_S].__class__(None, None)


def test_itl_counts_each_request_once_per_inter_token_gap(spec: Spec) -> None:
    """900 two-token answers at 10 ms a token and 100 long generations (1001 tokens) at 80 ms:
    the engines' ITL histograms observe every gap, so nearly all of them are the long
    generations' 80 ms, where a per-request quantile would read 10 ms."""
    store = OtlpStore(spec, started_s=T0 - 600)
    short = [Req(end_s=T0 - 200 + i * 0.1, ttft_s=0.1, decode_s=0.01, completion=2)
             for i in range(900)]
    long = [Req(end_s=T0 - 100 + i * 0.5, ttft_s=0.1, decode_s=80.0, completion=1001)
            for i in range(100)]
    store.ingest_traces(trace_request({vllm_resource("llama-chat-decode-a"): short + long}),
                        now_s=T0)
    row = store.read(spec, [Signal.ITL_P50_S, Signal.ITL_P95_S], at_s=T0)[DECODE]
    gaps = 900 * 1 + 100 * 1000
    assert 900 / gaps < 0.5  # the median gap is a long generation's
    assert row[Signal.ITL_P50_S].value == pytest.approx(0.08, rel=0.01)
    assert row[Signal.ITL_P95_S].value == pytest.approx(0.08, rel=0.01)
    hist = store.histograms()[DECODE]["itl"]
    assert hist.count == gaps and hist.sum_s == pytest.approx(900 * 0.01 + 100 * 80.0)
    # A few long generations among many short answers: the short ones hold the median.
    store = OtlpStore(spec, started_s=T0 - 600)
    store.ingest_traces(trace_request({vllm_resource("llama-chat-decode-a"): [
        *[Req(end_s=T0 - 200 + i * 0.1, ttft_s=0.1, decode_s=1.0, completion=101)
          for i in range(990)],
        *[Req(end_s=T0 - 50 + i, ttft_s=0.1, decode_s=0.8, completion=11) for i in range(10)]]}),
        now_s=T0)
    row = store.read(spec, [Signal.ITL_P50_S], at_s=T0)[DECODE]
    assert row[Signal.ITL_P50_S].value == pytest.approx(0.01, rel=0.01)


def test_the_recent_window_sees_a_swing_the_five_minute_one_averages(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    old = [Req(end_s=T0 - 280 + i, ttft_s=0.2) for i in range(200)]
    new = [Req(end_s=T0 - 50 + i * 0.5, ttft_s=2.0) for i in range(90)]
    store.ingest_traces(trace_request({vllm_resource("llama-chat-prefill-a"): old + new}),
                        now_s=T0)
    row = store.read(spec, [Signal.TTFT_P95_S, Signal.TTFT_P95_RECENT_S, Signal.TTFT_P50_S],
                     at_s=T0)[PREFILL]
    assert row[Signal.TTFT_P50_S].value == pytest.approx(0.2, rel=0.01)
    assert row[Signal.TTFT_P95_RECENT_S].value == pytest.approx(2.0, rel=0.01)
    # Five minutes later the burst has left both windows: nothing measured, no value.
    later = store.read(spec, [Signal.TTFT_P95_S, Signal.REQUEST_RATE], at_s=T0 + 400)[PREFILL]
    assert later[Signal.TTFT_P95_S].value is None and later[Signal.REQUEST_RATE].value is None
    assert later[Signal.TTFT_P95_S].age_s == pytest.approx(400 + 5, abs=1)


def test_a_rate_divides_by_the_time_the_store_has_been_receiving(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 60)
    reqs = [Req(end_s=T0 - 59 + i * 0.5, ttft_s=0.1) for i in range(118)]
    store.ingest_traces(trace_request({vllm_resource("llama-chat-prefill-a"): reqs}), T0)
    rate = store.read(spec, [Signal.REQUEST_RATE], at_s=T0)[PREFILL][Signal.REQUEST_RATE]
    assert rate.value == pytest.approx(2.0, rel=0.02)
    # Within the first resolution slot there is no rate yet (as Prometheus needs 2 samples).
    young = OtlpStore(spec, started_s=T0 - 5)
    young.ingest_traces(trace_request({vllm_resource("llama-chat-prefill-a"): reqs[-5:]}), T0)
    assert young.read(spec, [Signal.REQUEST_RATE], at_s=T0)[PREFILL][
        Signal.REQUEST_RATE].value is None


@pytest.mark.parametrize(("attrs", "reason"), [
    ({"gen_ai.latency.time_to_first_token": -0.2, "gen_ai.latency.e2e": 1.0},
     "invalid_timing"),
    ({"gen_ai.latency.time_to_first_token": float("nan"), "gen_ai.latency.e2e": 1.0},
     "invalid_timing"),
    ({"gen_ai.latency.time_to_first_token": "fast", "gen_ai.latency.e2e": 1.0},
     "invalid_timing"),
    ({"gen_ai.latency.e2e": 1.0}, "missing_timing"),
    ({"gen_ai.latency.time_to_first_token": 2.0, "gen_ai.latency.e2e": 1.0},
     "inconsistent_timing"),
    ({"gen_ai.latency.time_to_first_token": 0.5, "gen_ai.latency.e2e": 1.0,
      "gen_ai.latency.time_in_queue": 0.4, "gen_ai.latency.time_in_model_prefill": 0.4},
     "inconsistent_timing"),
], ids=["negative", "nan", "text", "no-ttft", "ttft-over-e2e", "stages-over-ttft"])
def test_bad_timings_are_counted_drops_never_zeros(spec: Spec, attrs: dict[str, object],
                                                   reason: str) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    res = vllm_resource("llama-chat-prefill-a")
    got = store.ingest_traces(trace_request({}, raw=[(res, attrs, "llm_request", T0 - 1)]), T0)
    assert got.dropped == {reason: 1} and got.accepted == 0
    assert got.detail and "llama-chat/prefill" in got.detail
    assert store.drops == {reason: 1}
    row = store.read(spec, [Signal.TTFT_P95_S, Signal.REQUEST_RATE], at_s=T0)[PREFILL]
    assert row[Signal.TTFT_P95_S].value is None and row[Signal.REQUEST_RATE].value is None


def test_unknown_and_ambiguous_resources_and_skewed_clocks_are_counted(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600, max_clock_skew_s=60)
    r = [Req(end_s=T0 - 1, ttft_s=0.1)]
    req = trace_request({vllm_resource("someone-else-0", namespace="llm"): r,
                         Resource.create({"service.name": "vllm"}): r,
                         vllm_resource("llama-chat-prefill-a"): [Req(end_s=T0 + 600,
                                                                     ttft_s=0.1),
                                                                 Req(end_s=T0 - 3600,
                                                                     ttft_s=0.1)]})
    got = store.ingest_traces(req, T0)
    assert got.dropped == {"unknown_pool": 2, "clock_skew": 1, "too_old": 1}
    assert got.accepted == 0
    assert "selector.resource_attributes" in (store.last_drop or "") \
        or "clock" in (store.last_drop or "") or "window" in (store.last_drop or "")


def test_other_spans_of_an_engine_are_ignored_not_dropped(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 600)
    res = vllm_resource("llama-chat-prefill-a")
    got = store.ingest_traces(trace_request({}, raw=[(res, {"module": "sglang::scheduler"},
                                                      "Scheduler", T0 - 1)]), T0)
    assert got.ignored == 1 and not got.dropped and got.accepted == 0


def test_sglang_spans_give_errors_and_cache_hits(spec: Spec) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from tests.telemetry.otlp_fixtures import recorded, sglang_span

    provider, exporter = recorded(vllm_resource("llama-chat-prefill-a"))
    for i in range(40):
        sglang_span(provider, Req(end_s=T0 - 100 + i, ttft_s=0.3, prefill_s=0.2,
                                  prompt=400), finish="abort" if i % 10 == 0 else "stop")
    store = OtlpStore(spec, started_s=T0 - 600)
    got = store.ingest_traces(encode_spans(exporter.get_finished_spans()), T0)
    assert got.accepted == 40
    row = store.read(spec, ALL, at_s=T0)[PREFILL]
    assert row[Signal.ERROR_RATIO].value == pytest.approx(0.1)
    assert row[Signal.PREFIX_CACHE_HIT_RATIO].value == pytest.approx(0.25)
    assert row[Signal.TTFT_QUEUE_P95_S].value is None  # SGLang does not export it
    assert row[Signal.TTFT_TRANSFER_P95_S].value is None
    assert row[Signal.TTFT_PREFILL_P95_S].value == pytest.approx(0.2)


def test_memory_per_pool_is_bounded_by_one_window(spec: Spec) -> None:
    store = OtlpStore(spec, started_s=T0 - 3600)
    res = vllm_resource("llama-chat-prefill-a")
    for minute in range(30):
        now = T0 - 1800 + minute * 60
        reqs = [Req(end_s=now - 30 + i * 0.3, ttft_s=0.1 + i / 1000) for i in range(100)]
        store.ingest_traces(trace_request({res: reqs}), now)
    slots = store._spans[PREFILL].slots
    assert len(slots) <= 300 / 30 + 1
    assert all(d.n_centroids <= 100 for s in slots for d in s.digests.values())
    assert math.isfinite(store.read(spec, [Signal.TTFT_P95_S], at_s=T0 - 60)[PREFILL][
        Signal.TTFT_P95_S].value or math.nan)
