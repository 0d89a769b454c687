"""`pdscale up` and `pdscale down` own the stack's processes: `down` stops what up.json records
and what carries the stack's marker (a controller restarted by hand), and never reports
success while one is left; an `up` refused because a part still runs writes nothing; `up
--status` lists every part; `up --restart PART` starts one again; options of the other engine
are refused.

The processes are stand-ins this test starts (a `sleep`, a Python HTTP server) under the
names and markers a stack's processes have; the real stack runs in
tests/e2e/test_dynamo_stack.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pdscale._io import MARKER
from pdscale._servers import process_record
from pdscale._upstack import MARKER_ENV, marked_processes
from pdscale.cli import main
from tests.conftest import ROOT, free_port

DYNAMO = str(ROOT / "examples" / "dynamo.yaml")


@pytest.fixture
def spawn() -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None, session: bool = True) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, cwd=cwd,
                                start_new_session=session)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _sleeper(*args: str) -> list[str]:
    """A process that sleeps, with ``args`` on its command line."""
    return [sys.executable, "-c", "import time; time.sleep(60)", *args]


def _wait_marked(folder: Path, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(marked_processes(folder)) < n:
        assert time.monotonic() < deadline, marked_processes(folder)
        time.sleep(0.05)


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _stack_folder(tmp_path: Path) -> Path:
    """A folder a stack ran in (its marker, its spec), with nothing recorded running."""
    folder = tmp_path / "stack"
    (folder / "dynamo").mkdir(parents=True)
    (folder / MARKER).write_text("pdscale up keeps its configuration here\n")
    (folder / "spec.yaml").write_text(Path(DYNAMO).read_text())
    (folder / "up.json").write_text(json.dumps({"processes": [
        {"name": "controller", "pid": 999_999_999, "url": "http://127.0.0.1:1",
         "start_ticks": 1, "boot_id": "x"}]}))
    return folder


def test_down_stops_a_controller_restarted_by_hand_and_the_marked_processes(
        spawn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _stack_folder(tmp_path)
    # A controller run again by hand, from the stack's folder, in the shell's process group.
    by_hand = spawn(_sleeper("pdscale", "run", "--spec", "spec.yaml", "--dynamo-stack",
                             "dynamo"), cwd=folder, session=False)
    # A worker it started: it inherited the marker.
    worker = spawn(_sleeper("worker"), env={MARKER_ENV: str(folder.resolve())})
    # Neither pdscale's nor marked: a shell tailing the stack's log, a pdscale of elsewhere.
    tail = spawn(_sleeper("tail", str(folder / "controller.log")))
    other = spawn(_sleeper("pdscale", "run", "--spec", str(tmp_path / "other.yaml")))
    _wait_marked(folder, 2)
    assert {m.pid for m in marked_processes(folder)} == {by_hand.pid, worker.pid}
    assert [m.is_controller for m in marked_processes(folder)] == [True, False]
    assert main(["down", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert by_hand.wait(timeout=15) is not None and worker.wait(timeout=15) is not None
    assert f"controller   stopped (pid {by_hand.pid}, not recorded in up.json, found by its " \
           "command line)" in out
    assert "found by its environment" in out
    assert tail.poll() is None and other.poll() is None
    assert not (folder / "up.json").exists()


def test_down_never_reports_success_while_a_process_is_left(
        spawn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = _stack_folder(tmp_path)
    stuck = spawn(_sleeper(), env={MARKER_ENV: str(folder.resolve())})
    _wait_marked(folder, 1)
    # It cannot be signalled (another user's, say): stop_marked leaves it.
    monkeypatch.setattr("pdscale._upstack.stop_marked", lambda found, **kw: ([], list(found)))
    assert main(["down", "--dir", str(folder)]) == 1
    captured = capsys.readouterr()
    assert f"still running: {stuck.pid}" in captured.err
    assert (folder / "up.json").exists()  # kept: the stack is not down


def test_an_up_refused_because_a_part_runs_writes_nothing(
        spawn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _stack_folder(tmp_path)
    survivor = spawn(_sleeper("pdscale", "run", "--spec", str(folder / "spec.yaml")))
    _wait_marked(folder, 1)
    before = _snapshot(folder)
    for engine in ("dynamo", "sim"):
        assert main(["up", "--engine", engine, "--dir", str(folder)]) == 2
        err = capsys.readouterr().err
        assert f"unrecorded (pid {survivor.pid})" in err and "pdscale down" in err
        assert "nothing was written" in err
        assert _snapshot(folder) == before


@pytest.mark.parametrize(("args", "said"), [
    (["--engine", "dynamo", "--speed", "20"], "--speed applies to --engine sim only (the "
                                               "Dynamo stack runs in real time)"),
    (["--engine", "dynamo", "--duration", "60"], "--duration applies to --engine sim only"),
    (["--engine", "dynamo", "--scale", "2"], "--scale applies to --engine sim only"),
    (["--cold-start", "30s"], "--cold-start applies to --engine dynamo only"),
    (["--status", "--spec", DYNAMO], "--spec does not apply to --status"),
    (["--restart", "controller", "--engine", "dynamo"], "--engine does not apply to --restart"),
], ids=["speed", "duration", "scale", "cold-start", "status-spec", "restart-engine"])
def test_an_option_of_the_other_engine_or_action_is_refused(
        args: list[str], said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "new"
    assert main(["up", "--dir", str(folder), *args]) == 2
    assert said in capsys.readouterr().err
    assert not folder.exists()


def test_status_lists_each_part_and_restart_starts_one_again(
        spawn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "stack"
    folder.mkdir()
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = spawn(argv, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    gone = spawn(["true"])
    gone.wait(timeout=10)
    (folder / "up.json").write_text(json.dumps({"processes": [
        {"name": "alertmanager", "pid": gone.pid, "url": "http://127.0.0.1:9093",
         "start_ticks": 1, "boot_id": None, "log": str(folder / "alertmanager.log")},
        {"name": "controller", "pid": server.pid, "url": url, **process_record(server.pid),
         "argv": argv, "ready_url": f"{url}/", "log": str(folder / "controller.log"),
         "port": port}]}))
    assert main(["up", "--status", "--dir", str(folder)]) == 1  # one part is down
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["PART", "STATE", "PID", "PORT", "LOG"]
    assert table[1].split()[:5] == ["alertmanager", "down", str(gone.pid), "9093",
                                    str(folder / "alertmanager.log")]
    assert table[2].split()[:5] == ["controller", "up", str(server.pid), str(port),
                                    str(folder / "controller.log")]
    assert main(["up", "--restart", "controller", "--dir", str(folder)]) == 0
    assert server.wait(timeout=15) is not None
    new = json.loads((folder / "up.json").read_text())["processes"][1]
    assert new["pid"] != server.pid and new["argv"] == argv and new["port"] == port
    try:
        with urllib.request.urlopen(f"{url}/", timeout=5) as resp:
            assert resp.status == 200
        assert f"controller restarted: pid {new['pid']}" in capsys.readouterr().out
        assert main(["up", "--restart", "frontend", "--dir", str(folder)]) == 2
        assert "worker processes are replaced by the controller" in capsys.readouterr().err
    finally:
        with contextlib.suppress(OSError):
            os.killpg(new["pid"], signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(new["pid"], 0)


def test_load_without_a_dynamo_stack_says_how_to_start_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no Dynamo stack in" in err and "pdscale up --engine dynamo" in err
    assert list(tmp_path.iterdir()) == []


def test_the_loopback_dynamo_spec_is_the_mocker_and_declares_no_gpu() -> None:
    """Each pool plans with the mocker's profile and start-up (plus a declared delay), not the
    example's GPU deployment with its 120 s cold start."""
    from pdscale._dynamo_up import local_dynamo_spec
    from pdscale.spec import load_spec, parse_spec

    example = load_spec(DYNAMO)
    urls = {"prometheus": "http://127.0.0.1:1", "controller": "http://127.0.0.1:2"}
    for delay, cold in ((0.0, 2), (30.0, 32)):
        raw = local_dynamo_spec(example, example.services[0], urls, start_delay_s=delay)
        service = parse_spec(json.dumps(raw)).services[0]
        assert service.gpu_metrics is False
        assert {p.profile for p in service.pools.values()} == {"dynamo-mocker-1.6.1"}
        assert {p.cold_start for p in service.pools.values()} == {cold}
