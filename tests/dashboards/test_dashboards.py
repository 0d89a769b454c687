from __future__ import annotations

import json

import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from pdscale.dashboards import build_dashboards, dashboard_files, panel_queries
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


def test_the_drain_panel_comes_with_drains_and_reads_known_series() -> None:
    from pdscale.spec import parse_spec
    from pdscale.telemetry import CONTROL_PLANE_METRICS, metric_names_in
    from tests.conftest import ROOT

    base = (ROOT / "examples" / "vllm.yaml").read_text()

    def drain_queries(text: str) -> list[str]:
        doc = next(d for d in build_dashboards(parse_spec(text)) if d.uid.endswith("autoscaler"))
        return [e for t, _, e in panel_queries(doc.model) if t == "Scale-down drains"]

    assert drain_queries(base) == []
    queries = drain_queries(base + "\ncontroller:\n  drain: {enabled: true}\n")
    assert len(queries) == 3
    read = set().union(*(metric_names_in(q) for q in queries))
    assert read == {"pdscale_drain_replicas", "pdscale_drain_ended_total",
                    "pdscale_drain_cut_requests_total"}
    assert read <= CONTROL_PLANE_METRICS


def test_slo_attainment_turns_green_at_each_services_own_objective(
        example: tuple[str, Spec]) -> None:
    """A fixed 0.99 threshold showed the SGLang example (objective 0.995) green at 0.992."""
    _, spec = example
    files = dashboard_files(spec)
    overview = json.loads(next(v for k, v in files.items()
                               if k.endswith("overview.json")))
    panels = [p for p in overview["panels"] if "SLO attainment" in p.get("title", "")]
    assert len(panels) == 2
    for panel in panels:
        by_service = {o["matcher"]["options"]: o["properties"][0]["value"]["steps"][1]["value"]
                      for o in panel["fieldConfig"]["overrides"]
                      if o["matcher"]["id"] == "byName"}
        assert by_service == {s.name: s.slo.objective for s in spec.services}
        assert all(t["legendFormat"] == "{{pdscale_service}}" for t in panel["targets"])


def _stage_row(spec: Spec) -> list[tuple[str, str]]:
    """(panel title, expr) of the prefill dashboard's TTFT-by-stage row, empty without it."""
    doc = next(d for d in build_dashboards(spec) if d.uid.endswith("-prefill"))
    panels = doc.model["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"
            and p["title"].startswith("TTFT by stage")]
    if not rows:
        return []
    return [(p["title"], t["expr"]) for p in panels[rows[0] + 1:] for t in p["targets"]]


def test_ttft_by_stage_is_charted_where_spans_give_the_stages() -> None:
    from pdscale.spec import load_spec
    from pdscale.telemetry import STAGE_SIGNALS, recorded_name
    from tests.conftest import ROOT

    spec = load_spec(ROOT / "examples" / "vllm-otlp.yaml")
    queries = _stage_row(spec)
    titles = {title for title, _ in queries}
    assert titles == {"TTFT p95 by stage, prefill pool", "TTFT p95 by stage, decode pool"}
    for role in ("prefill", "decode"):
        exprs = [e for t, e in queries if role in t]
        for signal in STAGE_SIGNALS:  # vLLM's spans give all three
            assert any(e.startswith(recorded_name(signal) + "{") and
                       f'pdscale_pool="{role}"' in e for e in exprs), (role, signal)
    # Without the OTLP receiver no span gives a stage: no row.
    assert _stage_row(load_spec(ROOT / "examples" / "vllm.yaml")) == []
