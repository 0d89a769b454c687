from __future__ import annotations

import yaml

from pdscale.alerts import (
    alert_defs,
    alert_files,
    alerting_groups,
    alertmanager_config,
    prometheus_rule,
)
from pdscale.spec import Engine, Role, Spec

ALWAYS = {
    "LLMKVCacheNearFull", "LLMGPUMemoryNearFull", "LLMGPUTemperatureHigh", "LLMGPUXidError",
    "LLMPoolTargetDown", "LLMPoolScalingStuck", "PDScaleControlPlaneDegraded",
    "LLMQueueBacklogHigh", "LLMQueueGrowing", "LLMPoolMetricsAbsent",
}
PREFILL = {"LLMTimeToFirstTokenHigh", "LLMPrefixCacheHitRateDropped",
           "LLMTimeToFirstTokenSLOBudgetBurn"}
DECODE = {"LLMInterTokenLatencyHigh", "LLMInterTokenLatencySLOBudgetBurn"}


def _rules(spec: Spec) -> list[dict]:
    return [r for g in alerting_groups(spec) for r in g["rules"]]


def test_each_alert_exists_in_both_tiers(example: tuple[str, Spec]) -> None:
    _, spec = example
    rules = _rules(spec)
    for service in spec.services:
        for role in Role:
            expected = ALWAYS | (PREFILL if role is Role.PREFILL else DECODE)
            if service.engine is Engine.TGI:  # no TTFT histogram, no prefix-cache series
                expected -= PREFILL
            if service.engine is Engine.DYNAMO and role is Role.PREFILL:
                expected -= {"LLMKVCacheNearFull"}  # a Dynamo prefill worker exports no KV
            mine = [r for r in rules if r["labels"]["pdscale_service"] == service.name
                    and r["labels"]["pdscale_pool"] == role.value]
            by_name: dict[str, set[str]] = {}
            for r in mine:
                by_name.setdefault(r["alert"], set()).add(r["labels"]["severity"])
            assert expected <= set(by_name), expected - set(by_name)
            for name, severities in by_name.items():
                assert severities == {"warning", "critical"}, name


def test_preemption_and_error_alerts_follow_the_catalog(example: tuple[str, Spec]) -> None:
    _, spec = example
    names = {(r["labels"]["pdscale_service"], r["alert"]) for r in _rules(spec)}
    for service in spec.services:
        has_preempt = (service.name, "LLMPreemptionsRising") in names
        # SGLang counts them as retractions (0.5.23); TGI exports none.
        assert has_preempt == (service.engine is not Engine.TGI)
        has_transfer = (service.name, "LLMKVTransferFailing") in names
        assert has_transfer == (service.engine in (Engine.VLLM, Engine.SGLANG))
        assert has_transfer == ((service.name, "LLMKVHandoffFailing") in names)


def test_absence_alert_per_signal_group(example: tuple[str, Spec]) -> None:
    """Each signal group's recorded series is watched, so a selector that goes empty pages."""
    _, spec = example
    for service in spec.services:
        for role in Role:
            rules = [r for r in _rules(spec) if r["alert"] == "LLMPoolMetricsAbsent"
                     and r["labels"]["pdscale_service"] == service.name
                     and r["labels"]["pdscale_pool"] == role.value]
            groups = {r["labels"]["signal_group"] for r in rules}
            expected = {"latency", "queue", "kv", "tokens", "errors", "gpu"}
            if service.engine is Engine.DYNAMO and role is Role.PREFILL:
                expected -= {"kv"}
            if service.engine is Engine.DYNAMO and role is Role.DECODE:
                expected -= {"errors"}  # the frontend's errors are the service's, on prefill
            # The SLO histogram's bucket at the threshold (TGI has no TTFT histogram).
            if not (service.engine is Engine.TGI and role is Role.PREFILL):
                expected |= {"slo_bucket"}
            assert groups == expected, (service.name, role)
            for r in rules:
                assert r["expr"].startswith("absent(pdscale_pool:")
                assert r["labels"]["signal_group"] in r["annotations"]["description"]


def test_labels_and_annotations(example: tuple[str, Spec]) -> None:
    _, spec = example
    for rule in _rules(spec):
        labels, ann = rule["labels"], rule["annotations"]
        assert labels["severity"] in ("warning", "critical")
        for key in ("namespace", "model_name", "pdscale_service", "pdscale_pool"):
            assert labels[key]
        for key, value in spec.alerts.extra_labels.items():
            assert labels[key] == value
        assert set(ann) == {"summary", "description", "runbook_url"}
        assert ann["runbook_url"] == spec.alerts.runbook_url(rule["alert"])
        assert rule["alert"].lower() in ann["runbook_url"]
        assert "{{" not in ann["summary"]


def test_thresholds_come_from_the_spec() -> None:
    from pdscale.spec import parse_spec
    from tests.conftest import ROOT

    raw = yaml.safe_load((ROOT / "examples" / "vllm.yaml").read_text())
    raw["alerts"]["thresholds"] = {"kv_cache_usage": {
        "warning": {"value": 0.8, "for": "7m"}, "critical": {"value": 0.95, "for": "2m"}}}
    spec = parse_spec(yaml.safe_dump(raw))
    kv = [r for r in _rules(spec) if r["alert"] == "LLMKVCacheNearFull"
          and r["labels"]["pdscale_service"] == "llama-chat"
          and r["labels"]["pdscale_pool"] == "decode"]
    by_sev = {r["labels"]["severity"]: r for r in kv}
    assert by_sev["warning"]["expr"].endswith("> 0.8") and by_sev["warning"]["for"] == "7m"
    assert by_sev["critical"]["expr"].endswith("> 0.95") and by_sev["critical"]["for"] == "2m"


def test_ttft_threshold_is_a_multiple_of_the_slo(example: tuple[str, Spec]) -> None:
    _, spec = example
    for service in spec.services:
        rules = [r for r in _rules(spec) if r["alert"] == "LLMTimeToFirstTokenHigh"
                 and r["labels"]["pdscale_service"] == service.name]
        if not rules:
            continue
        th = spec.alerts.thresholds.ttft_high
        by_sev = {r["labels"]["severity"]: r["expr"] for r in rules}
        assert by_sev["warning"].endswith(f"> {service.slo.ttft_p95_s * th.warning.value:g}")
        assert by_sev["critical"].endswith(f"> {service.slo.ttft_p95_s * th.critical.value:g}")


def test_scaling_stuck_waits_multiples_of_the_cold_start(example: tuple[str, Spec]) -> None:
    _, spec = example
    th = spec.alerts.thresholds.scaling_stuck
    for d in alert_defs(spec):
        if d.name != "LLMPoolScalingStuck":
            continue
        cold = d.service.pools[d.role].cold_start
        fors = {t.severity: t.for_s for t in d.tiers}
        assert fors["warning"] >= th.warning.value * cold
        assert fors["critical"] >= th.critical.value * cold
        assert fors["critical"] > fors["warning"]


def test_burn_rate_windows_and_factors(example: tuple[str, Spec]) -> None:
    _, spec = example
    burns = [r for r in _rules(spec) if r["alert"].endswith("SLOBudgetBurn")]
    assert burns
    windows = {(r["labels"]["severity"], r["labels"]["long"], r["labels"]["short"], r["for"])
               for r in burns}
    assert windows == {("critical", "1h", "5m", "2m"), ("critical", "6h", "30m", "15m"),
                       ("warning", "1d", "2h", "1h"), ("warning", "3d", "6h", "3h")}
    service = spec.services[0]
    budget = 1 - service.slo.objective
    fast = next(r for r in burns if r["labels"]["long"] == "1h"
                and r["labels"]["pdscale_service"] == service.name)
    assert f"> {14.4 * budget!r}" in fast["expr"] or f"> {14.4 * budget:g}" in fast["expr"]


def test_alertmanager_route_and_inhibition(example: tuple[str, Spec]) -> None:
    _, spec = example
    config = alertmanager_config(spec)
    route = config["route"]["routes"][0]
    assert 'severity=~"critical|warning"' in route["matchers"]
    assert route["receiver"] == spec.alerts.webhook.receiver and route["continue"] is True
    hook = next(r for r in config["receivers"] if r["name"] == route["receiver"])
    assert hook["webhook_configs"][0]["url"] == spec.alerts.webhook.url
    inhibit = config["inhibit_rules"][0]
    assert inhibit["source_matchers"] == ['severity="critical"']
    assert inhibit["target_matchers"] == ['severity="warning"']
    assert {"namespace", "alertname"} <= set(inhibit["equal"])


def test_prometheus_rule_manifest(example: tuple[str, Spec]) -> None:
    _, spec = example
    manifest = prometheus_rule(spec)
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    for key, value in spec.alerts.prometheus_rule.labels.items():
        assert manifest["metadata"]["labels"][key] == value
    rendered = yaml.safe_load(alert_files(spec)["prometheusrule.yaml"])
    assert rendered == manifest


def test_output_is_deterministic(example: tuple[str, Spec]) -> None:
    _, spec = example
    assert alert_files(spec) == alert_files(spec)


def test_recording_rules_carry_pool_labels(example: tuple[str, Spec]) -> None:
    from pdscale.alerts import recording_groups

    _, spec = example
    for group in recording_groups(spec):
        for rule in group["rules"]:
            assert rule["record"].count(":") == 2  # level:metric:operation
            assert {"pdscale_service", "pdscale_pool", "model_name"} <= set(rule["labels"])


def test_every_alert_has_a_runbook_section(example: tuple[str, Spec]) -> None:
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "runbooks.md").read_text()
    headings = {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}
    _, spec = example
    assert {r["alert"] for r in _rules(spec)} <= headings
