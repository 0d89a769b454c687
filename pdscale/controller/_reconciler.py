"""The reconcile loop: every tick, observe, decide, constrain, act, record.

* Time comes from an injected :class:`Clock`; tests drive :meth:`Reconciler.tick` by hand.
* One adapter failing (Prometheus, Kubernetes, a forecaster, the actuator for one pool) costs
  that tick or that pool, never the process: the error is recorded (``/v1/status``, the
  ``pdscale_adapter_errors_total`` metric, the log) and the next tick tries again. A pool whose
  signals are missing gets a degraded decision from the policy (hold, never scale down).
* Forecaster refits run on a worker thread, off the tick path.
* Only the leader acts. A standby, a dry run and recommendation mode still decide and record,
  so their status, metrics and forecasts stay warm and a takeover is seamless.
* Alert reactions (the webhook) come in through :class:`Overrides` (``_overrides``): floors
  on a pool's replicas and holds on scale-down, each with an expiry and its alert.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pdscale.controller._constraints import (
    Constraints,
    apply_constraints,
    hold_degraded,
    unread_pools_gpus,
)
from pdscale.controller._drain import Drainer
from pdscale.controller._interface import (
    Actuator,
    Cause,
    Observation,
    Policy,
    PoolDecision,
    PoolForecast,
    PoolKey,
    PoolObservation,
)
from pdscale.controller._overrides import Overrides
from pdscale.errors import GiveUp, RetryLater
from pdscale.telemetry import ControllerTelemetry, Signal

__all__ = ["AdapterError", "Clock", "DecisionRecord", "ObservationSource", "Overrides",
           "Reconciler", "Refits", "SourceResult", "SystemClock", "TickReport"]

log = logging.getLogger("pdscale.controller")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep up to ``seconds``; True when ``stop`` was set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(max(0.0, seconds))


@dataclass(frozen=True)
class AdapterError:
    adapter: str
    """prometheus, kubernetes, forecaster, actuator, lease, webhook."""
    kind: str
    """unavailable (retry helps), rejected (fix config or RBAC), error (a bug or the unknown)."""
    message: str
    pool: PoolKey | None = None
    at_s: float = 0.0

    @classmethod
    def from_exception(cls, exc: Exception, pool: PoolKey | None, at_s: float, *,
                       adapter: str = "actuator") -> AdapterError:
        """A failure classified by what to do about it (``pdscale.errors``): an adapter's
        :class:`RetryLater` is ``unavailable``, its :class:`GiveUp` ``rejected``; anything
        else is an ``error`` of ``adapter`` (a bug or the unknown)."""
        if isinstance(exc, RetryLater | GiveUp):
            return cls(exc.adapter, exc.kind, str(exc), pool, at_s)
        return cls(adapter, "error", f"{type(exc).__name__}: {exc}", pool, at_s)

    @classmethod
    def from_scaling(cls, exc: Exception, pool: PoolKey, at_s: float) -> AdapterError:
        """A failed read or write of a pool's replicas."""
        return cls.from_exception(exc, pool, at_s, adapter="actuator")

    def as_dict(self) -> dict[str, Any]:
        return {"adapter": self.adapter, "kind": self.kind, "message": self.message,
                "pool": None if self.pool is None else f"{self.pool[0]}/{self.pool[1].value}",
                "at": self.at_s}


@dataclass
class SourceResult:
    observation: Observation
    errors: list[AdapterError] = field(default_factory=list)
    staleness: dict[PoolKey, dict[Signal, float | None]] = field(default_factory=dict)


class ObservationSource(Protocol):
    def observe(self, now_s: float) -> SourceResult:
        ...


class Refits(Protocol):
    """The forecasters' upkeep the loop schedules after each tick (the policy's forecast
    stage, :class:`controller._forecast.ForecastStage`): on a worker thread in a cluster, in
    the foreground in the simulator."""

    def pending_refits(self, now_s: float) -> list[PoolKey]:
        """Pools due a refit."""
        ...

    def refit(self, key: PoolKey, now_s: float) -> float:
        """Refit one pool's forecaster; returns the seconds it took."""
        ...

    def stale_forecasts(self, now_s: float, within_s: float) -> list[PoolKey]:
        """Pools whose forecast expires within ``within_s``."""
        ...

    def refresh_forecast(self, key: PoolKey, now_s: float) -> None:
        ...


@dataclass
class DecisionRecord:
    time_s: float
    pool: PoolKey
    current: int
    ready: int
    desired: int
    outcome: Literal["applied", "unchanged", "standby", "dry_run", "recommend", "failed",
                     "draining"]
    cause: Cause
    reasons: tuple[str, ...]
    detail: Mapping[str, Any]
    forecast: PoolForecast | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"time": self.time_s, "service": self.pool[0], "pool": self.pool[1].value,
                "current": self.current, "ready": self.ready, "desired": self.desired,
                "outcome": self.outcome, "cause": self.cause.value,
                "reasons": list(self.reasons), "detail": dict(self.detail)}


FRESH_READ_S = 1.0
"""An alert reaction reuses a read of the pools this recent: a flood of alerts costs a read a
second, not one each."""
LOG_REASONS_CHARS = 300
"""A scale's log line carries its reasons up to this many characters (a line to read, not a
dump); the decision record has them all."""
ERROR_REPEAT_S = 300.0
"""An adapter error that comes back every tick is logged once, then at most this often with
how many times it came back (a Prometheus outage is one line, not one a tick)."""


def _error_key(err: AdapterError) -> tuple[str, str, PoolKey | None, str]:
    return (err.adapter, err.kind, err.pool, err.message)


class _ErrorLog:
    """Logs adapter errors at WARNING without repeating them every tick: the first time, then
    every :data:`ERROR_REPEAT_S` with a count, and (INFO) once a tick's error stops."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, PoolKey | None, str], list[float]] = {}
        """key -> [first seen, last logged, repeats since then, from a tick (1) or not]."""

    def report(self, err: AdapterError, now_s: float, *, in_tick: bool) -> None:
        key = _error_key(err)
        where = f" ({err.pool[0]}/{err.pool[1].value})" if err.pool else ""
        seen = self._open.get(key)
        if seen is None:
            self._open[key] = [now_s, now_s, 0.0, 1.0 if in_tick else 0.0]
            log.warning("%s %s%s: %s", err.adapter, err.kind, where, err.message)
            return
        seen[2] += 1
        if now_s - seen[1] >= ERROR_REPEAT_S:
            log.warning("%s %s%s: %s (again %d times in %.0fs)", err.adapter, err.kind, where,
                        err.message, seen[2], now_s - seen[1])
            seen[1], seen[2] = now_s, 0.0

    def settle(self, this_tick: set[tuple[str, str, PoolKey | None, str]],
               now_s: float) -> None:
        """Close the tick errors that this tick did not repeat (saying so)."""
        for key, seen in list(self._open.items()):
            if key in this_tick or not seen[3]:
                if not seen[3] and now_s - seen[1] >= ERROR_REPEAT_S:
                    del self._open[key]
                continue
            del self._open[key]
            adapter, kind, pool, _ = key
            where = f" ({pool[0]}/{pool[1].value})" if pool else ""
            log.info("%s%s: %s cleared after %.0fs", adapter, where, kind, now_s - seen[0])


_HOLD_REASONS = ("holding ", "down ", "reaction:", "degraded:", "idle:")
"""The reasons that keep replicas above the need (the policy's stabilisation, an alert
reaction, missing data: each says so in these words)."""


def _holding(record: DecisionRecord) -> str | None:
    """The reasons that keep the pool above the need its sizing set, or None when it is not
    above it (or no need was sized)."""
    need = record.detail.get("need")
    if not isinstance(need, int | float) or record.desired <= need:
        return None
    said = [r for r in record.reasons if r.startswith(_HOLD_REASONS)]
    return "; ".join(said) or None


def describe_data(decisions: dict[PoolKey, PoolDecision], observation: Observation) -> None:
    """Each decision says the state of the data it was made on (``detail["data_state"]``): an
    idle pool (no request counted yet) holds with that reason instead of "degraded", and the
    targets of a planned scale-down are said to be departing."""
    for key, d in list(decisions.items()):
        pool = observation.pools.get(key)
        if pool is None:
            continue
        detail = {**d.detail, "data_state": pool.data_state}
        if pool.data_state == "idle" and d.cause is Cause.DEGRADED:
            held = max(pool.replicas.desired, pool.replicas.active, d.desired_replicas)
            reasons = tuple(r for r in d.reasons if not r.startswith("degraded:"))
            d = replace(d, desired_replicas=held, cause=Cause.STEADY, detail=detail,
                        reasons=(*reasons, f"idle: {pool.note}; holding {held} replicas, no "
                                           "scale-down"))
        elif pool.note is not None:
            d = replace(d, detail=detail,
                        reasons=(*d.reasons, f"{pool.data_state}: {pool.note}"))
        else:
            d = replace(d, detail=detail)
        decisions[key] = d


@dataclass
class TickReport:
    started_s: float
    cpu_s: float
    wall_s: float
    decisions: dict[PoolKey, DecisionRecord]
    errors: list[AdapterError]
    leader: bool


class Reconciler:
    def __init__(self, policy: Policy, source: ObservationSource, actuator: Actuator,
                 clock: Clock, *, constraints: Constraints, telemetry: ControllerTelemetry,
                 tick_s: float = 15.0, mode: Literal["act", "recommend"] = "act",
                 dry_run: bool = False, is_leader: Callable[[], bool] = lambda: True,
                 overrides: Overrides | None = None, history: int = 1000,
                 forecasts: Refits | None = None, refit_in_background: bool = True,
                 drainer: Drainer | None = None) -> None:
        self.policy = policy
        self.forecasts = forecasts
        self.source = source
        self.actuator = actuator
        self.clock = clock
        self.constraints = constraints
        self.telemetry = telemetry
        self.tick_s = tick_s
        self.mode = mode
        self.dry_run = dry_run
        self.is_leader = is_leader
        self.overrides = overrides or Overrides()
        self.drainer = drainer
        """Reaches lower counts by draining the chosen replicas first (controller.drain)."""
        self._last_gpus: dict[PoolKey, int] = {}
        """GPUs each pool held when last read (the budget counts them while a pool is not)."""
        self.decisions: deque[DecisionRecord] = deque(maxlen=history)
        self.errors: deque[AdapterError] = deque(maxlen=200)
        self.last: dict[PoolKey, DecisionRecord] = {}
        self._error_log = _ErrorLog()
        self._holding: dict[PoolKey, str | None] = {}
        """What last held each pool above its need (logged when it changes)."""
        self.last_observation: Observation | None = None
        """What the last tick observed (an alert reaction checks its shortage there)."""
        self.last_tick: TickReport | None = None
        self.ticks = 0
        self._lock = threading.Lock()
        self._observing = threading.Lock()
        """One read of the source at a time (the tick's, or an alert reaction's)."""
        self._wake = threading.Event()
        self._refits: dict[PoolKey, Future[float]] = {}
        self._forecasts: Future[None] | None = None
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdscale-refit")
                          if refit_in_background else None)

    # -- refits -----------------------------------------------------------------------------

    def _schedule_refits(self, now: float) -> None:
        forecasts = self.forecasts
        if forecasts is None:
            return
        for key in forecasts.pending_refits(now):
            running = self._refits.get(key)
            if running is not None and not running.done():
                continue
            if running is not None and running.exception() is not None:
                self._error(AdapterError("forecaster", "error",
                                         f"refit failed: {running.exception()}", key, now))
            if self._executor is None:
                try:
                    forecasts.refit(key, now)
                except Exception as exc:
                    self._error(AdapterError("forecaster", "error", f"refit failed: {exc}",
                                             key, now))
            else:
                self._refits[key] = self._executor.submit(forecasts.refit, key, now)
        # Forecasts that expire before the next tick are recomputed on the worker too, so a
        # tick reuses them instead of predicting for every pool at once (in the foreground,
        # here, when there is no worker: the simulator's deterministic runs).
        if self._executor is None:
            self._refresh(forecasts, forecasts.stale_forecasts(now, within_s=self.tick_s), now)
        elif self._forecasts is None or self._forecasts.done():
            stale = forecasts.stale_forecasts(now, within_s=self.tick_s)
            if stale:
                self._forecasts = self._executor.submit(self._refresh, forecasts, stale, now)

    @staticmethod
    def _refresh(forecasts: Refits, keys: list[PoolKey], now: float) -> None:
        for key in keys:
            forecasts.refresh_forecast(key, now)

    def wait_for_refits(self, timeout_s: float = 60.0) -> None:
        for future in list(self._refits.values()):
            future.exception(timeout=timeout_s)

    # -- the tick ---------------------------------------------------------------------------

    def _error(self, err: AdapterError, *, in_tick: bool = False) -> None:
        self.errors.append(err)
        self.telemetry.record_error(err.adapter, err.kind)
        self._error_log.report(err, self.clock.now(), in_tick=in_tick)

    def tick(self) -> TickReport:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        now = self.clock.now()
        errors: list[AdapterError] = []
        tracer = self.telemetry.tracer
        leader = False
        records: dict[PoolKey, DecisionRecord] = {}
        with tracer.start_as_current_span("pdscale.tick") as span:
            with tracer.start_as_current_span("observe"):
                try:
                    with self._observing:
                        result = self.source.observe(now)
                        self.last_observation = result.observation
                except Exception as exc:  # a source must not take the loop down
                    result = SourceResult(Observation(now, {}), [AdapterError(
                        "source", "error", f"{type(exc).__name__}: {exc}", None, now)])
                    self.telemetry.staleness_unknown(now)
            errors.extend(result.errors)
            obs = result.observation
            for key, ages in result.staleness.items():
                for signal, age in ages.items():
                    self.telemetry.record_staleness(key, signal, age, now_s=now)
            with tracer.start_as_current_span("decide"):
                try:
                    decisions = dict(self.policy.decide(obs))
                except Exception as exc:
                    log.exception("policy failed")
                    errors.append(AdapterError("policy", "error",
                                               f"{type(exc).__name__}: {exc}", None, now))
                    decisions = {}
                hold_degraded(decisions, obs)
                describe_data(decisions, obs)
                self.overrides.apply(decisions, obs)
                self._last_gpus.update({key: pool.replicas.gpus_held
                                        for key, pool in obs.pools.items()})
                decisions = apply_constraints(
                    decisions, obs, self.constraints,
                    unread_pools_gpus(decisions, obs, self.constraints, self._last_gpus))
            with tracer.start_as_current_span("act"):
                leader = self.is_leader()
                for key in sorted(decisions, key=str):
                    # Asked again before each pool: acting on one can take seconds (pod reads,
                    # per-pod work, conflict retries), and a lease lost meanwhile must stop
                    # the writes before the next leader makes its own.
                    leader = leader and self.is_leader()
                    records[key] = self._act(key, decisions[key], obs, leader, now, errors)
                if not leader and self.drainer is not None:
                    self.drainer.standby()
            with tracer.start_as_current_span("refit-schedule"):
                self._schedule_refits(now)
            span.set_attribute("pdscale.pools", len(decisions))
            span.set_attribute("pdscale.leader", leader)
            span.set_attribute("pdscale.errors", len(errors))
        for err in errors:
            self._error(replace(err, at_s=err.at_s or now), in_tick=True)
        self._error_log.settle({_error_key(e) for e in errors}, now)
        self.telemetry.leader.set(1 if leader else 0, {})
        # CPU of the tick's own thread: background refits do not count against the tick.
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
        self.telemetry.tick_duration.record(wall, {})
        report = TickReport(now, cpu, wall, records, errors, leader)
        with self._lock:
            self.last_tick = report
            self.ticks += 1
        return report

    def _act(self, key: PoolKey, decision: PoolDecision, obs: Observation, leader: bool,
             now: float, errors: list[AdapterError]) -> DecisionRecord:
        pool = obs.pools[key]
        r = pool.replicas
        current = r.desired
        outcome: Literal["applied", "unchanged", "standby", "dry_run", "recommend", "failed",
                         "draining"]
        if self.mode == "recommend":
            outcome = "recommend"
        elif not leader:
            outcome = "standby"
        elif self.drainer is not None and not self.dry_run:
            outcome, notes, extra = self._reach_by_draining(key, decision, current, now, errors)
            decision = replace(decision, reasons=(*decision.reasons, *notes),
                               detail={**decision.detail, **extra})
        elif decision.desired_replicas == current:
            outcome = "unchanged"
        elif self.dry_run:
            outcome = "dry_run"
        else:
            try:
                self.actuator.set_replicas(key, decision.desired_replicas, decision.reasons)
                outcome = "applied"
            except Exception as exc:  # one pool failing must not stop the others
                errors.append(AdapterError.from_scaling(exc, key, now))
                outcome = "failed"
        record = DecisionRecord(now, key, current, r.ready, decision.desired_replicas, outcome,
                                Cause(decision.cause), decision.reasons, decision.detail,
                                decision.forecast)
        self._log_decision(record)
        self.telemetry.record_decision(
            key, desired=decision.desired_replicas, cause=record.cause.value,
            detail=decision.detail, current=r.active, ready=r.ready,
            gpus_per_replica=r.gpus_per_replica, cold_start_p90_s=decision.cold_start_p90_s,
            forecast=decision.forecast.as_dict() if decision.forecast is not None else None,
            now_s=now)
        with self._lock:
            self.decisions.append(record)
            self.last[key] = record
        return record

    def _log_decision(self, record: DecisionRecord) -> None:
        """A scale (INFO, with its reasons), and a pool's replicas held above its need, each
        time what holds them changes (not every tick)."""
        name = f"{record.pool[0]}/{record.pool[1].value}"
        if record.outcome == "applied" and record.desired != record.current:
            said = "; ".join(record.reasons)
            if len(said) > LOG_REASONS_CHARS:  # every reason is in /v1/decisions
                said = said[:LOG_REASONS_CHARS - 40].rstrip() + " ... (the rest: /v1/decisions)"
            log.info("%s scaled %d -> %d (%s): %s", name, record.current, record.desired,
                     record.cause.value, said)
        holding = _holding(record)
        if holding != self._holding.get(record.pool):
            self._holding[record.pool] = holding
            if holding is not None:
                message = f"{record.desired} replicas, held above the need: {holding}"
                log.info("%s: %s", name, message)
                self._event(record, "PdscaleHeldAboveNeed", message)

    def _event(self, record: DecisionRecord, reason: str, message: str) -> None:
        """An Event on the pool's target where the actuator records them (Kubernetes, the
        process actuator), from the acting leader only; a failure is logged, never raised."""
        event = getattr(self.actuator, "event", None)
        if event is None or self.dry_run or self.mode != "act" or record.outcome == "standby":
            return
        try:
            event(record.pool, reason, message)
        except Exception as exc:  # an Event is a record, not a reason to fail the tick
            log.warning("could not record %s as an Event: %s", reason, exc)

    def _reach_by_draining(self, key: PoolKey, decision: PoolDecision, current: int,
                           now: float, errors: list[AdapterError]
                           ) -> tuple[Literal["applied", "unchanged", "failed", "draining"],
                                      tuple[str, ...], dict[str, Any]]:
        """The decision's count through the drainer: a lower one is reached by draining the
        chosen replicas first. When the drain cannot work for good (no pod rights, a workload
        that would disown a drained pod), scale-ups still go through and scale-downs wait."""
        assert self.drainer is not None
        target = decision.desired_replicas
        try:
            step = self.drainer.reach(key, target, current=current,
                                      reasons=decision.reasons, now_s=now)
            return step.outcome, step.notes, dict(step.detail)
        except GiveUp as exc:  # KubeRejected: e.g. no rights on pods
            if not self.drainer.enabled:  # only looking for drains left behind: no rights
                self.drainer.stop_cleanup()
                log.info("not checking pods for drains left by an earlier configuration: %s",
                         exc)
            else:
                errors.append(AdapterError.from_scaling(exc, key, now))
            note = f"drain unavailable: {exc}"
            if target < current and self.drainer.enabled:
                return "failed", (f"{note}; scale-down held until it is fixed",), {}
            if target == current:
                return "unchanged", (), {}
            try:
                self.actuator.set_replicas(key, target, decision.reasons)
            except Exception as write_exc:
                errors.append(AdapterError.from_scaling(write_exc, key, now))
                return "failed", (), {}
            return "applied", (note,) if self.drainer.enabled else (), {}
        except Exception as exc:  # one pool failing must not stop the others
            errors.append(AdapterError.from_scaling(exc, key, now))
            return "failed", (), {}

    # -- the loop ---------------------------------------------------------------------------

    def observe_pool(self, key: PoolKey) -> PoolObservation | None:
        """The pool as its source shows it now: a fresh read (an alert reaction checks its
        shortage there, not in a tick up to a tick old); None when the read fails or does not
        cover the pool."""
        now = self.clock.now()
        try:
            with self._observing:
                last = self.last_observation
                if last is not None and 0 <= now - last.now_s <= FRESH_READ_S:
                    return last.pools.get(key)
                result = self.source.observe(now)
                self.last_observation = result.observation
        except Exception as exc:  # the reaction then finds no shortage; the tick reports it
            log.info("could not read the pools for an alert reaction: %s", exc)
            return None
        return result.observation.pools.get(key)

    def pool_observation(self, key: PoolKey) -> PoolObservation | None:
        """The pool as the last tick observed it, while that is at most two ticks old
        (:attr:`last_observation`); None otherwise."""
        obs = self.last_observation
        if obs is None or self.clock.now() - obs.now_s > 2 * self.tick_s:
            return None
        return obs.pools.get(key)

    def request_tick(self) -> None:
        """Tick now instead of at the next interval (an alert reaction arrived)."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick every ``tick_s`` (or at once when :meth:`request_tick` is called) until
        ``stop`` is set; a failing tick is logged, not fatal."""
        next_at = self.clock.now()
        while not stop.is_set():
            self._wake.clear()
            try:
                self.tick()
            except Exception:
                log.exception("tick failed; trying again next tick")
            if stop.is_set():
                break
            next_at += self.tick_s
            delay = next_at - self.clock.now()
            if delay < 0:  # a slow tick: skip the missed ones rather than bunch up
                next_at = self.clock.now()
                delay = 0
            self.clock.wait(delay, self._wake)
            if self._wake.is_set() and not stop.is_set():
                next_at = self.clock.now()  # an early tick restarts the interval

    def stop(self) -> None:
        self._wake.set()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _pool_status(record: DecisionRecord, last: TickReport | None) -> dict[str, Any]:
        """The pool's last decision, marked ``current: false`` (with the age and the last
        tick's errors) when later ticks made none for it: a failing tick must not leave an
        old decision looking like today's."""
        row = record.as_dict()
        current = last is None or record.time_s >= last.started_s
        row["current"] = current
        if not current and last is not None:
            row["decision_age_s"] = last.started_s - record.time_s
            row["why_not_current"] = "; ".join(e.message for e in last.errors[:3]) or \
                "the last tick made no decision for this pool"
        return row

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            last = self.last_tick
            return {
                "ticks": self.ticks,
                "last_tick": None if last is None else {
                    "at": last.started_s, "wall_s": last.wall_s, "cpu_s": last.cpu_s,
                    "leader": last.leader, "errors": [e.as_dict() for e in last.errors]},
                "pools": {f"{k[0]}/{k[1].value}": self._pool_status(v, last)
                          for k, v in self.last.items()},
                "recent_errors": [e.as_dict() for e in list(self.errors)[-20:]],
            }
