"""The seed spread's arithmetic (bench/seeds.py), which the README quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import bench_module

S = bench_module("seeds")


def _rows(pairs: dict[int, tuple[float, float]], trace: str = "t") -> list[dict[str, object]]:
    return [{"trace": trace, "cold_start_s": 60.0, "policy": "pdscale", "seed": s,
             "slo_attainment": a, "gpu_hours": g} for s, (a, g) in pairs.items()]


def test_the_spread_is_the_mean_and_range_over_seeds() -> None:
    got = S.summarise(_rows({0: (0.90, 10.0), 1: (0.96, 14.0), 2: (0.93, 12.0)}))
    s = got[("t", 60.0, "pdscale")]
    assert s["seeds"] == [0, 1, 2]
    assert s["attainment_mean"] == pytest.approx(0.93)
    assert (s["attainment_min"], s["attainment_max"]) == (0.90, 0.96)
    assert (s["gpu_hours_mean"], s["gpu_hours_min"], s["gpu_hours_max"]) == (12.0, 10.0, 14.0)


def test_a_change_is_counted_seed_by_seed_on_the_seeds_both_ran() -> None:
    before = S.summarise(_rows({0: (0.90, 10.0), 1: (0.96, 14.0), 2: (0.93, 12.0)}))
    now = S.summarise(_rows({0: (0.91, 11.0), 1: (0.95, 14.0), 3: (0.99, 1.0)}))
    d = S.compare(now, before)[("t", 60.0, "pdscale")]
    assert d["seeds_compared"] == 2  # seeds 0 and 1
    assert (d["attainment_up"], d["attainment_down"]) == (1, 1)
    assert (d["gpu_hours_up"], d["gpu_hours_down"]) == (1, 0)
    # The means are each run's own: seed 3 counts in them, seed 2 in the earlier one.
    assert d["attainment_points"] == pytest.approx(100 * ((0.91 + 0.95 + 0.99) / 3 - 0.93))
    assert S.compare(now, {}) == {}
    text = S.table(now, S.compare(now, before))
    assert "| t | 60 s | pdscale | 3 |" in text and "1/1, 1/0 of 2 |" in text


def test_compare_refuses_a_file_that_is_not_a_seeds_result(tmp_path: Path) -> None:
    other = tmp_path / "policies.json"
    other.write_text(json.dumps({"bench": "policies", "rows": []}))
    with pytest.raises(ValueError, match=r"not a bench/seeds\.py result"):
        S.load_summary(other)
    good = tmp_path / "seeds.json"
    good.write_text(json.dumps({"bench": "seeds", "rows": _rows({0: (0.9, 1.0)})}))
    assert ("t", 60.0, "pdscale") in S.load_summary(good)
