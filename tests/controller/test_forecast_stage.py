"""The forecast stage: one forecaster per pool, its refits, and typed forecasts."""

from __future__ import annotations

import math

import numpy as np

from pdscale.controller import ForecastStage, NoForecast, PoolForecast
from pdscale.spec import ControllerSettings, Role

KEY = ("svc", Role.PREFILL)


def _stage(**kw: float) -> ForecastStage:
    return ForecastStage({KEY: 75.0}, ControllerSettings(scale_up_quantile=0.9), **kw)


def _feed(stage: ForecastStage, minutes: int, start: float = 0.0) -> None:
    for i in range(minutes * 4):  # a tick every 15 s
        t = start + 15.0 * i
        stage.observe(KEY, t, 10_000.0 + 2_000.0 * math.sin(t / 3600))


def test_no_forecast_until_there_is_history_and_a_fit() -> None:
    stage = _stage()
    assert stage.min_history_s == 600.0  # minutes of history, not an hour
    _feed(stage, 9)
    got = stage.forecast(KEY, 540.0, 75.0)
    assert isinstance(got, NoForecast) and "history too short" in got.reason
    assert stage.pending_refits(540.0) == []
    _feed(stage, 60, start=540.0)
    got = stage.forecast(KEY, 4140.0, 75.0)
    assert isinstance(got, NoForecast) and "first fit" in got.reason
    assert stage.pending_refits(4140.0) == [KEY]


def test_a_fitted_stage_returns_a_typed_forecast_and_reuses_it() -> None:
    stage = _stage()
    _feed(stage, 120)
    stage.refit(KEY, 7200.0)
    got = stage.forecast(KEY, 7200.0, 150.0)
    assert isinstance(got, PoolForecast)
    assert got.horizons_s == (60.0, 120.0, 180.0) and set(got.quantiles) == {0.5, 0.9}
    assert got.sized_quantile == 0.9 and got.trained_horizons_s == (60.0, 600.0)
    assert got.sized_value == max(got.quantiles[0.9])
    assert all(np.isfinite(v) for q in got.quantiles.values() for v in q)
    assert stage.forecast(KEY, 7215.0, 150.0) is got  # cached until the worker refreshes
    assert stage.stale_forecasts(7215.0, within_s=15.0) == []
    assert stage.stale_forecasts(7310.0, within_s=15.0) == [KEY]  # forecast_every_s passed
    stage.refresh_forecast(KEY, 7320.0)
    fresh = stage.forecast(KEY, 7320.0, 150.0)
    assert isinstance(fresh, PoolForecast) and fresh.at_s == 7320.0
    assert fresh.as_dict()["quantiles"]["0.9"] == list(fresh.quantiles[0.9])
