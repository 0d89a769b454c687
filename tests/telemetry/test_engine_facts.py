"""The catalog's corrections against the engines' released code (shared/REFERENCE.md §1, §6):
each test names the fact and fails on the old, silently empty selector."""

from __future__ import annotations

import re

import pytest

from pdscale._engines import (
    DYNAMO_BUCKET_DEFAULTS,
    dynamo_buckets,
    suggest_dynamo_setting,
)
from pdscale.spec import Role, ServiceSpec, Spec, load_spec
from pdscale.telemetry import Signal, engine_signals, pool_expr
from pdscale.telemetry._catalog import OPTIONAL_METRICS, series_refs
from tests.conftest import ROOT


def _service(engine: str) -> ServiceSpec:
    return load_spec(ROOT / "examples" / f"{engine}.yaml").services[0]


@pytest.fixture
def dynamo() -> ServiceSpec:
    return _service("dynamo")


def test_dynamo_frontend_is_selected_by_model_not_dynamo_namespace(
        dynamo: ServiceSpec) -> None:
    for role in Role:
        for signal in engine_signals(dynamo, role):
            expr = pool_expr(signal, dynamo, role)
            for match in re.finditer(r"(dynamo_frontend_\w+)\{([^}]*)\}", expr):
                assert "dynamo_namespace" not in match.group(2), expr
                assert f'model="{dynamo.model_name}"' in match.group(2), expr


def test_dynamo_decode_pool_has_its_demand_and_backend_signals(dynamo: ServiceSpec) -> None:
    have = engine_signals(dynamo, Role.DECODE)
    # The controller's decode demand; before, only the prefill pool had frontend tokens.
    assert Signal.GENERATION_TOKENS_PER_S in have
    assert "dynamo_frontend_output_tokens_total" in pool_expr(
        Signal.GENERATION_TOKENS_PER_S, dynamo, Role.DECODE)
    assert {Signal.QUEUE_DEPTH, Signal.KV_CACHE_USAGE_MAX_RATIO} <= have
    # The re-exported vllm:* series carry no dynamo_component (only engine, model_name).
    assert "dynamo_component" not in pool_expr(Signal.QUEUE_DEPTH, dynamo, Role.DECODE)


def test_dynamo_prefill_backlog_comes_from_the_worker_runtime(dynamo: ServiceSpec) -> None:
    expr = pool_expr(Signal.QUEUE_DEPTH, dynamo, Role.PREFILL)
    assert "dynamo_component_inflight_requests{" in expr
    assert 'dynamo_component="prefill"' in expr
    # The runtime writes DYN_NAMESPACE with '-' as '_' (llama-disagg -> llama_disagg).
    assert dynamo.dynamo is not None and "-" in dynamo.dynamo.namespace
    assert f'dynamo_namespace="{dynamo.dynamo.namespace.replace("-", "_")}"' in expr


def test_vllm_error_ratio_counts_errors_not_aborts() -> None:
    svc = _service("vllm")
    expr = pool_expr(Signal.ERROR_RATIO, svc, Role.DECODE)
    assert 'finished_reason="error"' in expr and "abort" not in expr
    queue = pool_expr(Signal.QUEUE_DEPTH, svc, Role.DECODE)
    assert 'reason="capacity"' in queue and " or " in queue  # capacity waits, with fallback
    assert 'reason="deferred"' in pool_expr(Signal.KV_TRANSFER_WAITING, svc, Role.DECODE)
    assert 'source="local_compute"' in pool_expr(Signal.PROMPT_TOKENS_COMPUTED_PER_S, svc,
                                                 Role.PREFILL)


def test_sglang_gauges_at_the_priority_total_and_pd_queues() -> None:
    svc = _service("sglang")
    for signal in (Signal.QUEUE_DEPTH, Signal.RUNNING_REQUESTS, Signal.KV_CACHE_USAGE_MAX_RATIO):
        for m in re.finditer(r"(sglang:\w+)\{([^}]*)\}", pool_expr(signal, svc, Role.DECODE)):
            assert 'priority=""' in m.group(2), m.group(0)
    assert "sglang:cache_hit_rate" not in pool_expr(Signal.PREFIX_CACHE_HIT_RATIO, svc,
                                                    Role.PREFILL)
    assert "num_prefill_bootstrap_queue_reqs" in pool_expr(Signal.QUEUE_DEPTH, svc,
                                                           Role.PREFILL)
    assert "num_decode_prealloc_queue_reqs" in pool_expr(Signal.QUEUE_DEPTH, svc, Role.DECODE)
    assert "num_decode_transfer_queue_reqs" in pool_expr(Signal.KV_TRANSFER_WAITING, svc,
                                                         Role.DECODE)


def test_series_refs_name_each_raw_series_and_its_matchers(example: tuple[str, Spec]) -> None:
    _, spec = example
    svc = spec.services[0]
    refs = series_refs(Signal.QUEUE_DEPTH, svc, Role.DECODE)
    assert refs
    for ref in refs:
        assert ("namespace", "=", svc.namespace) in ref.matchers
        assert ref.optional == (ref.metric in OPTIONAL_METRICS)
    assert any(not r.optional for r in refs)


def test_dynamo_default_buckets_as_a_running_frontend_exposes_them() -> None:
    assert dynamo_buckets(*DYNAMO_BUCKET_DEFAULTS["ttft"]) == (
        0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100,
        220, 480)
    assert dynamo_buckets(*DYNAMO_BUCKET_DEFAULTS["itl"]) == (
        0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2,
        2.3, 4.1, 7.4, 13, 24, 44, 80)
    # The two settings observed on a running frontend (shared/reference, Dynamo section A).
    assert dynamo_buckets(0.05, 10, 8) == (0, 0.11, 0.23, 0.48, 1, 2.2, 4.7, 10)
    assert dynamo_buckets(0.01, 1, 5) == (0, 0.032, 0.1, 0.32, 1)


@pytest.mark.parametrize("threshold", [0.5, 0.05, 0.3, 2.0, 0.04, 1.5])
def test_suggested_dynamo_setting_makes_the_threshold_a_boundary(threshold: float) -> None:
    setting = suggest_dynamo_setting("ttft", threshold)
    assert setting is not None
    assert threshold in dynamo_buckets(*setting)
