"""`pdscale forecast backtest` on bad input: a short CSV row, times in another unit than
seconds, option values that cannot work; each exits 2 with a message that names the line or
the option and the fix, writes nothing, and never shows a traceback. Also the help's defaults
and examples, the notes a sparse series earns, and progress on stderr for a long series."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pdscale._cli import forecast
from pdscale.cli import build_parser, main
from pdscale.forecasting import LastValue, SeriesError, backtest, regularize, series_from_requests

T0 = 1_700_000_000  # epoch seconds, November 2023


def _csv(path: Path, times: Sequence[float] | np.ndarray, *, tail: str = "") -> Path:
    values = 100 + 10 * np.sin(np.arange(len(times)) / 20)
    path.write_text("t,rps\n" + "".join(f"{t:.0f},{v:.3f}\n" for t, v in
                                         zip(times, values, strict=True)) + tail)
    return path


def _minutes(n: int = 240, *, start: float = T0, scale: float = 1.0) -> np.ndarray:
    """n one-minute rows, in seconds times ``scale`` (1000 for milliseconds)."""
    return (start + 60.0 * np.arange(n)) * scale


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], *,
         strict: bool = False) -> tuple[int, str, str]:
    """Exit code (from argparse too), stdout, stderr; with ``strict`` a warning (numpy's on a
    zero resolution) fails the test."""
    with warnings.catch_warnings():
        if strict:
            warnings.simplefilter("error")
        try:
            code = main(["forecast", "backtest", *argv])
        except SystemExit as exc:
            code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def _series_argv(series: Path, out: Path, *extra: str) -> list[str]:
    return ["--series", str(series), "--time-col", "t", "--value-col", "rps",
            "--horizons", "5m", "--no-plots", "--out", str(out), *extra]


# -- 1. a short row ------------------------------------------------------------------------------

@pytest.mark.parametrize(("tail", "line"), [
    ("1\n", 242),          # the last row holds only a time
    ("1", 242),            # ... without a final newline
    ("\n\n1\n", 244),      # blank lines before it still count
    (f"{T0 + 240 * 60},\n", None),  # an empty value is a missing one, not a bad row
], ids=["short-last-row", "no-final-newline", "after-blank-lines", "empty-value"])
def test_a_short_row_names_its_line(tail: str, line: int | None, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv", _minutes(), tail=tail)
    out = tmp_path / "bt"
    code, _, err = _run(_series_argv(series, out), capsys)
    if line is None:
        assert code == 0, err
        return
    assert code == 2
    assert f"{series}, line {line}, column 'rps': missing" in err
    assert "--skip-bad-rows" in err and not out.exists()


def test_skip_bad_rows_skips_and_says_so(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv", _minutes(), tail="1\nnot-a-time,5\n")
    out = tmp_path / "bt"
    code, stdout, err = _run(_series_argv(series, out, "--skip-bad-rows"), capsys)
    assert code == 0, err
    assert "note: skipped 2 malformed row(s)" in stdout
    report = json.loads((out / "backtest.json").read_text())
    assert "skipped 2 malformed row(s)" in report["series_notes"]


def test_a_csv_that_is_not_utf8_names_the_file(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    series = tmp_path / "s.csv"
    series.write_bytes(b"t,rps\n0,1\n60,\xff\n")
    code, _, err = _run(_series_argv(series, tmp_path / "bt"), capsys)
    assert code == 2 and f"{series}: not UTF-8" in err


# -- 2. times in another unit ----------------------------------------------------------------

@pytest.mark.parametrize(("times", "unit_given", "says"), [
    (_minutes(scale=1e3), None, "they look like epoch milliseconds: pass --time-unit ms"),
    (_minutes(scale=1e6), None, "they look like epoch microseconds: pass --time-unit us"),
    (_minutes(scale=1e6), "ms", "they look like epoch microseconds: pass --time-unit us"),
    (_minutes(start=0, scale=1e3), None, "milliseconds (they look like it), pass --time-unit ms"),
    (_minutes(start=0, scale=1e6), None, "microseconds (they look like it), pass --time-unit us"),
], ids=["epoch-ms", "epoch-us", "epoch-us-as-ms", "relative-ms", "relative-us"])
def test_times_that_cannot_be_the_unit_are_refused(
        times: np.ndarray, unit_given: str | None, says: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Epoch milliseconds read as seconds made 1,440 one-minute rows 1.4 million steps, 99.9 %
    empty, and the backtest ran on them (exit 0, MASE nan)."""
    series = _csv(tmp_path / "s.csv", times)
    out = tmp_path / "bt"
    extra = ["--time-unit", unit_given] if unit_given else []
    code, stdout, err = _run(_series_argv(series, out, *extra), capsys)
    assert code == 2, stdout
    assert f"{series}, column 't'" in err and says in err
    assert not out.exists()


def test_time_unit_ms_reads_milliseconds(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv", _minutes(scale=1e3))
    out = tmp_path / "bt"
    code, stdout, err = _run(_series_argv(series, out, "--time-unit", "ms"), capsys)
    assert code == 0, err
    report = json.loads((out / "backtest.json").read_text())
    assert report["train_steps"] == 168  # 0.7 of 240 one-minute steps
    assert "note:" not in stdout  # no gaps: every step observed


@pytest.mark.parametrize(("spacing_s", "says"), [
    (300, "a median 300 seconds apart, 5x the resolution of 1m, so about 80% of the steps would "
          "be empty; if the times are not seconds, pass --time-unit (s, ms, us or ns); if the "
          "rows really are that far apart, pass --resolution 5m or coarser"),
    (86400, "pass --resolution 1d or coarser"),
], ids=["5m-rows", "daily-rows"])
def test_rows_far_apart_for_the_resolution_are_refused(
        spacing_s: int, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv", T0 + spacing_s * np.arange(240.0))
    code, _, err = _run(_series_argv(series, tmp_path / "bt"), capsys)
    assert code == 2 and says in err


def test_a_series_with_gaps_says_how_much_is_missing(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Missing steps are printed as notes with their share, not only kept in the report."""
    times = np.concatenate([_minutes(200), _minutes(100, start=T0 + 60 * 260)])
    series = _csv(tmp_path / "s.csv", times)
    code, stdout, err = _run(_series_argv(series, tmp_path / "bt"), capsys)
    assert code == 0, err
    assert "note: 60 of 360 step(s) (16.7%) left missing" in stdout


# -- 3. option values ------------------------------------------------------------------------

_OPTION_CASES = [
    # (source, option, value, what the message says), source "series": a 240-minute CSV
    ("series", "--resolution", "0s", "expected a duration of at least 1s"),
    ("trace", "--resolution", "0s", "expected a duration of at least 1s"),
    ("series", "--resolution", "500ms", "expected a duration of at least 1s"),
    ("series", "--resolution", "ten minutes", "such as 1m, 30s or 1h"),
    ("series", "--horizons", "", "expected comma-separated durations such as 5m,30m"),
    ("trace", "--horizons", "", "expected comma-separated durations such as 5m,30m"),
    ("series", "--horizons", " , ", "expected comma-separated durations such as 5m,30m"),
    ("series", "--horizons", "5m,soon", "expected a duration of at least 1s"),
    ("series", "--horizons", "30s", "30s is shorter than the resolution (1m)"),
    ("series", "--horizons", "90s", "90s is not a whole number of 1m steps"),
    ("series", "--quantiles", "abc", "expected increasing quantiles between 0 and 1"),
    ("trace", "--quantiles", "abc", "expected increasing quantiles between 0 and 1"),
    ("series", "--quantiles", "", "expected increasing quantiles between 0 and 1"),
    ("series", "--quantiles", "0.5,1", "expected increasing quantiles between 0 and 1"),
    ("series", "--quantiles", "0.9,0.5", "expected increasing quantiles between 0 and 1"),
    ("series", "--quantiles", "0.5,nan", "expected increasing quantiles between 0 and 1"),
    ("series", "--train-fraction", "0", "expected a fraction between 0 and 1 (exclusive)"),
    ("series", "--train-fraction", "1", "expected a fraction between 0 and 1 (exclusive)"),
    ("series", "--train-fraction", "0.999", "trains on 240 and leaves 0 to test"),
    ("series", "--train-fraction", "0.001", "trains on 0 and leaves 240 to test"),
    ("series", "--train-days", "1", "1 day(s) is 1440 steps of 1m, and the series has 240"),
    ("trace", "--time-unit", "ms", "applies to the numeric times of --series"),
]


@pytest.mark.parametrize(("source", "option", "value", "says"), _OPTION_CASES,
                         ids=[f"{c[0]}{c[1]}={c[2] or 'empty'}" for c in _OPTION_CASES])
def test_option_values_are_usage_errors_naming_the_option(
        source: str, option: str, value: str, says: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--resolution 0s` said "'minlength' must not be negative" with numpy warnings,
    `--horizons ""` "zero-size array...", `--quantiles abc` "could not convert string to
    float", `--train-fraction 0` that the training part must leave 31 steps to test."""
    out = tmp_path / "bt"
    if source == "trace":
        argv = ["--trace", "synthetic", "--no-plots", "--out", str(out)]
    else:
        series = _csv(tmp_path / "s.csv", _minutes())
        argv = [a for a in _series_argv(series, out) if a not in ("--horizons", "5m")]
    code, _, err = _run([*argv, f"{option}={value}"], capsys, strict=True)
    assert code == 2
    assert err.startswith("usage: pdscale forecast backtest")
    assert f"pdscale forecast backtest: error: argument {option}: " in err
    assert says in err and "such as" in err  # what was expected, with an example
    assert not out.exists()


def test_train_fraction_example_fits_a_short_series(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The example a refusal gives works: 0.7 of 40 steps leaves too little to test 31."""
    series = _csv(tmp_path / "s.csv", _minutes(40))
    argv = [a for a in _series_argv(series, tmp_path / "bt") if a not in ("--horizons", "5m")]
    code, _, err = _run([*argv, "--horizons", "30m", "--train-fraction", "0.9"], capsys)
    assert code == 2 and "such as 0.138" in err
    code, _, err = _run([*argv, "--horizons", "30m", "--train-fraction", "0.138"], capsys)
    assert code == 0, err


def test_a_series_too_short_for_the_horizons(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv", _minutes(20))
    argv = [a for a in _series_argv(series, tmp_path / "bt") if a not in ("--horizons", "5m")]
    code, _, err = _run([*argv, "--horizons", "30m"], capsys)
    assert code == 2
    assert "the series has 20 steps of 1m: too short to train on 2 and test 31" in err


def test_series_from_requests_refuses_a_resolution_of_zero() -> None:
    with pytest.raises(SeriesError, match="resolution must be positive"):
        series_from_requests(np.array([0.0, 1.0]), np.ones(2), np.ones(2), resolution_s=0)


# -- 4. help ---------------------------------------------------------------------------------

def _backtest_help() -> str:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    forecast_parser = sub.choices["forecast"]
    sub = next(a for a in forecast_parser._actions
               if isinstance(a, argparse._SubParsersAction))
    text: str = sub.choices["backtest"].format_help()
    return text


@pytest.mark.parametrize(("option", "shows"), [
    ("--resolution", "(default: 1m)"),
    ("--horizons", "(default: 5m,30m)"),
    ("--quantiles", "(default: 0.5,0.9)"),
    ("--train-fraction", "(default: 0.7)"),
    ("--seed", "(default: 0)"),
    ("--time-unit", "(default: s)"),
    ("--period", "(default: 86400"),
])
def test_help_shows_each_default(option: str, shows: str) -> None:
    text = _backtest_help()
    block = text.split(f"\n  {option} ", 1)[1].split("\n  -", 1)[0]
    assert shows in " ".join(block.split())


def test_help_has_examples() -> None:
    text = _backtest_help()
    assert "examples:\n  pdscale forecast backtest --series" in text
    assert "--time-unit ms" in text


# -- 5. progress -----------------------------------------------------------------------------

def test_backtest_reports_each_model_before_fitting_it() -> None:
    series = regularize(_minutes(), np.ones(240), resolution_s=60)
    calls: list[tuple[str, int, int]] = []
    models = {"a": LastValue(), "b": LastValue()}
    backtest(series, models, horizons_s=[300], train_steps=100, season_steps=1440,
             progress=lambda *call: calls.append(call))
    assert calls == [("a", 0, 2), ("b", 1, 2)]


@pytest.mark.parametrize("long_from", [1, 10**9], ids=["long", "short"])
def test_progress_goes_to_stderr_for_a_long_series(
        long_from: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast, "_PROGRESS_MIN_STEPS", long_from)
    series = _csv(tmp_path / "s.csv", _minutes())
    code, stdout, err = _run(_series_argv(series, tmp_path / "bt"), capsys)
    assert code == 0, err
    assert "backtest:" not in stdout
    if long_from == 1:
        lines = err.splitlines()
        assert lines[0].startswith(f"backtest: 240 steps of 1m from {series} (")
        assert any(line.startswith("backtest: gbqr (3/3): fitting on 168 steps, forecasting "
                                   "from 68 origins (") for line in lines)
    else:
        assert err == ""
