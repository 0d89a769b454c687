"""The generated rules and tests through the real promtool and amtool."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdscale.alerts import ScenarioError, alert_files, unit_tests
from pdscale.alerts._promtool import (
    humanize,
    humanize_duration,
    humanize_percentage,
    render_template,
)
from pdscale.spec import Spec, parse_spec
from tests.conftest import ROOT, need_tool
from tests.promtool_split import run_split, split


def _write(spec: Spec, out: Path) -> Path:
    for rel, text in alert_files(spec).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return out


def _only(tests_dir: Path, name: str, alert: str) -> str:
    """The part of the generated test file ``name`` that tests ``alert``, against the rules it
    reads (:func:`tests.promtool_split.split`); its name."""
    parts = split(tests_dir, name, only=alert)
    assert parts, f"no generated test of {alert} in {name}"
    return parts[0]


def test_promtool_checks_and_runs_generated_tests(example: tuple[str, Spec],
                                                  tmp_path: Path) -> None:
    """Every generated scenario passes, each alert's against the rules it reads (see
    tests/promtool_split.py; the whole files run as shipped in the next test)."""
    promtool = need_tool("promtool")
    _, spec = example
    out = _write(spec, tmp_path)
    rule_files = sorted(str(p) for p in (out / "rules").glob("*.yml"))
    check = subprocess.run([promtool, "check", "rules", *rule_files], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = sorted(p.name for p in (out / "tests").glob("*.test.yml"))
    assert len(tests) >= 2 * len(spec.services)
    results = run_split(promtool, out / "tests", tests)
    assert len(results) > len(tests)
    for result in results:
        assert result.returncode == 0, f"{result.args[-1]}: {result.stdout[-4000:]}"


def test_generated_test_files_run_as_shipped(tmp_path: Path) -> None:
    """A generated test file runs whole against the whole rule file, as a user runs it: one
    service's hour-window tests (the cheapest file: promtool replays every rule for every
    scenario, so a service's main file takes about a minute)."""
    promtool = need_tool("promtool")
    out = _write(parse_spec((ROOT / "examples" / "sglang.yaml").read_text()), tmp_path)
    (test,) = (out / "tests").glob("*.step5m.test.yml")
    result = subprocess.run([promtool, "test", "rules", test.name], cwd=test.parent,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-4000:]


def test_a_broken_rule_fails_the_generated_tests(tmp_path: Path) -> None:
    """The generated tests are real: a rule whose threshold drifted makes them fail."""
    promtool = need_tool("promtool")
    spec = parse_spec((ROOT / "examples" / "sglang.yaml").read_text())
    out = _write(spec, tmp_path)
    rules = out / "rules" / "qwen-sglang.rules.yml"
    text = rules.read_text()
    kv = 'pdscale_pool:kv_cache_usage:max{pdscale_service="qwen-sglang",pdscale_pool="decode"}'
    assert f"{kv} > 0.97" in text
    rules.write_text(text.replace(f"{kv} > 0.97", f"{kv} > 0.99"))
    only = _only(out / "tests", "qwen-sglang.test.yml", "LLMKVCacheNearFull")
    result = subprocess.run([promtool, "test", "rules", only],
                            cwd=out / "tests", capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "LLMKVCacheNearFull" in result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_config(example: tuple[str, Spec],
                                                tmp_path: Path) -> None:
    amtool = need_tool("amtool")
    _, spec = example
    path = tmp_path / "alertmanager.yaml"
    path.write_text(alert_files(spec)["alertmanager.yaml"])
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_thresholds_without_room_are_refused() -> None:
    import yaml

    raw = yaml.safe_load((ROOT / "examples" / "sglang.yaml").read_text())
    raw.setdefault("alerts", {})["thresholds"] = {"prefix_cache_hit_drop": {
        "warning": {"value": 0.3, "for": "15m"}, "critical": {"value": 0.31, "for": "5m"}}}
    spec = parse_spec(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match="LLMPrefixCacheHitRateDropped"):
        unit_tests(spec, {"qwen-sglang": "../rules/qwen-sglang.rules.yml"})


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (1234.5, "1.234k"), (0.275, "275m"), (12.5, "12.5"), (3e-6, "3u")])
def test_humanize_matches_prometheus(value: float, text: str) -> None:
    assert humanize(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (0.935, "93.5%"), (0.05, "5%"), (1.0, "100%")])
def test_humanize_percentage(value: float, text: str) -> None:
    assert humanize_percentage(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (0.75, "750ms"), (90, "1m 30s"), (3725, "1h 2m 5s"), (90061, "1d 1h 1m 1s"), (5, "5s")])
def test_humanize_duration(value: float, text: str) -> None:
    assert humanize_duration(value) == text


def test_render_template() -> None:
    assert render_template("{{ $labels.pod }} at {{ $value | humanizePercentage }}",
                           {"pod": "p-0"}, 0.5) == "p-0 at 50%"
    assert render_template("code {{ $value }}", {}, 79.0) == "code 79"


def test_drain_timeout_alert_is_generated_with_drains_and_passes_promtool(
        tmp_path: Path) -> None:
    """PDScaleDrainTimingOut exists only when controller.drain is on, reads the controller's
    own series, and its generated tests pass the real promtool."""
    promtool = need_tool("promtool")
    base = (ROOT / "examples" / "sglang.yaml").read_text()
    assert "PDScaleDrainTimingOut" not in str(alert_files(parse_spec(base)))
    spec = parse_spec(base + "\ncontroller:\n  drain: {enabled: true, timeout: 2m}\n")
    out = _write(spec, tmp_path)
    rules = (out / "rules" / "qwen-sglang.rules.yml").read_text()
    assert rules.count("alert: PDScaleDrainTimingOut") == 4  # two pools, two tiers
    assert ('pdscale_drain_timeouts_in_a_row{pdscale_service="qwen-sglang",'
            'pdscale_pool="decode"} > 3') in rules
    tests = (out / "tests" / "qwen-sglang.test.yml").read_text()
    assert "PDScaleDrainTimingOut" in tests
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    assert "\n## PDScaleDrainTimingOut\n" in runbooks
    check = subprocess.run([promtool, "check", "rules", str(out / "rules" /
                                                           "qwen-sglang.rules.yml")],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    only = _only(out / "tests", "qwen-sglang.test.yml", "PDScaleDrainTimingOut")
    result = subprocess.run([promtool, "test", "rules", only],
                            cwd=out / "tests", capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:]


def _vllm_rules(tmp_path: Path) -> tuple[Any, Callable[[str, list[dict[str, str]],
                                                        list[dict[str, Any]]], None]]:
    """The vLLM example's first service with its rules written under ``tmp_path``, and a
    runner that checks PromQL against them in promtool: (test name, input series, checks)."""
    import yaml

    promtool = need_tool("promtool")
    spec = parse_spec((ROOT / "examples" / "vllm.yaml").read_text())
    service = spec.services[0]
    out = _write(spec, tmp_path)

    def run(name: str, inputs: list[dict[str, str]], checks: list[dict[str, Any]],
            interval: str = "1m") -> None:
        test = {"rule_files": [f"../rules/{service.name}.rules.yml"],
                "evaluation_interval": "1m",
                "tests": [{"interval": interval, "input_series": inputs,
                           "promql_expr_test": checks}]}
        path = out / "tests" / f"{name}.test.yml"
        path.write_text(yaml.safe_dump(test, sort_keys=False))
        result = subprocess.run([promtool, "test", "rules", path.name], cwd=path.parent,
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]

    return service, run


def test_an_slo_threshold_off_the_engines_buckets_is_reported_not_read_as_no_burn(
        tmp_path: Path) -> None:
    """vLLM run with custom TTFT buckets that miss the spec's 0.5 s (the spec does not name
    them): every request takes about 0.7 s, so the SLO is burning, but the error ratios are
    empty. The slo_bucket absence alert says so instead of the silence reading as no burn."""
    from pdscale.alerts._promtool import _example_labels, _le, _series_text
    from pdscale.telemetry import slo_bucket_expr

    service, promtool_run = _vllm_rules(tmp_path)
    expr = slo_bucket_expr(service, "ttft")
    assert expr is not None
    base = _example_labels(expr, "vllm:time_to_first_token_seconds_bucket")
    assert base is not None
    metric = "vllm:time_to_first_token_seconds"
    inputs = [{"series": _series_text(f"{metric}_bucket", {**base, "le": _le(b)}),
               "values": f"0+{per_min}x60"}
              for b, per_min in ((0.25, 0), (1.0, 100), (2.5, 100), (float("inf"), 100))]
    inputs.append({"series": _series_text(f"{metric}_count", base), "values": "0+100x60"})
    pool = f'pdscale_service="{service.name}",pdscale_pool="prefill"'
    promtool_run("slo-bucket", inputs, [
        {"expr": f"count(pdscale_pool:ttft_slo_errors:ratio_rate5m{{{pool}}})",
         "eval_time": "40m", "exp_samples": []},
        {"expr": f'count(ALERTS{{alertname="LLMPoolMetricsAbsent",'
                 f'signal_group="slo_bucket",alertstate="firing",{pool}}})',
         "eval_time": "40m", "exp_samples": [{"labels": "{}", "value": 2}]}])


def test_gpu_memory_reads_without_the_reserved_field(tmp_path: Path) -> None:
    """An exporter whose counters lack DCGM_FI_DEV_FB_RESERVED left the memory ratio (and its
    alert) empty; it now reads used / (used + free)."""
    from pdscale.alerts._promtool import _example_labels, _series_text
    from pdscale.spec import Role
    from pdscale.telemetry import Signal, pool_expr, recorded_name

    service, promtool_run = _vllm_rules(tmp_path)
    expr = pool_expr(Signal.GPU_MEMORY_USED_MAX_RATIO, service, Role.DECODE)
    base = _example_labels(expr, "DCGM_FI_DEV_FB_USED")
    assert base is not None
    gpu = {**base, "gpu": "0"}
    inputs = [{"series": _series_text(m, gpu), "values": f"{v}x10"}
              for m, v in (("DCGM_FI_DEV_FB_USED", 72000), ("DCGM_FI_DEV_FB_FREE", 8000))]
    record = recorded_name(Signal.GPU_MEMORY_USED_MAX_RATIO)
    pool = f'pdscale_service="{service.name}",pdscale_pool="decode"'
    promtool_run("gpu-memory", inputs, [
        {"expr": f"{record}{{{pool}}}", "eval_time": "5m",
         "exp_samples": [{"labels": _series_text(record, {
             "namespace": service.namespace, "model_name": service.model_name,
             "pdscale_service": service.name, "pdscale_pool": "decode"}),
             "value": 0.9}]}])


def _subquery_steps(promtool: str, end_s: int, range_s: int, step_s: int) -> list[int]:
    """The steps of a subquery [range:step] evaluated at ``end_s``: Prometheus 2 takes both
    ends of the range, Prometheus 3 leaves its start out."""
    version = subprocess.run([promtool, "--version"], capture_output=True, text=True,
                             check=False).stdout
    first = end_s - range_s + (0 if "version 2." in version else step_s)
    return list(range(first, end_s + 1, step_s))


def test_the_dispersion_of_counted_tokens_reads_as_the_simulator_computes_it(
        tmp_path: Path) -> None:
    """Prompt tokens counted at 1,000/s and 200/s for 5 s each in turn, scraped every second:
    the tokens of the 5 s windows ending at the subquery's steps are 5,000 and 1,000 in turn,
    and the index of dispersion is half the mean squared difference of consecutive windows
    over their mean, the simulator's estimator (computed here on Prometheus' own steps). A
    steady stream reads 0, and so does a linear ramp to 10x its rate: the differences
    remove the trend (its variance over its mean would be large). Scraped every 10 s, windows
    hold fewer than two samples: empty, not zero, and ``pdscale check``'s probe sees it."""
    import numpy as np

    from pdscale._check import fine_samples_expr
    from pdscale.alerts._promtool import _example_labels, _series_text
    from pdscale.spec import Role
    from pdscale.telemetry import Signal, pool_expr

    service, promtool_run = _vllm_rules(tmp_path)
    expr = pool_expr(Signal.PROMPT_TOKENS_DISPERSION, service, Role.PREFILL)
    labels = _example_labels(expr, "vllm:prompt_tokens_total")
    assert labels is not None
    series = _series_text("vllm:prompt_tokens_total", labels)
    steps = _subquery_steps(need_tool("promtool"), 600, 300, 5)

    def counter(per_second: Any) -> list[float]:
        out = [0.0]
        for i in range(1, 721):
            out.append(out[-1] + per_second(i))
        return out

    def expected(values: list[float]) -> float:
        y = np.array([max(0.0, values[t] - values[t - 5]) for t in steps])
        dy = np.array([max(0.0, values[t] - values[t - 5]) - max(0.0, values[t - 5] -
                                                                values[t - 10]) for t in steps])
        return float(np.mean(dy ** 2) / 2 / np.mean(y))

    def check(name: str, values: list[float], want: float | None, interval: str = "1s"
              ) -> None:
        got = [] if want is None else [{"labels": _series_text(
            "", {"namespace": service.namespace}).lstrip(), "value": want}]
        promtool_run(name, [{"series": series, "values": " ".join(f"{v:g}" for v in values)}],
                     [{"expr": expr, "eval_time": "10m", "exp_samples": got}], interval=interval)

    clumped = counter(lambda i: 1000.0 if (i - 1) % 10 < 5 else 200.0)
    assert expected(clumped) == pytest.approx(16e6 / 2 / 3000, rel=0.02)
    check("dispersion", clumped, expected(clumped))
    check("dispersion-steady", counter(lambda i: 600.0), 0.0)
    ramp = counter(lambda i: 10.0 * i)
    y = np.array([ramp[t] - ramp[t - 5] for t in steps])
    assert y.var() / y.mean() > 500 and expected(ramp) < 2  # the trend, and without it
    check("dispersion-ramp", ramp, expected(ramp))
    check("dispersion-sparse", counter(lambda i: 600.0)[::10], None, interval="10s")
    probe = fine_samples_expr(series)
    promtool_run("probe", [{"series": series, "values": "0+600x720"}],
                 [{"expr": probe, "eval_time": "10m",
                   "exp_samples": [{"labels": "{}", "value": 6 if len(steps) == 61 else 5}]}],
                 interval="1s")
    promtool_run("probe-sparse", [{"series": series, "values": "0+6000x72"}],
                 [{"expr": probe, "eval_time": "10m",
                   "exp_samples": [{"labels": "{}", "value": 1}]}], interval="10s")


def _two_decode_pods(service: Any, signal: Any, metric: str
                     ) -> tuple[dict[str, str], dict[str, str]]:
    """Label sets of ``metric`` for two decode pods that the pool's expression of ``signal``
    selects (its first and second example pods)."""
    from pdscale.alerts._promtool import _example_labels
    from pdscale.spec import Role
    from pdscale.telemetry import pool_expr

    expr = pool_expr(signal, service, Role.DECODE)
    first = _example_labels(expr, metric, 0)
    second = _example_labels(expr, metric, 1)
    assert first is not None and second is not None and first["pod"] != second["pod"]
    return first, second


def test_an_xid_pages_for_the_event_not_for_the_gpus_history(tmp_path: Path) -> None:
    """DCGM_FI_DEV_XID_ERRORS holds the last XID code: a pod that lands on a GPU which once
    reported 79 inherits the value, and used to be drained for it. Only a change pages."""
    from pdscale.alerts._promtool import _series_text
    from pdscale.telemetry import Signal

    service, promtool_run = _vllm_rules(tmp_path)
    old, new = _two_decode_pods(service, Signal.GPU_XID_ERRORS, "DCGM_FI_DEV_XID_ERRORS")
    inputs = [
        # A pod scheduled on a GPU whose last XID was 79 long ago: the value, no change.
        {"series": _series_text("DCGM_FI_DEV_XID_ERRORS", {**old, "gpu": "0"}),
         "values": "79x40"},
        # Another GPU reports XID 79 at minute 10.
        {"series": _series_text("DCGM_FI_DEV_XID_ERRORS", {**new, "gpu": "1"}),
         "values": "0x9 79x30"},
    ]
    firing = 'ALERTS{alertname="LLMGPUXidError",alertstate="firing",severity="critical"}'
    promtool_run("xid", inputs, [
        {"expr": f"count by (pod, gpu) ({firing})", "eval_time": "13m",
         "exp_samples": [{"labels": _series_text("", {"pod": new["pod"], "gpu": "1"}),
                          "value": 1}]},
        {"expr": f"count({firing})", "eval_time": "35m", "exp_samples": []}])


def test_the_vllm_queue_falls_back_per_pod_during_a_rolling_upgrade(tmp_path: Path) -> None:
    """A newer vLLM pod breaks its queue down by reason, an older one does not: the pool's
    queue is the newer pod's capacity wait plus the older pod's whole queue (the fallback
    was per pool, so the older pods' queues vanished while both ran)."""
    from pdscale.alerts._promtool import _series_text
    from pdscale.telemetry import Signal, recorded_name

    service, promtool_run = _vllm_rules(tmp_path)
    new, old = _two_decode_pods(service, Signal.QUEUE_DEPTH, "vllm:num_requests_waiting")
    inputs = [
        {"series": _series_text("vllm:num_requests_waiting_by_reason",
                                {**new, "reason": "capacity"}), "values": "3x10"},
        {"series": _series_text("vllm:num_requests_waiting_by_reason",
                                {**new, "reason": "deferred"}), "values": "2x10"},
        {"series": _series_text("vllm:num_requests_waiting", new), "values": "5x10"},
        {"series": _series_text("vllm:num_requests_waiting", old), "values": "4x10"},
    ]
    record = recorded_name(Signal.QUEUE_DEPTH)
    pool = f'pdscale_service="{service.name}",pdscale_pool="decode"'
    promtool_run("queue", inputs, [
        {"expr": f"sum({record}{{{pool}}})", "eval_time": "5m",
         "exp_samples": [{"labels": "{}", "value": 7}]}])
