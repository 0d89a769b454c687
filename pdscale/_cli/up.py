"""``pdscale up`` and ``pdscale down``: a local stack on loopback (the simulator in live mode,
Prometheus with the generated rules, Alertmanager with the generated route, the controller),
and stopping it. The stack's configuration is rendered by a pure function
(:func:`local_stack`); this module only writes it and starts the processes.

``--dir`` is pdscale's own folder: ``up`` writes into a new or empty one and leaves the marker
``generate`` leaves (``pdscale._io.MARKER``), and refuses a folder without it, so pointing
``--dir`` at a project folder cannot overwrite the user's spec.yaml or prometheus.yml. Each
process is recorded with its kernel start time beside its PID (``pdscale._servers``), and
``down`` signals only a PID that is still the process ``up`` started."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    POSITIVE,
    err,
    example_spec,
    load_checked,
)
from pdscale._servers import ProcessState, recorded_process
from pdscale.spec import Spec, load_spec

_UP_NAMES = frozenset({
    "spec.yaml", "prometheus.yml", "alertmanager.yml", "rules", "sim", "dynamo", "up.json",
    "prometheus-data", "alertmanager-data",
    "simulator.log", "prometheus.log", "alertmanager.log", "controller.log"})
"""Everything ``pdscale up`` writes in its folder, either engine."""
_UP_EVIDENCE = frozenset({"up.json", "simulator.log", "prometheus.log", "alertmanager.log",
                          "controller.log"})
"""What only a ``pdscale up`` that got as far as starting a process leaves."""
_MARKER_TEXT = ("pdscale up keeps its configuration, state and logs in this folder and "
                "overwrites them on the next pdscale up.\n")


@dataclass(frozen=True)
class LocalStack:
    """Everything ``pdscale up`` writes and starts, rendered without I/O."""

    spec: dict[str, Any]
    """The local spec (the first service, fast ticks, no Lease, loopback URLs)."""
    prometheus: dict[str, Any]
    alertmanager: dict[str, Any]
    commands: tuple[tuple[str, tuple[str, ...], str], ...]
    """(name, argv, readiness URL) in start order."""
    urls: dict[str, str]


def local_spec(spec: Spec, *, urls: Mapping[str, str], speed: float) -> dict[str, Any]:
    """The spec the local stack runs: the first service (the simulator runs one), ticks sped
    up with the simulation (``pdscale._servers.loopback_spec`` for the rest)."""
    from pdscale._servers import loopback_spec

    return loopback_spec(spec, spec.services[0].name, prometheus_url=urls["prometheus"],
                         controller_url=urls["controller"], tick_s=max(1, round(15 / speed)))


def local_stack(spec: Spec, local: Spec, *, ports: Mapping[str, int], folder: Path,
                rule_files: Sequence[str], binaries: Mapping[str, str], python: str,
                speed: float, duration_s: float, scale: float) -> LocalStack:
    """The local stack's configuration and commands: a pure function of its inputs
    (``local`` is :func:`local_spec` loaded; ``folder`` absolute)."""
    from pdscale._servers import alertmanager_argv, prometheus_argv
    from pdscale.alerts import alertmanager_config

    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    prometheus = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": list(rule_files),
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [
            {"job_name": "simulator", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['simulator']}"]}]},
            {"job_name": "pdscale", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['controller']}"]}]}]}
    spec_file = str(folder / "spec.yaml")
    commands = (
        ("simulator", (python, "-m", "pdscale", "simulate", "--live", "--spec", spec_file,
                       "--trace", "synthetic", "--duration", str(duration_s), "--speed",
                       str(speed), "--scale", str(scale), "--port", str(ports["simulator"]),
                       "--policy", "static", "--out", str(folder / "sim")),
         f"{urls['simulator']}/status"),
        ("prometheus", tuple(prometheus_argv(binaries["prometheus"], folder / "prometheus.yml",
                                             folder / "prometheus-data", ports["prometheus"])),
         f"{urls['prometheus']}/-/ready"),
        ("alertmanager", tuple(alertmanager_argv(binaries["alertmanager"],
                                                 folder / "alertmanager.yml",
                                                 folder / "alertmanager-data",
                                                 ports["alertmanager"])),
         f"{urls['alertmanager']}/-/ready"),
        ("controller", (python, "-m", "pdscale", "run", "--spec", spec_file, "--sim-url",
                        urls["simulator"], "--listen", f"127.0.0.1:{ports['controller']}",
                        "--no-leader-election", "--log-level", "warning"),
         f"{urls['controller']}/healthz"),
    )
    return LocalStack(local_spec(spec, urls=urls, speed=speed), prometheus,
                      alertmanager_config(local), commands, urls)


def _start(stack: LocalStack, folder: Path) -> list[dict[str, Any]] | None:
    """Start the stack's processes in order, each once its predecessor is ready; on a
    failure stop those started and say why (None). Interrupted (Ctrl-C, SIGTERM, a closed
    stderr), it stops what it started before passing the interruption on: nothing is left
    running that up.json does not record."""
    import signal

    started: list[dict[str, Any]] = []

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        return _start_each(stack, folder, started)
    except BaseException:
        _stop(started, folder)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start_each(stack: LocalStack, folder: Path, started: list[dict[str, Any]]
                ) -> list[dict[str, Any]] | None:
    import subprocess

    from pdscale._servers import process_record, wait_ready

    for name, argv, ready_url in stack.commands:
        try:
            with (folder / f"{name}.log").open("w") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        except OSError as exc:
            _stop(started, folder)
            err(f"cannot start {name} ({exc.strerror}: {exc.filename}); everything started "
                "was stopped")
            return None
        # Recorded now, while the PID is surely this child's: `down` checks it later.
        started.append({"name": name, "pid": proc.pid, "url": stack.urls[name],
                        **process_record(proc.pid)})
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        if not wait_ready(ready_url, 60, proc):
            _stop(started, folder)
            tail = (folder / f"{name}.log").read_text()[-2000:]
            err(f"{name} did not come up (log {folder / (name + '.log')}):\n{tail}")
            return None
    return started


def _stop(started: Sequence[Mapping[str, Any]], folder: Path) -> None:
    for p in reversed(started):
        with contextlib.suppress(OSError):
            _terminate(p, folder)


def _dir_problem(folder: Path) -> str | None:
    """Why ``pdscale up`` may not write in ``folder``, said with the fix; None when it may:
    a new or empty folder, or pdscale's (the marker ``generate`` and ``up`` leave, or, from a
    pdscale before ``up`` left it, only what ``up`` writes, its logs or up.json among them).
    Reads only."""
    from pdscale._io import MARKER

    try:
        if not folder.exists():
            ancestor = next((a for a in folder.absolute().parents if a.exists()), None)
            if ancestor is not None and not ancestor.is_dir():
                return (f"cannot create the folder {folder}: {ancestor} is a file, not a "
                        "folder; choose another --dir")
            return None
        if not folder.is_dir():
            return (f"--dir {folder} is a file, not a folder; choose a new or empty folder "
                    "(default .pdscale-up)")
        names = {entry.name for entry in folder.iterdir()}
    except OSError as exc:
        return f"cannot read {folder} ({exc.strerror}); choose a --dir you can read and write"
    if not names or MARKER in names or (names <= _UP_NAMES and names & _UP_EVIDENCE):
        return None
    return (f"{folder} is not empty and was not created by pdscale up (no {MARKER} in it): "
            "up writes spec.yaml, prometheus.yml, alertmanager.yml, rules/ and logs there and "
            "would overwrite files of those names. Choose a new or empty folder for --dir "
            "(default .pdscale-up)")


def _claim(folder: Path) -> bool:
    """Create ``folder`` if needed and leave the marker in it; True when this call created it.
    OSError when it cannot be written (nothing left behind)."""
    from pdscale._io import MARKER

    created = not folder.is_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if not (folder / MARKER).exists():
            (folder / MARKER).write_text(_MARKER_TEXT, encoding="utf-8")
    except OSError:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return created


def _unclaim(folder: Path) -> None:
    """Remove a folder :func:`_claim` created when nothing but its marker went in."""
    from pdscale._io import MARKER

    with contextlib.suppress(OSError):
        if {entry.name for entry in folder.iterdir()} == {MARKER}:
            (folder / MARKER).unlink()
            folder.rmdir()


def _why_unconfirmed(p: Mapping[str, Any]) -> str:
    if "start_ticks" not in p:
        return (f"up.json comes from an older pdscale that recorded no start time, and "
                f"/proc/{p['pid']}/cmdline cannot be read")
    return "its start time could not be read when it started, nor can it be now"


def _by_hand(pids: Sequence[int], state_file: Path) -> str:
    return ("check each with `ps -o pid,lstart,args -p PID`; if it is pdscale's, stop it with "
            f"`kill -TERM -- -PID`; then delete {state_file} (PIDs: "
            f"{', '.join(str(pid) for pid in pids)})")


def _stack_already_up(folder: Path) -> int | None:
    """EXIT_BAD_INPUT (said why) when a stack is up in ``folder`` or its state is unreadable;
    None when the folder is free."""
    state_file = folder / "up.json"
    if not state_file.is_file():
        return None
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    now = [(p, recorded_process(p, folder=folder)) for p in state["processes"]]
    if any(what is ProcessState.OURS for _, what in now):
        err(f"a stack is already up in {folder}: run `pdscale down --dir {folder}` first")
        return EXIT_BAD_INPUT
    unknown = [p for p, what in now if what is ProcessState.UNCONFIRMED]
    if unknown:
        err(f"cannot tell whether the stack recorded in {state_file} is still up: "
            + "; ".join(f"{p['name']} (pid {p['pid']}) runs, but {_why_unconfirmed(p)}"
                        for p in unknown)
            + ". " + _by_hand([p["pid"] for p in unknown], state_file))
        return EXIT_BAD_INPUT
    return None


def _up_dynamo(spec: Spec, folder: Path) -> int:
    """``pdscale up --engine dynamo`` in ``folder`` (claimed first, released on bad input)."""
    from pdscale._dynamo_up import up_dynamo

    try:
        created = _claim(folder)
    except OSError as exc:
        err(_unwritable(folder, exc))
        return EXIT_BAD_INPUT
    code = up_dynamo(spec, folder)
    if code == EXIT_BAD_INPUT and created:
        _unclaim(folder)
    return code


def _cmd_up(args: argparse.Namespace) -> int:
    import json

    import yaml

    from pdscale._servers import find_binary, free_port, write_rule_files
    from pdscale.alerts import alert_files

    spec = load_checked(args.spec or example_spec("dynamo.yaml" if args.engine == "dynamo"
                                                  else "vllm.yaml"))
    if spec is None:
        return EXIT_BAD_INPUT
    folder = Path(args.dir)
    problem = _dir_problem(folder)
    if problem is not None:
        err(problem)
        return EXIT_BAD_INPUT
    busy = _stack_already_up(folder)
    if busy is not None:
        return busy
    if args.engine == "dynamo":  # a real Dynamo frontend and mocker workers, and Prometheus
        return _up_dynamo(spec, folder)
    binaries = {name: find_binary(name) for name in ("prometheus", "alertmanager")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        err(f"{' and '.join(missing)} not found: install the distribution's packages "
            "(apt-get install prometheus prometheus-alertmanager, or scripts/system-deps.sh)")
        return EXIT_BAD_INPUT
    try:
        _claim(folder)
        ports = {name: free_port()
                 for name in ("simulator", "prometheus", "alertmanager", "controller")}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        (folder / "spec.yaml").write_text(yaml.safe_dump(
            local_spec(spec, urls=urls, speed=args.speed), sort_keys=False))
        local = load_spec(folder / "spec.yaml")
        stack = local_stack(spec, local, ports=ports, folder=folder.resolve(),
                            rule_files=write_rule_files(alert_files(local), folder),
                            binaries={k: str(v) for k, v in binaries.items()},
                            python=sys.executable, speed=args.speed,
                            duration_s=args.duration, scale=args.scale)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(stack.prometheus,
                                                              sort_keys=False))
        (folder / "alertmanager.yml").write_text(yaml.safe_dump(stack.alertmanager,
                                                                sort_keys=False))
    except OSError as exc:
        err(_unwritable(folder, exc))
        return EXIT_BAD_INPUT
    started = _start(stack, folder)
    if started is None:
        return EXIT_FAILURE
    state_file = folder / "up.json"
    try:  # whole or not at all: `down` needs every PID
        (folder / "up.json.tmp").write_text(json.dumps({"processes": started}, indent=2)
                                            + "\n")
        (folder / "up.json.tmp").replace(state_file)
    except OSError as exc:
        _stop(started, folder)
        err(f"cannot write {state_file} ({exc.strerror}), so `pdscale down` could not find "
            "the stack: it was stopped. Free some space or fix the folder's permissions, then "
            "run pdscale up again")
        return EXIT_FAILURE
    url = stack.urls
    print(f"pdscale up: a local stack on loopback (x{args.speed:g} simulated time), "
          f"state in {folder}/")
    print(f"  simulator   {url['simulator']}/metrics  /status  POST /scale")
    print(f"  prometheus  {url['prometheus']}  (the generated rules; alerts at /alerts)")
    print(f"  alertmanager {url['alertmanager']}  (the generated route to pdscale)")
    print(f"  controller  {url['controller']}/v1/status  /v1/decisions  /v1/forecast  /metrics")
    print(f"stop it with: pdscale down --dir {folder}")
    return EXIT_OK


def _unwritable(folder: Path, exc: OSError) -> str:
    where = exc.filename or folder
    return (f"cannot write {where} ({exc.strerror}); choose a --dir you can write to, or fix "
            "its permissions")


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
    folder = Path(args.dir)
    state_file = folder / "up.json"
    if not state_file.is_file():
        print(f"pdscale down: nothing is up in {args.dir}", file=sys.stderr)
        return EXIT_OK
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    left: list[int] = []  # running, maybe pdscale's, not stopped: their PIDs stay recorded
    for p in reversed(state["processes"]):  # the controller first: it would replace workers
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
    if state.get("dynamo"):  # the Dynamo stack's workers and frontend, by their recorded PIDs
        from pdscale.simulator import stop_stack

        for name in stop_stack(folder / state["dynamo"]):
            print(f"  {name:<12} stopped")
    if left:
        err(f"{state_file} is kept: some recorded processes were not stopped. "
            + _by_hand(left, state_file))
        return EXIT_FAILURE
    state_file.unlink()
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "up", help="start a local stack on loopback: simulator, Prometheus, Alertmanager, "
                   "controller",
        description="Start, in the background on loopback ports, the simulator in live mode "
                    "(the spec's first service, synthetic trace), a real Prometheus with the "
                    "generated rules scraping it and the controller, Alertmanager with the "
                    "generated route, and the controller driving the simulator. Prints the "
                    "URLs. Needs the prometheus and prometheus-alertmanager binaries.")
    p.add_argument("--spec", help="default: examples/vllm.yaml (examples/dynamo.yaml with "
                                  "--engine dynamo)")
    p.add_argument("--engine", choices=["sim", "dynamo"], default="sim",
                   help="sim: the simulator's live mode (default); dynamo: a real NVIDIA Dynamo "
                        "frontend and mocker workers for the spec's dynamo service, and "
                        "Prometheus (needs scripts/dynamo-setup.sh)")
    p.add_argument("--dir", default=".pdscale-up", help="state, configs and logs")
    p.add_argument("--speed", type=POSITIVE, default=10.0,
                   help="simulated seconds per wall second (default 10)")
    p.add_argument("--duration", type=POSITIVE, default=6 * 3600,
                   help="simulated seconds of trace (default 6 h)")
    p.add_argument("--scale", type=POSITIVE, default=1.0, help="load multiplier")
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser(
        "down", help="stop the stack pdscale up started",
        description="Stop every process `pdscale up` started (recorded in DIR/up.json), each "
                    "only while it is still the process up started; then remove up.json. "
                    "Exit 1 when a recorded process could not be confirmed or stopped.")
    p.add_argument("--dir", default=".pdscale-up",
                   help="the folder pdscale up used (default .pdscale-up)")
    p.set_defaults(func=_cmd_down)
