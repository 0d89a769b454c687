"""bench/mocker_calibration.py's pure parts: the request schedule and the per-length summary.
No stack is started here (the bench needs .venv-dynamo)."""

from __future__ import annotations

import numpy as np
import pytest

from pdscale.controller import load_profile
from tests.conftest import ROOT, bench_module

M = bench_module("mocker_calibration")
PROFILE = load_profile(str(ROOT / "pdscale" / "controller" / "profiles" /
                           "dynamo-mocker-1.6.1.yaml"))


def test_every_length_comes_repeats_times_with_an_idle_gap_after_each_prefill() -> None:
    arrivals, prompts = M.schedule((16, 8192, 32768), 3, 1.0)
    assert sorted(prompts.tolist()) == [16] * 3 + [8192] * 3 + [32768] * 3
    gaps = np.diff(arrivals)
    expected = np.array([PROFILE.prefill_ms(float(p)) / 1000 + 1.0 for p in prompts[:-1]])
    assert gaps == pytest.approx(expected)
    assert prompts.tolist() != sorted(prompts.tolist())  # shuffled, not by length


def test_the_summary_is_the_ttft_less_the_profiles_prefill_per_length() -> None:
    prompts = np.array([8192, 8192, 8192, 16, 16])
    full = PROFILE.prefill_ms(8192) / 1000
    rows = M.summarize(prompts, [full + 0.03, full + 0.05, None, 0.04, 0.06])
    by_len = {r["prompt_tokens"]: r for r in rows}
    assert by_len[8192]["requests"] == 2  # the failed request is left out
    assert by_len[8192]["overhead_s"] == pytest.approx(0.04)
    assert by_len[16]["overhead_s"] == pytest.approx(0.05 - PROFILE.prefill_ms(16) / 1000)
    assert "| 8192 | 2 |" in M.table(rows)
    assert by_len[8192]["profile_overhead_s"] == pytest.approx(
        (PROFILE.overhead_ms(8192) + PROFILE.kv_transfer_ms(8192)) / 1000)
    (empty,) = M.summarize(np.array([512]), [None])
    assert empty["overhead_s"] is None and "| 512 | 0 | n/a |" in M.table([empty])


def test_the_overhead_fit_is_a_fixed_part_and_a_part_per_prompt_token() -> None:
    prompts = np.array([512, 4096, 16384, 32768])
    ttfts = [PROFILE.prefill_ms(float(p)) / 1000 + (10.0 + 0.8 * p / 1000) / 1000
             for p in prompts]
    fixed, per_1k = M.fit_overhead(M.summarize(prompts, list(ttfts)))
    assert fixed == pytest.approx(10.0) and per_1k == pytest.approx(0.8)
    # One length (or none measured) says nothing about the slope.
    assert M.fit_overhead(M.summarize(np.array([512, 512]), [0.05, None])) is None
    # The shipped profile accounts for the per-token part it measured: before the prefill
    # (the frontend's share) plus its KV transfer.
    assert PROFILE.frontend_ms_per_1k_tokens + \
        (PROFILE.kv_transfer_ms(1000.0) - PROFILE.kv_latency_ms) == pytest.approx(0.71, abs=0.02)
