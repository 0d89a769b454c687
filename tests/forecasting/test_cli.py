from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pdscale.cli import main


def _csv(path: Path, days: int = 12) -> Path:
    rng = np.random.default_rng(0)
    t = np.arange(days * 144) * 600.0
    v = 100 * (1 + 0.5 * np.sin(2 * np.pi * t / 86400)) * (1 + 0.05 * rng.standard_normal(len(t)))
    lines = ["time,rate"] + [f"{a:.0f},{b:.3f}" for a, b in zip(t, v, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_backtest_series_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _csv(tmp_path / "s.csv")
    out = tmp_path / "bt"
    assert main(["forecast", "backtest", "--series", str(series), "--time-col", "time",
                 "--value-col", "rate", "--resolution", "10m", "--horizons", "10m,30m",
                 "--train-days", "10", "--out", str(out)]) == 0
    report = json.loads((out / "backtest.json").read_text())
    for model in ("last_value", "seasonal_naive", "exp_smoothing", "gbqr"):
        for h in ("10m", "30m"):
            entry = report["models"][model][h]
            assert {"mae", "smape", "mase", "pinball", "coverage_q90"} <= set(entry)
            assert set(entry["pinball"]) == {"0.5", "0.9"}
    assert (out / "forecast.png").read_bytes()[:4] == b"\x89PNG"
    assert "gbqr" in capsys.readouterr().out


def test_backtest_from_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "bt"
    assert main(["forecast", "backtest", "--trace", "synthetic", "--resolution", "1m",
                 "--horizons", "5m", "--no-plots", "--out", str(out)]) == 0
    assert "gbqr" in json.loads((out / "backtest.json").read_text())["models"]


@pytest.mark.parametrize(("args", "message"), [
    (["--horizons", "30s"], "shorter than the resolution"),
    (["--value-col", "nope"], "no column 'nope'"),
    (["--resolution", "ten minutes"], "expected a duration"),
])
def test_backtest_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            args: list[str], message: str) -> None:
    series = _csv(tmp_path / "s.csv")
    base = ["forecast", "backtest", "--series", str(series), "--time-col", "time",
            "--value-col", "rate", "--resolution", "10m", "--out", str(tmp_path / "o")]
    merged = base + args
    assert main(merged) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_non_monotonic_time_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.csv"
    path.write_text("time,rate\n0,1\n1200,2\n600,3\n")
    assert main(["forecast", "backtest", "--series", str(path), "--time-col", "time",
                 "--value-col", "rate", "--resolution", "10m", "--horizons", "10m",
                 "--out", str(tmp_path / "o")]) == 2
    assert "not monotonic" in capsys.readouterr().err
