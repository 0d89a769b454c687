"""``pdscale forecast backtest``: rolling-origin backtests of the forecasters.

An option value that cannot work is a usage error that names the option, what it takes and an
example, in argparse's own format (exit 2): its syntax is checked before anything is read, what
depends on the input (horizons in whole steps of --resolution, a training part that leaves
steps to test) once the input is read.

A CSV's numeric times are seconds unless ``--time-unit`` says otherwise. Times that cannot be
seconds at the resolution are refused, naming the unit they look like: epoch milliseconds read
as seconds turned 1,440 one-minute rows into 1.4 million steps, 99.9 % of them empty, and the
backtest trained on them without a word.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    POSITIVE,
    err,
    out_ok,
    seed,
)

_TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_EPOCH_S = (1e8, 1e11)
"""Seconds since 1970 that a time column can mean (1973 to 5138); epoch milliseconds read as
seconds are about 1.7e12."""
_MAX_SPACING_STEPS = 4
"""Rows a median of more resolution steps apart leave most of the grid empty (regularize fills
gaps of up to 3 steps): a wrong time unit or resolution, never a series to train on."""
_PROGRESS_MIN_STEPS = 20_000
"""Series this long (two weeks of minutes) take seconds to backtest (ten with half a year of
minutes, most of it the boosted model): their stages are announced on stderr."""


class _OptionError(ValueError):
    """An option value that cannot work, reported as argparse reports a usage error."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"argument {option}: {message}")


def _usage_error(args: argparse.Namespace, exc: _OptionError) -> int:
    parser = getattr(args, "parser", None)
    if isinstance(parser, argparse.ArgumentParser):
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
    else:
        err(str(exc))
    return EXIT_BAD_INPUT


class _ProgressLines:
    """Short progress lines on stderr (stdout keeps the results), once :attr:`enabled`: for a
    series long enough to take seconds."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.enabled = False

    def __call__(self, text: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.started
            print(f"backtest: {text} ({elapsed:.0f}s)", file=sys.stderr, flush=True)


def _duration(option: str, text: str, *, example: str) -> float:
    """Whole seconds of at least one from a duration such as 90s, 5m or 1h30m."""
    import re

    from pdscale.spec import parse_duration

    want = (f"expected a duration of at least 1s in whole seconds, such as {example} (units "
            f"s, m, h, d, w), got {text!r}")
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise _OptionError(option, want) from None
    millis = sum(int(ms) for ms in re.findall(r"(\d+)ms", text))
    if seconds < 1 or millis % 1000:  # parse_duration rounds to whole seconds
        raise _OptionError(option, want)
    return float(seconds)


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _resolution(args: argparse.Namespace) -> float:
    return _duration("--resolution", args.resolution, example="1m, 30s or 1h")


def _horizons(args: argparse.Namespace) -> list[float]:
    items = _items(args.horizons)
    if not items:
        raise _OptionError("--horizons", f"expected comma-separated durations such as 5m,30m, "
                                         f"got {args.horizons!r}")
    return [_duration("--horizons", item, example="5m,30m") for item in items]


def _check_horizons(args: argparse.Namespace, horizons: list[float], resolution: float) -> None:
    """Each horizon a whole number of steps (a usage error; checked once the input is read,
    so a file's problem is not hidden behind a default that does not fit --resolution)."""
    from pdscale.spec import format_duration

    step = format_duration(resolution)
    example = "5m,30m" if 300 % resolution == 0 else \
        f"{step},{format_duration(6 * resolution)}"
    for item, h in zip(_items(args.horizons), horizons, strict=True):
        if h < resolution:
            raise _OptionError("--horizons", f"{item} is shorter than the resolution ({step}); "
                                             f"expected horizons of at least one step, such "
                                             f"as {example}")
        if h % resolution:
            raise _OptionError("--horizons", f"{item} is not a whole number of {step} steps "
                                             f"(--resolution); expected multiples of the "
                                             f"resolution, such as {example}")


def _quantiles(args: argparse.Namespace) -> tuple[float, ...]:
    import math

    want = ("expected increasing quantiles between 0 and 1 (exclusive), comma-separated, "
            "such as 0.5,0.9 or 0.1,0.5,0.9")
    quantiles: list[float] = []
    for item in _items(args.quantiles):
        try:
            q = float(item)
        except ValueError:
            q = math.nan
        if not 0 < q < 1 or (quantiles and q <= quantiles[-1]):
            raise _OptionError("--quantiles", f"{want}; got {args.quantiles!r}")
        quantiles.append(q)
    if not quantiles:
        raise _OptionError("--quantiles", f"{want}; got {args.quantiles!r}")
    return tuple(quantiles)


def _train_steps(args: argparse.Namespace, *, n: int, resolution: float, test: int) -> int:
    """Steps to train on: enough to fit (2) and leaving ``test`` steps after them."""
    from pdscale.spec import format_duration

    step = format_duration(resolution)
    if n < 2 + test:
        raise ValueError(f"the series has {n} steps of {step}: too short to train on 2 and "
                         f"test {test} (the longest --horizons plus one); use a longer "
                         f"series, shorter --horizons or a coarser --resolution")
    fraction: float = args.train_fraction
    days: float | None = args.train_days
    if days is None:
        train = round(n * fraction)
        if not 2 <= train <= n - test:
            works = 0.7 if 2 <= round(n * 0.7) <= n - test else round((2 + n - test) / 2 / n, 3)
            raise _OptionError(
                "--train-fraction",
                f"{fraction:g} of the series' {n} steps of {step} trains on {train} and leaves "
                f"{n - train} to test; expected a fraction that trains on at least 2 steps and "
                f"leaves at least {test} to test, such as {works:g}")
        return train
    train = round(days * 86400 / resolution)
    if not 2 <= train <= n - test:
        raise _OptionError(
            "--train-days",
            f"{days:g} day(s) is {train} steps of {step}, and the series has {n}; expected at "
            f"least {2 * resolution / 86400:.3g} and at most {(n - test) * resolution / 86400:.3g}"
            f" days, so that {test} steps are left to test, or --train-fraction such as 0.7")
    return train


def _parse_row(row: dict[Any, Any], time_col: str, value_col: str, *, scale: float,
               width: int) -> tuple[float, float]:
    """(seconds, value) of one CSV row, or ValueError saying what is wrong with it."""
    import math
    from datetime import datetime

    raw_t, raw_v = row[time_col], row[value_col]
    if raw_t is None or raw_v is None:  # csv.DictReader's filler for a short row
        fields = sum(1 for key, value in row.items() if key is not None and value is not None)
        missing = time_col if raw_t is None else value_col
        raise ValueError(f"column {missing!r}: missing (the row has {fields} field(s), the "
                         f"header {width})")
    try:
        t = float(raw_t) * scale
    except ValueError:
        try:
            t = datetime.fromisoformat(raw_t).timestamp()
        except ValueError:
            t = math.nan
    if not math.isfinite(t):
        raise ValueError(f"column {time_col!r}: expected a number (of --time-unit, seconds "
                         f"by default) or an ISO time, got {raw_t!r}")
    try:
        v = float(raw_v) if raw_v.strip() else math.nan
    except ValueError:
        raise ValueError(f"column {value_col!r}: expected a number, got {raw_v!r}") from None
    return t, v


def _read_series_csv(path: str, time_col: str, value_col: str, *, time_unit: str = "s",
                     skip_bad_rows: bool = False) -> tuple[list[float], list[float], int]:
    """Times (seconds), values and the number of malformed rows skipped."""
    try:
        return _read_csv_rows(path, time_col, value_col, scale=_TIME_UNITS_S[time_unit],
                              skip_bad_rows=skip_bad_rows)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the "
                         "CSV as UTF-8") from None


def _read_csv_rows(path: str, time_col: str, value_col: str, *, scale: float,
                   skip_bad_rows: bool) -> tuple[list[float], list[float], int]:
    import csv

    times: list[float] = []
    values: list[float] = []
    skipped = 0
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        for name in (time_col, value_col):
            if name not in columns:
                raise ValueError(f"{path}: no column {name!r}; the columns are "
                                 f"{', '.join(columns)}")
        for row in reader:
            try:
                t, v = _parse_row(row, time_col, value_col, scale=scale, width=len(columns))
            except ValueError as exc:
                if not skip_bad_rows:
                    # line_num: the file's line, counting blank lines the reader skipped
                    raise ValueError(f"{path}, line {reader.line_num}, {exc}; fix the row or "
                                     "pass --skip-bad-rows to skip malformed rows") from None
                skipped += 1
                continue
            times.append(t)
            values.append(v)
    return times, values, skipped


def _check_times(where: str, times: list[float], *, time_unit: str, resolution: float) -> None:
    """Refuse times that cannot be ``time_unit`` at this resolution, naming the likely unit."""
    import math

    import numpy as np

    from pdscale.spec import format_duration

    t = np.asarray(times, dtype=np.float64)
    if len(t) == 0:
        return
    scale = _TIME_UNITS_S[time_unit]
    smaller = [u for u, f in _TIME_UNITS_S.items() if f < scale]
    typical = float(np.median(np.abs(t)))
    if typical >= _EPOCH_S[1]:
        likely = next((u for u in smaller
                       if _EPOCH_S[0] <= typical * _TIME_UNITS_S[u] / scale < _EPOCH_S[1]), None)
        fix = (f"they look like epoch {_UNIT_NAMES[likely]}: pass --time-unit {likely}"
               if likely else "pass --time-unit with the column's unit (s, ms, us or ns)")
        raise ValueError(f"{where}: times such as {t[0] / scale:.0f} are past the year 5000 "
                         f"as {_UNIT_NAMES[time_unit]}; {fix}")
    gaps = np.diff(t)
    gaps = gaps[gaps > 0]
    if len(gaps) == 0:
        return
    spacing = float(np.median(gaps))
    ratio = spacing / resolution
    if ratio <= _MAX_SPACING_STEPS:
        return
    likely = None
    if not _EPOCH_S[0] <= float(t.min()) < _EPOCH_S[1]:  # not plausibly epoch seconds
        likely = next((u for u in smaller
                       if 0.01 <= ratio * _TIME_UNITS_S[u] / scale <= _MAX_SPACING_STEPS), None)
    unit_fix = (f"if the times are {_UNIT_NAMES[likely]} (they look like it), pass --time-unit "
                f"{likely}" if likely else
                f"if the times are not {_UNIT_NAMES[time_unit]}, pass --time-unit (s, ms, us "
                f"or ns)")
    how_far = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.2g}"
    empty = math.floor(1000 - 1000 / ratio) / 10  # percent, rounded down: 99.9, not 100
    raise ValueError(
        f"{where}: the rows are a median {spacing:,.0f} seconds apart, {how_far}x the resolution "
        f"of {format_duration(resolution)}, so about {empty:g}% of the steps would be empty; "
        f"{unit_fix}; if the rows really are that far apart, pass --resolution "
        f"{format_duration(spacing)} or coarser")


def _series(args: argparse.Namespace, resolution: float) -> tuple[Any, str, list[str]]:
    """The series to backtest, where it came from and notes on reading it (raises ValueError
    on bad input)."""
    import numpy as np

    from pdscale.forecasting import regularize, series_from_requests

    if args.trace:
        from pdscale.simulator import TraceError, load_trace

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
        return all_series[args.signal], args.trace, list(trace.notes)
    if not (args.series and args.time_col and args.value_col):
        raise ValueError("give --trace, or --series with --time-col and --value-col")
    unit = args.time_unit or "s"
    times, values, skipped = _read_series_csv(args.series, args.time_col, args.value_col,
                                              time_unit=unit,
                                              skip_bad_rows=args.skip_bad_rows)
    _check_times(f"{args.series}, column {args.time_col!r}", times, time_unit=unit,
                 resolution=resolution)
    notes = [f"skipped {skipped} malformed row(s)"] if skipped else []
    return regularize(times, values, resolution_s=resolution,
                      zero_is_missing=args.zero_is_missing), args.series, notes


def _models(args: argparse.Namespace, *, resolution: float, horizons: list[float],
            quantiles: tuple[float, ...], train: int, period: int) -> dict[str, Any]:
    from pdscale.forecasting import (
        ExponentialSmoothing,
        LastValue,
        QuantileGBForecaster,
        SeasonalNaive,
    )

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


def _print_scores(source: str, args: argparse.Namespace, result: Any,
                  notes: list[str]) -> None:
    labels = list(next(iter(result.scores.values())))
    print(f"backtest of {source} at {args.resolution}: trained on {result.train_steps} steps, "
          f"{result.test_origins} forecast origins")
    for note in notes:
        print(f"note: {note}")
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

    from pdscale._io import OutputError, write_tree
    from pdscale.forecasting import SeriesError, backtest

    progress = _ProgressLines()
    try:
        if args.trace and args.time_unit:
            raise _OptionError("--time-unit", "applies to the numeric times of --series, such "
                                              "as --series rates.csv --time-unit ms; a trace's "
                                              "format fixes its unit, so drop it")
        resolution = _resolution(args)
        horizons = _horizons(args)
        quantiles = _quantiles(args)
    except _OptionError as exc:
        return _usage_error(args, exc)
    if not out_ok(args.out):
        return EXIT_BAD_INPUT
    try:
        series, source, notes = _series(args, resolution)
        _check_horizons(args, horizons, resolution)
        notes += series.notes
        n = len(series)
        progress.enabled = n >= _PROGRESS_MIN_STEPS
        progress(f"{n:,} steps of {args.resolution} from {source}")
        period = max(1, round(args.period / resolution))
        test = round(max(horizons) / resolution) + 1
        train = _train_steps(args, n=n, resolution=resolution, test=test)
        models = _models(args, resolution=resolution, horizons=horizons, quantiles=quantiles,
                         train=train, period=period)
        origins = n - test - train + 2

        def announce(name: str, done: int, total: int) -> None:
            progress(f"{name} ({done + 1}/{total}): fitting on {train:,} steps, forecasting "
                     f"from {origins:,} origins")

        result = backtest(series, models, horizons_s=horizons, train_steps=train,
                          season_steps=period, progress=announce)
    except _OptionError as exc:
        return _usage_error(args, exc)
    except (SeriesError, ValueError, OSError) as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    _print_scores(source, args, result, notes)
    report = {"source": source, "resolution_s": resolution, "horizons_s": horizons,
              "quantiles": list(quantiles), "train_steps": result.train_steps,
              "test_origins": result.test_origins, "series_notes": notes,
              "fit_s": result.fit_s, "predict_ms": result.predict_ms,
              "models": result.scores}
    files: dict[str, str | bytes] = {
        "backtest.json": json.dumps(report, indent=2, sort_keys=True) + "\n"}
    if not args.no_plots:
        progress("plotting")
        files["forecast.png"] = _backtest_plot(series, result, quantiles)
    try:
        write_tree(Path(args.out), files)
    except OutputError as exc:
        err(str(exc))
        return EXIT_FAILURE
    print(f"wrote {args.out}/backtest.json" + ("" if args.no_plots else " and forecast.png"))
    return EXIT_OK


def _backtest_plot(series: object, result: object, quantiles: tuple[float, ...]) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdscale.forecasting import BacktestResult, RegularSeries

    assert isinstance(series, RegularSeries) and isinstance(result, BacktestResult)
    name = "gbqr" if "gbqr" in result.forecasts else next(iter(result.forecasts))
    pred = result.forecasts[name]
    j = len(result.horizons) - 1
    h = int(result.horizons[j])
    target = result.origins + h
    hours = series.times_s[target] / 3600
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.plot(hours, series.values[target], lw=0.8, color="black", label="actual")
    # The line is the quantile nearest the median (the forecasts' quantiles are sorted);
    # the band spans the lowest to the highest asked for.
    mid = min(range(len(quantiles)), key=lambda i: abs(quantiles[i] - 0.5))
    ax.plot(hours, pred[:, j, mid], lw=0.8, color="tab:blue",
            label=f"{name} q{quantiles[mid]:g}")
    if len(quantiles) > 1:
        ax.fill_between(hours, pred[:, j, 0], pred[:, j, -1], color="tab:blue", alpha=0.2,
                        label=f"q{quantiles[0]:g} to q{quantiles[-1]:g}")
    ax.set_xlabel("hours")
    ax.set_title(f"{name}: forecast {h * series.resolution_s / 60:g} min ahead against actual")
    ax.legend(loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _open_fraction(text: str) -> float:
    """An argparse type: a fraction strictly between 0 and 1 (0 trains on nothing, 1 tests
    nothing)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 (exclusive) "
                                         f"such as 0.7, got {text!r}")
    return value


_open_fraction.__name__ = "fraction"  # argparse names the type in its messages

_EPILOG = """\
examples:
  pdscale forecast backtest --series rates.csv --time-col t --value-col rps \\
      --resolution 10m --horizons 10m,30m,60m --train-days 10 --out bt/
  pdscale forecast backtest --series export.csv --time-col ts --time-unit ms \\
      --value-col rps --quantiles 0.1,0.5,0.9 --out bt/
  pdscale forecast backtest --trace synthetic --resolution 1m --horizons 5m --out bt/

Durations are whole seconds with units s, m, h, d, w (30s, 5m, 1h30m). A CSV's times are
numbers in --time-unit since any origin (epoch seconds by default) or ISO 8601 times. Rows a
median of more than 4 steps of --resolution apart are refused: most steps would be empty.
A long series (20,000 steps or more) reports progress on stderr.
Exit codes: 0 ok, 1 failure while writing, 2 bad input.
"""


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    forecast = sub.add_parser("forecast", help="load forecasting: backtests")
    forecast_sub = forecast.add_subparsers(dest="forecast_command", metavar="COMMAND",
                                           required=True)

    p = forecast_sub.add_parser(
        "backtest", help="rolling-origin backtest of the forecasters",
        description="Fit the forecasters (last value, exponential smoothing, seasonal naive,\n"
                    "gradient-boosted quantile regression) on the first part of a series and\n"
                    "score forecasts from every later origin: MAE, sMAPE, MASE, pinball loss\n"
                    "per quantile, coverage of the 0.9 quantile. Writes backtest.json and a\n"
                    "plot into --out.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="a request trace (or 'synthetic')")
    source.add_argument("--series", metavar="CSV", help="a CSV of (time, value) rows")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"],
                   help="the trace's format (default: from its name or header)")
    p.add_argument("--signal", default="request_rate",
                   help="from a trace: request_rate, prompt_tokens_per_s, output_tokens_per_s, "
                        "mean_input_tokens or mean_output_tokens (default: %(default)s)")
    p.add_argument("--time-col", metavar="COLUMN",
                   help="CSV time column: numbers in --time-unit, or ISO 8601 times")
    p.add_argument("--time-unit", choices=list(_TIME_UNITS_S),
                   help="unit of the numeric times in --time-col (default: s); times that "
                        "look like another unit are refused, naming it")
    p.add_argument("--value-col", metavar="COLUMN", help="CSV value column")
    p.add_argument("--zero-is-missing", action="store_true",
                   help="treat zeros in a busy series as collection gaps")
    p.add_argument("--resolution", default="1m", metavar="DURATION",
                   help="step of the series the forecasters work on, such as 30s, 1m or 10m "
                        "(default: %(default)s)")
    p.add_argument("--horizons", default="5m,30m", metavar="DURATION,...",
                   help="how far ahead to forecast, comma-separated multiples of --resolution "
                        "(default: %(default)s)")
    p.add_argument("--quantiles", default="0.5,0.9", metavar="Q,...",
                   help="increasing quantiles to forecast, each between 0 and 1, such as "
                        "0.1,0.5,0.9 (default: %(default)s)")
    p.add_argument("--period", type=POSITIVE, default=86400.0, metavar="SECONDS",
                   help="seasonal period, seconds (default: %(default)g, one day)")
    p.add_argument("--train-fraction", type=_open_fraction, default=0.7, metavar="FRACTION",
                   help="share of the series to train on, between 0 and 1; the rest is "
                        "tested (default: %(default)s)")
    p.add_argument("--train-days", type=POSITIVE, metavar="DAYS",
                   help="train on this many days instead of --train-fraction")
    p.add_argument("--seed", type=seed, default=0,
                   help="random seed of the boosted model, a whole number >= 0 "
                        "(default: %(default)s)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows of --trace or --series and report how many "
                        "(default: stop at the first, naming its line)")
    p.add_argument("--no-plots", action="store_true", help="write no forecast.png")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for backtest.json and forecast.png")
    p.set_defaults(func=_cmd_forecast_backtest, parser=p)
