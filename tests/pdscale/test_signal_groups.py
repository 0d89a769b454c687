"""A service declares whether its GPUs are scraped (``gpu_metrics``): without a DCGM exporter
(the loopback Dynamo stack) pdscale generates no GPU rule or alert, no absence alert for the
gpu group, and ``pdscale check`` lists no DCGM series it cannot find."""

from __future__ import annotations

from pathlib import Path

from pdscale._check import check_spec, render_table
from pdscale.alerts import alert_defs, recording_groups
from pdscale.spec import Spec, load_spec
from tests.conftest import ROOT


def _spec(gpu: bool) -> Spec:
    spec = load_spec(ROOT / "examples" / "dynamo.yaml")
    service = spec.services[0].model_copy(update={"gpu_metrics": gpu})
    return spec.model_copy(update={"services": (service,)})


def _absent_groups(spec: Spec) -> set[str]:
    return {t.labels["signal_group"] for d in alert_defs(spec)
            if d.name == "LLMPoolMetricsAbsent" for t in d.tiers}


def test_without_gpu_metrics_no_gpu_rule_alert_or_absence_alert() -> None:
    with_gpu, without = _spec(True), _spec(False)
    assert "gpu" in _absent_groups(with_gpu) and "gpu" not in _absent_groups(without)
    assert _absent_groups(without) == _absent_groups(with_gpu) - {"gpu"}
    names = {d.name for d in alert_defs(without)}
    assert not {n for n in names if n.startswith("LLMGPU")}
    assert {"LLMGPUMemoryNearFull", "LLMGPUXidError"} <= {d.name for d in alert_defs(with_gpu)}
    recorded = {r["record"] for g in recording_groups(without) for r in g["rules"]}
    assert not {r for r in recorded if "gpu" in r and "budget" not in r}


def test_check_lists_no_dcgm_series_for_a_service_without_gpu_metrics() -> None:
    def query(q: str) -> list[tuple[dict[str, str], float]]:
        if q.startswith("timestamp(") and "DCGM" not in q:
            return [({"pod": "p-0"}, 995.0)]
        return []

    for gpu, dcgm_rows in ((True, True), (False, False)):
        rows = check_spec(_spec(gpu), query, at_s=1000.0)
        table = render_table(rows)
        assert ("DCGM" in table) is dcgm_rows
        assert any(r.signal.startswith("gpu_") for r in rows) is dcgm_rows


def test_the_rules_and_their_tests_generate_without_gpu_metrics(tmp_path: Path) -> None:
    """pdscale up --engine dynamo writes them: every file, and rules promtool accepts."""
    import subprocess

    from pdscale.alerts import alert_files
    from tests.conftest import need_tool

    files = alert_files(_spec(False))
    assert any(k.startswith("tests/") for k in files)
    assert not any("DCGM" in text for text in files.values())
    rules = []
    for rel, text in files.items():
        if rel.startswith("rules/"):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
            rules.append(str(tmp_path / rel))
    check = subprocess.run([need_tool("promtool"), "check", "rules", *rules],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
