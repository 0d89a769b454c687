"""``pdscale up``: a local stack on loopback (the simulator in live mode, Prometheus with the
generated rules, Alertmanager with the generated route, the controller); ``pdscale down``
(:mod:`pdscale._cli.down`) stops it. The stack's configuration is rendered by a pure function
(:func:`local_stack`); this module only writes it and starts the processes.

``--dir`` is pdscale's own folder: ``up`` writes into a new or empty one and leaves the marker
``generate`` leaves (``pdscale._io.MARKER``), and refuses a folder without it, so pointing
``--dir`` at a project folder cannot overwrite the user's spec.yaml or prometheus.yml. Each
process is recorded with its kernel start time beside its PID (``pdscale._servers``), and
``down`` signals only a PID that is still the process ``up`` started. Every process also
carries the stack's marker (``pdscale._upstack``): ``down`` stops the marked processes up.json
does not record (a controller restarted by hand) and succeeds only when none is left; an
``up`` refused because a part still runs writes nothing. ``--status`` lists the parts and
``--restart PART`` starts one again from its recorded command line."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    DURATION,
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    POSITIVE,
    err,
    example_spec,
    load_checked,
)
from pdscale._cli.down import _by_hand, _terminate, _up_state, _why_unconfirmed
from pdscale._servers import ProcessState, recorded_process
from pdscale._upstack import MARKER_ENV, RESTARTABLE, record
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


SPAN_SIGNALS = ("ttft_p50_s", "ttft_p95_s", "ttft_p95_recent_s", "ttft_p99_s", "itl_p50_s",
                "itl_p95_s", "e2e_p95_s")
"""What ``pdscale up --otlp``'s controller reads from the simulated pods' request spans; the
gauges and token counters stay Prometheus' (examples/vllm-otlp.yaml's split)."""


def local_spec(spec: Spec, *, urls: Mapping[str, str], speed: float) -> dict[str, Any]:
    """The spec the local stack runs: the first service (the simulator runs one), ticks sped
    up with the simulation (``pdscale._servers.loopback_spec`` for the rest). With an ``otlp``
    URL the controller's OTLP/HTTP receiver listens there (loopback: no token) and latency is
    read from spans (:data:`SPAN_SIGNALS`)."""
    from urllib.parse import urlsplit

    from pdscale._servers import loopback_spec

    raw = loopback_spec(spec, spec.services[0].name, prometheus_url=urls["prometheus"],
                        controller_url=urls["controller"], tick_s=max(1, round(15 / speed)))
    if "otlp" in urls:
        raw["controller"]["otlp"] = {**raw["controller"].get("otlp", {}), "enabled": True,
                                     "http_port": urlsplit(urls["otlp"]).port, "grpc_port": 0,
                                     "auth": {}}
        raw["controller"]["signal_sources"] = {"default": "prometheus",
                                               "signals": dict.fromkeys(SPAN_SIGNALS, "otlp")}
    return raw


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
                       "--policy", "static", "--out", str(folder / "sim"),
                       *(("--otlp-endpoint", f"{urls['otlp']}/v1/traces")
                         if "otlp" in urls else ())),
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
                        "--no-leader-election"),
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

    from pdscale._servers import wait_ready
    from pdscale._upstack import marker_env

    for name, argv, ready_url in stack.commands:
        try:
            with (folder / f"{name}.log").open("w") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=marker_env(folder))
        except OSError as exc:
            _stop(started, folder)
            err(f"cannot start {name} ({exc.strerror}: {exc.filename}); everything started "
                "was stopped")
            return None
        # Recorded now, while the PID is surely this child's: `down` checks it later.
        started.append(record(name, proc.pid, argv=argv, url=stack.urls[name],
                              ready_url=ready_url, log=folder.resolve() / f"{name}.log"))
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


def _parts_running(folder: Path) -> int | None:
    """EXIT_BAD_INPUT (said why) when any part of a stack still runs in ``folder`` though
    up.json does not say so: the Dynamo stack's frontend or workers, or a process carrying
    the folder's marker (a controller restarted by hand); None when nothing does."""
    from pdscale._upstack import stack_parts

    running = [p for p in stack_parts(folder) if p.state.startswith("up")]
    if not running:
        return None
    err(f"part of a stack still runs in {folder}: "
        + ", ".join(f"{p.name} (pid {p.pid})" for p in running)
        + f". Stop it with `pdscale down --dir {folder}` first; nothing was written")
    return EXIT_BAD_INPUT


def _up_dynamo(spec: Spec, folder: Path, *, start_delay_s: float) -> int:
    """``pdscale up --engine dynamo`` in ``folder`` (claimed first, released on bad input)."""
    from pdscale._dynamo_up import up_dynamo

    try:
        created = _claim(folder)
    except OSError as exc:
        err(_unwritable(folder, exc))
        return EXIT_BAD_INPUT
    code = up_dynamo(spec, folder, start_delay_s=start_delay_s)
    if code == EXIT_BAD_INPUT and created:
        _unclaim(folder)
    return code


_ENGINE_OPTIONS = {"sim": ("speed", "duration", "scale", "otlp"), "dynamo": ("cold_start",)}
"""The options that apply to each engine; the others are refused, not ignored."""
_WHY_NOT = {"speed": "the Dynamo stack runs in real time",
            "duration": "the Dynamo stack serves what you send it (pdscale load)",
            "scale": "the Dynamo stack serves what you send it (pdscale load)",
            "otlp": "Dynamo's mocker workers export no request spans",
            "cold_start": "the simulated stack takes its start-ups from the spec's cold_start"}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _misused(args: argparse.Namespace) -> str | None:
    """Why the options given do not fit the engine or the action, or None."""
    given = [n for n in ("spec", "engine", "speed", "duration", "scale", "otlp", "cold_start")
             if getattr(args, n) is not None]
    action = "--status" if args.status else "--restart" if args.restart else None
    if action is not None:
        if action == "--status" and args.restart:
            return "--status and --restart cannot be combined: run one, then the other"
        if given:
            return (f"{_option(given[0])} does not apply to {action}, which acts on the stack "
                    f"already running in --dir: drop {_option(given[0])}")
        return None
    engine = args.engine or "sim"
    for name in given:
        other = next((e for e, names in _ENGINE_OPTIONS.items() if name in names), engine)
        if other != engine:
            return (f"{_option(name)} applies to --engine {other} only ({_WHY_NOT[name]}): "
                    f"drop {_option(name)}, or run --engine {other}")
    return None


def _cmd_up(args: argparse.Namespace) -> int:
    import yaml

    from pdscale._servers import find_binary, free_port, write_rule_files
    from pdscale.alerts import alert_files

    misused = _misused(args)
    if misused is not None:
        err(misused)
        return EXIT_BAD_INPUT
    if args.status:
        return _status(Path(args.dir))
    if args.restart:
        return _restart(Path(args.dir), args.restart)
    engine = args.engine or "sim"
    spec = load_checked(args.spec or example_spec("dynamo.yaml" if engine == "dynamo"
                                                  else "vllm.yaml"))
    if spec is None:
        return EXIT_BAD_INPUT
    folder = Path(args.dir)
    problem = _dir_problem(folder)
    if problem is not None:
        err(problem)
        return EXIT_BAD_INPUT
    busy = _stack_already_up(folder)
    if busy is None:
        busy = _parts_running(folder)
    if busy is not None:
        return busy
    import os

    # Every process started from here on carries the stack's marker (pdscale._upstack).
    os.environ[MARKER_ENV] = str(folder.resolve())
    if engine == "dynamo":  # a real Dynamo frontend and mocker workers, and Prometheus
        return _up_dynamo(spec, folder, start_delay_s=args.cold_start or 0.0)
    speed = args.speed if args.speed is not None else 10.0
    duration = args.duration if args.duration is not None else 6 * 3600.0
    scale = args.scale if args.scale is not None else 1.0
    binaries = {name: find_binary(name) for name in ("prometheus", "alertmanager")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        err(f"{' and '.join(missing)} not found: install the distribution's packages "
            "(apt-get install prometheus prometheus-alertmanager, or scripts/system-deps.sh)")
        return EXIT_BAD_INPUT
    try:
        _claim(folder)
        ports = {name: free_port()
                 for name in ("simulator", "prometheus", "alertmanager", "controller",
                              *(("otlp",) if args.otlp else ()))}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        (folder / "spec.yaml").write_text(yaml.safe_dump(
            local_spec(spec, urls=urls, speed=speed), sort_keys=False))
        local = load_spec(folder / "spec.yaml")
        stack = local_stack(spec, local, ports=ports, folder=folder.resolve(),
                            rule_files=write_rule_files(alert_files(local), folder),
                            binaries={k: str(v) for k, v in binaries.items()},
                            python=sys.executable, speed=speed,
                            duration_s=duration, scale=scale)
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
    if not _save_state(started, folder):
        return EXIT_FAILURE
    _announce(stack.urls, speed, folder)
    return EXIT_OK


def _save_state(started: Any, folder: Path) -> bool:
    """Write the started parts' PIDs to up.json, whole or not at all (``down`` needs every
    PID); when it cannot be written, stop them and say why."""
    import json

    state_file = folder / "up.json"
    try:
        (folder / "up.json.tmp").write_text(json.dumps({"processes": started}, indent=2)
                                            + "\n")
        (folder / "up.json.tmp").replace(state_file)
    except OSError as exc:
        _stop(started, folder)
        err(f"cannot write {state_file} ({exc.strerror}), so `pdscale down` could not find "
            "the stack: it was stopped. Free some space or fix the folder's permissions, then "
            "run pdscale up again")
        return False
    return True


def _announce(url: Mapping[str, str], speed: float, folder: Path) -> None:
    print(f"pdscale up: a local stack on loopback (x{speed:g} simulated time), "
          f"state in {folder}/")
    print(f"  simulator    {url['simulator']}/metrics  /status  POST /scale")
    print(f"  prometheus   {url['prometheus']}  (the generated rules; alerts at /alerts)")
    print(f"  alertmanager {url['alertmanager']}  (the generated route to pdscale)")
    print(f"  controller   {url['controller']}/v1/status  /v1/decisions  /v1/forecast  "
          "/metrics")
    if "otlp" in url:
        print(f"  otlp         {url['otlp']}/v1/traces  (the pods' request spans: the "
              "controller reads latency from them)")
    print_logs(folder, ("simulator", "prometheus", "alertmanager", "controller"))
    print(f"parts and their PIDs: pdscale up --status --dir {folder}; restart one: "
          f"pdscale up --restart controller --dir {folder}")
    print(f"stop it with: pdscale down --dir {folder}")


def print_logs(folder: Path, names: Sequence[str], workers: Path | None = None) -> None:
    """Where every part writes its log (the controller's: scale events, worker exits and
    alert reactions at its default level, INFO)."""
    print("logs:")
    for name in names:
        what = "  (scales, worker exits, alert reactions)" if name == "controller" else ""
        print(f"  {name:<12} {folder / (name + '.log')}{what}")
    if workers is not None:
        print(f"  {'frontend':<12} {workers / 'frontend.log'}")
        print(f"  {'workers':<12} {workers}/<worker name>.log")


def _status(folder: Path) -> int:
    """``pdscale up --status``: every part, up or down, with its PID, port and log; 0 when
    every part is up, 1 when one is down or nothing is up."""
    from pdscale._upstack import render_parts, stack_parts

    parts = stack_parts(folder)
    print(render_parts(parts, folder))
    if any(p.name == "unrecorded" for p in parts):
        print(f"unrecorded: a process of this stack up.json does not record (started by "
              f"hand?); pdscale down --dir {folder} stops it too")
    return EXIT_OK if parts and all(p.state.startswith("up") for p in parts) else EXIT_FAILURE


def _restart(folder: Path, name: str) -> int:
    """``pdscale up --restart NAME``: stop the part (and, for the controller, any other
    controller of the stack), start it again from its recorded command line with the same
    port and log, and record its new PID."""
    import json
    import subprocess

    from pdscale._servers import wait_ready
    from pdscale._upstack import marked_processes, marker_env, stop_marked

    state_file = folder / "up.json"
    if not state_file.is_file():
        err(f"nothing is up in {folder}: start it with pdscale up --dir {folder}")
        return EXIT_BAD_INPUT
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    rec = next((p for p in state["processes"] if p["name"] == name), None)
    if rec is None or "argv" not in rec:
        names = [p["name"] for p in state["processes"] if "argv" in p]
        err(f"--restart {name}: expected one of {', '.join(names) or 'nothing'} (the parts "
            f"of this stack that can restart: {', '.join(RESTARTABLE)}; worker processes are "
            "replaced by the controller when they exit, and the frontend comes back with "
            f"pdscale down and pdscale up). Got {name!r}")
        return EXIT_BAD_INPUT
    if recorded_process(rec, folder=folder) is ProcessState.OURS:
        _terminate(rec, folder)
    if name == "controller":  # two controllers would both scale the workers
        stop_marked([m for m in marked_processes(folder) if m.is_controller])
    log = Path(rec["log"])
    with log.open("a") as out:
        proc = subprocess.Popen(rec["argv"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=marker_env(folder))
    new = record(name, proc.pid, argv=rec["argv"], url=rec["url"], ready_url=rec["ready_url"],
                 log=log)
    print(f"restarting {name} ...", file=sys.stderr, flush=True)
    if not wait_ready(rec["ready_url"], 60, proc):
        _terminate(new, folder)
        err(f"{name} did not come up again (log {log}):\n{log.read_text()[-2000:]}")
        return EXIT_FAILURE
    state["processes"] = [new if p is rec else p for p in state["processes"]]
    (folder / "up.json.tmp").write_text(json.dumps(state, indent=2) + "\n")
    (folder / "up.json.tmp").replace(state_file)
    print(f"{name} restarted: pid {proc.pid}, {rec['url']}, log {log}")
    return EXIT_OK


def _unwritable(folder: Path, exc: OSError) -> str:
    where = exc.filename or folder
    return (f"cannot write {where} ({exc.strerror}); choose a --dir you can write to, or fix "
            "its permissions")


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "up", help="start a local stack on loopback: the simulator or a real Dynamo stack, "
                   "Prometheus, Alertmanager, the controller",
        description="Start, in the background on loopback ports, a serving stack (the "
                    "simulator in live mode, or with --engine dynamo a real NVIDIA Dynamo "
                    "frontend and mocker workers), a real Prometheus with the generated rules "
                    "scraping it and the controller, Alertmanager with the generated route, "
                    "and the controller scaling the stack. Prints the URLs and where every "
                    "log is. Each engine has its own options below; an option of the other "
                    "engine is refused. Needs the prometheus and prometheus-alertmanager "
                    "binaries. docs/local-stack.md: how to drive, inspect and restart it.",
        epilog="examples:\n"
               "  pdscale up                                  # the simulator, x10 time\n"
               "  pdscale up --otlp                           # latency from request spans\n"
               "  pdscale up --engine dynamo                  # real Dynamo, real time\n"
               "  pdscale load --trace synthetic --duration 120   # send it requests\n"
               "  pdscale up --status                         # each part: state, PID, port, log\n"
               "  pdscale up --restart controller\n"
               "  pdscale down",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="default: examples/vllm.yaml (examples/dynamo.yaml with "
                                  "--engine dynamo)")
    p.add_argument("--engine", choices=["sim", "dynamo"],
                   help="sim: the simulator's live mode (default); dynamo: a real NVIDIA Dynamo "
                        "frontend and mocker workers for the spec's dynamo service (needs "
                        "scripts/dynamo-setup.sh)")
    p.add_argument("--dir", default=".pdscale-up", help="state, configs and logs")
    sim = p.add_argument_group("--engine sim (the simulator in live mode)")
    sim.add_argument("--speed", type=POSITIVE,
                     help="simulated seconds per wall second (default 10)")
    sim.add_argument("--duration", type=POSITIVE,
                     help="simulated seconds of trace (default 6 h)")
    sim.add_argument("--scale", type=POSITIVE, help="load multiplier (default 1)")
    sim.add_argument("--otlp", action="store_true", default=None,
                     help="the simulated pods also export a vLLM-shaped request span a request "
                          "over OTLP/HTTP to the controller's receiver, and the controller "
                          "reads TTFT, ITL and e2e latency from the spans (gauges and token "
                          "counters from Prometheus); docs/opentelemetry.md")
    dyn = p.add_argument_group(
        "--engine dynamo (a real Dynamo stack in real time; send it load with pdscale load)",
        "Each pool runs the mocker profile (dynamo-mocker-1.6.1) and plans with its measured "
        "start-up (cold_start 2s: a mocker worker is routable within about a second).")
    dyn.add_argument("--cold-start", type=DURATION, metavar="DURATION",
                     help="a simulated start-up delay for every new worker (e.g. 30s, 2m): "
                          "the worker's process waits this long before the mocker starts, as "
                          "a GPU worker loads its weights; the spec's cold_start becomes it "
                          "plus the mocker's own 2 s (default 0)")
    run = p.add_argument_group("the stack already running in --dir")
    run.add_argument("--status", action="store_true",
                     help="list each part: up or down, PID, port, log (exit 1 when one is "
                          "down)")
    run.add_argument("--restart", metavar="PART",
                     help=f"stop one part and start it again from its recorded command line, "
                          f"same port and log ({', '.join(RESTARTABLE)})")
    p.set_defaults(func=_cmd_up)
