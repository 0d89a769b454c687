"""pdscale in front of a real serving stack on loopback, in one process: a Dynamo frontend and
mocker workers (``simulator._stack``), the distribution's Prometheus with the generated rules
scraping them as a PodMonitor would label them, optionally Alertmanager with the generated
route, and the controller (its HTTP API on loopback, the webhook included) scaling the pools
through the process actuator.

The end-to-end tests and ``bench/stack.py`` use this; ``pdscale up --engine dynamo`` starts the
same parts as background processes. Every server binds 127.0.0.1 and is stopped by PID on
exit, whatever happened.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdscale._servers import (
    alertmanager_argv,
    find_binary,
    free_port,
    prometheus_argv,
    wait_ready,
    write_rule_files,
)
from pdscale.spec import Engine, Role, ServiceSpec, Spec

__all__ = ["StackRun", "StackRunError"]


class StackRunError(RuntimeError):
    """A part of the loopback stack could not start; the message names it and its log."""


@dataclass
class StackRun:
    """Start with :meth:`start` (or ``with``), stop with :meth:`stop`; see the module
    docstring. ``controller=False`` leaves the pools to the caller (static allocations)."""

    spec: Spec
    folder: Path
    python: Path | None = None
    replicas: Mapping[Role, int] | None = None
    scrape_interval_s: float = 1.0
    controller: bool = True
    alertmanager: bool = False
    mocker_args: Sequence[str] = ()
    frontend_args: Sequence[str] = ()
    migration_limit: int = 0
    api_port: int | None = None
    alertmanager_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Merged into the generated Alertmanager route (e.g. a short ``group_interval``)."""
    policy: Any = None
    """The controller's policy (a ``controller.Policy``); None: pdscale's own."""
    extra_signals: Sequence[Any] = ()
    """Signals (``telemetry.Signal``) the controller reads beyond pdscale's, for ``policy``."""

    def __post_init__(self) -> None:
        self.folder = self.folder.resolve()
        self.service: ServiceSpec = next(
            (s for s in self.spec.services if s.engine is Engine.DYNAMO), None
        ) or _no_dynamo()
        self.stack: Any = None
        self.prometheus_url: str | None = None
        self.alertmanager_url: str | None = None
        self.api_url: str | None = None
        self.pdscale: Any = None
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._server: Any = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> StackRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> StackRun:
        from pdscale.simulator import DynamoStack

        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self.stack = DynamoStack(self.service, self.folder / "dynamo", python=self.python,
                                     replicas=self.replicas, mocker_args=self.mocker_args,
                                     frontend_args=self.frontend_args,
                                     migration_limit=self.migration_limit).start()
            self.stack.actuator.sync()
            if self.alertmanager:
                self._start_alertmanager()
            self._start_prometheus()
            if self.controller:
                self._start_controller()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.pdscale is not None:
            self.pdscale.stop()
        if self._server is not None:
            self._server.should_exit = True
        for t in self._threads:
            t.join(timeout=15)
        self._threads.clear()
        if self.stack is not None:
            self.stack.stop(grace_s=5)
        for _name, proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._procs.clear()

    def kill_prometheus(self) -> None:
        """Stop Prometheus (a fault test: the controller goes blind)."""
        for name, proc in self._procs:
            if name == "prometheus":
                proc.terminate()
                proc.wait(timeout=10)

    def restart_prometheus(self) -> None:
        """Start Prometheus again on the same port and data (after :meth:`kill_prometheus`)."""
        self._procs = [(n, p) for n, p in self._procs if n != "prometheus"]
        assert self.prometheus_url is not None
        self._start_prometheus(port=int(self.prometheus_url.rsplit(":", 1)[1]))

    # -- parts ------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], ready_url: str) -> None:
        log = self.folder / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self._procs.append((name, proc))
        if not wait_ready(ready_url, 60, proc):
            raise StackRunError(f"{name} did not become ready on {ready_url}; its log: {log}")

    def _start_prometheus(self, port: int | None = None) -> None:
        from pdscale.alerts import alert_files

        binary = find_binary("prometheus")
        if binary is None:
            raise StackRunError("prometheus not found: apt-get install prometheus (or "
                                "scripts/system-deps.sh)")
        port = port or free_port()
        interval = f"{self.scrape_interval_s:g}s"
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": write_rule_files(alert_files(self.spec), self.folder),
            "scrape_configs": self.stack.scrape_configs(interval=interval)}
        if self.alertmanager_url is not None:
            config["alerting"] = {"alertmanagers": [{"static_configs": [
                {"targets": [self.alertmanager_url.split("//", 1)[1]]}]}]}
        path = self.folder / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.prometheus_url = f"http://127.0.0.1:{port}"
        self._spawn("prometheus", prometheus_argv(binary, path, self.folder / "prometheus-data",
                                                  port), f"{self.prometheus_url}/-/ready")

    def _start_alertmanager(self) -> None:
        from pdscale.alerts import alertmanager_config

        binary = find_binary("alertmanager")
        if binary is None:
            raise StackRunError("alertmanager not found: apt-get install "
                                "prometheus-alertmanager (or scripts/system-deps.sh)")
        config = alertmanager_config(self.spec)
        for route in config["route"].get("routes", []):
            route.update(self.alertmanager_overrides)
        path = self.folder / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        self.alertmanager_url = f"http://127.0.0.1:{port}"
        self._spawn("alertmanager", alertmanager_argv(binary, path, self.folder / "am-data",
                                                      port), f"{self.alertmanager_url}/-/ready")

    def _start_controller(self) -> None:
        import uvicorn

        from pdscale.controller import Controller, SystemClock, create_app, reader_from_spec

        assert self.prometheus_url is not None
        self.pdscale = Controller(self.spec, None, reader_from_spec(self.spec,
                                                                   url=self.prometheus_url),
                                  clock=SystemClock(), identity="stackrun",
                                  leader_election=False, backend=self.stack.actuator,
                                  policy=self.policy, extra_signals=tuple(self.extra_signals))
        port = self.api_port or free_port()
        self.pdscale.expose("127.0.0.1")
        self._server = uvicorn.Server(uvicorn.Config(create_app(self.pdscale), host="127.0.0.1",
                                                     port=port, log_level="warning"))
        thread = threading.Thread(target=self._server.run, name="stackrun-api", daemon=True)
        thread.start()
        self._threads.append(thread)
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise StackRunError(f"the controller's API did not start on 127.0.0.1:{port}")
            time.sleep(0.05)
        self.api_url = f"http://127.0.0.1:{port}"
        self.pdscale.start()
        # Between the controller's ticks the actuator reaps, replaces and probes workers.
        supervisor = threading.Thread(target=self.stack.actuator.run, args=(self._stop, 0.5),
                                      name="stackrun-workers", daemon=True)
        supervisor.start()
        self._threads.append(supervisor)

    # -- reading ----------------------------------------------------------------------------

    def replica_counts(self) -> dict[str, int]:
        """Ready workers per pool now (for the replayer's worker-hours)."""
        counts: dict[str, int] = self.stack.replica_counts()
        return counts


def _no_dynamo() -> ServiceSpec:
    raise StackRunError("the spec has no service with engine: dynamo; the loopback stack runs "
                        "Dynamo (try examples/dynamo.yaml)")
