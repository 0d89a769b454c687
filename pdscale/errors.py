"""pdscale's exceptions, split by what the caller should do about them.

Every adapter at a boundary (Prometheus, Kubernetes, the simulator backend, the process
actuator, leader election) raises through this tree, chained over the library's own error
(``raise KubeUnavailable(...) from exc``), so the reconcile loop classifies a failure by its
class alone and never needs to import the adapter::

    PdscaleError                     base of every error pdscale raises at a boundary
    |-- RetryLater                   the other side cannot answer now; the next tick tries
    |   |                            again (``retry_after_s`` when the server said)
    |   |-- telemetry.PrometheusUnavailable      connection, timeout, 5xx
    |   |-- controller._kube.KubeUnavailable     429 (with Retry-After), 5xx, connection
    |   `-- controller._leader.LeaseUnavailable  the Lease could not be read or written now
    `-- GiveUp                       the call is wrong and stays wrong: fix the spec, the RBAC,
        |                            the credentials or the caller
        |-- telemetry.PrometheusQueryError       4xx: a bad query or credentials
        |-- controller._kube.KubeRejected        404 target, 403 RBAC, 422 invalid
        `-- controller._leader.LeaseRejected     403 RBAC, 404 namespace, 422 invalid

The simulator's backend (``pdscale up``) and the process actuator raise the Kubernetes pair,
since they stand in for it; the simulator's worlds raise ``simulator._world.UnknownPool``
(GiveUp). The lease elector never raises out of its loop: it keeps the failure of its last
step (``LeaseElector.failure``), typed by this tree, and stands by. Errors about the user's
input (``pdscale.spec.SpecError``, a profile, a trace) are raised before any loop runs and
say what to fix; they are not part of this tree. ``forecasting`` imports nothing of ours:
its ``SeriesError`` stays its own.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["GiveUp", "PdscaleError", "RetryLater"]


class PdscaleError(Exception):
    """Base of the errors pdscale's adapters raise; ``adapter`` names the boundary."""

    adapter: ClassVar[str] = "pdscale"
    """prometheus, kubernetes, lease, simulator, ... (the ``adapter`` label of
    ``pdscale_adapter_errors_total``)."""


class RetryLater(PdscaleError):
    """The other side cannot answer now; try again later (after ``retry_after_s`` when
    known)."""

    kind: ClassVar[str] = "unavailable"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GiveUp(PdscaleError):
    """The call was refused for good: retrying the same call will not help; the message
    says what to fix."""

    kind: ClassVar[str] = "rejected"
