"""What the simulator got wrong at the edges of a run (found by a review that drove
`pdscale simulate` with unusual specs): billing after the replay, a first sample that was no
data, --prefix-hit in event mode, the Dynamo baseline's GPUs per replica, dropped requests."""

from __future__ import annotations

import pytest
import yaml

from pdscale.controller import build_policy
from pdscale.simulator import SimOptions, simulate
from pdscale.spec import Role, SpecError, parse_spec
from tests.conftest import ROOT

BASE = yaml.safe_load((ROOT / "examples" / "vllm.yaml").read_text())


def _spec(**pools: dict[str, object]) -> object:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["services"] = raw["services"][:1]
    for role, changes in pools.items():
        raw["services"][0]["pools"][role].update(changes)
    return parse_spec(yaml.safe_dump(raw))


def test_replicas_starting_when_the_work_is_done_bill_nothing_more() -> None:
    """A failure's replacement with a 30-minute cold start ran the clock to its readiness:
    2.98 GPU-hours for five replicas over 600 s (at most 0.83)."""
    spec = _spec(prefill={"min_replicas": 3, "max_replicas": 3, "cold_start": "30m"},
                 decode={"min_replicas": 2, "max_replicas": 2, "cold_start": "30m"})
    base = SimOptions(policy="static", mode="event", duration_s=600.0)
    plain, _ = simulate(spec, base)
    failed, _ = simulate(spec, SimOptions(policy="static", mode="event", duration_s=600.0,
                                          failures=((590.0, Role.DECODE),)))
    s = failed.summary
    assert s["simulated_s"] < 700
    assert s["gpu_hours"] <= 5 * s["simulated_s"] / 3600 + 1e-9
    assert abs(s["gpu_hours"] - plain.summary["gpu_hours"]) < 0.05


def test_the_reactive_baseline_does_not_scale_down_on_the_empty_first_sample() -> None:
    """At t=0 the window is empty and read 0 everywhere: the HPA baseline scaled the fleet to
    its minimum before any load was measured."""
    result, _ = simulate(_spec(), SimOptions(policy="reactive", mode="event",
                                             duration_s=300.0, scale=3.0))
    early = [d for d in result.decisions if float(d["t"]) < 30]
    assert early == [] or all(int(d["to"]) >= int(d["from"]) for d in early)


def test_pools_measured_idle_before_the_trace_read_zero_load_at_first() -> None:
    """idle_before (a fresh deployment the load then reaches, as on the real-stack benchmark,
    whose reactive run scaled prefill 3 -> 1 on a utilisation of 0.00 before the window):
    the first sample is the idle pools' zeros, and the HPA baseline acts on them at once."""
    options = SimOptions(policy="reactive", mode="event", duration_s=300.0, scale=3.0,
                         idle_before=True, initial_replicas=(3, 3))
    result, _ = simulate(_spec(), options)
    first = [d for d in result.decisions if float(d["t"]) < 30]
    assert first and all(int(d["to"]) < int(d["from"]) for d in first)
    assert any("utilisation 0.00" in r for d in first for r in d["reasons"])


def test_prefix_hit_is_fluid_modes_assumption_only() -> None:
    """--prefix-hit 0.9 sized event mode's start for cache hits its replay never has."""
    spec = _spec()
    plain, _ = simulate(spec, SimOptions(policy="static", mode="event", duration_s=300.0,
                                         scale=3.0))
    hinted, _ = simulate(spec, SimOptions(policy="static", mode="event", duration_s=300.0,
                                          scale=3.0, prefix_hit=0.9))
    assert hinted.summary["gpu_hours"] == plain.summary["gpu_hours"]
    assert hinted.summary["slo_attainment"] == plain.summary["slo_attainment"]


def test_the_dynamo_baseline_sizes_replicas_whatever_their_gpus() -> None:
    """Profiles price a replica: dividing its count by gpus_per_replica under-sized the
    Dynamo baseline (82.0 % with one GPU, 62.6 % with two, same spec otherwise)."""
    runs = {}
    for gpus in (1, 2):
        raw = yaml.safe_load(yaml.safe_dump(BASE))
        raw["services"] = raw["services"][:1]
        raw.pop("gpu_budget", None)
        for pool in raw["services"][0]["pools"].values():
            pool["gpus_per_replica"] = gpus
        result, _ = simulate(parse_spec(yaml.safe_dump(raw)), SimOptions(
            policy="dynamo", mode="event", duration_s=1200.0, scale=8.0))
        runs[gpus] = result.summary
    assert runs[1]["slo_attainment"] == runs[2]["slo_attainment"]
    assert abs(runs[2]["gpu_hours"] - 2 * runs[1]["gpu_hours"]) < 1e-6


def test_requests_no_replica_can_hold_are_counted() -> None:
    result, _ = simulate(_spec(), SimOptions(policy="static", mode="event", duration_s=300.0))
    s = result.summary
    assert s["finished"] + s["rejected"] == s["requests"]


def _two_services_sharing(budget: int) -> object:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["gpu_budget"] = budget
    for svc in raw["services"]:
        for pool in svc["pools"].values():
            pool.update({"gpus_per_replica": 2, "min_replicas": 1, "max_replicas": 8})
    return parse_spec(yaml.safe_dump(raw))


def test_a_simulated_service_shares_the_budget_with_the_others_minimums() -> None:
    """Budget 8 and another service holding 4 GPUs at its minimums: the simulated service
    used to start (and static to stay) at 10 GPUs, and the controller to grant it all 8."""
    spec = _two_services_sharing(8)
    name = spec.services[0].name
    static, _ = simulate(spec, SimOptions(policy="static", mode="event", duration_s=600.0,
                                          scale=3.0, service=name))
    assert all(p["peak_replicas"] * 2 <= 4 for p in static.summary["pools"].values()) and \
        sum(p["peak_replicas"] for p in static.summary["pools"].values()) * 2 <= 4
    scaled, _ = simulate(spec, SimOptions(policy="pdscale", mode="event", duration_s=900.0,
                                          scale=3.0, service=name))
    for row in scaled.timeseries:
        assert (row["prefill_desired"] + row["decode_desired"]) * 2 <= 4 + 1e-9, row


def test_a_synthetic_window_far_out_is_refused_not_built() -> None:
    """--start 999999999 on the synthetic trace generated every request from t=0 (it hung;
    --start 864000 took 1.3 GB)."""
    from pdscale.simulator import TraceError

    with pytest.raises(TraceError, match="synthetic trace runs up to 14 days"):
        simulate(_spec(), SimOptions(policy="static", start_s=999_999_999.0,
                                     duration_s=120.0))


def test_the_peak_need_flag_is_the_traces_whatever_the_policy() -> None:
    """It was computed from the starting size, which for an autoscaled run covers only the
    first cold start: static said true and pdscale false on the same trace."""
    spec = _spec(prefill={"max_replicas": 3})
    flags = {}
    for policy in ("static", "pdscale"):
        result, _ = simulate(spec, SimOptions(policy=policy, mode="fluid", duration_s=5400.0,
                                              scale=2.0))
        flags[policy] = result.summary["peak_need_exceeds_max_replicas"]
    assert flags["static"] == flags["pdscale"]
    assert flags["static"]["prefill"] is True


def test_fluid_mode_waits_for_the_replacement_not_forever() -> None:
    """One prefill replica lost at 100 s: fluid mode read the TTFT as infinite (the 1e4 s clip
    in the summary, inf in timeseries.csv) until the replacement came; requests wait for it."""
    import math

    spec = _spec(prefill={"min_replicas": 1, "max_replicas": 1},
                 decode={"min_replicas": 1, "max_replicas": 1})
    result, _ = simulate(spec, SimOptions(policy="static", mode="fluid", duration_s=600.0,
                                          failures=((100.0, Role.PREFILL),)))
    s = result.summary
    cold = s["cold_start_s"]["prefill"]
    assert math.isfinite(s["ttft_p95_s"]) and s["ttft_p95_s"] < 5 * cold
    assert all(math.isfinite(r["ttft_p95_s"]) for r in result.timeseries
               if not math.isnan(r["ttft_p95_s"]))


def test_fluid_modes_first_sample_is_measured_and_idle_before_is_refused() -> None:
    """Fluid mode samples after its first step: that sample is data, kept; event mode's first
    sample, at t=0, closes a window nothing was simulated in, and is no data."""
    from pdscale.simulator._simulate import prepare, world_for

    seen = {}
    for mode in ("fluid", "event"):
        options = SimOptions(policy="static", mode=mode, duration_s=300.0, scale=3.0,
                             observation_delay_s=0.0)
        world = world_for(prepare(_spec(), options), options)
        world.advance(0.0)
        seen[mode] = world.observe(0.0).observation.pools[("llama-chat", Role.PREFILL)].signals
    assert all(v is None for v in seen["event"].values())
    assert any(v for v in seen["fluid"].values())
    with pytest.raises(ValueError, match="--idle-before is for event mode"):
        simulate(_spec(), SimOptions(policy="reactive", mode="fluid", duration_s=300.0,
                                     idle_before=True))


def test_the_summary_counts_the_failures_that_happened(tmp_path) -> None:
    """Event mode ends once the trace is over and every request is answered: a --fail due
    later never happens. The summary says so (it had counted nothing), with a failure that
    found no ready replica to take (the first one's replacement still starting)."""
    import json

    trace = tmp_path / "short.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 500, "input_length": 1000,
                                         "output_length": 20}) + "\n" for i in range(200)))
    spec = _spec(prefill={"min_replicas": 1, "max_replicas": 1, "cold_start": "60s"},
                 decode={"min_replicas": 1, "max_replicas": 1})
    failures = ((50.0, Role.PREFILL), (55.0, Role.PREFILL), (500.0, Role.DECODE))
    result, _ = simulate(spec, SimOptions(policy="static", mode="event", trace=str(trace),
                                          duration_s=600.0, failures=failures))
    s = result.summary
    assert s["simulated_s"] < 200  # 100 s of arrivals, then the backlog the loss left
    assert s["failures"] == {"asked": 3, "took_a_replica": 1, "no_ready_replica": 1,
                             "after_the_run": 1}
    plain, _ = simulate(spec, SimOptions(policy="static", mode="event", trace=str(trace),
                                         duration_s=600.0))
    assert plain.summary["failures"] is None


@pytest.mark.parametrize(("routing", "router"), [("load_balanced", "least_loaded"),
                                                 ("prefix_aware", "prefix")])
def test_the_simulated_router_is_the_one_the_spec_describes(routing: str, router: str) -> None:
    """The controller sizes for the spec's routing; the simulator routes the same way unless
    told otherwise, so the two agree on what the prefix cache serves."""
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["services"] = raw["services"][:1]
    raw["services"][0]["routing"] = routing
    spec = parse_spec(yaml.safe_dump(raw))
    _, meta = simulate(spec, SimOptions(policy="static", mode="event", duration_s=120.0))
    assert meta["router"] == router
    _, told = simulate(spec, SimOptions(policy="static", mode="event", duration_s=120.0,
                                        router="round_robin"))
    assert told["router"] == "round_robin"


def test_a_prefix_aware_service_keeps_its_hits_in_the_policy() -> None:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["services"][0]["routing"] = "prefix_aware"
    spec = parse_spec(yaml.safe_dump(raw))
    policy = build_policy(spec, forecasts=None)
    names = [svc.name for svc in spec.services]
    aware = {key[0] for key, st in policy.state.items() if st.prefix_aware}
    assert aware == {names[0]}
    assert len(names) > 1  # and the other services stay load-balanced


def test_an_unknown_routing_is_refused_with_the_choices() -> None:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["services"][0]["routing"] = "kv"
    with pytest.raises(SpecError, match=r"routing: .*load_balanced.*prefix_aware.*got .kv."):
        parse_spec(yaml.safe_dump(raw))


def test_each_service_is_sized_at_its_own_slo_objective() -> None:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["services"][0]["slo"]["objective"] = 0.95
    spec = parse_spec(yaml.safe_dump(raw))
    policy = build_policy(spec, forecasts=None)
    for svc in spec.services:
        for role in Role:
            assert policy.state[(svc.name, role)].objective == svc.slo.objective
    assert {st.objective for st in policy.state.values()} == {0.95, 0.99}
