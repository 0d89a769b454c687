"""Worker processes on this host, for :class:`controller._process.ProcessActuator`: how to
start one (:class:`WorkerTemplate`), how to probe it (health and load over HTTP), and how to
signal and stop processes by group, including those another process recorded in its state
file (``pdscale down``). A recorded PID is trusted only while its kernel start time matches,
so a recycled PID is never signalled."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from pdscale.controller._kube import KubeRejected, KubeUnavailable
from pdscale.controller._reconciler import Clock, SystemClock

__all__ = [
    "HttpProber",
    "Prober",
    "ProcessHandle",
    "WorkerTemplate",
    "free_loopback_port",
    "is_ours",
    "process_is_zombie",
    "process_start_ticks",
    "signal_group",
    "spawn_process",
    "stop_pids",
    "stop_recorded",
    "sum_metric",
    "write_atomic",
]

@dataclass(frozen=True)
class WorkerTemplate:
    """How to start one worker of a pool."""

    argv: tuple[str, ...]
    """The worker's command line; ``{port}`` and ``{name}`` are replaced per worker."""
    name_prefix: str
    """Workers are named ``<name_prefix>-<n>`` (pod-like; n counts up over the pool's life)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to this process's environment; ``{port}`` and ``{name}`` are replaced."""
    cold_start_s: float = 0.0
    """Seconds between a scale-up and the worker's own start (see the module docstring)."""
    health_path: str = "/health"
    """Answered with 200 on ``127.0.0.1:{port}`` when the worker is ready."""
    metrics_path: str = "/metrics"
    load_metric: str | None = "dynamo_component_inflight_requests"
    """Prometheus series summed over the worker's ``/metrics`` to pick the least loaded on
    scale-down; None: newest first."""
    scrape_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the pool's scrape targets (``namespace`` ...); ``pod`` is the worker's name."""
    log_dir: Path | None = None
    """Each worker's output goes to ``<log_dir>/<name>.log``; None: discarded."""
    launcher_python: str = sys.executable
    """The Python that runs the cold-start launcher (any Python 3)."""

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("The 'argv' parameter of WorkerTemplate must name a command. "
                             "Got an empty command line.")
        if not self.cold_start_s >= 0:
            raise ValueError("The 'cold_start_s' parameter of WorkerTemplate must be >= 0. "
                             f"Got {self.cold_start_s!r}.")


class ProcessHandle(Protocol):
    @property
    def pid(self) -> int:
        ...

    def poll(self) -> int | None:
        ...


class Prober(Protocol):
    def healthy(self, port: int, template: WorkerTemplate) -> bool:
        ...

    def load(self, port: int, template: WorkerTemplate) -> float | None:
        ...


@dataclass(frozen=True)
class HttpProber:
    """Health and load over HTTP on 127.0.0.1, each call bounded by ``timeout_s``."""

    timeout_s: float = 0.5

    def _get(self, port: int, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), b""
        except (OSError, ValueError):
            return 0, b""

    def healthy(self, port: int, template: WorkerTemplate) -> bool:
        return self._get(port, template.health_path)[0] == 200

    def load(self, port: int, template: WorkerTemplate) -> float | None:
        if template.load_metric is None:
            return None
        status, body = self._get(port, template.metrics_path)
        if status != 200:
            return None
        return sum_metric(body.decode("utf-8", "replace"), template.load_metric)


def sum_metric(exposition: str, name: str) -> float | None:
    """The sum of every sample of ``name`` in a text exposition; None when there is none."""
    total, seen = 0.0, False
    for line in exposition.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if not rest or rest[0] not in " {":
            continue
        try:
            total += float(line.rsplit(None, 1)[-1])
            seen = True
        except ValueError:
            continue
    return total if seen else None


def free_loopback_port(low: int | None = None, high: int | None = None) -> int:
    """A port free on 127.0.0.1 now: the kernel's pick, or one in ``[low, high]`` (Dynamo
    reads ``DYN_SYSTEM_PORT`` as a signed 16-bit number, so its workers need ports below
    32768, under the kernel's usual ephemeral range)."""
    if low is None or high is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise KubeUnavailable(f"no free port on 127.0.0.1 in {low}-{high} after 200 tries")


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """``<proc>/<pid>/stat`` from field 3 on (the command name, field 2, may hold spaces and
    parentheses, so split after its last ``)``); None where unreadable."""
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_ticks(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), to
    tell a recorded process from a later one that reuses its PID; None where unreadable."""
    fields = _stat_fields(pid, proc)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def process_is_zombie(pid: int, *, proc: Path = Path("/proc")) -> bool:
    """True when ``pid`` has exited and only waits to be reaped (state ``Z``)."""
    fields = _stat_fields(pid, proc)
    return fields is not None and fields[:1] == ["Z"]


def is_ours(pid: int, start_ticks: int | None) -> bool:
    """True while the recorded process is alive (not a zombie) and still the same one."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    if process_is_zombie(pid):
        return False
    return start_ticks is None or process_start_ticks(pid) in (None, start_ticks)


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to the process group ``pid`` leads (each worker has its own session);
    False when it is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def spawn_process(argv: Sequence[str], env: Mapping[str, str], log_path: Path | None,
                  ) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with this environment plus ``env``, output to
    ``log_path`` (appended) or discarded, standard input closed."""
    out: IO[bytes] | int
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = log_path.open("ab")
    else:
        out = subprocess.DEVNULL
    try:
        return subprocess.Popen(list(argv), env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if not isinstance(out, int):
            out.close()


def stop_recorded(state_file: Path, clock: Clock | None = None, *,
                  grace_s: float = 10.0) -> list[str]:
    """Stop every worker recorded in a :class:`ProcessActuator` state file (SIGTERM, then
    SIGKILL after ``grace_s``) from any process; returns the names of those that were
    running. Missing file: nothing to do."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise KubeRejected(f"{state_file}: not a readable process-actuator state file ({exc});"
                           " stop its workers by hand (their PIDs are in it)") from exc
    records = [(str(w["name"]), int(w["pid"]), w.get("start_ticks"))
               for pool in state.get("pools", {}).values() for w in pool.get("workers", [])]
    return stop_pids(records, clock or SystemClock(), grace_s=grace_s)


def stop_pids(records: Sequence[tuple[str, int, int | None]], clock: Clock, *,
              grace_s: float) -> list[str]:
    """SIGTERM each (name, pid, start ticks) still ours, wait up to ``grace_s`` on ``clock``,
    SIGKILL what is left; returns the names that were running. Our own children are reaped,
    so nothing is left behind, not even a zombie."""
    running = [(name, pid) for name, pid, ticks in records if is_ours(pid, ticks)]
    for _, pid in running:
        signal_group(pid, signal.SIGTERM)
    left = {pid for _, pid in running}
    idle = threading.Event()
    for sig, bound_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGKILL:
            for pid in left:
                signal_group(pid, signal.SIGKILL)
        deadline = clock.now() + bound_s
        while left:
            left = {pid for pid in left if not _gone(pid)}
            if not left or clock.now() >= deadline:
                break
            clock.wait(0.02, idle)
    return [name for name, _ in running]


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited: reaped when it is our child (a process whose main thread
    exited while others still run shows as a zombie before it can be reaped), else no longer
    running."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not is_ours(pid, None)
    return done == pid


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

