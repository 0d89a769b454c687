"""The controller: the queueing model and the policy it sizes pools with, cross-pool
constraints, reconcile loop, actuators, leader election, alert reactions and the HTTP API.

Importing this package stays light (no Kubernetes client, no web framework): the simulator
runs the policy in the same reconcile loop (:class:`Reconciler`) on its own clock. The
in-cluster pieces live in ``controller._runtime`` (the :class:`Controller` that ``pdscale
run`` builds), ``controller._api`` (FastAPI app), ``controller._kube``, ``controller._leader``
and ``controller._webhook``.
"""

from typing import TYPE_CHECKING, Any

from pdscale.controller._constraints import ConstrainedPolicy, Constraints, apply_constraints
from pdscale.controller._forecast import ForecastStage, NoForecast
from pdscale.controller._interface import (
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
from pdscale.controller._model import ColdStartTracker, PdscalePolicy, build_forecasts, build_policy
from pdscale.controller._perf import (
    HEADROOM,
    DecodePoint,
    decode_batch_limit,
    decode_operating_point,
    prefill_capacity,
    uncached_prefill_demand,
)
from pdscale.controller._profiles import (
    InstanceProfile,
    ProfileError,
    builtin_profiles,
    load_profile,
)
from pdscale.controller._recommend import hpa_manifests, keda_manifests
from pdscale.controller._reconciler import (
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

if TYPE_CHECKING:
    from pdscale.controller._api import create_app as create_app
    from pdscale.controller._process import (
        ProcessActuator as ProcessActuator,
    )
    from pdscale.controller._process import (
        WorkerTemplate as WorkerTemplate,
    )
    from pdscale.controller._process import (
        free_loopback_port as free_loopback_port,
    )
    from pdscale.controller._process import (
        process_is_zombie as process_is_zombie,
    )
    from pdscale.controller._process import (
        process_start_ticks as process_start_ticks,
    )
    from pdscale.controller._process import (
        spawn_process as spawn_process,
    )
    from pdscale.controller._process import (
        stop_pids as stop_pids,
    )
    from pdscale.controller._process import (
        stop_recorded as stop_recorded,
    )
    from pdscale.controller._process import (
        sum_metric as sum_metric,
    )
    from pdscale.controller._process import (
        targets_file_name as targets_file_name,
    )
    from pdscale.controller._runtime import (
        Controller as Controller,
    )
    from pdscale.controller._runtime import (
        KubeConfigError as KubeConfigError,
    )
    from pdscale.controller._runtime import (
        is_loopback as is_loopback,
    )
    from pdscale.controller._runtime import (
        kube_client as kube_client,
    )
    from pdscale.controller._runtime import (
        reader_from_spec as reader_from_spec,
    )
    from pdscale.controller._runtime import (
        serve as serve,
    )

_LAZY = {
    "create_app": "pdscale.controller._api",
    "Controller": "pdscale.controller._runtime",
    "KubeConfigError": "pdscale.controller._runtime",
    "is_loopback": "pdscale.controller._runtime",
    "kube_client": "pdscale.controller._runtime",
    "reader_from_spec": "pdscale.controller._runtime",
    "serve": "pdscale.controller._runtime",
    "ProcessActuator": "pdscale.controller._process",
    "WorkerTemplate": "pdscale.controller._process",
    "free_loopback_port": "pdscale.controller._process",
    "process_is_zombie": "pdscale.controller._process",
    "process_start_ticks": "pdscale.controller._process",
    "spawn_process": "pdscale.controller._process",
    "stop_pids": "pdscale.controller._process",
    "stop_recorded": "pdscale.controller._process",
    "sum_metric": "pdscale.controller._process",
    "targets_file_name": "pdscale.controller._process",
}
"""The in-cluster pieces (the Kubernetes client, the web framework, local processes): loaded on
first use, so ``import controller`` stays light for the simulator and the CLI."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'controller' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["HEADROOM", "Actuator", "AdapterError", "Cause", "Clock", "ColdStartTracker",
           "ConstrainedPolicy", "Constraints", "Controller", "DecisionRecord", "DecodePoint",
           "Detail", "ForecastStage", "InstanceProfile", "KubeConfigError", "NoForecast",
           "Observation", "ObservationSource", "Overrides", "PdscalePolicy", "Policy",
           "PoolDecision", "PoolForecast", "PoolKey", "PoolObservation", "PoolReplicas",
           "ProcessActuator", "ProfileError", "Reconciler", "Refits", "SourceResult",
           "SystemClock", "TickReport", "WorkerTemplate", "apply_constraints",
           "build_forecasts", "build_policy", "builtin_profiles", "create_app",
           "decode_batch_limit", "decode_operating_point", "free_loopback_port",
           "hpa_manifests", "is_loopback", "keda_manifests", "kube_client", "load_profile",
           "prefill_capacity", "process_is_zombie", "process_start_ticks", "reader_from_spec",
           "serve", "spawn_process", "stop_pids", "stop_recorded", "sum_metric",
           "targets_file_name", "uncached_prefill_demand"]
