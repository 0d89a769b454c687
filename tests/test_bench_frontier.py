"""The cost-matched comparison's arithmetic (bench/frontier.py), which the README quotes."""

from __future__ import annotations

import pytest

from tests.conftest import bench_module

F = bench_module("frontier")


def test_the_frontier_keeps_only_points_nothing_beats_on_both() -> None:
    points = [(10.0, 0.90), (8.0, 0.95), (12.0, 0.99), (9.0, 0.80), (15.0, 0.98)]
    # (10, 0.90) costs more than (8, 0.95) for less; (15, 0.98) more than (12, 0.99) for less.
    assert F.frontier(points) == [(8.0, 0.95), (12.0, 0.99)]


def test_attainment_at_matched_gpu_hours_interpolates_and_says_when_it_cannot() -> None:
    front = [(8.0, 0.90), (12.0, 0.98)]
    assert F.attainment_at(front, 10.0) == pytest.approx(0.94)
    assert F.attainment_at(front, 20.0) == 0.98  # beyond the costliest setting: its attainment
    assert F.attainment_at(front, 7.9) is None  # cheaper than any setting: no claim


def test_each_baseline_run_is_judged_against_pdscale_at_its_own_cost() -> None:
    rows = [{"trace": "t", "policy": "pdscale", "setting": s, "gpu_hours": g,
             "slo_attainment": a} for s, g, a in (("a", 8.0, 0.90), ("b", 12.0, 0.98))]
    rows += [{"trace": "t", "policy": "reactive", "setting": s, "gpu_hours": g,
              "slo_attainment": a} for s, g, a in (("x", 10.0, 0.93), ("y", 11.0, 0.97),
                                                   ("z", 5.0, 0.5), ("big", 30.0, 0.999),
                                                   ("waste", 30.0, 0.95))]
    got = {c["setting"]: (c["pdscale_attainment"], c["pdscale_better"]) for c in F.compare(rows)}
    assert got["x"][0] == pytest.approx(0.94) and got["x"][1] is True
    assert got["y"][0] == pytest.approx(0.96) and got["y"][1] is False
    assert got["z"] == (None, None)
    # Costlier than any pdscale setting: better if pdscale's best already beats it for less,
    # otherwise undecided (pdscale was not run at that cost), never "worse".
    assert got["waste"] == (0.98, True)
    assert got["big"] == (0.98, None)
