"""Forecast accuracy of the upper quantile, and speed, on the shared traces, as published and
with collection gaps and zero stretches inserted.

    OMP_NUM_THREADS=1 .venv/bin/python bench/forecasting.py [--skip-1m]

Traces come from ``$PDSCALE_TRACES`` or else ``../shared/traces`` next to the checkout.

Series (request rate, requests/s):

* ServeGen m-large and m-small aggregate rates at 10-minute resolution (as published, 600 s
  windows, 14 days; m-small's 37 zero-rate windows are real collection gaps). Train on the first
  10 days, forecast from every origin of the last 4 (one fit, as the controller refits rarely
  against 4 days).
* ServeGen m-large per-minute counts rebuilt from its per-client windows with ServeGen's own
  method (the simulator's loader, seeded), same split (``--skip-1m`` leaves it out: the rebuild
  takes about a minute).
* Azure code 2023 and Mooncake conversation, one hour each, per-minute counts: a pool with
  minutes of history. Forecasts from every minute from the 5th on, the models refitted at every
  origin on everything before it (the short-history regime; the controller refits on its own
  schedule).

Variants of each series: as published; ``+gaps`` (stretches of absent rows: a metrics outage);
``+zeros`` (stretches that read zero: a collection gap that reports zero). The 14-day series get
one of each kind a day, 20 minutes to 3 hours long; the one-hour traces one of each, 3 to 8
minutes. Forecasts are scored against the published values, on targets outside the inserted
stretches (and, for m-small, outside its own zero windows, whose true rate is unknown), so a
forecast that jumps after a gap pays for it.

Target (issue 16): the 0.9 quantile's pinball loss at most the last value's (``LastValue``: the
last observation plus the quantiles of its own in-sample errors) at 10 and 30 minutes, and its
coverage within 0.88-0.92, on every series and variant. Also: fit on 14 days at 1 minute and
one prediction, on one core. Prints a table; writes bench/results/forecasting.json.

How far a coverage can be read depends on how many targets it is counted on: the ``band``
column is the chance that a perfectly calibrated 0.9 quantile (each target covered with
probability 0.9, independently) lands inside 0.88-0.92 on that many targets. On the one-hour
traces (24-45 targets) it is 0.27-0.49, so a miss there says little about calibration; on the
14-day series (500-5,700 targets) it is 0.85-1. Forecasts from neighbouring origins share
errors, so the real chance is lower than this independent one.
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
from scipy.stats import binom

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdscale.forecasting import (  # noqa: E402
    LastValue,
    QuantileGBForecaster,
    backtest,
    regularize,
)
from pdscale.simulator import traces_dir  # noqa: E402

TRACES = traces_dir(None, default=ROOT.parent / "shared" / "traces")

HORIZONS_S = (600.0, 1800.0)
QUANTILE = 0.9
COVERAGE_BAND = (0.88, 0.92)
"""The target's band for the upper quantile's coverage."""


def aggregate_10m(model: str) -> tuple[np.ndarray, np.ndarray]:
    path = TRACES / f"servegen_{model}_aggregate_rate_DERIVED.csv"
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    t = np.array([float(r["window_start_s"]) for r in rows])
    v = np.array([float(r["total_rate_rps"]) for r in rows])
    return t, v


def per_minute(model: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from pdscale.simulator._servegen import load_servegen

    path = TRACES / f"servegen_{model}_client_rates.csv.gz"
    counts = np.zeros(14 * 1440)
    for day in range(14):
        trace = load_servegen(path, seed=seed + day, start_s=day * 86400.0, duration_s=86400.0)
        minutes = (trace.arrival_s // 60).astype(np.int64) + day * 1440
        counts += np.bincount(minutes, minlength=len(counts))[:len(counts)]
    return np.arange(len(counts)) * 60.0, counts / 60.0


def request_trace(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-minute request rate of a one-hour request trace."""
    from pdscale.simulator._trace import load_trace

    trace = load_trace(TRACES / name)
    minutes = (trace.arrival_s // 60).astype(np.int64)
    counts = np.bincount(minutes).astype(np.float64)
    return np.arange(len(counts)) * 60.0, counts / 60.0


def insert_stretches(v: np.ndarray, t: np.ndarray, *, per_day: bool, seed: int,
                     kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Absent rows (``kind='gaps'``) or zero readings (``'zeros'``): the series as seen, and a
    mask of what was inserted."""
    rng = np.random.default_rng(seed)
    res = float(t[1] - t[0])
    n = len(v)
    inserted = np.zeros(n, dtype=bool)
    if per_day:
        days = round(n * res / 86400)
        spans = [(d * 86400.0, rng.uniform(20 * 60, 3 * 3600)) for d in range(days)]
        spans = [(day0 + rng.uniform(0, 86400 - length), length) for day0, length in spans]
    else:
        length = rng.uniform(3 * 60, 8 * 60)
        # Inside the scored stretch (after the first 5 minutes), away from the end.
        spans = [(rng.uniform(8 * 60, n * res - length - 12 * 60), length)]
    for start_s, length_s in spans:
        inserted[(t >= start_s) & (t < start_s + length_s)] = True
    seen = v.copy()
    seen[inserted] = np.nan if kind == "gaps" else 0.0  # NaN: no observation at all
    return seen, inserted


def scores(truth: np.ndarray, scored: np.ndarray, result: Any,
           res: float) -> dict[str, dict[str, Any]]:
    """Per model and horizon: the q0.9 pinball loss, its coverage and the median's MAE, against
    the published values at the scored targets."""
    out: dict[str, dict[str, Any]] = {}
    for name, pred in result.forecasts.items():
        per_h: dict[str, Any] = {}
        for j, h in enumerate(result.horizons):
            target = result.origins + h
            ok = scored[target] & np.isfinite(truth[target]) & np.isfinite(pred[:, j, -1])
            a, upper, mid = truth[target][ok], pred[ok, j, -1], pred[ok, j, 0]
            diff = a - upper
            per_h[f"{h * res / 60:g}m"] = {
                "pinball_q90": float(np.mean(np.maximum(QUANTILE * diff, (QUANTILE - 1) * diff))),
                "coverage_q90": float(np.mean(a <= upper)),
                "mae": float(np.mean(np.abs(a - mid))),
                "points": int(ok.sum()),
            }
        out[name] = per_h
    return out


def band_chance(points: int) -> float:
    """P(low <= X / points <= high) for X ~ Binomial(points, QUANTILE) and (low, high) the
    :data:`COVERAGE_BAND`: how often a calibrated upper quantile's coverage on ``points``
    independent targets reads inside the band."""
    low, high = COVERAGE_BAND
    if points <= 0:
        return 0.0
    k = np.arange(points + 1)
    inside = k[(k >= low * points - 1e-9) & (k <= high * points + 1e-9)]
    return float(binom.pmf(inside, points, QUANTILE).sum())


def run_case(name: str, t: np.ndarray, v: np.ndarray, *, variant: str, long: bool,
             zero_gaps: bool = False, seed: int = 0) -> dict[str, Any]:
    res = float(t[1] - t[0])
    truth_series = regularize(t, v, resolution_s=res, zero_is_missing=zero_gaps)
    truth = truth_series.values
    scored = np.ones(len(truth), dtype=bool)
    seen = v
    if variant != "published":
        seen, inserted = insert_stretches(v, t, per_day=long, seed=seed,
                                          kind=variant.lstrip("+"))
        scored &= ~inserted
    # Zeros read as load in the +zeros variant (that is what it tests); as published,
    # m-small's zero windows are declared missing, as a user who knows them would. Absent rows
    # are NaN on the same grid.
    series = regularize(t, seen, resolution_s=res,
                        zero_is_missing=zero_gaps and variant == "published")
    gb_horizons = tuple(sorted({60.0, 300.0, *HORIZONS_S} if res < 600 else
                               {*HORIZONS_S, 3600.0}))

    def models() -> dict[str, Any]:
        return {"gbqr": QuantileGBForecaster(resolution_s=res, quantiles=(0.5, QUANTILE),
                                             horizons_s=gb_horizons),
                "last_value": LastValue(resolution_s=res, quantiles=(0.5, QUANTILE))}

    if long:
        steps_per_day = round(86400 / res)
        results = [backtest(series, models(), horizons_s=HORIZONS_S,
                            train_steps=10 * steps_per_day, season_steps=steps_per_day)]
    else:  # one backtest a horizon, so the short one keeps its later origins
        results = [backtest(series, models(), horizons_s=(h,), train_steps=5, season_steps=1,
                            refit_every=1) for h in HORIZONS_S]
    merged: dict[str, dict[str, Any]] = {}
    for result in results:
        for model, per_h in scores(truth, scored, result, res).items():
            merged.setdefault(model, {}).update(per_h)
    entry: dict[str, Any] = {"case": name, "variant": variant, "resolution_s": res,
                             "points": len(series), "notes": list(series.notes),
                             "scores": merged, "fit_s": results[0].fit_s["gbqr"],
                             "predict_ms": results[0].predict_ms["gbqr"]}
    return entry


def speed(t: np.ndarray, v: np.ndarray) -> dict[str, float]:
    """Fit on the whole series and one prediction (all horizons and quantiles), the
    controller's settings at its resolution."""
    model = QuantileGBForecaster(resolution_s=float(t[1] - t[0]),
                                 horizons_s=(60, 300, 600, 1800, 3600))
    started = time.perf_counter()
    model.fit(t[:, None], v)
    fit = time.perf_counter() - started
    future = t[-1] + np.array([600.0, 1800.0])[:, None]
    model.predict_quantiles(future)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        model.predict_quantiles(future)
        times.append(time.perf_counter() - started)
    return {"fit_s": fit, "predict_ms": 1000 * float(np.median(times))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-1m", action="store_true",
                        help="leave out ServeGen m-large per minute (its rebuild is slow)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "forecasting.json"))
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"{TRACES} is absent (set PDSCALE_TRACES): nothing to measure")
        return 1
    series: list[tuple[str, np.ndarray, np.ndarray, bool, bool]] = []
    for model in ("m-large", "m-small"):
        t, v = aggregate_10m(model)
        series.append((f"servegen {model} 10m", t, v, True, model == "m-small"))
    if not args.skip_1m:
        print("rebuilding m-large per-minute counts ...", flush=True)
        t, v = per_minute("m-large")
        series.append(("servegen m-large 1m", t, v, True, False))
    for label, file in (("azure code 1m", "azure_llm_2023_code.csv"),
                        ("mooncake 1m", "mooncake_fast25_conversation_trace.jsonl.gz")):
        t, v = request_trace(file)
        series.append((label, t, v, False, False))
    cases = []
    speeds = {}
    for i, (name, t, v, long, zero_gaps) in enumerate(series):
        for variant in ("published", "+gaps", "+zeros"):
            print(f"running {name} {variant} ...", flush=True)
            cases.append(run_case(name, t, v, variant=variant, long=long, zero_gaps=zero_gaps,
                                  seed=i))
        if name == "servegen m-large 1m":
            speeds["14 days at 1 minute"] = speed(t, v)
    print(f"\n{'series':<22}{'variant':<11}{'h':>4}{'pinball q90':>12}{'last':>8}{'ratio':>7}"
          f"{'cov q90':>8}{'last':>7}{'n':>6}{'band':>6}  target")
    met_all = True
    for c in cases:
        gb, last = c["scores"]["gbqr"], c["scores"]["last_value"]
        for h in gb:
            ratio = gb[h]["pinball_q90"] / last[h]["pinball_q90"]
            met = ratio <= 1.0 and \
                COVERAGE_BAND[0] <= gb[h]["coverage_q90"] <= COVERAGE_BAND[1]
            met_all &= met
            c.setdefault("target_met", {})[h] = met
            c.setdefault("band_chance", {})[h] = chance = band_chance(gb[h]["points"])
            print(f"{c['case']:<22}{c['variant']:<11}{h:>4}{gb[h]['pinball_q90']:>12.3f}"
                  f"{last[h]['pinball_q90']:>8.3f}{ratio:>7.2f}{gb[h]['coverage_q90']:>8.3f}"
                  f"{last[h]['coverage_q90']:>7.3f}{gb[h]['points']:>6}{chance:>6.2f}  "
                  f"{'met' if met else 'MISSED'}")
    for label, s in speeds.items():
        print(f"fit {label}: {s['fit_s']:.2f} s; one prediction {s['predict_ms']:.2f} ms")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cases": cases, "speed": speeds,
                                          "all_targets_met": met_all,
                                          "python": platform.python_version(),
                                          "machine": platform.machine(), "threads": 1},
                                         indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
