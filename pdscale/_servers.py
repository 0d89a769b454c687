"""Local servers on loopback: free ports, the distribution's Prometheus and Alertmanager command
lines, readiness polling and process checks. ``pdscale up`` and the end-to-end tests start
their servers with these, so both run them the same way.

A PID alone does not name a process for long: after the process exits, or the host reboots, the
kernel hands the number to another one, and ``pdscale down`` would signal a stranger. So
``pdscale up`` records each process's kernel start time and the boot's id beside its PID
(:func:`process_record`), and :func:`recorded_process` trusts a PID only while both still match
(``controller.process_start_ticks``, with which the process actuator tells its workers
apart)."""

from __future__ import annotations

import enum
import os
import shutil
import socket
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pdscale.spec import Spec

__all__ = [
    "ProcessState",
    "alertmanager_argv",
    "alive",
    "find_binary",
    "free_port",
    "loopback_spec",
    "process_record",
    "prometheus_argv",
    "recorded_process",
    "wait_ready",
]

_BINARIES = {"prometheus": ("prometheus",),
             "alertmanager": ("prometheus-alertmanager", "alertmanager")}


class _Process(Protocol):
    def poll(self) -> int | None:
        ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(name: str) -> str | None:
    """The path of ``prometheus`` or ``alertmanager`` (Debian names it
    prometheus-alertmanager), or None."""
    for candidate in _BINARIES[name]:
        path = shutil.which(candidate)
        if path is not None:
            return path
    return None


def prometheus_argv(binary: str, config: Path, data: Path, port: int) -> list[str]:
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]


def alertmanager_argv(binary: str, config: Path, data: Path, port: int) -> list[str]:
    """Alertmanager alone (no HA cluster listener)."""
    return [binary, f"--config.file={config}", f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=warn"]


def wait_ready(url: str, timeout_s: float, proc: _Process) -> bool:
    """Poll ``url`` until it answers 200; False when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


_PROC = Path("/proc")


class ProcessState(enum.Enum):
    """What a PID recorded by ``pdscale up`` holds now."""

    OURS = "ours"
    """Still the process pdscale started: its start time (or, in an older record, its command
    line) matches."""
    GONE = "gone"
    """Nothing runs under the PID (or only a zombie)."""
    REPLACED = "replaced"
    """Another process holds the PID now (it was reused, or the host rebooted)."""
    UNCONFIRMED = "unconfirmed"
    """A process runs under the PID but /proc cannot tell whether it is pdscale's."""


def _boot_id(proc: Path) -> str | None:
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def _cmdline(pid: int, proc: Path) -> list[str] | None:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def process_record(pid: int, *, proc: Path = _PROC) -> dict[str, Any]:
    """What to store beside ``pid`` to recognise the process later: its start time in clock
    ticks since boot (``start_ticks``) and this boot's id (``boot_id``); each None where
    ``proc`` cannot tell (then :func:`recorded_process` never confirms it)."""
    from pdscale.controller import process_start_ticks

    return {"start_ticks": process_start_ticks(pid, proc=proc), "boot_id": _boot_id(proc)}


def recorded_process(record: Mapping[str, Any], *, folder: Path,
                     proc: Path = _PROC) -> ProcessState:
    """What ``record`` (``{"pid": ..., **process_record(pid)}`` as ``pdscale up`` wrote it in
    ``folder``) holds now. A record without ``start_ticks`` (written before pdscale recorded
    it) is confirmed by the command line instead: every process ``pdscale up`` starts names a
    file in its folder."""
    pid = int(record["pid"])
    if pid <= 0:
        return ProcessState.GONE
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return ProcessState.GONE
    except PermissionError:
        pass  # another user's process: still compare it (``pdscale up`` may have run as root)
    from pdscale.controller import process_is_zombie, process_start_ticks

    if process_is_zombie(pid, proc=proc):
        return ProcessState.GONE
    if "start_ticks" not in record:
        argv = _cmdline(pid, proc)
        if argv is None:
            return ProcessState.UNCONFIRMED
        inside = f"{folder.resolve()}{os.sep}"  # an empty command line: a kernel thread
        return ProcessState.OURS if any(inside in arg for arg in argv) \
            else ProcessState.REPLACED
    start_ticks, boot_id = record.get("start_ticks"), record.get("boot_id")
    if not isinstance(start_ticks, int):
        return ProcessState.UNCONFIRMED
    boot_now = _boot_id(proc)
    if isinstance(boot_id, str) and boot_now is not None and boot_id != boot_now:
        return ProcessState.REPLACED  # the host rebooted since: the PID is someone else's
    ticks_now = process_start_ticks(pid, proc=proc)
    if ticks_now is None:
        return ProcessState.UNCONFIRMED
    return ProcessState.OURS if ticks_now == start_ticks else ProcessState.REPLACED


def write_rule_files(files: Mapping[str, str], folder: Path) -> list[str]:
    """Write the ``rules/`` entries of ``alerts.alert_files(spec)`` under ``folder``; returns
    their absolute paths for Prometheus' ``rule_files``."""
    paths = []
    for rel, text in files.items():
        if rel.startswith("rules/"):
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            paths.append(str(path.resolve()))
    return paths


def loopback_spec(spec: Spec, service: str, *, prometheus_url: str, controller_url: str,
                  tick_s: int) -> dict[str, Any]:
    """The spec as a local stack runs it (``pdscale up``, both engines), as plain data: the one
    service, the controller ticking every ``tick_s`` on the local Prometheus without a Lease,
    the webhook at the local controller (loopback, so no token)."""
    raw: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["services"] = [s for s in raw["services"] if s["name"] == service]
    raw.pop("gpu_budget", None)
    raw["controller"].update({"tick": tick_s, "prometheus": {
        **raw["controller"]["prometheus"], "url": prometheus_url, "history": 3600}})
    raw["controller"]["leader_election"]["enabled"] = False
    raw["alerts"]["webhook"] = {**raw["alerts"]["webhook"],
                                "url": f"{controller_url}/v1/alerts/alertmanager"}
    raw["alerts"]["webhook"].pop("credentials_file", None)
    raw["reactions"]["auth"] = {}
    return raw
