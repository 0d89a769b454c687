"""Prometheus rules from the spec: recording rules, tiered alerts, SLO burn-rate alerts, a
PrometheusRule, the Alertmanager route to pdscale's webhook, promtool unit tests, and the
alerts' runbooks (the runbooks page and the alert table of the docs)."""

from pdscale.alerts._promtool import ScenarioError, render_template, unit_tests
from pdscale.alerts._render import alert_files, alertmanager_config, dump_yaml, prometheus_rule
from pdscale.alerts._rules import AlertDef, TierDef, alert_defs, alerting_groups, recording_groups
from pdscale.alerts._runbooks import (
    RUNBOOKS,
    Runbook,
    RunbookCase,
    RunbookPanel,
    alerts_table,
    runbooks_page,
    with_alerts_table,
)

__all__ = [
    "RUNBOOKS",
    "AlertDef",
    "Runbook",
    "RunbookCase",
    "RunbookPanel",
    "ScenarioError",
    "TierDef",
    "alert_defs",
    "alert_files",
    "alerting_groups",
    "alertmanager_config",
    "alerts_table",
    "dump_yaml",
    "prometheus_rule",
    "recording_groups",
    "render_template",
    "runbooks_page",
    "unit_tests",
    "with_alerts_table",
]
