from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pdscale.cli import main
from tests.conftest import ROOT, SHARED

SPEC = str(ROOT / "examples" / "vllm.yaml")
KEYS = {"requests", "slo_attainment", "ttft_attainment", "itl_attainment", "ttft_p50_s",
        "ttft_p95_s", "ttft_p99_s", "itl_p50_s", "itl_p95_s", "gpu_hours", "scale_actions",
        "pools"}


@pytest.mark.parametrize("policy", ["static", "reactive", "dynamo", "oracle"])
def test_simulate_writes_summary_timeseries_and_plots(policy: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["simulate", "--spec", SPEC, "--trace", "synthetic", "--duration", "900",
                 "--policy", policy, "--cold-start", "30", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= KEYS
    for pool in ("prefill", "decode"):
        assert {"mean_replicas", "peak_replicas", "gpu_hours"} <= set(summary["pools"][pool])
    assert summary["policy"] == policy and summary["mode"] == "event"
    assert summary["cold_start_s"] == {"prefill": 30.0, "decode": 30.0}
    header = (out / "timeseries.csv").read_text().splitlines()[0]
    assert "prefill_ready" in header and "ttft_p95_s" in header
    for name in ("load", "replicas", "ttft"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_router_is_chosen_on_the_command_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    summaries = {}
    for router in ("least_loaded", "round_robin"):
        out = tmp_path / router
        assert main(["simulate", "--spec", SPEC, "--trace", "synthetic", "--duration", "600",
                     "--router", router, "--no-plots", "--out", str(out)]) == 0
        summaries[router] = json.loads((out / "summary.json").read_text())
        assert summaries[router]["router"] == router
    # The same requests, served in another order.
    assert summaries["least_loaded"]["requests"] == summaries["round_robin"]["requests"]
    assert summaries["least_loaded"]["ttft_p95_s"] != summaries["round_robin"]["ttft_p95_s"]
    with pytest.raises(SystemExit):
        main(["simulate", "--spec", SPEC, "--router", "random", "--out", str(tmp_path / "x")])
    assert "round_robin" in capsys.readouterr().err


def test_fluid_mode_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--spec", SPEC, "--duration", "1800", "--mode", "fluid",
                 "--policy", "oracle", "--no-plots", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "fluid" and summary["requests"] > 0
    assert not (out / "plots").exists()


def test_bad_trace_row_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,x,2\n")
    assert main(["simulate", "--spec", SPEC, "--trace", str(trace), "--format", "azure",
                 "--out", str(tmp_path / "o")]) == 2
    assert "line 2, column 'ContextTokens'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_trace_stats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["trace", "stats", "synthetic", "--duration", "600"]) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "p95" in out
    empty = tmp_path / "e.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert main(["trace", "stats", str(empty), "--format", "azure"]) == 2


def test_unknown_profile_in_spec_exits_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(Path(SPEC).read_text().replace("profile: h100-80gb-llama-3.1-8b",
                                                   "profile: tpu-v9", 1))
    assert main(["simulate", "--spec", str(spec), "--duration", "60",
                 "--out", str(tmp_path / "o")]) == 2
    assert "unknown profile 'tpu-v9'" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="../shared/traces is absent")
@pytest.mark.parametrize("trace", ["azure_llm_2023_code.csv",
                                   "mooncake_fast25_conversation_trace.jsonl.gz"])
def test_simulate_shared_traces(trace: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert main(["simulate", "--spec", SPEC, "--trace", str(SHARED / "traces" / trace),
                 "--policy", "oracle", "--no-plots", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 8000


def test_prompts_are_clipped_where_asked(tmp_path: Path) -> None:
    # A stack replay clips prompts at the model's context; the simulator can clip them alike.
    from pdscale.simulator import SimOptions, simulate
    from pdscale.spec import load_spec

    trace = tmp_path / "long.csv"
    rows = [f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0,{40000 + 100 * i},20" for i in range(120)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    spec = load_spec(Path(SPEC))
    base = SimOptions(trace=str(trace), fmt="azure", policy="oracle", mode="event")
    whole, _ = simulate(spec, base)
    clipped, _ = simulate(spec, dataclasses.replace(base, max_prompt_tokens=2000))
    assert whole.summary["max_prompt_tokens"] is None
    assert clipped.summary["max_prompt_tokens"] == 2000
    # Prompts 20-100x shorter: less prefill work, so fewer prefill GPU-hours for the oracle.
    assert clipped.summary["pools"]["prefill"]["gpu_hours"] < \
        whole.summary["pools"]["prefill"]["gpu_hours"]
    with pytest.raises(ValueError, match="max_prompt_tokens must be at least 1"):
        simulate(spec, dataclasses.replace(base, max_prompt_tokens=0))
