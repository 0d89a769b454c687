"""Grafana dashboards from the spec (grafana-foundation-sdk), and provisioning ConfigMaps."""

from pdscale.dashboards._build import DashboardDoc, build_dashboards, dashboard_files, panel_queries

__all__ = ["DashboardDoc", "build_dashboards", "dashboard_files", "panel_queries"]
