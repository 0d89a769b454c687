"""Telemetry: the signal catalog (engine metrics as PromQL for each pool), the Prometheus
reader, and the controller's self-instrumentation with OpenTelemetry.
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
from telemetry._instrument import ControllerTelemetry
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
    "ControllerTelemetry",
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
