"""What a simulation runs: the service's pools (:class:`SimSetup`, :class:`PoolSetup`), the
replicas' life cycle (starting, ready, draining, gone) and their per-replica state in event
mode, and the histogram quantile both modes report latencies with."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pdscale.controller import InstanceProfile
from pdscale.spec import Role, cold_start_quantile

__all__ = ["ColdStarts", "PoolSetup", "Router", "SimSetup", "hist_quantile"]

FloatArray = npt.NDArray[np.float64]

Router = Literal["least_loaded", "round_robin", "prefix"]


@dataclass(frozen=True)
class PoolSetup:
    role: Role
    profile: InstanceProfile
    initial_replicas: int
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int = 1
    cold_start_s: float = 60.0
    """The median cold start."""
    cold_start_spread: float = 0.0
    """Sigma of the log-normal every replica's cold start is drawn from (0: all take
    ``cold_start_s``)."""

    def cold_start_quantile(self, q: float) -> float:
        return cold_start_quantile(self.cold_start_s, self.cold_start_spread, q)


class ColdStarts:
    """Every new replica's cold start, drawn from its pool's log-normal (deterministic for a
    seed; clipped to [median / 3, 3 x median] so one draw cannot stall a run)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng([seed, 0xC01D])

    def draw(self, pool: PoolSetup) -> float:
        if pool.cold_start_spread <= 0:
            return pool.cold_start_s
        z = float(self._rng.standard_normal())
        factor = min(3.0, max(1 / 3, math.exp(pool.cold_start_spread * z)))
        return pool.cold_start_s * factor


@dataclass(frozen=True)
class SimSetup:
    service: str
    prefill: PoolSetup
    decode: PoolSetup
    slo_ttft_s: float
    slo_itl_s: float
    router: Router = "least_loaded"
    tick_s: float = 15.0
    failures: tuple[tuple[float, Role], ...] = ()
    """(time in seconds, role): a replica of that pool is lost at that time."""
    seed: int = 0
    """Seeds the cold-start draws."""


class _State(IntEnum):
    STARTING = 0
    READY = 1
    DRAINING = 2
    GONE = 3


@dataclass(eq=False)
class _Replica:
    id: int
    state: _State
    requested_s: float
    ready_s: float
    gone_s: float | None = None
    busy_s: float = 0.0  # GPU-busy seconds (prefill iterations, decode steps)


@dataclass(eq=False)
class _PrefillReplica(_Replica):
    queue: deque[int] = field(default_factory=deque)  # own queue (round-robin, prefix routers)
    active: list[int] = field(default_factory=list)  # prompts started here, not finished
    busy: bool = False
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
    queued_tokens: int = 0


class _Waiting(deque[int]):
    """A decode replica's waiting requests with their prompt tokens summed as they come and
    go (routing reads the sum at every arrival; summing the queue each time was quadratic in
    a backlog)."""

    def __init__(self, prompt: npt.NDArray[Any] | None = None) -> None:
        super().__init__()
        self.prompt = prompt
        self.tokens = 0

    def _size(self, req: int) -> int:
        return int(self.prompt[req]) if self.prompt is not None else 0

    def append(self, req: int) -> None:
        super().append(req)
        self.tokens += self._size(req)

    def appendleft(self, req: int) -> None:
        super().appendleft(req)
        self.tokens += self._size(req)

    def pop(self, i: int = -1) -> int:
        req = super().pop() if i == -1 else self._take(i)
        self.tokens -= self._size(req)
        return req

    def _take(self, i: int) -> int:
        req = self[i]
        del self[i]
        return req

    def popleft(self) -> int:
        req = super().popleft()
        self.tokens -= self._size(req)
        return req

    def clear(self) -> None:
        super().clear()
        self.tokens = 0


@dataclass(eq=False)
class _DecodeReplica(_Replica):
    members: dict[int, int] = field(default_factory=dict)  # request -> join step
    finish_heap: list[tuple[int, int, int]] = field(default_factory=list)
    """(finish step, request, join step); entries of preempted joins are skipped."""
    waiting: _Waiting = field(default_factory=_Waiting)
    steps: int = 0
    t_last: float = 0.0
    ctx_offset: int = 0  # sum over members of (context at join - join step)
    first_pending: list[int] = field(default_factory=list)
    version: int = 0
    stall_s: float = 0.0  # recompute cost to add before the next step
    tokens: int = 0  # generated tokens (live metrics)
    preempted: int = 0
    itl_hist: np.ndarray[Any, np.dtype[np.float64]] | None = None  # token-weighted step times

    def kv(self) -> int:
        return self.ctx_offset + len(self.members) * self.steps


class _Ev(IntEnum):
    ARRIVAL = 0
    PREFILL_DONE = 1
    KV_ARRIVE = 2
    DECODE = 3
    READY = 4
    TICK = 5
    FAIL = 6


def hist_quantile(hist: FloatArray, edges: FloatArray, q: float) -> float | None:
    """Quantile of a histogram over log-spaced ``edges`` (a bucket's geometric centre)."""
    total = hist.sum()
    if total <= 0:
        return None
    cum = np.cumsum(hist)
    i = int(np.searchsorted(cum, q * total))
    i = min(max(i, 1), len(edges) - 1)
    return float(math.sqrt(edges[i - 1] * edges[i]))
