from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdscale.spec import (
    Engine,
    Role,
    SpecError,
    format_duration,
    load_spec,
    parse_duration,
    parse_spec,
)
from tests.conftest import EXAMPLES

BASE = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: m
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, max_replicas: 4}
      decode: {target: {name: chat-decode}, max_replicas: 4}
"""


def _raw() -> dict:
    return yaml.safe_load(BASE)


def _problems(raw: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(raw))
    return {p.path: str(p) for p in info.value.problems}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_valid(path: Path) -> None:
    spec = load_spec(path)
    for service in spec.services:
        assert set(service.pools) == {Role.PREFILL, Role.DECODE}


def test_defaults_and_derived_values() -> None:
    spec = parse_spec(BASE)
    svc = spec.services[0]
    assert svc.engine is Engine.VLLM
    assert svc.prefill.min_replicas == 1
    assert svc.prefill.cold_start == 60
    assert svc.prefill.pod_regex == "chat-prefill-.*"
    assert svc.slo.objective == 0.99 and svc.slo.window == 30 * 86400
    assert spec.alerts.thresholds.ttft_high.critical.for_ == 180


def test_every_problem_is_reported_at_once() -> None:
    raw = _raw()
    svc = raw["services"][0]
    svc["engine"] = "triton"  # unknown engine
    svc["pools"]["prefill"]["min_replicas"] = 9  # min > max
    svc["pools"]["decode"]["colour"] = "blue"  # unknown field
    raw["services"].append(dict(raw["services"][0]))  # duplicate name
    problems = _problems(raw)
    assert "services[0].engine" in problems
    assert "'vllm'" in problems["services[0].engine"]
    assert "services[0].pools.prefill.min_replicas" in problems
    assert "at most max_replicas (4)" in problems["services[0].pools.prefill.min_replicas"]
    assert "services[0].pools.decode.colour" in problems
    assert "services[1].name" in problems
    assert "already used by services[0]" in problems["services[1].name"]


def test_a_field_removed_with_the_rule_based_sizing_is_named_as_removed() -> None:
    """A spec written for the rule-based sizing fails on each field that went with it, saying
    so and what replaced it; a misspelt field still reads as one."""
    raw = _raw()
    raw["controller"] = {"burst_window": "1h", "drain_time": "1m", "sizing": {"model": "rules"},
                         "stabilisaton": "5m"}
    problems = _problems(raw)
    for path, instead in (("controller.burst_window", "controller.stabilisation"),
                          ("controller.drain_time", "lead"),
                          ("controller.sizing.model", "the only sizing")):
        assert "removed with the rule-based sizing" in problems[path], problems[path]
        assert "Fix: remove it;" in problems[path] and instead in problems[path]
    assert "check its spelling" in problems["controller.stabilisaton"]
    assert "removed" not in problems["controller.stabilisaton"]


def test_slo_threshold_off_bucket_names_nearest_boundaries() -> None:
    raw = _raw()
    raw["services"][0]["slo"]["ttft_p95_s"] = 2.0  # vLLM has 1.0 and 2.5, no 2.0
    problems = _problems(raw)
    text = problems["services[0].slo.ttft_p95_s"]
    assert "nearest boundaries: 1, 2.5" in text
    assert "Fix:" in text


def test_custom_buckets_make_a_threshold_valid() -> None:
    raw = _raw()
    raw["services"][0]["slo"]["ttft_p95_s"] = 2.0
    raw["services"][0]["histogram_buckets"] = {"ttft": [0.5, 1, 2, 4]}
    spec = parse_spec(yaml.safe_dump(raw))
    assert spec.services[0].buckets("ttft") == (0.5, 1.0, 2.0, 4.0)


def test_sglang_buckets_differ_from_vllm() -> None:
    raw = _raw()
    raw["services"][0]["engine"] = "sglang"
    problems = _problems(raw)  # 0.5 is not an SGLang TTFT bucket; 0.05 not an ITL one
    assert "nearest boundaries: 0.4, 0.6" in problems["services[0].slo.ttft_p95_s"]
    assert "nearest boundaries: 0.04, 0.06" in problems["services[0].slo.itl_p95_s"]


def test_dynamo_needs_its_section() -> None:
    raw = _raw()
    raw["services"][0]["engine"] = "dynamo"
    assert "services[0].dynamo" in _problems(raw)


def test_missing_pool_and_bad_regex() -> None:
    raw = _raw()
    del raw["services"][0]["pools"]["decode"]
    raw["services"][0]["pools"]["prefill"]["selector"] = {"pod_regex": "chat-(["}
    problems = _problems(raw)
    assert "services[0].pools.decode" in problems
    assert "services[0].pools.prefill.selector.pod_regex" in problems


def test_tiers_must_rise_with_severity() -> None:
    raw = _raw()
    raw["alerts"] = {"thresholds": {"kv_cache_usage": {
        "warning": {"value": 0.95, "for": "10m"}, "critical": {"value": 0.9, "for": "3m"}}}}
    problems = _problems(raw)
    assert "more than the warning value (0.95)" in \
        problems["alerts.thresholds.kv_cache_usage.critical.value"]


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("services: [\n  - name: x\n")
    assert info.value.problems[0].path.startswith("line ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "absent.yaml")
    assert "readable YAML file" in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("5m", 300), ("1h30m", 5400), ("3d", 259200), (45, 45), ("0s", 0)])
def test_parse_duration(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "m5", "", "-1s", True, [1]])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize(("seconds", "text"), [(600, "10m"), (5400, "1h30m"), (0, "0s"),
                                               (86400 * 3, "3d"), (61, "1m1s")])
def test_format_duration_round_trips(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_an_objective_no_burn_rate_tier_can_page_on_is_refused() -> None:
    """With the default factors (14.4 the largest) an objective of 0.9 puts the fast-burn
    threshold at an error ratio of 1.44, which no ratio reaches: the page and its scale-up
    reaction would be lost without a word."""
    raw = _raw()
    raw["services"][0]["slo"]["objective"] = 0.9
    text = _problems(raw)["services[0].slo.objective"]
    assert "above 0.9306" in text and "burn_rate_factors" in text and "under 10" in text
    raw["alerts"] = {"thresholds": {"burn_rate_factors": [8, 5, 3, 1]}}
    assert parse_spec(yaml.safe_dump(raw)).services[0].slo.objective == 0.9
    raw = _raw()
    raw["services"][0]["slo"]["objective"] = 0.95  # 14.4 x 0.05 = 0.72: every tier can fire
    assert parse_spec(yaml.safe_dump(raw)).services[0].slo.objective == 0.95


def test_a_relative_profile_path_is_the_file_beside_the_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile: mine.yaml` next to the spec worked only from the spec's own folder."""
    from pdscale.cli import main
    from tests.conftest import ROOT

    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "mine.yaml").write_text(
        (ROOT / "pdscale" / "controller" / "profiles" / "dynamo-mocker-1.6.1.yaml").read_text())
    raw = _raw()
    raw["services"][0]["pools"]["prefill"]["profile"] = "mine.yaml"
    (folder / "spec.yaml").write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_spec(folder / "spec.yaml")
    assert spec.services[0].prefill.profile == str(folder / "mine.yaml")
    assert spec.services[0].decode.profile == "h100-80gb-llama-3.1-8b"  # a name stays one
    assert main(["validate", str(folder / "spec.yaml")]) == 0
