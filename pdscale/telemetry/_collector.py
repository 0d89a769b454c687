"""The OpenTelemetry Collector configuration for engines that push OTLP through a Collector
(``pdscale generate otel-collector SPEC``): a pure function of the spec, returned as a plain
dict.

Design. The Collector's OTLP receiver takes the engines' exports (gRPC 4317, HTTP 4318);
metrics leave through its Prometheus exporter, which Prometheus scrapes, so the generated
recording rules read them as they read an engine's own ``/metrics``. Those rules select a
pool by the ``namespace`` and ``pod`` labels (and the pool's ``match_labels``) that a
Kubernetes scrape adds (telemetry._catalog); an OTLP export carries them as resource
attributes instead, which the Prometheus exporter only puts on ``target_info``. So a
``transform`` processor copies them onto every data point, as the exporter's README advises:
``namespace`` from ``k8s.namespace.name``, ``pod`` from ``k8s.pod.name`` (the attributes the
``k8sattributes`` processor adds, or the downward API through ``OTEL_RESOURCE_ATTRIBUTES``),
each ``match_labels`` key from the resource attribute of that name; a pool selected by
``selector.resource_attributes`` (hosts without Kubernetes) gets its service's namespace and
a pod name ``<scale target>-<service.instance.id>``, which its default pod regex matches.
Where the spec runs pdscale's OTLP receiver, spans and metrics are forwarded to it as well.

The structure is the Collector's documented one (opentelemetry.io/docs/collector/
configuration, the component READMEs); no Collector binary is run here:
tests/telemetry/test_collector.py checks the output against the documented keys recorded in
tests/telemetry/reference/otel_collector.json and applies the statements to resources.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pdscale.spec import Spec
from pdscale.telemetry._otlp_pools import NAMESPACE_ATTRIBUTE, POD_ATTRIBUTE

__all__ = ["COLLECTOR_TOKEN_ENV", "collector_config", "collector_notes"]

COLLECTOR_TOKEN_ENV = "PDSCALE_OTLP_TOKEN"
"""The environment variable the Collector reads pdscale's OTLP bearer token from."""

_INSTANCE_ATTRIBUTE = "service.instance.id"


def _quote(value: str) -> str:
    """An OTTL string literal (double-quoted, backslash escapes, as JSON writes them)."""
    return json.dumps(value)


def _attr(name: str, *, resource: bool = False) -> str:
    return f"{'resource.' if resource else ''}attributes[{_quote(name)}]"


def _label_statements(spec: Spec) -> list[str]:
    """OTTL statements (datapoint context) that put the selectors' labels on data points."""
    out = []
    for label, attribute in (("namespace", NAMESPACE_ATTRIBUTE), ("pod", POD_ATTRIBUTE)):
        source = _attr(attribute, resource=True)
        out.append(f"set({_attr(label)}, {source}) where {source} != nil")
    extra = sorted({k for s in spec.services for p in s.pools.values()
                    for k in p.selector.match_labels})
    for key in extra:
        source = _attr(key, resource=True)
        out.append(f"set({_attr(key)}, {source}) where {source} != nil")
    for service in spec.services:
        for pool in service.pools.values():
            given = pool.selector.resource_attributes
            if not given:
                continue
            where = " and ".join(f"{_attr(k, resource=True)} == {_quote(v)}"
                                 for k, v in sorted(given.items()))
            out.append(f"set({_attr('namespace')}, {_quote(service.namespace)}) where {where}")
            instance = _attr(_INSTANCE_ATTRIBUTE, resource=True)
            if re.fullmatch(pool.pod_regex, f"{pool.target.name}-0"):
                out.append(f"set({_attr('pod')}, Concat([{_quote(pool.target.name)}, "
                           f"{instance}], \"-\")) where {where} and {instance} != nil")
    return out


def collector_notes(spec: Spec) -> list[str]:
    """What the configuration cannot do for this spec, in words (the file's header)."""
    notes = []
    for service in spec.services:
        for role, pool in service.pools.items():
            if pool.selector.resource_attributes and \
                    not re.fullmatch(pool.pod_regex, f"{pool.target.name}-0"):
                notes.append(f"{service.name}/{role.value}: its pod regex "
                             f"{pool.pod_regex!r} does not match '{pool.target.name}-<id>', "
                             "so no pod label is set for it: set k8s.pod.name on its "
                             "resource")
    return notes


def collector_config(spec: Spec, *, pdscale_endpoint: str = "pdscale.pdscale-system.svc:4317",
                     prometheus_endpoint: str = "0.0.0.0:8889") -> dict[str, Any]:
    """The Collector configuration for ``spec``: OTLP in; metrics out to a Prometheus
    exporter on ``prometheus_endpoint`` with the selectors' labels on every point; spans and
    metrics also to pdscale's OTLP/gRPC receiver at ``pdscale_endpoint`` where the spec runs
    it."""
    processors: dict[str, Any] = {
        # Refuse data before the Collector runs out of memory (the exporters retry).
        "memory_limiter": {"check_interval": "1s", "limit_percentage": 80,
                           "spike_limit_percentage": 20},
        "transform/pdscale_labels": {
            "error_mode": "ignore",
            "metric_statements": [{"context": "datapoint",
                                   "statements": _label_statements(spec)}],
        },
        "batch": {},
    }
    exporters: dict[str, Any] = {
        "prometheus": {"endpoint": prometheus_endpoint, "metric_expiration": "5m"},
    }
    pipelines: dict[str, Any] = {
        "metrics": {"receivers": ["otlp"],
                    "processors": ["memory_limiter", "transform/pdscale_labels", "batch"],
                    "exporters": ["prometheus"]},
    }
    if spec.controller.otlp_receiving:
        pdscale: dict[str, Any] = {"endpoint": pdscale_endpoint, "tls": {"insecure": True}}
        auth = spec.controller.otlp.auth
        if auth.bearer_token_file or auth.bearer_token_env:
            pdscale["headers"] = {"authorization": f"Bearer ${{env:{COLLECTOR_TOKEN_ENV}}}"}
        elif auth.basic_auth_file:
            pdscale["headers"] = {"authorization": f"Basic ${{env:{COLLECTOR_TOKEN_ENV}}}"}
        exporters["otlp/pdscale"] = pdscale
        pipelines["metrics"]["exporters"].append("otlp/pdscale")
        pipelines["traces"] = {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"],
                               "exporters": ["otlp/pdscale"]}
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"},
                                             "http": {"endpoint": "0.0.0.0:4318"}}}},
        "processors": processors,
        "exporters": exporters,
        "service": {"pipelines": pipelines},
    }
