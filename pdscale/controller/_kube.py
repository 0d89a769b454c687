"""Kubernetes actuator: set a pool's replicas through the target's ``/scale`` subresource.

The only module that imports the ``kubernetes`` client (shared layering rule). Deployments and
StatefulSets go through ``AppsV1Api``; any other kind with a scale subresource
(LeaderWorkerSet, Dynamo's graph deployments, ...) through ``CustomObjectsApi``. A write
carries the ``resourceVersion`` it read, so a concurrent change answers 409 and the actuator
re-reads and retries (bounded). Every change is recorded as a Kubernetes Event on the target,
with the decision's reasons. Errors are split by what the caller should do:
:class:`KubeUnavailable` (429 with its Retry-After, 5xx, connection: retry later) and
:class:`KubeRejected` (404 missing target, 403 RBAC, 422 invalid: fix the spec or the RBAC).
``dry_run`` decides and records but never writes.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pdscale.controller._drain import (
    DELETION_COST,
    DELETION_COST_MIN,
    DRAIN_REASON,
    DRAINING_SINCE,
    SERVING_BEFORE,
    DrainConfig,
    Replica,
)
from pdscale.controller._interface import PoolKey
from pdscale.errors import GiveUp, RetryLater
from pdscale.spec import ScaleTarget

__all__ = ["DELETION_COST_BEFORE", "KubeDrainBackend", "KubePodLabeler", "KubeRejected",
           "KubeScaleActuator", "KubeUnavailable", "ScaleRef", "ScaleStatus"]


class KubeUnavailable(RetryLater):
    """The API server cannot take the call now; retry after ``retry_after_s``."""

    adapter = "kubernetes"


class KubeRejected(GiveUp):
    """The API server refused the call for good (missing object, RBAC, invalid)."""

    adapter = "kubernetes"


@dataclass(frozen=True)
class ScaleRef:
    namespace: str
    target: ScaleTarget

    @property
    def group_version(self) -> tuple[str, str]:
        if "/" in self.target.api_version:
            group, version = self.target.api_version.split("/", 1)
            return group, version
        return "", self.target.api_version

    @property
    def plural(self) -> str:
        """The resource's plural as Kubernetes derives it from the kind (and as CRDs name
        theirs by convention): lower case, -y after a consonant to -ies, -s/-x/-z/-ch/-sh
        plus -es (a ...Policy's is ...policies, not ...policys)."""
        kind = self.target.kind.lower()
        if kind.endswith("y") and len(kind) > 1 and kind[-2] not in "aeiou":
            return kind[:-1] + "ies"
        if kind.endswith(("s", "x", "z", "ch", "sh")):
            return kind + "es"
        return kind + "s"

    def describe(self) -> str:
        return f"{self.target.kind} {self.namespace}/{self.target.name}"


@dataclass(frozen=True)
class ScaleStatus:
    desired: int
    """spec.replicas"""
    replicas: int
    """status.replicas: pods that exist, ready or not."""
    ready: int
    """status.readyReplicas (Deployment, StatefulSet, and custom resources that report it;
    otherwise status.replicas of the scale subresource)."""


@dataclass
class KubeScaleActuator:
    """Implements controller.Actuator over the Kubernetes API."""

    api: k8s.ApiClient
    targets: Mapping[PoolKey, ScaleRef]
    dry_run: bool = False
    max_conflict_retries: int = 5
    component: str = "pdscale"
    writes: list[tuple[PoolKey, int]] = field(default_factory=list)
    events: int = 0

    def _apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def _custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def _translate(self, ref: ScaleRef, verb: str, exc: ApiException) -> Exception:
        what = ref.describe()
        status = int(exc.status or 0)
        if status == 404:
            return _not_found(ref)
        if status == 403:
            if verb == "list":
                return KubeRejected(f"RBAC forbids list on {ref.plural} in namespace "
                                    f"{ref.namespace}: grant the controller's ServiceAccount "
                                    "get and list on them (deploy/rbac.yaml)")
            return KubeRejected(f"RBAC forbids {verb} on {ref.plural}/scale in namespace "
                                f"{ref.namespace}: grant the controller's ServiceAccount get, "
                                "update and patch on that scale subresource")
        if status == 429 or status >= 500 or status == 0:
            retry = None
            header = (exc.headers or {}).get("Retry-After")
            if header is not None:
                with contextlib.suppress(TypeError, ValueError):
                    retry = float(header)
            return KubeUnavailable(f"{verb} {what}: API server answered {status or 'nothing'}",
                                   retry)
        return KubeRejected(f"{verb} {what}: API server answered {status}: {exc.reason}")

    def read_scale(self, key: PoolKey) -> tuple[int, int, str]:
        """(spec.replicas, status.replicas, resourceVersion) of the pool's target."""
        ref = self.targets[key]
        try:
            scale = self._read(ref)
        except ApiException as exc:
            raise self._translate(ref, "get", exc) from exc
        spec = _get(scale, "spec") or {}
        status = _get(scale, "status") or {}
        meta = _get(scale, "metadata") or {}
        return (int(_get(spec, "replicas") or 0), int(_get(status, "replicas") or 0),
                str(_get(meta, "resource_version") or _get(meta, "resourceVersion") or ""))

    def read_status(self, key: PoolKey) -> ScaleStatus:
        """Desired, existing and ready replicas of the pool's target (one GET)."""
        ref = self.targets[key]
        kind = ref.target.kind
        try:
            if ref.target.api_version == "apps/v1" and kind in ("Deployment", "StatefulSet"):
                read = (self._apps().read_namespaced_deployment if kind == "Deployment"
                        else self._apps().read_namespaced_stateful_set)
                workload: Any = read(ref.target.name, ref.namespace)
                spec, status = workload.spec, workload.status
                desired = int(spec.replicas if spec.replicas is not None else 1)
                replicas = int((status and status.replicas) or 0)
                return ScaleStatus(desired, replicas, int((status and status.ready_replicas) or 0))
            group, version = ref.group_version
            scale = self._custom().get_namespaced_custom_object_scale(
                group, version, ref.namespace, ref.plural, ref.target.name)
            obj = self._custom().get_namespaced_custom_object(
                group, version, ref.namespace, ref.plural, ref.target.name)
        except ApiException as exc:
            raise self._translate(ref, "get", exc) from exc
        desired = int(_get(_get(scale, "spec") or {}, "replicas") or 0)
        replicas = int(_get(_get(scale, "status") or {}, "replicas") or 0)
        obj_status = _get(obj, "status") or {}
        ready = _get(obj_status, "readyReplicas")
        return ScaleStatus(desired, replicas, int(ready if ready is not None else replicas))

    def read_statuses(self, keys: Sequence[PoolKey]) -> dict[PoolKey, ScaleStatus | Exception]:
        """Status of many pools with one LIST per (namespace, kind) instead of a GET per pool,
        parsed from the raw JSON (the client's models cost milliseconds per object). A kind
        whose objects do not carry ``spec.replicas`` falls back to :meth:`read_status`. Per
        pool: a :class:`ScaleStatus`, or the error to report for it."""
        groups: dict[tuple[str, str, str], list[PoolKey]] = {}
        for key in keys:
            ref = self.targets[key]
            groups.setdefault((ref.namespace, ref.target.api_version, ref.target.kind),
                              []).append(key)
        out: dict[PoolKey, ScaleStatus | Exception] = {}
        for (_, api_version, _), members in groups.items():
            ref = self.targets[members[0]]
            try:
                items = self._list(ref)
            except ApiException as exc:
                err = self._translate(ref, "list", exc)
                for key in members:
                    out[key] = err
                continue
            for key in members:
                item = items.get(self.targets[key].target.name)
                if item is None:
                    out[key] = _not_found(self.targets[key])
                    continue
                spec = item.get("spec") or {}
                status = item.get("status") or {}
                if not isinstance(spec.get("replicas"), int):
                    try:
                        out[key] = self.read_status(key)
                    except (KubeRejected, KubeUnavailable) as exc:
                        out[key] = exc
                    continue
                replicas = int(status.get("replicas") or 0)
                ready = status.get("readyReplicas")
                if ready is None and api_version != "apps/v1":
                    ready = replicas
                out[key] = ScaleStatus(int(spec["replicas"]), replicas, int(ready or 0))
        return out

    def _list(self, ref: ScaleRef) -> dict[str, dict[str, Any]]:
        kind = ref.target.kind
        if ref.target.api_version == "apps/v1" and kind in ("Deployment", "StatefulSet"):
            lister = (self._apps().list_namespaced_deployment if kind == "Deployment"
                      else self._apps().list_namespaced_stateful_set)
            raw: Any = lister(ref.namespace, _preload_content=False)  # the raw HTTP response
            data = json.loads(raw.data)
        else:
            group, version = ref.group_version
            data = self._custom().list_namespaced_custom_object(group, version, ref.namespace,
                                                                ref.plural)
        return {str(item.get("metadata", {}).get("name")): item
                for item in data.get("items", [])}

    def _read(self, ref: ScaleRef) -> Any:
        kind = ref.target.kind
        if ref.target.api_version == "apps/v1" and kind == "Deployment":
            return self._apps().read_namespaced_deployment_scale(ref.target.name, ref.namespace)
        if ref.target.api_version == "apps/v1" and kind == "StatefulSet":
            return self._apps().read_namespaced_stateful_set_scale(ref.target.name,
                                                                   ref.namespace)
        group, version = ref.group_version
        return self._custom().get_namespaced_custom_object_scale(
            group, version, ref.namespace, ref.plural, ref.target.name)

    def prime(self) -> None:
        """Make the first real calls cheap: the client builds its (pydantic) validators on
        first use, about a second per kind of call. Reads every pool once, then sends one
        server-side dry-run write and Event per target kind (``dryRun=All``: validated by the
        API server, never stored). Errors are left for the ticks to report."""
        with contextlib.suppress(Exception):
            self.read_statuses(list(self.targets))
        seen: set[tuple[str, str]] = set()
        for key, ref in self.targets.items():
            kind = (ref.target.api_version, ref.target.kind)
            if kind in seen:
                continue
            seen.add(kind)
            with contextlib.suppress(Exception):
                current, _, version = self.read_scale(key)
                self._write(ref, current, version, dry_run=True)
                self._post_event(ref, "PdscaleStarted", "pdscale controller started",
                                 dry_run=True)

    def _write(self, ref: ScaleRef, replicas: int, resource_version: str,
               dry_run: bool = False) -> None:
        body: Any = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": ref.target.name, "namespace": ref.namespace,
                             "resourceVersion": resource_version},
                "spec": {"replicas": replicas}}
        kind = ref.target.kind
        extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        if ref.target.api_version == "apps/v1" and kind == "Deployment":
            self._apps().replace_namespaced_deployment_scale(ref.target.name, ref.namespace,
                                                             body, **extra)
        elif ref.target.api_version == "apps/v1" and kind == "StatefulSet":
            self._apps().replace_namespaced_stateful_set_scale(ref.target.name, ref.namespace,
                                                               body, **extra)
        else:
            group, version = ref.group_version
            self._custom().replace_namespaced_custom_object_scale(
                group, version, ref.namespace, ref.plural, ref.target.name, body, **extra)

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        ref = self.targets[key]
        for _attempt in range(self.max_conflict_retries + 1):
            current, _, version = self.read_scale(key)
            if current == replicas:
                return
            if self.dry_run:
                self.writes.append((key, replicas))
                return
            try:
                self._write(ref, replicas, version)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # someone else changed it: read again and retry
                raise self._translate(ref, "update", exc) from exc
            self.writes.append((key, replicas))
            self._event(ref, current, replicas, reasons)
            return
        raise KubeUnavailable(f"update {ref.describe()}: still conflicting after "
                              f"{self.max_conflict_retries} retries")

    def _event(self, ref: ScaleRef, before: int, after: int, reasons: Sequence[str]) -> None:
        message = f"pdscale scaled {ref.target.name} from {before} to {after}: " + \
            "; ".join(reasons)
        self._post_event(ref, "PdscaleScaled", message)

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        """Record a Kubernetes Event on the pool's target (alert reactions use this)."""
        self._post_event(self.targets[key], reason, message)

    def _post_event(self, ref: ScaleRef, reason: str, message: str,
                    dry_run: bool = False) -> None:
        now = datetime.datetime.now(datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{ref.target.name}.pdscale-",
                                      namespace=ref.namespace),
            involved_object=k8s.V1ObjectReference(api_version=ref.target.api_version,
                                                  kind=ref.target.kind, name=ref.target.name,
                                                  namespace=ref.namespace),
            reason=reason, message=message[:1024], type="Normal",
            source=k8s.V1EventSource(component=self.component), first_timestamp=now,
            last_timestamp=now, count=1)
        if self.dry_run and not dry_run:
            return
        try:
            if dry_run:
                k8s.CoreV1Api(self.api).create_namespaced_event(ref.namespace, event,
                                                                dry_run="All")
                return
            k8s.CoreV1Api(self.api).create_namespaced_event(ref.namespace, event)
            self.events += 1
        except ApiException:
            pass  # an event is a record, not a reason to fail the scale that happened


@dataclass
class KubePodLabeler:
    """Sets one label on a pod (drain_instance: take it out of its Service's selector)."""

    api: k8s.ApiClient

    def label_pod(self, namespace: str, pod: str, label: str, value: str) -> None:
        body = {"metadata": {"labels": {label: value}}}
        try:
            k8s.CoreV1Api(self.api).patch_namespaced_pod(pod, namespace, body)
        except ApiException as exc:
            status = int(exc.status or 0)
            if status == 404:
                raise KubeRejected(f"pod {namespace}/{pod} was not found (already gone?)"
                                   ) from exc
            if status == 403:
                raise KubeRejected(f"RBAC forbids patching pods in {namespace}: grant the "
                                   "controller's ServiceAccount patch on pods (only needed for "
                                   "drain_instance reactions)") from exc
            raise KubeUnavailable(f"patch pod {namespace}/{pod}: API server answered "
                                  f"{status or 'nothing'}") from exc


def _not_found(ref: ScaleRef) -> KubeRejected:
    return KubeRejected(f"{ref.describe()} was not found: check pools.*.target in the spec, "
                        "that the object exists, and, for a custom resource, that its CRD "
                        "declares the scale subresource (subresources.scale)")


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


# -- scale-down drain ---------------------------------------------------------------------------

_LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
_LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
DELETION_COST_BEFORE = "pdscale.io/deletion-cost-before"
"""Annotation: a pod's own deletion cost before pdscale lowered it (restored on take-back)."""


@dataclass
class KubeDrainBackend:
    """:class:`controller._drain.DrainBackend` over the Kubernetes API.

    A pool's replicas are the pods of its service's namespace whose name its pod regex
    matches (one LIST per call; terminating and finished pods left out). A LeaderWorkerSet's
    replica is its group's leader pod. Routing stops by setting the serving label to its
    drained value (``reactions.drain``: the Service selects the serving value), with the
    annotations ``pdscale.io/draining-since``, ``pdscale.io/drain-reason`` and
    ``pdscale.io/serving-before``; taking a pod back restores the label and removes them.
    Every pod patch carries the resourceVersion it read, so a concurrent change answers 409
    and the change is re-read and re-decided (bounded). Removal: Deployments (and kinds that
    run them, such as Dynamo's scaling adapters) get ``controller.kubernetes.io/pod-deletion-
    cost`` at its lowest on the removed pods, then the smaller count; StatefulSets and
    LeaderWorkerSets remove their highest ordinals, which is what the drain chose."""

    actuator: KubeScaleActuator
    pod_regex: Mapping[PoolKey, str]
    serving_label: str = "pdscale.io/serving"
    drained_value: str = "drained"
    routing_mark: bool = True
    """False: no routing mark; the chosen pods get the deletion cost and go at once."""
    max_conflict_retries: int = 5
    _checked: set[PoolKey] = field(default_factory=set)

    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.actuator.api)

    def _pod_error(self, verb: str, namespace: str, what: str, exc: ApiException
                   ) -> Exception:
        status = int(exc.status or 0)
        if status == 403:
            return KubeRejected(
                f"RBAC forbids {verb} on pods in namespace {namespace}: scale-down drains need "
                "get, list and patch on pods (apply the deploy/scale-down-drain component), or "
                "set controller.drain.enabled: false")
        if status == 429 or status >= 500 or status == 0:
            return KubeUnavailable(f"{verb} {what}: API server answered {status or 'nothing'}")
        return KubeRejected(f"{verb} {what}: API server answered {status}: {exc.reason}")

    def drain_config(self, key: PoolKey, *, timeout_s: float, settle_s: float) -> DrainConfig:
        target = self.actuator.targets[key].target
        ordinal = target.kind in ("StatefulSet", "LeaderWorkerSet")
        return DrainConfig(timeout_s=timeout_s, settle_s=settle_s,
                           removal="highest_ordinal" if ordinal else "chosen",
                           reversible=self.routing_mark,
                           leftover_marks=not self.routing_mark)

    def _check_selector(self, key: PoolKey) -> None:
        """A workload whose selector requires the serving label would disown a drained pod
        (and start a replacement): refuse, saying what to change."""
        ref = self.actuator.targets[key]
        if key in self._checked or ref.target.api_version != "apps/v1" or \
                ref.target.kind not in ("Deployment", "StatefulSet"):
            return
        try:
            read = (self.actuator._apps().read_namespaced_deployment
                    if ref.target.kind == "Deployment"
                    else self.actuator._apps().read_namespaced_stateful_set)
            raw: Any = read(ref.target.name, ref.namespace, _preload_content=False)
            selector = json.loads(raw.data).get("spec", {}).get("selector", {})
        except ApiException as exc:
            raise self.actuator._translate(ref, "get", exc) from exc
        if self.serving_label in (selector.get("matchLabels") or {}) or any(
                e.get("key") == self.serving_label
                for e in selector.get("matchExpressions") or []):
            raise KubeRejected(
                f"{ref.describe()} selects its pods on {self.serving_label}: draining a pod "
                "would disown it and start a replacement. Keep the serving label in the "
                "Service's selector only (the workload's selector must not name it), or set "
                "controller.drain.enabled: false")
        self._checked.add(key)

    def pool_replicas(self, key: PoolKey) -> list[Replica]:
        self._check_selector(key)
        ref = self.actuator.targets[key]
        pattern = re.compile(self.pod_regex[key])
        try:
            raw: Any = self._core().list_namespaced_pod(ref.namespace, _preload_content=False)
            items = json.loads(raw.data).get("items", [])
        except ApiException as exc:
            raise self._pod_error("list", ref.namespace, f"pods in {ref.namespace}",
                                  exc) from exc
        out = []
        for pod in items:
            meta = pod.get("metadata") or {}
            name = str(meta.get("name", ""))
            phase = (pod.get("status") or {}).get("phase")
            if not pattern.fullmatch(name) or meta.get("deletionTimestamp") or \
                    phase in ("Succeeded", "Failed"):
                continue
            labels = meta.get("labels") or {}
            if ref.target.kind == "LeaderWorkerSet" and labels.get(_LWS_WORKER, "0") != "0":
                continue  # a group is one replica; its leader pod stands for it
            annotations = meta.get("annotations") or {}
            since = None
            if DRAINING_SINCE in annotations:
                since = _parse_time(annotations[DRAINING_SINCE])
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])
            out.append(Replica(
                name=name, ready=ready,
                created_s=_parse_time(meta.get("creationTimestamp", "")),
                draining_since_s=since,
                routed=labels.get(self.serving_label) != self.drained_value,
                ordinal=_ordinal(ref.target.name, name, labels),
                drain_reason=annotations.get(DRAIN_REASON, "")))
        return out

    def _patch(self, key: PoolKey, name: str,
               change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
        """Read the pod, let ``change`` decide its metadata patch (None: nothing to do any
        more), write it conditionally on the resourceVersion read; on 409 read again and
        decide again. False when the pod is gone or there was nothing to do."""
        namespace = self.actuator.targets[key].namespace
        core = self._core()
        for _attempt in range(self.max_conflict_retries + 1):
            try:
                raw: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
                pod = json.loads(raw.data)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise self._pod_error("get", namespace, f"pod {namespace}/{name}", exc) from exc
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                return False
            patch = change(meta)
            if patch is None:
                return False
            patch["resourceVersion"] = meta.get("resourceVersion")
            try:
                core.patch_namespaced_pod(name, namespace, {"metadata": patch})
            except ApiException as exc:
                if exc.status == 409:
                    continue  # changed under us: read again and decide again
                if exc.status == 404:
                    return False
                raise self._pod_error("patch", namespace, f"pod {namespace}/{name}",
                                      exc) from exc
            return True
        raise KubeUnavailable(f"patch pod {namespace}/{name}: still conflicting after "
                              f"{self.max_conflict_retries} retries")

    def stop_routing(self, key: PoolKey, name: str, *, since_s: float, reason: str) -> None:
        def change(meta: dict[str, Any]) -> dict[str, Any] | None:
            if DRAINING_SINCE in (meta.get("annotations") or {}):
                return None
            before = (meta.get("labels") or {}).get(self.serving_label)
            return {"labels": {self.serving_label: self.drained_value},
                    "annotations": {DRAINING_SINCE: _format_time(since_s),
                                    DRAIN_REASON: reason[:1024],
                                    SERVING_BEFORE: json.dumps(before)}}

        self._patch(key, name, change)

    def resume_routing(self, key: PoolKey, name: str) -> None:
        def change(meta: dict[str, Any]) -> dict[str, Any] | None:
            annotations = meta.get("annotations") or {}
            if DRAINING_SINCE not in annotations:
                return None
            try:
                before = json.loads(annotations.get(SERVING_BEFORE, "null"))
            except ValueError:
                before = None
            restore: dict[str, Any] = {DRAINING_SINCE: None, DRAIN_REASON: None,
                                       SERVING_BEFORE: None}
            if annotations.get(DELETION_COST) == DELETION_COST_MIN:
                restore[DELETION_COST] = annotations.get(DELETION_COST_BEFORE)
                restore[DELETION_COST_BEFORE] = None
            return {"labels": {self.serving_label: before if isinstance(before, str) else None},
                    "annotations": restore}

        self._patch(key, name, change)

    def remove_replicas(self, key: PoolKey, names: Sequence[str], replicas: int,
                        reasons: Sequence[str]) -> None:
        if self.drain_config(key, timeout_s=1, settle_s=0).removal == "chosen":
            for name in names:
                def change(meta: dict[str, Any]) -> dict[str, Any] | None:
                    annotations = meta.get("annotations") or {}
                    own = annotations.get(DELETION_COST)
                    if own == DELETION_COST_MIN:
                        return None
                    out: dict[str, Any] = {DELETION_COST: DELETION_COST_MIN}
                    if own is not None:
                        out[DELETION_COST_BEFORE] = own
                    return {"annotations": out}

                self._patch(key, name, change)
        self.actuator.set_replicas(key, replicas, reasons)

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        self.actuator.set_replicas(key, replicas, reasons)

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        self.actuator.event(key, reason, message)


def _ordinal(workload: str, pod: str, labels: Mapping[str, str]) -> int | None:
    group = labels.get(_LWS_GROUP)
    if group is not None and group.isdigit():
        return int(group)
    prefix, _, tail = pod.rpartition("-")
    return int(tail) if prefix == workload and tail.isdigit() else None


def _format_time(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str) -> float:
    """RFC 3339 to epoch seconds; 0.0 when unreadable (an old drain: it gets taken back)."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return 0.0
