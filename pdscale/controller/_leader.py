"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two controller replicas run safely.

Semantics (those of client-go's leaderelection, on the Lease's own fields):

* The leader renews ``spec.renewTime`` every ``renew_every_s``. Every write carries the
  ``resourceVersion`` it read, so of two candidates racing for an expired lease exactly one
  wins (the other gets 409 Conflict).
* A standby takes the lease once ``renewTime + leaseDurationSeconds`` has passed, that is
  within one lease duration of the leader's last renewal (plus one polling interval).
* A leader that cannot renew stops acting at once: :meth:`LeaseElector.is_leader` is False as
  soon as a renewal finds another holder, and also when its last successful renewal is older
  than the renew deadline (two thirds of the lease duration), before any standby may take
  over. Losing the lease never needs a restart: the next successful acquire makes it leader
  again.
* Times are written as MicroTime (RFC 3339 with six fraction digits), which the API server
  requires for Lease times; clocks of the candidates are assumed to agree to well within the
  lease duration (NTP), as Lease readers in Kubernetes assume.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pdscale.errors import GiveUp, PdscaleError, RetryLater

__all__ = ["LeaseElector", "LeaseRejected", "LeaseUnavailable"]


class LeaseUnavailable(RetryLater):
    """The Lease could not be read or written now (connection, timeout, 5xx, 409 lost
    race): this candidate stands by and tries again at its next step."""

    adapter = "lease"


class LeaseRejected(GiveUp):
    """The API server refuses the Lease for good (403 RBAC, 404 namespace, 422 invalid):
    fix the ServiceAccount's permissions or the spec's leader_election section."""

    adapter = "lease"


def _microtime(t_s: float) -> dt.datetime:
    """A Lease time. The client validates the body into its models and writes datetimes with
    ``isoformat()``, which drops the fraction when it is zero; the API server parses Lease
    times as RFC 3339 with exactly six fraction digits and would refuse that, so a whole
    second is nudged by one microsecond."""
    stamp = dt.datetime.fromtimestamp(t_s, dt.UTC)
    return stamp.replace(microsecond=1) if stamp.microsecond == 0 else stamp


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return stamp.timestamp()
    text = str(value).replace("Z", "+00:00")
    return dt.datetime.fromisoformat(text).timestamp()


@dataclass
class LeaseElector:
    api: k8s.ApiClient
    namespace: str
    name: str
    identity: str
    lease_duration_s: float
    now: Callable[[], float]
    """The injected clock (seconds since the epoch)."""
    transitions: int = 0
    failure: PdscaleError | None = None
    """Why the last step failed (None when it did not), classified by what to do."""
    _leader: bool = False
    _renewed_at: float | None = None

    @property
    def last_error(self) -> str | None:
        return None if self.failure is None else str(self.failure)

    @property
    def renew_deadline_s(self) -> float:
        return self.lease_duration_s * 2 / 3

    def is_leader(self) -> bool:
        """True only while this candidate holds a lease it renewed within the deadline."""
        if not self._leader or self._renewed_at is None:
            return False
        if self.now() - self._renewed_at >= self.renew_deadline_s:
            self._leader = False
        return self._leader

    def _coord(self) -> k8s.CoordinationV1Api:
        return k8s.CoordinationV1Api(self.api)

    def _body(self, now: float, version: str | None, acquire_s: float,
              transitions: int, holder: str | None = "") -> k8s.V1Lease:
        return k8s.V1Lease(
            api_version="coordination.k8s.io/v1", kind="Lease",
            metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                      resource_version=version),
            spec=k8s.V1LeaseSpec(
                holder_identity=self.identity if holder == "" else holder,
                lease_duration_seconds=max(1, round(self.lease_duration_s)),
                acquire_time=_microtime(acquire_s), renew_time=_microtime(now),
                lease_transitions=transitions))

    def step(self) -> bool:
        """Acquire or renew the lease once; returns whether this candidate leads now.

        API errors make this candidate a non-leader until a later step succeeds (a leader that
        cannot reach the API server must assume someone else may take over)."""
        now = self.now()
        coord = self._coord()
        try:
            try:
                lease = coord.read_namespaced_lease(self.name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                coord.create_namespaced_lease(self.namespace, self._body(now, None, now, 0))
                return self._won(now)
            spec = lease.spec or k8s.V1LeaseSpec()
            holder = spec.holder_identity
            renew = _seconds(spec.renew_time)
            duration = float(spec.lease_duration_seconds or self.lease_duration_s)
            version = lease.metadata.resource_version if lease.metadata else None
            transitions = int(spec.lease_transitions or 0)
            if holder == self.identity:
                acquire = _seconds(spec.acquire_time) or now
                coord.replace_namespaced_lease(
                    self.name, self.namespace, self._body(now, version, acquire, transitions))
                return self._won(now)
            # (1 ms slack: whole-second times were written one microsecond late, see _microtime)
            expired = not holder or renew is None or now + 0.001 >= renew + duration
            if not expired:
                self._leader = False
                self.failure = None
                return False
            coord.replace_namespaced_lease(
                self.name, self.namespace, self._body(now, version, now, transitions + 1))
            self.transitions += 1
            return self._won(now)
        except ApiException as exc:
            self._leader = False
            message = (f"lease {self.namespace}/{self.name}: API server answered "
                       f"{exc.status} {exc.reason}")
            if exc.status == 403:
                message += ("; grant the ServiceAccount get, create and update on "
                            "leases.coordination.k8s.io in its namespace")
            self.failure = LeaseRejected(message) if exc.status in (401, 403, 404, 422) \
                else LeaseUnavailable(message)
            return False
        except Exception as exc:  # connection errors, timeouts
            self._leader = False
            self.failure = LeaseUnavailable(f"lease {self.namespace}/{self.name}: {exc}")
            return False

    def _won(self, now: float) -> bool:
        self._leader = True
        self._renewed_at = now
        self.failure = None
        return True

    def release(self) -> None:
        """On shutdown: let a standby take over at once instead of after the lease expires."""
        if not self._leader:
            return
        self._leader = False
        coord = self._coord()
        try:
            lease = coord.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            body = self._body(self.now(), lease.metadata.resource_version if lease.metadata
                              else None, self.now(), int(lease.spec.lease_transitions or 0),
                              holder=None)
            assert body.spec is not None
            body.spec.lease_duration_seconds = 1
            coord.replace_namespaced_lease(self.name, self.namespace, body)
        except Exception:  # best effort: the lease expires anyway
            return
