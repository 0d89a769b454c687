"""The tiny model folder, exact-length prompts, the replayer's SSE client (on a mock transport)
and its summary, and the stack's configuration checks; no Dynamo needed (the real stack runs in
tests/e2e/test_dynamo_stack.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pdscale.simulator._replay import (
    PromptBuilder,
    ReplayError,
    ReplayOptions,
    RequestRecord,
    replay_async,
    summarize,
    vocabulary_from_model,
)
from pdscale.simulator._stack import DynamoStack, StackError
from pdscale.simulator._tinymodel import CHAT_TEMPLATE, build_tiny_model, tiny_vocabulary
from pdscale.simulator._trace import Trace
from pdscale.spec import Spec, load_spec
from tests.conftest import ROOT


def test_tiny_model_folder(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m")
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names == ["config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json"]
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert 40_000 < size < 150_000
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == len(tok["model"]["vocab"])
    assert sorted(tok["model"]["vocab"].values()) == list(range(config["vocab_size"]))
    assert tok["model"]["type"] == "WordLevel" and tok["pre_tokenizer"]["type"] == "WhitespaceSplit"
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] \
        == CHAT_TEMPLATE
    words = vocabulary_from_model(folder)
    assert words == tiny_vocabulary() and len(set(words)) == 4000
    assert all(w.isalpha() and w.islower() for w in words)
    mtime = (folder / "tokenizer.json").stat().st_mtime_ns
    build_tiny_model(folder)  # idempotent: a built folder is left alone
    assert (folder / "tokenizer.json").stat().st_mtime_ns == mtime


def test_tiny_model_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'max_context_tokens'"):
        build_tiny_model(tmp_path, max_context_tokens=1)
    with pytest.raises(ValueError, match="'size'"):
        tiny_vocabulary(0)


def test_prompts_have_exact_lengths_and_shared_prefix_blocks() -> None:
    words = tiny_vocabulary(500)
    builder = PromptBuilder(words, seed=3, block_tokens=8)
    for n in (1, 7, 8, 9, 1000):
        assert len(builder.prompt(n, index=n).split(" ")) == n
    a = builder.prompt(20, index=1, hash_ids=[11, 12, 13]).split()
    b = builder.prompt(20, index=2, hash_ids=[11, 12, 99]).split()
    assert a[:16] == b[:16] and a[16:] != b[16:]
    assert builder.prompt(30, index=5) == PromptBuilder(words, seed=3).prompt(30, index=5)
    with pytest.raises(ReplayError, match="without whitespace"):
        PromptBuilder(["a b"])


def _sse(*chunks: dict[str, object]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


def _trace(n: int) -> Trace:
    return Trace("t", np.zeros(n), np.full(n, 4, dtype=np.int64), np.full(n, 3, dtype=np.int64))


def test_replay_client_parses_the_stream_and_records_errors() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if len(seen) == 2:
            return httpx.Response(503, text="no instances")
        words = body["messages"][0]["content"].split()  # type: ignore[index]
        delta = [{"choices": [{"delta": {"content": w}}]} for w in ("x", "y", "z")]
        usage = {"choices": [], "usage": {"prompt_tokens": len(words),
                                          "completion_tokens": 3}}
        return httpx.Response(200, content=_sse(*delta, usage),
                              headers={"content-type": "text/event-stream"})

    result = asyncio.run(replay_async(
        _trace(3), "http://127.0.0.1:9", "m", tiny_vocabulary(50), slo_ttft_s=1.0,
        slo_itl_s=1.0, options=ReplayOptions(duration_s=1.0),
        replicas=lambda: {"prefill": 1, "decode": 2}, transport=httpx.MockTransport(handler)))
    assert all(b["stream"] is True and b["max_tokens"] == 3 for b in seen)
    s = result.summary
    assert s["requests"] == 3 and s["finished"] == 2 and s["errors"] == 1
    assert s["error_kinds"] == {"http 503": 1}
    assert s["prompt_token_mismatches"] == 0 and s["output_tokens"] == 6
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["pools"]["decode"]["peak_replicas"] == 2 and s["mode"] == "replay"


def _echo(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    delta = [{"choices": [{"delta": {"content": "x"}}]}] * int(body["max_tokens"])
    return httpx.Response(200, content=_sse(*delta),
                          headers={"content-type": "text/event-stream"})


def test_nothing_is_thinned_or_clipped_unless_asked_and_what_was_is_said() -> None:
    """The trace goes as it is; a rate cap, a request cap and prompt or output limits apply
    only when given, and the summary's notes say what each did."""
    n = 40
    trace = Trace("t", np.linspace(0, 1.9, n), np.array([4, 70_000] * (n // 2)),
                  np.array([3, 900] * (n // 2)))

    def run(options: ReplayOptions) -> dict[str, object]:
        return asyncio.run(replay_async(
            trace, "http://127.0.0.1:9", "m", tiny_vocabulary(50), slo_ttft_s=1.0,
            slo_itl_s=1.0, options=options, transport=httpx.MockTransport(_echo))).summary

    plain = run(ReplayOptions(duration_s=2.0, max_rps=None, max_prompt_tokens=65_536))
    assert plain["requests"] == n and plain["notes"] == ["20 prompt(s) clipped to 65536 tokens"]
    assert plain["output_tokens"] == 20 * 3 + 20 * 900
    asked = run(ReplayOptions(duration_s=2.0, max_rps=10.0, max_output_tokens=100,
                              max_requests=15))
    assert asked["requests"] == 15
    assert asked["notes"][0] == "thinned from 20.00 to 10 requests/s on average"
    assert "cut to the first 15 requests" in asked["notes"]
    assert any(n.endswith("output(s) clipped to 100 tokens") for n in asked["notes"])  # type: ignore[union-attr]


def test_progress_is_reported_while_the_replay_runs() -> None:
    seen: list[tuple[float, int]] = []
    clock = {"t": 0.0}

    async def sleep(seconds: float) -> None:
        clock["t"] += seconds
        await asyncio.sleep(0)

    trace = Trace("t", np.arange(6, dtype=float) * 10, np.full(6, 4), np.full(6, 2))
    asyncio.run(replay_async(
        trace, "http://127.0.0.1:9", "m", tiny_vocabulary(50), slo_ttft_s=1.0,
        slo_itl_s=1.0, options=ReplayOptions(duration_s=60.0), now=lambda: clock["t"],
        sleep=sleep, transport=httpx.MockTransport(_echo),
        progress=lambda t, recs: seen.append((t, sum(r.sent_s is not None for r in recs))),
        progress_s=10.0))
    assert seen and all(b[0] > a[0] for a, b in itertools.pairwise(seen))
    assert seen[-1][1] >= seen[0][1]


def test_replay_refuses_non_loopback_and_bad_options() -> None:
    with pytest.raises(ReplayError, match="loopback"):
        asyncio.run(replay_async(_trace(1), "http://10.0.0.1:8000", "m", ["a"],
                                 slo_ttft_s=1, slo_itl_s=1))
    with pytest.raises(ReplayError, match="'max_rps'"):
        ReplayOptions(max_rps=0)


def test_summary_matches_the_simulators_definitions() -> None:
    recs = [RequestRecord(0, 0.0, 10, 5, sent_s=0.0, ttft_s=0.1, itl_mean_s=0.01,
                          output_tokens=5, end_s=1.0, gaps_s=[0.01] * 4),
            RequestRecord(1, 0.0, 10, 5, sent_s=0.0, ttft_s=0.9, itl_mean_s=0.01,
                          output_tokens=5, end_s=1.0, gaps_s=[0.01] * 4),
            RequestRecord(2, 0.0, 10, 5, sent_s=0.5, error="http 500: x")]
    samples = [(0.0, {"decode": 2}), (1800.0, {"decode": 4}), (3600.0, {"decode": 4})]
    s = summarize(recs, samples, slo_ttft_s=0.5, slo_itl_s=0.05,
                  gpus_per_replica={"decode": 2}, wall_s=3600.0)
    assert s["ttft_attainment"] == pytest.approx(1 / 3)  # errors count as misses
    assert s["itl_attainment"] == pytest.approx(2 / 3)
    assert s["slo_attainment"] == pytest.approx(1 / 3)
    assert s["gpu_hours"] == pytest.approx((0.5 * 2 + 0.5 * 4) * 2)
    assert s["pools"]["decode"]["mean_replicas"] == pytest.approx(3.0)
    assert s["scale_actions"] == 1 and s["client_delay_max_s"] == 0.5


def test_stack_labels_and_pod_names_match_the_spec(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "examples" / "dynamo.yaml")
    svc = spec.services[0]
    stack = DynamoStack(svc, tmp_path)
    templates = stack.worker_templates(Path("/usr/bin/python3"))
    for role, key in stack.keys().items():
        t = templates[key]
        assert t.name_prefix == svc.pools[role].target.name
        assert t.env["DYN_SYSTEM_PORT"] == "{port}" and t.env["DYN_NAMESPACE"] == "llama-disagg"
        assert t.scrape_labels["namespace"] == svc.namespace
        assert t.scrape_labels["role"] == role.value
        assert t.cold_start_s == svc.pools[role].cold_start
        assert "--disaggregation-mode" in t.argv and role.value in t.argv
    stack.frontend_port = 8000
    jobs = stack.scrape_configs()
    assert [j["job_name"] for j in jobs] == ["llama-dynamo-frontend", "llama-dynamo-prefill",
                                             "llama-dynamo-decode"]
    assert jobs[0]["static_configs"][0]["labels"]["pod"] == "llama-dynamo-frontend-0"
    assert jobs[2]["file_sd_configs"][0]["files"][0].endswith("targets/llama-dynamo-decode.json")


def test_stack_refuses_specs_it_cannot_run(tmp_path: Path) -> None:
    raw = load_spec(ROOT / "examples" / "dynamo.yaml").model_dump(mode="json", by_alias=True)
    svc = raw["services"][0]
    svc["pools"]["prefill"]["selector"]["pod_regex"] = "prefill-pods-.*"
    bad = Spec.model_validate(raw).services[0]
    with pytest.raises(StackError, match="does not match the stack's worker name"):
        DynamoStack(bad, tmp_path).worker_templates(Path("/usr/bin/python3"))
    vllm = load_spec(ROOT / "examples" / "vllm.yaml").services[0]
    with pytest.raises(StackError, match="engine 'dynamo'"):
        DynamoStack(vllm, tmp_path)
