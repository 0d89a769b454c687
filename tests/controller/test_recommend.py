from __future__ import annotations

from controller._recommend import hpa_manifests, keda_manifests
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
