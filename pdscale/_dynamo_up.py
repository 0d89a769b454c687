"""``pdscale up --engine dynamo``: a real Dynamo stack on loopback with everything pdscale
runs beside it in a cluster.

Starts, in the background, the spec's first ``engine: dynamo`` service as a Dynamo frontend and
mocker workers (``simulator._stack``, each pool at its ``min_replicas``), the distribution's
Prometheus with the generated rules scraping the stack as a PodMonitor would label it
(``namespace``, ``pod``, role labels; workers through ``file_sd`` files the process actuator
keeps current), Alertmanager with the generated route to the controller's webhook, and the
controller (``pdscale run --dynamo-stack``), which adopts the workers and scales them through
the process actuator. ``pdscale down`` stops the controller, Alertmanager and Prometheus by
their PIDs, then the stack by the PIDs recorded in ``<dir>/dynamo/``.

The stack is what the mocker really is, not the example's GPU deployment: each pool runs the
mocker's profile (``dynamo-mocker-1.6.1``) and plans with the mocker's measured start-up (its
``cold_start_s``: a new mocker worker answers its health check in 0.3-0.7 s and is routable
within about a second, measured with this stack on a 2-core host), so a scale-up or a
replacement takes seconds, as it does. ``--cold-start`` declares a simulated start-up delay
instead: every new worker's process waits that long before the mocker starts (as a GPU worker
loads its weights), and the spec's ``cold_start`` is that delay plus the mocker's own. The
delay is recorded in ``<dir>/dynamo/stack.json`` for the controller's process actuator.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pdscale._servers import (
    alertmanager_argv,
    alive,
    find_binary,
    free_port,
    loopback_spec,
    prometheus_argv,
    wait_ready,
    write_rule_files,
)
from pdscale.spec import Engine, Role, ServiceSpec, Spec, load_spec

__all__ = ["STACK_SUBDIR", "StackUpError", "process_backend", "up_dynamo"]

STACK_SUBDIR = "dynamo"
"""Where under ``pdscale up --dir`` the Dynamo stack keeps its state, model, logs, targets."""


def _err(message: str) -> None:
    print(f"pdscale: {message}", file=sys.stderr)


class StackUpError(Exception):
    """The loopback stack cannot be driven; the message says what to do."""


def _dynamo_service(spec: Spec, option: str = "--engine dynamo") -> ServiceSpec:
    service = next((s for s in spec.services if s.engine is Engine.DYNAMO), None)
    if service is None:
        raise StackUpError(f"{option} needs a service with engine: dynamo in the spec; "
                           "try --spec examples/dynamo.yaml")
    return service


MOCKER_PROFILE = "dynamo-mocker-1.6.1"
"""The performance profile of Dynamo's mocker: what the loopback stack's pools really run."""


def process_backend(spec: Spec, folder: Path) -> Any:
    """The process actuator of the stack in ``folder`` (``<up dir>/dynamo``), with the workers
    it runs adopted: ``pdscale run --dynamo-stack`` scales them, each new worker after the
    start-up delay the stack recorded."""
    from pdscale.controller import ProcessActuator
    from pdscale.simulator import DynamoStack, StackError, dynamo_python

    service = _dynamo_service(spec, "--dynamo-stack")
    if not (folder / "workers.json").is_file():
        raise StackUpError(f"{folder} holds no Dynamo stack (no workers.json): start one with "
                           "pdscale up --engine dynamo, and pass its <dir>/dynamo")
    try:
        python = dynamo_python()
    except StackError as exc:
        raise StackUpError(str(exc)) from exc
    try:
        delays = json.loads((folder / "stack.json").read_text()).get("start_delay_s", {})
    except (OSError, ValueError):
        delays = {}
    stack = DynamoStack(service, folder, python=python,
                        cold_start_s={r: float(delays.get(r.value, 0.0)) for r in Role})
    # With scale-down drains, a stopped worker may drain for the spec's timeout before SIGKILL.
    drain = spec.controller.drain
    actuator = ProcessActuator(stack.worker_templates(python), state_file=stack.workers_file,
                               targets_dir=stack.targets_dir, ports=stack.ports,
                               kill_after_s=float(drain.timeout) if drain.enabled
                               else stack.kill_after_s)
    if actuator.adopt() == 0:
        raise StackUpError(f"no running worker recorded in {stack.workers_file}: the stack is "
                           "down; pdscale down, then pdscale up --engine dynamo")
    return actuator


def local_dynamo_spec(spec: Spec, service: ServiceSpec, urls: dict[str, str], *,
                      start_delay_s: float) -> dict[str, Any]:
    """The spec as the local stack runs it, as plain data: this service alone, the controller
    reading the local Prometheus every 5 s, the webhook at the local controller (loopback, no
    token); each pool the mocker's profile and cold start (plus ``start_delay_s``), and no
    GPU metrics (mocker workers have no GPU, nothing exports DCGM series)."""
    from pdscale.controller import load_profile

    raw = loopback_spec(spec, service.name, prometheus_url=urls["prometheus"],
                        controller_url=urls["controller"], tick_s=5)
    mocker_start = load_profile(MOCKER_PROFILE).cold_start_s
    raw["services"][0]["gpu_metrics"] = False
    for pool in raw["services"][0]["pools"].values():
        pool["profile"] = MOCKER_PROFILE
        pool["cold_start"] = max(1, math.ceil(start_delay_s + mocker_start))
    return raw


def _local_spec(spec: Spec, service: ServiceSpec, folder: Path, urls: dict[str, str], *,
                start_delay_s: float) -> Path:
    raw = local_dynamo_spec(spec, service, urls, start_delay_s=start_delay_s)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _start(name: str, argv: list[str], ready_url: str, folder: Path,
           started: list[dict[str, Any]], url: str) -> None:
    from pdscale._upstack import marker_env, record

    with (folder / f"{name}.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=marker_env(folder))
    # With its start time: `pdscale down` signals the PID only while it is still this process;
    # with its command line: `pdscale up --restart` starts it again.
    started.append(record(name, proc.pid, argv=argv, url=url, ready_url=ready_url,
                          log=folder / f"{name}.log"))
    print(f"starting {name} ...", file=sys.stderr, flush=True)
    if not wait_ready(ready_url, 60, proc):
        tail = (folder / f"{name}.log").read_text()[-2000:]
        raise StackUpError(f"{name} did not come up (log {folder / (name + '.log')}):\n{tail}")


def _prerequisites(spec: Spec) -> tuple[ServiceSpec, dict[str, str], Path]:
    """The dynamo service, the Prometheus and Alertmanager binaries and Dynamo's Python, or
    StackUpError saying what is missing."""
    from pdscale.simulator import StackError, dynamo_python

    service = _dynamo_service(spec)
    binaries = {name: find_binary(name) for name in ("prometheus", "alertmanager")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        raise StackUpError(
            f"{' and '.join(missing)} not found: install the distribution's packages "
            "(apt-get install prometheus prometheus-alertmanager, or scripts/system-deps.sh)")
    try:
        python = dynamo_python()
    except StackError as exc:
        raise StackUpError(str(exc)) from exc
    return service, {k: str(v) for k, v in binaries.items()}, python


def up_dynamo(spec: Spec, folder: Path, *, start_delay_s: float = 0.0) -> int:
    """Start the stack, Prometheus, Alertmanager and the controller; print the URLs and the
    logs; 0, 1 (a process failed: everything started is stopped) or 2 (bad input: no dynamo
    service, Dynamo, Prometheus or Alertmanager not installed). ``start_delay_s``: the
    simulated start-up delay of every new worker (see the module docstring)."""
    from pdscale.alerts import alert_files
    from pdscale.simulator import DynamoStack, StackError

    try:
        service, binaries, python = _prerequisites(spec)
    except StackUpError as exc:
        _err(str(exc))
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    f = folder.resolve()
    ports = {name: free_port() for name in ("prometheus", "alertmanager", "controller")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    local = _local_spec(spec, service, f, urls, start_delay_s=start_delay_s)
    local_spec = load_spec(local)
    rule_files = write_rule_files(alert_files(local_spec), f)
    stack = DynamoStack(local_spec.service(service.name), f / STACK_SUBDIR, python=python,
                        cold_start_s={r: start_delay_s for r in Role})
    print("starting the Dynamo frontend and mocker workers ...", file=sys.stderr, flush=True)
    try:
        stack.start()
    except StackError as exc:
        _err(str(exc))
        return 1
    started: list[dict[str, Any]] = []
    try:  # whatever fails or interrupts from here, nothing is left running
        _start_beside(stack, local_spec, f, ports, urls, binaries, rule_files, local, started)
    except BaseException as exc:
        _stop_started(started)
        stack.stop()
        if not isinstance(exc, StackUpError):
            raise
        _err(str(exc))
        return 1
    assert stack.actuator is not None
    print(f"pdscale up: NVIDIA Dynamo on loopback for service {service.name}, state in "
          f"{folder}/")
    print(f"  frontend     {stack.frontend_url}/v1/chat/completions  /metrics  "
          f"(model {service.model_name})")
    for role in Role:
        for w in stack.actuator.workers((service.name, role)):
            print(f"  {role.value:<12} {w.name}  http://127.0.0.1:{w.port}/metrics  "
                  f"pid {w.pid}")
    print(f"  prometheus   {urls['prometheus']}  (the generated rules; the stack's pods as a "
          "PodMonitor would label them)")
    print(f"  alertmanager {urls['alertmanager']}  (the generated route to pdscale)")
    print(f"  controller   {urls['controller']}/v1/status  /v1/decisions  (scales the workers)")
    pool = local_spec.service(service.name).pools[Role.DECODE]
    delay = f"a simulated start-up delay of {start_delay_s:g} s + " if start_delay_s else ""
    print(f"pools: profile {MOCKER_PROFILE}, cold_start {pool.cold_start}s ({delay}the "
          "mocker's own start-up); controller tick 5 s")
    from pdscale._cli.up import print_logs

    print_logs(folder, ("prometheus", "alertmanager", "controller"),
               workers=folder / STACK_SUBDIR / "logs")
    print(f"send load: pdscale load --dir {folder} --trace synthetic --duration 60")
    print(f"parts and their PIDs: pdscale up --status --dir {folder}; restart one: "
          f"pdscale up --restart controller --dir {folder}")
    print(f"stop it with: pdscale down --dir {folder}")
    return 0


def _start_beside(stack: Any, local_spec: Spec, f: Path, ports: dict[str, int],
                  urls: dict[str, str], binaries: dict[str, str], rule_files: list[str],
                  local: Path, started: list[dict[str, Any]]) -> None:
    """Prometheus, Alertmanager and the controller beside the running stack, then up.json
    (StackUpError when one does not come up; ``started`` has what did)."""
    from pdscale.alerts import alertmanager_config

    stack.actuator.sync()  # the workers' scrape targets, now that they are ready
    config: dict[str, Any] = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [*stack.scrape_configs(), {
            "job_name": "pdscale", "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{ports['controller']}"]}]}]}
    (f / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (f / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(local_spec),
                                                       sort_keys=False))
    commands = [
        ("prometheus", prometheus_argv(binaries["prometheus"], f / "prometheus.yml",
                                       f / "prometheus-data", ports["prometheus"]),
         f"{urls['prometheus']}/-/ready"),
        ("alertmanager", alertmanager_argv(binaries["alertmanager"],
                                           f / "alertmanager.yml", f / "alertmanager-data",
                                           ports["alertmanager"]),
         f"{urls['alertmanager']}/-/ready"),
        ("controller", [sys.executable, "-m", "pdscale", "run", "--spec", str(local),
                        "--dynamo-stack", str(f / STACK_SUBDIR), "--listen",
                        f"127.0.0.1:{ports['controller']}", "--no-leader-election"],
         f"{urls['controller']}/healthz"),
    ]
    for name, argv, ready in commands:
        _start(name, argv, ready, f, started, urls[name])
    # The controller adopted the workers: this process lets go of them.
    state = {"processes": started, "dynamo": STACK_SUBDIR}
    (f / "up.json.tmp").write_text(json.dumps(state, indent=2) + "\n")
    (f / "up.json.tmp").replace(f / "up.json")


def _stop_started(started: list[dict[str, Any]]) -> None:
    import contextlib
    import os
    import signal
    import time

    for p in reversed(started):
        if alive(p["pid"]):
            try:
                os.killpg(p["pid"], signal.SIGTERM)
            except OSError:
                continue
            deadline = time.monotonic() + 10
            while alive(p["pid"]) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p["pid"], os.WNOHANG)
                time.sleep(0.1)
