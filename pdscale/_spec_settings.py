"""The spec's settings beside its services: alert thresholds and rules, dashboards, the
controller, the webhook's reactions (pdscale.spec re-exports them)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from pdscale._spec_types import Duration, HttpUrl, _Model, parse_duration


class Tier(_Model):
    value: float
    """The threshold (in the alert's own unit)."""
    for_: Duration = Field(alias="for")
    """How long the condition must hold before the tier fires."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TieredThreshold(_Model):
    """A warning and a critical level of one alert; higher values are worse."""

    warning: Tier
    """The warning tier."""
    critical: Tier
    """The critical tier."""


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
    ttft_stage: TieredThreshold = _tiers(0.5, "10m", 0.8, "5m")
    """One stage of TTFT (queue, prefill, transfer: the 95th percentile of each, from the
    engines' request spans) as a share of the TTFT SLO threshold: a stage that alone takes
    half the budget says where the time goes before TTFT itself misses (generated only
    where spans give the stage: the OTLP receiver runs, vLLM or SGLang)."""
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
    """The PrometheusRule's name."""
    namespace: str = "monitoring"
    """The PrometheusRule's namespace."""
    labels: dict[str, str] = Field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    """Labels the Prometheus operator selects rules by."""


class WebhookSettings(_Model):
    url: HttpUrl = "http://pdscale.pdscale-system.svc:8080/v1/alerts/alertmanager"
    """The controller's webhook URL as Alertmanager reaches it."""
    receiver: str = "pdscale"
    """The Alertmanager receiver's name."""
    send_resolved: bool = True
    """Also deliver resolved alerts (they end holds and floors)."""
    credentials_file: str | None = Field(
        default=None, description="Bearer token file as mounted in Alertmanager (its "
        "http_config.authorization.credentials_file); must hold the token the controller reads "
        "from reactions.auth")


class AlertSettings(_Model):
    extra_labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every generated alert (e.g. team, routing)."""
    runbook_url_pattern: str = Field(
        default="https://github.com/pdscale/pdscale/blob/main/docs/runbooks.md#{alertname}",
        description="'{alertname}' is replaced by the lower-cased alert name",
    )
    thresholds: AlertThresholds = Field(default_factory=AlertThresholds)
    """Warning and critical thresholds (value and `for`) per alert."""
    prometheus_rule: PrometheusRuleSettings = Field(default_factory=PrometheusRuleSettings)
    """Name, namespace and labels of the generated PrometheusRule."""
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    """The Alertmanager route and receiver that deliver alerts to pdscale's webhook."""
    evaluation_interval: Duration = 30
    """Rule evaluation interval of the generated rule groups."""
    prefix_cache_baseline: Duration = Field(
        default=86400, description="Trailing window of the prefix-cache hit-rate baseline"
    )

    def runbook_url(self, alertname: str) -> str:
        return self.runbook_url_pattern.replace("{alertname}", alertname.lower())


class ConfigMapSettings(_Model):
    namespace: str = "monitoring"
    """The dashboards ConfigMap's namespace (Grafana's)."""
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    """Labels Grafana's sidecar selects dashboard ConfigMaps by."""


class DashboardSettings(_Model):
    uid_prefix: str = Field(default="pdscale", pattern=r"^[a-zA-Z0-9_-]{1,24}$")
    """Prefix of every generated dashboard's uid."""
    title_prefix: str = "pdscale"
    """Prefix of every generated dashboard's title."""
    tags: tuple[str, ...] = ("pdscale", "llm")
    """Tags on every generated dashboard."""
    refresh: str = "30s"
    """Dashboard auto-refresh interval."""
    time_from: str = "now-6h"
    """Default time range start (Grafana syntax)."""
    folder: str = "pdscale"
    """Grafana folder the dashboards go to (the sidecar's folder annotation)."""
    configmap: ConfigMapSettings = Field(default_factory=ConfigMapSettings)
    """The ConfigMap the dashboards ship in for Grafana's sidecar."""


class PrometheusSettings(_Model):
    """Where the controller reads its signals, and how it authenticates."""

    url: HttpUrl = Field(default="http://prometheus-operated.monitoring.svc:9090",
                     description="Prometheus (or a PromQL-compatible store) base URL")
    timeout: Duration = Field(default=5, ge=1, description="Timeout of every query")
    stale_after: Duration = Field(default=120, ge=1,
                                  description="A series older than this counts as missing")
    bearer_token_file: str | None = Field(
        default=None, description="Token file, re-read when it changes")
    basic_auth_file: str | None = Field(
        default=None, description="File holding 'user:password', re-read when it changes")
    ca_bundle: str | None = None
    """CA bundle file to verify Prometheus' TLS certificate."""
    headers: dict[str, str] = Field(default_factory=dict,
                                    description="Extra headers, e.g. X-Scope-OrgID for Mimir")
    history: Duration = Field(default=3 * 86400,
                              description="History fetched at start-up to warm the forecasters")


class LeaderElectionSettings(_Model):
    enabled: bool = True
    """Elect a leader through a Lease (off: one replica only)."""
    lease_name: str = "pdscale-leader"
    """The Lease's name."""
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



SIGNAL_SOURCES = ("prometheus", "otlp", "both")
"""Where a signal is read: Prometheus' recorded series, the OTLP receiver's spans and metrics,
or both (the OTLP value where it has one, else Prometheus')."""

SOURCE_SIGNALS = (
    "queue_depth", "running_requests", "ttft_p50_s", "ttft_p95_s", "ttft_p95_recent_s",
    "ttft_p99_s", "itl_p50_s", "itl_p95_s", "e2e_p95_s", "request_rate", "prompt_tokens_per_s",
    "prompt_tokens_peak_per_s", "prompt_tokens_dispersion", "prompt_tokens_computed_per_s",
    "generation_tokens_per_s", "prefix_cache_hit_ratio", "kv_cache_usage_ratio",
    "kv_cache_usage_max_ratio", "preemptions_per_s", "error_ratio", "gpu_utilization_ratio",
    "kv_transfer_waiting")
"""The pool signals whose source ``controller.signal_sources`` may choose (the catalog's
``Signal`` values; tests/telemetry/test_span_rules.py holds the two lists together)."""

SignalSource = Literal["prometheus", "otlp", "both"]


class SignalSources(_Model):
    """Which source answers each signal the controller reads. Prometheus keeps what it
    measures best (gauges scraped from every replica, DCGM's GPU series); OTLP spans give
    exact latency percentiles and their split into queue, prefill and transfer."""

    default: SignalSource = "prometheus"
    """The source of every signal not named in ``signals``."""
    signals: dict[str, SignalSource] = Field(default_factory=dict)
    """Per signal (its catalog name, e.g. ttft_p95_s): prometheus, otlp or both."""

    @model_validator(mode="after")
    def _known_signals(self) -> SignalSources:
        unknown = sorted(set(self.signals) - set(SOURCE_SIGNALS))
        if unknown:
            raise ValueError(f"expected signal names from: {', '.join(SOURCE_SIGNALS)}; got "
                             f"{', '.join(unknown)}")
        return self

    def source(self, signal: str) -> SignalSource:
        """The source that answers ``signal``."""
        return self.signals.get(signal, self.default)

    def uses(self, source: Literal["prometheus", "otlp"]) -> bool:
        """True when some signal is read from ``source``."""
        chosen = {self.default, *self.signals.values()}
        return source in chosen or "both" in chosen


class OtlpSettings(_Model):
    """The OTLP receiver (``pdscale run``): engines' request spans and metrics pushed over
    OTLP/HTTP (protobuf or JSON) and OTLP/gRPC, on ports of their own."""

    enabled: bool = Field(default=False, description="Start the receiver (also started when "
                          "signal_sources reads any signal from otlp)")
    http_port: int = Field(default=4318, ge=0, le=65535,
                           description="OTLP/HTTP port (/v1/traces, /v1/metrics); 0: off")
    grpc_port: int = Field(default=4317, ge=0, le=65535, description="OTLP/gRPC port; 0: off")
    max_request_bytes: int = Field(
        default=4 << 20, ge=1024, description="Largest export request accepted, after "
        "decompression (larger: 413 or RESOURCE_EXHAUSTED); the Collector's gRPC default")
    buffer_bytes: int = Field(
        default=64 << 20, ge=1 << 16, description="Requests received and not yet ingested, "
        "in bytes; a full buffer answers 429 or RESOURCE_EXHAUSTED with a retry delay")
    stale_after: Duration = Field(default=120, ge=1, description="A pool whose newest span "
                                  "or metric point is older than this counts as missing")
    resolution: Duration = Field(
        default=30, ge=5, le=60, description="Width of the time slots the span sketches and "
        "counts are kept in: windows are read to this resolution, memory grows as its inverse")
    max_clock_skew: Duration = Field(
        default=60, ge=1, description="Spans that end further than this in the future (an "
        "engine's clock ahead of the controller's) are dropped and counted")
    auth: WebhookAuth = Field(default_factory=WebhookAuth)
    """How exporters authenticate (bearer token or basic auth), with the webhook's rule: no
    authentication on a non-loopback address only with allow_unauthenticated."""
class SizingSettings(_Model):
    """The queueing model's settings (``controller.sizing``): everything else it uses comes
    from the pool's profile, its SLO or a measurement. The scale-up quantile, the
    stabilisation window and the step down are the controller's own settings."""

    calibration_rate: float = Field(
        default=0.2, gt=0, le=1, description="Share of the way the pool's correction moves "
        "towards what one latency reading implies (0.2: about five readings to follow a "
        "change, one noisy reading moves it a fifth)")
    calibration_min: float = Field(
        default=0.5, gt=0, le=1, description="Lowest correction of the profile's service "
        "rate: a pool at most this much slower than its profile (an engine at half the "
        "profile's speed is a profile to re-measure, not a load to chase)")
    calibration_max: float = Field(
        default=2.0, ge=1, description="Highest correction: at most this much faster than "
        "the profile")
    default_variability: float = Field(
        default=2.0, gt=0, description="ca2 + cs2 (squared coefficients of variation of "
        "prefill arrivals and service times), and decode's running-sequence variability, "
        "where the prompt tokens' dispersion is not read: 2 is Poisson arrivals of "
        "exponentially varied prompts")
    prompt_length_cv2: float = Field(
        default=1.0, ge=0, description="Squared coefficient of variation of prompt lengths, "
        "which sets the prompt at the SLO's percentile (lognormal lengths with this spread): "
        "production prompt mixes read 0.8-1.5; 1 unless the pool's own mix is known")


class ControllerSettings(_Model):
    """How the in-cluster controller runs (``pdscale run``)."""

    mode: Literal["act", "recommend"] = Field(
        default="act", description="act: scale the targets; recommend: only export "
        "pdscale_desired_replicas for KEDA or HPA to act on (pdscale generate recommend)")
    dry_run: bool = Field(default=False, description="Decide and record, never write")
    tick: Duration = Field(default=15, ge=1, description="Decision interval")
    scale_up_quantile: float = Field(
        default=0.97, gt=0.5, lt=1, description="Forecast quantile each pool is sized for: "
        "higher buys attainment with GPU-hours")
    stabilisation: Duration = Field(default=600,
                                    description="Need must stay lower this long to scale down")
    max_step_down: int = Field(default=2, ge=1, description="Most replicas removed per tick")
    refit_every: Duration = Field(
        default=21600, ge=60, description="Forecaster refit interval. Between refits each "
        "minute's demand reaches the fitted model as an online update, so a refit only "
        "relearns the daily pattern from the three days of history; 6 hours is the cadence "
        "the scenario suite's figures are measured at")
    sizing: SizingSettings = Field(default_factory=SizingSettings)
    """The sizing model and its few settings."""
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    """Where and how the controller reads its signals."""
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    """The Lease that lets one of several controller replicas act."""
    drain: ScaleDownDrainSettings = Field(default_factory=ScaleDownDrainSettings)
    """Scale-down drains: replicas leave routing and finish their work before removal."""
    otlp: OtlpSettings = Field(default_factory=OtlpSettings)
    """The OTLP receiver for engines' request spans and OTLP metrics."""
    signal_sources: SignalSources = Field(default_factory=SignalSources)
    """Which source (prometheus, otlp, both) answers each signal."""

    @property
    def otlp_receiving(self) -> bool:
        """True when the OTLP receiver runs: enabled, or a signal is read from it."""
        return self.otlp.enabled or self.signal_sources.uses("otlp")


class ReactionAction(StrEnum):
    SCALE_UP = "scale_up"
    HOLD_SCALE_DOWN = "hold_scale_down"
    DRAIN_INSTANCE = "drain_instance"
    NOTIFY_ONLY = "notify_only"


class ShortageCondition(StrEnum):
    """The shortage a ``scale_up`` reaction answers, read from the pool's own recent signals
    when the alert arrives and on every tick its floor stands."""

    LATENCY = "latency"
    """The pool's latency p95 over the last minute (TTFT for prefill, ITL for decode) is above
    its SLO."""
    QUEUE = "queue"
    """More than two requests wait per ready replica of the pool now."""
    LATENCY_OR_QUEUE = "latency_or_queue"
    """Either of the two."""


class ReactionRule(_Model):
    """An alert that matches (every label in ``match`` equal, every ``match_re`` a full RE2/
    Python regex match) triggers ``action`` on the alert's pool (its ``pdscale_service`` and
    ``pdscale_pool`` labels) or, for drain_instance, on its ``pod``.

    An alert judges a window that has passed (a burn-rate alert looks back hours and waits its
    ``for``), so ``scale_up`` adds capacity only while the shortage it answers (``condition``)
    holds in the pool's recent signals, and its floor ends when that shortage clears, not when
    the alert resolves. Otherwise the alert is recorded and nothing is added."""

    match: dict[str, str] = Field(default_factory=dict)
    """Labels the alert must carry, with these exact values."""
    match_re: dict[str, str] = Field(default_factory=dict)
    """Labels the alert must carry, each fully matching this regex."""
    action: ReactionAction
    """What the alert does to its pool."""
    step: int | None = Field(default=None, ge=1, description="scale_up: add this many")
    to: int | None = Field(default=None, ge=1, description="scale_up: to at least this many")
    hold: Duration = Field(default=900, description="hold_scale_down / scale_up: how long "
                           "scale-down stays held unless the alert resolves first (scale_up: "
                           "or its condition clears)")
    condition: ShortageCondition | None = Field(
        default=None, description="scale_up only: the shortage the alert answers, checked in "
        "the pool's recent signals when it arrives and on every tick: latency (the last "
        "minute's TTFT or ITL p95 above the SLO), queue (more than two requests waiting per "
        "ready replica), or latency_or_queue (the default); while it does not hold nothing is "
        "added, and the floor ends when it clears")

    @model_validator(mode="after")
    def _consistent(self) -> ReactionRule:
        if self.action is ReactionAction.SCALE_UP and (self.step is None) == (self.to is None):
            raise ValueError("expected exactly one of 'step' or 'to' for scale_up")
        if self.action is not ReactionAction.SCALE_UP and (self.step or self.to):
            raise ValueError(f"'step' and 'to' apply to scale_up only, not {self.action.value}")
        if self.action is not ReactionAction.SCALE_UP and self.condition is not None:
            raise ValueError(f"'condition' applies to scale_up only, not {self.action.value}: "
                             "only a reaction that adds capacity checks a shortage")
        for label, pattern in self.match_re.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"match_re.{label}: invalid regex {pattern!r}: {exc}") from exc
        if not self.match and not self.match_re:
            raise ValueError("expected at least one label in 'match' or 'match_re' (a rule "
                             "matching every alert is almost certainly a mistake)")
        return self

    @property
    def shortage(self) -> ShortageCondition:
        """The condition a scale_up checks (``condition``, latency_or_queue when unset)."""
        return self.condition or ShortageCondition.LATENCY_OR_QUEUE


class DrainSettings(_Model):
    """How drain_instance takes a pod out of serving: set a label that the pool's Service and
    the workload's selector match on, so traffic stops and the workload starts a replacement."""

    label: str = "pdscale.io/serving"
    """The pod label a drain sets."""
    value: str = "drained"
    """The label's value while the pod is drained (its Service selects the serving value)."""


def _default_reactions() -> tuple[ReactionRule, ...]:
    return (
        ReactionRule(match={"alertname": "LLMGPUXidError", "severity": "critical"},
                     action=ReactionAction.DRAIN_INSTANCE),
        # The alerts that add capacity, each only while its shortage holds now: latency over
        # the SLO in the last minute, or a queue. A budget-burn alert says the error budget
        # was spent (hours of history): it adds capacity only through the same latency check.
        ReactionRule(match={"severity": "critical"},
                     match_re={"alertname": "LLMTimeToFirstTokenHigh|LLMInterTokenLatencyHigh|"
                               ".*SLOBudgetBurn"},
                     action=ReactionAction.SCALE_UP, step=2, hold=900,
                     condition=ShortageCondition.LATENCY),
        ReactionRule(match={"severity": "critical"},
                     match_re={"alertname": "LLMQueueBacklogHigh|LLMQueueGrowing|"
                               "LLMKVCacheNearFull"},
                     action=ReactionAction.SCALE_UP, step=2, hold=900,
                     condition=ShortageCondition.QUEUE),
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
    """The window `max_actions` counts over."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest webhook payload accepted (larger: 413)."""
    auth: WebhookAuth = Field(default_factory=WebhookAuth)
    """How Alertmanager authenticates to the webhook (bearer token or basic auth)."""
    drain: DrainSettings = Field(default_factory=DrainSettings)
    """The pod label drain_instance sets, and the value that takes a pod out of routing."""
    rules: tuple[ReactionRule, ...] = Field(default_factory=_default_reactions)
    """Reaction rules, first match wins: which critical alerts become which actions."""
