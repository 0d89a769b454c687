"""Rolling-origin backtests and forecast scores.

Each model is fitted once on the training part; forecasts are then made from every origin of
the test part (each using only data up to its origin) at each horizon. With ``refit_every``, the
model is instead refitted every that many origins on everything up to the origin (a short
history that grows, as the controller sees it on a new pool). Scores per model and
horizon: MAE, sMAPE, MASE (MAE over the in-sample MAE of the seasonal-naive forecast, the
usual scale), pinball loss per quantile, and the empirical coverage of the upper quantile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pdscale.forecasting._models import _Forecaster
from pdscale.forecasting._series import RegularSeries, SeriesError

__all__ = ["BacktestResult", "backtest", "pinball"]

FloatArray = npt.NDArray[np.float64]


def pinball(actual: FloatArray, forecast: FloatArray, q: float) -> float:
    diff = actual - forecast
    return float(np.nanmean(np.maximum(q * diff, (q - 1) * diff)))


@dataclass(frozen=True)
class BacktestResult:
    scores: dict[str, dict[str, dict[str, Any]]]
    """model -> horizon label -> scores."""
    train_steps: int
    test_origins: int
    forecasts: dict[str, FloatArray]
    """model -> (n_origins, n_horizons, n_quantiles), for plots."""
    origins: npt.NDArray[np.int64]
    horizons: npt.NDArray[np.int64]
    fit_s: dict[str, float]
    predict_ms: dict[str, float]
    """Time of one forecast from the last origin (all horizons and quantiles)."""


def _label(steps: int, resolution_s: float) -> str:
    seconds = steps * resolution_s
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"


def backtest(series: RegularSeries, models: Mapping[str, _Forecaster], *,
             horizons_s: Sequence[float], train_steps: int, season_steps: int,
             origin_stride: int = 1, refit_every: int | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> BacktestResult:
    """Score each model; ``progress(name, done, total)`` is called before each model is
    fitted (``done`` models of ``total`` finished), for a caller that shows progress."""
    res = series.resolution_s
    for h in horizons_s:
        if h < res:
            raise SeriesError(f"horizon {h:g}s is shorter than the resolution {res:g}s; use "
                              "horizons of at least one step")
    horizons = np.array(sorted({round(h / res) for h in horizons_s}), dtype=np.int64)
    values = series.values
    n = len(values)
    if refit_every is not None and refit_every < 1:
        raise ValueError(f"The 'refit_every' parameter of backtest must be at least 1. Got "
                         f"{refit_every!r} instead.")
    if train_steps < 2 or train_steps >= n - horizons.max():
        raise SeriesError(f"the training part ({train_steps} steps) must leave at least "
                          f"{horizons.max() + 1} steps to test; the series has {n}")
    origins = np.arange(train_steps - 1, n - horizons.max(), origin_stride, dtype=np.int64)
    train = values[:train_steps]
    times = series.times_s
    # MASE scale: in-sample MAE of the seasonal-naive forecast on the training part.
    m = season_steps if train_steps > season_steps + 1 else 1
    scale = float(np.nanmean(np.abs(train[m:] - train[:-m])))
    actual = values[origins[:, None] + horizons[None, :]]
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    forecasts: dict[str, FloatArray] = {}
    fit_s: dict[str, float] = {}
    predict_ms: dict[str, float] = {}
    for done, (name, model) in enumerate(models.items()):
        if progress is not None:
            progress(name, done, len(models))
        started = time.perf_counter()
        model.fit(times[:train_steps, None], train)
        fit_s[name] = time.perf_counter() - started
        started = time.perf_counter()
        model._predict_origins(values, np.array([n - 1]), horizons)
        predict_ms[name] = (time.perf_counter() - started) * 1000
        if refit_every is None:
            pred = model._predict_origins(values, origins, horizons)
        else:
            blocks = []
            for first in range(0, len(origins), refit_every):
                block = origins[first:first + refit_every]
                model.fit(times[:block[0] + 1, None], values[:block[0] + 1])
                blocks.append(model._predict_origins(values, block, horizons))
            pred = np.concatenate(blocks)
        forecasts[name] = pred
        qs = tuple(model.quantiles)
        mid = qs.index(0.5) if 0.5 in qs else len(qs) // 2
        per_h: dict[str, dict[str, Any]] = {}
        for j, h in enumerate(horizons):
            a = actual[:, j]
            ok = np.isfinite(a) & np.isfinite(pred[:, j, mid])
            f = pred[ok, j, mid]
            err = np.abs(a[ok] - f)
            denom = np.abs(a[ok]) + np.abs(f)
            entry: dict[str, Any] = {
                "mae": float(err.mean()) if ok.any() else None,
                "smape": float(np.mean(np.where(denom > 0, 2 * err / np.where(denom > 0, denom,
                                                                               1), 0.0)))
                if ok.any() else None,
                "mase": float(err.mean() / scale) if ok.any() and scale > 0 else None,
                "pinball": {str(q): pinball(a[ok], pred[ok, j, k], q)
                            for k, q in enumerate(qs)},
                "points": int(ok.sum()),
            }
            if 0.9 in qs:
                k = qs.index(0.9)
                entry["coverage_q90"] = float(np.mean(a[ok] <= pred[ok, j, k]))
            per_h[_label(int(h), res)] = entry
        scores[name] = per_h
    return BacktestResult(scores, train_steps, len(origins), forecasts, origins, horizons,
                          fit_s, predict_ms)
