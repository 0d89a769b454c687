"""The controller in a cluster: observations from Prometheus and Kubernetes, the policy built
from the spec, and history warm-up at start-up.

Per tick: one Prometheus query per signal for every pool, and one Kubernetes LIST per
(namespace, workload kind) for the replicas: neither count grows with the pools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from pdscale.controller._forecast import ForecastStage
from pdscale.controller._interface import (
    DataState,
    Observation,
    PoolKey,
    PoolObservation,
    PoolReplicas,
)
from pdscale.controller._kube import KubeScaleActuator
from pdscale.controller._reconciler import AdapterError, SourceResult
from pdscale.controller._simbackend import SimBackend
from pdscale.spec import Role, Spec
from pdscale.telemetry import (
    OtlpStore,
    PrometheusQueryError,
    PrometheusReader,
    PrometheusUnavailable,
    Signal,
    SignalValue,
    derive_signals,
)

__all__ = ["HEALTH_SIGNALS", "POLICY_SIGNALS", "REQUEST_SIGNALS", "ClusterSource", "SignalReader",
           "SourcedReader", "data_health", "warm_from_history"]

POLICY_SIGNALS = (Signal.PROMPT_TOKENS_PER_S, Signal.GENERATION_TOKENS_PER_S,
                  Signal.PREFIX_CACHE_HIT_RATIO, Signal.TTFT_P95_S, Signal.ITL_P95_S,
                  Signal.QUEUE_DEPTH, Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_COMPUTED_PER_S,
                  Signal.TTFT_P95_RECENT_S, Signal.PROMPT_TOKENS_PEAK_PER_S,
                  Signal.PROMPT_TOKENS_DISPERSION, Signal.RUNNING_REQUESTS,
                  Signal.ITL_P50_S)
"""What the policy reads each tick (one query each, for all pools)."""
HEALTH_SIGNALS = (Signal.SAMPLE_AGE_S, Signal.TARGETS_UP, Signal.TARGETS)
"""How old the pool's engine samples are and how many of its scrape targets answer: read
with the policy's signals, they decide whether those can be trusted."""
REQUEST_SIGNALS = frozenset({
    Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S, Signal.GENERATION_TOKENS_PER_S,
    Signal.TTFT_P50_S, Signal.TTFT_P95_S, Signal.TTFT_P99_S, Signal.TTFT_P95_RECENT_S,
    Signal.TTFT_QUEUE_P95_S, Signal.TTFT_PREFILL_P95_S, Signal.TTFT_TRANSFER_P95_S,
    Signal.ITL_P50_S, Signal.ITL_P95_S, Signal.E2E_P95_S})
"""Signals whose value shows the pool's requests: counted requests and tokens, and latency
percentiles (the OTLP store computes them from request spans). One answered through OTLP means
the pool is not idle, whatever Prometheus' request series say."""


def data_health(values: Mapping[Signal, SignalValue], now_s: float, stale_after_s: float,
                *, departing: int = 0) -> tuple[float | None, str | None]:
    """(age of the pool's newest engine sample, why the data is degraded or None).

    The recorded signals are rates over minutes: when a target dies they keep a value for
    minutes, falling as the window empties, and the recording rule's own timestamp stays
    fresh. The engine samples' age and the targets' health show the death within one scrape
    interval (Prometheus marks a dead target's series stale at its first failed scrape).
    Targets down that are no more than ``departing`` (replicas a scale-down just removed,
    listed until service discovery drops them) are planned, not a degradation."""
    age_v = values.get(Signal.SAMPLE_AGE_S)
    age = None
    if age_v is not None and age_v.value is not None and age_v.age_s is not None:
        age = max(0.0, age_v.value) + age_v.age_s
    why = []
    down, total = _targets_down(values)
    if down > departing:
        why.append(f"{down:.0f} of {total:.0f} scrape targets down")
    if age is None:
        why.append("no fresh engine sample (every target gone, or the "
                   f"{Signal.SAMPLE_AGE_S.value} rule missing)")
    elif age > stale_after_s:
        why.append(f"newest engine sample {age:.0f}s old (stale after {stale_after_s:.0f}s)")
    return age, "; ".join(why) or None


class SignalReader(Protocol):
    """Where a tick's signals come from: the Prometheus reader, or :class:`SourcedReader`."""

    stale_after_s: float

    def read(self, spec: Spec, signals: Sequence[Signal], *, at_s: float
             ) -> dict[PoolKey, dict[Signal, SignalValue]]:
        ...


class SourcedReader:
    """Each signal from the source the spec names (``controller.signal_sources``):
    Prometheus, the OTLP receiver's store, or both (OTLP's value where it has one, else
    Prometheus'). The pool's data age is the freshest of the sources in use; scrape-target
    health comes from Prometheus only. A Prometheus failure leaves the OTLP signals standing
    (``partial_errors`` holds it) unless every signal needed Prometheus."""

    def __init__(self, spec: Spec, prometheus: PrometheusReader | None,
                 otlp: OtlpStore | None) -> None:
        sources = spec.controller.signal_sources
        self.spec = spec
        self.prometheus = prometheus if sources.uses("prometheus") else None
        self.otlp = otlp
        if prometheus is None and sources.uses("prometheus"):
            raise ValueError("controller.signal_sources reads Prometheus, but no Prometheus "
                             "reader was given")
        if otlp is None and sources.uses("otlp"):
            raise ValueError("controller.signal_sources reads OTLP, but the receiver is off")
        self.stale_after_s = max(
            [r.stale_after_s for r in (prometheus, otlp) if r is not None] or [120.0])
        self.answered: dict[PoolKey, dict[Signal, str | None]] = {}
        """Per pool and signal, the source whose value was used at the last read (None: no
        source had one)."""
        self.ages: dict[PoolKey, dict[Signal, float | None]] = {}
        """Per pool and signal, the age in seconds of the data behind the value used at the
        last read (None: unknown, or no value)."""
        self.partial_errors: list[Exception] = []
        self.served: set[PoolKey] = set()
        """The pools whose requests the last read saw through OTLP: a request signal
        (:data:`REQUEST_SIGNALS`) answered from spans or OTLP metrics, the only sign of
        traffic where the spec reads the request and token counts from Prometheus and the
        engine has not exported them (yet)."""

    def _source(self, signal: Signal) -> str:
        if signal in HEALTH_SIGNALS:
            return "health"
        return self.spec.controller.signal_sources.source(signal.value)

    def read(self, spec: Spec, signals: Sequence[Signal], *, at_s: float
             ) -> dict[PoolKey, dict[Signal, SignalValue]]:
        self.partial_errors = []
        self.served = set()
        prom_signals = [s for s in signals if self._source(s) in ("prometheus", "both")
                        or (self._source(s) == "health" and self.prometheus is not None)]
        otlp_signals = [s for s in signals if self._source(s) in ("otlp", "both")
                        or (s is Signal.SAMPLE_AGE_S and self.otlp is not None)]
        prom: dict[PoolKey, dict[Signal, SignalValue]] = {}
        if self.prometheus is not None and prom_signals:
            try:
                prom = self.prometheus.read(spec, prom_signals, at_s=at_s)
            except (PrometheusUnavailable, PrometheusQueryError) as exc:
                if not otlp_signals:
                    raise
                self.partial_errors.append(exc)
        otlp = self.otlp.read(spec, otlp_signals, at_s=at_s) \
            if self.otlp is not None and otlp_signals else {}
        missing = SignalValue(None, None)
        out: dict[PoolKey, dict[Signal, SignalValue]] = {}
        for key in {*prom, *otlp}:
            p, o = prom.get(key, {}), otlp.get(key, {})
            row: dict[Signal, SignalValue] = {}
            answered: dict[Signal, str | None] = {}
            for sig in signals:
                source = self._source(sig)
                pv, ov = p.get(sig, missing), o.get(sig, missing)
                if sig is Signal.SAMPLE_AGE_S:
                    fresh = [(v, name) for v, name in ((pv, "prometheus"), (ov, "otlp"))
                             if v.value is not None]
                    best = min(fresh, key=lambda f: (f[0].value or 0.0) + (f[0].age_s or 0.0),
                               default=(missing, None))
                    row[sig], answered[sig] = best
                elif source == "otlp" or (source == "both" and ov.value is not None):
                    row[sig], answered[sig] = ov, "otlp" if ov.value is not None else None
                else:
                    row[sig], answered[sig] = pv, "prometheus" if pv.value is not None \
                        else None
            out[key] = row
            self.answered[key] = answered
            if any(answered.get(sig) == "otlp" for sig in REQUEST_SIGNALS):
                self.served.add(key)
            self.ages[key] = {sig: v.age_s if sig is not Signal.SAMPLE_AGE_S else v.value
                              for sig, v in row.items()}
        return out


def _targets_down(values: Mapping[Signal, SignalValue]) -> tuple[float, float]:
    """(targets down, targets) of the pool; (0, 0) when unread."""
    up, total = values.get(Signal.TARGETS_UP), values.get(Signal.TARGETS)
    if up is None or total is None or up.value is None or not total.value:
        return 0.0, 0.0
    return max(0.0, total.value - up.value), total.value


DEPARTURE_S = 60.0
"""How long after a scale-down the replicas it removed may still be listed as scrape targets
that are down: until service discovery drops them (a pod's until it is deleted, a loopback
worker's until the actuator rewrites its ``file_sd`` file and Prometheus reads it). Within
this, that many targets down are the plan, not a degradation."""


def _pool_signals(values: Mapping[Signal, SignalValue]) -> dict[Signal, float | None]:
    """The read values, with the derived signals (mean lengths over the rate window)."""
    return derive_signals({sig: v.value for sig, v in values.items()})


class ClusterSource:
    """Each pool's replicas (the actuator) and signals (Prometheus, or each from the source the
    spec names: :class:`SourcedReader`), with the data's state:
    a Prometheus that cannot be read (``unavailable``, said as such, not as missing targets),
    targets down that a scale-down removed (``departing``, not degraded), a pool with every
    target up but no request counted yet (``idle``), or ``degraded``."""

    def __init__(self, spec: Spec, reader: PrometheusReader | SignalReader,
                 kube: KubeScaleActuator | SimBackend, *,
                 extra_signals: Sequence[Signal] = ()) -> None:
        self.spec = spec
        self.reader = reader
        self.kube = kube
        self.signals = POLICY_SIGNALS + tuple(s for s in extra_signals
                                              if s not in POLICY_SIGNALS + HEALTH_SIGNALS)
        """The signals the policy reads (pdscale's, and any a baseline policy adds)."""
        self._desired: dict[PoolKey, int] = {}
        self._cuts: dict[PoolKey, list[tuple[float, int]]] = {}
        """(when, replicas) of each pool's recent scale-downs (:data:`DEPARTURE_S`)."""

    def _departing(self, key: PoolKey, desired: int, now_s: float) -> int:
        """Replicas the pool's scale-downs of the last :data:`DEPARTURE_S` removed."""
        before = self._desired.get(key)
        self._desired[key] = desired
        cuts = [(t, n) for t, n in self._cuts.get(key, []) if now_s - t <= DEPARTURE_S]
        if before is not None and desired < before:
            cuts.append((now_s, before - desired))
        self._cuts[key] = cuts
        return sum(n for _, n in cuts)

    def observe(self, now_s: float) -> SourceResult:
        errors: list[AdapterError] = []
        unavailable: str | None = None
        try:
            signals = self.reader.read(self.spec, self.signals + HEALTH_SIGNALS, at_s=now_s)
        except (PrometheusUnavailable, PrometheusQueryError) as exc:
            errors.append(AdapterError.from_exception(exc, None, now_s))
            signals = {}
            unavailable = f"Prometheus unreadable: {exc}"
        for partial in getattr(self.reader, "partial_errors", ()):
            errors.append(AdapterError.from_exception(partial, None, now_s))
        pools: dict[PoolKey, PoolObservation] = {}
        staleness: dict[PoolKey, dict[Signal, float | None]] = {}
        statuses = self.kube.read_statuses([(s.name, role) for s in self.spec.services
                                            for role in s.pools])
        for svc in self.spec.services:
            for role, pool in svc.pools.items():
                key = (svc.name, role)
                status = statuses[key]
                if isinstance(status, Exception):
                    errors.append(AdapterError.from_scaling(status, key, now_s))
                    continue
                values = signals.get(key, {})
                departing = self._departing(key, status.desired, now_s)
                sample_age, degraded = data_health(values, now_s, self.reader.stale_after_s,
                                                   departing=departing)
                served = isinstance(self.reader, SourcedReader) and key in self.reader.served
                state, note = _state(values, role, degraded, unavailable, departing,
                                     served=served)
                lost = self.kube.losses(key) if hasattr(self.kube, "losses") else None
                if degraded is not None and lost:  # the actuator knows which replica died
                    degraded = f"{degraded} ({lost})"
                if unavailable is not None:
                    degraded = f"{unavailable}; holding, no scale-down until it answers"
                if sample_age is None or sample_age > self.reader.stale_after_s:
                    # No engine sample to trust: the rates still computed from the window's
                    # older samples would read as falling demand. Withhold them.
                    values = {sig: SignalValue(None, v.age_s) if sig in self.signals else v
                              for sig, v in values.items()}
                values = {sig: v for sig, v in values.items() if sig not in HEALTH_SIGNALS}
                ages = [v.age_s for v in values.values() if v.age_s is not None]
                staleness[key] = {sig: v.age_s for sig, v in values.items()}
                staleness[key][Signal.SAMPLE_AGE_S] = sample_age
                replicas = PoolReplicas(
                    ready=status.ready, starting=max(0, status.desired - status.ready),
                    draining=max(0, status.replicas - status.desired), desired=status.desired,
                    min_replicas=pool.min_replicas, max_replicas=pool.max_replicas,
                    gpus_per_replica=pool.gpus_per_replica)
                if sample_age is not None:
                    data_time = now_s - sample_age
                else:
                    data_time = now_s - (min(ages) if ages else 0.0)
                pools[key] = PoolObservation(key, replicas, _pool_signals(values), data_time,
                                             degraded=degraded, data_state=state, note=note)
        return SourceResult(Observation(now_s, pools), errors, staleness)


_DEMAND = {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S, Role.DECODE: Signal.GENERATION_TOKENS_PER_S}


def _missing(values: Mapping[Signal, SignalValue], signal: Signal) -> bool:
    """No such series at all (not a stale or NaN one)."""
    v = values.get(signal)
    return v is None or (v.value is None and v.age_s is None)


def _state(values: Mapping[Signal, SignalValue], role: Role, degraded: str | None,
           unavailable: str | None, departing: int, *, served: bool = False
           ) -> tuple[DataState, str | None]:
    """The pool's data state and, for ``idle`` and ``departing``, what it means. ``idle``
    needs every source to show no request: no request or demand series in ``values``, and
    not ``served`` (requests seen through OTLP, :attr:`SourcedReader.served`)."""
    if unavailable is not None:
        return "unavailable", None
    if degraded is not None:
        return "degraded", None
    down, total = _targets_down(values)
    if down:
        return "departing", (f"{down:.0f} of {total:.0f} scrape targets are replicas a "
                             "scale-down removed (planned, not degraded)")
    if total and not served and _missing(values, Signal.REQUEST_RATE) \
            and _missing(values, _DEMAND[role]):
        return "idle", ("no request counted yet: every scrape target is up, and the engine "
                        "exports its request and token series from the first request (if "
                        "requests are served, `pdscale check` finds the selector that matches "
                        "nothing)")
    return "ok", None


def warm_from_history(spec: Spec, reader: PrometheusReader, forecasts: ForecastStage, *,
                      now_s: float, history_s: float, step_s: float = 60.0
                      ) -> dict[PoolKey, int]:
    """Feed each pool's forecaster its demand history (prefill: prompt tokens/s; decode:
    generated tokens/s), so a restarted controller forecasts at once. Returns the points
    taken per pool. Prometheus errors propagate: the caller decides to go on cold."""
    start = now_s - history_s
    prompt = reader.history(spec, Signal.PROMPT_TOKENS_PER_S, start_s=start, end_s=now_s,
                            step_s=step_s)
    gen = reader.history(spec, Signal.GENERATION_TOKENS_PER_S, start_s=start, end_s=now_s,
                         step_s=step_s)
    taken: dict[PoolKey, int] = {}
    for key, (times, values) in prompt.items():
        if key[1] is Role.PREFILL:
            taken[key] = forecasts.warm(key, times, values)
    for key, (times, values) in gen.items():
        if key[1] is Role.DECODE:
            taken[key] = forecasts.warm(key, times, values)
    return taken
