"""The processes of a local stack (``pdscale up``): what it recorded, what runs under its
marker, each part's state, and stopping or restarting them.

A PID file alone cannot own a stack: a part restarted by hand (a controller run again from
its command line) is a process ``up.json`` never recorded, and it would go on scaling workers
after ``pdscale down`` had reported the stack stopped. So every process ``pdscale up`` starts
carries a marker in its environment, ``PDSCALE_UP_DIR=<the stack's folder>``, which its
children inherit (the controller's replacement workers too), and a controller started by hand
names the folder on its command line (``--spec <dir>/spec.yaml``, ``--dynamo-stack
<dir>/dynamo``). :func:`marked_processes` finds both in ``/proc`` (this user's processes);
``pdscale down`` stops what was recorded and what is marked, and reports success only when
nothing marked is left. A refused ``pdscale up`` looks at the same three sources (``up.json``,
the Dynamo stack's state files, the markers) before it writes anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdscale._servers import ProcessState, process_record, recorded_process

__all__ = ["MARKER_ENV", "RESTARTABLE", "Marked", "Part", "marked_processes", "render_parts",
           "stack_parts", "stop_marked"]

MARKER_ENV = "PDSCALE_UP_DIR"
"""The environment variable every process of a ``pdscale up`` stack carries: its folder."""
RESTARTABLE = ("controller", "prometheus", "alertmanager", "simulator")
"""The parts ``pdscale up --restart`` starts again from their recorded command line. Workers
are replaced by the controller when they exit; the frontend comes back with down and up."""
_PROC = Path("/proc")


@dataclass(frozen=True)
class Marked:
    """A running process that belongs to the stack by its marker or its command line."""

    pid: int
    start_ticks: int | None
    argv: tuple[str, ...]
    how: str
    """``environment`` (it carries the marker) or ``command line`` (a pdscale controller
    naming the folder)."""

    @property
    def is_controller(self) -> bool:
        return _is_pdscale_run(self.argv)

    def describe(self) -> str:
        shown = " ".join(self.argv)
        return shown if len(shown) <= 100 else shown[:97] + "..."


@dataclass(frozen=True)
class Part:
    """One part of the stack as ``pdscale up --status`` lists it."""

    name: str
    state: str
    """up, down, replaced (its PID belongs to another process now), unconfirmed."""
    pid: int | None
    port: int | None
    log: Path | None
    note: str = ""


def _is_pdscale_run(argv: Sequence[str]) -> bool:
    names = [Path(a).name for a in argv[:4]]
    return "run" in argv and ("pdscale" in argv or "pdscale" in names
                              or any(a.endswith("/pdscale") for a in argv[:2]))


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _start_ticks(pid: int, proc: Path) -> int | None:
    from pdscale.controller import process_start_ticks

    return process_start_ticks(pid, proc=proc)


def marked_processes(folder: Path, *, proc: Path = _PROC) -> list[Marked]:
    """This user's running processes that carry ``folder`` as their marker, or that are a
    ``pdscale run`` naming a file in ``folder`` on their command line; this process and its
    ancestors are never among them."""
    from pdscale.controller import process_is_zombie

    where = str(folder.resolve())
    marker = f"{MARKER_ENV}={where}".encode()
    inside = f"{where}{os.sep}"
    skip = _ancestors(proc)
    out: list[Marked] = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        raw = _read(entry / "cmdline")
        if not raw:
            continue  # gone, another user's, or a kernel thread
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        how = None
        environ = _read(entry / "environ")
        if environ is not None and marker in environ.split(b"\0"):
            how = "environment"
        elif _is_pdscale_run(argv):
            try:
                cwd = Path(os.readlink(entry / "cwd"))
            except OSError:
                cwd = Path("/")
            if any(str((cwd / a).resolve()).startswith(inside) or str(cwd / a) == where
                   for a in argv if "/" in a or a.endswith((".yaml", ".yml"))):
                how = "command line"
        if how is None or process_is_zombie(pid, proc=proc):
            continue
        out.append(Marked(pid, _start_ticks(pid, proc), argv, how))
    return sorted(out, key=lambda m: (not m.is_controller, m.pid))


def _ancestors(proc: Path) -> set[int]:
    """This process and its ancestors (never stopped, never counted as the stack's)."""
    seen = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        raw = _read(proc / str(pid) / "stat")
        if raw is None:
            break
        try:
            pid = int(raw.decode().rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            break
    return seen


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads, or to the process alone when it leads none
    (a controller started from a shell shares the shell's group)."""
    try:
        leader = os.getpgid(pid) == pid
        if leader:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return


def _still(m: Marked, proc: Path) -> bool:
    from pdscale.controller import process_is_zombie

    return _start_ticks(m.pid, proc) == m.start_ticks and not process_is_zombie(m.pid, proc=proc)


def stop_marked(found: Sequence[Marked], *, grace_s: float = 10.0,
                proc: Path = _PROC) -> tuple[list[Marked], list[Marked]]:
    """SIGTERM each process (only while it is still the one found), SIGKILL after
    ``grace_s``; returns (stopped, left). PermissionError is a process left."""
    left: list[Marked] = []
    running: list[Marked] = []
    for m in found:
        if not _still(m, proc):
            continue
        try:
            _signal(m.pid, signal.SIGTERM)
            running.append(m)
        except PermissionError:
            left.append(m)
    for sig, bound in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGKILL:
            for m in running:
                if _still(m, proc):
                    with contextlib.suppress(PermissionError):
                        _signal(m.pid, signal.SIGKILL)
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and any(_still(m, proc) for m in running):
            for m in running:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(m.pid, os.WNOHANG)
            time.sleep(0.1)
    stuck = [m for m in running if _still(m, proc)]
    return [m for m in running if m not in stuck], left + stuck


# -- status -------------------------------------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _port(url: str | None) -> int | None:
    import urllib.parse

    try:
        return urllib.parse.urlsplit(url or "").port
    except ValueError:
        return None


_STATE_WORD = {ProcessState.OURS: "up", ProcessState.GONE: "down",
               ProcessState.REPLACED: "down", ProcessState.UNCONFIRMED: "unconfirmed"}


def _alive(pid: int | None, ticks: Any, proc: Path) -> bool:
    from pdscale.controller import process_is_zombie

    if pid is None:
        return False
    now = _start_ticks(int(pid), proc)
    return now is not None and (ticks is None or now == ticks) and \
        not process_is_zombie(int(pid), proc=proc)


def stack_parts(folder: Path, *, proc: Path = _PROC) -> list[Part]:
    """Every part of the stack in ``folder``: the processes ``up.json`` records, the Dynamo
    frontend and workers (``dynamo/stack.json``, ``dynamo/workers.json``), and the marked
    processes none of those record (named ``unrecorded``)."""
    parts: list[Part] = []
    known: set[int] = set()
    state = _json(folder / "up.json")
    for p in (state or {}).get("processes", []) if isinstance(state, dict) else []:
        if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
            continue
        what = recorded_process(p, folder=folder, proc=proc)
        known.add(p["pid"])
        note = "its PID belongs to another process now" if what is ProcessState.REPLACED \
            else ""
        if what is not ProcessState.OURS and p.get("name") in RESTARTABLE:
            note = (note + "; " if note else "") + \
                f"pdscale up --restart {p['name']} --dir {folder}"
        parts.append(Part(str(p.get("name")), _STATE_WORD[what], p["pid"],
                          p.get("port") or _port(p.get("url")),
                          Path(p["log"]) if p.get("log") else folder / f"{p.get('name')}.log",
                          note))
    dynamo = folder / "dynamo"
    stack = _json(dynamo / "stack.json")
    if isinstance(stack, dict) and isinstance(stack.get("frontend"), dict):
        fe = stack["frontend"]
        up = _alive(fe.get("pid"), fe.get("start_ticks"), proc)
        known.add(int(fe.get("pid") or 0))
        parts.append(Part("frontend", "up" if up else "down", fe.get("pid"), fe.get("port"),
                          dynamo / "logs" / "frontend.log",
                          "" if up else "pdscale down, then pdscale up"))
    workers = _json(dynamo / "workers.json")
    if isinstance(workers, dict):
        for pool, raw in sorted(workers.get("pools", {}).items()):
            for w in raw.get("workers", []):
                up = _alive(w.get("pid"), w.get("start_ticks"), proc)
                known.add(int(w.get("pid") or 0))
                role = pool.rsplit("/", 1)[-1]
                parts.append(Part(str(w.get("name")), f"up ({w.get('phase')})" if up else "down",
                                  w.get("pid"), w.get("port"),
                                  dynamo / "logs" / f"{w.get('name')}.log",
                                  f"{role} worker" if up else
                                  f"{role} worker: the controller replaces it"))
    for m in marked_processes(folder, proc=proc):
        if m.pid not in known:
            parts.append(Part("unrecorded", "up", m.pid, None, None,
                              f"found by its {m.how}: {m.describe()}"))
    return parts


def render_parts(parts: Sequence[Part], folder: Path) -> str:
    """``pdscale up --status``'s table."""
    if not parts:
        return f"nothing is up in {folder}"
    head = ("PART", "STATE", "PID", "PORT", "LOG")
    rows = [(p.name, p.state, str(p.pid or "-"), str(p.port or "-"),
             str(p.log) if p.log else "-") for p in parts]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(4)]
    lines = []
    for row, part in zip((head, *rows), (None, *parts), strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        if part is not None and part.note:
            line += f"  ({part.note})"
        lines.append(line)
    return "\n".join(lines)


def record(name: str, pid: int, *, argv: Sequence[str], url: str, ready_url: str,
           log: Path) -> dict[str, Any]:
    """What ``up.json`` keeps of a process: enough to recognise it (its start time), to show
    it (port, log) and to start it again (its command line and readiness URL)."""
    return {"name": name, "pid": pid, "url": url, **process_record(pid), "argv": list(argv),
            "ready_url": ready_url, "log": str(log), "port": _port(url)}


def marker_env(folder: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default this process's environment) with the stack's marker."""
    return {**(os.environ if base is None else base), MARKER_ENV: str(folder.resolve())}
