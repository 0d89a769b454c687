"""The simulator as a world the production controller runs in.

There is one control loop, :class:`controller._reconciler.Reconciler`: observe -> decide ->
hold degraded pools -> alert overrides -> cross-pool constraints -> act -> record. In a
cluster it reads Prometheus and scales through Kubernetes on the system clock; here it reads a
simulated service and scales it on a simulated clock (:class:`SimClock`). A :class:`World`
(event mode: :class:`simulator._runner.EventWorld`; fluid mode:
:class:`simulator._fluid.FluidWorld`) is both its observation source and its actuator, and
:func:`run_world` is the loop both modes share: advance the world to the next tick, tick the
reconciler, record what it did.

What the controller sees is what Prometheus would show it: every rate and latency percentile
over the recording rules' window (``telemetry.RATE_WINDOW``, 5 minutes), gauges (queue depth,
running requests, KV usage, GPU utilisation) as sampled at the tick, the derived mean lengths
computed by the same function as in a cluster (``telemetry.derive_signals``), and all of it
``observation_delay_s`` late (one scrape interval plus one rule evaluation, 30 s by
default). Forecaster refits run in the foreground (``refit_in_background=False``), on the
simulated clock, so a run is deterministic. Any error a tick reports stops the run: in a
simulation there is no flaky adapter to ride out, only a bug to see.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdscale.controller import (
    Constraints,
    Observation,
    Policy,
    PoolKey,
    PoolObservation,
    PoolReplicas,
    Reconciler,
    Refits,
    SourceResult,
    TickReport,
)
from pdscale.errors import GiveUp
from pdscale.simulator._event import SimSetup
from pdscale.spec import Role, Spec
from pdscale.telemetry import ControllerTelemetry, Signal, derive_signals

__all__ = ["PoolSignals", "SimClock", "SimResult", "SimulationError", "UnknownPool", "World",
           "build_reconciler", "run_world"]

PoolSignals = dict[Signal, float | None]
"""One pool's signals at one instant, as the recorded series would read."""


@dataclass
class SimResult:
    summary: dict[str, Any]
    timeseries: list[dict[str, float]]
    decisions: list[dict[str, Any]] = field(default_factory=list)


class SimClock:
    """Simulated time: the loop sets it, and waiting advances it (nothing sleeps)."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def now(self) -> float:
        return self.now_s

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        self.now_s += max(0.0, seconds)
        return stop.is_set()


class UnknownPool(GiveUp):
    """A decision for a pool the simulation does not run."""

    adapter = "simulator"


class SimulationError(RuntimeError):
    """A tick of the simulated controller failed (a bug: the simulator has no flaky
    adapters); the message lists the errors the reconciler recorded."""


class World(ABC):
    """One simulated service: the reconciler's observation source and actuator.

    Subclasses simulate (:meth:`advance`), call :meth:`sample` at every tick time with the
    pools' signals, report replicas (:meth:`replicas`) and apply scaling (:meth:`scale`)."""

    def __init__(self, setup: SimSetup, *, observation_delay_s: float) -> None:
        self.setup = setup
        self.delay_ticks = max(0, round(observation_delay_s / setup.tick_s))
        self._snapshots: deque[tuple[float, dict[Role, PoolSignals]]] = deque(
            maxlen=self.delay_ticks + 1)
        self.decisions: list[dict[str, Any]] = []
        self.scale_actions = 0

    # -- what a mode implements -----------------------------------------------------------

    @abstractmethod
    def advance(self, until_s: float) -> bool:
        """Simulate up to ``until_s`` and sample the signals there; False when the run is
        over (no tick at ``until_s``)."""

    @abstractmethod
    def replicas(self, role: Role) -> PoolReplicas:
        """The pool's replicas now (not delayed: Kubernetes answers at once)."""

    @abstractmethod
    def scale(self, role: Role, replicas: int) -> None:
        """Start or stop replicas to reach ``replicas`` (bounded by the pool's min and max)."""

    @abstractmethod
    def desired(self, role: Role) -> int:
        """The pool's target replicas."""

    @property
    @abstractmethod
    def span_s(self) -> float:
        """Simulated seconds the run is expected to cover (for progress)."""

    @abstractmethod
    def result(self, wall_s: float) -> SimResult:
        """Summary, per-minute time series and decisions, once the run is over."""

    # -- the loop's side ------------------------------------------------------------------

    def sample(self, now_s: float, signals: dict[Role, PoolSignals]) -> None:
        """Record the pools' signals at ``now_s``; :meth:`observe` hands them out
        ``observation_delay_s`` later (``{}``: nothing was measured)."""
        self._snapshots.append((now_s, signals))

    def observe(self, now_s: float) -> SourceResult:
        data_time, delayed = self._snapshots[0] if self._snapshots else (now_s, {})
        pools: dict[PoolKey, PoolObservation] = {}
        for role in Role:
            key = (self.setup.service, role)
            pools[key] = PoolObservation(key, self.replicas(role),
                                         derive_signals(delayed.get(role, {})), data_time)
        return SourceResult(Observation(now_s, pools))

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        if key[0] != self.setup.service:
            raise UnknownPool(f"no pool {key[0]}/{key[1].value} here: this simulation runs "
                              f"service {self.setup.service!r}")
        self.scale(key[1], replicas)

    def record(self, report: TickReport) -> None:
        """Keep the tick's applied decisions (decisions.json) and count scale actions."""
        if report.errors:
            raise SimulationError("; ".join(f"{e.adapter} {e.kind}: {e.message}"
                                            for e in report.errors))
        for key in sorted(report.decisions, key=str):
            rec = report.decisions[key]
            after = self.desired(key[1])
            if rec.outcome == "applied" and after != rec.current:
                self.scale_actions += 1
                self.decisions.append({"t": rec.time_s, "pool": key[1].value,
                                       "from": rec.current, "to": after,
                                       "cause": str(rec.cause), "reasons": list(rec.reasons),
                                       "detail": dict(rec.detail)})


def build_reconciler(world: World, policy: Policy, *, clock: SimClock,
                     spec: Spec | None = None, forecasts: Refits | None = None) -> Reconciler:
    """The production reconcile loop over ``world``: the spec's constraints (P:D ratio
    bounds, GPU budget) and telemetry when given (a run from a spec), none otherwise;
    ``forecasts`` refitted in the foreground."""
    constraints = Constraints.from_spec(spec) if spec is not None else \
        Constraints(gpu_budget=None, priority={}, slo_s={}, ratio={})
    return Reconciler(policy, world, world, clock, constraints=constraints,
                      telemetry=ControllerTelemetry(spec), tick_s=world.setup.tick_s,
                      forecasts=forecasts, refit_in_background=False)


def run_world(world: World, policy: Policy, *, spec: Spec | None = None,
              forecasts: Refits | None = None,
              progress: Callable[[float], None] | None = None) -> SimResult:
    """Run ``policy`` in the production reconcile loop over ``world`` until the run is over:
    the one loop of event and fluid mode. ``forecasts``: the policy's forecast stage, whose
    refits the loop runs (in the foreground, on the simulated clock)."""
    started = time.perf_counter()
    clock = SimClock()
    reconciler = build_reconciler(world, policy, clock=clock, spec=spec, forecasts=forecasts)
    tick_s = world.setup.tick_s
    report_every = max(1, math.ceil(world.span_s / tick_s / 100))
    t, ticks = 0.0, 0
    try:
        while world.advance(t):
            clock.now_s = t
            world.record(reconciler.tick())
            ticks += 1
            if progress is not None and ticks % report_every == 0:
                progress(min(1.0, t / max(world.span_s, 1e-9)))
            t += tick_s
    finally:
        reconciler.close()
        reconciler.telemetry.shutdown()
    return world.result(time.perf_counter() - started)
