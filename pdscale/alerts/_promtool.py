"""promtool unit tests generated from the spec, so every generated rule is tested for real.

For each alert of each pool, two scenarios run on a one-minute timeline: a healthy baseline for
every pool of the service until minute H, then the alert's input pushed to a level between the
warning and critical thresholds ("warning") or past the critical one ("critical"). The expected
alerts at each checked minute come from simulating the rule engine on the alert's Python model
(value per minute, pending for ``for``, then firing), and the generator refuses a scenario
that would not show (a) silence just before ``for`` elapses, (b) warning alone at the warning
level, (c) both tiers at the critical level and (d) silence while healthy. promtool then runs
the same inputs through the real rules: a wrong model or a wrong rule fails the test.

Recording rules get a ``promql_expr_test`` per service, fed with engine-named raw series built
from the rule's own label matchers.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdscale.alerts._rules import (
    AlertDef,
    Frame,
    Severity,
    TierDef,
    alert_annotations,
    alert_defs,
    alert_labels,
    pool_labels,
)
from pdscale.spec import Role, ServiceSpec, Spec, regex_examples
from pdscale.telemetry import (
    SPAN_HISTOGRAM_SERIES,
    STAGE_SIGNALS,
    Signal,
    engine_signals,
    metric_names_in,
    pool_expr,
    recorded_name,
    series_refs,
    slo_bucket_record,
    slo_error_ratio_expr,
    slo_error_ratio_record,
    slo_source,
    span_signals,
)

__all__ = ["ScenarioError", "render_template", "unit_tests"]



class ScenarioError(ValueError):
    """A generated scenario cannot demonstrate the tiers (thresholds leave no room)."""


# --------------------------------------------------------------------------------------------
# Go template functions used in annotations (prometheus/template), for expected values.


def _go_g4(value: float) -> str:
    text = f"{value:.4g}"
    # Go writes exponents with at least two digits, as Python does.
    return text


def humanize(value: float) -> str:
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
        return _go_g4(value) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix, value = p, value * 1000
    return _go_g4(value) + prefix


def humanize_percentage(value: float) -> str:
    return _go_g4(value * 100) + "%"


def humanize_duration(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    if value == 0:
        return "0s"
    sign = "-" if value < 0 else ""
    v = abs(value)
    if v >= 1:
        secs = int(v)
        days, hours = secs // 86400, secs // 3600 % 24
        minutes, seconds = secs // 60 % 60, secs % 60
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if v >= 1:
            break
        prefix, v = p, v * 1000
    return f"{sign}{_go_g4(v)}{prefix}s"


_FUNCS = {"humanize": humanize, "humanizePercentage": humanize_percentage,
          "humanizeDuration": humanize_duration}
_ACTION = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value(?:\s*\|\s*(\w+))?)\s*\}\}")


def render_template(text: str, labels: Mapping[str, str], value: float) -> str:
    """Render the subset of Alertmanager/Prometheus templating our annotations use."""
    def sub(match: re.Match[str]) -> str:
        if match.group(2):
            return labels.get(match.group(2), "")
        func = match.group(3)
        if func is None:
            return _go_float(value)
        if func not in _FUNCS:
            raise ValueError(f"template function {func!r} is not modelled")
        return _FUNCS[func](value)
    return _ACTION.sub(sub, text)


def _go_float(value: float) -> str:
    """Go's %v for a float64 ('strconv.FormatFloat(v, 'g', -1, 64)' with Go's exponents)."""
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mant, exp = text.split("e")
        sign = exp[0] if exp[0] in "+-" else "+"
        digits = exp.lstrip("+-").rjust(2, "0")
        return f"{mant}e{sign}{digits}"
    return text


# --------------------------------------------------------------------------------------------
# Alert tests

SeriesKey = tuple[str, Role]


Baseline = tuple[dict[SeriesKey, Any], dict[SeriesKey, dict[str, str]]]
"""Healthy value and labels of every series a service's alerts read."""


def _baseline(defs: Sequence[AlertDef]) -> Baseline:
    healthy: dict[SeriesKey, Any] = {}
    labels: dict[SeriesKey, dict[str, str]] = {}
    for d in defs:
        for name, value in d.reads.items():
            key = (name, d.role)
            if key in healthy and value is not None and healthy[key] is not None \
                    and healthy[key] != value:
                raise AssertionError(
                    f"{d.name}: healthy value of {name} ({value}) differs from another "
                    f"alert's ({healthy[key]}); the baseline must agree")
            if healthy.get(key) is None:
                healthy[key] = value
            labels[key] = {**pool_labels(d.service, d.role), **d.series_labels}
    return healthy, labels


def _healthy_at(value: Any, minute: int) -> float:
    if value == "time":
        return float(minute * 60)
    return 1.0 if value is None else float(value)


def _timeline(healthy: Mapping[SeriesKey, Any], d: AlertDef, severity: Severity,
              end: int) -> dict[SeriesKey, list[float | None]]:
    """Per-minute values of the series this alert reads (the others stay at baseline)."""
    H = d.history_min
    series: dict[SeriesKey, list[float | None]] = {}
    for name in d.reads:
        key = (name, d.role)
        value = healthy[key]
        if value == "time":
            series[key] = [float(m * 60) for m in range(end + 1)]
        else:
            series[key] = [_healthy_at(value, 0)] * (end + 1)
    for name, perturb in d.levels[severity].items():
        key = (name, d.role)
        at_h = _healthy_at(healthy[key], H)
        values = series[key]
        for m in range(H, end + 1):
            v = perturb(m - H, at_h)
            values[m] = None if v is None else float(v)
    return series


def _baseline_values(value: Any, end: int) -> str:
    """The expanding notation of an unperturbed series over ``end + 1`` minutes."""
    if value == "time":
        return f"0+60x{end}"
    return f"{_num(_healthy_at(value, 0))}x{end}"


Sim = dict[int, tuple[bool, float | None]]


def _simulate(tier: TierDef, frame: Frame, end: int, step: int) -> Sim:
    """(firing, value) at each evaluation minute under Prometheus' pending -> firing rule."""
    out: Sim = {}
    active_since: int | None = None
    for m in range(0, end + 1, step):
        value = tier.value(frame, m)
        if value is None:
            active_since = None
            out[m] = (False, None)
            continue
        if active_since is None:
            active_since = m
        out[m] = ((m - active_since) * 60 >= tier.for_s, float(value))
    return out


def _fmt_values(values: Sequence[float | None]) -> str:
    tokens: list[str] = []
    for value, run in itertools.groupby(values, key=lambda v: "_" if v is None else
                                        "stale" if math.isnan(v) else _num(v)):
        n = sum(1 for _ in run)
        if value in ("_", "stale"):
            tokens.extend([value] * n)
        else:
            tokens.append(value if n == 1 else f"{value}x{n - 1}")
    return " ".join(tokens)


def _num(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _expected(spec: Spec, d: AlertDef, sims: Sequence[tuple[TierDef, Sim]],
              minute: int) -> list[dict[str, Any]]:
    out = []
    # Annotation templates see the expression's labels (the input series'), not the rule's.
    series_labels = {**pool_labels(d.service, d.role), **d.series_labels}
    for tier, sim in sims:
        firing, value = sim[minute]
        if not firing:
            continue
        assert value is not None
        labels = {**alert_labels(spec.alerts, d, tier), **d.series_labels}
        annotations = alert_annotations(spec.alerts, d, tier)
        out.append({
            "exp_labels": dict(sorted(labels.items())),
            "exp_annotations": {
                k: render_template(v, series_labels, value)
                for k, v in sorted(annotations.items())
            },
        })
    out.sort(key=lambda a: sorted(a["exp_labels"].items()))
    return out


MAX_FOR_MIN = 7 * 1440
"""The longest `for` a generated scenario replays minute by minute (a week)."""


def _scenario_test(spec: Spec, d: AlertDef, baseline: Baseline,
                   severity: Severity) -> dict[str, Any]:
    H = d.history_min
    step = d.eval_step_min
    healthy, labels = baseline
    longest = max(t.for_s for t in d.tiers) // 60
    if longest > MAX_FOR_MIN:
        raise ScenarioError(
            f"{d.name} {d.service.name}/{d.role.value}: a `for` of {longest} minutes is longer "
            f"than a promtool test can replay (at most {MAX_FOR_MIN // 1440} days); shorten "
            "the threshold's `for` (or the pool's cold_start, for LLMPoolScalingStuck)")
    end = H + longest + 3 * step + 10
    series = _timeline(healthy, d, severity, end)
    frame = Frame(series)
    sims = [(t, _simulate(t, frame, end, step)) for t in d.tiers]

    def fires(sev: Severity) -> list[int]:
        return [next((m for m, (f, _) in sorted(sim.items()) if f), -1)
                for t, sim in sims if t.severity == sev]

    warn_first = [m for m in fires("warning") if m >= 0]
    crit_first = [m for m in fires("critical") if m >= 0]
    group = d.tiers[0].labels.get("signal_group")
    name = f"{d.name}[{group}]" if group else d.name
    where = f"{name} {d.service.name}/{d.role.value} {severity} scenario"
    if any(f for _, sim in sims for m, (f, _) in sim.items() if m < H):
        raise ScenarioError(f"{where}: an alert fires on the healthy baseline")
    if not warn_first:
        raise ScenarioError(f"{where}: the warning tier never fires")
    if severity == "warning" and crit_first:
        raise ScenarioError(f"{where}: the critical tier fires at the warning level; raise "
                            "the critical threshold above the warning one")
    if severity == "critical" and not crit_first:
        raise ScenarioError(f"{where}: the critical tier never fires")
    if d.escalates_by_duration and not min(warn_first) < min(crit_first):
        raise ScenarioError(f"{where}: the warning tier must fire before the critical one; "
                            "give the critical tier the longer `for`")

    checks = {H - step}  # (d) healthy
    for m in warn_first + crit_first:
        checks.add(m)  # (b), (c)
        if m - step >= H:
            checks.add(m - step)  # (a) just before `for` elapses
    checks.add(max(warn_first + crit_first))  # every tier that fires, together
    alert_tests = [{
        "eval_time": f"{m}m",
        "alertname": d.name,
        "exp_alerts": _expected(spec, d, sims, m),
    } for m in sorted(checks)]
    inputs = []
    for key in sorted(healthy, key=lambda k: (k[0], k[1].value)):
        values = _fmt_values(series[key]) if key in series else _baseline_values(healthy[key], end)
        inputs.append({"series": _series_text(key[0], labels[key]), "values": values})
    return {
        "name": where,
        "interval": "1m",
        "input_series": inputs,
        "alert_rule_test": alert_tests,
    }


# --------------------------------------------------------------------------------------------
# Recording-rule tests

_MATCHER = re.compile(r'(\w+)(=~|!=|!~|=)"((?:[^"\\]|\\.)*)"')


def _example_labels(expr: str, metric: str, variant: int = 0) -> dict[str, str] | None:
    """Labels that satisfy the matchers of ``metric`` in ``expr``, or None if unsure;
    ``variant`` picks another example for regex matchers (a second pod of the pool)."""
    # Matcher values are quoted and may hold braces (a pod regex such as '[a-z0-9]{5}').
    found = re.search(re.escape(metric) + r'\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}', expr)
    if found is None:
        return None
    labels: dict[str, str] = {}
    for name, op, raw in _MATCHER.findall(found.group(1)):
        value = raw.replace('\\"', '"').replace("\\\\", "\\")
        if name == "le":
            continue
        if op == "=":
            labels[name] = value
        elif op == "=~":
            samples = regex_examples(value, variant + 1)
            if len(samples) <= variant:
                return None
            labels[name] = samples[variant]
        else:
            return None
    return labels


def _le(bound: float) -> str:
    """``le`` as Python clients (vLLM, SGLang) write it: 0.5, 1.0, 2.5."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _recording_test(spec: Spec, service: ServiceSpec) -> dict[str, Any] | None:
    inputs: list[dict[str, str]] = []
    expects: list[dict[str, Any]] = []
    minutes = 10

    def expect(signal_record: str, role: Role, value: float) -> None:
        labels = pool_labels(service, role)
        expects.append({
            "expr": _series_text(signal_record, {"pdscale_service": service.name,
                                                 "pdscale_pool": role.value}),
            "eval_time": f"{minutes}m",
            "exp_samples": [{"labels": _series_text(signal_record, labels), "value": value}],
        })

    for role in Role:
        have = engine_signals(service, role)
        # Gauges summed over two pods: 3 + 4 waiting, in the required series only: the
        # optional ones (a newer engine's breakdown, a P/D-only queue) are absent, and the
        # recorded queue must not be empty because of it.
        refs = series_refs(Signal.QUEUE_DEPTH, service, role) if Signal.QUEUE_DEPTH in have \
            else []
        required = [r for r in refs if not r.optional]
        if required:
            metric = required[0].metric
            for variant, v in ((0, 3), (1, 4)):
                labels = _example_labels(required[0].selector(), metric, variant)
                if labels is None:
                    return None
                if "pod" not in labels:
                    labels["instance"] = f"i{variant}"
                inputs.append({"series": _series_text(metric, labels), "values": f"{v}x{minutes}"})
            expect(recorded_name(Signal.QUEUE_DEPTH), role, 7)
        # Scrape targets: one up, one down.
        expr = pool_expr(Signal.TARGETS_UP, service, role)
        for variant, v in ((0, 1), (1, 0)):
            labels = _example_labels(expr, "up", variant)
            if labels is None:
                return None
            inputs.append({"series": _series_text("up", labels), "values": f"{v}x{minutes}"})
        expect(recorded_name(Signal.TARGETS_UP), role, 1)
        expect(recorded_name(Signal.TARGETS), role, 2)
        # GPU memory: 72,000 MiB used of 80,000 (where the service declares GPU metrics).
        if Signal.GPU_MEMORY_USED_MAX_RATIO not in have:
            continue
        expr = pool_expr(Signal.GPU_MEMORY_USED_MAX_RATIO, service, role)
        base = _example_labels(expr, "DCGM_FI_DEV_FB_USED")
        if base is None:
            return None
        gpu = {**base, "gpu": "0"}
        for metric, v in (("DCGM_FI_DEV_FB_USED", 72000), ("DCGM_FI_DEV_FB_FREE", 8000),
                          ("DCGM_FI_DEV_FB_RESERVED", 0)):
            inputs.append({"series": _series_text(metric, gpu), "values": f"{v}x{minutes}"})
        expect(recorded_name(Signal.GPU_MEMORY_USED_MAX_RATIO), role, 0.9)

    # SLO histograms: per minute, 90 requests within the SLO bucket, 10 in the next one; the
    # engine's histogram, or pdscale's re-exported span histogram where the spec reads the
    # latency from OTLP ("both": the span side, which answers first).
    for kind, role in (("ttft", Role.PREFILL), ("itl", Role.DECODE)):
        source = slo_source(spec, kind)  # type: ignore[arg-type]
        error_expr = slo_error_ratio_expr(service, kind, "5m",  # type: ignore[arg-type]
                                          source=source)
        buckets = service.buckets(kind)  # type: ignore[arg-type]
        if error_expr is None or buckets is None:
            continue
        threshold = service.slo.threshold_s(kind)  # type: ignore[arg-type]
        spans = source != "prometheus"
        bucket_metric = f"{SPAN_HISTOGRAM_SERIES[kind]}_bucket" if spans else \
            next(n for n in sorted(metric_names_in(error_expr)) if n.endswith("_bucket"))
        base = _example_labels(error_expr, bucket_metric)
        if base is None:
            return None
        if spans:  # the re-export carries the pool's labels (honor_labels keeps them)
            base = {**pool_labels(service, role), **base}
            buckets = tuple(sorted({*buckets, threshold}))
        for bound in (*buckets, math.inf):
            per_min = 0 if bound < threshold and not math.isclose(bound, threshold) else \
                90 if math.isclose(bound, threshold) else 100
            inputs.append({"series": _series_text(bucket_metric, {**base, "le": _le(bound)}),
                           "values": f"0+{per_min}x{minutes}"})
        inputs.append({"series": _series_text(bucket_metric[:-len("_bucket")] + "_count", base),
                       "values": f"0+100x{minutes}"})
        expect(slo_error_ratio_record(kind, "5m"), role, 1 - (90 / 60) / (100 / 60))  # type: ignore[arg-type]
        expect(slo_bucket_record(kind), role, 1)  # type: ignore[arg-type]
    for role in Role:
        _stage_inputs(spec, service, role, inputs, expect)
    return {"name": f"recording rules of {service.name}", "interval": "1m",
            "input_series": inputs, "promql_expr_test": expects}


def _stage_inputs(spec: Spec, service: ServiceSpec, role: Role, inputs: list[dict[str, str]],
                  expect: Callable[[str, Role, float], None]) -> None:
    """TTFT by stage from the re-exported span histograms: per minute, 100 requests, a
    different share of them (50, 80, 90) at or below the TTFT SLO per stage and the rest in the
    next bucket, so each stage's p95 lies at its own point of that bucket
    (histogram_quantile's linear interpolation) and a rule reading another stage's series
    shows."""
    threshold = service.slo.ttft_p95_s
    bounds = sorted({*(service.buckets("ttft") or ()), threshold})
    i = bounds.index(threshold)
    if i + 1 >= len(bounds):
        return
    low, high = bounds[i], bounds[i + 1]
    within = {"queue": 50, "prefill": 80, "transfer": 90}
    for signal in sorted(span_signals(spec, service, role) & set(STAGE_SIGNALS),
                         key=lambda s: s.value):
        stage = STAGE_SIGNALS[signal]
        metric = SPAN_HISTOGRAM_SERIES[stage]
        labels = pool_labels(service, role)
        for bound in (*bounds, math.inf):
            per_min = 0 if bound < threshold and not math.isclose(bound, threshold) else \
                within[stage] if math.isclose(bound, threshold) else 100
            inputs.append({"series": _series_text(f"{metric}_bucket",
                                                  {**labels, "le": _le(bound)}),
                           "values": f"0+{per_min}x10"})
        # histogram_quantile's arithmetic on the per-second rates, step by step, so the
        # expectation is the float Prometheus computes.
        below, total = within[stage] / 60, 100 / 60
        expect(recorded_name(signal), role,
               low + (high - low) * ((0.95 * total - below) / (total - below)))


def unit_tests(spec: Spec, rule_file_for: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """promtool test files by name (the service's, plus ``.step5m`` for the tests of alerts
    with hour-long windows, evaluated every 5 minutes to keep them fast); ``rule_file_for``
    maps a service to its rule file path relative to the test file."""
    defs = alert_defs(spec)
    out: dict[str, dict[str, Any]] = {}
    for service in spec.services:
        mine = [d for d in defs if d.service.name == service.name]
        baseline = _baseline(mine)
        by_step: dict[int, list[dict[str, Any]]] = {1: []}
        recording = _recording_test(spec, service)
        if recording is not None:
            by_step[1].append(recording)
        for d in mine:
            scenarios = ("critical",) if d.escalates_by_duration else ("warning", "critical")
            for severity in scenarios:
                by_step.setdefault(d.eval_step_min, []).append(
                    _scenario_test(spec, d, baseline, severity))  # type: ignore[arg-type]
        for step, tests in sorted(by_step.items()):
            if not tests:
                continue
            key = service.name if step == 1 else f"{service.name}.step{step}m"
            out[key] = {
                "rule_files": [rule_file_for[service.name]],
                "evaluation_interval": f"{step}m",
                "tests": tests,
            }
    return out

