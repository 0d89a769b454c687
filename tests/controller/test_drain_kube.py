"""Scale-down drains through the official Kubernetes client against the API stand-in: the order
of operations (label, wait, annotate, scale), a drain that times out, a leader change in the
middle, a scale-up during a drain, 409 conflicts on the pod patches, StatefulSets, RBAC."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest
from kubernetes import client as k8s

from pdscale.controller._drain import DRAIN_REASON, DRAINING_SINCE, SERVING_BEFORE, Drainer
from pdscale.controller._kube import (
    DELETION_COST_BEFORE,
    KubeDrainBackend,
    KubeRejected,
    KubeScaleActuator,
    KubeUnavailable,
    ScaleRef,
)
from pdscale.controller._reconciler import Reconciler
from pdscale.spec import Role, ScaleTarget, parse_spec
from pdscale.telemetry import ControllerTelemetry, PodWork
from tests.controller.kube_standin import ApiState, api_standin
from tests.controller.memory_cluster import ManualClock

D = ("chat", Role.DECODE)
P = ("chat", Role.PREFILL)
LABEL = "pdscale.io/serving"
COST = "controller.kubernetes.io/pod-deletion-cost"
SPEC = parse_spec("""
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 1, max_replicas: 8}
      decode: {target: {name: chat-decode}, min_replicas: 1, max_replicas: 8}
controller:
  drain: {enabled: true, timeout: 300s, settle: 10s}
""")
T0 = 1_800_000_000.0


class Work:
    """Per-pod work as Prometheus would report it, set by the test."""

    def __init__(self) -> None:
        self.pods: dict[str, PodWork] = {}
        self.reads = 0

    def set(self, pod: str, running: float, at: float, kv: float | None = None) -> None:
        self.pods[pod] = PodWork(running, 0.0, kv, at)

    def pod_work(self, key: tuple[str, Role], now_s: float) -> Mapping[str, PodWork]:
        self.reads += 1
        return dict(self.pods)


@dataclass
class Env:
    state: ApiState
    api: k8s.ApiClient
    work: Work
    telemetry: ControllerTelemetry

    def backend(self, kind: str = "Deployment") -> KubeDrainBackend:
        plural = "chat-decode"
        targets = {D: ScaleRef("llm", ScaleTarget(kind=kind, name=plural))}
        return KubeDrainBackend(KubeScaleActuator(self.api, targets), {D: "chat-decode-.*"})

    def drainer(self, kind: str = "Deployment", **kw: object) -> Drainer:
        return Drainer(self.backend(kind), self.work, timeout_s=300, settle_s=10,
                       telemetry=self.telemetry, **kw)  # type: ignore[arg-type]

    def pod(self, name: str) -> dict[str, dict[str, str]]:
        meta: dict[str, dict[str, str]] = self.state.pods[("llm", name)]["metadata"]
        return meta


@pytest.fixture
def env() -> Iterator[Env]:
    state = ApiState()
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            yield Env(state, api, Work(), ControllerTelemetry(SPEC))


def _deployment(env: Env, n: int = 3) -> list[str]:
    pods = env.state.add_workload("llm", "deployments", "chat-decode", n,
                                  labels={LABEL: "true"})
    env.state.log.clear()
    return pods


def _metric(env: Env, name: str, **labels: str) -> float:
    for line in env.telemetry.render().decode().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not exported")


def test_label_wait_annotate_scale_in_that_order_removing_the_least_loaded(env: Env) -> None:
    a, b, c = _deployment(env)
    for pod, running in ((a, 4), (b, 1), (c, 6)):
        env.work.set(pod, running, T0 - 5)
    drainer = env.drainer()
    step = drainer.reach(D, 2, current=3, reasons=["forecast"], now_s=T0)
    assert step.outcome == "draining"
    assert env.state.log == [("patch", b, f"{DRAIN_REASON}=least work of 3 ready: 1 running,"
                              f" 0 waiting,{DRAINING_SINCE}=2027-01-15T08:00:00.000000Z,"
                              f"{SERVING_BEFORE}=\"true\",{LABEL}=drained")]
    assert env.pod(b)["labels"][LABEL] == "drained"  # out of the Service
    assert env.state.objects[("llm", "deployments", "chat-decode")]["replicas"] == 3
    assert any("chat-decode" in n and "chosen" in n for n in step.notes)
    # Still one request in flight 15 s later: nothing more happens.
    env.work.set(b, 1, T0 + 15)
    step = drainer.reach(D, 2, current=3, reasons=["forecast"], now_s=T0 + 15)
    assert step.outcome == "draining" and len(env.state.log) == 1
    # Idle on a sample taken after the settle time: annotate, then scale, and b is deleted.
    env.work.set(b, 0, T0 + 30)
    step = drainer.reach(D, 2, current=3, reasons=["forecast"], now_s=T0 + 30)
    assert step.outcome == "applied"
    assert [e[:2] for e in env.state.log[1:]] == [("patch", b), ("scale", "chat-decode"),
                                                  ("delete", b)]
    assert env.state.log[1][2] == f"{COST}=-2147483648"
    assert env.state.log[2][2] == "2"
    assert env.state.pod_names("llm", "chat-decode") == [a, c]
    assert all(LABEL in env.pod(p)["labels"] and env.pod(p)["labels"][LABEL] == "true"
               for p in (a, c))
    assert any("drained in 30.0 s" in n for n in step.notes)
    assert _metric(env, "pdscale_drain_ended_total", outcome="drained",
                   pdscale_pool="decode") == 1
    reasons = [e["reason"] for e in env.state.events]
    assert reasons == ["PdscaleDrainStarted", "PdscaleScaled", "PdscaleDrained"]


def test_a_drain_that_times_out_is_removed_and_recorded_with_what_it_held(env: Env) -> None:
    a, b = _deployment(env, 2)
    env.work.set(a, 5, T0)
    env.work.set(b, 2, T0)
    drainer = env.drainer()
    drainer.reach(D, 1, current=2, reasons=[], now_s=T0)
    for t in (T0 + 100, T0 + 200):
        env.work.set(b, 2, t)
        assert drainer.reach(D, 1, current=2, reasons=[], now_s=t).outcome == "draining"
    env.work.set(b, 2, T0 + 300)
    step = drainer.reach(D, 1, current=2, reasons=[], now_s=T0 + 300)
    assert step.outcome == "applied"
    assert env.state.pod_names("llm", "chat-decode") == [a]
    assert any("timed out after 300 s, removed still holding 2 running" in n
               for n in step.notes)
    assert _metric(env, "pdscale_drain_ended_total", outcome="timeout",
                   pdscale_pool="decode") == 1
    assert _metric(env, "pdscale_drain_cut_requests_total", pdscale_pool="decode") == 2
    assert _metric(env, "pdscale_drain_timeouts_in_a_row", pdscale_pool="decode") == 1
    assert drainer.timeouts_in_a_row(D) == 1
    recent = drainer.snapshot(T0 + 300)["recent"]
    assert recent[-1]["outcome"] == "timeout" and recent[-1]["work"]["running"] == 2
    assert "PdscaleDrainTimeout" in [e["reason"] for e in env.state.events]


def test_a_new_leader_finishes_the_drain_it_finds_on_the_pods(env: Env) -> None:
    a, b, c = _deployment(env)
    for pod, running in ((a, 3), (b, 0), (c, 3)):
        env.work.set(pod, running, T0)
    old = env.drainer()
    old.reach(D, 2, current=3, reasons=[], now_s=T0)
    assert DRAINING_SINCE in env.pod(b)["annotations"]
    # The old leader is gone; a new one (its own client objects, nothing in memory) takes over.
    new = env.drainer()
    env.work.set(b, 1, T0 + 20)
    env.work.set(a, 0, T0 + 20)  # a is now the least loaded: the drain of b must go on anyway
    step = new.reach(D, 2, current=3, reasons=[], now_s=T0 + 20)
    assert step.outcome == "draining"
    assert env.pod(a)["labels"][LABEL] == "true" and DRAINING_SINCE not in env.pod(a)["annotations"]
    assert new.snapshot(T0 + 20)["in_progress"]["chat/decode"][0]["replica"] == b
    env.work.set(b, 0, T0 + 40)
    assert new.reach(D, 2, current=3, reasons=[], now_s=T0 + 40).outcome == "applied"
    assert env.state.pod_names("llm", "chat-decode") == [a, c]


def test_a_new_leader_whose_target_no_longer_asks_undoes_the_drain(env: Env) -> None:
    a, b, c = _deployment(env)
    for pod in (a, b, c):
        env.work.set(pod, 1, T0)
    env.drainer().reach(D, 2, current=3, reasons=[], now_s=T0)
    drained = next(p for p in (a, b, c) if env.pod(p)["labels"][LABEL] == "drained")
    new = env.drainer()
    step = new.reach(D, 3, current=3, reasons=[], now_s=T0 + 20)
    assert step.outcome == "unchanged"
    assert env.pod(drained)["labels"][LABEL] == "true"
    assert not set(env.pod(drained)["annotations"]) & {DRAINING_SINCE, SERVING_BEFORE}
    assert any("back into routing" in n for n in step.notes)
    assert env.state.pod_names("llm", "chat-decode") == sorted((a, b, c))


def test_a_standby_forgets_and_rereads_the_pods_when_it_leads_again(env: Env) -> None:
    a, b = _deployment(env, 2)
    drainer = env.drainer()
    assert drainer.reach(D, 2, current=2, reasons=[], now_s=T0).outcome == "unchanged"
    lists = env.state.lists
    drainer.reach(D, 2, current=2, reasons=[], now_s=T0 + 15)
    assert env.state.lists == lists  # nothing draining: no pod LIST while steady
    # Meanwhile another leader started a drain of b; this replica was standby.
    drainer.standby()
    env.work.set(a, 0, T0)
    env.work.set(b, 0, T0)
    env.drainer().reach(D, 1, current=2, reasons=[], now_s=T0 + 20)
    step = drainer.reach(D, 2, current=2, reasons=[], now_s=T0 + 40)
    assert any("back into routing" in n for n in step.notes)
    assert all(env.pod(p)["labels"][LABEL] == "true" for p in (a, b))


def test_a_scale_up_during_a_drain_takes_the_draining_replica_back_first(env: Env) -> None:
    a, b, c = _deployment(env)
    for pod, running in ((a, 2), (b, 0), (c, 2)):
        env.work.set(pod, running, T0 - 1)
    drainer = env.drainer()
    drainer.reach(D, 2, current=3, reasons=[], now_s=T0)
    assert env.pod(b)["labels"][LABEL] == "drained"
    env.state.log.clear()
    step = drainer.reach(D, 4, current=3, reasons=["burst"], now_s=T0 + 15)
    assert step.outcome == "applied"
    assert env.state.log[0][:2] == ("patch", b) and f"{LABEL}=true" in env.state.log[0][2]
    assert env.state.log[1] == ("scale", "chat-decode", "4")
    assert env.pod(b)["labels"][LABEL] == "true"
    assert len(env.state.pod_names("llm", "chat-decode")) == 4 and b in \
        env.state.pod_names("llm", "chat-decode")
    assert _metric(env, "pdscale_drain_replicas", pdscale_pool="decode") == 0


def test_a_scale_up_goes_through_when_the_pods_cannot_be_read(env: Env) -> None:
    """One throttled pod LIST (429) during a drain used to fail the whole step: no /scale
    write that tick while the load spiked. The scale-up is written; the drained pod is taken
    back on the next tick that reads the pods."""
    a, b, c = _deployment(env)
    for pod, running in ((a, 4), (b, 1), (c, 6)):
        env.work.set(pod, running, T0 - 5)
    drainer = env.drainer()
    assert drainer.reach(D, 2, current=3, reasons=[], now_s=T0).outcome == "draining"
    env.state.throttle = 1
    step = drainer.reach(D, 6, current=3, reasons=["spike"], now_s=T0 + 15)
    assert step.outcome == "applied" and "could not be read" in step.notes[0]
    assert env.state.objects[("llm", "deployments", "chat-decode")]["replicas"] == 6
    drainer.reach(D, 6, current=6, reasons=[], now_s=T0 + 30)
    assert env.pod(b)["labels"][LABEL] == "true"


def test_a_draining_pod_deleted_by_someone_else_ends_its_drain(env: Env) -> None:
    """kubectl delete pod on a draining replica left a phantom drain: /v1/status listed it
    and pdscale_drain_replicas stayed 1 for good."""
    a, b, c = _deployment(env)
    for pod, running in ((a, 4), (b, 1), (c, 6)):
        env.work.set(pod, running, T0 - 5)
    drainer = env.drainer()
    drainer.reach(D, 2, current=3, reasons=[], now_s=T0)
    assert _metric(env, "pdscale_drain_replicas", pdscale_pool="decode") == 1
    env.state._delete("llm", b)
    env.state._converge(("llm", "deployments", "chat-decode"))
    step = drainer.reach(D, 3, current=3, reasons=[], now_s=T0 + 30)
    assert any(f"{b} no longer in the pool" in n for n in step.notes)
    assert drainer.snapshot(T0 + 60)["in_progress"] == {}
    assert _metric(env, "pdscale_drain_replicas", pdscale_pool="decode") == 0
    assert drainer.records[-1]["outcome"] == "gone"


def test_pod_patches_retry_409_conflicts_and_redecide_on_what_they_read(env: Env) -> None:
    a, b = _deployment(env, 2)
    env.work.set(a, 3, T0)
    env.work.set(b, 0, T0)
    env.state.pod_conflicts = 2
    drainer = env.drainer()
    drainer.reach(D, 1, current=2, reasons=[], now_s=T0)
    assert env.pod(b)["labels"][LABEL] == "drained"
    assert json.loads(env.pod(b)["annotations"][SERVING_BEFORE]) == "true"
    # A conflict caused by a real concurrent change: drain_instance took b out of serving
    # (without pdscale's annotations) between our read and our write. The retry reads it
    # again, so taking b back restores what it found, not a stale value.
    backend = env.backend()
    backend.resume_routing(D, b)
    assert env.pod(b)["labels"][LABEL] == "true"
    real_patch = k8s.CoreV1Api.patch_namespaced_pod
    calls = {"n": 0}

    def concurrent(self: k8s.CoreV1Api, name: str, namespace: str, body: object,
                   **kw: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:  # someone relabels the pod just before our first write lands
            env.state.pods[("llm", name)]["metadata"]["labels"][LABEL] = "drained"
            env.state.pods[("llm", name)]["metadata"]["resourceVersion"] = "99"
        return real_patch(self, name, namespace, body, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(k8s.CoreV1Api, "patch_namespaced_pod", concurrent)
        backend.stop_routing(D, b, since_s=T0, reason="test")
    assert calls["n"] == 2
    assert json.loads(env.pod(b)["annotations"][SERVING_BEFORE]) == "drained"
    backend.resume_routing(D, b)
    assert env.pod(b)["labels"][LABEL] == "drained"  # as the other writer left it
    env.state.pod_conflicts = 99
    with pytest.raises(KubeUnavailable, match="still conflicting after 5 retries"):
        backend.stop_routing(D, a, since_s=T0, reason="test")


def test_a_statefulset_drains_and_removes_its_highest_ordinal(env: Env) -> None:
    pods = env.state.add_workload("llm", "statefulsets", "chat-decode", 3,
                                  labels={LABEL: "true"})
    env.state.log.clear()
    assert pods == ["chat-decode-0", "chat-decode-1", "chat-decode-2"]
    env.work.set("chat-decode-0", 0, T0)  # the idlest, but not the one a StatefulSet removes
    env.work.set("chat-decode-1", 3, T0)
    env.work.set("chat-decode-2", 2, T0)
    drainer = env.drainer("StatefulSet")
    step = drainer.reach(D, 2, current=3, reasons=[], now_s=T0)
    assert any("highest ordinal" in n for n in step.notes)
    assert env.pod("chat-decode-2")["labels"][LABEL] == "drained"
    env.work.set("chat-decode-2", 0, T0 + 20)
    drainer.reach(D, 2, current=3, reasons=[], now_s=T0 + 20)
    assert env.state.pod_names("llm", "chat-decode") == ["chat-decode-0", "chat-decode-1"]
    assert not any(COST in e[2] for e in env.state.log if e[0] == "patch")  # no deletion cost


def test_a_taken_back_pod_gets_its_own_deletion_cost_back(env: Env) -> None:
    _, b = _deployment(env, 2)
    env.state.pods[("llm", b)]["metadata"]["annotations"][COST] = "5"
    backend = env.backend()
    backend.stop_routing(D, b, since_s=T0, reason="test")
    env.state.managed.clear()  # the scale write below must not delete it yet
    backend.remove_replicas(D, [b], 1, ["test"])
    assert env.pod(b)["annotations"][COST] == "-2147483648"
    assert env.pod(b)["annotations"][DELETION_COST_BEFORE] == "5"
    backend.resume_routing(D, b)
    assert env.pod(b)["annotations"][COST] == "5"
    assert DELETION_COST_BEFORE not in env.pod(b)["annotations"]


def test_a_workload_selecting_on_the_serving_label_is_refused_with_the_fix(env: Env) -> None:
    _deployment(env, 2)
    env.state.selectors[("llm", "deployments", "chat-decode")] = {"app": "chat-decode",
                                                                   LABEL: "true"}
    with pytest.raises(KubeRejected, match="Service's selector only"):
        env.backend().pool_replicas(D)


def _reconciler(env: Env, decide: dict[tuple[str, Role], int]) -> Reconciler:
    from pdscale.controller._constraints import Constraints
    from pdscale.controller._interface import (
        Observation,
        PoolDecision,
        PoolObservation,
        PoolReplicas,
    )
    from pdscale.controller._reconciler import SourceResult

    actuator = KubeScaleActuator(env.api, {
        D: ScaleRef("llm", ScaleTarget(name="chat-decode")),
        P: ScaleRef("llm", ScaleTarget(name="chat-prefill"))})
    backend = KubeDrainBackend(actuator, {D: "chat-decode-.*", P: "chat-prefill-.*"})

    class Source:
        def observe(self, now_s: float) -> SourceResult:
            pools = {}
            for key, status in actuator.read_statuses([D, P]).items():
                assert not isinstance(status, Exception)
                pools[key] = PoolObservation(key, PoolReplicas(
                    status.ready, 0, 0, status.desired, 1, 8), {}, now_s)
            return SourceResult(Observation(now_s, pools))

    class Policy:
        name = "fixed"

        def decide(self, obs: Observation) -> dict[tuple[str, Role], PoolDecision]:
            return {k: PoolDecision(v, ("fixed",), "scale_down") for k, v in decide.items()}

    clock = ManualClock(T0)
    drainer = Drainer(backend, env.work, timeout_s=300, settle_s=10, telemetry=env.telemetry)
    return Reconciler(Policy(), Source(), actuator, clock,  # type: ignore[arg-type]
                      constraints=Constraints.from_spec(SPEC), telemetry=env.telemetry,
                      drainer=drainer, refit_in_background=False)


def test_the_reconciler_records_the_drain_as_the_decision_and_its_reasons(env: Env) -> None:
    a, b, c = _deployment(env)
    env.state.add_workload("llm", "deployments", "chat-prefill", 1)
    for pod, running in ((a, 2), (b, 0), (c, 5)):
        env.work.set(pod, running, T0)
    rec = _reconciler(env, {D: 2, P: 1})
    report = rec.tick()
    record = report.decisions[D]
    assert record.outcome == "draining" and record.desired == 2 and record.current == 3
    assert any(r.startswith(f"drain: {b} chosen (least work of 3 ready") for r in record.reasons)
    assert record.detail["drain"]["stopped_routing"] == [b]  # type: ignore[index]
    assert report.decisions[P].outcome == "unchanged"
    assert rec.snapshot()["pools"]["chat/decode"]["outcome"] == "draining"


def test_without_pod_rights_scale_ups_go_through_and_scale_downs_wait(env: Env) -> None:
    _deployment(env)
    env.state.add_workload("llm", "deployments", "chat-prefill", 1)
    env.state.forbidden_pods = True
    rec = _reconciler(env, {D: 2, P: 3})
    report = rec.tick()
    assert report.decisions[D].outcome == "failed"
    assert any("scale-down held" in r for r in report.decisions[D].reasons)
    assert report.decisions[P].outcome == "applied"
    assert env.state.objects[("llm", "deployments", "chat-prefill")]["replicas"] == 3
    assert env.state.objects[("llm", "deployments", "chat-decode")]["replicas"] == 3
    assert any("deploy/scale-down-drain" in e.message for e in report.errors)


@pytest.mark.parametrize("enabled", [True, False], ids=["drains-on", "drains-off"])
def test_a_drain_left_by_a_routing_mark_is_taken_back_without_one(env: Env,
                                                                   enabled: bool) -> None:
    """After a restart with controller.drain.stop_routing: false (docs/drains.md's advice
    for Dynamo), a pod an earlier configuration had taken out of routing stayed out for good:
    the path without a mark read its annotation as a drain in progress."""
    a, b, c = _deployment(env)
    for pod, running in ((a, 4), (b, 1), (c, 6)):
        env.work.set(pod, running, T0 - 5)
    env.drainer().reach(D, 2, current=3, reasons=[], now_s=T0)
    assert env.pod(b)["labels"][LABEL] == "drained"
    backend = KubeDrainBackend(
        KubeScaleActuator(env.api, {D: ScaleRef("llm", ScaleTarget(name="chat-decode"))}),
        {D: "chat-decode-.*"}, routing_mark=False)
    unmarked = Drainer(backend, env.work, timeout_s=300, settle_s=10,
                       telemetry=env.telemetry, enabled=enabled)
    step = unmarked.reach(D, 3, current=3, reasons=[], now_s=T0 + 3600)
    assert env.pod(b)["labels"][LABEL] == "true"
    assert "pdscale.io/draining-since" not in (env.pod(b).get("annotations") or {})
    assert step.detail["drain"]["taken_back"] == [b]
    assert unmarked.snapshot(T0 + 3600)["in_progress"] == {}


def test_with_drains_off_a_drain_left_on_a_pod_is_taken_back(env: Env) -> None:
    a, b = _deployment(env, 2)
    env.drainer().reach(D, 1, current=2, reasons=[], now_s=T0)
    drained = next(p for p in (a, b) if env.pod(p)["labels"][LABEL] == "drained")
    env.state.log.clear()
    cleanup = env.drainer(enabled=False)
    step = cleanup.reach(D, 2, current=2, reasons=[], now_s=T0 + 20)
    assert step.outcome == "unchanged"
    assert env.pod(drained)["labels"][LABEL] == "true"
    assert env.state.log == [("patch", drained, f"{DRAIN_REASON}=None,{DRAINING_SINCE}=None,"
                              f"{SERVING_BEFORE}=None,{LABEL}=true")]
    # Then it scales as before drains existed: one plain write, no pod LIST.
    lists = env.state.lists
    assert cleanup.reach(D, 1, current=2, reasons=[], now_s=T0 + 35).outcome == "applied"
    assert env.state.lists == lists
    assert env.state.objects[("llm", "deployments", "chat-decode")]["replicas"] == 1


def test_without_a_routing_mark_the_least_loaded_pod_goes_at_once(env: Env) -> None:
    """controller.drain.stop_routing: false (routers that do not follow the serving label,
    such as Dynamo's own discovery): no label, the least-loaded pod gets the lowest deletion
    cost and the count drops in the same tick; the pod drains in its own SIGTERM handler."""
    a, b, c = _deployment(env)
    for pod, running in ((a, 4), (b, 1), (c, 6)):
        env.work.set(pod, running, T0)
    backend = env.backend()
    backend.routing_mark = False
    drainer = Drainer(backend, env.work, timeout_s=300, settle_s=10, telemetry=env.telemetry)
    step = drainer.reach(D, 2, current=3, reasons=["forecast"], now_s=T0)
    assert step.outcome == "applied"
    assert [e[:2] for e in env.state.log] == [("patch", b), ("scale", "chat-decode"),
                                              ("delete", b)]
    assert env.state.log[0][2] == f"{COST}=-2147483648"  # no serving label touched
    assert any(f"{b} chosen (least work of 3 ready: 1 running" in n for n in step.notes)
    step = drainer.reach(D, 2, current=2, reasons=[], now_s=T0 + 15)
    assert any(f"{b} drained and exited" in n for n in step.notes)


def test_the_controller_wires_the_drain_from_the_spec(env: Env) -> None:
    from pdscale.controller._runtime import Controller
    from pdscale.telemetry import PrometheusReader

    reader = PrometheusReader("http://127.0.0.1:9", timeout_s=1)
    on = Controller(SPEC, env.api, reader, clock=ManualClock(T0), leader_election=False)
    assert on.reconciler.drainer is not None and on.reconciler.drainer.enabled
    assert isinstance(on.reconciler.drainer.backend, KubeDrainBackend)
    status = on.status()["drains"]
    assert status["enabled"] and status["timeout_s"] == 300 and status["in_progress"] == {}
    off_spec = SPEC.model_copy(update={"controller": SPEC.controller.model_copy(
        update={"drain": SPEC.controller.drain.model_copy(update={"enabled": False})})})
    off = Controller(off_spec, env.api, reader, clock=ManualClock(T0), leader_election=False)
    assert off.reconciler.drainer is not None and not off.reconciler.drainer.enabled
    recommend = SPEC.model_copy(update={"controller": SPEC.controller.model_copy(
        update={"mode": "recommend"})})
    rec = Controller(recommend, env.api, reader, clock=ManualClock(T0), leader_election=False)
    assert rec.reconciler.drainer is None and rec.status()["drains"] is None
    for c in (on, off, rec):
        c.reconciler.close()
        c.telemetry.shutdown()
