"""bench/forecasting.py's band chance: how often a calibrated quantile reads inside the band."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import bench_module

fb = bench_module("forecasting")


def test_band_chance_matches_a_simulated_calibrated_quantile() -> None:
    rng = np.random.default_rng(0)
    for n in (24, 44, 538):
        covered = (rng.random((20_000, n)) < 0.9).mean(axis=1)
        simulated = float(np.mean((covered >= 0.88 - 1e-9) & (covered <= 0.92 + 1e-9)))
        assert fb.band_chance(n) == pytest.approx(simulated, abs=0.02)


def test_band_chance_grows_with_the_targets_counted() -> None:
    assert fb.band_chance(0) == 0.0
    assert fb.band_chance(24) < 0.5 < fb.band_chance(574) < fb.band_chance(5361)
    # On 10 targets only 9 covered reads inside 0.88-0.92: C(10, 9) 0.9^9 0.1.
    assert fb.band_chance(10) == pytest.approx(10 * 0.9 ** 9 * 0.1)
