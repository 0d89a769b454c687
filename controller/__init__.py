"""The controller: capacity model, decision policy, cross-pool constraints, reconcile loop,
actuators, leader election, alert reactions and the HTTP API.

Importing this package stays light (no Kubernetes client, no web framework): the simulator
runs the policy in the same reconcile loop (:class:`Reconciler`) on its own clock. The
in-cluster pieces live in ``controller._runtime`` (the :class:`Controller` that ``pdscale
run`` builds), ``controller._api`` (FastAPI app), ``controller._kube``, ``controller._leader``
and ``controller._webhook``.
"""

from controller._capacity import CapacityModel
from controller._constraints import ConstrainedPolicy, Constraints, apply_constraints
from controller._interface import (
    Actuator,
    Detail,
    Observation,
    Policy,
    PoolDecision,
    PoolKey,
    PoolObservation,
    PoolReplicas,
)
from controller._perf import (
    HEADROOM,
    DecodePoint,
    decode_batch_limit,
    decode_operating_point,
    prefill_capacity,
    uncached_prefill_demand,
)
from controller._policy import ColdStartTracker, PdscalePolicy, build_policy, policy_settings
from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile
from controller._reconciler import (
    AdapterError,
    Clock,
    DecisionRecord,
    ObservationSource,
    Overrides,
    Reconciler,
    SourceResult,
    SystemClock,
    TickReport,
)

__all__ = ["HEADROOM", "Actuator", "AdapterError", "CapacityModel", "Clock", "ColdStartTracker",
           "ConstrainedPolicy", "Constraints", "DecisionRecord", "DecodePoint",
           "Detail", "InstanceProfile", "Observation", "ObservationSource", "Overrides",
           "PdscalePolicy", "Policy", "PoolDecision", "PoolKey", "PoolObservation",
           "PoolReplicas", "ProfileError", "Reconciler", "SourceResult", "SystemClock",
           "TickReport", "apply_constraints", "build_policy", "builtin_profiles",
           "decode_batch_limit", "decode_operating_point", "load_profile",
           "policy_settings", "prefill_capacity", "uncached_prefill_demand"]
