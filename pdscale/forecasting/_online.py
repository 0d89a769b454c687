"""Online use: cheap updates between refits, and a refit schedule the caller owns.

The controller calls :meth:`OnlineForecaster.observe` with each new point (an append, no
refit), :meth:`OnlineForecaster.forecast` every tick, and runs :meth:`refit` off its tick path
when :meth:`refit_due` says so (every ``refit_every_s``). History is bounded to
``history_s`` so refits stay cheap. Fit and predict times are kept for reporting.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from sklearn.base import clone

from pdscale.forecasting._models import _Forecaster
from pdscale.forecasting._series import SeriesError

__all__ = ["OnlineForecaster"]

FloatArray = npt.NDArray[np.float64]


@dataclass
class OnlineForecaster:
    model: _Forecaster
    refit_every_s: float = 600.0
    history_s: float = 14 * 86400.0
    fitted: _Forecaster | None = None
    last_fit_s: float | None = None
    fit_seconds: float = 0.0
    predict_seconds: float = 0.0
    _times: list[float] = field(default_factory=list)
    _values: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def span_s(self) -> float:
        """Seconds of history held."""
        with self._lock:
            return self._times[-1] - self._times[0] if self._times else 0.0

    def observe(self, t_s: float, value: float) -> None:
        with self._lock:
            if self._times and t_s <= self._times[-1]:
                raise SeriesError(f"observations must move forward in time: {t_s} after "
                                  f"{self._times[-1]}")
            self._times.append(float(t_s))
            self._values.append(float(value))
            cutoff = t_s - self.history_s
            if self._times[0] < cutoff:
                keep = int(np.searchsorted(np.array(self._times), cutoff))
                del self._times[:keep], self._values[:keep]
            fitted = self.fitted
            if fitted is not None and t_s > fitted.t_last_ + fitted.resolution_s / 2:
                fitted._append_step(float(t_s), float(value))

    def refit_due(self, now_s: float) -> bool:
        return self.last_fit_s is None or now_s - self.last_fit_s >= self.refit_every_s

    def refit(self, now_s: float) -> _Forecaster:
        """Fit a fresh model on the history held. Safe to run on another thread while
        :meth:`observe` goes on: points that arrive during the fit are replayed into the new
        model before it replaces the old one."""
        model: _Forecaster = clone(self.model)
        with self._lock:
            times, values = np.array(self._times), np.array(self._values)
        started = time.perf_counter()
        model.fit(times[:, None], values)
        self.fit_seconds = time.perf_counter() - started
        with self._lock:
            newer = np.array(self._times) > model.t_last_ + model.resolution_s / 2
            if newer.any():
                model.update(np.array(self._times)[newer][:, None],
                             np.array(self._values)[newer])
            self.fitted = model
            self.last_fit_s = now_s
        return model

    def forecast(self, horizons_s: FloatArray) -> FloatArray:
        """(len(horizons), n_quantiles) from the latest observation."""
        with self._lock:  # observe() may update the model from another thread
            if self.fitted is None:
                raise SeriesError("no fitted model yet: call refit() once there is history")
            started = time.perf_counter()
            fitted = self.fitted
            # predict_quantiles' steps without its input validation (the horizons are ours).
            times = fitted.t_last_ + np.asarray(horizons_s, dtype=np.float64)
            steps = np.rint((times - fitted.t_last_) / fitted.resolution_s).astype(np.int64)
            if np.any(steps < 1):
                raise ValueError("forecast horizons must be at least one resolution step "
                                 f"({fitted.resolution_s:g} s)")
            out = fitted._predict_steps(steps)
            self.predict_seconds = time.perf_counter() - started
        return out
