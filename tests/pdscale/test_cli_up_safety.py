"""`pdscale up` and `pdscale down` never harm what is not theirs: `up` refuses a folder it did
not create (the user's spec.yaml and prometheus.yml stay as they were), a --dir that is a file
or cannot be written is one line and exit 2, and `down` signals a recorded PID only while it is
still the process `up` started (a reused PID is left alone, and does not block the next `up`).

No stack is started: `_start` is replaced by a fake, and the processes are `sleep`s this test
starts and stops itself."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import pdscale._cli.up as up_cli
from pdscale._cli._common import load_checked
from pdscale._io import MARKER
from pdscale._servers import ProcessState, process_record, recorded_process
from pdscale.cli import main
from tests.conftest import ROOT

VLLM = str(ROOT / "examples" / "vllm.yaml")

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start a process in its own session, as `pdscale up` does; every one is killed after."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: Sequence[str] = ("sleep", "30")) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(argv), start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """`up` runs to the end without starting anything: the binaries are "found" and `_start`
    records no process. Returns the folders `_start` was called for."""
    calls: list[Path] = []

    def fake_start(stack: Any, folder: Path) -> list[dict[str, Any]]:
        calls.append(folder)
        return []

    monkeypatch.setattr("pdscale._servers.find_binary", lambda name: "/bin/false")
    monkeypatch.setattr(up_cli, "_start", fake_start)
    return calls


@pytest.fixture
def must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever is installed, `up` gets as far as starting the stack, and fails loudly there."""
    def loud(stack: Any, folder: Path) -> None:
        raise AssertionError(f"pdscale up started a stack in {folder}")

    monkeypatch.setattr("pdscale._servers.find_binary", lambda name: "/bin/false")
    monkeypatch.setattr(up_cli, "_start", loud)


def _write_state(folder: Path, processes: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "up.json"
    state.write_text(json.dumps({"processes": processes}))
    return state


def _record(name: str, proc: subprocess.Popen[bytes], **change: Any) -> dict[str, Any]:
    return {"name": name, "pid": proc.pid, "url": "http://127.0.0.1:1",
            **process_record(proc.pid), **change}


def _running(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


# -- 1. a folder that is not pdscale's ----------------------------------------------------------

def test_up_refuses_a_folder_it_did_not_create(
        tmp_path: Path, must_not_start: None, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "spec.yaml").write_text("my spec\n")
    (mine / "prometheus.yml").write_text("my prometheus\n")
    assert main(["up", "--spec", VLLM, "--dir", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "not created by pdscale up" in err and "--dir" in err and MARKER in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in mine.iterdir()) == ["prometheus.yml", "spec.yaml"]
    assert (mine / "spec.yaml").read_text() == "my spec\n"
    assert (mine / "prometheus.yml").read_text() == "my prometheus\n"


def test_up_runs_again_in_the_folder_it_created(
        tmp_path: Path, no_stack: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "stack"
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0, capsys.readouterr().err
    assert (folder / MARKER).is_file() and (folder / "spec.yaml").is_file()
    assert main(["down", "--dir", str(folder)]) == 0
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0, capsys.readouterr().err
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0  # stale up.json: all gone
    assert len(no_stack) == 3


def test_up_takes_a_folder_an_older_pdscale_up_left(
        tmp_path: Path, no_stack: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    """From before the marker: only what `up` writes, its logs among them."""
    folder = tmp_path / ".pdscale-up"
    (folder / "rules").mkdir(parents=True)
    for name in ("spec.yaml", "prometheus.yml", "alertmanager.yml", "controller.log",
                 "simulator.log"):
        (folder / name).write_text("old\n")
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0, capsys.readouterr().err
    assert (folder / MARKER).is_file() and (folder / "spec.yaml").read_text() != "old\n"


# -- 3. a --dir that is a file, or cannot be written --------------------------------------------

@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_up_dir_that_is_a_file_exits_2(where: str, tmp_path: Path, must_not_start: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("keep\n")
    target = file if where == "file" else file / "stack"
    assert main(["up", "--spec", VLLM, "--dir", str(target)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "--dir" in err and "Traceback" not in err
    assert file.read_text() == "keep\n"


@contextlib.contextmanager
def _as_nobody() -> Iterator[None]:
    """Root may write anywhere: it checks permissions as nobody meanwhile (effective ids only,
    given back after)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize("where", ["inside", "itself"])
def test_up_dir_that_cannot_be_written_exits_2(where: str, must_not_start: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    load_checked(VLLM)  # what `up` imports, imported while this process may still read it all
    base = Path(tempfile.mkdtemp(prefix="pdscale-up-ro-"))  # not tmp_path: root's is 0700
    readonly = base / "ro"
    try:
        os.chmod(base, 0o755)
        readonly.mkdir()
        os.chmod(readonly, 0o555)
        target = readonly / "stack" if where == "inside" else readonly
        with _as_nobody():
            code = main(["up", "--spec", VLLM, "--dir", str(target)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "cannot write" in err and "--dir" in err and "Traceback" not in err
        assert list(readonly.iterdir()) == []
    finally:
        os.chmod(readonly, 0o755)
        shutil.rmtree(base)


# -- 2. a recorded PID is signalled only while it is still pdscale's ----------------------------

def test_recorded_process_tells_its_own_process_from_a_reused_pid(
        spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn()
    record = _record("prometheus", proc)
    assert isinstance(record["start_ticks"], int) and record["boot_id"]
    assert recorded_process(record, folder=tmp_path) is ProcessState.OURS
    reused = {**record, "start_ticks": record["start_ticks"] - 1}
    assert recorded_process(reused, folder=tmp_path) is ProcessState.REPLACED
    rebooted = {**record, "boot_id": "another-boot"}
    assert recorded_process(rebooted, folder=tmp_path) is ProcessState.REPLACED
    unknown = {**record, "start_ticks": None}
    assert recorded_process(unknown, folder=tmp_path) is ProcessState.UNCONFIRMED
    # An older up.json (no start time): confirmed only by a command line naming the folder.
    legacy = {"name": "prometheus", "pid": proc.pid}
    assert recorded_process(legacy, folder=tmp_path) is ProcessState.REPLACED
    assert recorded_process(legacy, folder=tmp_path,
                            proc=tmp_path / "no-proc") is ProcessState.UNCONFIRMED
    proc.kill()
    proc.wait(timeout=10)
    assert recorded_process(record, folder=tmp_path) is ProcessState.GONE


def test_down_leaves_a_process_that_reused_a_recorded_pid_alone(
        spawn: Spawn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = spawn()
    ours = spawn()
    state = _write_state(tmp_path, [
        _record("prometheus", stranger, start_ticks=process_record(stranger.pid)["start_ticks"]
                - 100),
        _record("controller", ours)])
    assert main(["down", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert _running(stranger), "down signalled a process pdscale did not start"
    assert "another process" in out and str(stranger.pid) in out
    assert ours.wait(timeout=15) is not None and "controller   stopped" in out
    assert not state.exists()


def test_up_is_not_blocked_by_a_reused_pid(
        spawn: Spawn, tmp_path: Path, no_stack: list[Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    stranger = spawn()
    folder = tmp_path / "stack"
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0  # pdscale's folder
    _write_state(folder, [_record("prometheus", stranger, boot_id="before-the-reboot")])
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 0, capsys.readouterr().err
    assert _running(stranger)
    # ... while a recorded process that is still pdscale's does block it.
    _write_state(folder, [_record("prometheus", stranger)])
    assert main(["up", "--spec", VLLM, "--dir", str(folder)]) == 2
    assert "already up" in capsys.readouterr().err
    assert len(no_stack) == 2


def _wait_for_cmdline(pid: int, text: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never showed {text} in its command line")


def test_down_with_an_older_up_json_stops_only_what_names_its_folder(
        spawn: Spawn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "stack"
    folder.mkdir()
    spec_file = str(folder.resolve() / "spec.yaml")
    ours = spawn([sys.executable, "-c", "import time; time.sleep(30)", "--spec", spec_file])
    _wait_for_cmdline(ours.pid, spec_file)
    stranger = spawn()
    _write_state(folder, [{"name": "simulator", "pid": ours.pid, "url": "u"},
                          {"name": "prometheus", "pid": stranger.pid, "url": "u"}])
    assert main(["down", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert ours.wait(timeout=15) is not None
    assert _running(stranger) and "another process" in out


def test_down_keeps_the_state_of_a_process_it_cannot_confirm(
        spawn: Spawn, tmp_path: Path, must_not_start: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    unknown = spawn()
    state = _write_state(tmp_path, [_record("prometheus", unknown, start_ticks=None)])
    assert main(["down", "--dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert _running(unknown)
    assert "cannot be confirmed" in captured.out and str(unknown.pid) in captured.err
    assert state.exists()  # nothing lost: the PID stays recorded until the user decides
    assert main(["up", "--spec", VLLM, "--dir", str(tmp_path)]) == 2
    assert "cannot tell whether" in capsys.readouterr().err


def test_up_engine_dynamo_records_each_process_with_its_start_time(tmp_path: Path) -> None:
    """`--engine dynamo` writes the same up.json: its processes carry their start time too."""
    from pdscale._dynamo_up import StackUpError, _start

    started: list[dict[str, Any]] = []
    with pytest.raises(StackUpError, match="did not come up"):  # `true` exits at once
        _start("prometheus", ["true"], "http://127.0.0.1:9/", tmp_path, started, "u")
    with contextlib.suppress(ChildProcessError):  # subprocess may have reaped it already
        os.waitpid(started[0]["pid"], 0)
    assert isinstance(started[0]["start_ticks"], int) and started[0]["boot_id"]


# -- an interrupted start -------------------------------------------------------------------------


def test_an_interrupted_start_stops_what_it_started(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM, or a closed stderr) while the stack comes up used to leave the
    processes started so far running with no up.json to find them by."""
    stack = up_cli.LocalStack(
        spec={}, prometheus={}, alertmanager={},
        commands=(("first", ("sleep", "30"), "http://127.0.0.1:1/"),
                  ("second", ("sleep", "30"), "http://127.0.0.1:1/")),
        urls={"first": "http://127.0.0.1:1", "second": "http://127.0.0.1:1"})
    seen: list[int] = []

    def ready_then_interrupt(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> bool:
        seen.append(proc.pid)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return True

    monkeypatch.setattr("pdscale._servers.wait_ready", ready_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        up_cli._start(stack, tmp_path)
    assert len(seen) == 2
    def gone(pid: int) -> bool:  # exited: no longer in the table, or a zombie of this test
        stat = Path(f"/proc/{pid}/stat")
        with contextlib.suppress(OSError):
            return stat.read_text().split(") ")[1].startswith("Z")
        return True

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(gone(pid) for pid in seen):
        time.sleep(0.05)
    assert all(gone(pid) for pid in seen)
    for pid in seen:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
