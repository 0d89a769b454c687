"""Prometheus rules from the spec: recording rules, tiered alerts, SLO burn-rate alerts, a
PrometheusRule, the Alertmanager route to pdscale's webhook, and promtool unit tests."""

from pdscale.alerts._promtool import ScenarioError, render_template, unit_tests
from pdscale.alerts._render import alert_files, alertmanager_config, dump_yaml, prometheus_rule
from pdscale.alerts._rules import AlertDef, TierDef, alert_defs, alerting_groups, recording_groups

__all__ = [
    "AlertDef",
    "ScenarioError",
    "TierDef",
    "alert_defs",
    "alert_files",
    "alerting_groups",
    "alertmanager_config",
    "dump_yaml",
    "prometheus_rule",
    "recording_groups",
    "render_template",
    "unit_tests",
]
