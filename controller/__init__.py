"""The controller: capacity model, decision policy, reconcile loop, actuators, HTTP API.

So far: the interface every policy and actuator speaks (the simulator drives it), the instance
profiles and the capacity model, and pdscale's forecast-driven policy. The Prometheus reader,
the reconcile loop, the Kubernetes actuators, leader election and the HTTP API are still to
come.
"""

from controller._capacity import CapacityModel, decode_batch_at_slo
from controller._interface import (
    Actuator,
    Observation,
    Policy,
    PoolDecision,
    PoolKey,
    PoolObservation,
    PoolReplicas,
)
from controller._policy import ColdStartTracker, PdscalePolicy
from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile

__all__ = ["Actuator", "CapacityModel", "ColdStartTracker", "InstanceProfile", "Observation",
           "PdscalePolicy", "Policy", "PoolDecision", "PoolKey", "PoolObservation",
           "PoolReplicas", "ProfileError", "builtin_profiles", "decode_batch_at_slo",
           "load_profile"]
