"""docs/sizing.md's worked example, through the policy: the numbers the page gives are the
numbers a decision carries."""

from __future__ import annotations

import pytest

from pdscale.controller import (
    Observation,
    PoolDecision,
    PoolObservation,
    PoolReplicas,
    load_profile,
)
from pdscale.controller._model import PdscalePolicy
from pdscale.spec import ControllerSettings, Role
from pdscale.telemetry import Signal

H100 = load_profile("h100-80gb-llama-3.1-8b")
KEY_P, KEY_D = ("svc", Role.PREFILL), ("svc", Role.DECODE)


def _decide(prefill_queue: float = 0.0) -> dict[Role, PoolDecision]:
    """100 requests/s of 2,000-token prompts with 20 % prefix hits read at 5 ready replicas,
    250 output tokens each; TTFT 0.25 s and ITL 50 ms at an objective of 0.95; the
    prompt tokens' dispersion unread, no latency read (so the correction is 1)."""
    policy = PdscalePolicy(ControllerSettings(),
                           {KEY_P: (H100, 0.25, 60.0), KEY_D: (H100, 0.05, 60.0)},
                           forecasts=None, objective={"svc": 0.95})
    signals = {
        KEY_P: {Signal.PROMPT_TOKENS_PER_S: 200_000.0, Signal.PROMPT_TOKENS_PEAK_PER_S: 200_000.0,
                Signal.PREFIX_CACHE_HIT_RATIO: 0.2, Signal.QUEUE_DEPTH: prefill_queue,
                Signal.MEAN_PROMPT_TOKENS: 2000.0},
        KEY_D: {Signal.GENERATION_TOKENS_PER_S: 25_000.0, Signal.QUEUE_DEPTH: 0.0,
                Signal.MEAN_OUTPUT_TOKENS: 250.0},
    }
    pools = {key: PoolObservation(key, PoolReplicas(ready=5, starting=0, draining=0, desired=5,
                                                     min_replicas=1, max_replicas=64),
                                  signals[key], 0.0)
             for key in (KEY_P, KEY_D)}
    decisions = policy.decide(Observation(30.0, pools))
    return {key[1]: decision for key, decision in decisions.items()}


def test_the_prefill_pool_of_the_worked_example() -> None:
    prefill = _decide()[Role.PREFILL]
    d = prefill.detail
    assert d["mean_service_s"] == pytest.approx(0.0349, abs=1e-4)
    assert d["offered"] == pytest.approx(3.49, abs=0.005)
    assert d["variability"] == 2.0
    assert d["ttft_floor_s"] == pytest.approx(0.101 + 0.0197, abs=5e-4)
    assert d["predicted_s"] == pytest.approx(0.167, abs=5e-4)
    assert prefill.desired_replicas == 5
    reasons = prefill.reasons
    assert reasons[1] == ("lambda 100 req/s x E[S] 35 ms = 3.49 replicas busy; predicted TTFT "
                          "p95 0.167 s at 5 <= 0.25 s")
    assert "dispersion unread: ca2 + cs2 = 2 assumed" in reasons


def test_the_backlog_of_the_worked_example_asks_no_more() -> None:
    """300 prompts waiting drain within the 75 s lead at ceil(3.49 + 300 x 0.0349 / 75) = 4,
    fewer than the SLO's 5."""
    prefill = _decide(prefill_queue=300.0)[Role.PREFILL]
    assert prefill.detail["replicas_to_drain"] == 4
    assert prefill.desired_replicas == 5


def test_the_decode_pool_of_the_worked_example() -> None:
    decode = _decide()[Role.DECODE]
    d = decode.detail
    assert d["batch"] == 198
    assert d["step_s"] == pytest.approx(0.0344, abs=1e-4)
    assert d["running"] == pytest.approx(861, abs=0.5)
    assert d["running_quantile"] == pytest.approx(929, abs=0.5)  # v = 2, the fallback
    assert d["predicted_s"] == pytest.approx(0.033, abs=5e-4)
    assert decode.desired_replicas == 5
    assert "batch <= 198 (what the KV cache holds at 2,125-token contexts)" in \
        decode.reasons[1]
