"""Policies side by side (what `pdscale demo` and the policy benchmark print)."""

from __future__ import annotations

import json
from pathlib import Path

from pdscale.cli import main
from tests.conftest import ROOT


def test_demo_compares_policies_and_writes_everything(tmp_path: Path,
                                                       capsys: object) -> None:
    out = tmp_path / "out"
    code = main(["demo", "--spec", str(ROOT / "examples" / "vllm.yaml"), "--out", str(out),
                 "--hours", "0.25", "--scale", "1", "--policies", "static,reactive"])
    assert code == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "| policy | SLO attainment | GPU-hours" in printed
    rows = json.loads((out / "simulation" / "comparison.json").read_text())
    assert [r["policy"] for r in rows] == ["static", "reactive"]
    for r in rows:
        assert 0 <= r["slo_attainment"] <= 1 and r["gpu_hours"] > 0
    # Static holds its peak size: it cannot use fewer GPU-hours than the policy that scales.
    assert rows[0]["scale_actions"] == 0
    for rel in ("simulation/comparison.md", "simulation/plots/gpu_hours_vs_attainment.png",
                "simulation/plots/replicas_vs_load.png", "simulation/static/summary.json",
                "simulation/reactive/timeseries.csv", "alerts/alertmanager.yaml",
                "dashboards/pdscale-autoscaler.json"):
        assert (out / rel).is_file(), rel
    assert (out / "simulation" / "plots" / "replicas_vs_load.png").read_bytes()[:4] == \
        b"\x89PNG"


def test_demo_finds_the_best_fixed_allocation_and_shows_it_beside_the_policies(
        tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "out"
    code = main(["demo", "--out", str(out), "--hours", "0.2", "--policies",
                 "static,best-fixed"])
    assert code == 0
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    assert "best-fixed:" in captured.err  # each allocation tried, as it is tried
    line = next(x for x in captured.out.splitlines() if x.startswith("best fixed in hindsight"))
    rows = {r["policy"]: r for r in
            json.loads((out / "simulation" / "comparison.json").read_text())}
    assert list(rows) == ["static", "best-fixed"]
    fixed = rows["best-fixed"]
    assert fixed["scale_actions"] == 0
    assert f"{fixed['peak_prefill']} prefill + {fixed['peak_decode']} decode" in line
    # Held fixed, at or above the pools' minimums, and within the bounds searched.
    assert fixed["peak_prefill"] >= 2 and fixed["peak_decode"] >= 2
    assert (out / "simulation" / "best-fixed" / "summary.json").is_file()


def test_demo_rejects_an_unknown_policy(tmp_path: Path, capsys: object) -> None:
    code = main(["demo", "--out", str(tmp_path / "o"), "--policies", "static,hpa"])
    assert code == 2
    assert "unknown policy hpa" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert not (tmp_path / "o").exists()


def test_the_simulated_controller_runs_with_the_spec_s_controller_settings() -> None:
    from pdscale.controller import PdscalePolicy
    from pdscale.simulator import SimOptions
    from pdscale.simulator._simulate import prepare
    from pdscale.spec import load_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    tuned = spec.model_copy(update={"controller": spec.controller.model_copy(update={
        "scale_up_quantile": 0.8, "stabilisation": 120, "max_step_down": 5, "tick": 10})})
    for which, expect in ((spec, (0.97, 600.0, 2, 15.0)), (tuned, (0.8, 120.0, 5, 10.0))):
        prepared = prepare(which, SimOptions(policy="pdscale", duration_s=600.0))
        policy = prepared.policy
        assert isinstance(policy, PdscalePolicy)
        c = policy.settings
        assert (c.scale_up_quantile, c.stabilisation, c.max_step_down, policy.tick_s) == expect
        assert prepared.setup.tick_s == expect[3]  # the world ticks with the controller
        assert prepared.forecasts is policy.forecasts is not None  # the loop refits them
        forecaster = next(iter(prepared.forecasts.forecasters.values()))
        assert forecaster.model.quantiles == (0.5, expect[0])
        # The constraints and telemetry are the simulated service's alone.
        assert [s.name for s in prepared.spec.services] == [spec.services[0].name]


def test_the_simulation_runs_the_production_reconciler_with_the_spec_s_constraints() -> None:
    """A GPU budget in the spec caps every policy in the simulator as in a cluster, and each
    decision is the reconciler's (its cause recorded)."""
    from pdscale.simulator import SimOptions, simulate
    from pdscale.spec import load_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    options = SimOptions(policy="reactive", duration_s=1800.0, scale=3.0, cold_start_s=30.0)
    free, _ = simulate(spec, options)

    def most_gpus(result: object) -> float:
        rows = result.timeseries  # type: ignore[attr-defined]
        return max(r["prefill_desired"] + r["decode_desired"] for r in rows)

    assert most_gpus(free) > 4
    assert {d["cause"] for d in free.decisions} <= {"steady", "scale_down", "forecast"}
    capped, _ = simulate(spec.model_copy(update={"gpu_budget": 4}), options)
    assert most_gpus(capped) <= 4
    assert capped.summary["slo_attainment"] < free.summary["slo_attainment"]


def test_a_simulated_run_is_deterministic_refits_included() -> None:
    """Refits run in the reconciler's foreground on the simulated clock: the same run twice
    gives the same decisions, forecasts included."""
    from pdscale.simulator import SimOptions, simulate
    from pdscale.spec import load_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    options = SimOptions(policy="pdscale", mode="fluid", duration_s=3 * 3600.0, scale=2.0)
    runs = [simulate(spec, options)[0] for _ in range(2)]
    assert runs[0].decisions == runs[1].decisions
    forecasts = [r for d in runs[0].decisions for r in d["reasons"] if "forecast q0.9" in r]
    assert forecasts, "the forecaster was fitted and used within the run"
    for key in ("slo_attainment", "gpu_hours", "scale_actions"):
        assert runs[0].summary[key] == runs[1].summary[key]


def test_a_failing_policy_stops_the_simulation_loudly() -> None:
    """The reconciler isolates failures in a cluster; in a simulation an error is a bug, so
    the run stops and says what failed."""
    import pytest

    from pdscale.controller import Observation, PoolDecision, PoolKey
    from pdscale.simulator import SimOptions, simulate
    from pdscale.simulator._world import SimulationError
    from pdscale.spec import load_spec

    class Broken:
        name = "broken"

        def decide(self, observation: Observation) -> dict[PoolKey, PoolDecision]:
            raise ZeroDivisionError("bad arithmetic")

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    with pytest.raises(SimulationError, match="policy error: ZeroDivisionError: bad arithmetic"):
        simulate(spec, SimOptions(duration_s=300.0), policy=Broken())
