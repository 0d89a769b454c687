from __future__ import annotations

import numpy as np
import pytest

from pdscale.forecasting import (
    SeriesError,
    level_shifts,
    regularize,
    series_from_prometheus,
    series_from_requests,
)


def test_missing_windows_are_missing_not_zero() -> None:
    s = regularize([0, 60, 240, 600], [1.0, 2.0, 4.0, 8.0], resolution_s=60, max_fill=3)
    # Steps 2-3 (120 s, 180 s) are filled between 2 and 4; steps 5-9 are a long gap.
    assert s.values[2] == pytest.approx(2 + 2 / 3)
    assert np.isnan(s.values[6])
    assert s.filled == 2 and s.missing == 5


def test_zero_collection_gaps() -> None:
    values = np.array([100.0, 110, 0, 0, 0, 0, 0, 120, 115])
    s = regularize(np.arange(9) * 600.0, values, resolution_s=600, zero_is_missing=True)
    assert np.isnan(s.values[3]) and "collection gaps" in s.notes[0]


def test_requests_to_series() -> None:
    arrivals = np.array([0.5, 1.0, 61.0, 200.0])
    series = series_from_requests(arrivals, np.array([100, 300, 50, 10]),
                                  np.array([10, 30, 5, 1]), resolution_s=60)
    assert list(series["request_rate"].values) == pytest.approx([2 / 60, 1 / 60, 0, 1 / 60])
    assert series["mean_input_tokens"].values[0] == 200
    assert np.isnan(series["mean_input_tokens"].values[2])


def test_prometheus_matrix() -> None:
    result = [{"metric": {"pod": "a"}, "values": [[0, "1"], [60, "2"], [120, "NaN"]]},
              {"metric": {"pod": "b"}, "values": [[0, "3"], [60, "4"]]}]
    s = series_from_prometheus(result, resolution_s=60)
    assert list(s.values[:2]) == [4.0, 6.0]
    with pytest.raises(SeriesError, match="no data, not zero"):
        series_from_prometheus([], resolution_s=60)


def test_level_shift_detection() -> None:
    values = np.concatenate([np.full(50, 10.0), np.full(50, 40.0)])
    assert level_shifts(values, window=10) == [50]
    assert level_shifts(np.full(100, 5.0), window=10) == []
