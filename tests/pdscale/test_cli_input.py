"""Bad input to the CLI exits 2 with one line naming the fix, never a traceback: out-of-range
numbers, a window that is not a duration, a corrupt or missing trace, a corrupt state file of
`pdscale up`; and a fuzz of every numeric option."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdscale.cli import build_parser, main
from tests.conftest import ROOT

VLLM = str(ROOT / "examples" / "vllm.yaml")


@pytest.mark.parametrize(("argv", "says"), [
    (["simulate", "--spec", VLLM, "--cold-start", "-5", "--out", "o"], "--cold-start"),
    (["simulate", "--spec", VLLM, "--prefix-hit", "2", "--out", "o"], "--prefix-hit"),
    (["simulate", "--spec", VLLM, "--duration", "0", "--out", "o"], "--duration"),
    (["simulate", "--spec", VLLM, "--speed", "nan", "--out", "o"], "--speed"),
    (["demo", "--hours", "0"], "--hours"),
    (["demo", "--seed", "-1"], "--seed"),
    (["up", "--speed", "0"], "--speed"),
    (["up", "--speed", "-3"], "--speed"),
    (["query", VLLM, "--service", "llama-chat", "--pool", "prefill", "--signal", "ttft_p95_s",
      "--window", 'abc"}'], "--window"),
    (["forecast", "backtest", "--trace", "synthetic", "--period", "-5", "--out", "o"],
     "--period"),
], ids=["cold-start", "prefix-hit", "duration", "speed-nan", "hours", "seed", "up-speed-0",
        "up-speed-neg", "window", "period"])
def test_out_of_range_options_exit_2_naming_the_option(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "expected" in err and "Traceback" not in err


@pytest.mark.parametrize("make", ["corrupt-gz", "truncated-gz", "folder"])
def test_unreadable_traces_exit_2(make: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    if make == "folder":
        trace = tmp_path
    else:
        trace = tmp_path / "t.jsonl.gz"
        if make == "corrupt-gz":
            trace.write_bytes(b"not gzip at all")
        else:
            good = gzip.compress(b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                                 * 200)
            trace.write_bytes(good[: len(good) // 2])
    out = tmp_path / "out"
    code = main(["simulate", "--spec", VLLM, "--trace", str(trace), "--format", "mooncake",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(trace) in err and not out.exists()


def test_out_is_checked_before_the_simulation(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["simulate", "--spec", VLLM, "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "not written by pdscale" in err and "Nothing was run" in err
    assert (mine / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("text", ["{bad", "[]", '{"processes": [{"pid": "x"}]}', ""],
                         ids=["not-json", "list", "bad-pid", "empty"])
def test_a_corrupt_up_state_file_exits_2(text: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "up.json").write_text(text)
    assert main(["down", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "up.json" in err and "by hand" in err
    assert (tmp_path / "up.json").exists()  # nothing lost: the user still has the file


# -- fuzz: every numeric option of every command ---------------------------------------------

_REQUIRED = {
    ("simulate",): ["--spec", VLLM, "--out", "o"],
    ("run",): ["--spec", VLLM],
    ("forecast", "backtest"): ["--trace", "synthetic", "--out", "o"],
    ("trace", "stats"): ["synthetic"],
    ("query",): [VLLM, "--service", "llama-chat", "--pool", "prefill", "--signal", "x"],
    ("generate",): ["all", VLLM, "--out", "o"],
    ("validate",): [VLLM],
}


def _numeric_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) for every option with a numeric type, nested commands too."""
    import argparse

    out: list[tuple[tuple[str, ...], str]] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for opt in parser._actions:
            if isinstance(opt, argparse._SubParsersAction):
                for name, sub in opt.choices.items():
                    walk(sub, (*path, name))
            elif opt.option_strings and getattr(opt.type, "__name__", "") in (
                    "positive", "non-negative", "fraction", "_seed", "int", "float"):
                out.append((path, opt.option_strings[0]))

    walk(build_parser(), ())
    return out


NUMERIC = _numeric_options()


def test_the_fuzz_covers_the_numeric_options() -> None:
    covered = {" ".join((*path, flag)) for path, flag in NUMERIC}
    for must in ("simulate --cold-start", "simulate --prefix-hit", "demo --hours",
                 "up --speed", "forecast backtest --period", "simulate --duration"):
        assert must in covered, (must, sorted(covered))


_values = st.one_of(
    st.sampled_from(["0", "-0", "-1", "1e309", "-1e309", "nan", "inf", "1e-320", "2", "0.5",
                     "", "x", "1,5", "10**9", "0x10"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**12, 10**12).map(str))


@settings(max_examples=150, deadline=None)
@given(option=st.sampled_from(NUMERIC), value=_values)
def test_numeric_options_parse_or_exit_2(option: tuple[tuple[str, ...], str],
                                         value: str) -> None:
    """Parsing alone (no command runs): a value is accepted in range, else argparse exits 2
    with a message, never a traceback."""
    path, flag = option
    argv = [*path, *_REQUIRED.get(path, []), f"{flag}={value}"]
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
        assert "error:" in err.getvalue() and "Traceback" not in err.getvalue()
        return
    parsed = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert parsed == parsed  # not NaN
    assert parsed is None or abs(parsed) < float("inf")


def test_webhook_state_file_is_json(tmp_path: Path) -> None:
    """The up state a stack writes reads back through the same checks (no false alarm)."""
    state = {"processes": [{"name": "prometheus", "pid": 1 << 22}]}
    (tmp_path / "up.json").write_text(json.dumps(state))
    assert main(["down", "--dir", str(tmp_path)]) == 0


@pytest.mark.parametrize("url", ["localhost:9090", "http://", "http://[::1",
                                 "http://127.0.0.1:99999", "ftp://prometheus:9090"])
@pytest.mark.parametrize("command", [["run", "--spec", VLLM, "--prometheus-url"],
                                     ["check", VLLM, "--prometheus"]], ids=["run", "check"])
def test_a_prometheus_url_that_is_not_one_exits_2_before_anything_starts(
        command: list[str], url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`run --prometheus-url localhost:9090` used to start, say it was controlling the pools,
    and stop its loop on the first tick with a traceback."""
    with pytest.raises(SystemExit) as info:
        main([*command, url])
    assert info.value.code == 2
    said = capsys.readouterr().err
    assert "an http(s) URL with a host" in said and "Traceback" not in said


def test_the_spec_refuses_a_url_without_its_scheme(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "examples" / "vllm.yaml").read_text()
    assert "controller:" not in text.split("services:")[0]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text + "\ncontroller:\n  prometheus: {url: \"localhost:9090\"}\n")
    assert main(["validate", str(spec)]) == 2
    said = capsys.readouterr().err
    assert "controller.prometheus.url: expected an http(s) URL with a host" in said
    assert "'localhost:9090'" in said


def test_a_kubeconfig_that_is_not_yaml_exits_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nclusters: [\n  - {name: x\n")
    code = main(["run", "--spec", VLLM, "--kubeconfig", str(config), "--dry-run",
                 "--prometheus-url", "http://127.0.0.1:9"])
    assert code == 2
    said = capsys.readouterr().err
    assert f"kubeconfig {config} is not a readable kubeconfig" in said
    assert "Traceback" not in said
