"""Which pool an OTLP resource belongs to: the spec's resource-attribute selectors.

A pool's selector is ``selector.resource_attributes`` (exact values, e.g. ``service.name``)
when the spec gives it; otherwise ``k8s.namespace.name`` equal to the service's namespace and
``k8s.pod.name`` matching the pool's pod regex, the same pods the Prometheus selectors pick
(the attributes the Collector's ``k8sattributes`` processor adds, or that an engine's
``OTEL_RESOURCE_ATTRIBUTES`` gets from the downward API). A resource that no pool selects,
or that two pools select, is dropped and counted (``unknown_pool``, ``ambiguous_pool``):
never guessed. Resources repeat in every export, so each distinct one is matched once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pdscale.spec import PoolKey, Spec

__all__ = ["NAMESPACE_ATTRIBUTE", "POD_ATTRIBUTE", "PoolMatcher", "resource_selector"]

NAMESPACE_ATTRIBUTE = "k8s.namespace.name"
POD_ATTRIBUTE = "k8s.pod.name"
_CACHE_LIMIT = 8192
"""Distinct resources remembered (one per engine process; cleared when full)."""


@dataclass(frozen=True)
class _Selector:
    key: PoolKey
    exact: tuple[tuple[str, str], ...]
    pod: re.Pattern[str] | None

    def matches(self, attrs: Mapping[str, str]) -> bool:
        if any(attrs.get(k) != v for k, v in self.exact):
            return False
        if self.pod is None:
            return True
        pod = attrs.get(POD_ATTRIBUTE)
        return pod is not None and self.pod.fullmatch(pod) is not None


def resource_selector(spec: Spec, key: PoolKey) -> dict[str, str]:
    """The pool's selector in words, attribute -> required value (a regex shown as
    ``=~regex``): what ``pdscale generate otel-collector`` and error messages name."""
    service = spec.service(key[0])
    pool = service.pools[key[1]]
    if pool.selector.resource_attributes:
        return dict(pool.selector.resource_attributes)
    return {NAMESPACE_ATTRIBUTE: service.namespace, POD_ATTRIBUTE: f"=~{pool.pod_regex}"}


class PoolMatcher:
    """Resource attributes -> the pool they belong to (cached per distinct resource)."""

    def __init__(self, spec: Spec) -> None:
        self._selectors: list[_Selector] = []
        for svc in spec.services:
            for role, pool in svc.pools.items():
                given = pool.selector.resource_attributes
                if given:
                    self._selectors.append(_Selector((svc.name, role),
                                                     tuple(sorted(given.items())), None))
                else:
                    self._selectors.append(_Selector(
                        (svc.name, role), ((NAMESPACE_ATTRIBUTE, svc.namespace),),
                        re.compile(pool.pod_regex)))
        self._cache: dict[tuple[tuple[str, str], ...], PoolKey | str] = {}

    def match(self, attrs: tuple[tuple[str, str], ...]) -> PoolKey | str:
        """The pool of a resource (its attributes, sorted), or why none: ``unknown_pool`` or
        ``ambiguous_pool``."""
        hit = self._cache.get(attrs)
        if hit is not None:
            return hit
        as_map = dict(attrs)
        found = [s.key for s in self._selectors if s.matches(as_map)]
        result: PoolKey | str = found[0] if len(found) == 1 else \
            "unknown_pool" if not found else "ambiguous_pool"
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[attrs] = result
        return result
