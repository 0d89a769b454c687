"""A real NVIDIA Dynamo serving stack on loopback: its frontend and router in front of its mocker
workers, prefill and decode disaggregated, as separate processes, no GPU, no etcd, no NATS.

:class:`DynamoStack` builds the tiny model folder (``simulator._tinymodel``), starts the frontend
and, through a :class:`controller._process.ProcessActuator`, one mocker process per replica of
each pool of a spec service (engine ``dynamo``), every one on free 127.0.0.1 ports, waits until
the frontend lists the model and routes to every worker, and records what it started in
``<folder>/stack.json`` (the frontend) and ``<folder>/workers.json`` (the workers), so that
:func:`stop_stack` (``pdscale down``) can stop everything by PID from another process.

What was measured with Dynamo 1.6.1 (shared/REFERENCE.md section 6, and here):

* Discovery through files (``DYN_DISCOVERY_BACKEND=file``, ``DYN_FILE_KV=<dir>``) and a TCP
  request plane, every listener on 127.0.0.1; ``HOME`` is a scratch folder because the frontend
  caches model cards under ``~/.cache``.
* A worker's ``/health`` (on ``DYN_SYSTEM_PORT``) answers 503 ``notready`` for ever unless
  ``DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]'`` ties it to the ``generate``
  endpoint: then it is 200 once the worker is registered, and 503 again from its SIGTERM.
* The Dynamo namespace (``DYN_NAMESPACE`` for workers, ``--namespace`` for the frontend) is the
  spec's ``dynamo.namespace``: the workers' ``dynamo_component_*`` series carry it as
  ``dynamo_namespace``; the frontend's series carry only ``model`` (the spec's model name).
  Kubernetes labels (``namespace``, ``pod``) come from the scrape config, as a PodMonitor adds
  them: :meth:`DynamoStack.scrape_configs`.
* Worker pods are named ``<pool target name>-<n>``, which the pool's default pod regex
  (``<target name>-.*``) matches; a spec whose pod regex does not match is refused.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pdscale.controller import (
    Clock,
    PoolKey,
    ProcessActuator,
    SystemClock,
    WorkerTemplate,
    free_loopback_port,
    process_start_ticks,
    spawn_process,
    stop_pids,
    stop_recorded,
    targets_file_name,
)
from pdscale.simulator._tinymodel import build_tiny_model
from pdscale.spec import Engine, Role, ServiceSpec

__all__ = [
    "DYNAMO_VERSION",
    "DynamoNotInstalled",
    "DynamoStack",
    "StackError",
    "dynamo_python",
    "stop_stack",
]

DYNAMO_VERSION = "1.6.1"
_COMPONENT = {Role.PREFILL: "prefill", Role.DECODE: "backend"}
"""The Dynamo component each pool's workers register (and label their series with)."""


class StackError(RuntimeError):
    """The stack could not start (the message says which process and where its log is)."""


class DynamoNotInstalled(StackError):
    """Dynamo's packages are not in their venv: run scripts/dynamo-setup.sh."""


def dynamo_python(root: Path | None = None) -> Path:
    """The Python of the Dynamo venv: ``$PDSCALE_DYNAMO_PYTHON``, else
    ``<repository>/.venv-dynamo/bin/python``. Raises :class:`DynamoNotInstalled` when it is
    missing or lacks Dynamo."""
    env = os.environ.get("PDSCALE_DYNAMO_PYTHON")
    if env:
        path = Path(env)
    else:
        base = root or Path(__file__).resolve().parents[2]
        path = base / ".venv-dynamo" / "bin" / "python"
    if not path.is_file():
        raise DynamoNotInstalled(
            f"Dynamo's Python {path} does not exist: run scripts/dynamo-setup.sh (it installs "
            f"ai-dynamo {DYNAMO_VERSION} into .venv-dynamo), or set PDSCALE_DYNAMO_PYTHON")
    if not list(path.parent.parent.glob("lib/python*/site-packages/dynamo/mocker")):
        raise DynamoNotInstalled(f"{path} has no dynamo package: run scripts/dynamo-setup.sh")
    return path


def dynamo_env(folder: Path) -> dict[str, str]:
    """The environment every process of the stack shares: file discovery under ``folder``,
    TCP request plane, every listener on 127.0.0.1, no hub access."""
    return {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(folder / "discovery"),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "HOME": str(folder / "home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _pod_prefix(service: ServiceSpec, role: Role) -> str:
    pool = service.pools[role]
    prefix = pool.target.name
    other = service.pools.get(Role.DECODE if role is Role.PREFILL else Role.PREFILL)
    example = f"{prefix}-0"
    if re.fullmatch(pool.pod_regex, example) is None:
        raise StackError(
            f"services.{service.name}.pools.{role.value}.selector.pod_regex "
            f"{pool.pod_regex!r} does not match the stack's worker name {example!r} "
            f"(<target name>-<n>): remove pod_regex or make it match")
    if other is not None and re.fullmatch(other.pod_regex, example) is not None:
        raise StackError(
            f"the {role.value} worker name {example!r} also matches the other pool's pod_regex "
            f"{other.pod_regex!r}: give the pools distinct target names or regexes")
    return prefix


class DynamoStack:
    """A Dynamo frontend and mocker workers for one spec service (see the module docstring).

    ``replicas`` per role defaults to each pool's ``min_replicas``; ``cold_start_s`` per role to
    each pool's ``cold_start`` (applied to scale-ups and replacements, not to the first start).
    """

    def __init__(self, service: ServiceSpec, folder: Path, *, python: Path | None = None,
                 replicas: Mapping[Role, int] | None = None,
                 cold_start_s: Mapping[Role, float] | None = None,
                 clock: Clock | None = None, ports: Callable[[], int] | None = None,
                 mocker_args: Sequence[str] = (), frontend_args: Sequence[str] = (),
                 migration_limit: int = 0, kill_after_s: float = 30.0) -> None:
        if service.engine is not Engine.DYNAMO:
            raise StackError(f"service {service.name!r} has engine {service.engine.value!r}; "
                             "the loopback stack runs engine 'dynamo' services")
        missing = [r.value for r in Role if r not in service.pools]
        if missing:
            raise StackError(f"service {service.name!r} has no {' or '.join(missing)} pool; "
                             "the stack runs disaggregated prefill and decode pools")
        self.service = service
        self.folder = folder.resolve()
        self.python = python
        self.clock: Clock = clock or SystemClock()
        self.ports = ports or _system_port
        self.replicas = {r: (replicas or {}).get(r, service.pools[r].min_replicas) for r in Role}
        self.cold_start_s = {r: float((cold_start_s or {}).get(r, service.pools[r].cold_start))
                             for r in Role}
        self.mocker_args = tuple(mocker_args)
        self.frontend_args = tuple(frontend_args)
        self.migration_limit = migration_limit
        self.kill_after_s = kill_after_s
        self.namespace = service.dynamo.namespace if service.dynamo is not None else "dynamo"
        self.model_name = service.model_name
        self.frontend_port: int | None = None
        self.frontend_pid: int | None = None
        self._frontend: Any = None
        self.actuator: ProcessActuator | None = None
        self._supervisor: threading.Thread | None = None
        self._stop_supervisor = threading.Event()

    # -- paths ------------------------------------------------------------------------------

    @property
    def model_dir(self) -> Path:
        return self.folder / "model"

    @property
    def state_file(self) -> Path:
        return self.folder / "stack.json"

    @property
    def workers_file(self) -> Path:
        return self.folder / "workers.json"

    @property
    def targets_dir(self) -> Path:
        return self.folder / "targets"

    @property
    def frontend_url(self) -> str:
        if self.frontend_port is None:
            raise StackError("the stack has not been started")
        return f"http://127.0.0.1:{self.frontend_port}"

    def keys(self) -> dict[Role, PoolKey]:
        return {r: (self.service.name, r) for r in Role}

    def frontend_pod(self) -> str:
        return f"{self.service.name}-frontend-0"

    def scrape_labels(self, role: Role | None) -> dict[str, str]:
        """What a PodMonitor would add to a pod's series (``pod`` comes per target)."""
        labels = {"namespace": self.service.namespace, "container": "main"}
        if role is None:
            labels["role"] = "frontend"
            return labels
        labels["role"] = role.value
        labels.update(self.service.pools[role].selector.match_labels)
        return labels

    # -- lifecycle --------------------------------------------------------------------------

    def worker_templates(self, python: Path) -> dict[PoolKey, WorkerTemplate]:
        env = {**dynamo_env(self.folder), "DYN_NAMESPACE": self.namespace,
               "DYN_SYSTEM_PORT": "{port}",
               "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]'}
        out = {}
        for role, key in self.keys().items():
            argv = (str(python), "-m", "dynamo.mocker", "--model-path", str(self.model_dir),
                    "--model-name", self.model_name, "--disaggregation-mode", role.value,
                    "--discovery-backend", "file", *self.mocker_args)
            out[key] = WorkerTemplate(
                argv=argv, name_prefix=_pod_prefix(self.service, role), env=env,
                cold_start_s=self.cold_start_s[role], scrape_labels=self.scrape_labels(role),
                log_dir=self.folder / "logs")
        return out

    def start(self, *, timeout_s: float = 60.0) -> DynamoStack:
        """Build the model folder, start the frontend and the workers, wait until the
        frontend routes to all of them. On failure everything started is stopped and a
        :class:`StackError` says which process failed and where its log is."""
        python = self.python or dynamo_python()
        if self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            pid = state.get("frontend", {}).get("pid")
            if pid is not None and process_start_ticks(int(pid)) == state["frontend"].get(
                    "start_ticks"):
                raise StackError(f"a stack is already running in {self.folder}: stop it first "
                                 "(pdscale down, or simulator.stop_stack)")
        for sub in ("discovery", "home", "logs", "targets"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for old in (self.folder / "discovery").glob("*"):
            _remove_tree(old)
        for old in (self.folder / "logs").glob("*.log"):
            old.unlink()
        build_tiny_model(self.model_dir)
        templates = self.worker_templates(python)
        self.frontend_port = self.ports()
        argv = [str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                "--http-port", str(self.frontend_port), "--discovery-backend", "file",
                "--namespace", self.namespace, *self.frontend_args]
        if self.migration_limit:
            argv += ["--migration-limit", str(self.migration_limit)]
        env = dynamo_env(self.folder)
        self._frontend = spawn_process(argv, env, self.folder / "logs" / "frontend.log")
        self.frontend_pid = int(self._frontend.pid)
        self.actuator = ProcessActuator(templates, clock=self.clock,
                                        state_file=self.workers_file,
                                        targets_dir=self.targets_dir, ports=self.ports,
                                        kill_after_s=self.kill_after_s)
        self._write_state()
        try:
            self.actuator.start({self.keys()[r]: n for r, n in self.replicas.items()})
            self.wait_routable(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_state(self) -> None:
        state = {"service": self.service.name, "namespace": self.namespace,
                 "model": self.model_name, "frontend": {
                     "name": self.frontend_pod(), "pid": self.frontend_pid,
                     "port": self.frontend_port,
                     "start_ticks": process_start_ticks(self.frontend_pid or -1)},
                 "workers_file": self.workers_file.name, "dynamo_version": DYNAMO_VERSION,
                 "start_delay_s": {r.value: s for r, s in self.cold_start_s.items()}}
        self.state_file.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")

    def wait_routable(self, *, timeout_s: float = 60.0,
                      counts: Mapping[Role, int] | None = None) -> None:
        """Wait until the frontend lists the model and has every ready worker registered
        (per role: ``counts``, default the actuator's ready workers and at least the
        configured replicas); raises :class:`StackError` on timeout or a dead process."""
        assert self.actuator is not None
        deadline = self.clock.now() + timeout_s
        idle = threading.Event()
        want = dict(counts) if counts is not None else dict(self.replicas)
        last = ""
        while True:
            if self._frontend is not None and self._frontend.poll() is not None:
                raise StackError(f"the Dynamo frontend exited ({self._frontend.poll()}): see "
                                 f"{self.folder / 'logs' / 'frontend.log'}\n"
                                 + _tail(self.folder / "logs" / "frontend.log"))
            statuses = self.actuator.read_statuses(list(self.keys().values()))
            seen = self.frontend_instances()
            ok = self.model_listed()
            for role, key in self.keys().items():
                status = statuses[key]
                if isinstance(status, Exception):
                    raise StackError(str(status))
                if self.actuator.crashes(key) >= 2:
                    logs = self.folder / "logs"
                    last_log = max(logs.glob(f"{self.service.pools[role].target.name}-*.log"),
                                   key=lambda p: p.stat().st_mtime, default=logs / "none")
                    raise StackError(f"the {role.value} workers exit before they are ready "
                                     f"(see {last_log}):\n" + _tail(last_log))
                need = max(want.get(role, 0), status.ready)
                ok = ok and status.ready >= want.get(role, 0) and seen.get(role, 0) >= need
            last = f"model listed {self.model_listed()}, instances {seen}, statuses {statuses}"
            if ok:
                return
            if self.clock.now() >= deadline:
                logs = self.folder / "logs"
                raise StackError(f"the Dynamo stack was not routable within {timeout_s:g} s "
                                 f"({last}); logs in {logs}\n" + _tail(logs / "frontend.log"))
            self.clock.wait(0.1, idle)

    def _get_json(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"{self.frontend_url}{path}", timeout=1.0) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def model_listed(self) -> bool:
        body = self._get_json("/v1/models")
        return isinstance(body, dict) and any(m.get("id") == self.model_name
                                              for m in body.get("data", []))

    def frontend_instances(self) -> dict[Role, int]:
        """Workers the frontend has discovered, per role (its ``/health`` instance list)."""
        body = self._get_json("/health")
        out = {r: 0 for r in Role}
        if not isinstance(body, dict):
            return out
        for inst in body.get("instances", []):
            if inst.get("endpoint") != "generate" or inst.get("namespace") != self.namespace:
                continue
            for role, component in _COMPONENT.items():
                if inst.get("component") == component:
                    out[role] += 1
        return out

    def supervise(self, interval_s: float = 0.5) -> None:
        """Keep the pools at their desired size from a background thread (reap, replace,
        escalate drains; :meth:`controller._process.ProcessActuator.run`) until :meth:`stop`.
        A controller driving the actuator does this on its own ticks."""
        assert self.actuator is not None, "start the stack first"
        if self._supervisor is not None:
            return
        self._stop_supervisor.clear()
        self._supervisor = threading.Thread(target=self.actuator.run,
                                            args=(self._stop_supervisor, interval_s),
                                            name="pdscale-stack-supervisor", daemon=True)
        self._supervisor.start()

    def replica_counts(self) -> dict[str, int]:
        """Worker processes per role, starting and draining included (what is billed)."""
        if self.actuator is None:
            return {r.value: 0 for r in Role}
        return {r.value: len(self.actuator.workers(k)) for r, k in self.keys().items()}

    def stop(self, *, grace_s: float = 10.0) -> list[str]:
        """Stop the workers, then the frontend (SIGTERM, SIGKILL after ``grace_s``); returns
        the names of the processes that were running."""
        stopped: list[str] = []
        if self._supervisor is not None:
            self._stop_supervisor.set()
            self._supervisor.join(timeout=10)
            self._supervisor = None
        if self.actuator is not None:
            stopped += self.actuator.stop(grace_s=grace_s)
        if self.frontend_pid is not None:
            stopped += stop_pids([(self.frontend_pod(), self.frontend_pid, None)], self.clock,
                                 grace_s=grace_s)
            if self._frontend is not None:
                self._frontend.poll()
        self.state_file.unlink(missing_ok=True)
        return stopped

    def __enter__(self) -> DynamoStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- Prometheus -------------------------------------------------------------------------

    def scrape_configs(self, *, discovery: str = "file",
                       interval: str = "2s") -> list[dict[str, Any]]:
        """Prometheus ``scrape_configs`` for the stack with the labels a PodMonitor adds
        (``namespace``, ``pod``, ``container``, ``role`` and the pools' ``match_labels``):
        the frontend as a static target; the workers through the ``file_sd`` files the
        actuator keeps current (``discovery="file"``, follows scaling) or as static targets
        of the workers running now (``discovery="static"``)."""
        if discovery not in ("file", "static"):
            raise ValueError("The 'discovery' parameter of scrape_configs must be 'file' or "
                             f"'static'. Got {discovery!r}.")
        name = self.service.name
        configs: list[dict[str, Any]] = [{
            "job_name": f"{name}-frontend", "scrape_interval": interval,
            "static_configs": [{"targets": [f"127.0.0.1:{self.frontend_port}"],
                                "labels": {**self.scrape_labels(None),
                                           "pod": self.frontend_pod()}}]}]
        for role, key in self.keys().items():
            job: dict[str, Any] = {"job_name": f"{name}-{role.value}",
                                   "scrape_interval": interval}
            if discovery == "file":
                job["file_sd_configs"] = [{"files": [str(self.targets_dir /
                                                         targets_file_name(key))],
                                           "refresh_interval": "5s"}]
            else:
                assert self.actuator is not None, "start the stack first"
                job["static_configs"] = [
                    {"targets": [f"127.0.0.1:{w.port}"],
                     "labels": {**self.scrape_labels(role), "pod": w.name}}
                    for w in self.actuator.workers(key) if w.phase != "draining"]
            configs.append(job)
        return configs


def _system_port() -> int:
    # DYN_SYSTEM_PORT is read as a signed 16-bit number: stay below 32768.
    return free_loopback_port(20000, 32767)


def stop_stack(folder: Path, clock: Clock | None = None, *, grace_s: float = 10.0) -> list[str]:
    """Stop a stack started in ``folder`` (possibly by another process): its workers, then its
    frontend, by the PIDs recorded there. Returns the names that were running."""
    folder = folder.resolve()
    clock = clock or SystemClock()
    state_file = folder / "stack.json"
    stopped = stop_recorded(folder / "workers.json", clock, grace_s=grace_s)
    if state_file.is_file():
        try:
            fe = json.loads(state_file.read_text()).get("frontend", {})
        except (OSError, ValueError) as exc:
            raise StackError(f"{state_file}: unreadable ({exc}); stop the frontend by hand"
                             ) from exc
        if fe.get("pid") is not None:
            stopped += stop_pids([(str(fe.get("name", "frontend")), int(fe["pid"]),
                                   fe.get("start_ticks"))], clock, grace_s=grace_s)
        state_file.unlink()
    return stopped


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _remove_tree(child)
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
