"""Load forecasting at the pre-warm horizon, with calibrated quantiles.

Estimators follow the scikit-learn contract (``fit(X, y)`` with times in ``X[:, 0]``);
:func:`backtest` scores them with rolling origins; :func:`regularize` and friends turn raw
observations into the regular series they learn from.
"""

from pdscale.forecasting._backtest import BacktestResult, backtest, pinball
from pdscale.forecasting._models import (
    AutoForecaster,
    ExponentialSmoothing,
    LastValue,
    QuantileGBForecaster,
    SeasonalNaive,
)
from pdscale.forecasting._online import OnlineForecaster
from pdscale.forecasting._series import (
    RegularSeries,
    SeriesError,
    level_shifts,
    regularize,
    series_from_prometheus,
    series_from_requests,
)

__all__ = [
    "AutoForecaster",
    "BacktestResult",
    "ExponentialSmoothing",
    "LastValue",
    "OnlineForecaster",
    "QuantileGBForecaster",
    "RegularSeries",
    "SeasonalNaive",
    "SeriesError",
    "backtest",
    "level_shifts",
    "pinball",
    "regularize",
    "series_from_prometheus",
    "series_from_requests",
]
