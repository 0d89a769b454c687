"""bench/suite.py: the best fixed allocation search, the frontier reading and the journal."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.conftest import bench_module

S = bench_module("suite")


def _exhaustive(feasible, p_max: int, d_max: int) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
    options = [(p, d) for p, d in itertools.product(range(1, p_max + 1), range(1, d_max + 1))
               if feasible(p, d)]
    return min(options, key=lambda a: (a[0] + a[1], a[0])) if options else None


CASES = {
    # Independent pools: each needs its own minimum.
    "corner": lambda p, d: p >= 7 and d >= 3,
    # Decode load spills into prefill (a longer TTFT when decode admits slowly): a staircase
    # whose best point is not the corner of the two minimums.
    "staircase": lambda p, d: p >= 4 and d >= 2 and p + 2 * d >= 14,
    "trade": lambda p, d: p * d >= 24 and p >= 2,
    "nothing": lambda p, d: False,
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_best_fixed_finds_the_smallest_allocation(case: str) -> None:
    feasible = CASES[case]
    calls: list[tuple[int, int]] = []

    def counted(p: int, d: int) -> bool:
        calls.append((p, d))
        return feasible(p, d)

    found = S.best_fixed(counted, 12, 9)
    assert found == _exhaustive(feasible, 12, 9)
    assert len(set(calls)) < 12 * 9 // 2  # a search, not a scan


def test_best_fixed_on_a_simulated_case() -> None:
    """The best fixed allocation of a hand-made staircase found by the search agrees with the
    exhaustive answer; its neighbours below fail."""
    found = S.best_fixed(CASES["staircase"], 20, 20)
    assert found is not None
    p, d = found
    assert CASES["staircase"](p, d)
    assert not CASES["staircase"](p - 1, d) and not CASES["staircase"](p, d - 1)


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
