"""The user's spec: one YAML file that drives the controller, the alerts and the dashboards.

Design: the YAML becomes frozen pydantic models at load (structure, types, ranges), then a
second pass of cross-field checks runs over the same raw data tolerantly, so that one run of
``pdscale validate`` reports every problem at once, each with the field path, what was
expected, what was given and how to fix it. Nothing the user wrote is silently rewritten:
derived values (a default pod regex from the scale target's name, tier thresholds given as
multiples of the SLO) are computed by properties, never stored back over the input.

Engine facts needed to validate a spec (the default latency histogram buckets of each engine)
live here rather than in ``telemetry`` because the spec is the bottom layer: everything else
imports it (shared/DESIGN.md, "Packages").
"""


from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from pdscale._cron import Cron, CronError
from pdscale._regex import regex_examples
from pdscale._spec_checks import (
    _cross_field_problems,
    _dedupe,
    _from_pydantic,
    _given,
    _semantic_problems,
)
from pdscale._spec_services import (
    DynamoHistogram,
    DynamoSettings,
    PlannedFloor,
    PoolSelector,
    PoolSpec,
    RatioBounds,
    ScaleTarget,
    ServiceSpec,
    SLOSpec,
)
from pdscale._spec_settings import (
    SIGNAL_SOURCES,
    SOURCE_SIGNALS,
    AlertSettings,
    AlertThresholds,
    ControllerSettings,
    DashboardSettings,
    DrainSettings,
    LeaderElectionSettings,
    OtlpSettings,
    PrometheusSettings,
    ReactionAction,
    ReactionRule,
    ReactionSettings,
    ScaleDownDrainSettings,
    ShortageCondition,
    SignalSource,
    SignalSources,
    Tier,
    TieredThreshold,
    WebhookAuth,
    WebhookSettings,
)
from pdscale._spec_types import (
    ENGINE_HISTOGRAM_BUCKETS,
    Engine,
    Role,
    SpecError,
    SpecProblem,
    _Model,
    cold_start_quantile,
    format_duration,
    parse_duration,
)

__all__ = [
    "ENGINE_HISTOGRAM_BUCKETS",
    "SIGNAL_SOURCES",
    "SOURCE_SIGNALS",
    "AlertSettings",
    "AlertThresholds",
    "ControllerSettings",
    "Cron",
    "CronError",
    "DashboardSettings",
    "DrainSettings",
    "DynamoHistogram",
    "DynamoSettings",
    "Engine",
    "LeaderElectionSettings",
    "OtlpSettings",
    "PlannedFloor",
    "PoolKey",
    "PoolSelector",
    "PoolSpec",
    "PrometheusSettings",
    "RatioBounds",
    "ReactionAction",
    "ReactionRule",
    "ReactionSettings",
    "Role",
    "SLOSpec",
    "ScaleDownDrainSettings",
    "ScaleTarget",
    "ServiceSpec",
    "ShortageCondition",
    "SignalSource",
    "SignalSources",
    "Spec",
    "SpecError",
    "SpecProblem",
    "Tier",
    "TieredThreshold",
    "WebhookAuth",
    "WebhookSettings",
    "cold_start_quantile",
    "format_duration",
    "load_spec",
    "parse_duration",
    "parse_spec",
    "regex_examples",
]


PoolKey = tuple[str, Role]
"""A pool: (service name, role). One name for it in the controller, telemetry and the
simulator."""


class Spec(_Model):
    version: Literal[1] = 1
    """Spec format version (1)."""
    services: tuple[ServiceSpec, ...] = Field(min_length=1)
    """The model services pdscale observes and scales, each a prefill and a decode pool."""
    gpu_budget: int | None = Field(default=None, ge=1, description="GPUs shared by all pools")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    """Alert thresholds per alert and tier, extra labels, the PrometheusRule and the
    Alertmanager webhook route."""
    dashboards: DashboardSettings = Field(default_factory=DashboardSettings)
    """Grafana dashboards: uids, titles, tags, refresh and the ConfigMap they ship in."""
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    """How `pdscale run` reads Prometheus, ticks, sizes, drains and elects a leader."""
    reactions: ReactionSettings = Field(default_factory=ReactionSettings)
    """The Alertmanager webhook: which critical alerts become which bounded actions, and the
    guards."""

    @model_validator(mode="after")
    def _budget_fits_minimums(self) -> Spec:
        if self.gpu_budget is None:
            return self
        floor = sum(p.min_replicas * p.gpus_per_replica for s in self.services
                    for p in s.pools.values())
        if floor > self.gpu_budget:
            raise ValueError(f"expected gpu_budget to cover every pool's min_replicas x "
                             f"gpus_per_replica ({floor} GPUs), got {self.gpu_budget}: raise "
                             "the budget or lower the minimums")
        return self

    def service(self, name: str) -> ServiceSpec:
        for svc in self.services:
            if svc.name == name:
                return svc
        known = ", ".join(s.name for s in self.services)
        raise KeyError(f"no service named {name!r} in the spec; the services are: {known}")


# --------------------------------------------------------------------------------------------
# Errors



MAX_SPEC_BYTES = 1 << 20
"""A spec is a few kilobytes; anything past this is a mistake (or an attack on the loader)."""
MAX_SPEC_VALUES = 100_000
"""Values a spec may expand to, YAML aliases expanded (a 500-byte alias bomb expands to
billions, which validation would walk for hours)."""


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise SpecError listing every problem."""
    source = str(path)
    try:
        p = Path(path)
        if p.is_dir():
            raise IsADirectoryError(21, "a directory, not a file")
        with p.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(
            source,
            [SpecProblem("(file)", "a readable YAML file", f"{exc.strerror or exc}",
                         "check the path and its permissions")],
        ) from exc
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecProblem(
            "(file)", f"a spec of at most {MAX_SPEC_BYTES} bytes", "a larger file",
            "check that the path names the spec, not a data file")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SpecError(source, [SpecProblem(
            f"line {line}", "UTF-8 text", f"the byte 0x{data[exc.start]:02x}",
            "save the file as UTF-8")]) from exc
    return _profiles_beside(parse_spec(text, source=source), Path(path).resolve().parent)


def _profiles_beside(spec: Spec, folder: Path) -> Spec:
    """A pool's profile given as a relative path is the file beside the spec when there is
    one there (a spec that names ``profile: mine.yaml`` works from any working directory);
    otherwise the path is left as written (relative to the working directory)."""
    services = []
    changed = False
    for service in spec.services:
        pools = {}
        for role, pool in service.pools.items():
            given = Path(pool.profile)
            if given.suffix in (".yaml", ".yml") and not given.is_absolute() \
                    and (folder / given).is_file():
                pool = pool.model_copy(update={"profile": str(folder / given)})
                changed = True
            pools[role] = pool
        services.append(service.model_copy(update={"pools": pools}))
    return spec.model_copy(update={"services": tuple(services)}) if changed else spec


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping (the second would silently
    win)."""


def _mapping_without_duplicates(loader: _SpecLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"the key {key!r} is given twice", key_node.start_mark)
    return loader.construct_mapping(node)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            _mapping_without_duplicates)


def _expands_past(value: Any, budget: int) -> bool:
    """True when ``value`` holds more than ``budget`` values once shared references (YAML
    aliases) are counted each time they are used. Stops as soon as it knows."""
    stack = [value]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_spec(text: str, *, source: str = "<spec>") -> Spec:
    try:
        raw = yaml.load(text, Loader=_SpecLoader)
    except RecursionError as exc:
        raise SpecError(source, [SpecProblem(
            "(document)", "a spec nested a few levels deep", "nesting too deep to read",
            "start from one of the files in examples/")]) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise SpecError(
            source,
            [SpecProblem(where, "valid YAML, each key once per mapping",
                         str(getattr(exc, "problem", exc)),
                         "keep one of the two" if "given twice" in str(exc)
                         else "fix the YAML syntax at that position")],
        ) from exc
    if not isinstance(raw, dict):
        raise SpecError(
            source,
            [SpecProblem("(document)", "a mapping with a 'services' list",
                         _given(raw), "start from one of the files in examples/")],
        )
    if _expands_past(raw, MAX_SPEC_VALUES):
        raise SpecError(source, [SpecProblem(
            "(document)", f"at most {MAX_SPEC_VALUES} values with YAML aliases expanded",
            "more (aliases that expand exponentially?)",
            "write the values out instead of nesting aliases")])
    problems: list[SpecProblem] = []
    spec: Spec | None = None
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_from_pydantic(exc))
    problems.extend(_cross_field_problems(raw))
    if spec is not None and not problems:
        problems.extend(_semantic_problems(spec))
    if problems:
        raise SpecError(source, _dedupe(problems))
    assert spec is not None
    return spec


# Kinds of the built-in API groups that have a /scale subresource; any other kind there cannot
