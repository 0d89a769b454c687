"""Forecast accuracy and speed on ServeGen (../shared/traces).

    .venv/bin/python bench/forecasting.py [--skip-1m]

* 10-minute resolution: the ServeGen m-large and m-small aggregate request rates (as
  published, 600 s windows; m-small's zero-rate collection gaps are treated as missing);
  horizons 10, 30 and 60 minutes (a 5-minute horizon is shorter than the data's resolution).
* 1-minute resolution: m-large's per-minute request counts rebuilt from its per-client windows
  with ServeGen's own method (the simulator's loader), seeded; horizons 5, 30 and 60 minutes.
  m-small is skipped here: it is 1.4 billion requests over 14 days.

Each case trains on the first 10 days and forecasts from every origin of the last 4 days.
Targets (issue 4): MASE <= 0.8 x seasonal-naive's and <= 0.8 x last-value's at 5 and 30
minutes; coverage of the 0.9 quantile in [0.85, 0.95]; fit on 14 days at 1 minute < 5 s on
one core; one prediction < 10 ms. Also the best mix of the main model and the last value with
the weight chosen on the test days (an optimistic bound on blending the two). Prints a table;
writes bench/results/forecasting.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRACES = ROOT.parent / "shared" / "traces"

from forecasting import (  # noqa: E402
    ExponentialSmoothing,
    LastValue,
    QuantileGBForecaster,
    SeasonalNaive,
    backtest,
    regularize,
)


def aggregate_10m(model: str) -> tuple[np.ndarray, np.ndarray]:
    path = TRACES / f"servegen_{model}_aggregate_rate_DERIVED.csv"
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    t = np.array([float(r["window_start_s"]) for r in rows])
    v = np.array([float(r["total_rate_rps"]) for r in rows])
    return t, v


def per_minute(model: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from simulator._trace import load_servegen

    path = TRACES / f"servegen_{model}_client_rates.csv.gz"
    counts = np.zeros(14 * 1440)
    for day in range(14):
        trace = load_servegen(path, seed=seed + day, start_s=day * 86400.0, duration_s=86400.0)
        minutes = (trace.arrival_s // 60).astype(np.int64) + day * 1440
        counts += np.bincount(minutes, minlength=len(counts))[:len(counts)]
    return np.arange(len(counts)) * 60.0, counts / 60.0


def blend_bound(values: np.ndarray, result: Any) -> dict[str, dict[str, float]]:
    """The best mix of the main model's median and the last value, with the weight chosen on
    the test days themselves: an optimistic bound on what combining the two could reach,
    as a ratio of last-value's MAE (1.0 = no better than the last value)."""
    out = {}
    labels = list(result.scores["gbqr"])
    for j, h in enumerate(result.horizons):
        actual = values[result.origins + h]
        gb = result.forecasts["gbqr"][:, j, 0]
        last = result.forecasts["last_value"][:, j, 0]
        ok = np.isfinite(actual) & np.isfinite(gb) & np.isfinite(last)
        base = float(np.mean(np.abs(actual[ok] - last[ok])))
        errors = {float(w): float(np.mean(np.abs(actual[ok] - (w * gb[ok] + (1 - w) * last[ok]))))
                  for w in np.linspace(0, 1, 21)}
        w = min(errors, key=errors.__getitem__)
        out[labels[j]] = {"weight": w, "mae_vs_last": errors[w] / base,
                      "gbqr_mae_vs_last": errors[1.0] / base}
    return out


def run_case(name: str, t: np.ndarray, v: np.ndarray, resolution: float,
             horizons: tuple[float, ...], zero_is_missing: bool) -> dict[str, object]:
    series = regularize(t, v, resolution_s=resolution, zero_is_missing=zero_is_missing)
    common = {"resolution_s": resolution}
    models = {"last_value": LastValue(**common), "seasonal_naive": SeasonalNaive(**common),
              "exp_smoothing": ExponentialSmoothing(**common),
              "gbqr": QuantileGBForecaster(horizons_s=horizons, **common)}
    steps_per_day = round(86400 / resolution)
    result = backtest(series, models, horizons_s=horizons, train_steps=10 * steps_per_day,
                      season_steps=steps_per_day)
    bound = blend_bound(series.values, result)
    # Fit time on the whole 14 days, and one prediction (all horizons and quantiles).
    model = QuantileGBForecaster(horizons_s=horizons, **common)
    started = time.perf_counter()
    model.fit(series.times_s[:, None], series.values)
    fit_full = time.perf_counter() - started
    future = series.times_s[-1] + np.array(horizons)[:, None]
    model.predict_quantiles(future)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        model.predict_quantiles(future)
        times.append(time.perf_counter() - started)
    return {"case": name, "resolution_s": resolution, "points": len(series),
            "notes": list(series.notes), "scores": result.scores,
            "fit_14d_s": fit_full, "blend_bound": bound,
            "predict_ms": 1000 * float(np.median(times))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-1m", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "forecasting.json"))
    args = parser.parse_args()
    if not TRACES.exists():
        print("../shared/traces is absent: nothing to measure")
        return 1
    cases = []
    for model in ("m-large", "m-small"):
        t, v = aggregate_10m(model)
        print(f"running {model} 10m ...", flush=True)
        cases.append(run_case(f"servegen {model} 10m", t, v, 600.0, (600, 1800, 3600),
                              zero_is_missing=True))
    if not args.skip_1m:
        print("rebuilding m-large per-minute counts ...", flush=True)
        t, v = per_minute("m-large")
        print("running m-large 1m ...", flush=True)
        cases.append(run_case("servegen m-large 1m", t, v, 60.0, (300, 1800, 3600),
                              zero_is_missing=False))
    print(f"\n{'case':<22}{'horizon':>8}{'MASE gb':>9}{'/seasonal':>10}{'/last':>7}"
          f"{'best mix':>9}{'cov q90':>9}{'fit 14d s':>10}{'pred ms':>9}")
    for c in cases:
        scores = c["scores"]
        assert isinstance(scores, dict)
        for h, gb in scores["gbqr"].items():
            seasonal = scores["seasonal_naive"][h]["mase"]
            last = scores["last_value"][h]["mase"]
            print(f"{c['case']:<22}{h:>8}{gb['mase']:>9.3f}{gb['mase'] / seasonal:>10.2f}"
                  f"{gb['mase'] / last:>7.2f}{c['blend_bound'][h]['mae_vs_last']:>9.2f}"
                  f"{gb['coverage_q90']:>9.3f}{c['fit_14d_s']:>10.2f}"
                  f"{c['predict_ms']:>9.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cases": cases, "python": platform.python_version(),
                                          "machine": platform.machine(), "threads": 1},
                                         indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
