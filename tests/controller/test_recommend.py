from __future__ import annotations

from pdscale.controller._recommend import hpa_manifests, keda_manifests
from pdscale.spec import Spec


def test_one_scaler_per_pool_with_the_spec_bounds(example: tuple[str, Spec]) -> None:
    _, spec = example
    keda = keda_manifests(spec, prometheus_url="http://prometheus.monitoring:9090")
    hpa = hpa_manifests(spec)
    pools = [p for s in spec.services for p in s.pools.values()]
    assert len(keda) == len(hpa) == len(pools)
    for obj, pool in zip(keda, pools, strict=True):
        assert obj["spec"]["scaleTargetRef"]["name"] == pool.target.name
        assert obj["spec"]["minReplicaCount"] == pool.min_replicas
        trigger = obj["spec"]["triggers"][0]
        assert trigger["metricType"] == "AverageValue" and trigger["metadata"]["threshold"] == "1"
        assert "pdscale_desired_replicas" in trigger["metadata"]["query"]
    for obj, pool in zip(hpa, pools, strict=True):
        assert obj["spec"]["maxReplicas"] == pool.max_replicas
        target = obj["spec"]["metrics"][0]["external"]["target"]
        assert target == {"type": "AverageValue", "averageValue": "1"}


def test_hpa_manifests_validate_against_the_kubernetes_schema(example: tuple[str, Spec]) -> None:
    import kubernetes_validate

    _, spec = example
    for obj in hpa_manifests(spec):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


# KEDA 2.17 added fallback.behavior; the newest KEDA models installable here are 2.16's, so
# the field is checked against the values KEDA 2.17+ documents and the rest against 2.16.
_FALLBACK_BEHAVIORS_2_17 = {"static", "currentReplicas", "currentReplicasIfHigher",
                            "currentReplicasIfLower"}


def test_keda_manifests_validate_against_keda_s_schema(example: tuple[str, Spec]) -> None:
    """Every field is one KEDA's ScaledObject model knows (a round trip through the model
    drops nothing), with KEDA's types."""
    import copy

    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    _, spec = example
    for obj in keda_manifests(spec, prometheus_url="http://prometheus.monitoring:9090"):
        expected = copy.deepcopy(obj)
        behavior = expected["spec"]["fallback"].pop("behavior")
        assert behavior in _FALLBACK_BEHAVIORS_2_17
        model = ScaledObject.model_validate(expected)
        assert model.model_dump(by_alias=True, exclude_none=True) == expected


def test_missing_recommendations_hold_the_pool(example: tuple[str, Spec]) -> None:
    """KEDA reads an empty query as 0 unless told otherwise: the manifests make it an error,
    fall back to the current replicas, and shrink only after a stabilisation window."""
    _, spec = example
    for obj in keda_manifests(spec, prometheus_url="http://prometheus.monitoring:9090"):
        s = obj["spec"]
        assert s["triggers"][0]["metadata"]["ignoreNullValues"] == "false"
        assert s["fallback"]["behavior"] == "currentReplicas"
        assert s["fallback"]["failureThreshold"] >= 1
        behavior = s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] > 0
    for obj in hpa_manifests(spec):
        assert obj["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > 0
