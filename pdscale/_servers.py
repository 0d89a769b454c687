"""Local servers on loopback: free ports, the distribution's Prometheus and Alertmanager command
lines, readiness polling and process checks. ``pdscale up`` and the end-to-end tests start
their servers with these, so both run them the same way."""

from __future__ import annotations

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
    "alertmanager_argv",
    "alive",
    "find_binary",
    "free_port",
    "loopback_spec",
    "prometheus_argv",
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
