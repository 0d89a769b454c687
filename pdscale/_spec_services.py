"""The spec's services and their pools: SLOs, selectors, scale targets, Dynamo settings, P:D
ratio bounds (pdscale.spec re-exports them)."""

from __future__ import annotations

import re
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, model_validator

from pdscale import _engines
from pdscale._cron import Cron, CronError
from pdscale._regex import regex_examples
from pdscale._spec_types import (
    ENGINE_HISTOGRAM_BUCKETS,
    Duration,
    Engine,
    Role,
    _Model,
    cold_start_quantile,
)

# RE2 metacharacters; re.escape would also escape '-', which reads badly in PromQL.
_RE_META = re.compile(r"([.^$*+?()\[\]{}|\\])")


class SLOSpec(_Model):
    """Latency SLOs of a service; each threshold must sit on a histogram bucket boundary."""

    ttft_p95_s: float = Field(gt=0, description="Time to first token, 95th percentile, seconds")
    itl_p95_s: float = Field(gt=0, description="Inter-token latency, 95th percentile, seconds")
    objective: float = Field(
        default=0.99, gt=0, lt=1, description="Share of requests that must meet both "
        "thresholds; pdscale sizes each pool for its latency at this percentile")
    window: Duration = Field(default=30 * 86400, description="SLO compliance window")

    def threshold_s(self, kind: Literal["ttft", "itl"]) -> float:
        """The latency threshold of ``kind`` (what its histogram's SLO bucket must match)."""
        return self.ttft_p95_s if kind == "ttft" else self.itl_p95_s


class PoolSelector(_Model):
    """How to find a pool's series in Prometheus.

    Kubernetes scrapes label every series with ``namespace`` and ``pod``; the pod regex (by
    default ``<scale target name>-.*``) selects the pool's engine and DCGM GPU series alike.
    ``match_labels`` adds exact label matchers for engine series (for labels that relabelling
    copies from the pod, such as ``role``). ``dynamo_component`` selects Dynamo workers.
    """

    pod_regex: str | None = Field(default=None, description="Regex on the pod label")
    match_labels: dict[str, str] = Field(default_factory=dict)
    """Exact label matchers added to the pool's engine series."""
    dynamo_component: str | None = None
    """Dynamo only: the component name of the pool's workers."""
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    """OTLP: the resource attributes (exact values) that select the pool's spans and metrics,
    e.g. service.name. Empty: k8s.namespace.name equal to the service's namespace and
    k8s.pod.name matching the pod regex (what the Collector's k8sattributes processor, or
    OTEL_RESOURCE_ATTRIBUTES from the downward API, puts on the engine's resource)."""


class ScaleTarget(_Model):
    """The Kubernetes object whose ``/scale`` subresource sets the pool's replicas."""

    api_version: str = "apps/v1"
    """The target's apiVersion."""
    kind: str = "Deployment"
    """The target's kind (anything with a /scale subresource)."""
    name: str
    """The target's name in the service's namespace."""


class PlannedFloor(_Model):
    """A window of planned capacity: from each minute the cron expression matches, for
    ``duration``, the pool keeps at least ``min_replicas``, asked one lead (the pool's cold
    start p90 and a tick) early so they are ready when the window opens."""

    cron: str = Field(min_length=1, description="When a window starts: minute hour "
                      "day-of-month month day-of-week (numbers, *, a-b, /n, lists), e.g. "
                      "'0 9 * * 1-5' for 09:00 on weekdays")
    duration: Duration = Field(gt=0, description="How long each window lasts")
    min_replicas: int = Field(ge=1, description="The pool's floor within a window")
    timezone: str = Field(default="UTC", description="IANA zone the cron expression reads "
                          "(the simulator's trace starts at 00:00 UTC, a Thursday)")

    @model_validator(mode="after")
    def _parses(self) -> PlannedFloor:
        try:
            Cron.parse(self.cron)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not an IANA zone name (e.g. "
                             "'UTC', 'Europe/Paris')") from None
        return self


class PoolSpec(_Model):
    selector: PoolSelector = Field(default_factory=PoolSelector)
    """How to find the pool's series in Prometheus."""
    target: ScaleTarget
    """The Kubernetes object whose /scale subresource sets the pool's replicas."""
    min_replicas: int = Field(default=1, ge=1)
    """Fewest replicas pdscale leaves the pool."""
    max_replicas: int = Field(ge=1)
    """Most replicas pdscale gives the pool."""
    gpus_per_replica: int = Field(default=1, ge=1)
    """GPUs one replica holds (GPU-hours and the GPU budget count them)."""
    cold_start: Duration = Field(default=60, description="Estimated median time from a "
                                 "scale-up to a ready replica")
    cold_start_spread: float = Field(
        default=0.2, ge=0, le=1.5, description="How much cold starts vary around "
        "cold_start: the sigma of a log-normal (0.2: one in ten takes over 1.29x the median). "
        "The controller plans with the p90 until it has timed its own cold starts; the "
        "simulator draws every replica's cold start from it")
    profile: str = Field(default="h100-80gb-llama-3.1-8b", min_length=1)
    """Performance profile: a shipped name or a profile YAML file (a relative path is read
    beside the spec)."""
    floors: list[PlannedFloor] = Field(default_factory=list)
    """Planned capacity for known peaks (launches, the daily peak): see PlannedFloor."""

    @model_validator(mode="after")
    def _floors_within_max(self) -> PoolSpec:
        for floor in self.floors:
            if floor.min_replicas > self.max_replicas:
                raise ValueError(f"floor {floor.cron!r} asks {floor.min_replicas} replicas, "
                                 f"over max_replicas {self.max_replicas}: lower it or raise "
                                 "max_replicas")
        return self

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
    """The worker backend Dynamo runs (its metrics' component names follow it)."""
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
    """The service's name (a DNS-1123 label); alerts and dashboards carry it as
    `pdscale_service`."""
    namespace: str
    """The Kubernetes namespace the service's pools run in."""
    engine: Engine
    """The serving engine whose metrics pdscale reads."""
    model_name: str = Field(min_length=1)
    """The model name the engine reports in its metrics' `model_name` label."""
    slo: SLOSpec
    """The latency SLOs the pools are sized and alerted for."""
    priority: float = Field(default=1.0, gt=0, description="Weight in the shared GPU budget")
    routing: Literal["load_balanced", "prefix_aware"] = Field(
        default="load_balanced", description="How prompts reach the prefill replicas: "
        "load_balanced (round robin, least loaded, a Kubernetes Service; Dynamo's frontend "
        "by default) sends a prompt to any replica, so prefix-cache hits fall as the pool "
        "grows and pdscale sizes for that; prefix_aware (Dynamo's KV router, SGLang's "
        "cache-aware router, llm-d's prefix scorer) sends it to the replica holding its "
        "prefix, and the hits read are kept")
    dynamo: DynamoSettings | None = None
    """Dynamo only: the namespace and backend the frontend and workers register under."""
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
    gpu_metrics: bool = Field(
        default=True, description="Whether the pools' GPUs are scraped from the DCGM exporter "
        "with its Kubernetes pod mapping (the gpu signal group). false where nothing exports "
        "them (no DCGM exporter, the loopback stack): pdscale then records, alerts on and "
        "checks no GPU signal, and generates no absence alert for the group")
    pools: dict[Role, PoolSpec]
    """The `prefill` and the `decode` pool."""

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
