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
