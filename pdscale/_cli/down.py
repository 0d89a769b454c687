"""``pdscale down``: stop the local stack ``pdscale up`` started, each process only while it
is still the one that was started (:mod:`pdscale._cli.up` describes the stack's folder)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, err
from pdscale._servers import ProcessState, recorded_process


def _why_unconfirmed(p: Mapping[str, Any]) -> str:
    if "start_ticks" not in p:
        return (f"up.json comes from an older pdscale that recorded no start time, and "
                f"/proc/{p['pid']}/cmdline cannot be read")
    return "its start time could not be read when it started, nor can it be now"


def _by_hand(pids: Sequence[int], state_file: Path) -> str:
    return ("check each with `ps -o pid,lstart,args -p PID`; if it is pdscale's, stop it with "
            f"`kill -TERM -- -PID`; then delete {state_file} (PIDs: "
            f"{', '.join(str(pid) for pid in pids)})")


def _terminate(record: Mapping[str, Any], folder: Path) -> None:
    """SIGTERM the process group of the process ``record`` names, SIGKILL after 10 s, only
    while it is still the one ``pdscale up`` started (its PID may belong to another process
    now). PermissionError when this user may not signal it."""
    import os
    import signal

    from pdscale._servers import process_record

    pid = int(record["pid"])

    def ours() -> bool:
        return recorded_process(record, folder=folder) is ProcessState.OURS

    if not ours():
        return
    ticks = process_record(pid)["start_ticks"]

    def there() -> bool:  # exited or not, until its parent reaps it: then the PID is free
        return ours() if ticks is None else process_record(pid)["start_ticks"] == ticks

    def wait_gone(timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and there():
            with contextlib.suppress(ChildProcessError):  # a child of this process: reap it
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)

    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_gone(10)
    if ours():
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        wait_gone(5)


def _up_state(state_file: Path) -> dict[str, Any] | None:
    """The state `pdscale up` recorded, or None after saying why it cannot be read."""
    import json

    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not all(
                isinstance(p, dict) and isinstance(p.get("pid"), int)
                and isinstance(p.get("name"), str) for p in state["processes"]):
            raise ValueError("expected {'processes': [{'name': ..., 'pid': ...}, ...]}")
        return state
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        err(f"cannot read {state_file} ({exc}): the stack's process ids are lost. Stop its "
             "processes by hand (ps -ef | grep -e prometheus -e alertmanager -e pdscale), "
             f"then delete {state_file}")
        return None


def _cmd_down(args: argparse.Namespace) -> int:
    """Stop the controllers first (a controller left running would replace the workers),
    then the recorded processes, the Dynamo stack, and whatever else carries the folder's
    marker; succeed only when nothing of the stack is left."""
    from pdscale._upstack import marked_processes, stack_parts, stop_marked

    folder = Path(args.dir)
    state_file = folder / "up.json"
    state: dict[str, Any] | None = None
    if state_file.is_file():
        state = _up_state(state_file)
        if state is None:
            return EXIT_BAD_INPUT
    dynamo = folder / "dynamo"
    marked = marked_processes(folder)
    if state is None and not any(p.state.startswith("up") for p in stack_parts(folder)):
        print(f"pdscale down: nothing is up in {args.dir}", file=sys.stderr)
        return EXIT_OK
    recorded = {int(p["pid"]) for p in (state or {}).get("processes", [])}
    left: list[int] = []  # running, maybe pdscale's, not stopped: their PIDs stay recorded

    def stop_unrecorded(found: Sequence[Any]) -> None:
        stopped, stuck = stop_marked([m for m in found if m.pid not in recorded])
        for m in stopped:
            what = "controller" if m.is_controller else "process"
            print(f"  {what:<12} stopped (pid {m.pid}, not recorded in up.json, found by its "
                  f"{m.how})")
        for m in stuck:
            left.append(m.pid)
            print(f"  {'process':<12} not stopped: pid {m.pid} ({m.describe()})")

    stop_unrecorded([m for m in marked if m.is_controller])
    for p in reversed((state or {}).get("processes", [])):  # the controller first
        name, pid = p["name"], p["pid"]
        what = recorded_process(p, folder=folder)
        if what is ProcessState.OURS:
            try:
                _terminate(p, folder)
                print(f"  {name:<12} stopped")
            except PermissionError:
                left.append(pid)
                print(f"  {name:<12} not stopped: this user may not signal pid {pid}; run "
                      "pdscale down as the user who ran pdscale up")
        elif what is ProcessState.REPLACED:
            print(f"  {name:<12} was not running (pid {pid} belongs to another process now: "
                  "left alone)")
        elif what is ProcessState.UNCONFIRMED:
            left.append(pid)
            print(f"  {name:<12} left running: pid {pid} runs, but {_why_unconfirmed(p)}, so "
                  "it cannot be confirmed as the process pdscale up started")
        else:
            print(f"  {name:<12} was not running")
    if dynamo.is_dir():  # the Dynamo stack's workers and frontend, by their recorded PIDs
        from pdscale.simulator import StackError, stop_stack

        try:
            for name in stop_stack(dynamo):
                print(f"  {name:<12} stopped")
        except StackError as exc:
            err(str(exc))
    stop_unrecorded(marked_processes(folder))  # workers a stray controller started, ...
    still = [m for m in marked_processes(folder) if m.pid not in left]
    left += [m.pid for m in still]
    if left:
        err(f"pdscale down: {len(left)} process(es) of the stack are still running: "
            + ", ".join(str(pid) for pid in left) + f". {state_file} is kept. "
            + _by_hand(left, state_file))
        return EXIT_FAILURE
    state_file.unlink(missing_ok=True)
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "down", help="stop the stack pdscale up started",
        description="Stop every process of the stack in --dir: the controllers first (those "
                    "up.json records and any started by hand on the stack's files), then the "
                    "recorded processes, the Dynamo frontend and workers, and whatever else "
                    "carries the stack's marker; each only while it is still the process that "
                    "was found. Then remove up.json. Exit 1 when a process could not be "
                    "confirmed or stopped (up.json is kept).")
    p.add_argument("--dir", default=".pdscale-up",
                   help="the folder pdscale up used (default .pdscale-up)")
    p.set_defaults(func=_cmd_down)
