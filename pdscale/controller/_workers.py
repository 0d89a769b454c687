"""The records of a pool of worker processes on one host: what
:class:`controller._process.ProcessActuator` knows of each worker, of a worker lost, and of
the pool."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pdscale.controller._host import ProcessHandle, WorkerTemplate, is_ours
from pdscale.controller._interface import PoolKey

__all__ = ["Phase", "WorkerInfo"]

Phase = Literal["starting", "ready", "draining"]


@dataclass
class _Worker:
    name: str
    pid: int
    port: int
    created_s: float
    start_ticks: int | None
    handle: ProcessHandle | None
    """None for a worker adopted from a state file (not our child)."""
    phase: Phase = "starting"
    healthy: bool = False
    terminated_s: float | None = None
    killed: bool = False

    @property
    def index(self) -> int:
        """n of ``<prefix>-<n>``: creation order among workers created at the same time."""
        tail = self.name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    def exit_code(self) -> int | None:
        """The exit status once it exited (-1 when unknown), None while it runs."""
        if self.handle is not None:
            return self.handle.poll()
        return None if is_ours(self.pid, self.start_ticks) else -1


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    pid: int
    port: int
    phase: Phase
    healthy: bool
    created_s: float


@dataclass
class _Loss:
    """A worker that exited without being asked to, and what replaces it."""

    name: str
    pid: int
    status: int | None
    phase: Phase
    """What it was doing when it exited."""
    at_s: float
    replaced_by: str | None = None


@dataclass
class _Pool:
    template: WorkerTemplate
    desired: int = 0
    workers: list[_Worker] = field(default_factory=list)
    next_index: int = 0
    crashes: int = 0
    """Workers in a row that exited before they were ever ready (crash-loop back-off)."""
    losses: deque[_Loss] = field(default_factory=lambda: deque(maxlen=20))
    """The latest workers that exited unasked (``/v1/status``)."""
    replaces: dict[str, str] = field(default_factory=dict)
    """A replacement's name -> the worker it replaces, until it is ready."""


def _key_text(key: PoolKey) -> str:
    return f"{key[0]}/{key[1].value}"
