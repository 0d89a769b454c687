"""The controller: capacity model, decision policy, cross-pool constraints, reconcile loop,
actuators, leader election, alert reactions and the HTTP API.

Importing this package stays light (no Kubernetes client, no web framework): the simulator
uses the policy and its constraints. The in-cluster pieces live in ``controller._runtime``
(the :class:`Controller` that ``pdscale run`` builds), ``controller._api`` (FastAPI app),
``controller._reconciler``, ``controller._kube``, ``controller._leader`` and
``controller._webhook``.
"""

from controller._capacity import CapacityModel, decode_batch_at_slo
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
from controller._policy import ColdStartTracker, PdscalePolicy, build_policy, policy_settings
from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile

__all__ = ["Actuator", "CapacityModel", "ColdStartTracker", "ConstrainedPolicy", "Constraints",
           "Detail", "InstanceProfile", "Observation", "PdscalePolicy", "Policy",
           "PoolDecision", "PoolKey", "PoolObservation", "PoolReplicas", "ProfileError",
           "apply_constraints", "build_policy", "builtin_profiles", "decode_batch_at_slo",
           "load_profile", "policy_settings"]
