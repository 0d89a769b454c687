"""Recommendation mode: manifests that let an existing KEDA or HPA act on pdscale's decisions.

Teams that keep their autoscaler run pdscale in recommendation mode: it only exports
``pdscale_desired_replicas`` per pool, and these manifests make KEDA (a ``prometheus`` trigger)
or an HPA (an External metric served by prometheus-adapter) follow it. Both use an
``AverageValue`` target of 1: the HPA then computes ceil(metric / 1) = the metric, whatever the
current replica count (a ``Value`` target would multiply by it). pdscale's bounds become the
scaler's bounds; scale-up acts at once.

Missing metrics hold, never shrink: pdscale's own rule is that no data means no scale-down,
and the scaler must keep it when ``pdscale_desired_replicas`` disappears (the controller is
down, Prometheus is down, the series went stale).

* KEDA: the Prometheus scaler reads an empty result as 0 by default (``ignoreNullValues``
  true), which would take the pool to its minimum. The trigger sets it to "false", so an empty
  result is a scaler error, and ``fallback`` (after ``FALLBACK_FAILURES`` failed polls) with
  ``behavior: currentReplicas`` keeps the replicas the pool has (KEDA 2.17 and later; older
  KEDA rejects the field: remove it there, and without a usable metric the HPA holds anyway).
* HPA: a failed External metric makes the HPA keep its replica count (FailedGetExternalMetric).
* Both: a scale-down stabilisation window of ``SCALE_DOWN_STABILISATION_S``, so one bad poll
  (a gap, a restarted controller's first seconds) cannot shrink a pool; pdscale's own
  stabilisation comes before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pdscale.spec import PoolSpec, Role, ServiceSpec, Spec

__all__ = ["FALLBACK_FAILURES", "SCALE_DOWN_STABILISATION_S", "hpa_manifests",
           "keda_manifests"]

FALLBACK_FAILURES = 3
"""Failed polls (15 s each) before KEDA's fallback holds the pool."""
SCALE_DOWN_STABILISATION_S = 120
"""The scaler's own scale-down window: longer than a few polls, short beside pdscale's."""


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
                "fallback": {"failureThreshold": FALLBACK_FAILURES,
                             "replicas": pool.min_replicas,
                             "behavior": "currentReplicas"},
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                    "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILISATION_S},
                    "scaleUp": {"stabilizationWindowSeconds": 0}}}},
                "triggers": [{
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {"serverAddress": prometheus_url,
                                 "query": _query(service.name, role),
                                 "threshold": "1",
                                 # An empty result is an error (then the fallback holds),
                                 # not 0.
                                 "ignoreNullValues": "false"},
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
                    "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILISATION_S,
                                  "policies": [{"type": "Percent", "value": 100,
                                                "periodSeconds": 15}]},
                },
            },
        })
    return out
