from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from pdscale.simulator import ProfileError, builtin_profiles, load_profile
from tests.conftest import SHARED

CALIBRATION = SHARED / "calibration"


def test_builtin_profiles() -> None:
    names = set(builtin_profiles())
    assert {"a100-80gb-llama-3.1-8b", "h100-80gb-llama-3.1-8b",
            "h200-llama-3.1-8b-fp8"} <= names


def test_a100_and_h100_match_the_recommended_defaults() -> None:
    a100 = load_profile("a100-80gb-llama-3.1-8b")
    h100 = load_profile("h100-80gb-llama-3.1-8b")
    # 2k-token prompt: 144 ms on A100, 45 ms on H100 (calibration defaults).
    assert a100.prefill_ms(2048) == pytest.approx(144, rel=0.02)
    assert h100.prefill_ms(2048) == pytest.approx(45, rel=0.02)
    # KV transfer of 2k bf16 tokens: 1 ms + 256 MiB / 15 or 30 GB/s.
    assert a100.kv_transfer_ms(2048) == pytest.approx(1 + 2048 * 131072 / 15e9 * 1000)
    assert h100.decode_step_ms(64, 100_000) == pytest.approx(8.0 + 0.04 * 64 + 0.044 * 100)


def test_chunks_add_up_to_the_whole_prompt() -> None:
    p = load_profile("a100-80gb-llama-3.1-8b")
    whole = p.chunk_ms(0, 12000)
    pieces = p.chunk_ms(0, 8192) + p.chunk_ms(8192, 12000 - 8192)
    assert pieces == pytest.approx(whole)


def test_the_mocker_charges_an_iteration_on_its_total_tokens() -> None:
    """Dynamo's mocker prices an iteration by its T new tokens (a + bT + cT^2), whichever
    prompts they come from; real engines' profiles charge each prompt's whole context."""
    mocker = load_profile("dynamo-mocker-1.6.1")
    assert mocker.prefill_attention == "iteration"
    assert load_profile("h100-80gb-llama-3.1-8b").prefill_attention == "context"
    full = mocker.prefill_ms(8192)
    # Four 2k-token prompts in one iteration cost what one 8k chunk does...
    assert mocker.iteration_ms([(0.0, 2048.0)] * 4) == pytest.approx(full)
    # ... and a 32k prompt four such iterations, not the context rule's 1.02 s.
    assert mocker.prefill_ms(32768) == pytest.approx(4 * full)
    context = replace(mocker, prefill_attention="context")
    assert context.prefill_ms(32768) > 1.4 * mocker.prefill_ms(32768)
    assert context.iteration_ms([(0.0, 2048.0)] * 4) < full
    # Measured on the loopback stack (shared/REFERENCE.md section 6): 0.735 s for 32k tokens
    # with the frontend's 50-80 ms.
    assert 0.735 - 0.080 <= mocker.prefill_ms(32768) / 1000 <= 0.735 - 0.050
    # Saturated, every iteration is full whatever the prompts' lengths.
    assert mocker.prefill_tokens_per_s(500.0, 500.0 ** 2) == \
        pytest.approx(8192 / full * 1000)
    assert mocker.prefill_tokens_per_s(20000.0, 20000.0 ** 2) == \
        pytest.approx(8192 / full * 1000)


def test_a_profile_with_an_unknown_attention_scope_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "pdscale" / "controller" / "profiles" /
            "dynamo-mocker-1.6.1.yaml").read_text()
    path = tmp_path / "odd.yaml"
    path.write_text(text.replace("prefill_attention: iteration", "prefill_attention: chunk"))
    with pytest.raises(ProfileError, match=r"prefill_attention must be one of context, "
                       r"iteration.*got 'chunk'"):
        load_profile(str(path))
    path.write_text(text.replace("prefill_attention: iteration\n", ""))
    assert load_profile(str(path)).prefill_attention == "context"


def test_the_frontend_share_per_prompt_token_is_optional_and_checked(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "pdscale" / "controller" / "profiles" /
            "dynamo-mocker-1.6.1.yaml").read_text()
    mocker = load_profile("dynamo-mocker-1.6.1")
    assert mocker.overhead_ms(10000) == pytest.approx(
        mocker.ttft_overhead_ms + 10 * mocker.frontend_ms_per_1k_tokens)
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("frontend_ms_per_1k_tokens: 0.2\n", ""))
    plain = load_profile(str(path))
    assert plain.frontend_ms_per_1k_tokens == 0.0
    assert plain.overhead_ms(10000) == plain.ttft_overhead_ms
    path.write_text(text.replace("frontend_ms_per_1k_tokens: 0.2",
                                 "frontend_ms_per_1k_tokens: -1"))
    with pytest.raises(ProfileError, match="frontend_ms_per_1k_tokens must be a non-negative"):
        load_profile(str(path))


@pytest.mark.skipif(not CALIBRATION.exists(), reason="../shared/calibration is absent")
def test_h200_profile_reproduces_the_dynamo_measurements() -> None:
    p = load_profile("h200-llama-3.1-8b-fp8")
    with (CALIBRATION / "dynamo_h200_llama31_8b_fp8_vllm_tp1_prefill.csv").open() as f:
        for row in csv.DictReader(f):
            measured = float(row["prefill_ttft_ms"])
            assert p.prefill_ms(float(row["prefill_isl_tokens"])) == \
                pytest.approx(measured, rel=0.15)
    errors = []
    with (CALIBRATION / "dynamo_h200_llama31_8b_fp8_vllm_tp1_decode.csv").open() as f:
        for row in csv.DictReader(f):
            batch = float(row["DERIVED_batch_size_est"])
            if batch > 600:
                continue
            fit = p.decode_step_ms(batch, float(row["DERIVED_active_kv_tokens"]))
            errors.append(abs(fit - float(row["itl_ms"])) / float(row["itl_ms"]))
    errors.sort()
    assert errors[len(errors) // 2] < 0.05 and errors[-1] < 0.2


def test_user_profile_file(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "pdscale" / "controller" / "profiles" /
            "h100-80gb-llama-3.1-8b.yaml").read_text().replace("name: h100-80gb-llama-3.1-8b",
                                                               "name: mine")
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    assert load_profile(str(path)).name == "mine"
    path.write_text(text.replace("kv_capacity_tokens: 445000\n", ""))
    with pytest.raises(ProfileError, match=r"missing field.*kv_capacity_tokens"):
        load_profile(str(path))
    path.write_text(text.replace("max_batch: 256", "max_batch: -3"))
    with pytest.raises(ProfileError, match="max_batch must be a positive number"):
        load_profile(str(path))


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"h100-80gb-llama-3\.1-8b"):
        load_profile("b200-magic")
