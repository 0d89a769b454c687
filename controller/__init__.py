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
from controller._forecast import ForecastStage, NoForecast
from controller._interface import (
    Actuator,
    Cause,
    Detail,
    Observation,
    Policy,
    PoolDecision,
    PoolForecast,
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
from controller._policy import ColdStartTracker, PdscalePolicy, build_forecasts, build_policy
from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile
from controller._reconciler import (
    AdapterError,
    Clock,
    DecisionRecord,
    ObservationSource,
    Overrides,
    Reconciler,
    Refits,
    SourceResult,
    SystemClock,
    TickReport,
)
from controller._sizing import Need, SizingInputs, size
from controller._stabilise import PoolHistory, Stabilised, bound, stabilise

__all__ = ["HEADROOM", "Actuator", "AdapterError", "CapacityModel", "Cause", "Clock",
           "ColdStartTracker", "ConstrainedPolicy", "Constraints", "DecisionRecord",
           "DecodePoint", "Detail", "ForecastStage", "InstanceProfile", "Need",
           "NoForecast", "Observation", "ObservationSource", "Overrides",
           "PdscalePolicy", "Policy", "PoolDecision", "PoolForecast", "PoolHistory",
           "PoolKey", "PoolObservation", "PoolReplicas", "ProfileError", "Reconciler",
           "Refits", "SizingInputs", "SourceResult", "Stabilised", "SystemClock",
           "TickReport", "apply_constraints", "bound", "build_forecasts",
           "build_policy", "builtin_profiles", "decode_batch_limit",
           "decode_operating_point", "load_profile", "prefill_capacity", "size",
           "stabilise", "uncached_prefill_demand"]
