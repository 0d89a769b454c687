"""The sizing model's arithmetic against hand-computed cases, and its monotonicity."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdscale.controller import load_profile
from pdscale.controller._perf import decode_operating_point
from pdscale.controller._queueing import (
    DecodeLoad,
    PrefillLoad,
    decode_replicas,
    erlang_c,
    predicted_ttft_s,
    prefill_replicas,
    wait_quantile_s,
)

PROFILE = load_profile("h100-80gb-llama-3.1-8b")


def _load(rps: float, service_s: float = 0.1, *, variability: float = 2.0,
          fixed_s: float = 0.05, q: float = 0.95) -> PrefillLoad:
    return PrefillLoad(arrival_rps=rps, mean_service_s=service_s,
                       variability=variability, fixed_s=fixed_s, quantile=q)


def test_erlang_c_matches_the_closed_forms() -> None:
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # a^2/2 / (1-rho) over 1 + a + that
    assert erlang_c(3, 1.0) == pytest.approx(0.0625 / 0.6875)
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 0.0) == 0.0
    # Large pools stay finite and tend to 0 well below saturation.
    assert 0 < erlang_c(500, 400.0) < 1e-6
    with pytest.raises(ValueError, match="at least 1"):
        erlang_c(0, 1.0)


def test_mm1_wait_quantile_is_exact() -> None:
    """M/M/1 at rho 0.5 and E[S] 1 s: P(W > t) = 0.5 exp(-0.5 t); the 95th percentile is
    2 ln 10 s."""
    load = _load(0.5, 1.0, fixed_s=0.0)
    assert wait_quantile_s(load, 1) == pytest.approx(2 * math.log(10))
    assert predicted_ttft_s(load, 1) == pytest.approx(2 * math.log(10) + 1.0)
    assert wait_quantile_s(load, 1) > wait_quantile_s(_load(0.5, 1.0, variability=1.0), 1)
    assert wait_quantile_s(_load(2.0, 1.0), 2) == math.inf  # at saturation


def test_prefill_replicas_by_hand() -> None:
    """10 prompts/s of 100 ms: a = 1. At 2 replicas C = 1/3, the wait's p95 is
    ln(20/3)/10 = 0.190 s, TTFT 0.340 s > 0.3 s; at 3, C = 1/11, ln(20/11)/20 = 0.030 s,
    TTFT 0.180 s."""
    sized = prefill_replicas(_load(10.0), 0.3, max_replicas=16)
    assert sized.replicas == 3 and sized.met
    assert sized.predicted_s == pytest.approx(math.log(20 / 11) / 20 + 0.15)
    assert "predicted TTFT p95 0.18 s at 3 <= 0.3 s" in sized.reason
    # 100 prompts waiting drain within the SLO at ceil(1 + 100 x 0.1 / 0.3) = 35.
    backlog = prefill_replicas(_load(10.0), 0.3, max_replicas=64, queued=100)
    assert backlog.replicas == 35 and "100 waiting drain within 0.3 s" in backlog.reason
    # Replicas asked now arrive after a 60 s lead: the backlog drains over it, ceil(1 + 1/6).
    later = prefill_replicas(_load(10.0), 0.3, max_replicas=64, queued=100, drain_s=60.0)
    assert later.replicas == 3 and "within 60 s" not in later.reason
    capped = prefill_replicas(_load(10.0), 0.3, max_replicas=20, queued=100)
    assert capped.replicas == 20 and not capped.met and "maximum, 20" in capped.reason


def test_prefill_that_cannot_meet_the_slo_says_so_and_keeps_prompts_from_waiting() -> None:
    sized = prefill_replicas(_load(10.0, 0.5, fixed_s=0.1), 0.4, max_replicas=32)
    assert not sized.met and "the prefill alone takes 0.6 s" in sized.reason
    assert wait_quantile_s(_load(10.0, 0.5, fixed_s=0.1), sized.replicas) == 0.0
    assert wait_quantile_s(_load(10.0, 0.5, fixed_s=0.1), sized.replicas - 1) > 0.0


def test_no_load_needs_one_replica() -> None:
    assert prefill_replicas(_load(0.0), 0.5, max_replicas=8).replicas == 1
    decode = decode_replicas(DecodeLoad(arrival_rps=0.0, mean_output_tokens=200,
                                        mean_context_tokens=2000, variability=1.0,
                                        quantile=0.95), PROFILE, 0.05,
                             max_replicas=8)
    assert decode.replicas == 1


def _decode(rps: float) -> DecodeLoad:
    return DecodeLoad(arrival_rps=rps, mean_output_tokens=200.0, mean_context_tokens=1500.0,
                      variability=1.0, quantile=0.95)


def test_decode_replicas_by_hand() -> None:
    """Little's law at the operating point, the normal tail, then batches."""
    load = DecodeLoad(arrival_rps=40.0, mean_output_tokens=300.0, mean_context_tokens=2150.0,
                      variability=1.0, quantile=0.95)
    point = decode_operating_point(PROFILE, 0.05, 2150.0)
    running = 40.0 * 300.0 * point.step_s
    tail = running + NormalDist().inv_cdf(0.95) * math.sqrt(running)
    sized = decode_replicas(load, PROFILE, 0.05, max_replicas=64)
    assert sized.replicas == math.ceil(tail / point.batch)
    assert sized.met and sized.predicted_s <= 0.05
    assert f"batch <= {point.batch} (what the KV cache holds at 2,150-token contexts)" in \
        sized.reason
    # Waiting sequences hold their slots for their outputs: over a drain of one step each
    # is one more running; over 60 s, output x step / 60 of one.
    more = decode_replicas(load, PROFILE, 0.05, max_replicas=64, waiting=3 * point.batch,
                           drain_s=point.step_s * 300.0)
    assert more.replicas == math.ceil((tail + 3 * point.batch) / point.batch)
    few = decode_replicas(load, PROFILE, 0.05, max_replicas=2)
    assert few.replicas == 2 and not few.met and "maximum, 2" in few.reason


RATES = st.floats(min_value=0.0, max_value=400.0, allow_nan=False)


@pytest.mark.parametrize("context,itl_s,bound", [
    (300.0, 0.02, "at ITL 20 ms"),
    (300.0, 0.1, "(the engine's max batch)"),
    (12_000.0, 0.1, "(what the KV cache holds at 12,000-token contexts)")])
def test_decode_names_the_bound_on_its_batch(context: float, itl_s: float, bound: str) -> None:
    """The batch is the ITL's, the engine's cap or the KV cache's, and the decision says
    which: a KV-bound batch runs far under the ITL SLO, and the reason must not read as if
    the ITL set it."""
    load = DecodeLoad(arrival_rps=40.0, mean_output_tokens=300.0,
                      mean_context_tokens=context, variability=1.0, quantile=0.95)
    sized = decode_replicas(load, PROFILE, itl_s, max_replicas=64)
    point = decode_operating_point(PROFILE, itl_s, context)
    assert f"batch <= {point.batch} {bound}:" in sized.reason


@given(RATES, RATES, st.floats(min_value=0.05, max_value=2.0))
def test_more_prefill_load_never_asks_fewer(a: float, b: float, slo: float) -> None:
    lo, hi = sorted((a, b))
    assert prefill_replicas(_load(lo, 0.05), slo, max_replicas=128).replicas <= \
        prefill_replicas(_load(hi, 0.05), slo, max_replicas=128).replicas


@given(st.floats(min_value=0.0, max_value=200.0), st.floats(min_value=0.2, max_value=2.0),
       st.floats(min_value=0.2, max_value=2.0))
def test_a_lower_ttft_slo_never_asks_fewer(rps: float, s1: float, s2: float) -> None:
    tight, loose = sorted((s1, s2))
    assert prefill_replicas(_load(rps, 0.05), tight, max_replicas=128).replicas >= \
        prefill_replicas(_load(rps, 0.05), loose, max_replicas=128).replicas


@given(RATES, RATES, st.floats(min_value=0.02, max_value=0.2))
def test_more_decode_load_never_asks_fewer(a: float, b: float, itl: float) -> None:
    lo, hi = sorted((a, b))

    def n(rps: float) -> int:
        return decode_replicas(_decode(rps), PROFILE, itl,
                               max_replicas=256).replicas
    assert n(lo) <= n(hi)


@given(st.floats(min_value=0.0, max_value=200.0), st.floats(min_value=0.02, max_value=0.2),
       st.floats(min_value=0.02, max_value=0.2))
def test_a_lower_itl_slo_never_asks_fewer(rps: float, i1: float, i2: float) -> None:
    tight, loose = sorted((i1, i2))

    def n(itl: float) -> int:
        return decode_replicas(_decode(rps), PROFILE, itl,
                               max_replicas=256).replicas
    assert n(tight) >= n(loose)


def test_the_percentile_prompt_sets_the_floor() -> None:
    """A long prompt at the percentile: its prefill, not the mean's, is what the wait adds to;
    at low load the prediction is that prefill plus the overhead."""
    load = PrefillLoad(arrival_rps=1.0, mean_service_s=0.1, variability=2.0,
                       fixed_s=0.05, quantile=0.95, service_quantile_s=0.3)
    assert predicted_ttft_s(load, 4) == pytest.approx(0.35)
    assert prefill_replicas(load, 0.3, max_replicas=8).met is False
