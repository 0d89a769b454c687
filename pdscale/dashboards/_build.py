"""Grafana dashboards built with grafana-foundation-sdk (Grafana 11 schema).

Design. Every panel queries the recorded, engine-agnostic series of telemetry's catalog (and
pdscale's own metrics), so one set of dashboards serves every engine and every service of the
spec; the ``datasource``, ``namespace`` and ``model_name`` variables pick what is shown and
legends name the service and pool. The panel sets follow the upstream dashboards users know
(vLLM production-stack, TGI, DCGM exporter; shared/reference/) and add what only pdscale has:
SLO burn rates, desired against ready replicas, forecasts with their quantile band, cold starts
and decision reasons.

Output is deterministic: stable ``uid``s from the spec's prefix, a ``refId`` on every query,
JSON with sorted keys. ``grafana_foundation_sdk`` is imported only in this package
(shared/DESIGN.md, third-party boundaries).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m

from pdscale.spec import Role, Spec
from pdscale.telemetry import (
    SLO_OBJECTIVE_RECORD,
    SLO_THRESHOLD_RECORD,
    STAGE_SIGNALS,
    Signal,
    recorded_name,
    signal_def,
    slo_error_ratio_record,
    span_signals,
)

__all__ = ["DashboardDoc", "build_dashboards", "dashboard_files", "panel_queries"]

_DS = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
_FILTER = 'namespace=~"$namespace",model_name=~"$model_name"'
_POOL_LEGEND = "{{pdscale_service}}/{{pdscale_pool}}"
_REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class DashboardDoc:
    uid: str
    title: str
    model: dict[str, Any]
    """The dashboard JSON model, as Grafana imports it."""


def _sel(extra: str = "") -> str:
    return "{" + _FILTER + ("," + extra if extra else "") + "}"


def _q(signal: Signal, extra: str = "") -> str:
    return recorded_name(signal) + _sel(extra)


def _pool(role: str) -> str:
    return f'pdscale_pool="{role}"'


def _targets(queries: list[tuple[str, str]]) -> list[prom_b.Dataquery]:
    return [
        prom_b.Dataquery().expr(expr).legend_format(legend).ref_id(_REF_IDS[i]).range()
        for i, (expr, legend) in enumerate(queries)
    ]


def _timeseries(title: str, queries: list[tuple[str, str]], unit: str, *,
                description: str = "", width: int = 12, height: int = 8,
                fill: int = 10, soft_max: float | None = None) -> ts_b.Panel:
    panel = (ts_b.Panel().title(title).datasource(_DS).unit(unit).span(width).height(height)
             .fill_opacity(fill).line_width(1)
             .legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.TABLE)
                     .placement(common_m.LegendPlacement.BOTTOM).show_legend(True)
                     .calcs(["lastNotNull", "max"]))
             .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI)
                      .sort(common_m.SortOrder.DESCENDING)))
    if description:
        panel = panel.description(description)
    if soft_max is not None:
        panel = panel.axis_soft_max(soft_max)
    for target in _targets(queries):
        panel = panel.with_target(target)
    return panel


def _stat(title: str, queries: list[tuple[str, str]], unit: str, *, description: str = "",
          width: int = 6, thresholds: list[tuple[float | None, str]] | None = None) -> stat_b.Panel:
    panel = (stat_b.Panel().title(title).datasource(_DS).unit(unit).span(width).height(5)
             .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"])))
    if description:
        panel = panel.description(description)
    if thresholds:
        panel = panel.thresholds(
            dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
                [dash_m.Threshold(value=v, color=c) for v, c in thresholds]))
    for target in _targets(queries):
        panel = panel.with_target(target.instant())
    return panel


def _objective_colours(panel: stat_b.Panel, spec: Spec) -> stat_b.Panel:
    """Each service's attainment turns green at its own SLO objective (a series is named by
    its service, the legend): one fixed 0.99 showed a 0.995 objective's miss as green."""
    for service in spec.services:
        steps = [{"value": None, "color": "red"},
                 {"value": service.slo.objective, "color": "green"}]
        panel = panel.override_by_name(service.name, [dash_m.DynamicConfigValue(
            id_val="thresholds", value={"mode": "absolute", "steps": steps})])
    return panel


def _variables(spec: Spec) -> list[Any]:
    anchor = recorded_name(Signal.TARGETS)
    return [
        dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dash_b.QueryVariable("namespace").label("Namespace").datasource(_DS)
        .query(f"label_values({anchor}, namespace)")
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True)
        .all_value(".*"),
        dash_b.QueryVariable("model_name").label("Model").datasource(_DS)
        .query(f'label_values({anchor}{{namespace=~"$namespace"}}, model_name)')
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True)
        .all_value(".*"),
    ]


def _new(spec: Spec, key: str, title: str, description: str) -> dash_b.Dashboard:
    s = spec.dashboards
    board = (dash_b.Dashboard(f"{s.title_prefix} / {title}").uid(f"{s.uid_prefix}-{key}")
             .description(description).tags(list(s.tags)).refresh(s.refresh)
             .time(s.time_from, "now").timezone("browser").editable()
             .tooltip(dash_m.DashboardCursorSync.CROSSHAIR))
    for variable in _variables(spec):
        board = board.with_variable(variable)
    return board


def _burn(kind: str, window: str, role: str) -> str:
    errors = slo_error_ratio_record(kind, window)  # type: ignore[arg-type]
    return (f"{errors}{_sel(_pool(role))} / on (pdscale_service, pdscale_pool) "
            f"(1 - {SLO_OBJECTIVE_RECORD}{_sel(_pool(role))})")


def _overview(spec: Spec) -> dash_b.Dashboard:
    b = _new(spec, "overview", "Service overview",
             "SLO status, latency percentiles, traffic and errors of each P/D service.")
    b = b.with_row(dash_b.Row("SLO"))
    ttft_ok = f"1 - {slo_error_ratio_record('ttft', '1d')}{_sel(_pool('prefill'))}"
    itl_ok = f"1 - {slo_error_ratio_record('itl', '1d')}{_sel(_pool('decode'))}"
    green_red = [(None, "red"), (0.99, "green")]
    b = b.with_panel(_objective_colours(
        _stat("TTFT SLO attainment (1d)", [(ttft_ok, "{{pdscale_service}}")],
              "percentunit", thresholds=green_red,
              description="Share of requests whose TTFT met the SLO threshold; green at or "
                          "above the service's objective."), spec))
    b = b.with_panel(_objective_colours(
        _stat("ITL SLO attainment (1d)", [(itl_ok, "{{pdscale_service}}")],
              "percentunit", thresholds=green_red,
              description="Share of token gaps within the ITL SLO threshold; green at or "
                          "above the service's objective."), spec))
    b = b.with_panel(_timeseries(
        "Error-budget burn rate", [
            (_burn("ttft", "1h", "prefill"), "TTFT 1h {{pdscale_service}}"),
            (_burn("ttft", "6h", "prefill"), "TTFT 6h {{pdscale_service}}"),
            (_burn("itl", "1h", "decode"), "ITL 1h {{pdscale_service}}"),
            (_burn("itl", "6h", "decode"), "ITL 6h {{pdscale_service}}"),
        ], "short", width=12,
        description="1 spends the budget exactly over the SLO window; the critical alert pages "
                    "at 14.4 (1h) and 6 (6h)."))
    b = b.with_row(dash_b.Row("Latency"))
    threshold_ttft = f"{SLO_THRESHOLD_RECORD}{_sel(_pool('prefill'))}"
    threshold_itl = f"{SLO_THRESHOLD_RECORD}{_sel(_pool('decode'))}"
    b = b.with_panel(_timeseries("Time to first token", [
        (_q(Signal.TTFT_P50_S, _pool("prefill")), "p50 {{pdscale_service}}"),
        (_q(Signal.TTFT_P95_S, _pool("prefill")), "p95 {{pdscale_service}}"),
        (_q(Signal.TTFT_P99_S, _pool("prefill")), "p99 {{pdscale_service}}"),
        (threshold_ttft, "SLO {{pdscale_service}}"),
    ], "s", fill=0))
    b = b.with_panel(_timeseries("Inter-token latency", [
        (_q(Signal.ITL_P50_S, _pool("decode")), "p50 {{pdscale_service}}"),
        (_q(Signal.ITL_P95_S, _pool("decode")), "p95 {{pdscale_service}}"),
        (threshold_itl, "SLO {{pdscale_service}}"),
    ], "s", fill=0))
    b = b.with_panel(_timeseries("End-to-end latency p95", [
        (_q(Signal.E2E_P95_S), _POOL_LEGEND)], "s", width=8, fill=0))
    b = b.with_row(dash_b.Row("Traffic"))
    b = b.with_panel(_timeseries("Requests", [(_q(Signal.REQUEST_RATE), _POOL_LEGEND)],
                                 "reqps", width=8))
    b = b.with_panel(_timeseries("Errors", [(_q(Signal.ERROR_RATIO), _POOL_LEGEND)],
                                 "percentunit", width=8))
    b = b.with_panel(_timeseries("Token throughput", [
        (_q(Signal.PROMPT_TOKENS_PER_S), "prompt " + _POOL_LEGEND),
        (_q(Signal.GENERATION_TOKENS_PER_S), "generated " + _POOL_LEGEND),
    ], "short", width=8, description="Tokens per second."))
    return b


def _replicas_panel(role: str, width: int = 12) -> ts_b.Panel:
    return _timeseries("Replicas: desired, ready, scraped", [
        (f"pdscale_desired_replicas{_sel(_pool(role))}", "desired {{pdscale_service}}"),
        (f"pdscale_ready_replicas{_sel(_pool(role))}", "ready {{pdscale_service}}"),
        (_q(Signal.TARGETS_UP, _pool(role)), "scraped {{pdscale_service}}"),
    ], "short", width=width, fill=0)


def _prefill(spec: Spec) -> dash_b.Dashboard:
    role = "prefill"
    b = _new(spec, "prefill", "Prefill pool",
             "The compute-bound pool: TTFT, queueing, prompt throughput and prefix reuse.")
    b = b.with_panel(_timeseries("Time to first token", [
        (_q(Signal.TTFT_P50_S, _pool(role)), "p50 {{pdscale_service}}"),
        (_q(Signal.TTFT_P95_S, _pool(role)), "p95 {{pdscale_service}}"),
        (_q(Signal.TTFT_P95_RECENT_S, _pool(role)), "p95 last minute {{pdscale_service}}"),
        (_q(Signal.TTFT_P99_S, _pool(role)), "p99 {{pdscale_service}}"),
        (f"{SLO_THRESHOLD_RECORD}{_sel(_pool(role))}", "SLO {{pdscale_service}}"),
    ], "s", fill=0, description="Over 5 minutes, and the p95 over the last minute: pdscale "
                                "adds a replica for latency alone only while both are over "
                                "the SLO."))
    b = b.with_panel(_timeseries("Queue: waiting and per ready replica", [
        (_q(Signal.QUEUE_DEPTH, _pool(role)), "waiting {{pdscale_service}}"),
        (f"{_q(Signal.QUEUE_DEPTH, _pool(role))} / clamp_min("
         f"{_q(Signal.TARGETS_UP, _pool(role))}, 1)", "per replica {{pdscale_service}}"),
    ], "short"))
    b = b.with_panel(_timeseries("Prompt tokens per second", [
        (_q(Signal.PROMPT_TOKENS_PER_S, _pool(role)), "5m rate {{pdscale_service}}"),
        (_q(Signal.PROMPT_TOKENS_PEAK_PER_S, _pool(role)),
         "peak minute in 5m {{pdscale_service}}")], "short", width=6,
        description="The peak minute is what a burst needed; pdscale sizes prefill for it "
                    "(the 5-minute rate averages a burst away)."))
    b = b.with_panel(_timeseries("Prompt tokens: dispersion per 5 s", [
        (_q(Signal.PROMPT_TOKENS_DISPERSION, _pool(role)), "{{pdscale_service}}")],
        "short", width=6,
        description="Half the mean squared difference of consecutive 5 s windows' prompt "
                    "tokens over their mean, over 5 minutes: about one prompt's length for "
                    "independent arrivals, more when prompts arrive in clumps within seconds. "
                    "pdscale's prefill model reads its arrival variability from it. Empty at a "
                    "scrape interval over 2.5 s (pdscale check says so)."))
    b = b.with_panel(_timeseries("Prefix-cache hit rate", [
        (_q(Signal.PREFIX_CACHE_HIT_RATIO, _pool(role)), "{{pdscale_service}}")],
        "percentunit", width=6, soft_max=1))
    b = b.with_panel(_timeseries("GPU utilisation", [
        (_q(Signal.GPU_UTILIZATION_RATIO, _pool(role)), "{{pdscale_service}}")],
        "percentunit", width=6, soft_max=1))
    b = b.with_panel(_replicas_panel(role, width=24))
    return _with_ttft_stages(spec, b)


def _with_ttft_stages(spec: Spec, b: dash_b.Dashboard) -> dash_b.Dashboard:
    """TTFT broken down by stage (queue, prefill, transfer), only where the engines' request
    spans give it (the OTLP receiver runs, the engine's spans carry the stage): which stage
    moved is the first question when TTFT swings."""
    stages = [s for s in STAGE_SIGNALS
              if any(s in span_signals(spec, service, role)
                     for service in spec.services for role in Role)]
    if not stages:
        return b
    b = b.with_row(dash_b.Row("TTFT by stage (request spans)"))
    names = {Signal.TTFT_QUEUE_P95_S: "queue", Signal.TTFT_PREFILL_P95_S: "prefill",
             Signal.TTFT_TRANSFER_P95_S: "transfer"}
    for role, title, description in (
            ("prefill", "TTFT p95 by stage, prefill pool",
             "The 95th percentile of each stage of the prefill pool's requests, from the "
             "engines' request spans: queue (waiting for a prefill slot: short of replicas), "
             "prefill (the computation itself: prompt lengths, cache hits, the GPU), transfer "
             "(the rest of TTFT: tokenisation, the hand-off). Percentiles of stages do not "
             "add up to the TTFT percentile; compare each with the SLO."),
            ("decode", "TTFT p95 by stage, decode pool",
             "The same split as the decode engines see it: in P/D the KV transfer from "
             "prefill shows as transfer (or queue, while the KV is awaited).")):
        queries = [(_q(s, _pool(role)), f"{names[s]} {{{{pdscale_service}}}}") for s in stages]
        queries.append((_q(Signal.TTFT_P95_S, _pool(role)), "TTFT {{pdscale_service}}"))
        queries.append((f"{SLO_THRESHOLD_RECORD}{_sel(_pool('prefill'))}",
                        "SLO {{pdscale_service}}"))
        b = b.with_panel(_timeseries(title, queries, "s", fill=0, description=description))
    return b


def _decode(spec: Spec) -> dash_b.Dashboard:
    role = "decode"
    b = _new(spec, "decode", "Decode pool",
             "The memory-bound pool: ITL, KV-cache pressure, batch occupancy and preemptions.")
    b = b.with_panel(_timeseries("Inter-token latency", [
        (_q(Signal.ITL_P50_S, _pool(role)), "p50 {{pdscale_service}}"),
        (_q(Signal.ITL_P95_S, _pool(role)), "p95 {{pdscale_service}}"),
        (f"{SLO_THRESHOLD_RECORD}{_sel(_pool(role))}", "SLO {{pdscale_service}}"),
    ], "s", fill=0))
    b = b.with_panel(_timeseries("KV-cache usage", [
        (_q(Signal.KV_CACHE_USAGE_RATIO, _pool(role)), "mean {{pdscale_service}}"),
        (_q(Signal.KV_CACHE_USAGE_MAX_RATIO, _pool(role)), "fullest {{pdscale_service}}"),
    ], "percentunit", soft_max=1))
    b = b.with_panel(_timeseries("Running and waiting sequences", [
        (_q(Signal.RUNNING_REQUESTS, _pool(role)), "running {{pdscale_service}}"),
        (_q(Signal.QUEUE_DEPTH, _pool(role)), "waiting for capacity {{pdscale_service}}"),
        (_q(Signal.KV_TRANSFER_WAITING, _pool(role)), "waiting for KV transfer "
                                                      "{{pdscale_service}}"),
    ], "short", width=8, description="Waiting for capacity is what more decode replicas "
                                     "relieve; waiting for the KV transfer from prefill is not."))
    b = b.with_panel(_timeseries("Preemptions per second", [
        (_q(Signal.PREEMPTIONS_PER_S, _pool(role)), "{{pdscale_service}}")], "short", width=8))
    b = b.with_panel(_timeseries("Generated tokens per second", [
        (_q(Signal.GENERATION_TOKENS_PER_S, _pool(role)), "{{pdscale_service}}")], "short",
        width=8))
    b = b.with_panel(_replicas_panel(role, width=24))
    return b


def _cache(spec: Spec) -> dash_b.Dashboard:
    b = _new(spec, "cache", "Caches",
             "Prefix-cache reuse (local and cross-instance) and KV-cache occupancy per pool.")
    b = b.with_panel(_timeseries("Prefix-cache hit rate", [
        (_q(Signal.PREFIX_CACHE_HIT_RATIO), _POOL_LEGEND)], "percentunit", soft_max=1))
    b = b.with_panel(_timeseries("External (KV-connector) cache hit rate", [
        (_q(Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO), _POOL_LEGEND)], "percentunit",
        soft_max=1, description="vLLM's cross-instance cache (e.g. LMCache, Mooncake); empty "
                                "for engines that do not export it."))
    b = b.with_panel(_timeseries("KV-cache usage, fullest replica", [
        (_q(Signal.KV_CACHE_USAGE_MAX_RATIO), _POOL_LEGEND)], "percentunit", soft_max=1))
    b = b.with_panel(_timeseries("P/D KV-transfer failures per second", [
        (_q(Signal.KV_TRANSFER_FAILURES_PER_S), "transfer " + _POOL_LEGEND),
        (_q(Signal.KV_HANDOFF_FAILURES_PER_S), "hand-off " + _POOL_LEGEND),
    ], "short", fill=0, description="KV written by prefill that never reached decode: failed "
                                    "transfers, and hand-offs that expired or failed to "
                                    "bootstrap (vLLM with NIXL, SGLang). No series for a pool "
                                    "means its engine exports no such counter (Dynamo 1.6.1, "
                                    "vLLM with other connectors), not zero failures."))
    b = b.with_panel(_timeseries("Uncached prompt tokens per second", [
        (f"{_q(Signal.PROMPT_TOKENS_PER_S, _pool('prefill'))} * (1 - "
         f"{_q(Signal.PREFIX_CACHE_HIT_RATIO, _pool('prefill'))})",
         "estimated {{pdscale_service}}"),
        (_q(Signal.PROMPT_TOKENS_COMPUTED_PER_S, _pool("prefill")),
         "computed {{pdscale_service}}")],
        "short", description="The prefill pool's real work: prompt tokens the cache did not "
                             "serve. pdscale sizes prefill on this: the engine's own count of "
                             "computed tokens where it exports one (vLLM 0.34+), else prompt "
                             "tokens x (1 - prefix hit rate)."))
    return b


def _gpus(spec: Spec) -> dash_b.Dashboard:
    b = _new(spec, "gpus", "GPUs", "DCGM exporter signals of each pool's GPUs.")
    b = b.with_panel(_timeseries("GPU utilisation", [
        (_q(Signal.GPU_UTILIZATION_RATIO), _POOL_LEGEND)], "percentunit", soft_max=1))
    b = b.with_panel(_timeseries("GPU memory", [
        (_q(Signal.GPU_MEMORY_USED_BYTES), "used " + _POOL_LEGEND),
        (_q(Signal.GPU_MEMORY_FREE_BYTES), "free " + _POOL_LEGEND),
    ], "bytes"))
    b = b.with_panel(_timeseries("Fullest GPU memory", [
        (_q(Signal.GPU_MEMORY_USED_MAX_RATIO), _POOL_LEGEND)], "percentunit", width=8,
        soft_max=1))
    b = b.with_panel(_timeseries("Hottest GPU", [
        (_q(Signal.GPU_TEMPERATURE_MAX_CELSIUS), _POOL_LEGEND)], "celsius", width=8, fill=0))
    xid = (table_b.Panel().title("GPUs reporting an XID error").datasource(_DS).span(8)
           .height(8).description("Last XID code per GPU; 0 means none. Critical codes page.")
           .with_target(prom_b.Dataquery().expr(f"{_q(Signal.GPU_XID_ERRORS)} > 0")
                        .legend_format("{{pod}} gpu {{gpu}}").ref_id("A").instant()
                        .format(prom_m.PromQueryFormat.TABLE)))
    b = b.with_panel(xid)
    return b


def _autoscaler(spec: Spec) -> dash_b.Dashboard:
    b = _new(spec, "autoscaler", "Autoscaler",
             "What pdscale decided and why: replicas, forecasts against actual load, cold "
             "starts, decision reasons, the GPU budget and data freshness.")
    b = b.with_panel(_timeseries("Desired and ready replicas", [
        (f"pdscale_desired_replicas{_sel()}", "desired " + _POOL_LEGEND),
        (f"pdscale_ready_replicas{_sel()}", "ready " + _POOL_LEGEND),
    ], "short", fill=0))
    b = _with_drain_panel(spec, b)
    by_pool = "max by (namespace, model_name, pdscale_service, pdscale_pool) "
    b = b.with_panel(_timeseries("Forecast against observed demand", [
        (by_pool + "(pdscale_forecast_demand" + _sel('quantile="0.5"') + ")",
         "forecast p50 " + _POOL_LEGEND),
        (by_pool + "(pdscale_forecast_demand" + _sel('quantile="0.9"') + ")",
         "forecast p90 " + _POOL_LEGEND),
        (f"pdscale_observed_demand{_sel()}", "observed " + _POOL_LEGEND),
    ], "short", fill=0, description="Highest forecast over the pre-warm horizon (one cold "
                                    "start ahead) against the demand observed now: prefill in "
                                    "prompt tokens/s, decode in generated tokens/s. "
                                    "The p90 is what pdscale sizes for."))
    b = b.with_panel(_timeseries("Cold start p90", [
        (f"pdscale_cold_start_p90_seconds{_sel()}", _POOL_LEGEND)], "s", width=8, fill=0))
    decisions = signal_def(Signal.DECISIONS_PER_S)
    b = b.with_panel(_timeseries("Decisions by reason", [
        (f"sum by (pdscale_service, pdscale_pool, reason) (rate({decisions.series}{_sel()}"
         "[$__rate_interval]))", "{{pdscale_service}}/{{pdscale_pool}} {{reason}}")],
        "short", width=8, description="Scaling decisions per second, by the reason recorded "
                                      "with each."))
    b = b.with_panel(_timeseries("GPU budget", [
        ("sum(pdscale_gpus_allocated" + _sel() + ")", "allocated"),
        ("max(pdscale_gpu_budget)", "budget"),
    ], "short", width=8, fill=0))
    b = b.with_panel(_timeseries("Input data staleness", [
        (f"max by (pdscale_service, pdscale_pool) (pdscale_data_staleness_seconds{_sel()})",
         _POOL_LEGEND)], "s", width=12, fill=0,
        description="Age of the newest sample behind the controller's inputs. Stale data "
                    "holds scaling (never scales down)."))
    # One unit a panel: failures per second, seconds, and the 0/1 lease.
    b = b.with_panel(_timeseries("Controller adapter errors", [
        ("sum by (adapter, kind) (rate(pdscale_adapter_errors_total[$__rate_interval]))",
         "{{adapter}} {{kind}}")], "short", width=8, fill=0,
        description="Failed calls per second by adapter (prometheus, kubernetes, forecaster, "
                    "lease)."))
    b = b.with_panel(_timeseries("Controller tick time p99", [
        ("histogram_quantile(0.99, sum by (le) (rate(pdscale_tick_duration_seconds_bucket"
         "[$__rate_interval])))", "tick p99")], "s", width=8, fill=0,
        description="99th-percentile time of one control tick."))
    b = b.with_panel(_stat("Controller holds the lease", [("max(pdscale_leader)", "leader")],
                           "bool_yes_no", width=8,
                           description="Whether a controller replica is the leader (1) or "
                                       "none is (0)."))
    return b


def _with_drain_panel(spec: Spec, b: dash_b.Dashboard) -> dash_b.Dashboard:
    """Scale-down drains, only with controller.drain: replicas out of routing, how drains
    ended, requests cut at the timeout."""
    if not spec.controller.drain.enabled:
        return b
    by = "sum by (pdscale_service, pdscale_pool"
    return b.with_panel(_timeseries("Scale-down drains", [
        (f"{by}) (pdscale_drain_replicas{_sel()})", "draining " + _POOL_LEGEND),
        (f"{by}, outcome) (increase(pdscale_drain_ended_total{_sel()}[$__rate_interval]))",
         _POOL_LEGEND + " {{outcome}}"),
        (f"{by}) (increase(pdscale_drain_cut_requests_total{_sel()}[$__rate_interval]))",
         "requests cut " + _POOL_LEGEND),
    ], "short", fill=0, description="Replicas out of routing while their requests finish "
                                    "before a scale-down removes them; drains ended by outcome "
                                    "(drained, timeout, taken_back, abandoned); requests still "
                                    "on replicas removed at controller.drain.timeout."))


_BUILDERS = (
    ("overview", _overview),
    ("prefill", _prefill),
    ("decode", _decode),
    ("cache", _cache),
    ("gpus", _gpus),
    ("autoscaler", _autoscaler),
)


def build_dashboards(spec: Spec) -> list[DashboardDoc]:
    docs = []
    for _key, build in _BUILDERS:
        board = build(spec).build()
        model: dict[str, Any] = json.loads(json.dumps(board, cls=JSONEncoder))
        _number_panels(model)
        docs.append(DashboardDoc(uid=str(model["uid"]), title=str(model["title"]), model=model))
    return docs


def _number_panels(model: dict[str, Any]) -> None:
    """Unique panel ids in layout order (the SDK leaves them 0); Grafana keys state on them."""
    next_id = 1
    stack = list(model.get("panels", []))
    while stack:
        panel = stack.pop(0)
        panel["id"] = next_id
        next_id += 1
        stack[0:0] = panel.get("panels", [])


def panel_queries(model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) for every query of a dashboard model, rows included."""
    out = []
    panels = list(model.get("panels", []))
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []) or []:
            out.append((str(panel.get("title", "")), str(target.get("refId", "")),
                        str(target.get("expr", ""))))
    return out


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def dashboard_files(spec: Spec) -> dict[str, str]:
    """Dashboard JSON files and a Grafana-sidecar ConfigMap manifest per dashboard."""
    import yaml  # local: only the manifests need it

    files: dict[str, str] = {}
    settings = spec.dashboards
    for doc in build_dashboards(spec):
        files[f"{doc.uid}.json"] = _json(doc.model)
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"grafana-dashboard-{doc.uid}",
                "namespace": settings.configmap.namespace,
                "labels": dict(sorted({"app.kubernetes.io/managed-by": "pdscale",
                                       **settings.configmap.labels}.items())),
                "annotations": {"grafana_folder": settings.folder},
            },
            "data": {f"{doc.uid}.json": _json(doc.model)},
        }
        files[f"configmaps/{doc.uid}.yaml"] = yaml.safe_dump(configmap, sort_keys=False,
                                                             width=1 << 20)
    return files
