"""``pdscale forecast backtest``: rolling-origin backtests of the forecasters."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    FRACTION,
    POSITIVE,
    err,
    out_ok,
    seed,
)


def _read_series_csv(path: str, time_col: str, value_col: str) -> tuple[list[float],
                                                                         list[float]]:
    import csv
    from datetime import datetime

    times: list[float] = []
    values: list[float] = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for name in (time_col, value_col):
            if name not in (reader.fieldnames or []):
                raise ValueError(f"{path}: no column {name!r}; the columns are "
                                 f"{', '.join(reader.fieldnames or [])}")
        for line, row in enumerate(reader, start=2):
            raw_t, raw_v = row[time_col], row[value_col]
            try:
                t = float(raw_t)
            except ValueError:
                try:
                    t = datetime.fromisoformat(raw_t).timestamp()
                except ValueError:
                    raise ValueError(f"{path}, line {line}, column {time_col!r}: expected "
                                     f"seconds or an ISO time, got {raw_t!r}") from None
            try:
                v = float(raw_v) if raw_v.strip() else float("nan")
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {value_col!r}: expected a "
                                 f"number, got {raw_v!r}") from None
            times.append(t)
            values.append(v)
    return times, values


def _series(args: argparse.Namespace, resolution: float) -> tuple[Any, str]:
    """The series to backtest and where it came from (raises ValueError on bad input)."""
    import numpy as np

    from forecasting import regularize, series_from_requests

    if args.trace:
        from simulator import TraceError, load_trace

        try:
            trace = load_trace(args.trace, args.format, skip_bad_rows=args.skip_bad_rows)
        except TraceError as exc:
            raise ValueError(str(exc)) from exc
        all_series = series_from_requests(
            trace.arrival_s, trace.prompt_tokens.astype(np.float64),
            trace.output_tokens.astype(np.float64), resolution_s=resolution)
        if args.signal not in all_series:
            raise ValueError(f"unknown --signal {args.signal!r}; use one of "
                             f"{', '.join(all_series)}")
        return all_series[args.signal], args.trace
    if not (args.series and args.time_col and args.value_col):
        raise ValueError("give --trace, or --series with --time-col and --value-col")
    times, values = _read_series_csv(args.series, args.time_col, args.value_col)
    return regularize(times, values, resolution_s=resolution,
                      zero_is_missing=args.zero_is_missing), args.series


def _models(args: argparse.Namespace, *, resolution: float, horizons: list[float],
            quantiles: tuple[float, ...], train: int, period: int) -> dict[str, Any]:
    from forecasting import ExponentialSmoothing, LastValue, QuantileGBForecaster, SeasonalNaive

    models: dict[str, Any] = {
        "last_value": LastValue(resolution_s=resolution, quantiles=quantiles),
        "exp_smoothing": ExponentialSmoothing(resolution_s=resolution, quantiles=quantiles)}
    if train > period + 1:
        models["seasonal_naive"] = SeasonalNaive(period_s=args.period, resolution_s=resolution,
                                                 quantiles=quantiles)
    models["gbqr"] = QuantileGBForecaster(horizons_s=tuple(horizons), period_s=args.period,
                                          random_state=args.seed, resolution_s=resolution,
                                          quantiles=quantiles)
    return models


def _print_scores(source: str, args: argparse.Namespace, result: Any) -> None:
    labels = list(next(iter(result.scores.values())))
    print(f"backtest of {source} at {args.resolution}: trained on {result.train_steps} steps, "
          f"{result.test_origins} forecast origins")
    print(f"{'model':<16}{'horizon':>8}{'MAE':>11}{'sMAPE':>8}{'MASE':>7}{'cov q90':>9}"
          f"{'fit s':>7}")
    for name, per_h in result.scores.items():
        for label in labels:
            sc = per_h[label]
            cov = sc.get("coverage_q90")
            print(f"{name:<16}{label:>8}{sc['mae']:>11.4g}{sc['smape']:>8.3f}"
                  f"{sc['mase'] if sc['mase'] is not None else float('nan'):>7.3f}"
                  f"{cov if cov is not None else float('nan'):>9.3f}{result.fit_s[name]:>7.2f}")


def _cmd_forecast_backtest(args: argparse.Namespace) -> int:
    import json

    from forecasting import SeriesError, backtest
    from pdscale._io import OutputError, write_tree
    from pdscale.spec import parse_duration

    if not out_ok(args.out):
        return EXIT_BAD_INPUT
    try:
        resolution = float(parse_duration(args.resolution))
        horizons = [float(parse_duration(h)) for h in args.horizons.split(",") if h.strip()]
        quantiles = tuple(float(q) for q in args.quantiles.split(","))
        series, source = _series(args, resolution)
        n = len(series)
        period = max(1, round(args.period / resolution))
        train = round(n * args.train_fraction) if args.train_days is None else \
            round(args.train_days * 86400 / resolution)
        models = _models(args, resolution=resolution, horizons=horizons, quantiles=quantiles,
                         train=train, period=period)
        result = backtest(series, models, horizons_s=horizons, train_steps=train,
                          season_steps=period)
    except (SeriesError, ValueError, OSError) as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    _print_scores(source, args, result)
    report = {"source": source, "resolution_s": resolution, "horizons_s": horizons,
              "quantiles": list(quantiles), "train_steps": result.train_steps,
              "test_origins": result.test_origins, "series_notes": list(series.notes),
              "fit_s": result.fit_s, "predict_ms": result.predict_ms,
              "models": result.scores}
    files: dict[str, str | bytes] = {
        "backtest.json": json.dumps(report, indent=2, sort_keys=True) + "\n"}
    if not args.no_plots:
        files["forecast.png"] = _backtest_plot(series, result)
    try:
        write_tree(Path(args.out), files)
    except OutputError as exc:
        err(str(exc))
        return EXIT_FAILURE
    print(f"wrote {args.out}/backtest.json" + ("" if args.no_plots else " and forecast.png"))
    return EXIT_OK


def _backtest_plot(series: object, result: object) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from forecasting import BacktestResult, RegularSeries

    assert isinstance(series, RegularSeries) and isinstance(result, BacktestResult)
    name = "gbqr" if "gbqr" in result.forecasts else next(iter(result.forecasts))
    pred = result.forecasts[name]
    j = len(result.horizons) - 1
    h = int(result.horizons[j])
    target = result.origins + h
    hours = series.times_s[target] / 3600
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.plot(hours, series.values[target], lw=0.8, color="black", label="actual")
    ax.plot(hours, pred[:, j, 0], lw=0.8, color="tab:blue", label=f"{name} median")
    ax.fill_between(hours, pred[:, j, 0], pred[:, j, -1], color="tab:blue", alpha=0.2,
                    label="quantile band")
    ax.set_xlabel("hours")
    ax.set_title(f"{name}: forecast {h * series.resolution_s / 60:g} min ahead against actual")
    ax.legend(loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    forecast = sub.add_parser("forecast", help="load forecasting: backtests")
    forecast_sub = forecast.add_subparsers(dest="forecast_command", metavar="COMMAND",
                                           required=True)

    p = forecast_sub.add_parser(
        "backtest", help="rolling-origin backtest of the forecasters",
        description="Fit the forecasters (last value, exponential smoothing, seasonal naive, "
                    "gradient-boosted quantile regression) on the first part of a series and "
                    "score forecasts from every later origin: MAE, sMAPE, MASE, pinball loss "
                    "per quantile, coverage of the 0.9 quantile. Writes backtest.json and a "
                    "plot into --out.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="a request trace (or 'synthetic')")
    source.add_argument("--series", help="a CSV of (time, value) rows")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"])
    p.add_argument("--signal", default="request_rate",
                   help="from a trace: request_rate, prompt_tokens_per_s, output_tokens_per_s, "
                        "mean_input_tokens or mean_output_tokens")
    p.add_argument("--time-col", help="CSV time column (seconds or ISO times)")
    p.add_argument("--value-col", help="CSV value column")
    p.add_argument("--zero-is-missing", action="store_true",
                   help="treat zeros in a busy series as collection gaps")
    p.add_argument("--resolution", default="1m")
    p.add_argument("--horizons", default="5m,30m")
    p.add_argument("--quantiles", default="0.5,0.9")
    p.add_argument("--period", type=POSITIVE, default=86400.0, help="seasonal period, seconds")
    p.add_argument("--train-fraction", type=FRACTION, default=0.7)
    p.add_argument("--train-days", type=POSITIVE, help="train on this many days instead")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--skip-bad-rows", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_forecast_backtest)
