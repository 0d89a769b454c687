"""The controller: capacity model, decision policy, reconcile loop, actuators, HTTP API.

So far it holds the interface every policy and actuator speaks (also used by the simulator);
the forecast-driven policy, the reconcile loop and the actuators come with the controller work.
"""

from controller._interface import (
    Actuator,
    Observation,
    Policy,
    PoolDecision,
    PoolKey,
    PoolObservation,
    PoolReplicas,
)

__all__ = ["Actuator", "Observation", "Policy", "PoolDecision", "PoolKey", "PoolObservation",
           "PoolReplicas"]
