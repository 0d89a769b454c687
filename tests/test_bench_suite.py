"""bench/suite.py: the best fixed allocation search, the frontier reading and the journal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import bench_module

S = bench_module("suite")


def test_frontier_interpolates_inside_and_is_undecided_outside() -> None:
    points = [(10.0, 0.80), (20.0, 0.90), (40.0, 0.95), (30.0, 0.85)]  # (30, .85): dominated
    assert S.frontier_at(points, 15.0) == pytest.approx(0.85)
    assert S.frontier_at(points, 30.0) == pytest.approx(0.925)
    assert S.frontier_at(points, 5.0) is None
    assert S.frontier_at(points, 41.0) is None


def test_first_burst_counts_scale_ups_within_two_cold_starts() -> None:
    ups = [{"t": 15.0, "pool": "prefill", "from": 1, "to": 9},
           {"t": 30.0, "pool": "decode", "from": 1, "to": 3},
           {"t": 200.0, "pool": "prefill", "from": 9, "to": 12}]
    assert S.first_burst_steps(ups, 60.0) == 1
    creeping = [{"t": 15.0 + 60 * i, "pool": "prefill", "from": i + 1, "to": i + 2}
                for i in range(4)]
    assert S.first_burst_steps(creeping, 60.0) == 3
    assert S.first_burst_steps([], 60.0) == 0


def test_the_aggregate_is_also_given_per_cold_start() -> None:
    """Two cold starts, two seeds: pdscale at 0.9 and 0.8 attainment (30 s, 60 s) on half
    and the same GPU-hours as the best fixed allocation; the per-cold-start aggregate keeps
    them apart, the whole one averages them."""
    sc = S.BY_NAME["steps"]
    rows = [{"scenario": "steps", "policy": "best-fixed", "seed": seed, "start": "fixed",
             "cold_start_s": 60.0, "slo_attainment": 0.99, "gpu_hours": 10.0 + seed,
             "first_burst_steps": 0}
            for seed in (0, 1)]
    for seed in (0, 1):
        for start in ("fixed", "cold"):
            for cold, att, share in ((30.0, 0.9, 0.5), (60.0, 0.8, 1.0)):
                rows.append({"scenario": "steps", "policy": "pdscale", "seed": seed,
                             "start": start, "cold_start_s": cold, "slo_attainment": att,
                             "gpu_hours": share * (10.0 + seed), "first_burst_steps": 1})
    summary = S.summarise({"rows": rows}, [sc], [0, 1], [30.0, 60.0])
    whole = summary["aggregate"]["pdscale"]
    assert whole["attainment"] == pytest.approx(0.85)
    assert whole["gpu_hours_vs_best_fixed"] == pytest.approx(0.75)
    by_cold = summary["aggregate_by_cold_start"]
    assert by_cold["30"]["pdscale"]["attainment"] == pytest.approx(0.9)
    assert by_cold["60"]["pdscale"]["gpu_hours_vs_best_fixed"] == pytest.approx(1.0)
    assert by_cold["30"]["pdscale"]["attainment_sd"] == pytest.approx(0.0)
    text = S.markdown(summary, {}, {"tier": "full", "command": "c", "seeds": [0, 1],
                                    "cold_starts": [30.0, 60.0], "runs": 0, "wall_min": 0.0,
                                    "jobs": 1, "reused": 0})
    assert "| pdscale | 90.00±0.00, 0.500 | 80.00±0.00, 1.000 |" in text
    one = S.summarise({"rows": rows}, [sc], [0, 1], [60.0])
    assert "aggregate_by_cold_start" not in one


def test_the_journal_keeps_finished_runs_for_a_rerun(tmp_path: Path) -> None:
    journal = tmp_path / "x.runs.jsonl"
    job = {"scenario": "steps", "policy": "pdscale", "start": "cold", "cold_start_s": 60,
           "seed": 0}
    row = {**job, "slo_attainment": 0.5, "gpu_hours": 1.0, "wall_s": 0.1}
    journal.write_text(json.dumps({"key": S._key(job), "row": row}) + "\n" + '{"key": "cut')
    runner = S.Runner(1, journal)
    assert runner.map([job]) == [row]  # from the journal: nothing simulated
    assert runner.done == 0 and runner.reused == 1
    assert S.Runner(1, journal, rerun=("pdscale",)).cache == {}  # to be run again


def test_unknown_scenario_and_missing_traces_are_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    with pytest.raises(SystemExit) as stop:
        S.main(["--scenarios", "tsunami"])
    assert stop.value.code == 2
    assert "use any of daily-rise" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        S.main(["--scenarios", "azure-code", "--traces", str(tmp_path)])
    assert "--scenarios daily-rise" in capsys.readouterr().err


def test_a_target_missed_says_by_how_much() -> None:
    """One seed of one hour-long scenario at one cold start, every baseline present: pdscale
    two points under the fixed allocation on half its GPU-hours, three scale-ups from cold."""
    sc = S.BY_NAME["steps"]
    att = {"pdscale": 0.97, "dynamo": 0.30, "oracle": 0.99, "reactive@0.4": 0.95,
           "reactive@0.6": 0.90, "reactive@0.8": 0.80}
    gpu = {"pdscale": 5.0, "dynamo": 2.0, "oracle": 4.0, "reactive@0.4": 8.0,
           "reactive@0.6": 4.0, "reactive@0.8": 3.0}
    rows = [{"scenario": "steps", "policy": "best-fixed", "seed": 0, "start": "fixed",
             "cold_start_s": 60.0, "slo_attainment": 0.99, "gpu_hours": 10.0,
             "first_burst_steps": 0}]
    rows += [{"scenario": "steps", "policy": policy, "seed": 0, "start": start,
              "cold_start_s": 60.0, "slo_attainment": a, "gpu_hours": gpu[policy],
              "first_burst_steps": 3}
             for policy, a in att.items() for start in ("fixed", "cold")]
    summary = S.summarise({"rows": rows}, [sc], [0], [60.0])
    fixed, cold = summary["cells"]
    assert fixed["targets"]["no_worse_than_fixed"] == "missed"
    assert fixed["margins"]["no_worse_than_fixed"] == "-2.00 pts on 0.50x GPU-h"
    assert cold["margins"]["first_burst_one_decision"] == "3 scale-ups"
    assert cold["margins"]["beats_reactive_and_dynamo"] == "+7.00 pts"
    # reactive's frontier at 5 GPU-hours: 0.90 + (0.95 - 0.90) x 1/4
    assert cold["margins"]["beats_reactive_matched"] == "+5.75 pts"
    text = S.markdown(summary, {}, {"tier": "quick", "command": "c", "seeds": [0],
                                    "cold_starts": [60.0], "runs": 0, "wall_min": 0.0,
                                    "jobs": 1, "reused": 0})
    assert "no_worse_than_fixed missed (-2.00 pts on 0.50x GPU-h)" in text
    assert "| no_worse_than_fixed | 0 | 1 | 0 |" in text
    assert "| first_burst_one_decision | 0 | 1 | 0 |" in text
