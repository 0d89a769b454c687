"""bench/stack.py's pure parts: its options, the reactive baseline's signals on a real stack,
the replica schedule the simulator replays, the per-bin timeline, and the tables and targets
it reports. No stack is started here."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from pdscale.controller import Observation, PoolObservation, PoolReplicas, load_profile
from pdscale.spec import Role
from tests.conftest import ROOT, bench_module

S = bench_module("stack")
PROFILE = load_profile(str(ROOT / "pdscale" / "controller" / "profiles" /
                           "dynamo-mocker-1.6.1.yaml"))


# -- options ---------------------------------------------------------------------------------


def test_the_defaults_run_both_traces_at_60s_with_the_baselines() -> None:
    opts = S.parse_args([])
    assert opts.traces == ("azure", "mooncake")
    assert [p.label for p in opts.policies] == ["pdscale", "reactive", "static:2+1",
                                                "static:3+1"]
    assert opts.cold_starts_s == (60.0,)
    assert opts.start_min == {"azure": 14.0, "mooncake": 20.0}
    assert opts.scale == {"azure": 1.0, "mooncake": 1.0}


def test_per_trace_values_and_quick() -> None:
    opts = S.parse_args(["--traces", "mooncake", "--start", "mooncake=5", "--scale", "2",
                         "--cold-starts", "30,60", "--policies", "static:3+2,pdscale",
                         "--quick"])
    assert opts.traces == ("mooncake",)
    assert opts.start_min == {"mooncake": 5.0}
    assert opts.scale == {"mooncake": 2.0}
    assert opts.cold_starts_s == (30.0, 60.0)
    assert opts.minutes == 3.0
    assert opts.policies[0] == S.PolicyChoice("static", 3, 2)
    assert not opts.policies[0].controller and opts.policies[1].controller


@pytest.mark.parametrize("argv", [
    ["--jobs", "2"],
    ["--traces", "burstgpt"],
    ["--policies", "static:0+1"],
    ["--policies", "static:2"],
    ["--policies", "hpa"],
    ["--policies", "static:5+1", "--max-replicas", "4"],
    ["--start", "nosuch=3"],
    ["--scale", "azure=0"],
    ["--cold-starts", "-1"],
    ["--minutes", "0"],
], ids=["jobs", "trace", "static-zero", "static-one-pool", "unknown-policy", "over-max",
        "start-trace", "scale-zero", "cold-negative", "minutes-zero"])
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        S.parse_args(argv)
    assert exc.value.code == 2
    assert "bench/stack.py: error:" in capsys.readouterr().err


def test_parse_policy_says_what_it_accepts() -> None:
    with pytest.raises(ValueError, match="static:P\\+D"):
        S.parse_policy("static:a+b")
    assert S.parse_policy(" reactive ").label == "reactive"


# -- policies --------------------------------------------------------------------------------


def _pool(role: Role, ready: int, signals: dict[str, float | None]) -> PoolObservation:
    return PoolObservation(("chat", role), PoolReplicas(ready, 0, 0, ready, 1, 4), signals,
                           0.0)


def test_the_reactive_baseline_reads_prefill_utilisation_from_demand_and_the_profile() -> None:
    mean = 2000.0
    saturated = PROFILE.prefill_tokens_per_s(mean, mean * mean)
    signals: dict[str, float | None] = {"prompt_tokens_per_s": 0.9 * saturated,
                                        "mean_input_tokens_interval": mean}
    assert S.prefill_utilisation(signals, 1, PROFILE) == pytest.approx(0.9)
    assert S.prefill_utilisation(signals, 3, PROFILE) == pytest.approx(0.3)
    signals["prefix_cache_hit_ratio"] = 0.5
    assert S.prefill_utilisation(signals, 1, PROFILE) == pytest.approx(0.45)
    assert S.prefill_utilisation({"prompt_tokens_per_s": None}, 1, PROFILE) is None


def test_the_reactive_baseline_scales_prefill_over_its_target_and_holds_decode() -> None:
    policy = S.StackReactivePolicy(PROFILE, PROFILE, tick_s=15.0)
    mean = 2000.0
    saturated = PROFILE.prefill_tokens_per_s(mean, mean * mean)
    obs = Observation(100.0, {
        ("chat", Role.PREFILL): _pool(Role.PREFILL, 1, {
            "prompt_tokens_per_s": 1.2 * saturated, "mean_input_tokens_interval": mean}),
        ("chat", Role.DECODE): _pool(Role.DECODE, 1, {
            "kv_cache_usage_ratio": 0.05, "running_requests": 6.0}),
    })
    enriched = policy.enrich(obs)
    assert enriched.pools[("chat", Role.DECODE)].signals["batch_occupancy_ratio"] == \
        pytest.approx(6 / PROFILE.max_batch)
    out = policy.decide(obs)
    assert out[("chat", Role.PREFILL)].desired_replicas == 2  # ceil(1 x 1.2 / 0.6)
    assert out[("chat", Role.DECODE)].desired_replicas == 1
    names = {s.value for s in S.StackReactivePolicy.reads()}
    assert names == {"kv_cache_usage_ratio", "running_requests"}


def test_the_schedule_is_the_applied_decisions_from_the_replay_start() -> None:
    decisions = [
        {"time": 90.0, "pool": "prefill", "desired": 1, "outcome": "unchanged"},
        {"time": 100.0, "pool": "prefill", "desired": 3, "outcome": "applied"},
        {"time": 130.0, "pool": "decode", "desired": 2, "outcome": "applied"},
        {"time": 160.0, "pool": "prefill", "desired": 2, "outcome": "failed"},
        {"time": 400.0, "pool": "prefill", "desired": 1, "outcome": "applied"},
        {"time": 95.0, "pool": "decode", "desired": 1, "outcome": "applied"},
    ]
    sched = S.schedule_from_decisions(decisions, 110.0, {Role.PREFILL: 1, Role.DECODE: 1})
    # A decision before the replay started sets the size at its start.
    assert sched.prefill == ((0.0, 3), (290.0, 1))
    assert sched.decode == ((0.0, 1), (20.0, 2))
    assert [sched.at(Role.PREFILL, t) for t in (0, 289, 290, 1e6)] == [3, 3, 1, 1]
    policy = S.SchedulePolicy("chat", sched)
    out = policy.decide(Observation(25.0, {}))
    assert out[("chat", Role.DECODE)].desired_replicas == 2
    assert out[("chat", Role.PREFILL)].desired_replicas == 3


# -- measurements ----------------------------------------------------------------------------


def test_the_timeline_bins_requests_by_arrival_and_workers_by_sample() -> None:
    tl = S.timeline([1.0, 2.0, 31.0, 95.0], [0.1, None, 0.3, 0.2], [100, 200, 300, 400],
                    [(0.0, {"prefill": 1, "decode": 1}), (20.0, {"prefill": 2, "decode": 1}),
                     (40.0, {"prefill": 3, "decode": 1})], span_s=90.0, bin_s=30.0)
    assert tl["t_s"] == [0.0, 30.0, 60.0]  # the request at 95 s is past the span
    assert tl["arrivals_rps"] == pytest.approx([2 / 30, 1 / 30, 0.0])
    assert tl["prompt_tokens_per_s"] == pytest.approx([10.0, 10.0, 0.0])
    assert tl["ttft_p50_s"][0] == pytest.approx(0.1)  # the failed request has no TTFT
    assert tl["ttft_p95_s"][2] is None
    assert tl["prefill"] == [1.5, 3.0, None]


def test_requests_that_share_an_arrival_are_sent_one_after_another_in_no_fixed_order() -> None:
    import numpy as np

    from pdscale.simulator import Trace

    arrivals = np.array([0.0, 0.0, 0.0, 3.0, 3.0, 7.5])
    prompts = np.array([30000, 600, 6000, 1000, 2000, 500])
    trace = Trace("t", arrivals, prompts, np.full(6, 4))
    sent = S.as_sent(trace, 0)
    a, b, c = S.CLIENT_SEND_MS
    assert np.all(np.diff(sent.arrival_s) >= 0) and len(sent) == 6
    assert sent.arrival_s[-1] == 7.5 and sent.prompt_tokens[-1] == 500  # alone: as scheduled
    first = sent.arrival_s[:3]
    assert np.all((first > 0) & (first < 0.01))
    # The k-th of a group: a + b k ms and c ms per 1,000 tokens sent up to it.
    cum = np.cumsum(sent.prompt_tokens[:3]) / 1000
    assert first * 1000 == pytest.approx(a + b * np.arange(3) + c * cum)
    orders = {tuple(S.as_sent(trace, seed).prompt_tokens[:3]) for seed in range(12)}
    assert len(orders) > 1  # not always the trace's order


def test_decision_changes_and_causes() -> None:
    decisions = [
        {"time": 15.0, "pool": "prefill", "current": 1, "ready": 1, "desired": 1,
         "cause": "steady", "outcome": "unchanged", "reasons": ["demand"]},
        {"time": 30.0, "pool": "prefill", "current": 1, "ready": 1, "desired": 2,
         "cause": "reactive", "outcome": "applied", "reasons": ["reactive: ttft"]},
    ]
    assert S.decision_changes(decisions, 10.0) == [
        {"t_s": 20.0, "pool": "prefill", "from": 1, "to": 2, "ready": 1, "cause": "reactive",
         "outcome": "applied", "reasons": ["reactive: ttft"]}]
    assert S.cause_counts(decisions) == {"prefill": {"steady": 1, "reactive": 1}}


def test_cpu_summary() -> None:
    out = S.summarize_cpu([{"t_s": 5, "load1": 2.0, "frontend_pct": 40.0},
                           {"t_s": 10, "load1": 4.0, "frontend_pct": 60.0}])
    assert out["load1_mean"] == 3.0 and out["load1_max"] == 4.0
    assert out["frontend_pct_mean"] == 50.0 and out["samples"] == 2.0


def _row(policy: str, attainment: float, wh: float, **kw: Any) -> dict[str, Any]:
    summary = {"requests": 100, "errors": 0, "slo_attainment": attainment,
               "ttft_attainment": attainment, "itl_attainment": 1.0, "ttft_p50_s": 0.1,
               "ttft_p95_s": 0.3, "ttft_p99_s": 0.4, "itl_p95_s": 0.01, "tpot_p95_s": 0.01,
               "gpu_hours": wh, "pools": {"prefill": {"mean_replicas": 1.5,
                                                      "peak_replicas": 2},
                                          "decode": {"mean_replicas": 1.0,
                                                     "peak_replicas": 1}}}
    window = {"start_min": 9.0, "minutes": 12.0, "scale": 1.5, "slo_ttft_s": 0.47,
              "slo_itl_s": 0.064}
    summary["client_delay_max_s"] = 0.2
    row: dict[str, Any] = S.run_row(trace=kw.get("trace", "azure"), policy=policy,
                                    cold_start_s=kw.get("cold", 60.0), window=window,
                                    summary=summary, ttft_p90_s=0.2,
                                    cpu={"load1_mean": 2.5, "load1_max": 3.0,
                                         "frontend_pct_mean": 30.0,
                                         "workers_pct_mean": 20.0})
    return row


def test_targets_compare_pdscale_with_the_smallest_static_that_reaches_99() -> None:
    rows = [_row("pdscale", 0.995, 0.40), _row("reactive", 0.97, 0.45),
            _row("static:1+1", 0.95, 0.40), _row("static:2+1", 0.992, 0.60),
            _row("static:3+1", 0.999, 0.80)]
    (check,) = S.targets(rows)
    assert check["smallest_static"] == "static:2+1"
    assert check["attainment_ok"] and check["cheaper_ok"] and check["met"]
    rows[0] = _row("pdscale", 0.985, 0.40)
    assert not S.targets(rows)[0]["met"]
    # The static's own size held throughout bills the same within start jitter: not fewer.
    rows[0] = _row("pdscale", 0.995, 0.59999)
    assert not S.targets(rows)[0]["cheaper_ok"]
    rows[0] = _row("pdscale", 0.995, 0.58)
    assert S.targets(rows)[0]["cheaper_ok"]
    # No static reached 99 %: nothing to beat, so the target is not shown as met.
    (check,) = S.targets([_row("pdscale", 0.995, 0.4), _row("static:1+1", 0.9, 0.4)])
    assert check["smallest_static"] is None and not check["met"]
    assert "none reached 99 %" in S.targets_table([check])
    # A static run starts no replica: it counts at every cold start of the same window,
    # not at another window.
    (check,) = S.targets([_row("pdscale", 0.995, 0.4, cold=30.0),
                          _row("static:2+1", 0.992, 0.6, cold=60.0)])
    assert check["cold_start_s"] == 30.0 and check["smallest_static"] == "static:2+1"
    other = _row("static:2+1", 0.992, 0.6)
    other["start_min"] = 20.0
    (check,) = S.targets([_row("pdscale", 0.995, 0.4, cold=30.0), other])
    assert check["smallest_static"] is None


def test_targets_show_the_slo_as_the_spec_states_it_beside_the_attainment() -> None:
    """The spec's SLO is a TTFT p95; the attainment target (99 % of requests within its
    value) is stricter, so a run can meet the one and miss the other, and the table says
    which."""
    row = _row("pdscale", 0.985, 0.40)
    row["timeline"] = {"ttft_p95_s": [0.2, None, 0.5, 0.3, 0.48]}
    (check,) = S.targets([row, _row("static:3+1", 0.999, 0.8)])
    assert not check["attainment_ok"]
    assert (check["ttft_p95_s"], check["slo_ttft_s"]) == (0.3, 0.47)
    assert (check["bins_over_slo"], check["bins"]) == (2, 4)
    text = S.targets_table([check])
    assert "98.50% **no** | 0.300 s <= 0.47 s (2 of 4) |" in text
    row["ttft_p95_s"] = 0.5
    assert "0.500 s **>** 0.47 s" in S.targets_table(S.targets([row]))


def test_a_run_whose_client_fell_behind_is_marked_and_not_counted() -> None:
    rows = [_row("pdscale", 0.995, 0.40), _row("static:2+1", 0.999, 0.60),
            _row("static:3+1", 0.999, 0.50)]
    rows[2]["client_delay_max_s"] = 122.0
    (check,) = S.targets(rows)
    assert check["smallest_static"] == "static:2+1"
    assert check["statics_tried"] == ["static:2+1 99.9%"]
    assert "static:3+1 (client starved 122 s: not counted)" in S.table(rows)
    columns = S.compact_samples([{"t_s": 5.0, "load1": 2.345}, {"t_s": 10.0}])
    assert columns["t_s"] == [5.0, 10.0]
    assert columns["load1"] == [2.35, None]


def test_fidelity_is_relative_for_ttft_and_in_points_for_attainment() -> None:
    stack = {"ttft_p50_s": 0.2, "ttft_p90_s": 0.4, "slo_attainment": 0.99}
    sim = {"ttft_p50_s": 0.24, "ttft_p90_s": 0.52, "slo_attainment": 0.975}
    fid = S.fidelity(stack, sim)
    assert fid["ttft_p50_rel"] == pytest.approx(0.2) and fid["ttft_p50_ok"]
    assert fid["ttft_p90_rel"] == pytest.approx(0.3) and not fid["ttft_p90_ok"]
    assert fid["attainment_points"] == pytest.approx(-1.5) and fid["attainment_ok"]
    assert not S.fidelity({**stack, "ttft_p50_s": None}, sim)["ttft_p50_ok"]


def test_tables_render_every_run() -> None:
    rows = [_row("pdscale", 0.995, 0.40), _row("static:2+1", 0.992, 0.60)]
    rows[0]["sim"] = {"ttft_p50_s": 0.11, "ttft_p90_s": 0.25, "slo_attainment": 0.99,
                      "fidelity": S.fidelity(rows[0], {"ttft_p50_s": 0.11,
                                                       "ttft_p90_s": 0.25,
                                                       "slo_attainment": 0.99})}
    text = S.table(rows)
    assert "**azure** (minutes 9-21, x1.5, SLO TTFT 0.47 s / ITL 0.064 s), cold start 60 s" \
        in text
    assert "| pdscale | 99.50% |" in text and "| static:2+1 | 99.20% |" in text
    assert "2.5 (max 3.0) | 50 |" in text
    rows[0]["sim_policy"] = {"slo_attainment": 0.98, "gpu_hours": 0.5}
    comparison = S.comparison_table(rows)
    assert "| 98.00%, 0.500 (99.50%, 0.400) |" in comparison
    assert comparison.count("\n") == 3  # header, rule, the one run with a simulation
    assert "0.100 / 0.110" in comparison and "+10% yes" in comparison
    assert "+25% **no**" not in comparison


def test_merge_keeps_old_rows_not_redone_in_a_stable_order() -> None:
    old = [_row("static:1+1", 0.9, 0.4), _row("pdscale", 0.98, 0.4),
           _row("pdscale", 0.97, 0.5, trace="mooncake")]
    new = [_row("pdscale", 0.995, 0.41), _row("reactive", 0.99, 0.5)]
    rows = S.merge_rows(old, new)
    assert [(r["trace"], r["policy"]) for r in rows] == [
        ("azure", "pdscale"), ("azure", "reactive"), ("azure", "static:1+1"),
        ("mooncake", "pdscale")]
    assert rows[0]["slo_attainment"] == 0.995


def test_resimulate_is_an_option_that_starts_no_stack() -> None:
    assert S.parse_args(["--resimulate"]).resimulate
    assert not S.parse_args([]).resimulate


def test_the_spec_and_profile_of_a_run(tmp_path: Any) -> None:
    from pdscale.spec import load_spec

    path = S.write_spec(tmp_path, S.TRACES["mooncake"], cold_start_s=30.0, max_replicas=3,
                        speedup=0.5)
    spec = load_spec(path)
    svc = spec.services[0]
    assert svc.slo.ttft_p95_s == 4.7 and svc.slo.itl_p95_s == 0.064
    assert svc.pools[Role.PREFILL].cold_start == 30 and svc.pools[Role.DECODE].max_replicas == 3
    slowed = load_profile(svc.pools[Role.PREFILL].profile)
    assert slowed.prefill_ms(8192) == pytest.approx(2 * PROFILE.prefill_ms(8192))
    assert slowed.ttft_overhead_ms == PROFILE.ttft_overhead_ms
    assert math.isclose(slowed.decode_step_ms(8, 1000), 2 * PROFILE.decode_step_ms(8, 1000))


def test_autoscaled_runs_start_cold_or_from_the_allocation_given(tmp_path: Any) -> None:
    """Never at the trace's future need: the pools' minimum, or --start-from P+D (bounded)."""
    path = S.write_spec(tmp_path, S.TRACES["mooncake"], cold_start_s=30.0, max_replicas=3,
                        speedup=1.0)
    assert S.parse_args([]).start_from is None
    assert S.autoscaled_start(path, None) == {Role.PREFILL: 1, Role.DECODE: 1}
    opts = S.parse_args(["--start-from", "2+1"])
    assert opts.start_from == (2, 1)
    assert S.autoscaled_start(path, (2, 1)) == {Role.PREFILL: 2, Role.DECODE: 1}
    assert S.autoscaled_start(path, (9, 1)) == {Role.PREFILL: 3, Role.DECODE: 1}


def test_the_simulator_replays_a_run_from_the_sizes_it_started_at(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's run under the policy starts where the stack's run did (from 3+1 when
    the run was started from the best fixed allocation), not at the pools' minimum."""
    import pdscale.simulator

    seen: list[Any] = []

    result = SimpleNamespace(summary={
        "slo_attainment": 1.0, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2, "gpu_hours": 1.0,
        "scale_actions": 0, "pools": {"prefill": {"peak_replicas": 3, "mean_replicas": 3.0}}})

    def fake(spec: Any, options: Any) -> tuple[Any, dict[str, Any]]:
        seen.append(options)
        return result, {}

    monkeypatch.setattr(pdscale.simulator, "simulate", fake)
    path = S.write_spec(tmp_path, S.TRACES["azure"], cold_start_s=60.0, max_replicas=4,
                        speedup=1.0)
    row = {"policy": "pdscale", "trace": "azure", "start_min": 14.0, "minutes": 20.0,
           "scale": 1.0, "cold_start_s": 60.0, "initial": {"prefill": 3, "decode": 1}}
    assert S.simulate_policy(row, path) is not None
    assert seen[-1].initial_replicas == (3, 1)
    assert S.simulate_policy({**row, "policy": "static:3+1"}, path) is None
