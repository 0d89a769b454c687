"""The P/D cluster simulator: trace loaders, instance profiles, event and fluid modes as
worlds the production controller runs in (:func:`run_world`), baseline policies, and results
(summary, time series, plots)."""

from typing import TYPE_CHECKING, Any

from pdscale.controller import InstanceProfile, ProfileError, builtin_profiles, load_profile
from pdscale.simulator._bestfixed import (
    ATTAINMENT_TARGET,
    CEILING_MARGIN,
    GENEROUS,
    BestFixed,
    best_fixed,
    search_best_fixed,
)
from pdscale.simulator._compare import (
    compare_policies,
    comparison_files,
    comparison_table,
    fixed_in_hindsight,
)
from pdscale.simulator._event import EventSimulator, PoolSetup, SimSetup
from pdscale.simulator._fetch import TraceFetchError, TraceUnavailable, fetch_trace
from pdscale.simulator._fluid import (
    FluidLoad,
    FluidWorld,
    fluid_load_from_servegen,
    fluid_load_from_trace,
    run_fluid,
)
from pdscale.simulator._live import LiveCluster, serve_live
from pdscale.simulator._policies import (
    DynamoPolicy,
    OraclePolicy,
    ReactivePolicy,
    StaticPolicy,
    demand_plan,
    size_for_peak,
)
from pdscale.simulator._replay import ReplayError, ReplayOptions, replay, vocabulary_from_model
from pdscale.simulator._runner import EventWorld, attach_reconciler, run_event
from pdscale.simulator._simulate import (
    POLICIES,
    Prepared,
    SimOptions,
    prepare,
    result_files,
    simulate,
    world_for,
)
from pdscale.simulator._trace import (
    FORMATS,
    Trace,
    TraceError,
    TraceStats,
    load_trace,
    synthetic_trace,
    trace_stats,
)
from pdscale.simulator._tracedir import (
    BASE_URL_ENV,
    PUBLIC_TRACES,
    TRACES_ENV,
    PublicTrace,
    TraceFile,
    default_traces_dir,
    resolve_trace,
    traces_dir,
)
from pdscale.simulator._world import SimClock, SimResult, World, run_world

if TYPE_CHECKING:
    from pdscale.simulator._stack import (
        DYNAMO_VERSION as DYNAMO_VERSION,
    )
    from pdscale.simulator._stack import (
        DynamoNotInstalled as DynamoNotInstalled,
    )
    from pdscale.simulator._stack import (
        DynamoStack as DynamoStack,
    )
    from pdscale.simulator._stack import (
        StackError as StackError,
    )
    from pdscale.simulator._stack import (
        dynamo_python as dynamo_python,
    )
    from pdscale.simulator._stack import (
        stop_stack as stop_stack,
    )

_LAZY = {
    "DYNAMO_VERSION": "pdscale.simulator._stack",
    "DynamoNotInstalled": "pdscale.simulator._stack",
    "DynamoStack": "pdscale.simulator._stack",
    "StackError": "pdscale.simulator._stack",
    "dynamo_python": "pdscale.simulator._stack",
    "stop_stack": "pdscale.simulator._stack",
}
"""The loopback Dynamo stack (it starts local processes through the controller's process
actuator): loaded on first use."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ATTAINMENT_TARGET",
    "BASE_URL_ENV",
    "CEILING_MARGIN",
    "DYNAMO_VERSION",
    "FORMATS",
    "GENEROUS",
    "POLICIES",
    "PUBLIC_TRACES",
    "TRACES_ENV",
    "BestFixed",
    "DynamoNotInstalled",
    "DynamoPolicy",
    "DynamoStack",
    "EventSimulator",
    "EventWorld",
    "FluidLoad",
    "FluidWorld",
    "InstanceProfile",
    "LiveCluster",
    "OraclePolicy",
    "PoolSetup",
    "Prepared",
    "ProfileError",
    "PublicTrace",
    "ReactivePolicy",
    "ReplayError",
    "ReplayOptions",
    "SimClock",
    "SimOptions",
    "SimResult",
    "SimSetup",
    "StackError",
    "StaticPolicy",
    "Trace",
    "TraceError",
    "TraceFetchError",
    "TraceFile",
    "TraceStats",
    "TraceUnavailable",
    "World",
    "attach_reconciler",
    "best_fixed",
    "builtin_profiles",
    "compare_policies",
    "comparison_files",
    "comparison_table",
    "default_traces_dir",
    "demand_plan",
    "dynamo_python",
    "fetch_trace",
    "fixed_in_hindsight",
    "fluid_load_from_servegen",
    "fluid_load_from_trace",
    "load_profile",
    "load_trace",
    "prepare",
    "replay",
    "resolve_trace",
    "result_files",
    "run_event",
    "run_fluid",
    "run_world",
    "search_best_fixed",
    "serve_live",
    "simulate",
    "size_for_peak",
    "stop_stack",
    "synthetic_trace",
    "trace_stats",
    "traces_dir",
    "vocabulary_from_model",
    "world_for",
]
