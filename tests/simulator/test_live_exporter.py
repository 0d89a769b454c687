"""The live simulator exports what each engine's release exports, per role, so that the e2e
tests meet the real shapes: every series the catalog reads for a pool is there, with labels
that satisfy the pool's selector, and nothing an engine does not export is."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pdscale.simulator import EventSimulator, synthetic_trace
from pdscale.simulator._live import LiveCluster
from pdscale.simulator._simulate import SimOptions, prepare
from pdscale.spec import Engine, Role, ServiceSpec, load_spec
from pdscale.telemetry import engine_signals, series_refs, slo_bucket_ref
from tests.conftest import ROOT

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}\s')


def _exposition(example: str) -> tuple[ServiceSpec, list[tuple[str, dict[str, str]]]]:
    spec = load_spec(ROOT / "examples" / f"{example}.yaml")
    service = spec.services[0]
    prepared = prepare(spec, SimOptions(duration_s=600, cold_start_s=20, mode="event"))
    sim = EventSimulator(prepared.setup, synthetic_trace(duration_s=600, mean_rps=8, seed=5))
    cluster = LiveCluster.for_service(sim, service)
    cluster.start(0.0)
    cluster.step(120.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(cluster)
    series = []
    for line in generate_latest(registry).decode().splitlines():
        found = _LINE.match(line)
        if found:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found.group(2)))
            series.append((found.group(1), labels))
    return service, series


def _matches(labels: dict[str, str], matchers: tuple[tuple[str, str, str], ...]) -> bool:
    for name, op, value in matchers:
        got = labels.get(name, "")
        ok = {"=": got == value, "!=": got != value,
              "=~": re.fullmatch(value, got) is not None,
              "!~": re.fullmatch(value, got) is None}[op]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("example", ["vllm", "sglang", "dynamo"])
def test_every_series_the_catalog_reads_is_exported(example: str) -> None:
    service, series = _exposition(example)
    for role in Role:
        refs = [r for s in engine_signals(service, role) for r in series_refs(s, service, role)]
        kind = "ttft" if role is Role.PREFILL else "itl"
        bucket = slo_bucket_ref(service, kind)  # type: ignore[arg-type]
        if bucket is not None:
            refs.append(bucket)
        for ref in refs:
            if ref.metric == "up" or ref.optional:
                continue
            assert any(name == ref.metric and _matches(labels, ref.matchers)
                       for name, labels in series), f"{example}/{role.value}: {ref.selector()}"


def test_dynamo_shapes_as_a_running_dynamo_exports_them() -> None:
    service, series = _exposition("dynamo")
    prefill = service.pools[Role.PREFILL].pod_regex
    prefill_pods = {labels["pod"] for _, labels in series
                    if re.fullmatch(prefill, labels.get("pod", ""))}
    assert prefill_pods
    for name, labels in series:
        if labels.get("pod") in prefill_pods:
            assert not name.startswith("vllm:"), name  # a prefill worker: no vllm:* at all
        if name.startswith("dynamo_frontend_"):
            assert "dynamo_namespace" not in labels and labels["model"] == service.model_name
        if name.startswith("vllm:"):
            assert "dynamo_component" not in labels  # re-exported: engine, model_name only
    ttft = {labels["le"] for name, labels in series
            if name == "dynamo_frontend_time_to_first_token_seconds_bucket"}
    assert {"0", "0.47", "1", "+Inf"} <= ttft  # Dynamo's log-spaced defaults


def test_sglang_and_vllm_export_their_own_names_only() -> None:
    for example, foreign in (("sglang", "vllm:"), ("vllm", "sglang:")):
        _, series = _exposition(example)
        assert not any(name.startswith((foreign, "dynamo_")) for name, _ in series)
    with pytest.raises(ValueError, match="tgi"):
        spec = load_spec(ROOT / "examples" / "vllm.yaml")
        raw = spec.services[0].model_dump(by_alias=True)
        raw["engine"] = Engine.TGI.value
        LiveCluster.for_service(None, ServiceSpec.model_validate(raw))  # type: ignore[arg-type]
