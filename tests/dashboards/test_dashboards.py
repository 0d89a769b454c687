from __future__ import annotations

import json

import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import build_dashboards, dashboard_files, panel_queries
from pdscale.spec import Spec

EXPECTED = {"overview", "prefill", "decode", "cache", "gpus", "autoscaler"}


def test_six_dashboards_with_stable_uids(example: tuple[str, Spec]) -> None:
    _, spec = example
    docs = build_dashboards(spec)
    prefix = spec.dashboards.uid_prefix
    assert {d.uid for d in docs} == {f"{prefix}-{k}" for k in EXPECTED}
    assert [d.uid for d in docs] == [d.uid for d in build_dashboards(spec)]


def test_every_query_has_a_unique_ref_id(example: tuple[str, Spec]) -> None:
    _, spec = example
    for doc in build_dashboards(spec):
        queries = panel_queries(doc.model)
        assert queries, doc.uid
        per_panel: dict[str, list[str]] = {}
        for title, ref, expr in queries:
            assert ref, f"{doc.uid}/{title} has a query without refId"
            assert expr
            per_panel.setdefault(title, []).append(ref)
        for title, refs in per_panel.items():
            assert len(refs) == len(set(refs)), f"{doc.uid}/{title}"


def test_variables_and_datasource(example: tuple[str, Spec]) -> None:
    _, spec = example
    for doc in build_dashboards(spec):
        variables = {v["name"]: v for v in doc.model["templating"]["list"]}
        assert set(variables) == {"datasource", "namespace", "model_name"}
        assert variables["datasource"]["query"] == "prometheus"
        for panel in doc.model["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_panel_ids_are_unique(example: tuple[str, Spec]) -> None:
    _, spec = example
    for doc in build_dashboards(spec):
        ids = [p["id"] for p in doc.model["panels"]]
        assert len(ids) == len(set(ids)) and 0 not in ids


def test_models_round_trip_through_the_sdk_types(example: tuple[str, Spec]) -> None:
    _, spec = example
    for doc in build_dashboards(spec):
        typed = Dashboard.from_json(doc.model)
        assert typed.uid == doc.uid
        assert len(typed.panels or []) == len(doc.model["panels"])


def test_files_are_byte_identical_across_runs(example: tuple[str, Spec]) -> None:
    _, spec = example
    assert dashboard_files(spec) == dashboard_files(spec)


def test_configmaps_for_the_grafana_sidecar(example: tuple[str, Spec]) -> None:
    _, spec = example
    files = dashboard_files(spec)
    for doc in build_dashboards(spec):
        cm = yaml.safe_load(files[f"configmaps/{doc.uid}.yaml"])
        assert cm["kind"] == "ConfigMap"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == spec.dashboards.configmap.namespace
        assert json.loads(cm["data"][f"{doc.uid}.json"]) == doc.model


def _units(model: dict) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        out[panel["title"]] = (unit, [t["expr"] for t in panel.get("targets", [])])
    return out


def test_controller_health_panels_have_one_unit_each(example: tuple[str, Spec]) -> None:
    """Errors per second, tick seconds and the 0/1 lease were once on one axis."""
    _, spec = example
    board = next(d for d in build_dashboards(spec) if d.uid.endswith("-autoscaler"))
    for unit, exprs in _units(board.model).values():
        kinds = {kind for expr in exprs for kind, name in (
            ("errors", "pdscale_adapter_errors_total"),
            ("seconds", "pdscale_tick_duration_seconds"),
            ("lease", "pdscale_leader")) if name in expr}
        assert len(kinds) <= 1, (unit, exprs)
        if kinds == {"seconds"}:
            assert unit == "s"
