from __future__ import annotations

import re

import pytest

from pdscale.alerts import alerting_groups, recording_groups
from pdscale.dashboards import build_dashboards, panel_queries
from pdscale.spec import Engine, Role, Spec
from pdscale.telemetry import (
    KNOWN_METRICS,
    Signal,
    UnknownSignal,
    engine_signals,
    le_matcher,
    metric_names_in,
    pool_expr,
)

DEPRECATED = ("vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache",
              "vllm:time_per_output_token_seconds", "DCGM_FI_PROF_SM_ACTIVE")


def _all_expressions(spec: Spec) -> list[str]:
    exprs = [r["expr"] for g in recording_groups(spec) + alerting_groups(spec)
             for r in g["rules"]]
    for doc in build_dashboards(spec):
        exprs += [expr for _, _, expr in panel_queries(doc.model)]
    return exprs


def test_every_generated_expression_uses_catalog_metrics(example: tuple[str, Spec]) -> None:
    _, spec = example
    for expr in _all_expressions(spec):
        unknown = metric_names_in(expr) - KNOWN_METRICS
        assert not unknown, f"{unknown} in {expr}"


def test_no_deprecated_metric_names(example: tuple[str, Spec]) -> None:
    _, spec = example
    text = "\n".join(_all_expressions(spec))
    for name in DEPRECATED:
        assert name not in text


def test_metric_name_scanner() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, namespace) (rate(vllm:x_bucket{a="b",'
            'le=~"1(\\\\.0)?"}[5m]))) / on (pdscale_service) (1 - up{pod=~"a-.*"} offset 5m)'
            ' > 1e-3 and time() - pdscale_t > 60')
    assert metric_names_in(expr) == {"vllm:x_bucket", "up", "pdscale_t"}


def test_scanner_catches_an_unknown_name() -> None:
    assert metric_names_in("sum(rate(vllm:made_up_total[5m]))") - KNOWN_METRICS == \
        {"vllm:made_up_total"}


def test_engines_lack_what_they_do_not_export(example: tuple[str, Spec]) -> None:
    _name, spec = example
    for service in spec.services:
        have = engine_signals(service, Role.PREFILL)
        if service.engine is Engine.SGLANG:
            # SGLang counts preemptions as retractions (0.5.23).
            assert "sglang:num_retracted_requests_total" in pool_expr(
                Signal.PREEMPTIONS_PER_S, service, Role.DECODE)
            assert Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO not in have
        if service.engine is Engine.VLLM:
            assert Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO in have
        if service.engine is Engine.DYNAMO:
            # A Dynamo prefill worker exports no vllm:* series at all.
            for signal in have:
                assert "vllm:" not in pool_expr(signal, service, Role.PREFILL), signal
            assert Signal.KV_CACHE_USAGE_MAX_RATIO not in have


def test_tgi_has_no_ttft(example: tuple[str, Spec]) -> None:
    _, spec = example
    raw = spec.services[0].model_dump(by_alias=True)
    raw.update(engine="tgi", dynamo=None)
    tgi = type(spec.services[0]).model_validate(raw)
    assert Signal.TTFT_P95_S not in engine_signals(tgi, Role.PREFILL)
    with pytest.raises(UnknownSignal) as info:
        pool_expr(Signal.TTFT_P95_S, tgi, Role.PREFILL)
    assert "engine 'tgi'" in str(info.value) and "queue_depth" in str(info.value)


def test_pool_selector_and_window(example: tuple[str, Spec]) -> None:
    _, spec = example
    svc = spec.services[0]
    expr = pool_expr(Signal.QUEUE_DEPTH, svc, Role.DECODE)
    assert f'namespace="{svc.namespace}"' in expr
    assert f'pod=~"{svc.decode.pod_regex}"' in expr
    rate = pool_expr(Signal.PROMPT_TOKENS_PER_S, svc, Role.PREFILL, window="2m")
    assert "[2m]" in rate


@pytest.mark.parametrize(("threshold", "matcher"), [
    (0.5, 'le="0.5"'), (1.0, 'le=~"1(\\\\.0)?"'), (2.5, 'le="2.5"'), (10, 'le=~"10(\\\\.0)?"')])
def test_le_matcher(threshold: float, matcher: str) -> None:
    assert le_matcher(threshold) == matcher
    # The regex form matches what Python and Go clients write.
    if "=~" in matcher:
        pattern = matcher.split('"')[1].replace("\\\\", "\\")
        assert re.fullmatch(pattern, f"{threshold:g}")
        assert re.fullmatch(pattern, f"{float(threshold)}")


def test_the_rate_window_is_the_recorded_series_window() -> None:
    """The simulator computes its signals over RATE_WINDOW_S; the recording rules must record
    over the same window, or the benchmark measures a smoothing the controller never sees."""
    from pdscale.telemetry import (
        RATE_WINDOW,
        RATE_WINDOW_S,
        RECENT_WINDOW,
        RECENT_WINDOW_S,
        signal_def,
    )

    assert RATE_WINDOW_S == 300.0 and RATE_WINDOW == "5m"
    assert RECENT_WINDOW_S == 60.0 and RECENT_WINDOW == "1m"
    recent = {Signal.TTFT_P95_RECENT_S: f"rate{RECENT_WINDOW}",
              Signal.ITL_P95_RECENT_S: f"rate{RECENT_WINDOW}",
              Signal.PROMPT_TOKENS_PEAK_PER_S: f"rate{RECENT_WINDOW}_max{RATE_WINDOW}"}
    windowed = [s for s in Signal if signal_def(s).scope == "pool" and "rate" in
                signal_def(s).series and s not in recent]
    assert windowed and all(signal_def(s).series.endswith(f"rate{RATE_WINDOW}")
                            for s in windowed)
    assert all(signal_def(s).series.endswith(end) for s, end in recent.items())
    from pdscale.spec import load_spec
    from tests.conftest import ROOT

    svc = load_spec(ROOT / "examples" / "vllm.yaml").services[0]
    assert f"[{RATE_WINDOW}]" in pool_expr(Signal.PROMPT_TOKENS_PER_S, svc, Role.PREFILL)
    # The recent signals: the same expressions over the last minute; the peak minute is the
    # highest of those one-minute rates within the rate window.
    p95 = pool_expr(Signal.TTFT_P95_S, svc, Role.PREFILL)
    assert pool_expr(Signal.TTFT_P95_RECENT_S, svc, Role.PREFILL) == \
        p95.replace(f"[{RATE_WINDOW}]", f"[{RECENT_WINDOW}]")
    itl = pool_expr(Signal.ITL_P95_S, svc, Role.DECODE)
    assert pool_expr(Signal.ITL_P95_RECENT_S, svc, Role.DECODE) == \
        itl.replace(f"[{RATE_WINDOW}]", f"[{RECENT_WINDOW}]")
    rate = pool_expr(Signal.PROMPT_TOKENS_PER_S, svc, Role.PREFILL)
    assert pool_expr(Signal.PROMPT_TOKENS_PEAK_PER_S, svc, Role.PREFILL) == \
        f"max_over_time(({rate.replace(f'[{RATE_WINDOW}]', f'[{RECENT_WINDOW}]')})[{RATE_WINDOW}:])"


def test_derived_signals_divide_token_rates_by_the_request_rate() -> None:
    from pdscale.telemetry import derive_signals

    out = derive_signals({Signal.REQUEST_RATE: 4.0, Signal.PROMPT_TOKENS_PER_S: 4000.0,
                          Signal.GENERATION_TOKENS_PER_S: None})
    assert out[Signal.MEAN_PROMPT_TOKENS] == 1000.0 and out[Signal.MEAN_OUTPUT_TOKENS] is None
    idle = derive_signals({Signal.REQUEST_RATE: 0.0, Signal.PROMPT_TOKENS_PER_S: 0.0})
    assert idle[Signal.MEAN_PROMPT_TOKENS] is None  # missing, not zero


def test_the_recent_signals_change_only_the_window_not_the_selectors() -> None:
    """``$w`` is the window; ``$wrk`` (a Dynamo worker's selector) must survive untouched."""
    from pdscale.telemetry._catalog import _recent

    got = _recent({Signal.TTFT_P95_S: "q(x{$wrk}[$w])", Signal.PROMPT_TOKENS_PER_S: "r{$eng}[$w]"},
                  Role.PREFILL)
    assert got[Signal.TTFT_P95_RECENT_S] == "q(x{$wrk}[1m])"
    assert got[Signal.PROMPT_TOKENS_PEAK_PER_S] == "max_over_time((r{$eng}[1m])[$w:])"
    # Not a sum of rates: no dispersion can be derived from it (and none is recorded).
    assert Signal.PROMPT_TOKENS_DISPERSION not in got


def test_the_dispersion_differences_the_counter_for_prefill_pools_only() -> None:
    """The tokens of a 5 s window are the counter's difference between two instants (a rate's
    extrapolation would inflate the variance); its consecutive differences remove a trend;
    the rule keeps a value only while every series' median window held two samples; decode
    has none."""
    from pdscale.telemetry._catalog import _recent

    table = {Signal.PROMPT_TOKENS_PER_S: "sum by (namespace) (rate(c{$eng}[$w]))"}
    fine = _recent(table, Role.PREFILL)[Signal.PROMPT_TOKENS_DISPERSION]
    assert "rate(" not in fine and "clamp_min(c{$eng} - c{$eng} offset 5s, 0)" in fine
    assert "clamp_min(c{$eng} offset 5s - c{$eng} offset 10s, 0)" in fine
    assert fine.startswith("avg_over_time((sum by (namespace) (")
    assert fine.endswith("and on () (min(quantile_over_time(0.5, count_over_time(c{$eng}[5s])"
                         "[$w:5s])) >= 2)")
    assert Signal.PROMPT_TOKENS_DISPERSION not in _recent(table, Role.DECODE)
