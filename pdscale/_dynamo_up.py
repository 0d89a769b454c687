"""``pdscale up --engine dynamo``: a real Dynamo stack on loopback with a real Prometheus.

Starts, in the background, the spec's first ``engine: dynamo`` service as a Dynamo frontend and
mocker workers (``simulator._stack``, each pool at its ``min_replicas``) and the distribution's
Prometheus with the generated rules, scraping the stack through the scrape config a PodMonitor
would amount to (``namespace``, ``pod``, role labels; workers through ``file_sd`` files that the
process actuator keeps current). ``pdscale down`` stops the stack by the PIDs recorded in
``<dir>/dynamo/`` and then Prometheus. The controller is not started here: nothing keeps the
pools at size or replaces a dead worker until a controller drives the process actuator.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pdscale._servers import find_binary, free_port, prometheus_argv, wait_ready, write_rule_files
from pdscale.spec import Engine, Role, Spec

__all__ = ["STACK_SUBDIR", "up_dynamo"]

STACK_SUBDIR = "dynamo"
"""Where under ``pdscale up --dir`` the Dynamo stack keeps its state, model, logs, targets."""


def _err(message: str) -> None:
    print(f"pdscale: {message}", file=sys.stderr)


def up_dynamo(spec: Spec, folder: Path) -> int:
    """Start the stack and Prometheus; print the URLs; 0, 1 (a process failed) or 2 (bad
    input: no dynamo service, Dynamo or Prometheus not installed)."""
    from alerts import alert_files
    from simulator import DynamoStack, StackError, dynamo_python

    service = next((s for s in spec.services if s.engine is Engine.DYNAMO), None)
    if service is None:
        _err("--engine dynamo needs a service with engine: dynamo in the spec; try "
             "--spec examples/dynamo.yaml")
        return 2
    prometheus = find_binary("prometheus")
    if prometheus is None:
        _err("prometheus not found: install the distribution's package (apt-get install "
             "prometheus, or scripts/system-deps.sh)")
        return 2
    try:
        python = dynamo_python()
    except StackError as exc:
        _err(str(exc))
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    stack = DynamoStack(service, folder / STACK_SUBDIR, python=python)
    print("starting the Dynamo frontend and mocker workers ...", file=sys.stderr, flush=True)
    try:
        stack.start()
    except StackError as exc:
        _err(str(exc))
        return 1
    assert stack.actuator is not None
    stack.actuator.sync()  # the workers' scrape targets, now that they are ready
    f = folder.resolve()
    port = free_port()
    rules = write_rule_files(alert_files(spec), f)
    config: dict[str, Any] = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                              "rule_files": rules, "scrape_configs": stack.scrape_configs()}
    (f / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    with (f / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(prometheus_argv(prometheus, f / "prometheus.yml",
                                                f / "prometheus-data", port),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    if not wait_ready(f"{url}/-/ready", 60, proc):
        proc.kill()
        stack.stop()
        _err(f"prometheus did not come up (log {f / 'prometheus.log'})")
        return 1
    state = {"processes": [{"name": "prometheus", "pid": proc.pid, "url": url}],
             "dynamo": STACK_SUBDIR}
    (f / "up.json").write_text(json.dumps(state, indent=2) + "\n")
    print(f"pdscale up: NVIDIA Dynamo on loopback for service {service.name}, state in "
          f"{folder}/")
    print(f"  frontend    {stack.frontend_url}/v1/chat/completions  /metrics  "
          f"(model {service.model_name})")
    for role in Role:
        for w in stack.actuator.workers((service.name, role)):
            print(f"  {role.value:<11} {w.name}  http://127.0.0.1:{w.port}/metrics  "
                  f"pid {w.pid}")
    print(f"  prometheus  {url}  (the generated rules; the stack's pods as a PodMonitor "
          "would label them)")
    print(f"stop it with: pdscale down --dir {folder}")
    return 0
