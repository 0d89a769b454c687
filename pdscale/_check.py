"""``pdscale check``: are the series the alerts, dashboards and controller read really there?

Design. A selector that matches nothing yields an empty result, and an empty result fires no
alert and moves no replica: the failure is silent by construction. This check asks a live
Prometheus, for every service, pool and signal, about each raw series behind the signal (the
catalog's :func:`telemetry.series_refs`): does it exist, how many pods report it, how old is its
newest sample, and does the SLO's bucket exist. Where a selector matches nothing it finds the
matcher that removed the series by dropping the matchers one at a time, reads the values that
label really has, and says what to change: the spec (namespace, pod regex, model name, match
labels), the scrape config (labels only the scrape provides), or the engine's settings.

The core (:func:`check_spec`) takes a query function, so it runs against any PromQL source;
the command line passes the telemetry reader (the only place Prometheus is reached over HTTP).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pdscale import _engines
from pdscale.spec import SOURCE_SIGNALS, Engine, Role, ServiceSpec, Spec
from pdscale.telemetry import (
    DISPERSION_WINDOW_S,
    SeriesRef,
    Signal,
    dispersion_window_samples,
    engine_signals,
    series_refs,
    slo_bucket_ref,
)

__all__ = ["CheckRow", "Query", "SourceRow", "check_spec", "render_json", "render_sources",
           "render_table", "source_rows", "sources_ready"]

Query = Callable[[str], list[tuple[dict[str, str], float]]]
"""An instant query at the check's time: (labels, value) per row."""

Status = Literal["ok", "stale", "missing", "absent-optional", "no-bucket", "coarse"]

CONTROLLER_NEEDS: dict[Role, tuple[Signal, ...]] = {
    # The policy's demand and latency per role (controller._model DEMAND_SIGNAL and
    # LATENCY_SIGNAL), its queue, and the prefix-cache discount of prefill demand.
    Role.PREFILL: (Signal.PROMPT_TOKENS_PER_S, Signal.TTFT_P95_S, Signal.QUEUE_DEPTH,
                   Signal.PREFIX_CACHE_HIT_RATIO),
    Role.DECODE: (Signal.GENERATION_TOKENS_PER_S, Signal.ITL_P95_S, Signal.QUEUE_DEPTH),
}
"""What the controller reads for each pool; missing any of them exits 1."""


@dataclass(frozen=True)
class CheckRow:
    service: str
    pool: str
    signal: str
    needed_by: str
    """'controller' (and alerts, dashboards) or 'alerts, dashboards'."""
    series: str
    status: Status
    series_count: int
    pods: int
    age_s: float | None
    problem: str | None = None
    fix: str | None = None


def _count(query: Query, selector: str) -> int:
    rows = query(f"count({selector})")
    return int(rows[0][1]) if rows else 0


def _values(query: Query, metric: str, matchers: Sequence[tuple[str, str, str]],
            label: str) -> list[str]:
    ref = SeriesRef(metric, tuple(matchers), "eng", False)
    rows = query(f"count by ({label}) ({ref.selector()})")
    return sorted({labels.get(label, "") for labels, _ in rows})


def _spec_field(service: ServiceSpec, index: int, role: Role, label: str) -> str | None:
    where = f"services[{index}]"
    pool = service.pools[role]
    fields = {
        "namespace": f"{where}.namespace",
        "pod": f"{where}.pools.{role.value}.selector.pod_regex",
        "model_name": f"{where}.model_name", "model": f"{where}.model_name",
        "dynamo_namespace": f"{where}.dynamo.namespace",
        "dynamo_component": f"{where}.pools.{role.value}.selector.dynamo_component",
    }
    if label in pool.selector.match_labels:
        return f"{where}.pools.{role.value}.selector.match_labels.{label}"
    return fields.get(label)


_SOURCE_FIX = {
    "eng": "check that the pool's pods are scraped (PodMonitor or scrape config) and that the "
           "engine exports it (SGLang needs --enable-metrics)",
    "wrk": "check that the Dynamo workers' system port (DYN_SYSTEM_PORT) is scraped",
    "fe": "check that the Dynamo frontend's /metrics is scraped, in the service's namespace",
    "gpu": "deploy the DCGM exporter with its Kubernetes pod mapping "
           "(namespace and pod labels of the GPU's pod)",
    "tgt": "check the scrape config: no target of the pool is known to Prometheus",
}


def _diagnose(query: Query, service: ServiceSpec, index: int, role: Role,
              ref: SeriesRef) -> tuple[str, str]:
    """(problem, fix) for a selector that matches nothing."""
    version = _engines.ENGINE_VERSIONS.get(service.engine.value, "?")
    if _count(query, ref.metric) == 0:
        return (f"no {ref.metric} series at all in Prometheus",
                _SOURCE_FIX[ref.source] + (f"; pdscale's catalog was checked against "
                                           f"{service.engine.value} {version}"))
    for i, (label, op, value) in enumerate(ref.matchers):
        others = [m for j, m in enumerate(ref.matchers) if j != i]
        if _count(query, SeriesRef(ref.metric, tuple(others), ref.source, False).selector()) \
                == 0:
            continue
        seen = _values(query, ref.metric, others, label)
        expected = f'{label}{op}"{value}"'
        if seen == [""]:
            problem = f"the matcher {expected} removed every series: they carry no '{label}'"
            if label in service.scrape_labels:
                fix = (f"'{label}' only comes from the scrape: add it to the {ref.metric} "
                       f"target's labels (a PodMonitor adds namespace and pod; with "
                       f"static_configs set it in labels or relabel it), or remove it from "
                       f"services[{index}].scrape_labels if your scrape cannot add it")
            else:
                fix = (f"{service.engine.value} {version} should emit '{label}' on "
                       f"{ref.metric}; check the engine version, or a metric_relabel_configs "
                       f"that drops it")
            return problem, fix
        shown = ", ".join(f'"{v}"' for v in seen[:6]) + (" ..." if len(seen) > 6 else "")
        problem = f"the matcher {expected} removed every series: '{label}' is {shown}"
        field = _spec_field(service, index, role, label)
        if field is not None:
            return problem, f"set {field} to match one of them"
        return problem, (f"{service.engine.value} writes {label} as {shown}, not as pdscale's "
                         f"catalog ({service.engine.value} {version}) expects: check the "
                         "engine version, or report it")
    sample = query(f"topk(1, {ref.metric})")
    labels = sample[0][0] if sample else {}
    return (f"no single matcher explains it; {ref.metric} exists with labels such as "
            f"{json.dumps(labels, sort_keys=True)}",
            "compare those labels with the spec's selector for the pool")


def _probe(query: Query, ref: SeriesRef, at_s: float) -> tuple[int, int, float | None]:
    rows = query(f"timestamp({ref.selector()})")
    if not rows:
        return 0, 0, None
    pods = {labels["pod"] for labels, _ in rows if "pod" in labels}
    return len(rows), len(pods), max(0.0, at_s - max(v for _, v in rows))


FINE_SIGNALS = (Signal.PROMPT_TOKENS_DISPERSION,)
"""Signals recorded from windows of :data:`telemetry.DISPERSION_WINDOW_S`: their series exist
at any scrape interval, but read empty unless it is at most half that window."""


def fine_samples_expr(selector: str) -> str:
    """PromQL: the samples the median dispersion window of the last minute held, for the series
    with the fewest (the recording rule's own condition, over a minute)."""
    return f"min({dispersion_window_samples(selector, '1m')})"


def _coarse(query: Query, ref: SeriesRef) -> str | None:
    """Why ``ref``'s scrape is too coarse for the dispersion's windows, or None."""
    rows = query(fine_samples_expr(ref.selector()))
    samples = rows[0][1] if rows else 0.0
    if samples >= 2:
        return None
    return (f"the median {DISPERSION_WINDOW_S:g}s window of the last minute held {samples:g} "
            f"sample(s), and this signal needs two (a scrape every "
            f"{DISPERSION_WINDOW_S / 2:g}s or less): it reads empty, and the prefill tail model "
            "(sizing for clumped arrivals) is off")


def _bucket_row(query: Query, service: ServiceSpec, index: int,
                kind: Literal["ttft", "itl"], at_s: float, stale_after_s: float) -> CheckRow:
    role = Role.PREFILL if kind == "ttft" else Role.DECODE
    ref = slo_bucket_ref(service, kind)
    assert ref is not None
    threshold = service.slo.threshold_s(kind)
    count, pods, age = _probe(query, ref, at_s)
    base = dict(service=service.name, pool=role.value, signal=f"slo_{kind}_bucket",
                needed_by="alerts, dashboards", series=ref.selector(), series_count=count,
                pods=pods, age_s=age)
    if count:
        stale = age is not None and age > stale_after_s
        return CheckRow(**base, status="stale" if stale else "ok")  # type: ignore[arg-type]
    others = tuple(m for m in ref.matchers if m[0] != "le")
    les = [v for v in _values(query, ref.metric, others, "le") if v]
    if not les:
        problem, fix = _diagnose(query, service, index, role,
                                 SeriesRef(ref.metric, others, ref.source, False))
        return CheckRow(**base, status="missing", problem=problem, fix=fix)  # type: ignore[arg-type]
    bounds = tuple(sorted(float(v) for v in les if v != "+Inf"))
    below, above = _engines.nearest_boundaries(threshold, bounds)
    near = ", ".join(f"{b:g}" for b in (below, above) if b is not None)
    problem = (f"the SLO threshold {threshold:g}s is not a bucket boundary of what the engine "
               f"exposes ({', '.join(f'{b:g}' for b in bounds)}): the burn-rate alerts read a "
               "bucket that does not exist and can never fire")
    if service.engine is Engine.DYNAMO:
        setting = _engines.suggest_dynamo_setting(kind, threshold)
        env = _engines.DYNAMO_BUCKET_ENV[kind]
        how = "" if setting is None else (
            f", or start the frontend with {env}_MIN={setting[0]:g} {env}_MAX={setting[1]:g} "
            f"{env}_COUNT={setting[2]} and declare them in services[{index}].dynamo."
            f"histograms.{kind}")
        fix = f"set services[{index}].slo to {near}{how}"
    else:
        setting_name = _engines.ENGINE_BUCKET_SETTING.get(service.engine.value, {}).get(kind)
        fix = (f"set services[{index}].slo to {near}, or start the engine with buckets that "
               f"include {threshold:g}" + (f" ({setting_name})" if setting_name else "") +
               f" and list them in services[{index}].histogram_buckets.{kind}")
    return CheckRow(**base, status="no-bucket", problem=problem, fix=fix)  # type: ignore[arg-type]


def check_spec(spec: Spec, query: Query, *, at_s: float, stale_after_s: float = 120.0,
               services: Sequence[str] | None = None) -> list[CheckRow]:
    """One row per raw series behind every signal of every pool, plus the SLO buckets."""
    rows: list[CheckRow] = []
    for index, service in enumerate(spec.services):
        if services is not None and service.name not in services:
            continue
        for role in Role:
            needs = CONTROLLER_NEEDS[role]
            signals = sorted(engine_signals(service, role), key=lambda s: (s not in needs,
                                                                           s.value))
            for signal in signals:
                needed_by = "controller" if signal in needs else \
                    "controller (tail model)" if signal in FINE_SIGNALS else "alerts, dashboards"
                if _from_otlp_only(spec, signal):
                    # The controller reads it from spans, and the generated rules read
                    # pdscale's re-exported span histograms: the engine's series are spare.
                    needed_by = "nothing (read from OTLP)"
                for ref in series_refs(signal, service, role):
                    count, pods, age = _probe(query, ref, at_s)
                    base = dict(service=service.name, pool=role.value, signal=signal.value,
                                needed_by=needed_by, series=ref.selector(),
                                series_count=count, pods=pods, age_s=age)
                    stale = count > 0 and age is not None and age > stale_after_s
                    coarse = _coarse(query, ref) if count and not stale and \
                        signal in FINE_SIGNALS else None
                    if coarse is not None:
                        rows.append(CheckRow(**base, status="coarse", problem=coarse,  # type: ignore[arg-type]
                                             fix=f"scrape the pool's pods every "
                                                 f"{DISPERSION_WINDOW_S / 2:g}s or less "
                                                 "(the PodMonitor's interval), or size "
                                                 "without the tail model"))
                    elif count:
                        rows.append(CheckRow(**base,  # type: ignore[arg-type]
                                             status="stale" if stale else "ok",
                                             problem=f"newest sample {age:.0f}s old" if stale
                                             else None))
                    elif ref.optional:
                        rows.append(CheckRow(**base, status="absent-optional"))  # type: ignore[arg-type]
                    else:
                        problem, fix = _diagnose(query, service, index, role, ref)
                        rows.append(CheckRow(**base, status="missing",  # type: ignore[arg-type]
                                             problem=problem, fix=fix))
        for kind in ("ttft", "itl"):
            if slo_bucket_ref(service, kind) is not None:
                rows.append(_bucket_row(query, service, index, kind,
                                        at_s, stale_after_s))
    return rows


def _from_otlp_only(spec: Spec, signal: Signal) -> bool:
    return spec.controller.otlp_receiving and signal.value in SOURCE_SIGNALS and \
        spec.controller.signal_sources.source(signal.value) == "otlp"


# --------------------------------------------------------------------------------------------
# Which source answered: a running controller's view (pdscale check --controller URL)


DECIDED_ON: dict[Role, tuple[Signal, ...]] = {
    Role.PREFILL: (Signal.PROMPT_TOKENS_PER_S, Signal.TTFT_P95_S),
    Role.DECODE: (Signal.GENERATION_TOKENS_PER_S, Signal.ITL_P95_S),
}
"""What a pool is decided on, whichever source gives it: its demand (without it the pool is
held as degraded) and its latency (the correction learns from it). The other signals the
controller reads sharpen a decision; a source without them (spans give no queue gauge) is not
a fault."""


@dataclass(frozen=True)
class SourceRow:
    service: str
    pool: str
    signal: str
    needed_by: str
    configured: str
    """The spec's source for the signal (prometheus, otlp, both; health: Prometheus' scrape
    health)."""
    answered: str | None
    """The source whose value the controller used at its last read; None: none had one."""
    age_s: float | None
    """Age of the data behind that value."""
    status: Literal["ok", "stale", "missing"]


def source_rows(spec: Spec, status: dict[str, Any], *, stale_after_s: float,
                services: Sequence[str] | None = None) -> list[SourceRow]:
    """Per pool and signal the controller reads, from its ``/v1/status``: which source
    answered at its last read and how fresh the data was."""
    answered_by = status.get("signal_sources") or {}
    ages = status.get("signal_ages_s") or {}
    sources = spec.controller.signal_sources
    rows: list[SourceRow] = []
    for service in spec.services:
        if services is not None and service.name not in services:
            continue
        for role in Role:
            key = f"{service.name}/{role.value}"
            needs = DECIDED_ON[role]
            read = answered_by.get(key, {})
            names = sorted(set(read) | {s.value for s in needs},
                           key=lambda n: (Signal(n) not in needs, n))
            for name in names:
                source = read.get(name)
                age = ages.get(key, {}).get(name)
                state: Literal["ok", "stale", "missing"] = "missing" if source is None else \
                    "stale" if age is not None and age > stale_after_s else "ok"
                rows.append(SourceRow(
                    service=service.name, pool=role.value, signal=name,
                    needed_by="controller" if Signal(name) in needs else "controller (other)",
                    configured=sources.source(name) if name in SOURCE_SIGNALS else "health",
                    answered=source, age_s=age, status=state))
    return rows


def sources_ready(rows: Sequence[SourceRow]) -> bool:
    """Every signal the controller needs was answered by a source, with fresh data."""
    return not any(r.needed_by == "controller" and r.status != "ok" for r in rows)


def render_sources(rows: Sequence[SourceRow], *, controller: str) -> str:
    head = ("SERVICE", "POOL", "SIGNAL", "NEEDED BY", "SOURCE (SPEC)", "ANSWERED BY", "AGE",
            "STATUS")
    body = [(r.service, r.pool, r.signal, r.needed_by, r.configured, r.answered or "-",
             _age(r.age_s), r.status) for r in rows]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    lines = [f"signal sources at the controller {controller} (its last read):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
              for line in (head, *body)]
    bad = [r for r in rows if r.needed_by == "controller" and r.status != "ok"]
    for r in bad:
        where = {"prometheus": "Prometheus (pdscale check SPEC --prometheus URL says which "
                               "series)",
                 "otlp": "the OTLP receiver (/v1/status: otlp.dropped and last_drop say what "
                         "was refused; check the engines' exporter endpoint and resource "
                         "attributes)",
                 "both": "either source", "health": "Prometheus"}.get(r.configured,
                                                                     r.configured)
        lines.append(f"- {r.service}/{r.pool} {r.signal}: "
                     f"{'no source had a value' if r.status == 'missing' else 'stale data'}"
                     f"; it is read from {where}")
    lines.append("every signal the controller needs has a fresh source" if not bad else
                 f"{len(bad)} signal(s) the controller needs without a fresh source (it holds "
                 "those pools, never scaling down)")
    return "\n".join(lines)


def controller_ready(rows: Sequence[CheckRow]) -> bool:
    """Everything the controller needs is present and fresh."""
    return not any(r.needed_by == "controller" and r.status in ("missing", "stale")
                   for r in rows)


def _age(age: float | None) -> str:
    if age is None or math.isnan(age):
        return "-"
    return f"{age:.0f}s"


def render_table(rows: Sequence[CheckRow]) -> str:
    head = ("SERVICE", "POOL", "SIGNAL", "NEEDED BY", "STATUS", "PODS", "AGE", "SERIES")
    body = [(r.service, r.pool, r.signal, r.needed_by, r.status,
             str(r.pods) if r.series_count else "-", _age(r.age_s),
             r.series if len(r.series) <= 90 else r.series[:87] + "...") for r in rows]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) +
             "  " + line[-1] for line in (head, *body)]
    problems = [r for r in rows if r.problem]
    if problems:
        lines += ["", "problems:"]
        for r in problems:
            lines.append(f"- {r.service}/{r.pool} {r.signal} ({r.needed_by}): {r.series}")
            lines.append(f"    {r.problem}")
            if r.fix:
                lines.append(f"    fix: {r.fix}")
    verdict = "everything the controller needs is present" if controller_ready(rows) else \
        "the controller is missing data it needs (it holds those pools, never scaling down)"
    missing = sum(r.status in ("missing", "no-bucket", "stale", "coarse") for r in rows)
    lines += ["", f"{len(rows)} series checked, {missing} with a problem; {verdict}"]
    return "\n".join(lines)


def render_json(rows: Sequence[CheckRow], *, url: str, at_s: float) -> str:
    return json.dumps({"prometheus": url, "time": at_s,
                       "controller_ready": controller_ready(rows),
                       "rows": [asdict(r) for r in rows]}, indent=2, sort_keys=True)
