"""Process actuator: scale pools of worker processes on one host, as the scale subresource would.

A deployment mode for bare hosts (and the loopback Dynamo stack the tests run): each pool is a
set of local worker processes started from a :class:`WorkerTemplate`, and this actuator offers
what the controller asks of :class:`controller._kube.KubeScaleActuator` (``read_statuses``,
``set_replicas``, ``event``, ``prime``, ``dry_run``), reporting what a Kubernetes ``/scale``
status would: ``desired`` (spec.replicas), ``replicas`` (worker processes that exist and are not
terminating) and ``ready`` (those whose health endpoint answers 200).

Design decisions:

* **Cold start is part of the launch.** A pool's configured cold start is modelled by delaying
  the worker's own start: the process is created at once (it counts as a replica, not ready,
  like a pod pulling its image and loading weights) and a tiny launcher ``exec``\\ s the real
  command after the delay, so the worker becomes routable only then. Dynamo's mocker has a
  ``--startup-time`` flag, but it registers the worker at once and stalls its requests, which
  is not a cold start. The launcher's sleep runs in the child; the actuator itself never
  sleeps: "now" comes from the injected clock, and waiting goes through ``clock.wait``.
* **Self-healing, like a ReplicaSet.** Every :meth:`ProcessActuator.sync` (each status read and
  each write) reaps exited workers, replaces those that died unexpectedly (an Event says so;
  the replacement has the cold start too), and escalates a drain that outlasts
  ``kill_after_s`` to SIGKILL (Kubernetes' terminationGracePeriodSeconds, 30 s by default).
* **Scale-down drains.** The chosen workers get SIGTERM (Dynamo's workers leave ``/health`` at
  once, finish their streams and exit); they are chosen as a ReplicaSet would: workers not
  ready yet first (newest first), then the least loaded by their own ``/metrics`` (the
  template's ``load_metric``, summed), newest first among equals or when no load can be read
  (``victim_order="newest"`` or ``"random"`` ignores the load, as a ReplicaSet without
  deletion costs does: the baselines of ``bench/drain.py``). It is also a drain backend and
  work source (``controller._drain``): with ``controller.drain`` the drainer chooses the
  worker (the same rule, its reasons recorded) and :meth:`ProcessActuator.remove_replicas`
  stops exactly that one; SIGTERM cannot be undone, so a scale-up during a drain starts new
  workers, and ``kill_after_s`` is the drain's timeout.
* **Nothing left behind.** Every worker runs in its own session (process group), is signalled
  by group, and is recorded with its PID, port and kernel start time in a JSON state file
  that another process (``pdscale down``) can use to stop them; the start time guards
  against a recycled PID.
* **Scrape targets follow the pool.** The actuator writes a Prometheus ``file_sd`` file per pool
  (the labels a PodMonitor would add, ``pod`` per worker), listing a worker from its first
  healthy probe until it exits, so Prometheus scrapes new workers without a reload.

Limits (docs/bare-hosts.md): one host; ports are picked free on 127.0.0.1 (a race with other
programs is possible); workers started by another actuator are adopted only from its state
file; a worker that is wedged but alive and healthy is not detected; GPUs are not assigned.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pdscale.controller._drain import DrainConfig, Replica
from pdscale.controller._host import (
    HttpProber,
    Prober,
    ProcessHandle,
    WorkerTemplate,
    free_loopback_port,
    is_ours,
    process_is_zombie,
    process_start_ticks,
    signal_group,
    spawn_process,
    stop_pids,
    stop_recorded,
    sum_metric,
    write_atomic,
)
from pdscale.controller._interface import PoolKey
from pdscale.controller._kube import KubeRejected, ScaleStatus
from pdscale.controller._reconciler import Clock, SystemClock
from pdscale.controller._workers import WorkerInfo, _key_text, _Loss, _Pool, _Worker
from pdscale.telemetry import PodWork

__all__ = [
    "HttpProber",
    "Prober",
    "ProcessActuator",
    "ProcessHandle",
    "WorkerInfo",
    "WorkerTemplate",
    "free_loopback_port",
    "process_is_zombie",
    "process_start_ticks",
    "signal_group",
    "spawn_process",
    "stop_pids",
    "stop_recorded",
    "sum_metric",
    "targets_file_name",
]

log = logging.getLogger("pdscale.controller")

# Runs in the worker's own process: wait out the cold start, then become the worker (same PID).
_LAUNCHER = "import os,sys,time;time.sleep(float(sys.argv[1]));os.execvp(sys.argv[2],sys.argv[2:])"


_WARNING_EVENTS = frozenset({"WorkerExited", "WorkerKilled"})
"""Events a person should see at the default log level: work was lost or cut."""


class ProcessActuator:
    """Scales pools of local worker processes (see the module docstring)."""

    def __init__(self, templates: Mapping[PoolKey, WorkerTemplate], *,
                 clock: Clock | None = None, state_file: Path | None = None,
                 targets_dir: Path | None = None, prober: Prober | None = None,
                 spawn: Callable[[Sequence[str], Mapping[str, str], Path | None],
                                 ProcessHandle] = spawn_process,
                 ports: Callable[[], int] = free_loopback_port,
                 send_signal: Callable[[int, int], bool] = signal_group,
                 kill_after_s: float = 30.0, crash_backoff_s: float = 10.0,
                 max_backoff_s: float = 300.0, dry_run: bool = False,
                 victim_order: Literal["least_loaded", "newest", "random"] = "least_loaded",
                 seed: int = 0) -> None:
        if not templates:
            raise ValueError("The 'templates' parameter of ProcessActuator must name at least "
                             "one pool. Got none.")
        self.clock: Clock = clock or SystemClock()
        self.state_file = state_file
        self.targets_dir = targets_dir
        self.prober: Prober = prober or HttpProber()
        self.spawn = spawn
        self.ports = ports
        self.send_signal = send_signal
        self.kill_after_s = kill_after_s
        self.crash_backoff_s = crash_backoff_s
        self.max_backoff_s = max_backoff_s
        self.dry_run = dry_run
        self.victim_order = victim_order
        """Which ready worker a plain scale-down stops: the least loaded; the newest; or one
        at random (a ReplicaSet's logarithmic scale-down among pods of similar age)."""
        self._rng = random.Random(seed)
        self.writes: list[tuple[PoolKey, int]] = []
        self._killed: dict[PoolKey, dict[str, float | None]] = {}
        self.events: deque[tuple[float, PoolKey, str, str]] = deque(maxlen=500)
        self._pools = {key: _Pool(t) for key, t in templates.items()}
        self._lock = threading.RLock()

    # -- the controller's interface ---------------------------------------------------------

    def read_statuses(self, keys: Sequence[PoolKey]) -> dict[PoolKey, ScaleStatus | Exception]:
        """Per pool: desired, existing (not terminating) and ready workers, after a
        :meth:`sync`; an unknown pool gets a :class:`KubeRejected`."""
        out: dict[PoolKey, ScaleStatus | Exception] = {}
        with self._lock:
            self.sync()
            for key in keys:
                pool = self._pools.get(key)
                if pool is None:
                    out[key] = self._unknown(key)
                    continue
                active = [w for w in pool.workers if w.phase != "draining"]
                out[key] = ScaleStatus(pool.desired, len(active),
                                       sum(1 for w in active if w.healthy))
        return out

    def read_status(self, key: PoolKey) -> ScaleStatus:
        status = self.read_statuses([key])[key]
        if isinstance(status, Exception):
            raise status
        return status

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        """Set the pool's desired workers; starts (after the cold start) or drains workers
        at once. In dry run only records the write."""
        if replicas < 0:
            raise KubeRejected(f"pool {_key_text(key)}: replicas must be >= 0, got {replicas}")
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                raise self._unknown(key)
            if pool.desired == replicas:
                return
            self.writes.append((key, replicas))
            if self.dry_run:
                return
            before, pool.desired = pool.desired, replicas
            self.event(key, "PdscaleScaled", f"pdscale scaled {pool.template.name_prefix} "
                       f"from {before} to {replicas}: " + "; ".join(reasons))
            self.sync()

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        """Record an event (the log and :attr:`events`; there is no API server here): a worker
        that exited or was killed is a WARNING, the rest INFO (a scale is DEBUG: the
        reconcile loop logs it with its reasons)."""
        self.events.append((self.clock.now(), key, reason, message))
        level = logging.WARNING if reason in _WARNING_EVENTS else \
            logging.DEBUG if reason == "PdscaleScaled" else logging.INFO
        log.log(level, "%s on %s: %s", reason, _key_text(key), message)

    def prime(self) -> None:
        return

    def label_pod(self, namespace: str, pod: str, label: str, value: str) -> None:
        raise KubeRejected("the process actuator has no pods to relabel: drain_instance "
                           "reactions need Kubernetes")

    # -- pools ------------------------------------------------------------------------------

    def start(self, replicas: Mapping[PoolKey, int]) -> None:
        """Start pools at these sizes at once, without the cold start (an existing
        deployment coming up); then keep them there."""
        with self._lock:
            for key, n in replicas.items():
                pool = self._pools.get(key)
                if pool is None:
                    raise self._unknown(key)
                pool.desired = n
                self._converge(key, pool, self.clock.now(), delay_s=0.0)
            self._save()

    def crashes(self, key: PoolKey) -> int:
        """Workers of the pool in a row that exited before they were ever ready."""
        with self._lock:
            return self._pools[key].crashes

    def workers(self, key: PoolKey) -> list[WorkerInfo]:
        with self._lock:
            return [WorkerInfo(w.name, w.pid, w.port, w.phase, w.healthy, w.created_s)
                    for w in self._pools[key].workers]

    def sync(self) -> None:
        """Reap exited workers, replace those that died, escalate overdue drains, probe
        health, and start or drain workers towards the desired count."""
        with self._lock:
            now = self.clock.now()
            for key, pool in self._pools.items():
                self._reap(key, pool, now)
                for w in pool.workers:
                    if w.phase == "draining":
                        continue
                    w.healthy = self.prober.healthy(w.port, pool.template)
                    if w.healthy and w.phase == "starting":
                        w.phase = "ready"
                        pool.crashes = 0
                        lost = pool.replaces.pop(w.name, None)
                        if lost is None:
                            log.info("%s ready %.1f s after it was created", w.name,
                                     now - w.created_s)
                        else:
                            self.event(key, "WorkerReplaced", f"{w.name} (pid {w.pid}) is "
                                       f"ready {now - w.created_s:.1f} s after it was created, "
                                       f"replacing {lost}")
                if not self.dry_run:
                    delay = pool.template.cold_start_s
                    if pool.crashes:  # back off as Kubernetes' CrashLoopBackOff does
                        delay += min(self.max_backoff_s,
                                     self.crash_backoff_s * 2 ** (pool.crashes - 1))
                    self._converge(key, pool, now, delay_s=delay)
            self._save()

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """Call :meth:`sync` every ``interval_s`` until ``stop`` is set (a supervisor thread
        between the controller's ticks)."""
        while not stop.is_set():
            self.sync()
            if self.clock.wait(interval_s, stop):
                return

    def stop(self, *, grace_s: float = 10.0) -> list[str]:
        """Stop every worker (SIGTERM, SIGKILL after ``grace_s``) and forget them; returns
        the names that were running. Pools keep their templates; desired becomes 0."""
        with self._lock:
            records = []
            for pool in self._pools.values():
                pool.desired = 0
                records += [(w.name, w.pid, w.start_ticks) for w in pool.workers
                            if w.exit_code() is None]
            stopped = stop_pids(records, self.clock, grace_s=grace_s)
            for pool in self._pools.values():
                for w in pool.workers:
                    if w.handle is not None:
                        w.handle.poll()
                pool.workers.clear()
            self._save()
            return stopped

    def adopt(self) -> int:
        """Take over the workers recorded in the state file that are still running (another
        actuator, e.g. ``pdscale up``, started them); returns how many."""
        if self.state_file is None or not self.state_file.is_file():
            return 0
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            raise KubeRejected(f"{self.state_file}: not a readable state file ({exc})") from exc
        taken = 0
        with self._lock:
            for key, pool in self._pools.items():
                raw = state.get("pools", {}).get(_key_text(key))
                if raw is None:
                    continue
                pool.desired = int(raw.get("desired", 0))
                pool.next_index = max(pool.next_index, int(raw.get("next_index", 0)))
                known = {w.pid for w in pool.workers}
                for w in raw.get("workers", []):
                    ticks = w.get("start_ticks")
                    if int(w["pid"]) in known or not is_ours(int(w["pid"]), ticks):
                        continue
                    pool.workers.append(_Worker(
                        str(w["name"]), int(w["pid"]), int(w["port"]), float(w["created_s"]),
                        ticks, None, phase=w.get("phase", "starting"),
                        terminated_s=w.get("terminated_s")))
                    taken += 1
            self._save()
        return taken

    def report(self) -> dict[str, Any]:
        """Per pool, for ``/v1/status``: its workers (phase, PID, port, age) and the latest that
        exited unasked, each with its replacement's progress (starting for how long, against
        the cold start; ready; or none yet)."""
        with self._lock:
            now = self.clock.now()
            out: dict[str, Any] = {}
            for key, pool in self._pools.items():
                by_name = {w.name: w for w in pool.workers}
                losses = []
                for x in pool.losses:
                    row: dict[str, Any] = {"name": x.name, "pid": x.pid,
                                           "exit_status": _status(x.status),
                                           "while": x.phase, "at": x.at_s,
                                           "ago_s": round(now - x.at_s, 1),
                                           "replaced_by": x.replaced_by}
                    new = by_name.get(x.replaced_by or "")
                    if x.replaced_by is None:
                        row["replacement"] = "none started yet"
                    elif new is None:
                        row["replacement"] = "gone (exited or drained)"
                    elif new.phase == "starting":
                        row["replacement"] = (f"starting for {now - new.created_s:.0f} s (cold "
                                              f"start {pool.template.cold_start_s:g} s)")
                    else:
                        row["replacement"] = new.phase
                    losses.append(row)
                out[_key_text(key)] = {
                    "desired": pool.desired,
                    "workers": [{"name": w.name, "pid": w.pid, "port": w.port,
                                 "phase": w.phase, "age_s": round(now - w.created_s, 1)}
                                for w in pool.workers],
                    "exited": losses}
            return out

    def losses(self, key: PoolKey) -> str | None:
        """The pool's workers that exited unasked within the last ten minutes and are not yet
        replaced by a ready worker, in words (a degraded pool's reason names them)."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                return None
            now = self.clock.now()
            said = []
            for x in pool.losses:
                if now - x.at_s > 600 or (x.replaced_by is not None
                                          and x.replaced_by not in pool.replaces):
                    continue
                new = f"replacement {x.replaced_by} starting" if x.replaced_by else \
                    "no replacement yet"
                said.append(f"{x.name} exited ({_status(x.status)}) {now - x.at_s:.0f}s ago, "
                            f"{new}")
            return "; ".join(said) or None

    # -- internals --------------------------------------------------------------------------

    def _unknown(self, key: PoolKey) -> KubeRejected:
        known = ", ".join(_key_text(k) for k in self._pools)
        return KubeRejected(f"pool {_key_text(key)} has no worker template in the process "
                            f"actuator (it runs {known}): add the pool to the stack")

    def _reap(self, key: PoolKey, pool: _Pool, now: float) -> None:
        for w in list(pool.workers):
            code = w.exit_code()
            if code is None:
                if (w.phase == "draining" and not w.killed and w.terminated_s is not None
                        and now - w.terminated_s > self.kill_after_s):
                    held = self.prober.load(w.port, pool.template)
                    killed = self._killed.setdefault(key, {})
                    killed[w.name] = held
                    while len(killed) > 500:
                        killed.pop(next(iter(killed)))
                    self.send_signal(w.pid, signal.SIGKILL)
                    w.killed = True
                    self.event(key, "WorkerKilled", f"{w.name} (pid {w.pid}) still draining "
                               f"after {self.kill_after_s:g} s: sent SIGKILL")
                continue
            pool.workers.remove(w)
            if w.phase == "starting":
                pool.crashes += 1
            if w.phase == "draining":
                log.info("%s drained and exited (%s) %.1f s after SIGTERM", w.name, code,
                         now - (w.terminated_s or now))
            else:
                status = code if w.handle is not None else None  # adopted: not our child
                pool.losses.append(_Loss(w.name, w.pid, status, w.phase, now))
                replaced = pool.replaces.pop(w.name, None)  # died before it was ready
                label = w.name if replaced is None else f"{w.name} (replacing {replaced})"
                self.event(key, "WorkerExited", f"{label} (pid {w.pid}) exited "
                           f"({_status(status)}) while {w.phase}; a replacement will be "
                           "started")

    def _converge(self, key: PoolKey, pool: _Pool, now: float, *, delay_s: float) -> None:
        active = [w for w in pool.workers if w.phase != "draining"]
        for _ in range(pool.desired - len(active)):
            name = self._launch(pool, now, delay_s)
            lost = next((x for x in pool.losses if x.replaced_by is None), None)
            if lost is not None:
                lost.replaced_by = name
                pool.replaces[name] = lost.name
                self.event(key, "WorkerReplacing", f"{name} started to replace {lost.name}; "
                           f"ready after its cold start ({delay_s:g} s) and its own start-up")
        surplus = len(active) - pool.desired
        if surplus > 0:
            for w in self._victims(pool, active, surplus):
                w.phase = "draining"
                w.healthy = False
                w.terminated_s = now
                self.send_signal(w.pid, signal.SIGTERM)
                log.info("%s: SIGTERM (pid %d), draining", w.name, w.pid)

    def _victims(self, pool: _Pool, active: list[_Worker], n: int) -> list[_Worker]:
        """Not ready first (newest first), then least loaded, newest first among equals."""
        def order(w: _Worker) -> tuple[int, float, float, int]:
            if w.phase != "ready":
                return (0, 0.0, -w.created_s, -w.index)
            if self.victim_order == "newest":
                return (1, 0.0, -w.created_s, -w.index)
            if self.victim_order == "random":
                return (1, self._rng.random(), 0.0, 0)
            load = self.prober.load(w.port, pool.template)
            return (1, load if load is not None else 0.0, -w.created_s, -w.index)

        return sorted(active, key=order)[:n]

    # -- as a drain backend (controller._drain) ---------------------------------------------

    def drain_config(self, key: PoolKey, *, timeout_s: float, settle_s: float) -> DrainConfig:
        """SIGTERM is the mark and the removal at once, and cannot be undone; the drain's
        bound is this actuator's ``kill_after_s``."""
        return DrainConfig(timeout_s=self.kill_after_s, settle_s=0.0, removal="chosen",
                           reversible=False)

    def pool_replicas(self, key: PoolKey) -> list[Replica]:
        """Every worker of the pool after a :meth:`sync`, draining ones with their SIGTERM
        time."""
        with self._lock:
            self.sync()
            pool = self._pools.get(key)
            if pool is None:
                raise self._unknown(key)
            return [Replica(w.name, w.phase == "ready" and w.healthy, w.created_s,
                            draining_since_s=w.terminated_s if w.phase == "draining" else None,
                            killed=w.killed)
                    for w in pool.workers]

    def pod_work(self, key: PoolKey, now_s: float) -> dict[str, PodWork]:
        """Each ready worker's load by its own ``/metrics`` (the template's ``load_metric``)
        as running requests, sampled now; a worker whose load cannot be read is left out
        (unknown)."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                raise self._unknown(key)
            workers = [(w.name, w.port) for w in pool.workers if w.phase == "ready"]
            template = pool.template
        out = {}
        for name, port in workers:
            load = self.prober.load(port, template)
            if load is not None:
                out[name] = PodWork(load, None, None, now_s)
        return out

    def stop_routing(self, key: PoolKey, name: str, *, since_s: float, reason: str) -> None:
        raise KubeRejected("a worker process cannot leave routing and come back: its drain "
                           "is its SIGTERM (remove_replicas)")

    def resume_routing(self, key: PoolKey, name: str) -> None:
        raise KubeRejected("a SIGTERMed worker cannot be taken back")

    def remove_replicas(self, key: PoolKey, names: Sequence[str], replicas: int,
                        reasons: Sequence[str]) -> None:
        """SIGTERM exactly the named workers (they drain and exit; SIGKILL after
        ``kill_after_s``) and lower the desired count to ``replicas``."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                raise self._unknown(key)
            self.writes.append((key, replicas))
            if self.dry_run:
                return
            now = self.clock.now()
            chosen = [w for w in pool.workers if w.name in set(names) and w.phase != "draining"]
            for w in chosen:
                w.phase = "draining"
                w.healthy = False
                w.terminated_s = now
                self.send_signal(w.pid, signal.SIGTERM)
                log.info("%s: SIGTERM (pid %d), draining (chosen by the drainer)", w.name,
                         w.pid)
            before, pool.desired = pool.desired, replicas
            self.event(key, "PdscaleScaled", f"pdscale scaled {pool.template.name_prefix} "
                       f"from {before} to {replicas}, stopping "
                       f"{', '.join(w.name for w in chosen)}: " + "; ".join(reasons))
            self.sync()

    def killed_drains(self, key: PoolKey) -> dict[str, float | None]:
        """Workers of the pool killed at ``kill_after_s`` while draining, with the load each
        still had then (None when unreadable)."""
        with self._lock:
            return dict(self._killed.get(key, {}))

    def _launch(self, pool: _Pool, now: float, delay_s: float) -> str:
        t = pool.template
        name = f"{t.name_prefix}-{pool.next_index}"
        pool.next_index += 1
        port = self.ports()

        def fill(text: str) -> str:
            return text.replace("{port}", str(port)).replace("{name}", name)

        argv = [fill(a) for a in t.argv]
        if delay_s > 0:
            argv = [t.launcher_python, "-c", _LAUNCHER, repr(float(delay_s)), *argv]
        env = {k: fill(v) for k, v in t.env.items()}
        log_path = t.log_dir / f"{name}.log" if t.log_dir is not None else None
        try:
            handle = self.spawn(argv, env, log_path)
        except OSError as exc:
            raise KubeRejected(f"cannot start {name}: {argv[0]}: {exc}; check the pool's "
                               "worker command") from exc
        pool.workers.append(_Worker(name, handle.pid, port, now,
                                    process_start_ticks(handle.pid), handle))
        log.info("%s: started pid %d on port %d (ready after %g s of cold start)", name,
                 handle.pid, port, delay_s)
        return name

    def _save(self) -> None:
        if self.state_file is not None:
            state: dict[str, Any] = {"pools": {}}
            for key, pool in self._pools.items():
                state["pools"][_key_text(key)] = {
                    "desired": pool.desired, "next_index": pool.next_index,
                    "workers": [{"name": w.name, "pid": w.pid, "port": w.port,
                                 "created_s": w.created_s, "start_ticks": w.start_ticks,
                                 "phase": w.phase, "terminated_s": w.terminated_s}
                                for w in pool.workers]}
            write_atomic(self.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")
        if self.targets_dir is not None:
            for key, pool in self._pools.items():
                groups = [{"targets": [f"127.0.0.1:{w.port}"],
                           "labels": {**pool.template.scrape_labels, "pod": w.name}}
                          for w in pool.workers if w.phase != "starting"]
                write_atomic(self.targets_dir / targets_file_name(key),
                              json.dumps(groups, indent=2, sort_keys=True) + "\n")


def _status(code: int | None) -> str:
    """An exit status in words: a signal's name for a negative one (Popen's convention)."""
    if code is None:
        return "exit status unknown: not a child of this process"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


def targets_file_name(key: PoolKey) -> str:
    """The ``file_sd`` file of a pool under the actuator's ``targets_dir``."""
    return f"{key[0]}-{key[1].value}.json"
