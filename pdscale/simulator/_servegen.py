"""The ServeGen loader: per-client rate windows rebuilt into requests (:func:`load_servegen`),
or aggregated per window without materialising them, for the fluid simulator and forecasting
(:func:`servegen_load_series`). :mod:`simulator._trace` describes the format and the method; its
:func:`~simulator._trace.load_trace` reads ServeGen files through this module."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdscale.simulator._trace import (
    FloatArray,
    IntArray,
    Trace,
    TraceError,
    _bad,
    _check_file,
    _csv_rows,
    _finite,
    _mix_lengths,
    _reading,
)

__all__ = ["load_servegen", "servegen_load_series"]

SERVEGEN_WINDOW_S = 600.0


@dataclass(frozen=True)
class _LengthWindow:
    start_s: float
    input_q: tuple[float, float, float, float]  # p50, p90, p99, mean
    output_q: tuple[float, float, float, float]


def _servegen_model(path: Path) -> str:
    name = path.name
    for model in ("m-large", "m-small", "m-mid", "mm-image"):
        if model in name:
            return model
    return "m-large"


def _load_lengths(path: Path, model: str) -> list[_LengthWindow]:
    if _is_multimodal(path):
        return _load_multimodal_lengths(path, model)
    out = []
    for line, row in _csv_rows(path, ("model", "window_start_s", "p50_input", "p90_input",
                                       "p99_input", "p50_output", "p90_output", "p99_output")):
        if row["model"] != model:
            continue
        try:
            out.append(_LengthWindow(
                float(row["window_start_s"]),
                (float(row["p50_input"]), float(row["p90_input"]), float(row["p99_input"]),
                 float(row["mean_input_tokens"])),
                (float(row["p50_output"]), float(row["p90_output"]), float(row["p99_output"]),
                 float(row["mean_output_tokens"]))))
        except (KeyError, ValueError):
            raise _bad(path, line, "p50_input", "expected numbers") from None
    if not out:
        raise TraceError(f"{path}: no token-length rows for model {model!r}")
    return sorted(out, key=lambda w: w.start_s)


def _sample_lengths(q: tuple[float, float, float, float], n: int,
                    rng: np.random.Generator) -> IntArray:
    """Draw lengths through a piecewise log-linear quantile function fitted to p50/p90/p99."""
    p50, p90, p99, _mean = (max(1.0, v) for v in q)
    probs = np.array([0.0, 0.5, 0.9, 0.99, 1.0])
    values = np.log(np.array([max(1.0, p50 / 8), p50, max(p90, p50), max(p99, p90),
                              max(p99, p90) * 1.5]))
    u = rng.random(n)
    drawn: IntArray = np.maximum(1, np.exp(np.interp(u, probs, values))).astype(np.int64)
    return drawn


def _servegen_rows(path: Path) -> list[tuple[float, float, str, float, float]]:
    """The rate windows, each checked: a window is a client's load for ten minutes, so a bad
    one is an error (--skip-bad-rows does not apply to ServeGen)."""
    rows = []
    for line, row in _csv_rows(path, ("client_id", "window_start_s", "rate_rps",
                                       "arrival_dist", "dist_param1", "dist_param2")):
        numbers = []
        for column, default in (("window_start_s", None), ("rate_rps", None),
                                ("dist_param1", "0"), ("dist_param2", "0")):
            text = row[column] or default
            value = _finite(text)
            if value is None or (value < 0 and column in ("window_start_s", "rate_rps")):
                raise _bad(path, line, column, f"expected a finite non-negative number, got "
                                               f"{row[column]!r}", skippable=False)
            numbers.append(value)
        start, rate, p1, p2 = numbers
        dist = row["arrival_dist"] or ""
        if dist not in ("", "Gamma", "Weibull"):
            raise _bad(path, line, "arrival_dist", f"expected Gamma or Weibull, got {dist!r}",
                       skippable=False)
        rows.append((start, rate, dist, p1, p2))
    if not rows:
        raise TraceError(f"{path}: the trace has no rows")
    return rows


def _is_multimodal(path: Path) -> bool:
    with path.open() as f:
        return "p50_text" in f.readline()


def _load_multimodal_lengths(path: Path, model: str) -> list[_LengthWindow]:
    """A multimodal model's windows (ServeGen mm-image): the file gives text-token quantiles
    and the images a request carries, not input quantiles. A prompt to prefill is its text
    plus its images' tokens; the images add a near-constant block (1.5-1.7 images of 480-670
    tokens a request), so the input quantiles are the text quantiles plus the mean image
    tokens a request (mean images a request x mean tokens an image), and the input mean is
    the file's ``mean_input_tokens``."""
    out = []
    for line, row in _csv_rows(path, ("model", "window_start_s", "p50_text", "p90_text",
                                       "p99_text", "mean_images_per_request",
                                       "mean_tokens_per_image", "mean_input_tokens",
                                       "p50_output", "p90_output", "p99_output",
                                       "mean_output_tokens")):
        if row["model"] != model:
            continue
        try:
            images = float(row["mean_images_per_request"]) * float(row["mean_tokens_per_image"])
            out.append(_LengthWindow(
                float(row["window_start_s"]),
                (float(row["p50_text"]) + images, float(row["p90_text"]) + images,
                 float(row["p99_text"]) + images, float(row["mean_input_tokens"])),
                (float(row["p50_output"]), float(row["p90_output"]), float(row["p99_output"]),
                 float(row["mean_output_tokens"]))))
        except ValueError:
            raise _bad(path, line, "p50_text", "expected numbers") from None
    if not out:
        raise TraceError(f"{path}: no token-length rows for model {model!r}")
    return sorted(out, key=lambda w: w.start_s)


def _default_lengths_path(path: Path) -> Path | None:
    """The token-length file beside a ServeGen trace: the multimodal model's own, else the
    language models' shared one."""
    names = ["servegen_token_lengths_6h_DERIVED.csv"]
    if _servegen_model(path) == "mm-image":
        names = ["servegen_mm-image_token_lengths_6h_DERIVED.csv"]
    for name in names:
        candidate = path.parent / name
        if candidate.exists():
            return candidate
    return None


def load_servegen(path: Path, *, lengths_path: Path | None = None, seed: int = 0,
                  start_s: float = 0.0, duration_s: float | None = None) -> Trace:
    """Materialise ServeGen arrivals between ``start_s`` and ``start_s + duration_s``."""
    rng = np.random.default_rng(seed)
    model = _servegen_model(path)
    lengths_path = lengths_path or _default_lengths_path(path)
    lengths = _load_lengths(lengths_path, model) if lengths_path else None
    end = math.inf if duration_s is None else start_s + duration_s
    arrivals: list[FloatArray] = []
    for w_start, rate, dist, p1, p2 in _servegen_rows(path):
        if rate <= 0 or not dist or w_start + SERVEGEN_WINDOW_S <= start_s or w_start >= end:
            continue
        n = math.ceil(rate * SERVEGEN_WINDOW_S)
        if dist == "Gamma":
            gaps = rng.gamma(shape=max(p1, 1e-6), scale=max(p2, 1e-12), size=n)
        else:
            gaps = rng.weibull(max(p1, 1e-6), size=n) * max(p2, 1e-12)
        times = np.cumsum(gaps)
        times = times / times[-1] * SERVEGEN_WINDOW_S * (n - 1) / n if times[-1] > 0 else \
            np.linspace(0, SERVEGEN_WINDOW_S, n, endpoint=False)
        t = w_start + times
        arrivals.append(t[(t >= start_s) & (t < end)])
    if not arrivals or not sum(len(a) for a in arrivals):
        raise TraceError(f"{path}: no requests between {start_s:g}s and {end:g}s")
    a = np.sort(np.concatenate(arrivals))
    prompts, outputs = _servegen_lengths(a, lengths, rng)
    notes: tuple[str, ...] = ("arrivals rebuilt from per-client rate windows (ServeGen's "
                              "method)",)
    if lengths is None:
        notes += ("no token-length file found: lengths drawn from the synthetic default mix",)
    return Trace(name=path.name, arrival_s=a - start_s, prompt_tokens=prompts,
                 output_tokens=outputs, notes=notes)


def _servegen_lengths(a: FloatArray, lengths: list[_LengthWindow] | None,
                      rng: np.random.Generator) -> tuple[IntArray, IntArray]:
    if lengths is None:
        return _mix_lengths(len(a), rng)
    starts = np.array([w.start_s for w in lengths])
    which = np.clip(np.searchsorted(starts, a, side="right") - 1, 0, len(lengths) - 1)
    prompts = np.empty(len(a), dtype=np.int64)
    outputs = np.empty(len(a), dtype=np.int64)
    for i, w in enumerate(lengths):
        idx = np.flatnonzero(which == i)
        if len(idx):
            prompts[idx] = _sample_lengths(w.input_q, len(idx), rng)
            outputs[idx] = _sample_lengths(w.output_q, len(idx), rng)
    return prompts, outputs


def servegen_load_series(path: Path, *, lengths_path: Path | None = None,
                         bin_s: float = SERVEGEN_WINDOW_S) -> dict[str, Any]:
    """Aggregate request rate per window and length quantiles, without materialising
    requests (for the fluid simulator and for forecasting)."""
    _check_file(path)
    with _reading(path):
        return _servegen_load_series(path, lengths_path=lengths_path, bin_s=bin_s)


def _servegen_load_series(path: Path, *, lengths_path: Path | None,
                          bin_s: float) -> dict[str, Any]:
    rows = _servegen_rows(path)
    starts = np.array([r[0] for r in rows])
    rates = np.array([r[1] for r in rows])
    n_bins = math.ceil((starts.max() + SERVEGEN_WINDOW_S) / bin_s)
    total = np.bincount((starts // bin_s).astype(np.int64), weights=rates * SERVEGEN_WINDOW_S,
                        minlength=n_bins) / bin_s
    lengths_path = lengths_path or _default_lengths_path(path)
    lengths = _load_lengths(lengths_path, _servegen_model(path)) if lengths_path else None
    return {"bin_s": bin_s, "rate_rps": total, "lengths": lengths}
