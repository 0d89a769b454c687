"""Load forecasters with the scikit-learn estimator contract.

Contract: ``fit(X, y)`` with ``X[:, 0]`` the observation times in seconds (monotonic) and ``y``
the observed values; ``predict(X)`` gives the median forecast at the times in ``X[:, 0]``,
which must lie at least one resolution step after the last observation; ``predict_quantiles``
gives every quantile, never crossing. ``update(X, y)`` appends new observations without
refitting (the controller refits on its own schedule). Observations are put on a regular grid
(:func:`forecasting.regularize`).

Models:

* :class:`LastValue`: the last observation (what a one-interval-ahead planner effectively
  does); quantiles from its own in-sample errors at each horizon.
* :class:`SeasonalNaive`: the value one period (a day by default) before the target time.
* :class:`ExponentialSmoothing`: Holt's damped-trend smoothing.
* :class:`QuantileGBForecaster`: gradient-boosted quantile regression (scikit-learn's
  HistGradientBoostingRegressor, quantile loss), one model per quantile pooled over the
  horizons (direct: the horizon is a feature, never a recursion). Features: lags at several
  scales, rolling level and spread, recent trend, the value one day and one week before the
  target, time-of-day Fourier terms of the target time (and day-of-week ones with at least
  three weeks of history: with fewer, one or two days of each weekday, the trees memorise
  them), the steps since the last observation and the hour's missing share. The target is the
  change from the last observed value, in units of a scale (the last week's mean size, at
  least 5 % of the history's): additive, never a ratio to a value that can be near zero (after
  a gap, a zero stretch or a partial window a ratio's lags and targets read tens of times the
  level, and any row resembling them in one feature would take the upper quantile learned
  there). A week's mean follows only a slow change of level; a unit that moved with each
  hour's level would make the upper quantile's width follow it, which the size of the
  changes does not. Absent steps are missing (lags carry the last observation over them; the
  gap's length is a feature), not zero.
  Quantiles other than the median are conformalised (CQR):
  fitted on the older origins, mixed per horizon with the simple model below by the weight
  that scores best on the most recent ``calibration`` share of the history, and shifted by
  the quantile of the mix's errors there, so their coverage holds on data the model did not
  see and they are never much less sharp than the simple model. Between refits each forecast
  is then shifted by the conformal quantile of the errors the same forecast made over the last
  ``recalibration_s`` (a day; origins whose targets are observed, from the calibration share
  on), so a fit whose calibration share was quieter than what follows does not under-cover
  until the next refit. Quantiles are sorted per row
  (monotone rearrangement), so they never cross. With less than ``short_history_s`` of
  history (or too few complete rows for the trees) the simple model forecasts alone: per
  horizon, the last value or the hour's level (whichever scores better) plus the conformal
  quantiles of the changes seen so far, so a pool with minutes of data gets a forecast.
* :class:`AutoForecaster`: fits the candidates on the older part of the history, scores them on
  the recent part (rolling origins), keeps the best and says why; short or odd histories fall
  back to simpler models with a stated reason.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.utils.validation import check_is_fitted, validate_data

from pdscale.forecasting._series import SeriesError, regularize
from pdscale.forecasting._trees import CompiledTrees, compile_trees

__all__ = ["AutoForecaster", "ExponentialSmoothing", "LastValue", "QuantileGBForecaster",
           "SeasonalNaive"]

FloatArray = npt.NDArray[np.float64]
DAY_S = 86400.0


class _Forecaster(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Shared plumbing: grid building, horizons, residual quantiles, predict/update."""

    resolution_s: float
    quantiles: tuple[float, ...]

    def _check_params(self) -> None:
        if not self.resolution_s > 0:
            raise ValueError(f"The 'resolution_s' parameter of {type(self).__name__} must be "
                             f"positive. Got {self.resolution_s!r} instead.")
        qs = tuple(self.quantiles)
        if not qs or any(not 0 < q < 1 for q in qs):
            raise ValueError(f"The 'quantiles' parameter of {type(self).__name__} must be "
                             f"values in (0, 1). Got {self.quantiles!r} instead.")

    def fit(self, X: Any, y: Any) -> _Forecaster:
        self._check_params()
        X, y = self._validate_xy(X, y, reset=True)
        started = time.perf_counter()
        series = regularize(X[:, 0], y, resolution_s=float(self.resolution_s))
        self.series_ = series
        self.values_ = series.values.copy()
        self.t_last_ = float(series.times_s[-1])
        self._fit_grid(self.values_)
        self.fit_time_s_ = time.perf_counter() - started
        return self

    def update(self, X: Any, y: Any) -> _Forecaster:
        """Append observations after the last one (no refit); predictions start from them."""
        check_is_fitted(self)
        X, y = self._validate_xy(X, y, reset=False)
        times = X[:, 0]
        if np.any(np.diff(times) < 0) or (len(times) and times[0] <= self.t_last_ -
                                           self.resolution_s / 2):
            raise SeriesError("update() takes observations after the last one, in time order")
        grid = regularize(np.concatenate([[self.t_last_], times]),
                          np.concatenate([[self.values_[-1]], y]),
                          resolution_s=float(self.resolution_s))
        self.values_ = np.concatenate([self.values_, grid.values[1:]])
        self.t_last_ = self.t_last_ + self.resolution_s * (len(grid.values) - 1)
        return self

    def _append_step(self, t_s: float, value: float) -> None:
        """:meth:`update` with one observation, for the online loop: one resolution step after
        the last (the usual case) it is appended as :meth:`update` would, without its input
        validation (sklearn's costs more than the append, once a minute for every pool);
        anything else goes through :meth:`update`."""
        if t_s == self.t_last_ + self.resolution_s and not math.isinf(value):
            self.values_ = np.concatenate([self.values_, [float(value)]])
            self.t_last_ = self.t_last_ + self.resolution_s
            return
        self.update(np.array([[t_s]]), np.array([value]))

    def _validate_xy(self, X: Any, y: Any, *, reset: bool) -> tuple[FloatArray, FloatArray]:
        """X must be finite (times); y may hold NaN (missing observations)."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y "
                             "is None")
        X = validate_data(self, X, reset=reset, ensure_min_samples=2 if reset else 1,
                          dtype=np.float64)
        y_arr = np.asarray(y, dtype=np.float64)
        if y_arr.ndim != 1:
            y_arr = y_arr.reshape(-1) if y_arr.ndim == 2 and y_arr.shape[1] == 1 else y_arr
        if y_arr.ndim != 1 or len(y_arr) != len(X):
            raise ValueError(f"y must be 1-D with one value per row of X; got shape "
                             f"{np.shape(y)} for {len(X)} rows")
        if np.any(np.isinf(y_arr)):
            raise ValueError("y contains infinite values")
        return X, y_arr

    def _horizons(self, X: Any) -> npt.NDArray[np.int64]:
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan")
        steps = np.rint((X[:, 0] - self.t_last_) / self.resolution_s).astype(np.int64)
        if np.any(steps < 1):
            raise ValueError("forecast times must be at least one resolution step "
                             f"({self.resolution_s:g} s) after the last observation; a horizon "
                             "shorter than the resolution cannot be forecast")
        out: npt.NDArray[np.int64] = steps
        return out

    def predict(self, X: Any) -> FloatArray:
        check_is_fitted(self)
        q = tuple(self.quantiles)
        median = q.index(0.5) if 0.5 in q else len(q) // 2
        out: FloatArray = self.predict_quantiles(X)[:, median]
        return out

    def predict_quantiles(self, X: Any) -> FloatArray:
        """(n, len(quantiles)) forecasts at the times in X[:, 0], non-decreasing per row."""
        check_is_fitted(self)
        return self._predict_steps(self._horizons(X))

    def _predict_steps(self, steps: npt.NDArray[np.int64]) -> FloatArray:
        """:meth:`predict_quantiles` at ``steps`` (validated: each at least 1) after the last
        observation."""
        unique = np.unique(steps)
        origin = np.array([len(self.values_) - 1])
        table = self._predict_origins(self.values_, origin, unique)[0]
        rows = np.searchsorted(unique, steps)
        return np.sort(table[rows], axis=1)

    # Subclasses: _fit_grid(values) and _point(values, origins, horizons) -> (n_o, n_h).

    def _fit_grid(self, values: FloatArray) -> None:
        self.residual_cache_: dict[int, FloatArray] = {}

    def _point(self, values: FloatArray, origins: npt.NDArray[np.int64],
               horizons: npt.NDArray[np.int64]) -> FloatArray:
        raise NotImplementedError

    def _residual_quantiles(self, h: int) -> FloatArray:
        """Quantiles of the in-sample error at horizon h (from the training grid)."""
        cache: dict[int, FloatArray] = self.residual_cache_
        if h not in cache:
            values = self.series_.values
            n = len(values)
            origins = np.arange(max(0, n - 5000), max(0, n - h))
            qs = np.array(self.quantiles)
            if len(origins) < 10:
                cache[h] = np.zeros(len(qs))
            else:
                point = self._point(values, origins, np.array([h]))[:, 0]
                err = values[origins + h] - point
                err = err[np.isfinite(err)]
                cache[h] = np.quantile(err, qs) if len(err) >= 10 else np.zeros(len(qs))
        return cache[h]

    def _predict_origins(self, values: FloatArray, origins: npt.NDArray[np.int64],
                         horizons: npt.NDArray[np.int64]) -> FloatArray:
        """(n_origins, n_horizons, n_quantiles) forecasts made at each origin index."""
        point = self._point(values, origins, horizons)
        res = np.stack([self._residual_quantiles(int(h)) for h in horizons])  # (n_h, n_q)
        out = point[:, :, None] + res[None, :, :]
        return np.maximum(out, 0.0) if self._nonnegative() else out

    def _nonnegative(self) -> bool:
        return bool(np.nanmin(self.series_.values) >= 0) if np.any(
            np.isfinite(self.series_.values)) else False

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.regressor_tags.poor_score = True
        return tags


def _last_finite(values: FloatArray, origins: npt.NDArray[np.int64]) -> FloatArray:
    """The latest finite value at or before each origin (forward fill)."""
    idx = np.where(np.isfinite(values), np.arange(len(values)), -1)
    idx = np.maximum.accumulate(idx)
    picked = idx[origins]
    out = np.where(picked >= 0, values[np.maximum(picked, 0)], np.nan)
    return out.astype(np.float64)


class LastValue(_Forecaster):
    """Forecast the last observed value at every horizon."""

    def __init__(self, *, resolution_s: float = 60.0,
                 quantiles: tuple[float, ...] = (0.5, 0.9)) -> None:
        self.resolution_s = resolution_s
        self.quantiles = quantiles

    def _point(self, values: FloatArray, origins: npt.NDArray[np.int64],
               horizons: npt.NDArray[np.int64]) -> FloatArray:
        last = _last_finite(values, origins)
        return np.repeat(last[:, None], len(horizons), axis=1)


class SeasonalNaive(_Forecaster):
    """Forecast the value one ``period_s`` before the target time."""

    def __init__(self, *, period_s: float = DAY_S, resolution_s: float = 60.0,
                 quantiles: tuple[float, ...] = (0.5, 0.9)) -> None:
        self.period_s = period_s
        self.resolution_s = resolution_s
        self.quantiles = quantiles

    def _fit_grid(self, values: FloatArray) -> None:
        super()._fit_grid(values)
        self.period_steps_ = max(1, round(self.period_s / self.resolution_s))
        if len(values) <= self.period_steps_:
            raise SeriesError(f"SeasonalNaive needs more than one period of history "
                              f"({self.period_steps_} steps); got {len(values)}")

    def _point(self, values: FloatArray, origins: npt.NDArray[np.int64],
               horizons: npt.NDArray[np.int64]) -> FloatArray:
        m = self.period_steps_
        # The value one period before the target; for horizons beyond a period, repeat it.
        back = origins[:, None] + horizons[None, :] - m * np.ceil(horizons / m)[None, :]
        back = back.astype(np.int64)
        filled = _forward_filled(values)
        ok = back >= 0
        out = np.full(back.shape, np.nan)
        out[ok] = filled[back[ok]]
        return out


def _forward_filled(values: FloatArray) -> FloatArray:
    idx = np.where(np.isfinite(values), np.arange(len(values)), -1)
    idx = np.maximum.accumulate(idx)
    return np.where(idx >= 0, values[np.maximum(idx, 0)], np.nan).astype(np.float64)


class ExponentialSmoothing(_Forecaster):
    """Holt's damped-trend exponential smoothing (alpha, beta, phi)."""

    def __init__(self, *, alpha: float = 0.3, beta: float = 0.05, phi: float = 0.9,
                 resolution_s: float = 60.0, quantiles: tuple[float, ...] = (0.5, 0.9)) -> None:
        self.alpha = alpha
        self.beta = beta
        self.phi = phi
        self.resolution_s = resolution_s
        self.quantiles = quantiles

    def _states(self, values: FloatArray) -> tuple[FloatArray, FloatArray]:
        n = len(values)
        level = np.empty(n)
        trend = np.empty(n)
        finite = values[np.isfinite(values)]
        lvl = float(finite[0]) if len(finite) else 0.0
        tr = 0.0
        a, b, phi = self.alpha, self.beta, self.phi
        for i in range(n):
            v = values[i]
            prev = lvl
            if math.isfinite(v):
                lvl = a * v + (1 - a) * (lvl + phi * tr)
                tr = b * (lvl - prev) + (1 - b) * phi * tr
            else:
                lvl = lvl + phi * tr
                tr = phi * tr
            level[i], trend[i] = lvl, tr
        return level, trend

    def _fit_grid(self, values: FloatArray) -> None:
        super()._fit_grid(values)
        for name, value in (("alpha", self.alpha), ("beta", self.beta), ("phi", self.phi)):
            if not 0 < value <= 1:
                raise ValueError(f"The '{name}' parameter of ExponentialSmoothing must be in "
                                 f"(0, 1]. Got {value!r} instead.")
        self._state_cache: tuple[tuple[int, int], FloatArray, FloatArray] | None = None

    def _point(self, values: FloatArray, origins: npt.NDArray[np.int64],
               horizons: npt.NDArray[np.int64]) -> FloatArray:
        key = (id(values), len(values))
        if self._state_cache is None or self._state_cache[0] != key:
            level, trend = self._states(values)
            self._state_cache = (key, level, trend)
        _, level, trend = self._state_cache
        phi = self.phi
        damp = np.array([sum(phi ** k for k in range(1, int(h) + 1)) for h in horizons])
        out: FloatArray = level[origins][:, None] + trend[origins][:, None] * damp[None, :]
        return out


_LAG_SECONDS = (60, 120, 300, 600, 900, 1800, 3600, 7200)
_SCALE_S = 7 * DAY_S
"""The scale is the mean size over this trailing window..."""
_FLOOR_SHARE = 0.05
"""... and never below this share of the training history's mean size (``scale_floor_``)."""
_WEEKDAY_HISTORY_S = 21 * DAY_S
"""History the day-of-week terms need (three of each weekday); shorter, they are left out."""
_MIN_PAIRS = 5
"""Changes a horizon needs before the simple model estimates its quantiles directly."""
_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Weights of the trees against the simple model tried for each upper or lower quantile."""
_MIN_RECALIBRATION = 30
"""Errors a rolling recalibration needs before it moves a quantile."""
_RECALIBRATION_POINTS = 288
"""At most this many errors in a recalibration window (a day at 5-minute spacing)."""


def _window_mean(values: FloatArray, window: int) -> FloatArray:
    """Mean of the finite values among each step's trailing ``window`` steps (NaN if none)."""
    finite = np.isfinite(values)
    csum = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    cnt = np.concatenate([[0.0], np.cumsum(finite)])
    hi = np.arange(1, len(values) + 1)
    lo = np.maximum(hi - window, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean: FloatArray = ((csum[hi] - csum[lo]) / (cnt[hi] - cnt[lo])).astype(np.float64)
    return mean


_DIRECT_MEANS = 512
"""Steps up to which :func:`_window_mean_at` averages each window directly."""


def _window_mean_at(values: FloatArray, window: int, idx: npt.NDArray[np.int64]) -> FloatArray:
    """:func:`_window_mean` at the steps ``idx`` only: straight from their windows when they
    are at most :data:`_DIRECT_MEANS` (a forecast's origins, and the day of past ones its
    recalibration reads: each mean then depends on its own window alone, whatever else is
    asked with it), through the running sums of the whole series otherwise (a fit's)."""
    unique, inverse = np.unique(idx, return_inverse=True)
    if len(unique) > _DIRECT_MEANS:
        return _window_mean(values, window)[idx]
    means = np.full(len(unique), np.nan)
    for k, i in enumerate(unique.tolist()):
        tail = values[max(0, i + 1 - window):i + 1]
        tail = tail[np.isfinite(tail)]
        if len(tail):
            means[k] = tail.mean()
    out: FloatArray = means[inverse]
    return out


def _conformal_quantile(values: FloatArray, q: float) -> float:
    """The split-conformal quantile of a sample: the ceil((m + 1) q)-th smallest of m values
    for an upper quantile (the largest when m is small), its mirror for a lower one."""
    m = len(values)
    ordered = np.sort(values)
    if q > 0.5:
        return float(ordered[min(m, math.ceil((m + 1) * q)) - 1])
    if q < 0.5:
        return float(ordered[max(1, math.floor((m + 1) * q)) - 1])
    return float(np.median(ordered))


def _pinball_sum(residual: FloatArray, q: float) -> float:
    return float(np.sum(np.maximum(q * residual, (q - 1) * residual)))


class QuantileGBForecaster(_Forecaster):
    """Gradient-boosted quantile regression on lag, seasonal and calendar features, additive
    on the last observation; a simple model of the changes for short histories."""

    def __init__(self, *, resolution_s: float = 60.0,
                 quantiles: tuple[float, ...] = (0.5, 0.9),
                 horizons_s: tuple[float, ...] = (60, 120, 300, 600, 1800, 3600),
                 period_s: float = DAY_S, max_iter: int = 120, learning_rate: float = 0.05,
                 max_train_rows: int = 60_000, calibration: float = 0.15,
                 short_history_s: float = 3 * 3600.0, recalibration_s: float = DAY_S,
                 random_state: int | None = 0) -> None:
        self.resolution_s = resolution_s
        self.quantiles = quantiles
        self.horizons_s = horizons_s
        self.period_s = period_s
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_train_rows = max_train_rows
        self.calibration = calibration
        self.short_history_s = short_history_s
        self.recalibration_s = recalibration_s
        self.random_state = random_state

    # Features -----------------------------------------------------------------------------

    def _base(self, values: FloatArray, origins: npt.NDArray[np.int64]
              ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """At each origin: the last observed value, the scale, the steps since that
        observation and the last hour's mean level. The scale is the mean size of the observed
        values over the last week (:data:`_SCALE_S`), at least ``scale_floor_``: it cannot
        approach zero after a gap, a zero stretch or a partial window, so nothing divided by
        it can explode, and it follows the level only over days."""
        res = float(self.resolution_s)
        hour = max(3, round(3600 / res))
        scale = _window_mean_at(np.abs(values), max(hour, round(_SCALE_S / res)), origins)
        scale = np.where(np.isfinite(scale), np.fmax(scale, self.scale_floor_),
                         self.scale_floor_)
        idx = np.maximum.accumulate(np.where(np.isfinite(values), np.arange(len(values)), -1))
        seen = idx[origins]
        last = np.where(seen >= 0, values[np.maximum(seen, 0)], np.nan).astype(np.float64)
        age = np.where(seen >= 0, origins - seen, len(values)).astype(np.float64)
        level = _window_mean_at(values, hour, origins)
        level = np.where(np.isfinite(level), level, last).astype(np.float64)
        return last, scale.astype(np.float64), age, level

    def _features(self, values: FloatArray, origins: npt.NDArray[np.int64],
                  horizons: npt.NDArray[np.int64], t0: float
                  ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Feature rows for every (origin, horizon), with the last value, the scale and the
        hour's level each row is relative to: target = (value - last) / scale. The last value
        and the steps since it are the last observation's; lags and seasonal values read the
        series forward-filled, and the hour's missing share says how much of it was absent."""
        res = float(self.resolution_s)
        hour = max(3, round(3600 / res))
        half = max(1, hour // 2)
        observed = np.concatenate([[0.0], np.cumsum(np.isfinite(values))])
        filled = _forward_filled(values)
        lags = sorted({max(1, round(s / res)) for s in _LAG_SECONDS})
        period = max(1, round(self.period_s / res))
        k = len(horizons)
        last_o, scale_o, age_o, level_o = self._base(values, origins)
        o = np.repeat(origins, k)
        h = np.tile(horizons, len(origins))
        last, scale, level = (np.repeat(a, k) for a in (last_o, scale_o, level_o))

        def at(idx: npt.NDArray[np.int64]) -> FloatArray:
            ok = (idx >= 0) & (idx < len(filled))
            out = np.full(idx.shape, np.nan)
            out[ok] = filled[idx[ok]]
            return out

        def rel(x: FloatArray) -> FloatArray:
            out: FloatArray = (x - last) / scale
            return out

        lo = np.maximum(o + 1 - hour, 0)
        missing_share = 1 - (observed[o + 1] - observed[lo]) / (o + 1 - lo)
        # ``level`` is the hour's mean where it has a value; where it has none, neither has
        # the mean square, and the deviation is NaN either way.
        std = np.sqrt(np.maximum(_window_mean_at(values ** 2, hour, o) - level ** 2, 0))
        day = _window_mean_at(values, max(hour, round(DAY_S / res)), o)
        cols = [h.astype(np.float64), last / scale, np.repeat(age_o, k), missing_share,
                rel(level), rel(day), std / scale]
        cols += [rel(at(o - lag)) for lag in lags]
        halves = _window_mean_at(values, half, np.concatenate([o, np.maximum(o - half, 0)]))
        prev_half = np.where(o - half >= 0, halves[len(o):], np.nan)
        cols.append((halves[:len(o)] - prev_half) / scale)
        for back in (period, 7 * period):
            target_back = o + h - back * np.ceil(h / back).astype(np.int64)
            seasonal = at(target_back)
            window = np.stack([at(target_back + d) for d in (-2, -1, 0, 1, 2)])
            count = np.isfinite(window).sum(axis=0)
            around = np.where(count > 0, np.nansum(window, axis=0) / np.maximum(count, 1),
                              np.nan)
            cols.append(rel(seasonal))
            cols.append(rel(around))
            # Last period's change from then to the target time: a trend the season repeats.
            cols.append((seasonal - at(o - back * np.ceil(h / back).astype(np.int64))) / scale)
        target_t = t0 + (o + h) * res
        tod = 2 * np.pi * (target_t % DAY_S) / DAY_S
        cols += [np.sin(tod), np.cos(tod)]
        if self.weekdays_:
            dow = 2 * np.pi * (target_t % (7 * DAY_S)) / (7 * DAY_S)
            cols += [np.sin(dow), np.cos(dow)]
        with np.errstate(invalid="ignore", divide="ignore"):
            matrix = np.column_stack(cols)
        return matrix, last, scale, level

    def _grid_horizons(self) -> npt.NDArray[np.int64]:
        steps = {max(1, round(s / self.resolution_s)) for s in self.horizons_s}
        return np.array(sorted(steps), dtype=np.int64)

    # Fitting ------------------------------------------------------------------------------

    def _fit_grid(self, values: FloatArray) -> None:
        super()._fit_grid(values)
        if not 0 <= self.calibration < 1:
            raise ValueError(f"The 'calibration' parameter of QuantileGBForecaster must be in "
                             f"[0, 1). Got {self.calibration!r} instead.")
        if not self.recalibration_s >= 0:
            raise ValueError(f"The 'recalibration_s' parameter of QuantileGBForecaster must be "
                             f"at least 0 (0: off). Got {self.recalibration_s!r} instead.")
        if not self.short_history_s >= 0:
            raise ValueError(f"The 'short_history_s' parameter of QuantileGBForecaster must be "
                             f"at least 0. Got {self.short_history_s!r} instead.")
        finite = values[np.isfinite(values)]
        if len(finite) < 2:
            raise SeriesError(f"QuantileGBForecaster needs at least 2 observed steps; got "
                              f"{len(finite)}")
        mean_size = float(np.mean(np.abs(finite)))
        self.scale_floor_ = _FLOOR_SHARE * mean_size if mean_size > 0 else 1.0
        self.weekdays_ = len(values) * self.resolution_s >= _WEEKDAY_HISTORY_S
        horizons = self._grid_horizons()
        shape = (len(self.quantiles), len(horizons))
        self.trained_horizons_ = horizons
        self.models_: list[HistGradientBoostingRegressor] = []
        self.compiled_: list[CompiledTrees | None] = []
        """Each model's trees as arrays (``forecasting._trees``), None where not compiled."""
        self.past_rows_: dict[tuple[int, ...], dict[int, tuple[FloatArray, ...]]] = {}
        self.shift_ = np.zeros(shape)
        self.weight_ = np.zeros(shape)
        self.simple_ = np.zeros(shape)
        self.anchor_ = np.zeros(len(horizons))
        self.calibrated_ = False
        self.cal_start_ = len(values)
        if len(values) * self.resolution_s < self.short_history_s or \
                not self._fit_trees(values):
            self.mode_ = "short-history"
            self._fit_short(values)
        else:
            self.mode_ = "trees"

    def _simple_table(self, change: FloatArray, level_rel: FloatArray, h_rows: FloatArray,
                      horizons: npt.NDArray[np.int64]
                      ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """The simple model from observed changes (target minus last, in scale units): per
        horizon, an anchor (0: the last value, 1: the hour's level) and the conformal quantiles
        of the target around it; the anchor is the one whose quantiles score better."""
        anchor = np.zeros(len(horizons))
        table = np.zeros((len(self.quantiles), len(horizons)))
        known = np.zeros(len(horizons), dtype=bool)
        for j, hz in enumerate(horizons):
            sel = (h_rows == hz) & np.isfinite(change)
            if sel.sum() < _MIN_PAIRS:
                continue
            known[j] = True
            best = math.inf
            for a in (0.0, 1.0):
                around = change[sel] - a * level_rel[sel]
                qs = [_conformal_quantile(around, q) for q in self.quantiles]
                loss = sum(_pinball_sum(around - v, q) for v, q in
                           zip(qs, self.quantiles, strict=True))
                if loss < best:
                    best, anchor[j], table[:, j] = loss, a, qs
        return anchor, table, known

    def _fit_short(self, values: FloatArray) -> None:
        """Short history (minutes to hours): the simple model alone, from the changes seen so
        far at every horizon up to the longest; a horizon with fewer than ``_MIN_PAIRS``
        changes takes the longest shorter one's, grown by the square root of the horizons'
        ratio around the last value (a random walk's spread) and unchanged around the level.
        Changes are measured in units of the latest scale."""
        n = len(values)
        grid = self.trained_horizons_
        reach = np.arange(1, max(1, min(int(grid.max()), n - 1)) + 1, dtype=np.int64)
        origins = np.arange(0, n - 1, dtype=np.int64)
        last, _, _, level = self._base(values, origins)
        # One scale, the latest: over minutes the level has not moved enough to need its own
        # at each origin, and the first few origins' would rest on one or two values.
        scale = np.full(len(origins), self._base(values, np.array([n - 1]))[1][0])
        o = np.repeat(origins, len(reach))
        h = np.tile(reach, len(origins))
        ok = o + h < n
        o, h = o[ok], h[ok]
        rows = np.searchsorted(origins, o)
        change = (values[o + h] - last[rows]) / scale[rows]
        level_rel = (level[rows] - last[rows]) / scale[rows]
        anchor, table, known = self._simple_table(change, level_rel, h.astype(np.float64),
                                                  reach)
        for j, hz in enumerate(grid):
            shorter = np.flatnonzero(known & (reach <= hz))
            if not len(shorter):
                continue
            k = int(shorter[-1])
            grow = 1.0 if anchor[k] else math.sqrt(hz / reach[k])
            self.anchor_[j] = anchor[k]
            self.simple_[:, j] = grow * table[:, k]

    def _fit_trees(self, values: FloatArray) -> bool:
        """Fit the boosted models; False when the history has too few complete rows."""
        horizons = self.trained_horizons_
        n = len(values)
        origins = np.arange(0, n - 1)
        rng = np.random.default_rng(self.random_state)
        rows = len(origins) * len(horizons)
        if rows > self.max_train_rows:
            keep = max(20, self.max_train_rows // len(horizons))
            origins = np.sort(rng.choice(origins, size=min(keep, len(origins)), replace=False))
        X, last, scale, level = self._features(values, origins, horizons,
                                               self.series_.start_s)
        o = np.repeat(origins, len(horizons))
        h = np.tile(horizons, len(origins))
        target_idx = o + h
        ok = target_idx < n
        y = np.full(len(o), np.nan)
        y[ok] = (values[target_idx[ok]] - last[ok]) / scale[ok]
        use = np.isfinite(y)
        if use.sum() < 20 * len(horizons):
            return False
        level_rel = (level - last) / scale
        # Conformalised quantiles (CQR): every quantile but the median is fitted on the older
        # origins, mixed per horizon with the simple model (fitted on the same origins) by the
        # weight that scores best on the most recent ``calibration`` share, and shifted by the
        # quantile of the mix's errors there, so its coverage holds on data it did not see
        # and it is no less sharp than the simple model. The median is fitted on everything.
        cal = use & (o >= int((n - 1) * (1 - self.calibration))) if self.calibration else \
            np.zeros(len(o), dtype=bool)
        calibrate = cal.sum() >= 20 * len(horizons) and (use & ~cal).sum() >= 20
        older = use & ~cal if calibrate else use
        # Columns with no value on the rows fitted (a seasonal lag longer than the history)
        # carry nothing.
        self.columns_ = np.any(np.isfinite(X[older]), axis=0)
        X = X[:, self.columns_]
        self.anchor_, self.simple_, _ = self._simple_table(y[older], level_rel[older],
                                                           h[older].astype(np.float64),
                                                           horizons)
        self.weight_[:] = 1.0
        for i, q in enumerate(self.quantiles):
            model = HistGradientBoostingRegressor(
                loss="quantile", quantile=q, max_iter=self.max_iter,
                learning_rate=self.learning_rate, max_bins=128, early_stopping=False,
                min_samples_leaf=40, l2_regularization=1.0, max_leaf_nodes=15,
                random_state=self.random_state)
            if q == 0.5 or not calibrate:
                model.fit(X[use], y[use])
            else:
                model.fit(X[older], y[older])
                trees = model.predict(X[cal])
                for j, hz in enumerate(horizons):
                    at_h = h[cal] == hz
                    if at_h.sum() < 20:
                        continue
                    simple = self.anchor_[j] * level_rel[cal][at_h] + self.simple_[i, j]
                    best = math.inf
                    for w in _WEIGHTS:
                        mix = w * trees[at_h] + (1 - w) * simple
                        shift = float(np.quantile(y[cal][at_h] - mix, q))
                        loss = _pinball_sum((y[cal][at_h] - mix - shift) * scale[cal][at_h], q)
                        if loss < best:
                            best, self.weight_[i, j], self.shift_[i, j] = loss, w, shift
            self.models_.append(model)
            self.compiled_.append(compile_trees(model, X[use][-256:]))
        self.calibrated_ = bool(calibrate)
        self.cal_start_ = int((n - 1) * (1 - self.calibration))
        return True

    def _relative(self, values: FloatArray, origins: npt.NDArray[np.int64],
                  horizons: npt.NDArray[np.int64]
                  ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Every (origin, horizon) row's quantiles relative to its last value, in units of its
        scale (before any recalibration), with that last value and scale."""
        # Features and the scale reach back at most a week and a day: forecasting from recent
        # origins only needs the tail, which keeps one prediction cheap on a long history.
        period = max(1, round(self.period_s / self.resolution_s))
        reach = max(7 * period * (1 + int(horizons.max()) // period),
                    round(_SCALE_S / self.resolution_s)) + round(DAY_S / self.resolution_s) + 16
        offset = max(0, int(origins.min()) - reach)
        start = self.series_.start_s + offset * self.resolution_s
        h_rows = np.tile(horizons, len(origins)).astype(np.float64)
        if self.models_:
            X, last, scale, level = self._features(values[offset:], origins - offset,
                                                   horizons, start)
            X = X[:, self.columns_]
            trees = np.stack([c.predict(X) if c is not None else m.predict(X)
                              for m, c in zip(self.models_, self.compiled_, strict=True)],
                             axis=1)
        else:
            last, scale, _, level = (np.repeat(a, len(horizons)) for a in
                                     self._base(values[offset:], origins - offset))
            trees = np.zeros((len(h_rows), len(self.quantiles)))
        grid = self.trained_horizons_.astype(np.float64)

        def per_row(table: FloatArray) -> FloatArray:
            return np.stack([np.interp(h_rows, grid, row) for row in table], axis=1)

        anchor = np.interp(h_rows, grid, self.anchor_)
        simple = anchor[:, None] * ((level - last) / scale)[:, None] + per_row(self.simple_)
        weight = per_row(self.weight_)
        rel: FloatArray = weight * trees + (1 - weight) * simple + per_row(self.shift_)
        return rel, last, scale

    def _recalibration_origins(self, origins: npt.NDArray[np.int64],
                               horizons: npt.NDArray[np.int64]
                               ) -> tuple[npt.NDArray[np.int64], int] | None:
        """The past origins whose errors recalibrate forecasts from ``origins`` (see
        :meth:`_recalibration`), and how many of them a window holds; None when there is
        nothing to recalibrate (off, not calibrated, short-history mode, no past yet)."""
        if not self.recalibration_s or not self.calibrated_ or self.mode_ != "trees":
            return None
        window = max(1, round(self.recalibration_s / self.resolution_s))
        # At most _RECALIBRATION_POINTS errors a window: the past origins on a fixed stride
        # (aligned on the grid, so every origin's window holds the same ones its neighbours
        # do), which keeps one prediction cheap on a day of 1-minute steps.
        stride = max(1, math.ceil(window / _RECALIBRATION_POINTS))
        length = max(1, window // stride)
        hmax = int(horizons.max())
        first = max(self.cal_start_, int(origins.min()) - hmax - window + 1)
        first = -(-first // stride) * stride
        last_past = int(origins.max()) - int(horizons.min())
        if last_past < first:
            return None
        return np.arange(first, last_past + 1, stride, dtype=np.int64), length

    def _recalibration(self, values: FloatArray, origins: npt.NDArray[np.int64],
                       horizons: npt.NDArray[np.int64], past: npt.NDArray[np.int64],
                       length: int, rel: FloatArray, last: FloatArray, scale: FloatArray
                       ) -> FloatArray:
        """Rolling conformal recalibration: per requested (origin, horizon) and quantile (the
        median excepted), the conformal quantile of the errors that the same forecast made at
        the ``past`` origins of the last ``recalibration_s`` whose targets are now observed,
        counted from the calibration share on (errors of origins the trees were fitted on
        would be in-sample). ``rel``, ``last``, ``scale``: :meth:`_relative` at ``past``."""
        k = len(horizons)
        rel = rel.reshape(len(past), k, len(self.quantiles))
        target = past[:, None] + horizons[None, :]
        actual = np.full(target.shape, np.nan)
        inside = target < len(values)
        actual[inside] = values[target[inside]]
        change = (actual - last.reshape(len(past), k)) / scale.reshape(len(past), k)
        out = np.zeros((len(origins), k, len(self.quantiles)))
        for i, q in enumerate(self.quantiles):
            if q == 0.5:
                continue
            for j, hz in enumerate(horizons):
                err = change[:, j] - rel[:, j, i]
                # Origin o may use the errors of past origins up to o - hz (their targets are
                # observed at o): the last ``length`` of them.
                padded = np.concatenate([np.full(length - 1, np.nan), err])
                views = np.lib.stride_tricks.sliding_window_view(padded, length)
                ends = np.searchsorted(past, origins - int(hz), side="right") - 1
                usable = ends >= 0
                if not usable.any():
                    continue
                rows = views[ends[usable]]
                count = np.isfinite(rows).sum(axis=1)
                enough = count >= _MIN_RECALIBRATION
                if not enough.any():
                    continue
                # The q-quantile of each row's finite errors, the next higher at a tie (as
                # np.nanquantile's method="higher", without its per-row loop): NaN sorts last.
                ordered = np.sort(rows[enough], axis=1)
                at = np.ceil(q * (count[enough] - 1)).astype(np.int64)
                idx = np.flatnonzero(usable)[enough]
                out[idx, j, i] = ordered[np.arange(len(at)), at]
        return out

    def _relative_with_past(self, values: FloatArray, origins: npt.NDArray[np.int64],
                            horizons: npt.NDArray[np.int64], past: npt.NDArray[np.int64]
                            ) -> tuple[tuple[FloatArray, ...], tuple[FloatArray, ...]]:
        """:meth:`_relative` at ``origins`` and at the recalibration's ``past`` origins, each
        past one computed once per fit: a past origin's features reach only back from it, over
        values already observed, so what the fitted model said there does not change as new
        points arrive. The past origins not computed yet are predicted with ``origins``, in
        one pass."""
        store = self.past_rows_.setdefault(tuple(int(h) for h in horizons), {})
        for origin in [o for o in store if o < past[0]]:
            del store[origin]
        missing = np.array([o for o in past.tolist() if o not in store], dtype=np.int64)
        k = len(horizons)
        rel, last, scale = self._relative(values, np.concatenate([origins, missing]),
                                          horizons)
        mine = len(origins) * k
        for i, origin in enumerate(missing.tolist()):
            rows = slice(mine + i * k, mine + (i + 1) * k)
            store[origin] = (rel[rows], last[rows], scale[rows])
        parts = [store[o] for o in past.tolist()]
        return ((rel[:mine], last[:mine], scale[:mine]),
                tuple(np.concatenate([p[i] for p in parts]) for i in range(3)))

    def _predict_origins(self, values: FloatArray, origins: npt.NDArray[np.int64],
                         horizons: npt.NDArray[np.int64]) -> FloatArray:
        plan = self._recalibration_origins(origins, horizons)
        if plan is None:
            rel, last, scale = self._relative(values, origins, horizons)
        else:
            past, length = plan
            (rel, last, scale), at_past = self._relative_with_past(values, origins, horizons,
                                                                   past)
            shift = self._recalibration(values, origins, horizons, past, length, *at_past)
            rel = rel + shift.reshape(len(origins) * len(horizons), len(self.quantiles))
        # Additive on the last observation, in units of a scale that cannot approach zero.
        preds = last[:, None] + rel * scale[:, None]
        preds = np.sort(preds, axis=1)  # no quantile crossing
        if self._nonnegative():
            preds = np.maximum(preds, 0.0)
        out: FloatArray = preds.reshape(len(origins), len(horizons), len(self.quantiles))
        return out


class AutoForecaster(_Forecaster):
    """Picks the candidate with the best recent rolling-origin score; says why."""

    def __init__(self, *, resolution_s: float = 60.0,
                 quantiles: tuple[float, ...] = (0.5, 0.9),
                 horizons_s: tuple[float, ...] = (300, 1800), period_s: float = DAY_S,
                 holdout: float = 0.2, random_state: int | None = 0) -> None:
        self.resolution_s = resolution_s
        self.quantiles = quantiles
        self.horizons_s = horizons_s
        self.period_s = period_s
        self.holdout = holdout
        self.random_state = random_state

    def _candidates(self, n: int, values: FloatArray) -> tuple[list[_Forecaster], list[str]]:
        res, qs = float(self.resolution_s), tuple(self.quantiles)
        period_steps = round(self.period_s / self.resolution_s)
        notes: list[str] = []
        finite = values[np.isfinite(values)]
        if len(finite) == 0:
            raise SeriesError("the series has no finite values")
        if np.ptp(finite) == 0:
            notes.append("constant series: last value")
            return [LastValue(resolution_s=res, quantiles=qs)], notes
        out: list[_Forecaster] = [LastValue(resolution_s=res, quantiles=qs),
                                  ExponentialSmoothing(resolution_s=res, quantiles=qs)]
        if n > 2 * period_steps:
            out.append(SeasonalNaive(period_s=self.period_s, resolution_s=res, quantiles=qs))
        else:
            notes.append(f"history shorter than two periods ({n} < {2 * period_steps} steps): "
                         "no seasonal-naive")
        if n >= max(200, period_steps // 2):
            out.append(QuantileGBForecaster(period_s=self.period_s,
                                            horizons_s=tuple(self.horizons_s),
                                            random_state=self.random_state,
                                            resolution_s=res, quantiles=qs))
        else:
            notes.append(f"history too short for the boosted model ({n} < "
                         f"{max(200, period_steps // 2)} steps)")
        return out, notes

    def _fit_grid(self, values: FloatArray) -> None:
        super()._fit_grid(values)
        n = len(values)
        candidates, notes = self._candidates(n, values)
        horizons = np.array(sorted({max(1, round(s / self.resolution_s))
                                    for s in self.horizons_s}), dtype=np.int64)
        split = int(n * (1 - self.holdout))
        scores: dict[str, float] = {}
        if len(candidates) > 1 and n - split > horizons.max() + 5:
            times = self.series_.times_s
            for cand in candidates:
                try:
                    cand.fit(times[:split, None], values[:split])
                except SeriesError as exc:
                    notes.append(f"{type(cand).__name__} skipped: {exc}")
                    continue
                origins = np.arange(split - 1, n - horizons.max())
                pred = cand._predict_origins(values, origins, horizons)
                q = tuple(self.quantiles)
                mid = q.index(0.5) if 0.5 in q else len(q) // 2
                actual = values[origins[:, None] + horizons[None, :]]
                err = np.abs(pred[:, :, mid] - actual)
                scores[type(cand).__name__] = float(np.nanmean(err))
        if scores:
            best_name = min(scores, key=lambda k: scores[k])
            best = next(c for c in candidates if type(c).__name__ == best_name)
            ranking = ", ".join(f"{k} {v:.4g}" for k, v in sorted(scores.items(),
                                                                  key=lambda kv: kv[1]))
            reason = f"lowest recent MAE ({ranking})"
        else:
            best = candidates[-1] if len(candidates) == 1 else candidates[0]
            reason = "too little history to compare candidates"
        self.chosen_ = best.fit(self.series_.times_s[:, None], values)
        self.scores_ = scores
        self.choice_reason_ = "; ".join([*notes, f"chose {type(best).__name__}: {reason}"])

    def _predict_origins(self, values: FloatArray, origins: npt.NDArray[np.int64],
                         horizons: npt.NDArray[np.int64]) -> FloatArray:
        return self.chosen_._predict_origins(values, origins, horizons)

