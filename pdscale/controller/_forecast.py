"""The forecast stage: one online forecaster per pool, its refits, and typed forecasts.

The stage is fed each pool's demand every tick (one point per resolution step: the mean of
the ticks in it) and answers :meth:`ForecastStage.forecast` with a
:class:`~controller._interface.PoolForecast` (quantiles per horizon up to the lead, and the
horizons the model was trained for), or a reason why there is none (history too short, first
fit pending, the model failed). Fitting is the caller's to schedule, off the tick path in a
cluster and in the foreground in the simulator: the reconcile loop asks
:meth:`pending_refits` and :meth:`stale_forecasts` after each tick (the :class:`Refits`
protocol). A forecast is reused for ``forecast_every_s``: new points arrive once a resolution
step, and the current demand still enters every tick through the policy's max(demand,
forecast).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pdscale.controller._interface import PoolForecast, PoolKey
from pdscale.forecasting import OnlineForecaster, QuantileGBForecaster, SeriesError
from pdscale.spec import ControllerSettings

__all__ = ["ForecastStage", "NoForecast", "default_forecaster"]

HORIZONS_S = (60, 120, 300, 600)
"""Horizons the model is trained for: a cold start of seconds to ten minutes."""

def default_forecaster(quantile: float, refit_every_s: float, *,
                       resolution_s: float = 60.0) -> OnlineForecaster:
    """The forecaster the controller uses: gradient-boosted quantiles (the median and the
    scale-up quantile) at ``HORIZONS_S``, three days of history."""
    return OnlineForecaster(
        QuantileGBForecaster(resolution_s=resolution_s, quantiles=(0.5, quantile),
                             horizons_s=HORIZONS_S, max_iter=60, max_train_rows=20_000),
        refit_every_s=refit_every_s, history_s=3 * 86400)


@dataclass(frozen=True)
class NoForecast:
    """Why there is no forecast for a pool this tick (it is sized on the current demand)."""

    reason: str


class ForecastStage:
    """The online forecasters of every pool, their refits and a forecast cache."""

    def __init__(self, leads_s: Mapping[PoolKey, float], settings: ControllerSettings, *,
                 resolution_s: float = 60.0, min_history_s: float = 600.0,
                 forecast_every_s: float = 120.0,
                 make: Callable[[], OnlineForecaster] | None = None) -> None:
        """``leads_s``: each pool's lead until the policy says otherwise (its default cold
        start plus one tick), so forecasts can be computed before the first tick.
        ``min_history_s``: a pool is forecast once its history spans this long (10 minutes:
        the forecaster's short-history model needs minutes, not hours, and a pool without a
        forecast is sized on the demand it serves now)."""
        self.quantile = settings.scale_up_quantile
        self.resolution_s = resolution_s
        self.min_history_s = min_history_s
        self.forecast_every_s = forecast_every_s
        refit_every_s = float(settings.refit_every)
        self.forecasters: dict[PoolKey, OnlineForecaster] = {
            key: make() if make is not None else
            default_forecaster(self.quantile, refit_every_s, resolution_s=resolution_s)
            for key in leads_s}
        self._bucket: dict[PoolKey, tuple[float, list[float]]] = {}
        self._cache: dict[PoolKey, tuple[tuple[int, int], PoolForecast]] = {}
        self._lead: dict[PoolKey, float] = dict(leads_s)

    # -- data -------------------------------------------------------------------------------

    def observe(self, key: PoolKey, t_s: float, demand: float) -> None:
        """Feed one tick's demand; the forecaster gets one point per resolution step (the
        mean of the ticks in it)."""
        fc = self.forecasters.get(key)
        if fc is None:
            return
        step = math.floor(t_s / self.resolution_s) * self.resolution_s
        current = self._bucket.get(key)
        if current is None or current[0] == step:
            values = current[1] if current else []
            values.append(demand)
            self._bucket[key] = (step, values)
            return
        with contextlib.suppress(SeriesError):  # at or before warmed-up history: skip
            fc.observe(current[0], float(np.mean(current[1])))
        self._bucket[key] = (step, [demand])

    def warm(self, key: PoolKey, times_s: Sequence[float], values: Sequence[float]) -> int:
        """Feed a pool's demand history (from Prometheus at start-up); returns points taken."""
        fc = self.forecasters.get(key)
        if fc is None:
            return 0
        taken = 0
        for t, v in zip(times_s, values, strict=True):
            if math.isfinite(v):
                with contextlib.suppress(SeriesError):
                    fc.observe(t, v)
                    taken += 1
        return taken

    # -- forecasts --------------------------------------------------------------------------

    def forecast(self, key: PoolKey, now_s: float, lead_s: float) -> PoolForecast | NoForecast:
        """The pool's forecast up to ``lead_s`` ahead: the cached one while the worker has not
        refreshed it (see :meth:`stale_forecasts`), computed here only when there is none."""
        fc = self.forecasters.get(key)
        self._lead[key] = lead_s
        if fc is None or fc.span_s < self.min_history_s:
            return NoForecast("forecast: history too short, sizing on the current demand")
        if fc.fitted is None:
            return NoForecast("forecast: first fit still running, sizing on the current demand")
        cached = self._cache.get(key)
        if cached is not None:
            return cached[1]
        try:
            return self._compute(key, fc, now_s, lead_s)
        except (SeriesError, ValueError) as exc:
            return NoForecast(f"forecast unavailable ({exc}); sizing on the current demand")

    def _compute(self, key: PoolKey, fc: OnlineForecaster, now_s: float,
                 lead_s: float) -> PoolForecast:
        step = self.resolution_s
        horizons = np.arange(step, lead_s + step, step)
        trained = tuple(float(h) for h in getattr(fc.model, "horizons_s", HORIZONS_S))
        table = fc.forecast(horizons)
        out = PoolForecast(
            at_s=now_s, horizons_s=tuple(float(h) for h in horizons),
            quantiles={float(q): tuple(float(x) for x in table[:, i])
                       for i, q in enumerate(fc.model.quantiles)},
            sized_quantile=float(fc.model.quantiles[-1]),
            trained_horizons_s=(min(trained), max(trained)))
        self._cache[key] = (self._cache_key(fc, lead_s), out)
        return out

    @staticmethod
    def _cache_key(fc: OnlineForecaster, lead_s: float) -> tuple[int, int]:
        """A cached forecast holds for this fitted model and this lead only."""
        return id(fc.fitted), round(lead_s)

    def _fresh(self, key: PoolKey, fc: OnlineForecaster, lead_s: float, at_s: float) -> bool:
        cached = self._cache.get(key)
        return cached is not None and cached[0] == self._cache_key(fc, lead_s) and \
            at_s - cached[1].at_s < self.forecast_every_s

    # -- the Refits protocol (the reconcile loop schedules these) ----------------------------

    def pending_refits(self, now_s: float) -> list[PoolKey]:
        """Pools whose forecaster is due a refit and has enough history."""
        return [key for key, fc in self.forecasters.items()
                if fc.span_s >= self.min_history_s and fc.refit_due(now_s)]

    def refit(self, key: PoolKey, now_s: float) -> float:
        """Refit one pool's forecaster (safe against the tick's reads); returns fit seconds."""
        fc = self.forecasters[key]
        fc.refit(now_s)
        return fc.fit_seconds

    def stale_forecasts(self, now_s: float, within_s: float) -> list[PoolKey]:
        """Pools whose cached forecast expires within ``within_s`` (or whose model or lead
        changed)."""
        return [key for key, fc in self.forecasters.items()
                if fc.fitted is not None and key in self._lead
                and not self._fresh(key, fc, self._lead[key], now_s + within_s)]

    def refresh_forecast(self, key: PoolKey, now_s: float) -> None:
        fc = self.forecasters[key]
        if fc.fitted is not None and key in self._lead:
            with contextlib.suppress(SeriesError, ValueError):
                self._compute(key, fc, now_s, self._lead[key])
