"""The spec's checks beyond its types: problems from pydantic's errors reworded, the
cross-field pass over the raw data (run alongside the typed pass so one validation reports
everything) and the semantic pass over the typed spec (run when both are clean)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from pdscale import _engines
from pdscale._spec_settings import AlertThresholds, TieredThreshold
from pdscale._spec_types import ENGINE_HISTOGRAM_BUCKETS, Engine, Role, SpecProblem

if TYPE_CHECKING:
    from pdscale.spec import Spec

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

_SCALABLE_BUILTIN = {"v1": {"ReplicationController"},
                     "apps/v1": {"Deployment", "StatefulSet", "ReplicaSet"}}
_BUILTIN_GROUPS = ("v1", "apps/", "batch/", "autoscaling/", "policy/", "networking.k8s.io/",
                   "rbac.authorization.k8s.io/", "storage.k8s.io/")


def _semantic_problems(spec: Spec) -> list[SpecProblem]:
    """Checks on the typed spec for what later stages would reject: a scale target without
    /scale, a pod regex that selects no pod name (or another pool's pods), a model name that
    cannot be quoted in the generated tests."""
    problems: list[SpecProblem] = []
    pools = [(i, svc, role, pool) for i, svc in enumerate(spec.services)
             for role, pool in svc.pools.items()]
    for i, _svc, role, pool in pools:
        where = f"services[{i}].pools.{role.value}"
        t = pool.target
        group = t.api_version if "/" in t.api_version or t.api_version == "v1" else ""
        if group.startswith(_BUILTIN_GROUPS) and t.kind not in _SCALABLE_BUILTIN.get(group, set()):
            scalable = ", ".join(f"{k} ({g})" for g, ks in _SCALABLE_BUILTIN.items()
                                 for k in sorted(ks))
            problems.append(SpecProblem(
                f"{where}.target.kind", f"a kind with a /scale subresource: {scalable}, or a "
                "custom resource that has one (LeaderWorkerSet, Dynamo's adapter)",
                f"{t.kind} ({t.api_version})", "point the pool at the object that owns its "
                "pods, e.g. kind: Deployment"))
        if not pool.example_pods(1):
            problems.append(SpecProblem(
                f"{where}.selector.pod_regex", "a regular expression that matches pod names "
                "(RE2: no look-around or back-references)", _given(pool.pod_regex),
                "write the regex as Prometheus would run it, e.g. 'llama-p-.*'"))
    for i, svc, role, pool in pools:
        mine = re.compile(pool.pod_regex)
        for j, other, other_role, other_pool in pools:
            if (j, other_role) == (i, role) or other.namespace != svc.namespace:
                continue
            # This pool's regex is the one at fault when it selects the other pool's pods.
            shared = next((pod for pod in other_pool.example_pods(6) if mine.fullmatch(pod)),
                          None)
            if shared is not None:
                problems.append(SpecProblem(
                    f"services[{i}].pools.{role.value}.selector.pod_regex",
                    f"a regex for this pool's pods only; services[{j}].pools."
                    f"{other_role.value}'s pods are in the same namespace",
                    f"{pool.pod_regex!r}, which also matches their pod {shared!r}",
                    "narrow it, e.g. to the workload's name and a '-'"))
    for i, svc in enumerate(spec.services):
        bad = sorted({ch for ch in svc.model_name if ch in '"\\' or not ch.isprintable()})
        if bad:
            problems.append(SpecProblem(
                f"services[{i}].model_name", "the model name as the engine labels its series "
                "(no quotes, backslashes or control characters)", _given(svc.model_name),
                "use the served model name, e.g. 'meta-llama/Llama-3.1-8B-Instruct'"))
    return problems


def _dedupe(problems: Sequence[SpecProblem]) -> list[SpecProblem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        key = (p.path, p.expected)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _given(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


REMOVED_FIELDS = {
    "controller.sizing.model": "remove it; the queueing model is the only sizing",
    "controller.burst_window": "remove it; the queueing model keeps no burst envelope "
                               "(controller.stabilisation is how long a need holds a pool)",
    "controller.drain_time": "remove it; the queueing model drains a backlog within the "
                             "pool's lead (its cold-start p90 plus a tick) or its SLO, "
                             "whichever is longer",
}
"""Fields removed with the rule-based sizing, and how a spec that still sets one is fixed:
named as such, not as a misspelling."""

_FIXES = {
    "missing": "add the field",
    "extra_forbidden": "remove the field or check its spelling against examples/",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
    "greater_than": "raise the value",
    "greater_than_equal": "raise the value",
    "less_than": "lower the value",
    "less_than_equal": "lower the value",
    "too_short": "add at least one entry",
}


class _Said(str):
    """What a validator's own message says was given (shown as is, not repr'd)."""

    def __repr__(self) -> str:
        return str(self)


def _from_pydantic(exc: ValidationError) -> list[SpecProblem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        kind = err["type"]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if msg.startswith("expected "):  # our own validators' messages
            msg = msg[len("expected "):]
            if ", got " in msg and kind == "value_error":
                msg, _, got = msg.partition(", got ")
                err = {**err, "input": _Said(got)}
        given = "nothing" if kind == "missing" else _given(err.get("input"))
        fix = _FIXES.get(kind, "correct the value")
        if kind == "extra_forbidden":
            msg = "no such field"
            removed = REMOVED_FIELDS.get(_path(loc))
            if removed is not None:
                msg = "no such field (removed with the rule-based sizing)"
                fix = removed
        problems.append(SpecProblem(_path(loc), msg[0].lower() + msg[1:], given, fix))
    return problems


def _cross_field_problems(raw: Mapping[str, Any]) -> list[SpecProblem]:
    """Checks across fields, run over the raw data so they report alongside type errors.

    Each check looks only at values that are well-formed; malformed ones are already reported
    by the structural pass.
    """
    problems: list[SpecProblem] = _threshold_problems(raw)
    services = raw.get("services")
    if not isinstance(services, list):
        return problems
    seen_names: dict[str, int] = {}
    seen_targets: dict[tuple[str, str, str], str] = {}
    for i, svc in enumerate(services):
        if not isinstance(svc, dict):
            continue
        where = f"services[{i}]"
        name = svc.get("name")
        if isinstance(name, str):
            if not _NAME_RE.match(name):
                problems.append(SpecProblem(
                    f"{where}.name", "a DNS-1123 label (lower-case letters, digits, '-')",
                    _given(name), "rename the service, e.g. 'llama-chat'"))
            if name in seen_names:
                problems.append(SpecProblem(
                    f"{where}.name", "a service name used once",
                    f"{name!r}, already used by services[{seen_names[name]}]",
                    "give each service its own name"))
            else:
                seen_names[name] = i
        namespace = svc.get("namespace")
        if isinstance(namespace, str) and not _NAME_RE.match(namespace):
            problems.append(SpecProblem(
                f"{where}.namespace", "a Kubernetes namespace name", _given(namespace),
                "use the namespace the pools run in"))
        engine = _engine(svc.get("engine"))
        problems.extend(_slo_bucket_problems(svc, engine, where))
        problems.extend(_burn_rate_problems(raw, svc, where))
        problems.extend(_scrape_label_problems(svc, engine, where))
        problems.extend(_dynamo_problems(svc, engine, where))
        pools = svc.get("pools")
        if isinstance(pools, dict):
            for role in Role:
                if role.value not in pools:
                    problems.append(SpecProblem(
                        f"{where}.pools.{role.value}", "a pool (P/D serving has both roles)",
                        "nothing", f"add a '{role.value}' pool"))
            for role_name, pool in pools.items():
                if isinstance(pool, dict):
                    problems.extend(_pool_problems(
                        pool, f"{where}.pools.{role_name}", namespace, seen_targets))
    return problems


def _engine(value: object) -> Engine | None:
    try:
        return Engine(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _slo_bucket_problems(svc: Mapping[str, Any], engine: Engine | None,
                         where: str) -> list[SpecProblem]:
    slo = svc.get("slo")
    if not isinstance(slo, dict) or engine is None:
        return []
    raw_overrides = svc.get("histogram_buckets")
    overrides: dict[str, Any] = raw_overrides if isinstance(raw_overrides, dict) else {}
    problems = []
    for kind, field in (("ttft", "ttft_p95_s"), ("itl", "itl_p95_s")):
        threshold = slo.get(field)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            continue
        override = overrides.get(kind)
        buckets: tuple[float, ...] | None
        setting = _engines.ENGINE_BUCKET_SETTING[engine.value].get(kind)
        version = _engines.ENGINE_VERSIONS[engine.value]
        if isinstance(override, list) and all(isinstance(b, int | float) for b in override):
            buckets = tuple(float(b) for b in override)
            source = f"{where}.histogram_buckets.{kind}"
        elif engine is Engine.DYNAMO:
            buckets, source = _dynamo_buckets_of(svc, kind)
        else:
            buckets = ENGINE_HISTOGRAM_BUCKETS[engine].get(kind)
            source = f"{engine.value} {version}'s default {kind.upper()} histogram"
        if buckets is None:
            continue
        if any(math.isclose(threshold, b, rel_tol=1e-9) for b in buckets):
            continue
        below, above = _engines.nearest_boundaries(float(threshold), buckets)
        near = ", ".join(_fmt(b) for b in (below, above) if b is not None)
        either = " or ".join(_fmt(b) for b in (below, above) if b is not None)
        if engine is Engine.DYNAMO and not isinstance(override, list):
            env = _engines.DYNAMO_BUCKET_ENV[kind]
            suggestion = _engines.suggest_dynamo_setting(kind, float(threshold))
            make = "" if suggestion is None else (
                f", or start the frontend with {env}_MIN={_fmt(suggestion[0])} "
                f"{env}_MAX={_fmt(suggestion[1])} {env}_COUNT={suggestion[2]} (which makes "
                f"{_fmt(float(threshold))} a boundary) and declare them as "
                f"{where}.dynamo.histograms.{kind}: {{min: {_fmt(suggestion[0])}, "
                f"max: {_fmt(suggestion[1])}, count: {suggestion[2]}}}")
            fix = f"use {either}{make}"
        else:
            how = f" ({setting})" if setting else ""
            fix = (f"use {either}, or start the engine with buckets that include it{how} and "
                   f"list them in {where}.histogram_buckets.{kind}")
        problems.append(SpecProblem(
            f"{where}.slo.{field}",
            f"a bucket boundary of {source}, so the SLO can be read exactly (a threshold "
            "between boundaries reads a bucket that does not exist: the SLO alerts never fire)",
            f"{_fmt(float(threshold))} (nearest boundaries: {near})", fix))
    return problems


def _dynamo_buckets_of(svc: Mapping[str, Any], kind: str) -> tuple[tuple[float, ...] | None,
                                                                     str]:
    """Dynamo's buckets from the spec's DYN_METRICS_* settings, or its defaults."""
    env = _engines.DYNAMO_BUCKET_ENV[kind]
    dynamo = svc.get("dynamo")
    histograms = dynamo.get("histograms") if isinstance(dynamo, dict) else None
    setting = histograms.get(kind) if isinstance(histograms, dict) else None
    version = _engines.ENGINE_VERSIONS["dynamo"]
    if isinstance(setting, dict):
        values = (setting.get("min"), setting.get("max"), setting.get("count"))
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return None, ""
        try:
            buckets = _engines.dynamo_buckets(float(values[0]), float(values[1]),  # type: ignore[arg-type]
                                              int(values[2]))  # type: ignore[arg-type]
        except ValueError:
            return None, ""
        return buckets, (f"Dynamo {version}'s {kind.upper()} histogram with {env}_MIN="
                         f"{_fmt(float(values[0]))} {env}_MAX={_fmt(float(values[1]))} "  # type: ignore[arg-type]
                         f"{env}_COUNT={values[2]}")
    lo, hi, count = _engines.DYNAMO_BUCKET_DEFAULTS[kind]
    return _engines.dynamo_buckets(lo, hi, count), (
        f"Dynamo {version}'s default {kind.upper()} histogram ({env}_* unset: MIN={_fmt(lo)} "
        f"MAX={_fmt(hi)} COUNT={count})")


def _scrape_label_problems(svc: Mapping[str, Any], engine: Engine | None,
                           where: str) -> list[SpecProblem]:
    """A pool selector on a label that neither the engine nor the declared scrape provides
    can never match: every signal of the pool would be empty, and nothing would say so."""
    if engine is None:
        return []
    raw_scrape = svc.get("scrape_labels", _engines.POD_MONITOR_LABELS)
    if not isinstance(raw_scrape, list | tuple) or \
            not all(isinstance(x, str) for x in raw_scrape):
        return []
    scrape = set(raw_scrape)
    declared = "scrape_labels" in svc
    said = (f"your declared scrape_labels ({', '.join(sorted(scrape)) or 'none'})" if declared
            else "a PodMonitor's default target labels (" +
            ", ".join(_engines.POD_MONITOR_LABELS) + ")")
    problems = []
    for label in ("namespace", "pod"):
        if label not in scrape:
            problems.append(SpecProblem(
                f"{where}.scrape_labels", f"'{label}' among the scrape labels: no engine "
                f"emits it, and every pool signal selects by it",
                said, f"relabel the pods' {label} into a '{label}' label in your scrape "
                f"config and list it in scrape_labels"))
    engine_labels = set(_engines.ENGINE_SERIES_LABELS.get(engine.value, frozenset()))
    if engine is Engine.DYNAMO:
        dynamo = svc.get("dynamo")
        backend = dynamo.get("backend", "vllm") if isinstance(dynamo, dict) else "vllm"
        engine_labels |= _engines.ENGINE_SERIES_LABELS["dynamo_worker"] | \
            _engines.ENGINE_SERIES_LABELS.get(str(backend), frozenset())
    pools = svc.get("pools")
    for role_name, pool in (pools.items() if isinstance(pools, dict) else ()):
        selector = pool.get("selector") if isinstance(pool, dict) else None
        labels = selector.get("match_labels") if isinstance(selector, dict) else None
        if not isinstance(labels, dict):
            continue
        for key in labels:
            if not isinstance(key, str) or key in scrape or key in engine_labels:
                continue
            problems.append(SpecProblem(
                f"{where}.pools.{role_name}.selector.match_labels.{key}",
                f"a label that {engine.value} "
                f"{_engines.ENGINE_VERSIONS[engine.value]} or your scrape provides (the "
                "selector matches nothing otherwise)",
                f"'{key}', which the engine does not emit and which is not in {said}",
                f"if your scrape config relabels '{key}' from the pod, add it to "
                f"{where}.scrape_labels; otherwise remove the matcher"))
    return problems


def _dynamo_problems(svc: Mapping[str, Any], engine: Engine | None,
                     where: str) -> list[SpecProblem]:
    has = svc.get("dynamo") is not None
    if engine is Engine.DYNAMO and not has:
        return [SpecProblem(f"{where}.dynamo", "a 'dynamo' section for engine 'dynamo'",
                            "nothing", "add dynamo: {namespace: <the workers' dynamo_namespace>, "
                            "backend: vllm}")]
    if engine is not None and engine is not Engine.DYNAMO and has:
        return [SpecProblem(f"{where}.dynamo", "no 'dynamo' section unless engine is 'dynamo'",
                            "a 'dynamo' section", "remove it or set engine: dynamo")]
    return []


def _pool_problems(pool: Mapping[str, Any], where: str, namespace: object,
                   seen_targets: dict[tuple[str, str, str], str]) -> list[SpecProblem]:
    problems = []
    lo, hi = pool.get("min_replicas", 1), pool.get("max_replicas")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        problems.append(SpecProblem(
            f"{where}.min_replicas", f"at most max_replicas ({hi})", str(lo),
            "lower min_replicas or raise max_replicas"))
    selector = pool.get("selector")
    if isinstance(selector, dict):
        regex = selector.get("pod_regex")
        if isinstance(regex, str):
            try:
                re.compile(regex)
            except re.error as exc:
                problems.append(SpecProblem(
                    f"{where}.selector.pod_regex", "a valid regular expression",
                    f"{regex!r} ({exc})", "fix the expression (Prometheus uses RE2 syntax)"))
        labels = selector.get("match_labels")
        if isinstance(labels, dict):
            for key in labels:
                if not isinstance(key, str) or not _LABEL_NAME_RE.match(key):
                    problems.append(SpecProblem(
                        f"{where}.selector.match_labels", "Prometheus label names",
                        _given(key), "use letters, digits and '_' only"))
    target = pool.get("target")
    if isinstance(target, dict) and isinstance(target.get("name"), str):
        key = (str(namespace), str(target.get("kind", "Deployment")), target["name"])
        if key in seen_targets:
            problems.append(SpecProblem(
                f"{where}.target", "a scale target used by one pool only",
                f"{key[1]}/{key[2]} in {key[0]}, already used by {seen_targets[key]}",
                "point each pool at its own object"))
        else:
            seen_targets[key] = where
    return problems


def _burn_rate_problems(raw: Mapping[str, Any], svc: Mapping[str, Any], where: str
                        ) -> list[SpecProblem]:
    """Every burn-rate tier must be able to fire: its threshold, the factor times the error
    budget (1 - objective), is an error ratio, which never exceeds 1. With the default factors
    an objective under about 0.93 would silently drop the fast-burn page and its reaction."""
    slo = svc.get("slo")
    objective = slo.get("objective", 0.99) if isinstance(slo, dict) else 0.99
    if not isinstance(objective, int | float) or not 0 < objective < 1:
        return []  # reported by the structural pass
    alerts = raw.get("alerts")
    thresholds = alerts.get("thresholds") if isinstance(alerts, dict) else None
    factors = thresholds.get("burn_rate_factors") if isinstance(thresholds, dict) else None
    if factors is None:
        factors = AlertThresholds().burn_rate_factors
    if not isinstance(factors, list | tuple) or \
            not all(isinstance(f, int | float) and f > 0 for f in factors):
        return []
    worst = max(factors)
    if worst * (1 - objective) < 1:
        return []
    lowest = 1 - 1 / worst
    return [SpecProblem(
        f"{where}.slo.objective",
        f"an objective whose error budget every burn-rate tier can exceed: above "
        f"{_fmt(round(lowest, 4))} with the largest burn-rate factor {_fmt(worst)} (a tier "
        f"fires on an error ratio over factor x (1 - objective), and a ratio never exceeds 1)",
        _fmt(objective),
        f"raise the objective above {_fmt(round(lowest, 4))}, or lower "
        f"alerts.thresholds.burn_rate_factors so that each is under "
        f"{_fmt(round(1 / (1 - objective), 4))}")]


_DURATION_ONLY_THRESHOLDS = frozenset({"metrics_absent_for", "xid_error"})


def _threshold_problems(raw: Mapping[str, Any]) -> list[SpecProblem]:
    alerts = raw.get("alerts")
    thresholds = alerts.get("thresholds") if isinstance(alerts, dict) else None
    if not isinstance(thresholds, dict):
        return []
    problems = []
    defaults = AlertThresholds()
    for name, tiers in thresholds.items():
        default = getattr(defaults, name, None)
        if not isinstance(tiers, dict) or not isinstance(default, TieredThreshold):
            continue
        values = {}
        for tier in ("warning", "critical"):
            given = tiers.get(tier, {})
            value = given.get("value") if isinstance(given, dict) else None
            values[tier] = value if isinstance(value, int | float) else \
                getattr(default, tier).value
        if name in _DURATION_ONLY_THRESHOLDS:
            continue
        if values["critical"] <= values["warning"]:
            problems.append(SpecProblem(
                f"alerts.thresholds.{name}.critical.value",
                f"more than the warning value ({_fmt(values['warning'])}): higher is worse",
                _fmt(values["critical"]), "swap the two values or raise the critical one"))
    return problems


def _fmt(value: float) -> str:
    return f"{value:g}"
