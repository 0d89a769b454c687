"""Span data for users who keep Prometheus: the span-derived histograms pdscale re-exports on
its ``/metrics`` have a bucket at each SLO threshold, and the generated recording rules read
them where the spec reads a signal from OTLP (promtool runs the generated tests in
tests/alerts/test_promtool.py; a real Prometheus scrapes a running controller in
tests/e2e/test_otlp_run.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from prometheus_client.parser import text_string_to_metric_families

from pdscale.alerts import alert_defs, recording_groups
from pdscale.spec import SOURCE_SIGNALS, Role, Spec, load_spec, parse_spec
from pdscale.telemetry import (
    SPAN_HISTOGRAM_SERIES,
    STAGE_SIGNALS,
    ControllerTelemetry,
    OtlpStore,
    Signal,
    le_matcher,
    pool_expr,
    recorded_expr,
    recorded_name,
    slo_error_ratio_expr,
    slo_source,
    span_signals,
)
from tests.conftest import ROOT
from tests.telemetry.otlp_fixtures import (
    Req,
    recorded,
    sglang_span,
    trace_request,
    vllm_resource,
)

T0 = 1_700_000_000.0
OTLP_EXAMPLE = ROOT / "examples" / "vllm-otlp.yaml"

_SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: {engine}
    model_name: m
    slo: {{ttft_p95_s: {ttft}, itl_p95_s: {itl}}}
    {buckets}
    pools:
      prefill: {{target: {{name: chat-prefill}}, max_replicas: 4}}
      decode: {{target: {{name: chat-decode}}, max_replicas: 4}}
controller:
  {controller}
"""


def _spec(*, engine: str = "vllm", ttft: float = 0.5, itl: float = 0.05, buckets: str = "",
          controller: str = "otlp: {enabled: true}") -> Spec:
    return parse_spec(_SPEC.format(engine=engine, ttft=ttft, itl=itl, buckets=buckets,
                                   controller=controller))


def _exposition(spec: Spec, request: Any) -> dict[str, dict[str, float]]:
    """``/metrics`` of a controller whose OTLP store took ``request``: per re-exported bucket
    series (``name{pool}``), its value by ``le``."""
    store = OtlpStore(spec, started_s=T0 - 600)
    telemetry = ControllerTelemetry(spec=spec)
    telemetry.export_span_histograms(store)
    store.ingest_traces(request, now_s=T0)
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(telemetry.render().decode()):
        for sample in family.samples:
            if sample.name.startswith("pdscale_otlp_") and sample.name.endswith("_bucket"):
                key = f"{sample.name}{{{sample.labels['pdscale_pool']}}}"
                out.setdefault(key, {})[sample.labels["le"]] = sample.value
    return out


def _at(buckets: dict[str, float], threshold: float) -> float:
    """The bucket whose ``le`` the generated rules' matcher selects for ``threshold``."""
    matcher = le_matcher(threshold)
    pattern = matcher.split('"', 1)[1].rsplit('"', 1)[0].replace("\\\\", "\\")
    found = [v for le, v in buckets.items()
             if (re.fullmatch(pattern, le) if "=~" in matcher else le == pattern)]
    assert len(found) == 1, (threshold, sorted(buckets))
    return found[0]


@pytest.mark.parametrize(("engine", "ttft", "itl", "buckets"), [
    ("vllm", 0.5, 0.05, ""),
    ("vllm", 1.0, 0.1, ""),
    ("vllm", 0.3, 0.07, "histogram_buckets: {ttft: [0.1, 0.3, 1.0], itl: [0.02, 0.07, 0.2]}"),
    # TGI has no TTFT histogram: the re-export's buckets are spaced around the threshold.
    ("tgi", 0.37, 0.05, ""),
], ids=["vllm-defaults", "integer-threshold", "declared-buckets", "no-engine-buckets"])
def test_re_exported_histograms_have_a_bucket_at_each_slo_threshold(
        engine: str, ttft: float, itl: float, buckets: str) -> None:
    spec = _spec(engine=engine, ttft=ttft, itl=itl, buckets=buckets)
    # Half the requests within each threshold, half just over it.
    reqs = [Req(end_s=T0 - 10 - i, ttft_s=ttft * (0.9 if i % 2 else 1.1),
                queue_s=ttft * 0.2, prefill_s=ttft * 0.3,
                decode_s=itl * (0.9 if i % 2 else 1.1) * 100, completion=101)
            for i in range(40)]
    series = _exposition(spec, trace_request({vllm_resource("chat-prefill-0"): reqs}))
    ttft_buckets = series[f"{SPAN_HISTOGRAM_SERIES['ttft']}_bucket{{prefill}}"]
    itl_buckets = series[f"{SPAN_HISTOGRAM_SERIES['itl']}_bucket{{prefill}}"]
    assert _at(ttft_buckets, ttft) == 20 and ttft_buckets["+Inf"] == 40
    # ITL counts every inter-token gap: 100 a request.
    assert _at(itl_buckets, itl) == 20 * 100 and itl_buckets["+Inf"] == 40 * 100


def test_a_stage_no_span_gives_is_not_exported_as_zeros() -> None:
    spec = _spec()
    # SGLang's request span has no queue time: neither queue nor transfer is known.
    provider, exporter = recorded(vllm_resource("chat-prefill-0"))
    for i in range(5):
        sglang_span(provider, Req(end_s=T0 - 5 - i, ttft_s=0.2, prefill_s=0.15))
    series = _exposition(spec, encode_spans(exporter.get_finished_spans()))
    exported = {k.split("_bucket")[0] for k in series}
    assert exported == {SPAN_HISTOGRAM_SERIES[s] for s in ("ttft", "prefill", "itl", "e2e")}
    assert all(k.endswith("{prefill}") for k in series)  # no span of the decode pool


def test_without_the_receiver_the_rules_are_the_engines_own() -> None:
    spec = _spec(controller="signal_sources: {default: prometheus}")
    assert not span_signals(spec, spec.services[0], Role.PREFILL)
    text = str(recording_groups(spec))
    assert "pdscale_otlp_" not in text
    assert "LLMTimeToFirstTokenStageHigh" not in {d.name for d in alert_defs(spec)}


@pytest.mark.parametrize(("engine", "stages"), [
    ("vllm", {"queue", "prefill", "transfer"}),
    ("sglang", {"prefill"}),
    ("tgi", set()),
], ids=["vllm", "sglang", "tgi"])
def test_ttft_stages_are_recorded_where_the_engines_spans_give_them(engine: str,
                                                                    stages: set[str]) -> None:
    spec = _spec(engine=engine, ttft=0.4 if engine == "sglang" else 0.5,
                 itl=0.04 if engine == "sglang" else 0.05,
                 buckets="histogram_buckets: {ttft: [0.5, 1, 2]}" if engine == "tgi" else "")
    service = spec.services[0]
    for role in Role:
        got = {STAGE_SIGNALS[s] for s in span_signals(spec, service, role) & set(STAGE_SIGNALS)}
        assert got == stages
    rules = {r["record"]: r["expr"] for g in recording_groups(spec) for r in g["rules"]
             if r["labels"]["pdscale_pool"] == "prefill"}
    for signal, stage in STAGE_SIGNALS.items():
        if stage in stages:
            assert f"{SPAN_HISTOGRAM_SERIES[stage]}_bucket{{" in rules[recorded_name(signal)]
            assert 'pdscale_service="chat",pdscale_pool="prefill"' in \
                rules[recorded_name(signal)]
        else:
            assert recorded_name(signal) not in rules
    alerts = [d for d in alert_defs(spec) if d.name == "LLMTimeToFirstTokenStageHigh"]
    assert {d.tiers[0].labels["stage"] for d in alerts} == stages
    assert len(alerts) == 2 * len(stages)  # each pool


def test_each_signal_is_recorded_from_the_source_the_spec_names() -> None:
    spec = load_spec(OTLP_EXAMPLE)
    service = spec.services[0]
    sources = spec.controller.signal_sources
    for role in Role:
        for signal in (Signal.TTFT_P95_S, Signal.TTFT_P95_RECENT_S, Signal.ITL_P95_S,
                       Signal.E2E_P95_S, Signal.QUEUE_DEPTH, Signal.KV_CACHE_USAGE_MAX_RATIO):
            expr = recorded_expr(spec, signal, service, role)
            engine = pool_expr(signal, service, role)
            source = sources.source(signal.value)
            if source == "prometheus":
                assert expr == engine
            elif source == "otlp":
                assert "pdscale_otlp_" in expr and "vllm:" not in expr
            else:  # both: the span value where there is one, else the engine's
                assert expr.endswith(f" or ({engine})") and expr.startswith("(histogram")
    recent = recorded_expr(spec, Signal.TTFT_P95_RECENT_S, service, Role.PREFILL)
    assert "[1m]" in recent and "[5m]" not in recent
    # The SLO error ratios follow their p95 signal's source.
    assert slo_source(spec, "ttft") == "otlp" and slo_source(spec, "itl") == "both"
    ttft = slo_error_ratio_expr(service, "ttft", "1h", source=slo_source(spec, "ttft"))
    assert ttft is not None and "pdscale_otlp_time_to_first_token_seconds_bucket" in ttft
    assert 'le="0.5"' in ttft and "vllm:" not in ttft


def test_every_signal_a_source_may_answer_is_a_catalog_signal() -> None:
    assert set(SOURCE_SIGNALS) <= {s.value for s in Signal}
