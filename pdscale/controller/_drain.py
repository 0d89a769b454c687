"""Scale-down drain: choose the replica, stop routing to it, let it drain, then remove it.

The policy's decision stays a number; this unit is how a lower number is reached without
dropping work. Writing a smaller ``/scale`` leaves the choice of pod to the workload
controller (a busy replica can go) and the fate of its requests to the termination grace
period (a long stream is cut at its end; Dynamo's planner aborts after 5 s). Instead, per
pool and per tick:

1. **Choose** the replicas to remove: starting ones first (they have served nothing), then
   ready ones already out of routing by someone else (``drain_instance``), then the ready
   ones with the least work (running + waiting requests, then KV in use, per pod), then those
   whose work is unknown (no fresh per-pod sample: missing is never zero). A replica is not
   chosen when it is the last ready one, or when the KV it holds is more than the replicas
   that stay have free between them (the others could not take its sequences should it be
   cut at the timeout): that step of the scale-down waits, and says why.
   A StatefulSet (and a LeaderWorkerSet) always removes its highest ordinal, so for those the
   highest ordinals are drained: the choice is fixed, the draining is not.
2. **Stop routing** to them (the backend's reversible mark: a label that the Service selects
   on, and an annotation with the time, the reason and the label's previous value), then wait
   until each is idle: its running and waiting requests at zero and, for a prefill replica,
   its KV blocks released (decode has pulled them), on a sample taken at least ``settle_s``
   after it left routing (routers learn of the change late), or ``timeout_s`` has passed.
3. **Remove** exactly those: the backend prepares the removal (for Deployments the
   ``controller.kubernetes.io/pod-deletion-cost`` annotation at the lowest value, which the
   ReplicaSet honours; nothing for highest-ordinal kinds) and lowers the count.

State lives where a new leader can read it (the pods' annotations and label), so a leader
that starts mid-drain finishes it or, when the target no longer asks for it, takes the replica
back into routing; a drain whose removal keeps failing is taken back after twice the timeout,
so no replica is left out of routing for ever. A scale-up during a drain takes the draining
replicas back first: their capacity returns at once, with no cold start.

A backend whose mark cannot be undone (the process actuator: SIGTERM takes a Dynamo worker
out of routing and drains it, and its own kill bound is the timeout) is driven through the
same choice: the victims are removed at once and followed until they exit.

:func:`plan_drain` (in :mod:`controller._drain_plan`) is pure (replicas, their work, ``now``
and the settings in; what to do out); :class:`Drainer` applies a plan through a
:class:`DrainBackend` and keeps the record.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pdscale.controller._drain_plan import (
    DrainConfig,
    DrainOutcome,
    DrainPlan,
    DrainProgress,
    Removal,
    Replica,
    Victim,
    choose_victims,
    describe_work,
    is_idle,
    plan_drain,
    work_load,
)
from pdscale.controller._interface import PoolKey
from pdscale.spec import Spec
from pdscale.telemetry import PodWork, PrometheusReader, read_pod_work

__all__ = [
    "DELETION_COST",
    "DELETION_COST_MIN",
    "DRAINING_SINCE",
    "DRAIN_REASON",
    "SERVING_BEFORE",
    "DrainBackend",
    "DrainConfig",
    "DrainOutcome",
    "DrainPlan",
    "DrainProgress",
    "DrainStep",
    "Drainer",
    "PrometheusWork",
    "Removal",
    "Replica",
    "Victim",
    "WorkSource",
    "choose_victims",
    "is_idle",
    "plan_drain",
    "work_load",
]

log = logging.getLogger("pdscale.controller")

DRAINING_SINCE = "pdscale.io/draining-since"
"""Annotation: when the replica left routing (RFC 3339); its presence marks a drain by pdscale."""
DRAIN_REASON = "pdscale.io/drain-reason"
"""Annotation: why this replica was chosen, in words."""
SERVING_BEFORE = "pdscale.io/serving-before"
"""Annotation: the serving label's value before the drain (JSON; null when it had none)."""
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Annotation a ReplicaSet reads on scale-down: lower cost goes first (Kubernetes >= 1.22)."""
DELETION_COST_MIN = "-2147483648"
"""The lowest cost (an int32): the drained pod goes before any other."""

# -- applying plans -------------------------------------------------------------------------------


class DrainBackend(Protocol):
    """Where the replicas are and how to move them (Kubernetes pods, local processes)."""

    def drain_config(self, key: PoolKey, *, timeout_s: float, settle_s: float) -> DrainConfig:
        """How this pool's workload removes replicas, with the spec's bounds."""
        ...

    def pool_replicas(self, key: PoolKey) -> list[Replica]:
        """The pool's replicas that exist and are not terminating."""
        ...

    def stop_routing(self, key: PoolKey, name: str, *, since_s: float, reason: str) -> None:
        ...

    def resume_routing(self, key: PoolKey, name: str) -> None:
        ...

    def remove_replicas(self, key: PoolKey, names: Sequence[str], replicas: int,
                        reasons: Sequence[str]) -> None:
        """Lower the count to ``replicas`` so that exactly ``names`` go."""
        ...

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        ...

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        ...


class WorkSource(Protocol):
    def pod_work(self, key: PoolKey, now_s: float) -> Mapping[str, PodWork]:
        """Per replica name, what it holds now; a replica left out is unknown."""
        ...


@dataclass(frozen=True)
class DrainStep:
    """What reaching a pool's target did this tick."""

    outcome: Literal["applied", "draining", "unchanged"]
    notes: tuple[str, ...] = ()
    """Reasons to add to the tick's decision (which replica, why, how long, what it held)."""
    detail: Mapping[str, Any] = field(default_factory=dict)


class DrainTelemetry(Protocol):
    def record_drain(self, key: PoolKey, *, outcome: str, duration_s: float | None,
                     held_requests: float | None, timeouts_in_a_row: int) -> None:
        ...

    def record_draining(self, key: PoolKey, replicas: int) -> None:
        ...


@dataclass
class _Known:
    since_s: float
    why: str
    work: PodWork | None = None


class Drainer:
    """Reaches each pool's target through drains (see the module docstring). Only the leader
    calls :meth:`reach`; :meth:`standby` forgets what it knew, so that the pools are read
    again from their pods when leadership returns. :meth:`snapshot` is thread-safe."""

    def __init__(self, backend: DrainBackend, work: WorkSource, *, timeout_s: float,
                 settle_s: float, telemetry: DrainTelemetry | None = None,
                 enabled: bool = True, history: int = 200,
                 on_error: Callable[[PoolKey, Exception], None] | None = None) -> None:
        self.backend = backend
        self.work = work
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self.telemetry = telemetry
        self.enabled = enabled
        """False: never drain, only take back drains an earlier configuration left."""
        self.on_error = on_error
        """Told about a failed per-pod work read (the drain goes on, knowing less)."""
        self.records: deque[dict[str, Any]] = deque(maxlen=history)
        self._active: dict[PoolKey, dict[str, _Known]] = {}
        self._scanned: set[PoolKey] = set()
        self._timeouts_in_a_row: dict[PoolKey, int] = {}
        self._cleanup_off = False
        self._lock = threading.Lock()

    def stop_cleanup(self) -> None:
        """Drains are off and the pods cannot be read (no RBAC for them): there is nothing
        this configuration could have left to take back; stop looking."""
        self._cleanup_off = True

    def standby(self) -> None:
        """This replica does not lead now: what it knew may change under the leader."""
        with self._lock:
            self._scanned.clear()
            self._active.clear()

    def config(self, key: PoolKey) -> DrainConfig:
        return self.backend.drain_config(key, timeout_s=self.timeout_s, settle_s=self.settle_s)

    def reach(self, key: PoolKey, target: int, *, current: int, reasons: Sequence[str],
              now_s: float) -> DrainStep:
        """Move the pool towards ``target`` replicas this tick (``current``: its count now).
        Backend errors propagate (the caller records them); the pods keep the state, so the
        next tick resumes."""
        with self._lock:
            quiet = (key in self._scanned and not self._active.get(key)) or \
                (not self.enabled and self._cleanup_off)
        if quiet and (target >= current or not self.enabled):
            return self._plain(key, target, current=current, reasons=reasons)
        try:
            replicas = self.backend.pool_replicas(key)
            config = self.config(key)
        except Exception as exc:
            if target <= current:
                raise  # nothing to drain safely, or to take back, without the pods
            # A scale-up does not wait for the pods (a throttled LIST would hold it a tick);
            # drains are taken back, and the scan done, on the next tick that reads them.
            step = self._plain(key, target, current=current, reasons=reasons)
            with self._lock:
                self._scanned.discard(key)
            return DrainStep(step.outcome, (
                f"drain: the pool's pods could not be read ({type(exc).__name__}: {exc}); "
                "scaled up without them, drains are taken back on a later tick",))
        plan_target = target if self.enabled else max(target, current)
        busy = any(r.draining_since_s is not None for r in replicas)
        work: Mapping[str, PodWork] = {}
        if plan_target < current or busy:
            try:
                work = self.work.pod_work(key, now_s)
            except Exception as exc:  # work unknown: no drain completes but by the timeout
                if self.on_error is not None:
                    self.on_error(key, exc)
        plan = plan_drain(role=key[1], current=current, target=plan_target,
                          replicas=replicas, work=work, now_s=now_s, config=config)
        notes = self._apply(key, plan, config, reasons=reasons, now_s=now_s,
                            pods={r.name for r in replicas})
        with self._lock:
            self._scanned.add(key)
        outcome: Literal["applied", "draining", "unchanged"]
        if plan.replicas_after is not None:
            outcome = "applied"
        elif target != current and (target > current or not self.enabled):
            self.backend.set_replicas(key, target, reasons)
            outcome = "applied"
        elif target < current:
            outcome = "draining"
        else:
            outcome = "unchanged"
        detail = {"drain": {
            "draining": [p.name for p in plan.in_progress],
            "stopped_routing": [v.name for v in plan.stop_routing],
            "removed": list(plan.remove), "taken_back": [n for n, _ in plan.resume_routing],
            "held": list(plan.held)}}
        return DrainStep(outcome, tuple(notes), detail)

    def _plain(self, key: PoolKey, target: int, *, current: int,
               reasons: Sequence[str]) -> DrainStep:
        if target == current:
            return DrainStep("unchanged")
        self.backend.set_replicas(key, target, reasons)
        return DrainStep("applied")

    def _apply(self, key: PoolKey, plan: DrainPlan, config: DrainConfig, *,
               reasons: Sequence[str], now_s: float, pods: set[str] | None = None
               ) -> list[str]:
        notes: list[str] = []
        with self._lock:
            known = dict(self._active.get(key, {}))
        for name, _why in plan.resume_routing:
            self.backend.resume_routing(key, name)
            known.pop(name, None)
        for victim in plan.stop_routing:
            if config.reversible:
                self.backend.stop_routing(key, victim.name, since_s=now_s, reason=victim.why)
            known[victim.name] = _Known(now_s, victim.why, victim.work)
            notes.append(f"drain: {victim.name} chosen ({victim.why}); "
                         + ("out of routing until it is idle" if config.reversible
                            else "stopped: it finishes its requests and exits"))
            self._event(key, "PdscaleDrainStarted", f"{victim.name}: {victim.why}")
            self._record(key, now_s, victim.name, "started", None, victim.work, victim.why)
        if plan.replicas_after is not None:
            if plan.remove:
                self.backend.remove_replicas(
                    key, plan.remove, plan.replicas_after,
                    [*reasons, f"drained replicas removed: {', '.join(plan.remove)}"])
                if config.reversible:
                    notes.append(f"drain: {', '.join(plan.remove)} removed (count to "
                                 f"{plan.replicas_after})")
            else:
                self.backend.set_replicas(key, plan.replicas_after, reasons)
        for f in plan.finished:
            notes.append(f"drain: {f.name} {f.why}")
            self._finish(key, f, now_s)
            known.pop(f.name, None)
        notes += [f"drain: {note}" for note in plan.held]
        if config.reversible:
            for p in plan.in_progress:
                k = known.setdefault(p.name, _Known(p.since_s, "found draining (read from the "
                                                    "pod: an earlier leader started it)"))
                k.work = p.work
            # A draining pod someone else deleted (kubectl delete pod) is no drain any more.
            for name in [n for n in known if pods is not None and n not in pods]:
                k = known.pop(name)
                f = DrainOutcome(name, "gone", k.since_s, now_s - k.since_s, k.work,
                                 "no longer in the pool: deleted while draining, not by "
                                 "pdscale")
                self._finish(key, f, now_s)
                notes.append(f"drain: {name} {f.why}")
        else:
            # Marking was removing: a victim is finished once its process is gone.
            present = {p.name for p in plan.in_progress} | {v.name for v in plan.stop_routing}
            killed = self._killed(key)
            for name in [n for n in known if n not in present]:
                k = known.pop(name)
                elapsed = now_s - k.since_s
                if name in killed:
                    load = killed[name]
                    held = PodWork(load, None, None, now_s) if load is not None else k.work
                    f = DrainOutcome(name, "timeout", k.since_s, elapsed, held,
                                     f"killed at the drain bound ({elapsed:.0f} s), still "
                                     f"holding {describe_work(held)}")
                else:
                    f = DrainOutcome(name, "drained", k.since_s, elapsed, None,
                                     f"drained and exited within {elapsed:.1f} s")
                self._finish(key, f, now_s)
                notes.append(f"drain: {name} {f.why}")
            for p in plan.in_progress:
                known.setdefault(p.name, _Known(p.since_s, "found draining"))
        with self._lock:
            if known:
                self._active[key] = known
            else:
                self._active.pop(key, None)
        if self.telemetry is not None:
            self.telemetry.record_draining(key, len(known))
        return notes

    def _killed(self, key: PoolKey) -> Mapping[str, float | None]:
        """Victims the backend had to kill at its bound, with what they held then."""
        killed: Callable[[PoolKey], Mapping[str, float | None]] | None = getattr(
            self.backend, "killed_drains", None)
        return killed(key) if killed is not None else {}

    def _event(self, key: PoolKey, reason: str, message: str) -> None:
        try:
            self.backend.event(key, reason, message)
        except Exception as exc:  # an Event is a record, not a reason to fail
            log.warning("could not record the drain as an Event: %s", exc)

    def _finish(self, key: PoolKey, f: DrainOutcome, now_s: float) -> None:
        with self._lock:
            if f.outcome == "timeout":
                self._timeouts_in_a_row[key] = self._timeouts_in_a_row.get(key, 0) + 1
            elif f.outcome == "drained":
                self._timeouts_in_a_row[key] = 0
            in_a_row = self._timeouts_in_a_row.get(key, 0)
        if self.telemetry is not None:
            self.telemetry.record_drain(
                key, outcome=f.outcome, duration_s=f.duration_s,
                held_requests=work_load(f.held) if f.outcome == "timeout" else None,
                timeouts_in_a_row=in_a_row)
        if f.outcome in ("timeout", "abandoned"):
            log.warning("drain of %s (%s/%s): %s", f.name, key[0], key[1].value, f.why)
        reason = {"drained": "PdscaleDrained", "timeout": "PdscaleDrainTimeout"}.get(
            f.outcome, "PdscaleDrainUndone")
        self._event(key, reason, f"{f.name}: {f.why}")
        self._record(key, now_s, f.name, f.outcome, f.duration_s, f.held, f.why)

    def timeouts_in_a_row(self, key: PoolKey) -> int:
        with self._lock:
            return self._timeouts_in_a_row.get(key, 0)

    def _record(self, key: PoolKey, now_s: float, name: str, outcome: str,
                duration_s: float | None, work: PodWork | None, why: str) -> None:
        row = {"time": now_s, "pool": f"{key[0]}/{key[1].value}", "replica": name,
               "outcome": outcome, "duration_s": duration_s, "why": why,
               "work": None if work is None else {
                   "running": work.running, "waiting": work.waiting,
                   "kv_usage": work.kv_usage}}
        with self._lock:
            self.records.append(row)

    def snapshot(self, now_s: float) -> dict[str, Any]:
        """Drains in progress and the recent ones, for ``/v1/status``."""
        with self._lock:
            active = {f"{k[0]}/{k[1].value}": [
                {"replica": name, "since": d.since_s, "elapsed_s": now_s - d.since_s,
                 "why": d.why,
                 "work": None if d.work is None else {"running": d.work.running,
                                                      "waiting": d.work.waiting,
                                                      "kv_usage": d.work.kv_usage}}
                for name, d in per.items()]
                for k, per in self._active.items() if per}
            return {"enabled": self.enabled, "timeout_s": self.timeout_s,
                    "settle_s": self.settle_s, "in_progress": active,
                    "timeouts_in_a_row": {f"{k[0]}/{k[1].value}": n
                                          for k, n in self._timeouts_in_a_row.items() if n},
                    "recent": list(self.records)[-50:]}


class PrometheusWork:
    """:class:`WorkSource` from Prometheus: each pool's per-pod work with one query
    (``telemetry.read_pod_work``, the catalog's expressions grouped by pod)."""

    def __init__(self, reader: PrometheusReader, spec: Spec) -> None:
        self.reader = reader
        self.services = {s.name: s for s in spec.services}

    def pod_work(self, key: PoolKey, now_s: float) -> Mapping[str, PodWork]:
        return read_pod_work(self.reader, self.services[key[0]], key[1], at_s=now_s)
