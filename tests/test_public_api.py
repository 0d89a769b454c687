"""The packages' public names are pinned: changing them is a deliberate act."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "pdscale.alerts": ["AlertDef", "RUNBOOKS", "Runbook", "RunbookCase", "RunbookPanel",
               "ScenarioError", "TierDef", "alert_defs", "alert_files",
               "alerting_groups", "alertmanager_config", "alerts_table", "dump_yaml",
               "prometheus_rule", "recording_groups", "render_template", "runbooks_page",
               "unit_tests", "with_alerts_table"],
    "pdscale.dashboards": ["DashboardDoc", "build_dashboards", "dashboard_files", "panel_queries"],
    "pdscale.telemetry": ["CONTROL_PLANE_METRICS", "ControllerTelemetry", "DISPERSION_WINDOW",
                  "DISPERSION_WINDOW_S", "KNOWN_METRICS",
                  "POOL_LABELS", "PrometheusAuth", "PrometheusQueryError",
                  "PrometheusReader", "PrometheusUnavailable", "RATE_WINDOW",
                  "RATE_WINDOW_S", "RECENT_WINDOW", "RECENT_WINDOW_S", "SLO_OBJECTIVE_RECORD",
                  "SLO_THRESHOLD_RECORD", "SLO_WINDOWS", "SeriesRef",
                  "Signal", "SignalDef", "SignalValue", "UnknownSignal",
                  "derive_signals", "dispersion_window_samples", "dynamo_label_namespace",
                  "engine_signals", "instant_rows", "le_matcher",
                  "metric_names_in", "pool_expr", "pool_query",
                  "recorded_name", "series_refs", "signal_def",
                  "slo_bucket_expr", "slo_bucket_record",
                  "slo_bucket_ref", "slo_error_ratio_expr",
                  "slo_error_ratio_record", "slo_source", "span_signals",
                  "recorded_expr", "SPAN_HISTOGRAM_SERIES", "STAGE_SIGNALS",
                  "COLLECTOR_TOKEN_ENV", "collector_config", "collector_notes",
                  "POD_WORK_SIGNALS", "PodWork", "pod_work_query", "read_pod_work",
                  "STAGES", "IngestResult", "OtlpStore", "StageHistogram",
                  "resource_selector"],
    "pdscale.forecasting": ["AutoForecaster", "BacktestResult", "ExponentialSmoothing", "LastValue",
                    "OnlineForecaster",
                    "QuantileGBForecaster", "RegularSeries", "SeasonalNaive", "SeriesError",
                    "backtest", "level_shifts", "pinball", "regularize",
                    "series_from_prometheus", "series_from_requests"],
    "pdscale.controller": ["Actuator", "AdapterError", "Cause", "Clock",
                   "ColdStartTracker", "ConstrainedPolicy", "Constraints",
                   "Controller", "DecisionRecord", "DecodePoint", "Detail",
                   "ForecastStage", "HEADROOM", "InstanceProfile",
                   "KubeConfigError", "NoForecast", "Observation",
                   "ObservationSource", "Overrides", "PdscalePolicy",
                   "Policy", "PoolDecision", "PoolForecast",
                   "PoolKey", "PoolObservation", "PoolReplicas",
                   "ProcessActuator", "ProfileError", "Reconciler", "Refits",
                   "SourceResult", "SystemClock", "TickReport", "WorkerTemplate",
                   "apply_constraints", "build_forecasts",
                   "build_policy", "builtin_profiles", "create_app",
                   "decode_batch_limit", "decode_operating_point",
                   "free_loopback_port", "hpa_manifests", "is_loopback",
                   "keda_manifests", "kube_client", "load_profile",
                   "prefill_capacity", "process_is_zombie", "process_start_ticks",
                   "reader_from_spec", "serve", "spawn_process",
                   "stop_pids", "stop_recorded", "sum_metric",
                   "targets_file_name", "uncached_prefill_demand"],
    "pdscale.simulator": ["DYNAMO_VERSION", "DynamoNotInstalled", "DynamoPolicy", "DynamoStack",
                  "EventSimulator", "EventWorld", "FORMATS", "FluidLoad",
                  "FluidWorld", "InstanceProfile", "LiveCluster",
                  "OraclePolicy", "POLICIES", "PoolSetup", "Prepared",
                  "ProfileError", "ReactivePolicy", "SimClock", "SimOptions",
                  "SimResult", "SimSetup", "StackError", "StaticPolicy",
                  "Trace", "TraceError", "TraceStats", "World",
                  "attach_reconciler", "builtin_profiles", "compare_policies",
                  "comparison_files", "comparison_table", "demand_plan",
                  "dynamo_python", "fluid_load_from_servegen",
                  "fluid_load_from_trace", "load_profile", "load_trace",
                  "prepare", "result_files", "run_event", "run_fluid",
                  "run_world", "serve_live", "simulate", "size_for_peak",
                  "stop_stack", "synthetic_trace", "trace_stats", "world_for",
                  "PUBLIC_TRACES", "TRACES_ENV", "PublicTrace", "TraceFetchError",
                  "TraceFile", "TraceUnavailable", "default_traces_dir", "fetch_trace",
                  "resolve_trace", "traces_dir", "ATTAINMENT_TARGET", "CEILING_MARGIN",
                  "GENEROUS", "BestFixed", "best_fixed", "fixed_in_hindsight",
                  "search_best_fixed", "BASE_URL_ENV", "ReplayError", "ReplayOptions",
                  "replay", "vocabulary_from_model"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        assert hasattr(module, name)


def test_controller_package_import_stays_light() -> None:
    """The simulator imports the controller's policy; that must not pull in the Kubernetes
    client or the web framework (seconds of import time for every CLI call)."""
    import subprocess
    import sys

    code = ("import sys, pdscale.controller, pdscale.simulator; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('kubernetes', 'fastapi', 'uvicorn')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_spec_public_names() -> None:
    from pdscale import spec

    for name in spec.__all__:
        assert hasattr(spec, name), name
    assert {"Spec", "SpecError", "load_spec", "parse_spec"} <= set(spec.__all__)


def test_one_name_for_one_concept() -> None:
    """PoolKey is defined once (pdscale.spec) and the error tree has one base; every adapter's
    errors derive from its RetryLater/GiveUp split."""
    import re
    from pathlib import Path

    from pdscale.controller._kube import KubeRejected, KubeUnavailable
    from pdscale.controller._leader import LeaseRejected, LeaseUnavailable
    from pdscale.errors import GiveUp, RetryLater
    from pdscale.telemetry import PrometheusQueryError, PrometheusUnavailable

    root = Path(__file__).resolve().parent.parent
    defined = [p for p in (root / "pdscale").rglob("*.py")
               if re.search(r"^PoolKey\s*=", p.read_text(), re.M)]
    assert [p.relative_to(root).as_posix() for p in defined] == ["pdscale/spec.py"]
    for retry in (PrometheusUnavailable, KubeUnavailable, LeaseUnavailable):
        assert issubclass(retry, RetryLater)
    for give_up in (PrometheusQueryError, KubeRejected, LeaseRejected):
        assert issubclass(give_up, GiveUp)
