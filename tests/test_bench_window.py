"""bench/window.py: the arrival statistics, the sampled queue's rule and the option parsing
(pure); one short static run through the simulator when the shared trace is here."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SHARED, bench_module

W = bench_module("window")


def test_arrival_stats_bin_by_second_and_minute() -> None:
    # 120 s: one request of 100 tokens a second, and a burst of 50 x 1,000 tokens at 30.2 s.
    arrival = np.concatenate([np.arange(120) + 0.5, np.full(50, 30.2)])
    tokens = np.concatenate([np.full(120, 100), np.full(50, 1000)])
    a = W.arrival_stats(arrival, tokens, 120.0)
    assert a["requests"] == 170
    assert a["mean_tokens_per_s"] == pytest.approx((120 * 100 + 50_000) / 120)
    assert a["peak_second_tokens_per_s"] == pytest.approx(50_100)
    assert a["peak_minute_tokens_per_s"] == pytest.approx((60 * 100 + 50_000) / 60)
    counts = np.ones(120)
    counts[30] = 51
    assert a["dispersion_per_second"] == pytest.approx(counts.var() / counts.mean())
    steady = W.arrival_stats(np.arange(60) + 0.5, np.full(60, 10), 60.0)
    assert steady["dispersion_per_second"] == 0.0  # one a second: no dispersion at all


def test_the_queue_rule_keeps_the_window_peak_and_sizes_it_within_the_slo() -> None:
    queue = np.array([0, 10, 0, 0, 0, 3, 0])
    assert W.rolling_max(queue.astype(float), 3).tolist() == [0, 10, 10, 10, 0, 3, 3]
    # 10 prompts of 1,000 tokens within 0.5 s at 4,000 tokens/s a worker: 5 workers.
    need = W.queue_need(queue, window=3, prompt_tokens=1000, per_replica=4000, slo_s=0.5)
    assert need.tolist() == [1, 5, 5, 5, 1, 2, 2]
    assert W.need_shares(need) == pytest.approx({"1": 2 / 7, "2": 2 / 7, "5": 3 / 7})


def test_options_parse_ranges_and_refuse_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    opts = W.parse_args(["--seeds", "0-2,7", "--statics", "2,3", "--cold-starts", "30"])
    assert opts.seeds == (0, 1, 2, 7) and opts.statics == (2, 3)
    assert opts.cold_starts_s == (30.0,) and opts.out == "window-azure"
    assert opts.start_min == 14.0  # bench/stack.py's window by default
    for bad, says in ((["--seeds", "a-b"], "whole numbers"), (["--statics", "0"], "at least 1"),
                      (["--sample-s", "0"], "--sample-s must be > 0"),
                      (["--cold-starts", "x"], "could not convert")):
        with pytest.raises(SystemExit) as e:
            W.parse_args(bad)
        assert e.value.code == 2
        assert says in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "traces" / "azure_llm_2023_code.csv").is_file(),
                    reason="needs ../shared/traces/azure_llm_2023_code.csv (CI has it)")
def test_a_static_run_samples_the_queue_every_tick(tmp_path: object) -> None:
    from pathlib import Path

    trace = W.load_window("azure", 14.0, 2.0, 1.0, 0)
    spec = W.write_spec(Path(str(tmp_path)), W.TRACES["azure"], cold_start_s=60.0,
                        max_replicas=4, speedup=1.0)
    one = W.simulate_static(trace, spec, 1, sample_s=2.0, seed=0)
    four = W.simulate_static(trace, spec, 4, sample_s=2.0, seed=0)
    assert len(one["queue"]) == len(one["queue_t"]) >= 40  # until the last request is served
    assert np.diff(one["queue_t"]) == pytest.approx(2.0)
    # The window opens with a burst: one worker queues it, four barely.
    assert max(one["queue"]) > 10 * max(1.0, max(four["queue"]))
    assert one["slo_attainment"] < four["slo_attainment"]
