"""Recording rules and tiered alerting rules, generated from the spec as plain dicts.

Design. Recording rules turn each engine's series into one engine-agnostic series per signal
and pool (telemetry's catalog). Every alert reads only those recorded series (and pdscale's own
metrics), so one set of alert definitions serves vLLM, SGLang, Dynamo and TGI alike.

Each alert is defined twice under one name, ``severity: warning`` and ``severity: critical``,
each with its own threshold and ``for`` (kubernetes-mixin convention, shared/REFERENCE.md §2).
Rules are per pool, so thresholds tied to a service (its SLO, its pool's cold start) are exact.
Beside the PromQL, every tier carries a small Python model of its expression
(:attr:`TierDef.value`), which the promtool test generator uses to predict when each tier
fires; promtool then checks the prediction against the real rule engine. Each alert's
``summary`` comes from its runbook (``_runbooks.py``), the one source of the runbooks page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pdscale.alerts._runbooks import summary
from pdscale.spec import (
    AlertSettings,
    Role,
    ServiceSpec,
    Spec,
    format_duration,
    parse_duration,
)
from pdscale.telemetry import (
    SLO_OBJECTIVE_RECORD,
    SLO_THRESHOLD_RECORD,
    SLO_WINDOWS,
    Signal,
    engine_signals,
    recorded_expr,
    recorded_name,
    slo_bucket_expr,
    slo_bucket_record,
    slo_error_ratio_expr,
    slo_error_ratio_record,
    slo_source,
    span_signals,
)

Severity = Literal["warning", "critical"]
Rule = dict[str, Any]

LOOKBACK_MIN = 5
"""Prometheus' default lookback delta, in minutes (a sample is visible this long)."""


class Frame:
    """Input series of a promtool test, one value a minute, as the Python models read them."""

    def __init__(self, series: Mapping[tuple[str, Role], list[float | None]]) -> None:
        self._series = series

    def samples(self, name: str, role: Role, start: int, end: int) -> list[float]:
        """Raw samples in minutes [start, end], as a range selector returns them."""
        values = self._series.get((name, role)) or []
        return [v for v in values[max(0, start):end + 1] if v is not None and not math.isnan(v)]

    def at(self, name: str, role: Role, minute: int) -> float | None:
        """The value Prometheus sees at ``minute``: the latest sample within the lookback;
        None (also after an explicit stale marker, stored as NaN) when there is none."""
        values = self._series.get((name, role))
        if values is None:
            return None
        for i in range(min(minute, len(values) - 1), max(-1, minute - LOOKBACK_MIN - 1), -1):
            v = values[i]
            if v is None:
                continue
            return None if math.isnan(v) else v
        return None


ValueFn = Callable[[Frame, int], float | None]
Perturb = Callable[[int, float], float | None]
"""A test input from minute H on: (minutes since H, healthy value at H) -> value, None for no
sample, NaN for a stale marker."""

TARGETS = 8.0
"""Scrape targets per pool in the tests' healthy baseline (fine-grained enough for shares)."""


@dataclass(frozen=True)
class TierDef:
    severity: Severity
    expr: str
    for_s: int
    value: ValueFn
    """Python model of ``expr`` at a minute: the alert's value, or None when it is not met."""
    labels: Mapping[str, str] = field(default_factory=dict)
    description: str | None = None
    """Overrides the alert's description for this tier (e.g. naming its windows)."""


@dataclass(frozen=True)
class AlertDef:
    """One alert of one pool, in both tiers, with what a test needs to drive it."""

    name: str
    service: ServiceSpec
    role: Role
    summary: str
    """From the alert's runbook (:func:`pdscale.alerts._runbooks.summary`)."""
    description: str
    """Alertmanager template; only {{ $labels.x }} and {{ $value | f }} are used."""
    tiers: tuple[TierDef, ...]
    reads: Mapping[str, float | Literal["time"] | None]
    """Series the alert reads, with a healthy value ('time': the eval time in seconds; None:
    any value, only presence matters)."""
    levels: Mapping[Severity, Mapping[str, Perturb]]
    """Per scenario ('warning', 'critical'), the series a test perturbs from minute H on."""
    series_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels the alert's input series carry beyond the pool's (e.g. pod and gpu)."""
    history_min: int = 10
    eval_step_min: int = 1
    """Rule evaluation step of its promtool test (5 for alerts with hour-long windows)."""
    escalates_by_duration: bool = False
    """Both tiers share one condition and differ only in ``for``: one scenario shows warning
    alone first, then both."""
    """Healthy minutes before a test's scenario starts (long for trailing baselines)."""


def pool_labels(service: ServiceSpec, role: Role) -> dict[str, str]:
    return {
        "namespace": service.namespace,
        "model_name": service.model_name,
        "pdscale_service": service.name,
        "pdscale_pool": role.value,
    }


def pool_matchers(service: ServiceSpec, role: Role) -> str:
    return f'pdscale_service="{service.name}",pdscale_pool="{role.value}"'


# --------------------------------------------------------------------------------------------
# Recording rules


def recording_groups(spec: Spec) -> list[Rule]:
    """One group per service: every available signal of each pool, and the SLO error ratios."""
    groups = []
    for service in spec.services:
        rules: list[Rule] = []
        for role in Role:
            labels = pool_labels(service, role)
            del labels["namespace"]  # kept from the series by `by (namespace)`
            signals = engine_signals(service, role) | span_signals(spec, service, role)
            for signal in sorted(signals, key=lambda s: s.value):
                rules.append({
                    "record": recorded_name(signal),
                    "expr": recorded_expr(spec, signal, service, role),
                    "labels": dict(labels),
                })
        for kind, role in (("ttft", Role.PREFILL), ("itl", Role.DECODE)):
            labels = pool_labels(service, role)
            threshold = service.slo.threshold_s(kind)  # type: ignore[arg-type]
            rules.append({"record": SLO_OBJECTIVE_RECORD,
                          "expr": f"vector({_num(service.slo.objective)})",
                          "labels": dict(labels)})
            rules.append({"record": SLO_THRESHOLD_RECORD, "expr": f"vector({_num(threshold)})",
                          "labels": dict(labels)})
            del labels["namespace"]
            source = slo_source(spec, kind)  # type: ignore[arg-type]
            for window in SLO_WINDOWS:
                expr = slo_error_ratio_expr(service, kind, window,  # type: ignore[arg-type]
                                            source=source)
                if expr is not None:
                    rules.append({
                        "record": slo_error_ratio_record(kind, window),  # type: ignore[arg-type]
                        "expr": expr,
                        "labels": dict(labels),
                    })
            bucket = slo_bucket_expr(service, kind, source=source)  # type: ignore[arg-type]
            if bucket is not None:
                rules.append({"record": slo_bucket_record(kind),  # type: ignore[arg-type]
                              "expr": bucket, "labels": dict(labels)})
        groups.append({"name": f"pdscale.{service.name}.recording", "rules": rules})
    return groups


# --------------------------------------------------------------------------------------------
# Alert definitions


def _gt(name: str, role: Role, threshold: float) -> ValueFn:
    def value(frame: Frame, minute: int) -> float | None:
        v = frame.at(name, role, minute)
        return v if v is not None and v > threshold else None
    return value


def _const(value: float) -> Perturb:
    return lambda _m, _h: value


def _stale(m: int, _h: float) -> float | None:
    return math.nan if m == 0 else None


def _gauge_alert(*, name: str, service: ServiceSpec, role: Role, signal: Signal,
                 warning: float, warning_for: int, critical: float, critical_for: int,
                 description: str, bound: float | None = None,
                 multiplier: float = 1.0, labels: Mapping[str, str] | None = None) -> AlertDef:
    """`recorded > threshold × multiplier` in two tiers, driven by setting the series."""
    series = recorded_name(signal)
    sel = f"{series}{{{pool_matchers(service, role)}}}"
    w, c = warning * multiplier, critical * multiplier
    crit_level = (c + bound) / 2 if bound is not None else c * 1.25 if c > 0 else c + 1
    return AlertDef(
        name=name, service=service, role=role, summary=summary(name), description=description,
        tiers=(
            TierDef("warning", f"{sel} > {_num(w)}", warning_for, _gt(series, role, w),
                    labels=dict(labels or {})),
            TierDef("critical", f"{sel} > {_num(c)}", critical_for, _gt(series, role, c),
                    labels=dict(labels or {})),
        ),
        reads={series: w * 0.5},
        levels={"warning": {series: _const((w + c) / 2)},
                "critical": {series: _const(crit_level)}},
    )


def _num(value: float) -> str:
    """A threshold as PromQL reads it back exactly (repr is round-trip exact)."""
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def alert_defs(spec: Spec) -> list[AlertDef]:
    out: list[AlertDef] = []
    for service in spec.services:
        for role in Role:
            out.extend(_pool_alerts(spec.alerts, service, role))
            out.extend(_ttft_stage_alerts(spec, service, role))
            out.extend(_drain_alerts(spec, service, role))
    return out


_STAGE_ADVICE = {
    Signal.TTFT_QUEUE_P95_S: (
        "queue", "requests waited {value} (p95) in the engine's queue before their prefill",
        "the pool is short of prefill capacity: add replicas, or check that the router "
        "spreads requests"),
    Signal.TTFT_PREFILL_P95_S: (
        "prefill", "the prefill itself took {value} (p95) to the first token",
        "long prompts, a falling prefix-cache hit rate or a slow GPU; more replicas do not "
        "shorten one prefill (check prompt lengths and the cache)"),
    Signal.TTFT_TRANSFER_P95_S: (
        "transfer", "TTFT outside the queue and the prefill took {value} (p95)",
        "in P/D this is the KV transfer from prefill to decode (check the KV connector and "
        "the network between the pools), else tokenisation and the API server's hand-off"),
}


def _ttft_stage_alerts(spec: Spec, service: ServiceSpec, role: Role) -> list[AlertDef]:
    """TTFT by stage, where the engines' request spans give it (:func:`span_signals`): one
    alert name, a ``stage`` label, so a page says whether the time went to the queue, the
    prefill or the transfer, the first question when TTFT swings."""
    tiers = spec.alerts.thresholds.ttft_stage
    slo = service.slo.ttft_p95_s
    where = f"{service.namespace}/{service.name} {role.value}"
    out = []
    for signal in sorted(span_signals(spec, service, role) & set(_STAGE_ADVICE),
                         key=lambda s: s.value):
        stage, what, advice = _STAGE_ADVICE[signal]
        value = "{{ $value | humanizeDuration }}"
        out.append(_gauge_alert(
            name="LLMTimeToFirstTokenStageHigh", service=service, role=role, signal=signal,
            warning=tiers.warning.value, warning_for=tiers.warning.for_,
            critical=tiers.critical.value, critical_for=tiers.critical.for_,
            description=f"{where}: {what.format(value=value)} against a TTFT SLO of "
                        f"{slo:g}s: {advice}.",
            multiplier=slo, labels={"stage": stage}))
    return out


def _drain_alerts(spec: Spec, service: ServiceSpec, role: Role) -> list[AlertDef]:
    """Scale-down drains that keep ending at their timeout (only with controller.drain)."""
    if not spec.controller.drain.enabled:
        return []
    tiers = spec.alerts.thresholds.drain_timeouts
    series = "pdscale_drain_timeouts_in_a_row"
    sel = f"{series}{{{pool_matchers(service, role)}}}"
    w, c = tiers.warning.value, tiers.critical.value
    where = f"{service.namespace}/{service.name} {role.value}"
    timeout = format_duration(spec.controller.drain.timeout)
    return [AlertDef(
        name="PDScaleDrainTimingOut", service=service, role=role,
        summary=summary("PDScaleDrainTimingOut"),
        description=f"{where}: the last {{{{ $value }}}} drains in a row ended at the "
                    f"{timeout} timeout with requests still on the replica, which were cut. "
                    "Requests outlast the timeout (raise controller.drain.timeout), or the "
                    "pod's running and waiting series never read idle (check them per pod).",
        tiers=(TierDef("warning", f"{sel} > {_num(w)}", tiers.warning.for_, _gt(series, role, w)),
               TierDef("critical", f"{sel} > {_num(c)}", tiers.critical.for_,
                       _gt(series, role, c))),
        reads={series: 0.0},
        levels={"warning": {series: _const((w + c) / 2)}, "critical": {series: _const(c + 1)}},
    )]


def _pool_alerts(settings: AlertSettings, service: ServiceSpec, role: Role) -> list[AlertDef]:
    th = settings.thresholds
    have = engine_signals(service, role)
    pool = service.pools[role]
    # Rules are per pool, so the pool's names are written in; only per-instance labels (pod,
    # gpu) are templated. Annotation templates see the expression's labels, not the rule's.
    where = f"{service.namespace}/{service.name} {role.value}"
    defs: list[AlertDef] = []

    def gauge(name: str, signal: Signal, tiers: Any, description: str, **kw: Any) -> None:
        if signal in have:
            defs.append(_gauge_alert(
                name=name, service=service, role=role, signal=signal,
                warning=tiers.warning.value, warning_for=tiers.warning.for_,
                critical=tiers.critical.value, critical_for=tiers.critical.for_,
                description=description, **kw))

    if role is Role.PREFILL:
        gauge("LLMTimeToFirstTokenHigh", Signal.TTFT_P95_S, th.ttft_high,
              f"{where}: TTFT p95 is {{{{ $value | humanizeDuration }}}} against an SLO of "
              f"{service.slo.ttft_p95_s:g}s. Add prefill replicas or check the queue.",
              multiplier=service.slo.ttft_p95_s)
    if role is Role.DECODE:
        gauge("LLMInterTokenLatencyHigh", Signal.ITL_P95_S, th.itl_high,
              f"{where}: ITL p95 is {{{{ $value | humanizeDuration }}}} against an SLO of "
              f"{service.slo.itl_p95_s:g}s. Add decode replicas or check KV-cache pressure.",
              multiplier=service.slo.itl_p95_s)
    if Signal.QUEUE_DEPTH in have:
        defs.append(_backlog_alert(service, role, th.queue_backlog, where))
        defs.append(_queue_growing_alert(service, role, th.queue_growing,
                                         _healthy_waiting(th.queue_backlog), where))
    if role is Role.PREFILL and Signal.PREFIX_CACHE_HIT_RATIO in have:
        defs.append(_prefix_drop_alert(settings, service, role, where))
    gauge("LLMKVCacheNearFull", Signal.KV_CACHE_USAGE_MAX_RATIO, th.kv_cache_usage,
          f"{where}: the fullest replica's KV cache is {{{{ $value | humanizePercentage }}}} "
          "used; requests will queue or be preempted.", bound=1.0)
    gauge("LLMPreemptionsRising", Signal.PREEMPTIONS_PER_S, th.preemptions,
          f"{where}: {{{{ $value | humanize }}}} preemptions per second; the KV cache is "
          "over-committed.")
    gauge("LLMErrorRateHigh", Signal.ERROR_RATIO, th.error_ratio,
          f"{where}: {{{{ $value | humanizePercentage }}}} of requests failed over 5 minutes.",
          bound=1.0)
    # P/D "cache write" failures: the KV a prefill wrote never reaches its decode instance.
    gauge("LLMKVTransferFailing", Signal.KV_TRANSFER_FAILURES_PER_S, th.kv_transfer_failures,
          f"{where}: {{{{ $value | humanize }}}} KV transfers failed per second; their requests "
          "fail or are recomputed (check the KV connector and the network between pools).")
    gauge("LLMKVHandoffFailing", Signal.KV_HANDOFF_FAILURES_PER_S, th.kv_transfer_failures,
          f"{where}: {{{{ $value | humanize }}}} requests per second lost their KV hand-off "
          "(expired before decode read it, or the bootstrap failed); decode may be too slow "
          "to pick them up.")
    gauge("LLMGPUMemoryNearFull", Signal.GPU_MEMORY_USED_MAX_RATIO, th.gpu_memory,
          f"{where}: the fullest GPU has {{{{ $value | humanizePercentage }}}} of its memory "
          "used.", bound=1.0)
    gauge("LLMGPUTemperatureHigh", Signal.GPU_TEMPERATURE_MAX_CELSIUS, th.gpu_temperature,
          f"{where}: the hottest GPU is at {{{{ $value }}}} degrees Celsius.")
    if Signal.GPU_XID_ERRORS in have:
        defs.append(_xid_alert(settings, service, role))
    defs.append(_target_down_alert(service, role, th.target_down, where))
    for group, signal in absence_groups(service, role):
        defs.append(_absent_alert(service, role, th.metrics_absent_for, where, group, signal))
    slo_bucket = _slo_bucket_alert(service, role, th.metrics_absent_for, where)
    if slo_bucket is not None:
        defs.append(slo_bucket)
    defs.append(_scaling_stuck_alert(service, role, th.scaling_stuck, pool.cold_start, where))
    defs.append(_control_plane_alert(service, role, th.control_plane_stale, where))
    defs.extend(_burn_rate_alerts(settings, service, role, where))
    return defs


def _healthy_waiting(backlog_tiers: Any) -> float:
    """Waiting requests in the tests' healthy baseline: a quarter of the warning backlog."""
    return float(TARGETS * backlog_tiers.warning.value * 0.25)


def _backlog_alert(service: ServiceSpec, role: Role, tiers: Any, where: str) -> AlertDef:
    waiting, up = recorded_name(Signal.QUEUE_DEPTH), recorded_name(Signal.TARGETS_UP)
    m = pool_matchers(service, role)
    ratio = f"{waiting}{{{m}}} / clamp_min({up}{{{m}}}, 1)"

    def model(threshold: float) -> ValueFn:
        def value(frame: Frame, minute: int) -> float | None:
            q, n = frame.at(waiting, role, minute), frame.at(up, role, minute)
            if q is None or n is None:
                return None
            v = q / max(n, 1.0)
            return v if v > threshold else None
        return value

    w, c = tiers.warning.value, tiers.critical.value
    return AlertDef(
        name="LLMQueueBacklogHigh", service=service, role=role,
        summary=summary("LLMQueueBacklogHigh"),
        description=f"{where}: {{{{ $value | humanize }}}} requests wait per ready replica.",
        tiers=(TierDef("warning", f"{ratio} > {_num(w)}", tiers.warning.for_, model(w)),
               TierDef("critical", f"{ratio} > {_num(c)}", tiers.critical.for_, model(c))),
        reads={waiting: _healthy_waiting(tiers), up: TARGETS},
        levels={"warning": {waiting: _const(TARGETS * (w + c) / 2)},
                "critical": {waiting: _const(TARGETS * c * 1.5)}},
    )


def _queue_growing_alert(service: ServiceSpec, role: Role, tiers: Any, healthy: float,
                         where: str) -> AlertDef:
    """Growth over 10 minutes, per second: ``(q - q offset 10m) / 600``, exact and cheap."""
    waiting = recorded_name(Signal.QUEUE_DEPTH)
    sel = f"{waiting}{{{pool_matchers(service, role)}}}"
    expr = f"({sel} - {sel} offset 10m) / 600"

    def model(threshold: float) -> ValueFn:
        def value(frame: Frame, minute: int) -> float | None:
            now, before = frame.at(waiting, role, minute), frame.at(waiting, role, minute - 10)
            if now is None or before is None or minute < 10:
                return None
            v = (now - before) / 600
            return v if v > threshold else None
        return value

    w, c = tiers.warning.value, tiers.critical.value

    def ramp(slope_per_s: float) -> Perturb:
        return lambda m, h: h + slope_per_s * 60 * m

    return AlertDef(
        name="LLMQueueGrowing", service=service, role=role,
        summary=summary("LLMQueueGrowing"),
        description=f"{where}: the queue grew by {{{{ $value | humanize }}}} requests per "
                    "second over the last 10 minutes.",
        tiers=(TierDef("warning", f"{expr} > {_num(w)}", tiers.warning.for_, model(w)),
               TierDef("critical", f"{expr} > {_num(c)}", tiers.critical.for_, model(c))),
        reads={waiting: healthy},
        levels={"warning": {waiting: ramp((w + c) / 2)},
                "critical": {waiting: ramp(c * 2)}},
    )


def _prefix_drop_alert(settings: AlertSettings, service: ServiceSpec, role: Role,
                       where: str) -> AlertDef:
    tiers = settings.thresholds.prefix_cache_hit_drop
    hit = recorded_name(Signal.PREFIX_CACHE_HIT_RATIO)
    sel = f"{hit}{{{pool_matchers(service, role)}}}"
    window = format_duration(settings.prefix_cache_baseline)
    baseline = f"avg_over_time({sel}[{window}])"
    expr = f"1 - {sel} / ({baseline} > 0.05)"
    window_min = settings.prefix_cache_baseline // 60

    def model(threshold: float) -> ValueFn:
        def value(frame: Frame, minute: int) -> float | None:
            now = frame.at(hit, role, minute)
            seen = frame.samples(hit, role, minute - window_min, minute)
            if now is None or not seen:
                return None
            base = sum(seen) / len(seen)
            if not base > 0.05:
                return None
            v = 1 - now / base
            return v if v > threshold else None
        return value

    w, c = tiers.warning.value, tiers.critical.value
    healthy = 0.6
    return AlertDef(
        name="LLMPrefixCacheHitRateDropped", service=service, role=role,
        summary=summary("LLMPrefixCacheHitRateDropped"),
        description=f"{where}: the prefix-cache hit rate is {{{{ $value | humanizePercentage }}}}"
                    f" below its {window} average; prompts are being recomputed (routing or "
                    "cache eviction changed?).",
        tiers=(TierDef("warning", f"{expr} > {_num(w)}", tiers.warning.for_, model(w)),
               TierDef("critical", f"{expr} > {_num(c)}", tiers.critical.for_, model(c))),
        reads={hit: healthy},
        # A drop a little past each level, so the baseline's slow slide keeps it there.
        levels={"warning": {hit: _const(healthy * (1 - (w + (c - w) * 0.6)))},
                "critical": {hit: _const(healthy * (1 - min(0.99, c + (1 - c) * 0.5)))}},
        history_min=min(window_min, 120),
        eval_step_min=5,
    )


def _xid_alert(settings: AlertSettings, service: ServiceSpec, role: Role) -> AlertDef:
    th = settings.thresholds
    xid = recorded_name(Signal.GPU_XID_ERRORS)
    sel = f"{xid}{{{pool_matchers(service, role)}}}"
    codes = tuple(sorted(set(th.xid_critical_codes)))
    critical_expr = " or ".join(f"{sel} == {code}" for code in codes)

    def any_code(frame: Frame, minute: int) -> float | None:
        v = frame.at(xid, role, minute)
        return v if v is not None and v > 0 else None

    def critical_code(frame: Frame, minute: int) -> float | None:
        v = frame.at(xid, role, minute)
        return v if v is not None and v in codes else None

    non_critical = next(c for c in (13, 31, 43, 45, 1, 2, 3) if c not in codes)
    return AlertDef(
        name="LLMGPUXidError", service=service, role=role,
        summary=summary("LLMGPUXidError"),
        description="{{ $labels.namespace }}/{{ $labels.pod }} GPU {{ $labels.gpu }} "
                    "reported XID {{ $value }}; critical codes mean the instance should be "
                    "drained and its node checked.",
        tiers=(TierDef("warning", f"{sel} > 0", th.xid_error.warning.for_, any_code),
               TierDef("critical", critical_expr, th.xid_error.critical.for_, critical_code)),
        reads={xid: 0},
        levels={"warning": {xid: _const(non_critical)}, "critical": {xid: _const(codes[0])}},
        series_labels={"pod": service.pools[role].example_pods(1)[0], "gpu": "0"},
    )


def _target_down_alert(service: ServiceSpec, role: Role, tiers: Any, where: str) -> AlertDef:
    up, count = recorded_name(Signal.TARGETS_UP), recorded_name(Signal.TARGETS)
    m = pool_matchers(service, role)
    expr = f"1 - {up}{{{m}}} / {count}{{{m}}}"

    def model(threshold: float) -> ValueFn:
        def value(frame: Frame, minute: int) -> float | None:
            u, n = frame.at(up, role, minute), frame.at(count, role, minute)
            if u is None or n is None or n == 0:
                return None
            v = 1 - u / n
            return v if v > threshold else None
        return value

    w, c = tiers.warning.value, tiers.critical.value
    targets = TARGETS
    return AlertDef(
        name="LLMPoolTargetDown", service=service, role=role,
        summary=summary("LLMPoolTargetDown"),
        description=f"{where}: {{{{ $value | humanizePercentage }}}} of the pool's targets are "
                    "down.",
        tiers=(TierDef("warning", f"{expr} > {_num(w)}", tiers.warning.for_, model(w)),
               TierDef("critical", f"{expr} > {_num(c)}", tiers.critical.for_, model(c))),
        reads={up: targets, count: targets},
        levels={"warning": {up: _const(targets * (1 - (w + c) / 2))},
                "critical": {up: _const(targets * (1 - (c + 1) / 2))}},
    )


SIGNAL_GROUPS: tuple[tuple[str, dict[Role, Signal]], ...] = (
    ("latency", {Role.PREFILL: Signal.TTFT_P95_S, Role.DECODE: Signal.ITL_P95_S}),
    ("queue", {Role.PREFILL: Signal.QUEUE_DEPTH, Role.DECODE: Signal.QUEUE_DEPTH}),
    ("kv", {Role.PREFILL: Signal.KV_CACHE_USAGE_MAX_RATIO,
            Role.DECODE: Signal.KV_CACHE_USAGE_MAX_RATIO}),
    ("tokens", {Role.PREFILL: Signal.PROMPT_TOKENS_PER_S,
                Role.DECODE: Signal.GENERATION_TOKENS_PER_S}),
    # The error ratio is empty without traffic; the request counter behind it is not.
    ("errors", {Role.PREFILL: Signal.REQUEST_RATE, Role.DECODE: Signal.REQUEST_RATE}),
    ("gpu", {Role.PREFILL: Signal.GPU_UTILIZATION_RATIO,
             Role.DECODE: Signal.GPU_UTILIZATION_RATIO}),
)
"""One watched recorded series per signal group and role: each group's absence alert fires
when the series is absent, i.e. when every selector behind it matches nothing. Each watched
series exists (possibly NaN) at zero traffic as long as its engine series exist."""


def absence_groups(service: ServiceSpec, role: Role) -> list[tuple[str, Signal]]:
    """(group, watched signal) for the groups this pool's engine provides."""
    have = engine_signals(service, role)
    out = []
    for group, by_role in SIGNAL_GROUPS:
        signal = by_role[role]
        if group == "errors" and Signal.ERROR_RATIO not in have:
            continue
        if signal in have:
            out.append((group, signal))
    return out


def _absent_alert(service: ServiceSpec, role: Role, tiers: Any, where: str, group: str,
                  signal: Signal) -> AlertDef:
    series = recorded_name(signal)
    expr = f"absent({series}{{{pool_matchers(service, role)}}})"

    def value(frame: Frame, minute: int) -> float | None:
        return 1.0 if frame.at(series, role, minute) is None else None

    labels = {"signal_group": group}
    return AlertDef(
        name="LLMPoolMetricsAbsent", service=service, role=role,
        summary=summary("LLMPoolMetricsAbsent"),
        description=f"{where}: no {group} data ({signal.value}, recorded as {series}): its "
                    "engine series are missing or the pool's selector matches nothing; the "
                    "alerts and dashboards that read it are blind (pdscale check SPEC "
                    "--prometheus URL says which matcher).",
        tiers=(TierDef("warning", expr, tiers.warning.for_, value, labels=labels),
               TierDef("critical", expr, tiers.critical.for_, value, labels=labels)),
        reads={series: None},
        levels={"warning": {series: _stale}, "critical": {series: _stale}},
        escalates_by_duration=True,
    )


def _slo_bucket_alert(service: ServiceSpec, role: Role, tiers: Any, where: str
                      ) -> AlertDef | None:
    """The pool's latency histogram is there but has no bucket at the SLO threshold (the
    engine runs with custom buckets the spec does not name): every SLO error ratio, the
    burn-rate alerts and their reaction read nothing, which must not pass for "no burn"."""
    kind = "ttft" if role is Role.PREFILL else "itl"
    if slo_bucket_expr(service, kind) is None:  # type: ignore[arg-type]
        return None
    signal = Signal.TTFT_P95_S if role is Role.PREFILL else Signal.ITL_P95_S
    if signal not in engine_signals(service, role):
        return None
    latency = recorded_name(signal)
    bucket = slo_bucket_record(kind)  # type: ignore[arg-type]
    m = pool_matchers(service, role)
    expr = f"absent({bucket}{{{m}}}) unless absent({latency}{{{m}}})"
    threshold = service.slo.threshold_s(kind)  # type: ignore[arg-type]

    def value(frame: Frame, minute: int) -> float | None:
        missing = frame.at(bucket, role, minute) is None
        return 1.0 if missing and frame.at(latency, role, minute) is not None else None

    labels = {"signal_group": "slo_bucket"}
    what = "time to first token" if kind == "ttft" else "inter-token latency"
    return AlertDef(
        name="LLMPoolMetricsAbsent", service=service, role=role,
        summary=summary("LLMPoolMetricsAbsent", "slo_bucket"),
        description=f"{where}: no slo_bucket data: the {what} histogram is there but has no "
                    f"bucket at the SLO's {threshold:g} s, so the SLO error ratios and the "
                    "burn-rate alerts read nothing. The engine runs with custom buckets: put "
                    "the threshold on one of them and name them in the service's "
                    "histogram_buckets, or add the threshold to the engine's buckets.",
        tiers=(TierDef("warning", expr, tiers.warning.for_, value, labels=labels),
               TierDef("critical", expr, tiers.critical.for_, value, labels=labels)),
        reads={bucket: None, latency: None},
        levels={"warning": {bucket: _stale}, "critical": {bucket: _stale}},
        escalates_by_duration=True,
    )


def _scaling_stuck_alert(service: ServiceSpec, role: Role, tiers: Any, cold_start_s: int,
                         where: str) -> AlertDef:
    desired = "pdscale_desired_replicas"
    ready = "pdscale_ready_replicas"
    m = pool_matchers(service, role)
    expr = f"{desired}{{{m}}} > {ready}{{{m}}}"

    def value(frame: Frame, minute: int) -> float | None:
        d, r = frame.at(desired, role, minute), frame.at(ready, role, minute)
        return d if d is not None and r is not None and d > r else None

    def for_of(multiple: float) -> int:
        return max(60, math.ceil(multiple * cold_start_s / 60) * 60)

    # A cold start of seconds rounds both tiers to the one-minute floor: critical still waits
    # a minute longer, so the tiers stay two (and promtool can tell them apart).
    wf = for_of(tiers.warning.value)
    cf = max(for_of(tiers.critical.value), wf + 60)
    return AlertDef(
        name="LLMPoolScalingStuck", service=service, role=role,
        summary=summary("LLMPoolScalingStuck"),
        description=f"{where}: {{{{ $value }}}} replicas desired but fewer are ready after "
                    f"{format_duration(wf)} (cold start {format_duration(cold_start_s)}); "
                    "check pending pods, quota and image pulls.",
        tiers=(TierDef("warning", expr, wf, value), TierDef("critical", expr, cf, value)),
        reads={desired: 2, ready: 2},
        levels={"warning": {desired: _const(3)}, "critical": {desired: _const(3)}},
        escalates_by_duration=True,
    )


def _control_plane_alert(service: ServiceSpec, role: Role, tiers: Any, where: str) -> AlertDef:
    last = "pdscale_last_decision_timestamp_seconds"
    stale = "pdscale_data_staleness_seconds"
    m = pool_matchers(service, role)

    def expr(threshold: float) -> str:
        t = _num(threshold)
        return (f"(time() - {last}{{{m}}} > {t}) or "
                f"(max without (signal) ({stale}{{{m}}}) > {t}) or absent({last}{{{m}}})")

    def model(threshold: float) -> ValueFn:
        def value(frame: Frame, minute: int) -> float | None:
            ts = frame.at(last, role, minute)
            if ts is None:
                return 1.0
            age = minute * 60 - ts
            if age > threshold:
                return age
            s = frame.at(stale, role, minute)
            return s if s is not None and s > threshold else None
        return value

    w, c = tiers.warning.value, tiers.critical.value
    return AlertDef(
        name="PDScaleControlPlaneDegraded", service=service, role=role,
        summary=summary("PDScaleControlPlaneDegraded"),
        description=f"{where}: the controller's last decision or input data is "
                    "{{ $value | humanizeDuration }} old; it holds replicas and never scales "
                    "down until data returns.",
        tiers=(TierDef("warning", expr(w), tiers.warning.for_, model(w)),
               TierDef("critical", expr(c), tiers.critical.for_, model(c))),
        reads={last: "time", stale: 5.0},
        levels={"warning": {stale: _const((w + c) / 2)}, "critical": {stale: _const(c * 1.5)}},
    )


_BURN_WINDOWS: tuple[tuple[Severity, str, str, str, int], ...] = (
    # severity, long window, short window, `for`; factors come from the spec in this order.
    ("critical", "1h", "5m", "2m", 0),
    ("critical", "6h", "30m", "15m", 1),
    ("warning", "1d", "2h", "1h", 2),
    ("warning", "3d", "6h", "3h", 3),
)


def _burn_rate_alerts(settings: AlertSettings, service: ServiceSpec, role: Role,
                      where: str) -> list[AlertDef]:
    kind: Literal["ttft", "itl"] = "ttft" if role is Role.PREFILL else "itl"
    if slo_error_ratio_expr(service, kind, "5m") is None:
        return []
    budget = 1 - service.slo.objective
    what = "time to first token" if kind == "ttft" else "inter-token latency"
    m = pool_matchers(service, role)
    factors = settings.thresholds.burn_rate_factors
    tiers = []
    for severity, long, short, for_, index in _BURN_WINDOWS:
        threshold = factors[index] * budget
        lr, sr = slo_error_ratio_record(kind, long), slo_error_ratio_record(kind, short)
        expr = f"{lr}{{{m}}} > {_num(threshold)} and {sr}{{{m}}} > {_num(threshold)}"

        def value(frame: Frame, minute: int, lr: str = lr, sr: str = sr,
                  threshold: float = threshold) -> float | None:
            a, b = frame.at(lr, role, minute), frame.at(sr, role, minute)
            return a if a is not None and b is not None and a > threshold and b > threshold \
                else None

        tiers.append(TierDef(
            severity, expr, parse_duration(for_), value, labels={"long": long, "short": short},
            description=f"{where}: {{{{ $value | humanizePercentage }}}} of requests missed the "
                        f"{what} SLO over {long} (and over {short}), {factors[index]:g} times "
                        f"the rate that spends the {format_duration(service.slo.window)} error "
                        f"budget of {budget * 100:g}%."))
    name = "LLMTimeToFirstTokenSLOBudgetBurn" if kind == "ttft" \
        else "LLMInterTokenLatencySLOBudgetBurn"
    records = [slo_error_ratio_record(kind, w) for w in SLO_WINDOWS]
    healthy = budget * 0.1
    warn_level = budget * (factors[2] + factors[1]) / 2
    crit_level = min(1.0, budget * factors[0] * 1.5)
    return [AlertDef(
        name=name, service=service, role=role,
        summary=summary(name),
        description=f"{where}: requests miss the {what} SLO fast enough to spend the error "
                    "budget early.",
        tiers=tuple(tiers),
        reads=dict.fromkeys(records, healthy),
        levels={"warning": {r: _const(warn_level) for r in records},
                "critical": {r: _const(crit_level) for r in records}},
        eval_step_min=5,
    )]


def alerting_groups(spec: Spec) -> list[Rule]:
    """One group per service, every alert in both tiers, as Prometheus rule dicts."""
    by_service: dict[str, list[Rule]] = {s.name: [] for s in spec.services}
    for d in alert_defs(spec):
        by_service[d.service.name].extend(render_alert(spec.alerts, d))
    return [{"name": f"pdscale.{name}.alerts", "rules": rules}
            for name, rules in by_service.items()]


def alert_labels(settings: AlertSettings, d: AlertDef, tier: TierDef) -> dict[str, str]:
    labels = dict(settings.extra_labels)
    labels.update(pool_labels(d.service, d.role))
    labels.update(tier.labels)
    labels["severity"] = tier.severity
    return labels


def alert_annotations(settings: AlertSettings, d: AlertDef,
                      tier: TierDef) -> dict[str, str]:
    return {
        "summary": d.summary,
        "description": tier.description or d.description,
        "runbook_url": settings.runbook_url(d.name),
    }


def render_alert(settings: AlertSettings, d: AlertDef) -> list[Rule]:
    rules = []
    for tier in d.tiers:
        rule: Rule = {"alert": d.name, "expr": tier.expr}
        if tier.for_s:
            rule["for"] = format_duration(tier.for_s)
        rule["labels"] = alert_labels(settings, d, tier)
        rule["annotations"] = alert_annotations(settings, d, tier)
        rules.append(rule)
    return rules
