"""Bad input to ``pdscale simulate`` (and its trace loaders) exits 2 with one line naming the
fix, never a traceback.

Covered: a missing, folder or truncated trace whose format is found from its contents; a
Mooncake trace saved as one JSON array, or with a row that is not an object; non-finite
timestamps, token counts and ServeGen rates.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pdscale.cli import main
from simulator import TraceError, load_trace
from tests.conftest import ROOT

VLLM = str(ROOT / "examples" / "vllm.yaml")
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
SERVEGEN_HEADER = "client_id,window_start_s,rate_rps,cv,arrival_dist,dist_param1,dist_param2\n"


def _burstgpt(path: Path, stamps: list[str], *, tokens: str = "100") -> Path:
    path.write_text(BURSTGPT_HEADER + "".join(f"{t},m,{tokens},20,120,x\n" for t in stamps))
    return path


def _small_trace(tmp_path: Path) -> Path:
    """A BurstGPT trace of 100 s: a request every 5 s (a run takes well under a second)."""
    return _burstgpt(tmp_path / "small_burstgpt.csv", [str(t) for t in range(0, 101, 5)])


def _exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command; it must exit 2 (returned or by argparse) without a traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.strip()
    return err


# -- unreadable trace files --------------------------------------------------------------------


def _truncated_gzip(path: Path, header: str, row: str) -> Path:
    whole = gzip.compress((header + row * 400).encode())
    path.write_bytes(whole[: len(whole) // 2])
    return path


@pytest.mark.parametrize(("make", "says"), [
    ("missing", "no such file"),
    ("folder", "a folder"),
    ("truncated-gz", "EOFError"),
    ("missing-servegen", "no such file"),
    ("truncated-servegen", "EOFError"),
], ids=["missing", "folder", "truncated-gz", "missing-servegen", "truncated-servegen"])
def test_unreadable_trace_without_format_exits_2(make: str, says: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Without --format the format is found from the file's header, which was read before the
    loader's own checks (a FileNotFoundError, IsADirectoryError or EOFError traceback); a
    ServeGen trace in fluid mode is aggregated without the loader at all."""
    extra: list[str] = []
    if make == "missing":
        trace = tmp_path / "nofile"
    elif make == "folder":
        trace = tmp_path / "traces"
        trace.mkdir()
    elif make == "truncated-gz":
        trace = _truncated_gzip(tmp_path / "t.gz", BURSTGPT_HEADER, "0,m,1,1,2,x\n")
    elif make == "missing-servegen":
        trace, extra = tmp_path / "nofile.csv", ["--format", "servegen"]
    else:
        trace = _truncated_gzip(tmp_path / "x_servegen.csv.gz", SERVEGEN_HEADER,
                                "1,0,1,1,Gamma,1,1\n")
    out = tmp_path / "out"
    err = _exit_2(["simulate", "--spec", VLLM, "--trace", str(trace), *extra,
                   "--out", str(out)], capsys)
    assert str(trace) in err and says in err
    assert not out.exists()


# -- Mooncake: JSON array, rows that are not objects ------------------------------------------

_ROWS = [{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1, 2]},
         {"timestamp": 1500, "input_length": 700, "output_length": 30, "hash_ids": [1, 3]}]


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "pretty"])
def test_a_mooncake_json_array_reads_as_its_json_lines(indent: int | None,
                                                       tmp_path: Path) -> None:
    lines = tmp_path / "a_mooncake.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in _ROWS))
    array = tmp_path / "b_mooncake.json"
    array.write_text(json.dumps(_ROWS, indent=indent))
    want, got = load_trace(lines), load_trace(array)
    assert list(got.arrival_s) == list(want.arrival_s) == [0.0, 1.5]
    assert list(got.prompt_tokens) == [100, 700] and list(got.output_tokens) == [10, 30]
    assert got.hash_ids is not None and [list(h) for h in got.hash_ids] == [[1, 2], [1, 3]]


def test_mooncake_array_rows_are_checked_and_skipped_as_rows(tmp_path: Path) -> None:
    path = tmp_path / "t_mooncake.json"
    path.write_text(json.dumps([_ROWS[0], "oops", {**_ROWS[1], "timestamp": -5}, _ROWS[1]]))
    with pytest.raises(TraceError, match=r"request 2, column '\(row\)'.*got str"):
        load_trace(path)
    trace = load_trace(path, skip_bad_rows=True)
    assert len(trace) == 2 and trace.skipped_rows == 2


def test_a_broken_mooncake_array_says_what_is_expected(tmp_path: Path) -> None:
    path = tmp_path / "t_mooncake.json"
    path.write_text(json.dumps(_ROWS)[:-5])
    for skip in (False, True):  # not one bad row: the file as a whole
        with pytest.raises(TraceError, match=r"not a JSON array.*JSON lines"):
            load_trace(path, skip_bad_rows=skip)


def test_a_json_lines_row_that_is_not_an_object_is_a_bad_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t_mooncake.jsonl"
    path.write_text(json.dumps(_ROWS[0]) + "\n[1, 2]\n7\n" + json.dumps(_ROWS[1]) + "\n")
    err = _exit_2(["trace", "stats", str(path)], capsys)
    assert "line 2" in err and "expected a JSON object" in err and "--skip-bad-rows" in err
    assert main(["trace", "stats", str(path), "--skip-bad-rows"]) == 0
    assert "skipped 2 malformed row(s)" in capsys.readouterr().out


# -- non-finite numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "1e999"])
def test_non_finite_burstgpt_timestamps_are_bad_rows(bad: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = _burstgpt(tmp_path / "t_burstgpt.csv", ["0", "5", bad, "10"])
    err = _exit_2(["trace", "stats", str(path)], capsys)
    assert "line 4, column 'Timestamp'" in err and repr(bad) in err
    trace = load_trace(path, skip_bad_rows=True)
    assert list(trace.arrival_s) == [0.0, 5.0, 10.0] and trace.skipped_rows == 1
    assert main(["trace", "stats", str(path), "--skip-bad-rows"]) == 0


@pytest.mark.parametrize("bad", ["inf", "nan", "1e999"])
def test_non_finite_token_counts_are_bad_rows(bad: str, tmp_path: Path) -> None:
    path = _burstgpt(tmp_path / "t_burstgpt.csv", ["0"])
    path.write_text(path.read_text() + f"5,m,{bad},20,1,x\n")
    with pytest.raises(TraceError, match=r"line 3, column 'Request tokens'"):
        load_trace(path)
    assert load_trace(path, skip_bad_rows=True).skipped_rows == 1


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_mooncake_numbers_are_bad_rows(bad: str, tmp_path: Path) -> None:
    path = tmp_path / "t_mooncake.jsonl"
    path.write_text(json.dumps(_ROWS[0]) + "\n"
                    f'{{"timestamp": {bad}, "input_length": 5, "output_length": 5}}\n'
                    f'{{"timestamp": 9, "input_length": {bad}, "output_length": 5}}\n'
                    + json.dumps(_ROWS[1]) + "\n")
    with pytest.raises(TraceError, match=r"line 2, column 'timestamp'.*finite"):
        load_trace(path)
    trace = load_trace(path, skip_bad_rows=True)
    assert len(trace) == 2 and trace.skipped_rows == 2


@pytest.mark.parametrize("bad", ["inf", "nan", "-1"])
@pytest.mark.parametrize("mode", [["--mode", "fluid"], ["--mode", "event", "--duration", "900"]],
                         ids=["fluid", "event"])
def test_a_non_finite_servegen_rate_exits_2_naming_the_row(
        bad: str, mode: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x_servegen.csv"
    path.write_text(SERVEGEN_HEADER + "1,0,0.5,1,Gamma,1,2\n" + f"1,600,{bad},1,Gamma,1,2\n")
    out = tmp_path / "out"
    err = _exit_2(["simulate", "--spec", VLLM, "--trace", str(path), *mode, "--out", str(out)],
                  capsys)
    assert "line 3, column 'rate_rps'" in err and repr(bad) in err
    assert "--skip-bad-rows" not in err  # which does not apply to ServeGen's rate windows
    assert not out.exists()
