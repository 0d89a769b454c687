"""Telemetry: the signal catalog (engine metrics as PromQL for each pool) and the
Prometheus reader. OpenTelemetry self-instrumentation joins it with the controller's API.
"""

from telemetry._catalog import (
    CONTROL_PLANE_METRICS,
    KNOWN_METRICS,
    POOL_LABELS,
    SLO_OBJECTIVE_RECORD,
    SLO_THRESHOLD_RECORD,
    SLO_WINDOWS,
    Signal,
    SignalDef,
    UnknownSignal,
    engine_signals,
    le_matcher,
    metric_names_in,
    pool_expr,
    pool_query,
    recorded_name,
    signal_def,
    slo_error_ratio_expr,
    slo_error_ratio_record,
)
from telemetry._reader import (
    PrometheusAuth,
    PrometheusQueryError,
    PrometheusReader,
    PrometheusUnavailable,
    SignalValue,
)

__all__ = [
    "CONTROL_PLANE_METRICS",
    "KNOWN_METRICS",
    "POOL_LABELS",
    "SLO_OBJECTIVE_RECORD",
    "SLO_THRESHOLD_RECORD",
    "SLO_WINDOWS",
    "PrometheusAuth",
    "PrometheusQueryError",
    "PrometheusReader",
    "PrometheusUnavailable",
    "Signal",
    "SignalDef",
    "SignalValue",
    "UnknownSignal",
    "engine_signals",
    "le_matcher",
    "metric_names_in",
    "pool_expr",
    "pool_query",
    "recorded_name",
    "signal_def",
    "slo_error_ratio_expr",
    "slo_error_ratio_record",
]
