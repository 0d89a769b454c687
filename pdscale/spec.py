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

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pdscale import _engines
from pdscale._regex import regex_examples

__all__ = [
    "ENGINE_HISTOGRAM_BUCKETS",
    "AlertSettings",
    "AlertThresholds",
    "ControllerSettings",
    "DashboardSettings",
    "DrainSettings",
    "DynamoHistogram",
    "DynamoSettings",
    "Engine",
    "LeaderElectionSettings",
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


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    DYNAMO = "dynamo"
    TGI = "tgi"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


PoolKey = tuple[str, Role]
"""A pool: (service name, role). One name for it in the controller, telemetry and the
simulator."""


# Default latency histogram buckets (seconds) as the engines' released versions export them;
# the tables and the versions live in pdscale._engines (shared/REFERENCE.md §1). Engines can
# be started with other buckets, which is why a service may state them in its spec. Dynamo's
# are computed from its DYN_METRICS_* settings (ServiceSpec.buckets); TGI's are not known, so
# no boundary check is made unless the spec states them.
ENGINE_HISTOGRAM_BUCKETS: dict[Engine, dict[str, tuple[float, ...]]] = {
    engine: dict(_engines.ENGINE_HISTOGRAM_BUCKETS[engine.value]) for engine in Engine}

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# RE2 metacharacters; re.escape would also escape '-', which reads badly in PromQL.
_RE_META = re.compile(r"([.^$*+?()\[\]{}|\\])")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def parse_duration(value: object) -> int:
    """Parse a Prometheus-style duration ("90s", "5m", "1h30m") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '5m' or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"expected a non-negative duration, got {value!r}")
        return round(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as '5m' or a number of seconds, got {value!r}")
    text = value.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _DURATION_UNITS_S[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(
            f"expected a duration such as '30s', '5m' or '1h30m' (units ms, s, m, h, d, w), "
            f"got {value!r}"
        )
    return round(total)


def format_duration(seconds: int | float) -> str:
    """Seconds as the shortest exact Prometheus duration: 600 -> '10m', 5400 -> '1h30m'."""
    remaining = round(seconds)
    if remaining == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


Duration = Annotated[int, BeforeValidator(parse_duration)]

_NORMAL_Z = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}


def cold_start_quantile(median_s: float, spread: float, q: float) -> float:
    """The ``q`` quantile (0.5, 0.9 or 0.99) of a log-normal cold start with this median and
    sigma ``spread``."""
    return median_s * math.exp(spread * _NORMAL_Z[q])


def _accepts_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    return any(_accepts_bool(a) for a in getattr(annotation, "__args__", ()))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's true/false would otherwise pass as 1/0 for a number (min_replicas: true).
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _accepts_bool(field.annotation):
                raise ValueError("expected a number or text as the field says, not true/false")
        return value


class SLOSpec(_Model):
    """Latency SLOs of a service; each threshold must sit on a histogram bucket boundary."""

    ttft_p95_s: float = Field(gt=0, description="Time to first token, 95th percentile, seconds")
    itl_p95_s: float = Field(gt=0, description="Inter-token latency, 95th percentile, seconds")
    objective: float = Field(
        default=0.99, gt=0, lt=1, description="Share of requests that must meet both thresholds"
    )
    window: Duration = Field(default=30 * 86400, description="SLO compliance window")


class PoolSelector(_Model):
    """How to find a pool's series in Prometheus.

    Kubernetes scrapes label every series with ``namespace`` and ``pod``; the pod regex (by
    default ``<scale target name>-.*``) selects the pool's engine and DCGM GPU series alike.
    ``match_labels`` adds exact label matchers for engine series (for labels that relabelling
    copies from the pod, such as ``role``). ``dynamo_component`` selects Dynamo workers.
    """

    pod_regex: str | None = Field(default=None, description="Regex on the pod label")
    match_labels: dict[str, str] = Field(default_factory=dict)
    dynamo_component: str | None = None


class ScaleTarget(_Model):
    """The Kubernetes object whose ``/scale`` subresource sets the pool's replicas."""

    api_version: str = "apps/v1"
    kind: str = "Deployment"
    name: str


class PoolSpec(_Model):
    selector: PoolSelector = Field(default_factory=PoolSelector)
    target: ScaleTarget
    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(ge=1)
    gpus_per_replica: int = Field(default=1, ge=1)
    cold_start: Duration = Field(default=60, description="Estimated median time from a "
                                 "scale-up to a ready replica")
    cold_start_spread: float = Field(
        default=0.2, ge=0, le=1.5, description="How much cold starts vary around "
        "cold_start: the sigma of a log-normal (0.2: one in ten takes over 1.29x the median). "
        "The controller plans with the p90 until it has timed its own cold starts; the "
        "simulator draws every replica's cold start from it")
    profile: str = Field(default="h100-80gb-llama-3.1-8b", min_length=1)

    @property
    def cold_start_p90_s(self) -> float:
        """The cold start one in ten exceeds (the lead planned with before any is timed)."""
        return cold_start_quantile(float(self.cold_start), self.cold_start_spread, 0.9)

    @property
    def pod_regex(self) -> str:
        if self.selector.pod_regex is not None:
            return self.selector.pod_regex
        return _RE_META.sub(r"\\\1", self.target.name) + "-.*"

    def example_pods(self, n: int = 2) -> list[str]:
        """Up to ``n`` distinct pod names the pool's pod regex selects (for generated tests
        and overlap checks); validation guarantees at least one."""
        return regex_examples(self.pod_regex, n)


class DynamoHistogram(_Model):
    """One frontend histogram's DYN_METRICS_<TTFT|ITL>_{MIN,MAX,COUNT} as set in the
    deployment: Dynamo's buckets are log-spaced from these, two significant digits, first
    boundary 0."""

    min: float = Field(gt=0, description="DYN_METRICS_<KIND>_MIN, seconds")
    max: float = Field(gt=0, description="DYN_METRICS_<KIND>_MAX, seconds")
    count: int = Field(ge=2, le=200, description="DYN_METRICS_<KIND>_COUNT")

    @model_validator(mode="after")
    def _ordered(self) -> DynamoHistogram:
        if self.min >= self.max:
            raise ValueError(f"expected min < max, got min {self.min:g} >= max {self.max:g}")
        return self


class DynamoSettings(_Model):
    """Where a Dynamo deployment's series are: its namespace and its worker engine.

    Only the workers' own ``dynamo_component_*`` series carry ``dynamo_namespace``; the
    frontend's carry only ``model`` (Dynamo 1.6.1), so frontend signals are selected by the
    service's ``namespace`` (from the scrape) and ``model``."""

    namespace: str = Field(min_length=1, description="Value of the dynamo_namespace label on "
                           "the workers' dynamo_component_* series")
    backend: Literal["vllm", "sglang"] = "vllm"
    histograms: dict[Literal["ttft", "itl"], DynamoHistogram] = Field(
        default_factory=dict, description="The frontend's DYN_METRICS_TTFT_* / DYN_METRICS_ITL_* "
        "settings where the deployment sets them (default: Dynamo's, TTFT MIN 0.001 MAX 480 "
        "COUNT 18, ITL MIN 0.001 MAX 80 COUNT 20)")


class RatioBounds(_Model):
    """Bounds on prefill replicas per decode replica. Enforced by raising the short pool,
    never by removing replicas, so a bound cannot cost SLO."""

    min: float | None = Field(default=None, gt=0, description="Lowest prefill:decode ratio")
    max: float | None = Field(default=None, gt=0, description="Highest prefill:decode ratio")

    @model_validator(mode="after")
    def _ordered(self) -> RatioBounds:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"expected min <= max, got min {self.min:g} > max {self.max:g}")
        return self


class ServiceSpec(_Model):
    name: str
    namespace: str
    engine: Engine
    model_name: str = Field(min_length=1)
    slo: SLOSpec
    priority: float = Field(default=1.0, gt=0, description="Weight in the shared GPU budget")
    dynamo: DynamoSettings | None = None
    pd_ratio: RatioBounds | None = Field(
        default=None, description="Optional bounds on prefill replicas per decode replica")
    histogram_buckets: dict[Literal["ttft", "itl"], tuple[float, ...]] = Field(
        default_factory=dict,
        description="Override the engine's latency buckets when the engine was started with "
        "custom ones",
    )
    scrape_labels: tuple[str, ...] = Field(
        default=_engines.POD_MONITOR_LABELS,
        description="Labels your scrape configuration puts on every series of the pools' pods "
        "(default: a PodMonitor's). The engines emit no namespace or pod label: pool "
        "selectors may use only these and the engine's own labels; add any label your "
        "relabelling copies from the pod (e.g. a role label used in match_labels)")
    pools: dict[Role, PoolSpec]

    def buckets(self, kind: Literal["ttft", "itl"]) -> tuple[float, ...] | None:
        """The latency histogram buckets for this service, or None where not known."""
        if kind in self.histogram_buckets:
            return self.histogram_buckets[kind]
        if self.engine is Engine.DYNAMO:
            return self.frontend_buckets(kind)
        return ENGINE_HISTOGRAM_BUCKETS[self.engine].get(kind)

    def frontend_buckets(self, kind: Literal["ttft", "itl"]) -> tuple[float, ...]:
        """The buckets Dynamo's frontend exports: from its DYN_METRICS_* settings (declared in
        ``dynamo.histograms``), else Dynamo's defaults."""
        setting = self.dynamo.histograms.get(kind) if self.dynamo is not None else None
        lo, hi, count = (setting.min, setting.max, setting.count) if setting is not None \
            else _engines.DYNAMO_BUCKET_DEFAULTS[kind]
        return _engines.dynamo_buckets(lo, hi, count)

    @property
    def prefill(self) -> PoolSpec:
        return self.pools[Role.PREFILL]

    @property
    def decode(self) -> PoolSpec:
        return self.pools[Role.DECODE]


class Tier(_Model):
    value: float
    for_: Duration = Field(alias="for")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TieredThreshold(_Model):
    """A warning and a critical level of one alert; higher values are worse."""

    warning: Tier
    critical: Tier


def _tiers(warning: float, warning_for: str, critical: float, critical_for: str) -> Any:
    return Field(
        default_factory=lambda: TieredThreshold(
            warning=Tier(value=warning, for_=parse_duration(warning_for)),
            critical=Tier(value=critical, for_=parse_duration(critical_for)),
        )
    )


class AlertThresholds(_Model):
    """Per-alert tiers. Units are in each field's docstring; every threshold rises with
    severity, so critical.value must be more than warning.value."""

    ttft_high: TieredThreshold = _tiers(1.0, "10m", 2.0, "3m")
    """TTFT p95 as a multiple of the SLO threshold."""
    itl_high: TieredThreshold = _tiers(1.0, "10m", 2.0, "3m")
    """ITL p95 as a multiple of the SLO threshold."""
    queue_backlog: TieredThreshold = _tiers(5, "10m", 20, "3m")
    """Waiting requests per ready replica (llm-d saturates at 5)."""
    queue_growing: TieredThreshold = _tiers(0.05, "15m", 0.5, "5m")
    """Growth of the waiting queue, requests per second, over 10 minutes."""
    prefix_cache_hit_drop: TieredThreshold = _tiers(0.3, "15m", 0.6, "5m")
    """Relative drop of the prefix-cache hit rate below its trailing baseline (0-1)."""
    kv_cache_usage: TieredThreshold = _tiers(0.9, "10m", 0.97, "3m")
    """KV-cache usage of the fullest replica (0-1)."""
    preemptions: TieredThreshold = _tiers(0.1, "10m", 1.0, "5m")
    """Preemptions per second across the pool."""
    error_ratio: TieredThreshold = _tiers(0.01, "10m", 0.05, "5m")
    """Share of requests that fail."""
    kv_transfer_failures: TieredThreshold = _tiers(0, "10m", 0.1, "5m")
    """P/D KV transfers (or hand-offs) failing per second across the pool: any sustained
    failure warns; vLLM NIXL failed transfers / expired requests, SGLang transfer / bootstrap
    failures."""
    gpu_memory: TieredThreshold = _tiers(0.97, "15m", 0.99, "5m")
    """Framebuffer memory used on the fullest GPU (0-1); engines preallocate about 0.9."""
    gpu_temperature: TieredThreshold = _tiers(85, "10m", 92, "5m")
    """Hottest GPU of the pool, degrees Celsius."""
    target_down: TieredThreshold = _tiers(0.25, "10m", 0.5, "5m")
    """Share of the pool's scrape targets that are down."""
    scaling_stuck: TieredThreshold = _tiers(3, "0s", 6, "0s")
    """Desired above ready for longer than this multiple of the pool's cold start (the `for`
    of each tier is computed from it; the durations given here are ignored)."""
    control_plane_stale: TieredThreshold = _tiers(120, "5m", 600, "5m")
    """Seconds since the controller's last decision, or age of its input data."""
    metrics_absent_for: TieredThreshold = _tiers(0, "10m", 0, "30m")
    """Only the durations are used: how long a pool's signal group (latency, queue, KV,
    tokens, errors, GPU) may be missing before LLMPoolMetricsAbsent fires for it."""
    xid_error: TieredThreshold = _tiers(0, "1m", 0, "1m")
    """Only the durations are used: warning on any XID code, critical on xid_critical_codes."""
    xid_critical_codes: tuple[int, ...] = (48, 63, 64, 74, 79, 94, 95, 119, 120)
    """XID codes that page (double-bit ECC, row remapping, NVLink, fell off the bus, GSP)."""
    burn_rate_factors: tuple[float, float, float, float] = (14.4, 6.0, 3.0, 1.0)
    """Multi-window burn-rate factors for 1h/5m, 6h/30m, 1d/2h, 3d/6h (Google SRE workbook)."""
    drain_timeouts: TieredThreshold = _tiers(1, "1m", 3, "1m")
    """Scale-down drains of the pool in a row that ended at controller.drain.timeout with
    work still on the replica (generated only with controller.drain.enabled)."""


class PrometheusRuleSettings(_Model):
    name: str = "pdscale"
    namespace: str = "monitoring"
    labels: dict[str, str] = Field(default_factory=lambda: {"release": "kube-prometheus-stack"})


class WebhookSettings(_Model):
    url: str = "http://pdscale.pdscale-system.svc:8080/v1/alerts/alertmanager"
    receiver: str = "pdscale"
    send_resolved: bool = True
    credentials_file: str | None = Field(
        default=None, description="Bearer token file as mounted in Alertmanager (its "
        "http_config.authorization.credentials_file); must hold the token the controller reads "
        "from reactions.auth")


class AlertSettings(_Model):
    extra_labels: dict[str, str] = Field(default_factory=dict)
    runbook_url_pattern: str = Field(
        default="https://github.com/pdscale/pdscale/blob/main/docs/runbooks.md#{alertname}",
        description="'{alertname}' is replaced by the lower-cased alert name",
    )
    thresholds: AlertThresholds = Field(default_factory=AlertThresholds)
    prometheus_rule: PrometheusRuleSettings = Field(default_factory=PrometheusRuleSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    evaluation_interval: Duration = 30
    prefix_cache_baseline: Duration = Field(
        default=86400, description="Trailing window of the prefix-cache hit-rate baseline"
    )

    def runbook_url(self, alertname: str) -> str:
        return self.runbook_url_pattern.replace("{alertname}", alertname.lower())


class ConfigMapSettings(_Model):
    namespace: str = "monitoring"
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})


class DashboardSettings(_Model):
    uid_prefix: str = Field(default="pdscale", pattern=r"^[a-zA-Z0-9_-]{1,24}$")
    title_prefix: str = "pdscale"
    tags: tuple[str, ...] = ("pdscale", "llm")
    refresh: str = "30s"
    time_from: str = "now-6h"
    folder: str = "pdscale"
    configmap: ConfigMapSettings = Field(default_factory=ConfigMapSettings)


class PrometheusSettings(_Model):
    """Where the controller reads its signals, and how it authenticates."""

    url: str = Field(default="http://prometheus-operated.monitoring.svc:9090",
                     description="Prometheus (or a PromQL-compatible store) base URL")
    timeout: Duration = Field(default=5, ge=1, description="Timeout of every query")
    stale_after: Duration = Field(default=120, ge=1,
                                  description="A series older than this counts as missing")
    bearer_token_file: str | None = Field(
        default=None, description="Token file, re-read when it changes")
    basic_auth_file: str | None = Field(
        default=None, description="File holding 'user:password', re-read when it changes")
    ca_bundle: str | None = None
    headers: dict[str, str] = Field(default_factory=dict,
                                    description="Extra headers, e.g. X-Scope-OrgID for Mimir")
    history: Duration = Field(default=3 * 86400,
                              description="History fetched at start-up to warm the forecasters")


class LeaderElectionSettings(_Model):
    enabled: bool = True
    lease_name: str = "pdscale-leader"
    namespace: str | None = Field(
        default=None, description="Namespace of the Lease; default: the controller's own "
        "(POD_NAMESPACE), else 'pdscale-system'")
    lease_duration: Duration = Field(default=15, ge=2,
                                     description="A standby takes over after this long")
    renew_every: Duration = Field(default=5, ge=1, description="How often the leader renews")

    @model_validator(mode="after")
    def _renews_in_time(self) -> LeaderElectionSettings:
        if self.renew_every * 2 > self.lease_duration:
            raise ValueError(f"expected renew_every at most half of lease_duration, got "
                             f"{self.renew_every}s and {self.lease_duration}s")
        return self


class ScaleDownDrainSettings(_Model):
    """How a scale-down is reached (``controller.drain``): choose the replica with the least
    work, take it out of routing (``reactions.drain``'s label), wait until its in-flight
    requests finish, then remove that replica. Off by default: it needs pod get, list and
    patch rights (the opt-in ``deploy/scale-down-drain`` component); without it pdscale
    writes the smaller replica count and Kubernetes picks the pod."""

    enabled: bool = Field(default=False, description="Drain replicas before removing them "
                          "(needs pod get/list/patch: deploy/scale-down-drain)")
    timeout: Duration = Field(
        default=300, ge=1, description="Most time a replica may drain; then it is removed "
        "with whatever it still holds (recorded, and PDScaleDrainTimingOut when it repeats)")
    settle: Duration = Field(
        default=10, ge=0, description="Routing changes take this long to reach every router: "
        "a replica counts as idle only on samples taken this long after it left routing")
    stop_routing: bool = Field(
        default=True, description="Take the chosen replica out of routing with the serving "
        "label and wait for it to drain; false where routing does not follow a selector on "
        "that label (Dynamo's Kubernetes discovery follows its operator's Services): the "
        "least-loaded replica is then removed at once and drains in its own SIGTERM handler "
        "within the pod's grace period")


class ControllerSettings(_Model):
    """How the in-cluster controller runs (``pdscale run``)."""

    mode: Literal["act", "recommend"] = Field(
        default="act", description="act: scale the targets; recommend: only export "
        "pdscale_desired_replicas for KEDA or HPA to act on (pdscale generate recommend)")
    dry_run: bool = Field(default=False, description="Decide and record, never write")
    tick: Duration = Field(default=15, ge=1, description="Decision interval")
    scale_up_quantile: float = Field(
        default=0.9, gt=0.5, lt=1, description="Forecast quantile each pool is sized for: "
        "higher buys attainment with GPU-hours (the README's cost-matched comparison shows "
        "the trade on production traces)")
    stabilisation: Duration = Field(default=300,
                                    description="Need must stay lower this long to scale down")
    max_step_down: int = Field(default=2, ge=1, description="Most replicas removed per tick")
    drain_time: Duration = Field(default=60, ge=1,
                                 description="Reactive path: drain the backlog within this")
    refit_every: Duration = Field(default=900, ge=60, description="Forecaster refit interval")
    burst_window: Duration = Field(
        default=900, ge=0, description="How long the load a burst needed is held: a peak "
        "envelope that decays with a half-life of a third of this, growing (up to 4x this) "
        "while scale-downs are reversed within the stabilisation window (bursts that came "
        "recently come again; 0 turns it off)")
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    drain: ScaleDownDrainSettings = Field(default_factory=ScaleDownDrainSettings)


class ReactionAction(StrEnum):
    SCALE_UP = "scale_up"
    HOLD_SCALE_DOWN = "hold_scale_down"
    DRAIN_INSTANCE = "drain_instance"
    NOTIFY_ONLY = "notify_only"


class ReactionRule(_Model):
    """An alert that matches (every label in ``match`` equal, every ``match_re`` a full RE2/
    Python regex match) triggers ``action`` on the alert's pool (its ``pdscale_service`` and
    ``pdscale_pool`` labels) or, for drain_instance, on its ``pod``."""

    match: dict[str, str] = Field(default_factory=dict)
    match_re: dict[str, str] = Field(default_factory=dict)
    action: ReactionAction
    step: int | None = Field(default=None, ge=1, description="scale_up: add this many")
    to: int | None = Field(default=None, ge=1, description="scale_up: to at least this many")
    hold: Duration = Field(default=900, description="hold_scale_down / scale_up: how long "
                           "scale-down stays held unless the alert resolves first")

    @model_validator(mode="after")
    def _consistent(self) -> ReactionRule:
        if self.action is ReactionAction.SCALE_UP and (self.step is None) == (self.to is None):
            raise ValueError("expected exactly one of 'step' or 'to' for scale_up")
        if self.action is not ReactionAction.SCALE_UP and (self.step or self.to):
            raise ValueError(f"'step' and 'to' apply to scale_up only, not {self.action.value}")
        for label, pattern in self.match_re.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"match_re.{label}: invalid regex {pattern!r}: {exc}") from exc
        if not self.match and not self.match_re:
            raise ValueError("expected at least one label in 'match' or 'match_re' (a rule "
                             "matching every alert is almost certainly a mistake)")
        return self


class WebhookAuth(_Model):
    bearer_token_file: str | None = Field(default=None,
                                          description="Token file, re-read when it changes")
    bearer_token_env: str | None = Field(default=None,
                                         description="Environment variable holding the token")
    basic_auth_file: str | None = Field(default=None,
                                        description="File holding 'user:password'")
    allow_unauthenticated: bool = Field(
        default=False, description="Serve the webhook without authentication on a non-loopback "
        "address (anyone who reaches the port can then scale and drain pools); without it, "
        "pdscale run disables the webhook there and says so")


class DrainSettings(_Model):
    """How drain_instance takes a pod out of serving: set a label that the pool's Service and
    the workload's selector match on, so traffic stops and the workload starts a replacement."""

    label: str = "pdscale.io/serving"
    value: str = "drained"


def _default_reactions() -> tuple[ReactionRule, ...]:
    return (
        ReactionRule(match={"alertname": "LLMGPUXidError", "severity": "critical"},
                     action=ReactionAction.DRAIN_INSTANCE),
        ReactionRule(match={"severity": "critical"},
                     match_re={"alertname": "LLMTimeToFirstTokenHigh|LLMInterTokenLatencyHigh|"
                               "LLMQueueBacklogHigh|LLMQueueGrowing|LLMKVCacheNearFull|"
                               ".*SLOBudgetBurn"},
                     action=ReactionAction.SCALE_UP, step=2, hold=900),
        # Missing inputs of the controller (latency, queue, tokens) hold; a missing group it
        # does not read (kv, errors, gpu: a cluster without DCGM has no gpu group) only pages.
        ReactionRule(match={"alertname": "LLMPoolMetricsAbsent", "severity": "critical"},
                     match_re={"signal_group": "latency|queue|tokens"},
                     action=ReactionAction.HOLD_SCALE_DOWN, hold=1800),
        ReactionRule(match={"alertname": "LLMPoolMetricsAbsent"},
                     action=ReactionAction.NOTIFY_ONLY),
        ReactionRule(match={"severity": "critical"},
                     match_re={"alertname": "LLMPoolTargetDown|PDScaleControlPlaneDegraded|"
                               "LLMErrorRateHigh"},
                     action=ReactionAction.HOLD_SCALE_DOWN, hold=1800),
    )


class ReactionSettings(_Model):
    """What the Alertmanager webhook does with the alerts it receives."""

    enabled: bool = Field(default=True, description="Global kill switch: false records "
                          "alerts but takes no action")
    dry_run: bool = Field(default=False, description="Record what would be done, do nothing")
    cooldown: Duration = Field(default=120, description="Least time between actions on a pool")
    max_actions: int = Field(default=10, ge=0, description="Most actions per window, all pools")
    window: Duration = Field(default=600, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    auth: WebhookAuth = Field(default_factory=WebhookAuth)
    drain: DrainSettings = Field(default_factory=DrainSettings)
    rules: tuple[ReactionRule, ...] = Field(default_factory=_default_reactions)


class Spec(_Model):
    version: Literal[1] = 1
    services: tuple[ServiceSpec, ...] = Field(min_length=1)
    gpu_budget: int | None = Field(default=None, ge=1, description="GPUs shared by all pools")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    dashboards: DashboardSettings = Field(default_factory=DashboardSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    reactions: ReactionSettings = Field(default_factory=ReactionSettings)

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


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec: where, what was expected, what was given, how to fix it."""

    path: str
    expected: str
    given: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: expected {self.expected}; got {self.given}. Fix: {self.fix}"


class SpecError(Exception):
    """The spec is invalid; ``problems`` lists every problem found. Give up: the user fixes it."""

    def __init__(self, source: str, problems: Sequence[SpecProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = [f"{source}: {len(self.problems)} problem(s) in the spec"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


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
    return parse_spec(text, source=source)


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
# be scaled. Custom resources (other groups) are taken on trust: Kubernetes answers 404 for one
# without /scale, and the controller reports it.
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
