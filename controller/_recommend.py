"""Recommendation mode: manifests that let an existing KEDA or HPA act on pdscale's decisions.

Teams that keep their autoscaler run pdscale in recommendation mode: it only exports
``pdscale_desired_replicas`` per pool, and these manifests make KEDA (a ``prometheus`` trigger)
or an HPA (an External metric served by prometheus-adapter) follow it. Both use an
``AverageValue`` target of 1: the HPA then computes ceil(metric / 1) = the metric, whatever the
current replica count (a ``Value`` target would multiply by it). pdscale's bounds become the
scaler's bounds; the scale-down stabilisation stays in pdscale, so the scaler's own windows are
set to act at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pdscale.spec import PoolSpec, Role, ServiceSpec, Spec

__all__ = ["hpa_manifests", "keda_manifests"]


def _query(service: str, role: Role) -> str:
    return (f'max(pdscale_desired_replicas{{pdscale_service="{service}",'
            f'pdscale_pool="{role.value}"}})')


def _pools(spec: Spec) -> Iterator[tuple[ServiceSpec, Role, PoolSpec]]:
    for service in spec.services:
        for role in Role:
            yield service, role, service.pools[role]


def _common(service: ServiceSpec, pool: PoolSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """Metadata and scale-target reference shared by both kinds of scaler."""
    metadata = {"name": f"{pool.target.name}-pdscale", "namespace": service.namespace,
                "labels": {"app.kubernetes.io/managed-by": "pdscale"}}
    target = {"apiVersion": pool.target.api_version, "kind": pool.target.kind,
              "name": pool.target.name}
    return metadata, target


def keda_manifests(spec: Spec, *, prometheus_url: str) -> list[dict[str, Any]]:
    """One KEDA ScaledObject per pool, following ``pdscale_desired_replicas``."""
    out = []
    for service, role, pool in _pools(spec):
        metadata, target = _common(service, pool)
        out.append({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": metadata,
            "spec": {
                "scaleTargetRef": target,
                "minReplicaCount": pool.min_replicas,
                "maxReplicaCount": pool.max_replicas,
                "pollingInterval": 15,
                "cooldownPeriod": 30,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                    "scaleDown": {"stabilizationWindowSeconds": 0},
                    "scaleUp": {"stabilizationWindowSeconds": 0}}}},
                "triggers": [{
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {"serverAddress": prometheus_url,
                                 "query": _query(service.name, role),
                                 "threshold": "1"},
                }],
            },
        })
    return out


def hpa_manifests(spec: Spec) -> list[dict[str, Any]]:
    """One autoscaling/v2 HPA per pool on the External metric ``pdscale_desired_replicas``
    (expose it with prometheus-adapter; selector labels pick the pool)."""
    out = []
    for service, role, pool in _pools(spec):
        metadata, target = _common(service, pool)
        out.append({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": metadata,
            "spec": {
                "scaleTargetRef": target,
                "minReplicas": pool.min_replicas,
                "maxReplicas": pool.max_replicas,
                "metrics": [{
                    "type": "External",
                    "external": {
                        "metric": {"name": "pdscale_desired_replicas",
                                   "selector": {"matchLabels": {
                                       "pdscale_service": service.name,
                                       "pdscale_pool": role.value}}},
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }],
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 0,
                                "policies": [{"type": "Percent", "value": 1000,
                                              "periodSeconds": 15}]},
                    "scaleDown": {"stabilizationWindowSeconds": 0,
                                  "policies": [{"type": "Percent", "value": 100,
                                                "periodSeconds": 15}]},
                },
            },
        })
    return out
