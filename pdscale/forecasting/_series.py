"""Regular series from raw observations: request-level traces or Prometheus range queries.

Forecasters work on a regular grid (one value per ``resolution_s``). Preparation makes every
irregularity explicit rather than silently zero:

* a window with no observation is missing (NaN), not zero;
* a zero where the series is otherwise busy (a collection gap, such as ServeGen m-small's
  zero-rate windows) can be declared missing with ``zero_is_missing``;
* short runs of missing values (up to ``max_fill`` steps) are filled by linear interpolation and
  reported; longer runs stay missing, and models skip targets and features that touch them;
* level shifts are detected (:func:`level_shifts`) so callers can report them; the boosted
  forecaster predicts changes in units of the recent level, which keeps it sound across a
  shift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["RegularSeries", "SeriesError", "level_shifts", "regularize",
           "series_from_prometheus", "series_from_requests"]

FloatArray = npt.NDArray[np.float64]


class SeriesError(ValueError):
    """Input that cannot become a regular series; the message says what to change."""


@dataclass(frozen=True)
class RegularSeries:
    start_s: float
    resolution_s: float
    values: FloatArray
    filled: int = 0
    """Missing steps filled by interpolation."""
    missing: int = 0
    """Steps still missing after filling."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def times_s(self) -> FloatArray:
        return self.start_s + self.resolution_s * np.arange(len(self.values), dtype=np.float64)

    def __len__(self) -> int:
        return int(self.values.shape[0])


def regularize(times_s: Sequence[float] | FloatArray, values: Sequence[float] | FloatArray, *,
               resolution_s: float, zero_is_missing: bool = False,
               max_fill: int = 3) -> RegularSeries:
    """Bin (time, value) observations onto a grid (the mean of each step's observations)."""
    t = np.asarray(times_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if not resolution_s > 0:  # NaN too
        raise SeriesError(f"resolution must be positive, got {resolution_s!r}")
    if t.shape != v.shape or t.ndim != 1:
        raise SeriesError(f"times and values must be 1-D and the same length; got {t.shape} and "
                          f"{v.shape}")
    if len(t) == 0:
        raise SeriesError("no observations: the series is empty")
    if np.any(~np.isfinite(t)):
        raise SeriesError("the time column has non-finite values")
    if np.any(np.diff(t) < 0):
        first = int(np.flatnonzero(np.diff(t) < 0)[0]) + 1
        raise SeriesError(f"the time column is not monotonic (row {first} goes back in time); "
                          "sort the observations by time first")
    start = float(np.floor(t[0] / resolution_s) * resolution_s)
    idx = ((t - start) // resolution_s).astype(np.int64)
    n = int(idx[-1]) + 1
    ok = np.isfinite(v)
    sums = np.bincount(idx[ok], weights=v[ok], minlength=n)
    counts = np.bincount(idx[ok], minlength=n)
    out = np.full(n, np.nan)
    out[counts > 0] = sums[counts > 0] / counts[counts > 0]
    notes = []
    if zero_is_missing:
        busy = np.nanmean(out) if np.any(np.isfinite(out)) else 0.0
        zeros = (out == 0) & (busy > 0)
        if zeros.any():
            out[zeros] = np.nan
            notes.append(f"{int(zeros.sum())} zero step(s) treated as collection gaps")
    filled = _fill_short_gaps(out, max_fill)
    missing = int(np.isnan(out).sum())
    if filled:
        notes.append(f"{filled} missing step(s) filled by interpolation")
    if missing:
        notes.append(f"{missing} of {n} step(s) ({missing / n:.1%}) left missing (gaps longer "
                     f"than {max_fill} steps)")
    return RegularSeries(start, float(resolution_s), out, filled, missing, tuple(notes))


def _fill_short_gaps(values: FloatArray, max_fill: int) -> int:
    nan = np.isnan(values)
    if not nan.any() or nan.all():
        return 0
    filled = 0
    i = 0
    n = len(values)
    while i < n:
        if not nan[i]:
            i += 1
            continue
        j = i
        while j < n and nan[j]:
            j += 1
        if i > 0 and j < n and j - i <= max_fill:
            values[i:j] = np.interp(np.arange(i, j), [i - 1, j], [values[i - 1], values[j]])
            filled += j - i
        i = j
    return filled


def series_from_requests(arrival_s: FloatArray, prompt_tokens: FloatArray,
                         output_tokens: FloatArray, *, resolution_s: float,
                         start_s: float = 0.0) -> dict[str, RegularSeries]:
    """Request rate, prompt and output tokens/s, mean input and output length per step.

    Steps without requests have a rate of zero (a real quiet period) and missing mean lengths.
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    if not resolution_s > 0:
        raise SeriesError(f"resolution must be positive, got {resolution_s!r}")
    if len(a) == 0:
        raise SeriesError("no requests: the trace is empty")
    if np.any(np.diff(a) < 0):
        raise SeriesError("arrival times are not sorted")
    idx = ((a - start_s) // resolution_s).astype(np.int64)
    n = int(idx[-1]) + 1
    count = np.bincount(idx, minlength=n).astype(np.float64)
    prompt = np.bincount(idx, weights=prompt_tokens, minlength=n)
    output = np.bincount(idx, weights=output_tokens, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_in = np.where(count > 0, prompt / count, np.nan)
        mean_out = np.where(count > 0, output / count, np.nan)
    r = float(resolution_s)
    return {
        "request_rate": RegularSeries(start_s, r, count / r),
        "prompt_tokens_per_s": RegularSeries(start_s, r, prompt / r),
        "output_tokens_per_s": RegularSeries(start_s, r, output / r),
        "mean_input_tokens": RegularSeries(start_s, r, mean_in),
        "mean_output_tokens": RegularSeries(start_s, r, mean_out),
    }


def series_from_prometheus(result: Sequence[Mapping[str, Any]], *, resolution_s: float,
                           zero_is_missing: bool = False) -> RegularSeries:
    """A Prometheus range-query ``result`` (matrix) as one series (series are summed)."""
    if not result:
        raise SeriesError("the query returned no series: no data, not zero")
    points: dict[float, float] = {}
    for series in result:
        values = series.get("values")
        if not isinstance(values, list):
            raise SeriesError("expected a range-query matrix: each series needs 'values'")
        for ts, raw in values:
            value = float(raw)
            if np.isfinite(value):
                points[float(ts)] = points.get(float(ts), 0.0) + value
    if not points:
        raise SeriesError("the query returned only NaN or infinite samples")
    times = np.array(sorted(points))
    return regularize(times, np.array([points[t] for t in times]), resolution_s=resolution_s,
                      zero_is_missing=zero_is_missing)


def level_shifts(values: FloatArray, *, window: int, ratio: float = 1.8) -> list[int]:
    """Steps where the median of the next ``window`` steps differs from the previous
    ``window``'s by more than ``ratio`` (either way), placed where the change is largest."""
    v = np.asarray(values, dtype=np.float64)

    def change(i: int, stat: Any = np.nanmedian) -> float:
        before = stat(v[i - window:i])
        after = stat(v[i:i + window])
        if not (np.isfinite(before) and np.isfinite(after)) or min(before, after) <= 0:
            return 1.0
        return float(max(before, after) / min(before, after))

    shifts: list[int] = []
    i = window
    while i + window <= len(v):
        if change(i) > ratio:
            candidates = range(i, min(i + window, len(v) - window + 1))
            # Medians find the shift robustly; means place it (they peak at the step itself).
            best = max(candidates, key=lambda j: change(j, np.nanmean))
            shifts.append(best)
            i = best + window
        else:
            i += 1
    return shifts
