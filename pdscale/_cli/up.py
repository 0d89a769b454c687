"""``pdscale up`` and ``pdscale down``: a local stack on loopback (the simulator in live mode,
Prometheus with the generated rules, Alertmanager with the generated route, the controller),
and stopping it. The stack's configuration is rendered by a pure function
(:func:`local_stack`); this module only writes it and starts the processes."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, POSITIVE, err, load_checked
from pdscale._servers import alive
from pdscale.spec import Spec, load_spec


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
    from alerts import alertmanager_config
    from pdscale._servers import alertmanager_argv, prometheus_argv

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
    failure stop those started and say why (None)."""
    import subprocess

    from pdscale._servers import wait_ready

    started: list[dict[str, Any]] = []
    for name, argv, ready_url in stack.commands:
        with (folder / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        started.append({"name": name, "pid": proc.pid, "url": stack.urls[name]})
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        if not wait_ready(ready_url, 60, proc):
            for p in reversed(started):
                _terminate(p["pid"])
            tail = (folder / f"{name}.log").read_text()[-2000:]
            err(f"{name} did not come up (log {folder / (name + '.log')}):\n{tail}")
            return None
    return started


def _stack_already_up(folder: Path) -> int | None:
    """EXIT_BAD_INPUT (said why) when a stack is up in ``folder`` or its state is unreadable;
    None when the folder is free."""
    state_file = folder / "up.json"
    if not state_file.exists():
        return None
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    if any(alive(p["pid"]) for p in state["processes"]):
        err(f"a stack is already up in {folder}: run `pdscale down --dir {folder}` first")
        return EXIT_BAD_INPUT
    return None


def _cmd_up(args: argparse.Namespace) -> int:
    import json

    import yaml

    from alerts import alert_files
    from pdscale._servers import find_binary, free_port, write_rule_files

    spec = load_checked(args.spec or ("examples/dynamo.yaml" if args.engine == "dynamo"
                                      else "examples/vllm.yaml"))
    if spec is None:
        return EXIT_BAD_INPUT
    folder = Path(args.dir)
    busy = _stack_already_up(folder)
    if busy is not None:
        return busy
    if args.engine == "dynamo":  # a real Dynamo frontend and mocker workers, and Prometheus
        from pdscale._dynamo_up import up_dynamo

        return up_dynamo(spec, folder)
    binaries = {name: find_binary(name) for name in ("prometheus", "alertmanager")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        err(f"{' and '.join(missing)} not found: install the distribution's packages "
            "(apt-get install prometheus prometheus-alertmanager, or scripts/system-deps.sh)")
        return EXIT_BAD_INPUT
    folder.mkdir(parents=True, exist_ok=True)
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
    (folder / "prometheus.yml").write_text(yaml.safe_dump(stack.prometheus, sort_keys=False))
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(stack.alertmanager,
                                                            sort_keys=False))
    started = _start(stack, folder)
    if started is None:
        return EXIT_FAILURE
    (folder / "up.json").write_text(json.dumps({"processes": started}, indent=2) + "\n")
    url = stack.urls
    print(f"pdscale up: a local stack on loopback (x{args.speed:g} simulated time), "
          f"state in {folder}/")
    print(f"  simulator   {url['simulator']}/metrics  /status  POST /scale")
    print(f"  prometheus  {url['prometheus']}  (the generated rules; alerts at /alerts)")
    print(f"  alertmanager {url['alertmanager']}  (the generated route to pdscale)")
    print(f"  controller  {url['controller']}/v1/status  /v1/decisions  /v1/forecast  /metrics")
    print(f"stop it with: pdscale down --dir {folder}")
    return EXIT_OK


def _terminate(pid: int) -> None:
    import os
    import signal

    if not alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


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

    state_file = Path(args.dir) / "up.json"
    if not state_file.exists():
        print(f"pdscale down: nothing is up in {args.dir}", file=sys.stderr)
        return EXIT_OK
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    for p in reversed(state["processes"]):  # the controller first: it would replace workers
        was = alive(p["pid"])
        _terminate(p["pid"])
        print(f"  {p['name']:<12} {'stopped' if was else 'was not running'}")
    if state.get("dynamo"):  # the Dynamo stack's workers and frontend, by their recorded PIDs
        from simulator import stop_stack

        for name in stop_stack(Path(args.dir) / state["dynamo"]):
            print(f"  {name:<12} stopped")
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

    p = sub.add_parser("down", help="stop the stack pdscale up started")
    p.add_argument("--dir", default=".pdscale-up")
    p.set_defaults(func=_cmd_down)
