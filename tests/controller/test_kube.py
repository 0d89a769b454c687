"""The Kubernetes actuator through the official client against an in-test API stand-in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from pdscale.controller._kube import KubeRejected, KubeScaleActuator, KubeUnavailable, ScaleRef
from pdscale.spec import Role, ScaleTarget
from tests.controller.kube_standin import ApiState, api_standin

KEYS = {
    ("chat", Role.PREFILL): ScaleRef("llm", ScaleTarget(name="chat-prefill")),
    ("chat", Role.DECODE): ScaleRef("llm", ScaleTarget(api_version="apps/v1",
                                                       kind="StatefulSet", name="chat-decode")),
    ("lws", Role.PREFILL): ScaleRef("llm", ScaleTarget(
        api_version="leaderworkerset.x-k8s.io/v1", kind="LeaderWorkerSet", name="lws-p")),
}


@pytest.fixture
def setup() -> Iterator[tuple[ApiState, KubeScaleActuator]]:
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 2)
    state.add("llm", "statefulsets", "chat-decode", 3)
    state.add("llm", "leaderworkersets", "lws-p", 1)
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            yield state, KubeScaleActuator(api, KEYS)


def test_scales_each_kind_and_records_an_event(setup: tuple[ApiState, KubeScaleActuator]
                                               ) -> None:
    state, actuator = setup
    for key, replicas in zip(KEYS, (5, 4, 2), strict=True):
        actuator.set_replicas(key, replicas, ["forecast q0.9 = 1e5 tokens/s"])
    assert state.objects[("llm", "deployments", "chat-prefill")]["replicas"] == 5
    assert state.objects[("llm", "statefulsets", "chat-decode")]["replicas"] == 4
    assert state.objects[("llm", "leaderworkersets", "lws-p")]["replicas"] == 2
    assert len(state.events) == 3
    assert "from 2 to 5" in state.events[0]["message"]
    assert state.events[0]["reason"] == "PdscaleScaled"


def test_no_write_when_already_there(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    actuator.set_replicas(("chat", Role.PREFILL), 2, ["steady"])
    assert state.writes == 0 and not state.events


def test_conflicts_are_retried(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    state.conflicts = 2
    actuator.set_replicas(("chat", Role.PREFILL), 7, ["burst"])
    assert state.objects[("llm", "deployments", "chat-prefill")]["replicas"] == 7
    state.conflicts = 99
    with pytest.raises(KubeUnavailable, match="still conflicting"):
        actuator.set_replicas(("chat", Role.PREFILL), 8, ["burst"])


def test_missing_target_and_rbac_are_rejected_clearly(
        setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    del state.objects[("llm", "deployments", "chat-prefill")]
    with pytest.raises(KubeRejected, match="Deployment llm/chat-prefill was not found"):
        actuator.set_replicas(("chat", Role.PREFILL), 3, [])
    state.forbidden_namespaces.add("llm")
    with pytest.raises(KubeRejected, match="RBAC forbids get on statefulsets/scale"):
        actuator.set_replicas(("chat", Role.DECODE), 3, [])


def test_throttling_says_when_to_retry(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    state.throttle = 1
    with pytest.raises(KubeUnavailable) as info:
        actuator.set_replicas(("chat", Role.DECODE), 9, [])
    assert info.value.retry_after_s == 2
    actuator.set_replicas(("chat", Role.DECODE), 9, [])
    assert state.objects[("llm", "statefulsets", "chat-decode")]["replicas"] == 9


def test_dry_run_never_writes(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    actuator.dry_run = True
    actuator.set_replicas(("chat", Role.PREFILL), 10, ["advisory"])
    assert state.writes == 0 and actuator.writes == [(("chat", Role.PREFILL), 10)]


def test_prime_sends_dry_runs_only(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    before = {k: dict(v) for k, v in state.objects.items()}
    actuator.prime()
    assert state.dry_runs >= 2  # a dry-run write and Event per kind
    assert state.writes == 0 and not state.events
    assert {k: v["replicas"] for k, v in state.objects.items()} == \
        {k: v["replicas"] for k, v in before.items()}


def test_one_list_per_namespace_and_kind(setup: tuple[ApiState, KubeScaleActuator]) -> None:
    state, actuator = setup
    out = actuator.read_statuses(list(KEYS))
    assert state.lists == 3  # deployments, statefulsets, leaderworkersets in one namespace
    status = out[("chat", Role.PREFILL)]
    assert not isinstance(status, Exception)
    assert (status.desired, status.ready) == (2, 2)
    del state.objects[("llm", "statefulsets", "chat-decode")]
    missing = actuator.read_statuses(list(KEYS))[("chat", Role.DECODE)]
    assert isinstance(missing, KubeRejected) and "not found" in str(missing)
    state.forbidden_namespaces.add("llm")
    denied = actuator.read_statuses(list(KEYS))[("chat", Role.PREFILL)]
    assert isinstance(denied, KubeRejected) and "RBAC" in str(denied)


@pytest.mark.parametrize(("kind", "plural"), [
    ("Deployment", "deployments"), ("StatefulSet", "statefulsets"),
    ("LeaderWorkerSet", "leaderworkersets"),
    ("DynamoGraphDeploymentScalingAdapter", "dynamographdeploymentscalingadapters"),
    ("InferencePolicy", "inferencepolicies"), ("Gateway", "gateways"),
    ("InferencePool", "inferencepools"), ("Ingress", "ingresses"), ("Mesh", "meshes"),
    ("Box", "boxes")])
def test_plurals_follow_the_kubernetes_convention(kind: str, plural: str) -> None:
    """A ...Policy kind became ...policys (a 404 on every scale call)."""
    assert ScaleRef("ns", ScaleTarget(api_version="x.io/v1", kind=kind, name="n")).plural == \
        plural


def test_a_custom_resource_policy_kind_scales(tmp_path: object) -> None:
    state = ApiState()
    state.add("llm", "inferencepolicies", "pool-a", 1)
    key = ("p", Role.PREFILL)
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            actuator = KubeScaleActuator(api, {key: ScaleRef("llm", ScaleTarget(
                api_version="example.io/v1", kind="InferencePolicy", name="pool-a"))})
            actuator.set_replicas(key, 3, ["test"])
    assert state.objects[("llm", "inferencepolicies", "pool-a")]["replicas"] == 3
