"""`pdscale validate` against the engines' real buckets and labels (issue 13): a threshold off
the buckets the engine will expose, or a selector on a label nothing provides, is refused with
the pool, the expected value and the fix; nothing is written."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pdscale.cli import main
from pdscale.spec import SpecError, parse_spec
from tests.conftest import ROOT


def _dynamo() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "dynamo.yaml").read_text())
    return raw


def _problems(raw: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(raw))
    return {p.path: str(p) for p in info.value.problems}


def test_dynamo_default_buckets_refuse_half_a_second_with_the_setting() -> None:
    raw = _dynamo()
    raw["services"][0]["slo"].update(ttft_p95_s=0.5, itl_p95_s=0.05)
    problems = _problems(raw)
    ttft = problems["services[0].slo.ttft_p95_s"]
    assert "Dynamo 1.6.1's default TTFT histogram" in ttft
    assert "nearest boundaries: 0.47, 1" in ttft
    assert "DYN_METRICS_TTFT_MIN=0.0005 DYN_METRICS_TTFT_MAX=500 DYN_METRICS_TTFT_COUNT=19" in ttft
    assert "nearest boundaries: 0.035, 0.064" in problems["services[0].slo.itl_p95_s"]


def test_declared_dynamo_settings_make_the_threshold_a_boundary() -> None:
    raw = _dynamo()
    raw["services"][0]["slo"].update(ttft_p95_s=0.5, itl_p95_s=0.05)
    raw["services"][0]["dynamo"]["histograms"] = {
        "ttft": {"min": 0.0005, "max": 500, "count": 19},
        "itl": {"min": 0.00005, "max": 50, "count": 19}}
    spec = parse_spec(yaml.safe_dump(raw))
    assert 0.5 in (spec.services[0].buckets("ttft") or ())


def test_the_dynamo_example_validates_on_default_boundaries() -> None:
    spec = parse_spec((ROOT / "examples" / "dynamo.yaml").read_text())
    service = spec.services[0]
    assert service.slo.ttft_p95_s in (service.buckets("ttft") or ())
    assert service.slo.itl_p95_s in (service.buckets("itl") or ())
    assert service.dynamo is not None and not service.dynamo.histograms


def test_a_selector_label_nothing_provides_is_refused() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "vllm.yaml").read_text())
    del raw["services"][1]["scrape_labels"]
    problems = _problems(raw)
    text = problems["services[1].pools.prefill.selector.match_labels.llm_d_role"]
    assert "vllm 0.34.0" in text and "add it to services[1].scrape_labels" in text


def test_a_scrape_without_pod_is_refused() -> None:
    raw = _dynamo()
    raw["services"][0]["scrape_labels"] = ["namespace", "instance"]
    assert "'pod' among the scrape labels" in _problems(raw)["services[0].scrape_labels"]


def test_validate_says_where_pool_identity_comes_from(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Any) -> None:
    assert main(["validate", str(ROOT / "examples" / "dynamo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "dynamo 1.6.1" in out and "only your scrape config provides" in out
    raw = _dynamo()
    raw["services"][0]["slo"]["ttft_p95_s"] = 0.5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["validate", str(path)]) == 2
    assert "services[0].slo.ttft_p95_s" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
