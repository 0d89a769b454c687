"""Bad input to ``pdscale simulate`` (and its trace loaders) exits 2 with one line naming the
fix, never a traceback; Ctrl-C during ``simulate`` or ``demo`` exits 130 with one line and
leaves no half-written output.

Covered: a missing, folder or truncated trace whose format is found from its contents; a
Mooncake trace saved as one JSON array, or with a row that is not an object; non-finite
timestamps, token counts and ServeGen rates; ``--fail`` outside the replay; a live port out of
range or taken; Ctrl-C while simulating and while writing.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdscale.cli import build_parser, main
from pdscale.simulator import TraceError, load_trace
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


# -- --fail ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fail", "says"), [
    ("5000:decode", "within [0, 600) seconds (--duration)"),
    ("600:prefill", "within [0, 600) seconds (--duration)"),
    ("inf:decode", "finite number >= 0"),
    ("nan:decode", "finite number >= 0"),
    ("-10:decode", "finite number >= 0"),
], ids=["after-end", "at-end", "inf", "nan", "negative"])
def test_a_failure_outside_the_replay_exits_2(fail: str, says: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A failure after the replay's end lengthened the run (5000 s with --duration 600: 8x the
    GPU-hours); an infinite one made GPU-hours NaN."""
    out = tmp_path / "out"
    err = _exit_2(["simulate", "--spec", VLLM, "--trace", str(_small_trace(tmp_path)),
                   "--duration", "600", f"--fail={fail}", "--out", str(out)], capsys)
    assert says in err and fail in err
    assert not out.exists()


def test_without_duration_failures_must_fall_in_the_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_small_trace(tmp_path))
    err = _exit_2(["simulate", "--spec", VLLM, "--trace", trace, "--fail", "30:decode",
                   "--fail", "150:prefill", "--out", str(tmp_path / "late")], capsys)
    assert "--fail 150:prefill" in err and "[0, 100) seconds (the trace's length)" in err
    out = tmp_path / "ok"
    capsys.readouterr()
    assert main(["simulate", "--spec", VLLM, "--trace", trace, "--fail", "30:decode",
                 "--fail", "0:prefill", "--no-plots", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 21
    # Both came due within the run (t=0 finds no prefill replica ready yet, or takes one);
    # the report says what each did.
    failed = summary["failures"]
    assert failed["asked"] == 2 and failed["after_the_run"] == 0
    assert failed["took_a_replica"] + failed["no_ready_replica"] == 2
    assert "failures: 2 asked" in capsys.readouterr().out


def test_in_fluid_servegen_failures_must_fall_in_its_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ServeGen in fluid mode has no request trace: the replay is its rate windows."""
    path = tmp_path / "x_servegen.csv"
    path.write_text(SERVEGEN_HEADER + "1,0,0.5,1,Gamma,1,2\n1,600,1,1,Gamma,1,2\n")
    err = _exit_2(["simulate", "--spec", VLLM, "--trace", str(path), "--fail", "5000:decode",
                   "--out", str(tmp_path / "out")], capsys)
    assert "[0, 1200) seconds (the trace's length)" in err


# -- the live port -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["99999", "-1", "65536", "http", "80.5"])
def test_a_port_out_of_range_exits_2(value: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    err = _exit_2(["simulate", "--spec", VLLM, "--live", f"--port={value}",
                   "--out", str(tmp_path / "out")], capsys)
    assert "--port" in err and "0 to 65535" in err


@settings(max_examples=60, deadline=None)
@given(port=st.one_of(st.integers(-10**6, 10**6).map(str),
                      st.sampled_from(["", "0x10", "1e3", " 80", "nan"])))
def test_port_parses_in_range_or_exits_2(port: str) -> None:
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args = build_parser().parse_args(["simulate", "--spec", VLLM, "--out", "o",
                                              f"--port={port}"])
        except SystemExit as exc:
            assert exc.code == 2
            return
    assert 0 <= args.port <= 65535


@pytest.mark.parametrize("when", ["checked-first", "taken-while-preparing"])
def test_a_busy_live_port_exits_2(when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The port is checked before the trace loads (as ``pdscale run`` checks --listen); one
    taken between that check and the server's bind is reported the same way."""
    if when == "taken-while-preparing":
        from pdscale._cli import run

        monkeypatch.setattr(run, "_port_busy", lambda host, port: None)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGINT)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        err = _exit_2(["simulate", "--spec", VLLM, "--trace", str(_small_trace(tmp_path)),
                       "--live", "--port", str(port), "--out", str(out)], capsys)
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert not out.exists()
    assert signal.getsignal(signal.SIGINT) is before  # the live run's handlers are put back


# -- Ctrl-C ------------------------------------------------------------------------------------


def _interrupt(*_: Any, **__: Any) -> Any:
    raise KeyboardInterrupt


def _main_under_ctrl_c(argv: list[str]) -> int:
    """``main``, failing the test (not ending the session) if KeyboardInterrupt escapes it."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped pdscale: the user sees a traceback")


@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_ctrl_c_while_simulating_writes_nothing(command: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import pdscale.simulator as simulator

    monkeypatch.setattr(simulator, "simulate" if command == "simulate" else "compare_policies",
                        _interrupt)
    out = tmp_path / "out"
    assert _main_under_ctrl_c([command, "--spec", VLLM, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "pdscale: interrupted; nothing written"
    assert "Traceback" not in err and not out.exists()
    assert not list(tmp_path.iterdir())  # no staging folder either


@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_ctrl_c_while_writing_finishes_the_write(command: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C between staging the output and renaming it into place would leave a hidden
    half-written folder beside --out: it is held until the write is done, then reported."""
    import pdscale._io

    real = pdscale._io.write_tree

    def write_tree(target: Path, files: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives as the write begins
        real(target, files)

    monkeypatch.setattr(pdscale._io, "write_tree", write_tree)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGINT)
    argv = (["simulate", "--trace", str(_small_trace(tmp_path)), "--no-plots"]
            if command == "simulate" else ["demo", "--hours", "0.05", "--policies", "static"])
    assert _main_under_ctrl_c([*argv, "--spec", VLLM, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"pdscale: interrupted; wrote {out} in full"
    assert (out / ".pdscale-generated").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_during_demo_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    """A real SIGINT to a real process, once the demo is running."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pdscale", "demo", "--spec", VLLM,
                             "--hours", "6", "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # Ctrl-C's default even where this runs with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    first = proc.stderr.readline()  # printed just before the policies run
    assert first.startswith("pdscale demo:"), first
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest
    assert rest.strip().splitlines()[-1] == "pdscale: interrupted; nothing written", rest
    assert "Traceback" not in rest and not out.exists()


def test_exit_130_after_an_interrupt_raised_inside_exec() -> None:
    """CPython 3.11 ends a process by SIGINT once a KeyboardInterrupt was raised inside
    ``exec`` of a string (as ``dataclasses`` does while a module imports), caught or not: the
    entry point still exits 130, with the command's message flushed."""
    program = ("import sys\n"
               "import pdscale.cli as cli\n"
               "def main():\n"
               "    try:\n"
               "        exec('raise KeyboardInterrupt')\n"
               "    except KeyboardInterrupt:\n"
               "        print('pdscale: interrupted; nothing written', file=sys.stderr)\n"
               "        return 130\n"
               "cli.main = main\n"
               "cli.run()\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "pdscale: interrupted; nothing written\n"
