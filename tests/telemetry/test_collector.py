"""``pdscale generate otel-collector``: the Collector configuration against the Collector's
documented structure (reference/otel_collector.json; no Collector binary is installed here),
and its statements applied to engines' resources as OTTL documents them: the labels they put
on data points are those the pools' Prometheus selectors match."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdscale.cli import main
from pdscale.spec import Role, Spec, load_spec, parse_spec
from pdscale.telemetry import Signal, collector_config, collector_notes, series_refs
from tests.conftest import EXAMPLES, ROOT, example_ids

DOC = json.loads((Path(__file__).parent / "reference" / "otel_collector.json").read_text())
_ENV = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*\}")
_DURATION = re.compile(r"^\d+(ms|s|m|h)$")


def _kind_ok(kind: str, value: Any) -> bool:
    return {"string": isinstance(value, str), "int": isinstance(value, int)
            and not isinstance(value, bool), "bool": isinstance(value, bool),
            "duration": isinstance(value, str) and bool(_DURATION.match(value)),
            "map": isinstance(value, dict), "list": isinstance(value, list)}[kind]


def _check_keys(where: str, keys: dict[str, Any], value: Any, problems: list[str]) -> None:
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a mapping, got {value!r}")
        return
    for key, got in value.items():
        if key not in keys:
            problems.append(f"{where}.{key}: not a documented key ({', '.join(keys)})")
        elif isinstance(keys[key], dict):
            _check_keys(f"{where}.{key}", keys[key], got, problems)
        elif not _kind_ok(keys[key], got):
            problems.append(f"{where}.{key}: expected {keys[key]}, got {got!r}")


def _check_transform(where: str, config: dict[str, Any], problems: list[str]) -> None:
    doc = DOC["components"]["processors/transform"]
    if config.get("error_mode", "ignore") not in doc["error_modes"]:
        problems.append(f"{where}.error_mode: {config['error_mode']!r}")
    for signal, contexts in doc["contexts"].items():
        for group in config.get(signal, []):
            if isinstance(group, str):
                continue
            unknown = set(group) - set(doc["group_keys"])
            if unknown:
                problems.append(f"{where}.{signal}: undocumented group keys {unknown}")
            if group.get("context") not in (None, *contexts):
                problems.append(f"{where}.{signal}: context {group.get('context')!r}")
            for statement in group.get("statements", []):
                if _parse_statement(statement) is None:
                    problems.append(f"{where}.{signal}: not OTTL as documented: {statement}")


def structure_problems(config: dict[str, Any]) -> list[str]:
    """Where ``config`` leaves the Collector's documented structure (empty: none)."""
    problems: list[str] = []
    for key in config:
        if key not in DOC["top_level"]:
            problems.append(f"{key}: not a top-level section")
    problems += [f"{k}: missing" for k in DOC["required_top_level"] if k not in config]
    defined: set[str] = set()
    for section in ("receivers", "processors", "exporters"):
        for cid, body in config.get(section, {}).items():
            if not re.match(DOC["component_id"], cid):
                problems.append(f"{section}.{cid}: not a component id (type[/name])")
            doc = DOC["components"].get(f"{section}/{cid.split('/')[0]}")
            if doc is None:
                problems.append(f"{section}.{cid}: a component the reference does not hold")
                continue
            _check_keys(f"{section}.{cid}", doc["keys"], body or {}, problems)
            problems += [f"{section}.{cid}.{k}: required" for k in doc["required"]
                         if k not in (body or {})]
            if cid.startswith("transform"):
                _check_transform(f"{section}.{cid}", body, problems)
            defined.add(f"{section}/{cid}")
    service = config.get("service", {})
    _check_keys("service", {k: "map" if v == "map" else "list"
                            for k, v in DOC["service"]["keys"].items()}, service, problems)
    used: set[str] = set()
    for pid, pipeline in service.get("pipelines", {}).items():
        if not re.match(DOC["pipeline_id"], pid):
            problems.append(f"service.pipelines.{pid}: not a pipeline id")
        _check_keys(f"service.pipelines.{pid}", DOC["pipeline"]["keys"], pipeline, problems)
        problems += [f"service.pipelines.{pid}.{k}: required" for k in DOC["pipeline"]["required"]
                     if not pipeline.get(k)]
        for section in ("receivers", "processors", "exporters"):
            for cid in pipeline.get(section, []):
                if f"{section}/{cid}" not in defined:
                    problems.append(f"service.pipelines.{pid} names {section} {cid}, which "
                                    "is not configured")
                used.add(f"{section}/{cid}")
    problems += [f"{c}: configured but in no pipeline" for c in sorted(defined - used)]
    for text in re.findall(r"\$\{[^}]*\}", json.dumps(config)):
        if not _ENV.fullmatch(text):
            problems.append(f"{text}: not the documented ${{env:NAME}} form")
    return problems


# -- the OTTL the generator writes, read as LANGUAGE.md defines it ---------------------------

_STRING = r'"(?:[^"\\]|\\.)*"'
_PATH = rf'(?P<scope>resource\.)?attributes\[(?P<key>{_STRING})\]'


def _value(text: str, resource: dict[str, str], point: dict[str, str]) -> str | None:
    text = text.strip()
    if text == "nil":
        return None
    if re.fullmatch(_STRING, text):
        return str(json.loads(text))
    found = re.fullmatch(_PATH, text)
    if found:
        where = resource if found["scope"] else point
        return where.get(json.loads(found["key"]))
    concat = re.fullmatch(rf"Concat\(\[(?P<items>.*)\], (?P<sep>{_STRING})\)", text)
    if concat:
        parts = [_value(p, resource, point) for p in re.split(r", (?=[\"r])", concat["items"])]
        return str(json.loads(concat["sep"])).join("" if p is None else p for p in parts)
    raise ValueError(f"not an OTTL value this test reads: {text}")


def _parse_statement(statement: str) -> tuple[str, str, list[tuple[str, str, str]]] | None:
    """``set(target, value) where a op b and ...`` -> (target key, value text, conditions)."""
    found = re.fullmatch(rf'set\(attributes\[(?P<key>{_STRING})\], (?P<value>.+?)\)'
                         r"(?: where (?P<cond>.+))?", statement)
    if found is None:
        return None
    conditions = []
    for part in (found["cond"] or "").split(" and ") if found["cond"] else []:
        cmp = re.fullmatch(r"(.+) (==|!=) (.+)", part)
        if cmp is None:
            return None
        conditions.append((cmp[1], cmp[2], cmp[3]))
    return str(json.loads(found["key"])), found["value"], conditions


def apply_statements(statements: list[str], resource: dict[str, str],
                     point: dict[str, str]) -> dict[str, str]:
    """A data point's attributes after the datapoint-context statements ran on it."""
    point = dict(point)
    for statement in statements:
        parsed = _parse_statement(statement)
        assert parsed is not None, statement
        key, value, conditions = parsed
        if all((_value(a, resource, point) == _value(b, resource, point)) == (op == "==")
               for a, op, b in conditions):
            point[key] = _value(value, resource, point) or ""
    return point


def _selects(spec: Spec, labels: dict[str, str]) -> list[tuple[str, Role]]:
    """The pools whose engine selector (the running-requests series' matchers) matches
    ``labels``."""
    out = []
    for service in spec.services:
        for role in Role:
            ref = next(r for r in series_refs(Signal.RUNNING_REQUESTS, service, role)
                       if r.source == "eng")
            if all((re.fullmatch(v, labels.get(k, "")) is not None) if op == "=~"
                   else labels.get(k, "") == v for k, op, v in ref.matchers
                   if op in ("=", "=~")):
                out.append((service.name, role))
    return out


def _statements(config: dict[str, Any]) -> list[str]:
    groups = config["processors"]["transform/pdscale_labels"]["metric_statements"]
    assert [g["context"] for g in groups] == ["datapoint"]
    return list(groups[0]["statements"])


_RESOURCE_POOLS = """
version: 1
services:
  - name: bare
    namespace: hosts
    engine: vllm
    model_name: m
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill:
        target: {name: bare-prefill}
        max_replicas: 4
        selector: {resource_attributes: {service.name: bare-prefill}}
      decode:
        target: {name: bare-decode}
        max_replicas: 4
        selector: {resource_attributes: {service.name: bare-decode}}
controller:
  signal_sources: {default: otlp}
"""


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
def test_the_configuration_has_the_documented_structure(path: Path) -> None:
    config = collector_config(load_spec(path))
    assert structure_problems(config) == []


def test_the_structure_check_catches_what_the_collector_refuses() -> None:
    config = collector_config(load_spec(ROOT / "examples" / "vllm-otlp.yaml"))
    broken = json.loads(json.dumps(config))
    broken["exporters"]["prometheus"]["port"] = 8889
    broken["service"]["pipelines"]["metrics"]["processors"].append("filter")
    broken["processors"]["transform/pdscale_labels"]["metric_statements"][0]["context"] = "span"
    del broken["exporters"]["otlp/pdscale"]["endpoint"]
    problems = "\n".join(structure_problems(broken))
    for expected in ("prometheus.port: not a documented key", "names processors filter",
                     "context 'span'", "otlp/pdscale.endpoint: required"):
        assert expected in problems


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
def test_each_pools_resource_becomes_the_labels_its_selectors_read(path: Path) -> None:
    spec = load_spec(path)
    statements = _statements(collector_config(spec))
    for service in spec.services:
        for role, pool in service.pools.items():
            if service.engine.value == "dynamo" or service.engine.value == "tgi":
                continue  # their queue series come from the frontend / without model_name
            pod = pool.example_pods(1)[0]
            resource = {"k8s.namespace.name": service.namespace, "k8s.pod.name": pod,
                        "service.name": "vllm", **pool.selector.match_labels}
            labels = apply_statements(statements, resource, {"model_name": service.model_name})
            assert _selects(spec, labels) == [(service.name, role)], labels
            # Without the Kubernetes attributes nothing is made up: no pool is selected.
            bare = apply_statements(statements, {"service.name": "vllm"},
                                    {"model_name": service.model_name})
            assert "pod" not in bare and _selects(spec, bare) == []


def test_pools_selected_by_resource_attributes_get_namespace_and_pod() -> None:
    spec = parse_spec(_RESOURCE_POOLS)
    config = collector_config(spec)
    assert structure_problems(config) == [] and collector_notes(spec) == []
    statements = _statements(config)
    for role in Role:
        resource = {"service.name": f"bare-{role.value}", "service.instance.id": "host-7"}
        labels = apply_statements(statements, resource, {"model_name": "m"})
        assert labels["namespace"] == "hosts" and labels["pod"] == f"bare-{role.value}-host-7"
        assert _selects(spec, labels) == [("bare", role)]
    # Spans and metrics go on to pdscale's receiver, which this spec reads from.
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["otlp/pdscale"]
    assert "headers" not in config["exporters"]["otlp/pdscale"]  # no auth in the spec


def test_without_the_receiver_nothing_is_forwarded_to_pdscale() -> None:
    config = collector_config(load_spec(ROOT / "examples" / "vllm.yaml"))
    assert set(config["service"]["pipelines"]) == {"metrics"}
    assert "otlp/pdscale" not in config["exporters"]


def test_generate_otel_collector_writes_the_configuration(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    spec_path = ROOT / "examples" / "vllm-otlp.yaml"
    out = tmp_path / "collector"
    code = main(["generate", "otel-collector", str(spec_path), "--out", str(out),
                 "--pdscale-otlp-endpoint", "pdscale.ops.svc:14317"])
    assert code == 0, capsys.readouterr().err
    text = (out / "otel-collector.yaml").read_text()
    assert text.startswith("# OpenTelemetry Collector configuration generated by pdscale")
    assert "PDSCALE_OTLP_TOKEN" in text.split("receivers:")[0]  # the header says what to set
    written = yaml.safe_load(text)
    assert written == collector_config(load_spec(spec_path),
                                       pdscale_endpoint="pdscale.ops.svc:14317")
    assert written["exporters"]["otlp/pdscale"]["headers"] == {
        "authorization": "Bearer ${env:PDSCALE_OTLP_TOKEN}"}
