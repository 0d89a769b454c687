"""Cross-pool constraints: the GPU budget and P:D ratio bounds (properties and examples)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdscale.controller import Observation, PoolDecision, PoolKey, PoolObservation, PoolReplicas
from pdscale.controller._constraints import Constraints, apply_constraints
from pdscale.spec import Role, SpecError, parse_spec


def _obs(pools: dict[PoolKey, tuple[int, int, int, float | None]]) -> Observation:
    """key -> (min, max, gpus, latency p95)."""
    out = {}
    for key, (lo, hi, gpus, latency) in pools.items():
        sig = "ttft_p95_s" if key[1] is Role.PREFILL else "itl_p95_s"
        out[key] = PoolObservation(key, PoolReplicas(lo, 0, 0, lo, lo, hi, gpus),
                                   {sig: latency}, 0.0)
    return Observation(0.0, out)


pool_st = st.tuples(st.integers(1, 3), st.integers(0, 30), st.integers(1, 4),
                    st.one_of(st.none(), st.floats(0.0, 5.0)))


@given(st.lists(pool_st, min_size=1, max_size=6), st.integers(0, 60),
       st.lists(st.floats(0.1, 5.0), min_size=6, max_size=6), st.data())
def test_budget_always_holds_and_never_exceeds_the_ask(
        pools: list[tuple[int, int, int, float | None]], slack: int, priorities: list[float],
        data: st.DataObject) -> None:
    keys = [(f"s{i // 2}", Role.PREFILL if i % 2 == 0 else Role.DECODE) for i in range(len(pools))]
    spec_pools = {}
    decisions = {}
    for key, (lo, extra, gpus, latency) in zip(keys, pools, strict=True):
        hi = lo + extra
        spec_pools[key] = (lo, hi, gpus, latency)
        decisions[key] = PoolDecision(data.draw(st.integers(lo, hi)))
    floor = sum(lo * g for lo, _, g, _ in spec_pools.values())
    budget = floor + slack
    constraints = Constraints(budget, {f"s{i}": priorities[i] for i in range(6)},
                              {k: 0.5 for k in keys}, {})
    out = apply_constraints(decisions, _obs(spec_pools), constraints)
    used = sum(out[k].desired_replicas * spec_pools[k][2] for k in keys)
    assert used <= budget
    for k in keys:
        assert spec_pools[k][0] <= out[k].desired_replicas <= decisions[k].desired_replicas
    if sum(decisions[k].desired_replicas * spec_pools[k][2] for k in keys) <= budget:
        assert all(out[k] == decisions[k] for k in keys)  # untouched when it fits
    else:
        # Work-conserving: no pool left short could take one more replica within the budget.
        for k in keys:
            if out[k].desired_replicas < decisions[k].desired_replicas:
                assert used + spec_pools[k][2] > budget
                assert out[k].cause == "budget"


def test_budget_favours_priority_and_slo_deficit() -> None:
    a, b = ("a", Role.PREFILL), ("b", Role.PREFILL)
    obs = _obs({a: (1, 20, 1, 0.4), b: (1, 20, 1, 0.4)})
    asks = {a: PoolDecision(10), b: PoolDecision(10)}
    even = apply_constraints(asks, obs, Constraints(10, {"a": 1, "b": 1}, {a: 0.5, b: 0.5}, {}))
    assert even[a].desired_replicas == even[b].desired_replicas == 5
    ranked = apply_constraints(asks, obs, Constraints(10, {"a": 3, "b": 1},
                                                      {a: 0.5, b: 0.5}, {}))
    assert ranked[a].desired_replicas > ranked[b].desired_replicas
    late = _obs({a: (1, 20, 1, 0.4), b: (1, 20, 1, 1.5)})  # b is 3x over its SLO
    deficit = apply_constraints(asks, late, Constraints(10, {"a": 1, "b": 1},
                                                        {a: 0.5, b: 0.5}, {}))
    assert deficit[b].desired_replicas > deficit[a].desired_replicas
    assert "SLO deficit 2.00" in deficit[b].reasons[-1] or "SLO deficit" in deficit[a].reasons[-1]


@given(st.integers(1, 30), st.integers(1, 30), st.floats(0.2, 4.0), st.floats(0.2, 4.0))
def test_ratio_bounds_only_raise(p: int, d: int, lo: float, span: float) -> None:
    hi = lo + span
    kp, kd = ("s", Role.PREFILL), ("s", Role.DECODE)
    obs = _obs({kp: (1, 200, 1, None), kd: (1, 200, 1, None)})
    out = apply_constraints({kp: PoolDecision(p), kd: PoolDecision(d)}, obs,
                            Constraints(None, {}, {}, {"s": (lo, hi)}))
    p2, d2 = out[kp].desired_replicas, out[kd].desired_replicas
    assert p2 >= p and d2 >= d
    # Either both bounds hold, or a pool hit its max (and the reason says so).
    if p2 < 200 and d2 < 200:
        assert lo * d2 <= p2 + 1e-9 and p2 <= hi * d2 + 1e-9


def test_ratio_says_when_max_replicas_stops_it() -> None:
    kp, kd = ("s", Role.PREFILL), ("s", Role.DECODE)
    obs = _obs({kp: (1, 3, 1, None), kd: (1, 50, 1, None)})
    out = apply_constraints({kp: PoolDecision(1), kd: PoolDecision(20)}, obs,
                            Constraints(None, {}, {}, {"s": (0.5, None)}))
    assert out[kp].desired_replicas == 3
    assert "bound not met" in out[kp].reasons[-1] and out[kp].cause == "ratio"


def test_spec_rejects_a_budget_below_the_minimums_and_inverted_ratio() -> None:
    text = """
version: 1
gpu_budget: 3
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: m
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pd_ratio: {min: 2, max: 1}
    pools:
      prefill: {target: {name: p}, min_replicas: 2, max_replicas: 4}
      decode: {target: {name: d}, min_replicas: 2, max_replicas: 4}
"""
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    text_all = str(info.value)
    assert "min <= max" in text_all
    text_ok_ratio = text.replace("pd_ratio: {min: 2, max: 1}", "pd_ratio: {min: 1, max: 2}")
    with pytest.raises(SpecError) as info:
        parse_spec(text_ok_ratio)
    assert "gpu_budget" in str(info.value) and "4 GPUs" in str(info.value)


def _degraded(obs: Observation, key: PoolKey, desired: int) -> Observation:
    from dataclasses import replace

    pool = obs.pools[key]
    pools = dict(obs.pools)
    pools[key] = replace(pool, replicas=replace(pool.replicas, desired=desired, ready=desired),
                         degraded="2 of 2 scrape targets down")
    return Observation(obs.now_s, pools)


def test_pools_not_read_this_tick_keep_their_gpus_in_the_budget() -> None:
    """A 503 on one service's scale targets left its pools out of the budget's sum: another
    pool was granted their GPUs (11 allocated against a budget of 8)."""
    from pdscale.controller._constraints import unread_pools_gpus

    a, b = ("a", Role.PREFILL), ("a", Role.DECODE)
    c, d = ("b", Role.PREFILL), ("b", Role.DECODE)
    constraints = Constraints(8, {}, {k: 0.5 for k in (a, b, c, d)}, {},
                              max_gpus={a: 8, b: 8, c: 8, d: 8})
    obs = _obs({c: (1, 8, 1, None), d: (1, 8, 1, None)})  # service a unread
    decisions = {c: PoolDecision(1), d: PoolDecision(6)}
    held = unread_pools_gpus(decisions, obs, constraints, {a: 2, b: 2})
    assert held == 4
    out = apply_constraints(decisions, obs, constraints, held)
    assert out[d].desired_replicas == 3 and out[c].desired_replicas == 1  # 4 + 1 + 3 = 8
    assert "4 held by pools not read this tick" in out[d].reasons[-1]
    # Never read at all: assumed at its max, so nothing grows past the minimums.
    assert unread_pools_gpus(decisions, obs, constraints, {}) == 16
    # Read but without a decision: as observed.
    assert unread_pools_gpus({c: PoolDecision(1)}, obs, constraints, {a: 2, b: 2}) == 5


def test_the_budget_never_cuts_a_degraded_pool() -> None:
    """A pool whose targets are down is never scaled down (hold_degraded); the budget cut it
    to its minimum to grow another pool."""
    p, d = ("s", Role.PREFILL), ("s", Role.DECODE)
    constraints = Constraints(6, {}, {p: 0.5, d: 0.5}, {})
    obs = _degraded(_obs({p: (1, 8, 1, None), d: (1, 8, 1, 1.0)}), p, 3)
    out = apply_constraints({p: PoolDecision(3), d: PoolDecision(6)}, obs, constraints)
    assert out[p].desired_replicas == 3 and out[d].desired_replicas == 3
    # Its growth is still bounded by the budget.
    out = apply_constraints({p: PoolDecision(8), d: PoolDecision(1)}, obs, constraints)
    assert out[p].desired_replicas == 5


BUDGET_SPEC = """
version: 1
gpu_budget: 8
services:
  - name: a
    namespace: ns-a
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: a-prefill}, min_replicas: 1, max_replicas: 8}
      decode: {target: {name: a-decode}, min_replicas: 1, max_replicas: 8}
  - name: b
    namespace: ns-b
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: b-prefill}, min_replicas: 1, max_replicas: 8}
      decode: {target: {name: b-decode}, min_replicas: 1, max_replicas: 8}
"""


def test_the_reconciler_keeps_the_budget_when_a_services_targets_cannot_be_read() -> None:
    """Through the controller's loop against the Kubernetes API stand-in: the LIST of one
    service's Deployments answers 503 for a tick while another pool asks for 6."""
    from kubernetes import client as k8s

    from pdscale.controller._cluster import ClusterSource
    from pdscale.controller._kube import KubeScaleActuator, ScaleRef
    from pdscale.controller._reconciler import Reconciler
    from pdscale.telemetry import ControllerTelemetry
    from tests.controller.kube_standin import ApiState, api_standin
    from tests.controller.memory_cluster import ManualClock

    spec = parse_spec(BUDGET_SPEC)

    class NoData:
        stale_after_s = 120.0

        def read(self, *_: object, **__: object) -> dict[PoolKey, object]:
            return {}

    class Wants6:
        name = "wants-6"

        def decide(self, obs: Observation) -> dict[PoolKey, PoolDecision]:
            return {k: PoolDecision(6 if k == ("b", Role.DECODE) else p.replicas.desired)
                    for k, p in obs.pools.items()}

    state = ApiState()
    for ns, name in (("ns-a", "a-prefill"), ("ns-a", "a-decode"), ("ns-b", "b-prefill"),
                     ("ns-b", "b-decode")):
        state.add(ns, "deployments", name, 2)
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            targets = {(s.name, r): ScaleRef(s.namespace, p.target)
                       for s in spec.services for r, p in s.pools.items()}
            kube = KubeScaleActuator(api, targets)
            rec = Reconciler(Wants6(), ClusterSource(spec, NoData(), kube), kube,
                             ManualClock(), constraints=Constraints.from_spec(spec),
                             telemetry=ControllerTelemetry(spec))
            rec.tick()
            state.fail_next = 1  # ns-a's LIST answers 503
            report = rec.tick()
            assert {e.adapter for e in report.errors} == {"kubernetes"}
            rec.close()
    assert sum(o["replicas"] for o in state.objects.values()) <= 8


def test_the_budget_keeps_the_ratio_bounds_the_ratio_step_set() -> None:
    """The budget ran after the ratio bounds and cut decode alone: prefill:decode 4:2 with a
    max of 1.5 held for 54 ticks, where 3:3 fits both."""
    p, d = ("s", Role.PREFILL), ("s", Role.DECODE)
    constraints = Constraints(6, {}, {p: 0.5, d: 0.5}, {"s": (1.0, 1.5)})
    obs = _obs({p: (1, 8, 1, 2.0), d: (1, 8, 1, None)})  # prefill over its SLO: it claims more
    out = apply_constraints({p: PoolDecision(4), d: PoolDecision(4)}, obs, constraints)
    pp, dd = out[p].desired_replicas, out[d].desired_replicas
    assert pp + dd <= 6 and 1.0 <= pp / dd <= 1.5
    assert (pp, dd) == (3, 3)
