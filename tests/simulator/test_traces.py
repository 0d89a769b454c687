from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pdscale.simulator import TraceError, load_trace, synthetic_trace, trace_stats
from pdscale.simulator._fluid import fluid_load_from_servegen
from pdscale.simulator._servegen import load_servegen
from tests.conftest import SHARED

TRACES = SHARED / "traces"
needs_shared = pytest.mark.skipif(not TRACES.exists(),
                                  reason="../shared/traces is absent (only in the project's CI)")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_azure_2023_and_2024_timestamps(tmp_path: Path) -> None:
    t23 = _write(tmp_path / "a23.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:05.0319600,3180,8\n")
    t24 = _write(tmp_path / "a24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,100,5\n2024-05-10 00:00:01.509930+00:00,7,1\n")
    a = load_trace(t23, "azure")
    assert list(a.prompt_tokens) == [4808, 3180]
    assert a.arrival_s[1] == pytest.approx(1.052)
    b = load_trace(t24, "azure")
    assert b.arrival_s[1] == pytest.approx(1.5)
    assert b.start is not None and b.start.year == 2024


def test_bad_row_names_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:17:03.9,10,2\n2023-11-16 18:17:04.0,ten,2\n"
                  "2023-11-16 18:17:05.0,12,3\n")
    with pytest.raises(TraceError) as info:
        load_trace(path, "azure")
    message = str(info.value)
    assert "bad.csv, line 3, column 'ContextTokens'" in message
    assert "--skip-bad-rows" in message
    skipped = load_trace(path, "azure", skip_bad_rows=True)
    assert len(skipped) == 2 and skipped.skipped_rows == 1
    assert "skipped 1 malformed row(s)" in skipped.notes


def test_unsorted_timestamps_are_sorted_with_a_warning(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.csv", "Timestamp,Model,Request tokens,Response tokens,"
                  "Total tokens,Log Type\n5.0,ChatGPT,10,20,30,Conversation log\n"
                  "1.0,GPT-4,40,50,90,API log\n")
    with pytest.warns(UserWarning, match="not sorted"):
        trace = load_trace(path, "burstgpt")
    assert list(trace.prompt_tokens) == [40, 10]
    assert list(trace.arrival_s) == [0.0, 4.0]


def test_empty_and_unknown(tmp_path: Path) -> None:
    empty = _write(tmp_path / "e.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(empty, "azure")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(empty, "parquet")
    odd = _write(tmp_path / "x.txt", "hello\n")
    with pytest.raises(TraceError, match="--format"):
        load_trace(odd)
    with pytest.raises(TraceError, match="missing column"):
        load_trace(_write(tmp_path / "m.csv", "TIMESTAMP,Tokens\n1,2\n"), "azure")


def test_mooncake_jsonl_gz(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl.gz"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 700, "output_length": 6, "hash_ids": [1, 3]}]
    with gzip.open(path, "wt") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.write('{"timestamp": "x"}\n')
    with pytest.raises(TraceError, match="line 3, column 'timestamp'"):
        load_trace(path)
    trace = load_trace(path, skip_bad_rows=True)
    assert list(trace.arrival_s) == [0.0, 1.5]
    assert trace.hash_ids is not None and list(trace.hash_ids[1]) == [1, 3]
    assert trace_stats(trace).prefix_blocks_mean == 2.0


def test_servegen_rebuilds_counts_per_window(tmp_path: Path) -> None:
    path = _write(tmp_path / "servegen_m-large_client_rates.csv",
                  "client_id,window_start_s,rate_rps,cv,arrival_dist,dist_param1,dist_param2\n"
                  "0,0,2.0,1.0,Gamma,1.0,0.5\n0,600,0,0,,0,0\n1,600,0.5,3.0,Weibull,0.5,1.0\n")
    trace = load_servegen(path, seed=3)
    first = int(((trace.arrival_s >= 0) & (trace.arrival_s < 600)).sum())
    second = int(((trace.arrival_s >= 600) & (trace.arrival_s < 1200)).sum())
    assert (first, second) == (1200, 300)
    again = load_servegen(path, seed=3)
    assert np.array_equal(trace.arrival_s, again.arrival_s)


def test_servegen_fluid_window_takes_the_rates_in_it(tmp_path: Path) -> None:
    """A window of a ServeGen trace in fluid mode is the aggregate rates within it, on a
    clock from 0, as the whole trace's are: no request is materialised."""
    path = _write(tmp_path / "servegen_m-large_client_rates.csv",
                  "client_id,window_start_s,rate_rps,cv,arrival_dist,dist_param1,dist_param2\n"
                  "0,0,2.0,1.0,Gamma,1.0,0.5\n0,600,1.0,1.0,Gamma,1.0,1.0\n"
                  "0,1200,4.0,1.0,Gamma,1.0,0.25\n")
    whole = fluid_load_from_servegen(path, seed=1)
    window = fluid_load_from_servegen(path, seed=1, start_s=600, duration_s=900)
    assert whole.requests.sum() == pytest.approx(2 * 600 + 600 + 4 * 600)
    assert window.requests.sum() == pytest.approx(1.0 * 600 + 4 * 300)
    assert window.steps == 900 / window.dt_s
    assert np.array_equal(window.requests, whole.requests[120:300])
    with pytest.raises(TraceError, match="no requests between 1800s and 2400s"):
        fluid_load_from_servegen(path, start_s=1800, duration_s=600)
    clipped = window.clipped(100)
    assert max(float(p.max()) for p in clipped.prompt_samples) <= 100
    assert max(float(p.max()) for p in window.prompt_samples) > 100
    with pytest.raises(TraceError, match="at least 1"):
        window.clipped(0)


def test_synthetic_is_seeded() -> None:
    a = synthetic_trace(duration_s=600, seed=7)
    b = synthetic_trace(duration_s=600, seed=7)
    c = synthetic_trace(duration_s=600, seed=8)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.prompt_tokens[:100], c.prompt_tokens[:100])
    assert np.all(np.diff(a.arrival_s) >= 0)


def test_synthetic_has_a_daily_cycle() -> None:
    trace = synthetic_trace(duration_s=86400, mean_rps=5, bursts_per_hour=0, seed=1)
    per_hour = np.bincount((trace.arrival_s // 3600).astype(int), minlength=24)
    assert per_hour.max() > 2.5 * per_hour.min()


@pytest.mark.parametrize("factor", [0.25, 1.0, 2.0, 3.5])
def test_scale_thins_or_multiplies(factor: float) -> None:
    trace = synthetic_trace(duration_s=1800, mean_rps=10, seed=2)
    scaled = trace.scaled(factor, seed=1)
    assert len(scaled) == pytest.approx(factor * len(trace), rel=0.05)
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    with pytest.raises(TraceError, match="positive"):
        trace.scaled(0)


@needs_shared
@pytest.mark.parametrize(("name", "requests"), [
    ("azure_llm_2023_code.csv", 8819), ("mooncake_fast25_conversation_trace.jsonl.gz", 12031)])
def test_shared_traces_load(name: str, requests: int) -> None:
    trace = load_trace(TRACES / name)
    assert len(trace) == requests
    stats = trace_stats(trace)
    assert 3000 < stats.span_s < 3700


@needs_shared
def test_shared_servegen_hour() -> None:
    trace = load_trace(TRACES / "servegen_m-large_client_rates.csv.gz", duration_s=3600)
    rate = len(trace) / 3600
    assert 150 < rate < 260  # ServeGen m-large: ~212 req/s in the first window
