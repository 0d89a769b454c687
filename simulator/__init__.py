"""The P/D cluster simulator: trace loaders, instance profiles, event and fluid modes as
worlds the production controller runs in (:func:`run_world`), baseline policies, and results
(summary, time series, plots)."""

from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile
from simulator._event import EventSimulator, PoolSetup, SimSetup
from simulator._fluid import (
    FluidLoad,
    FluidWorld,
    fluid_load_from_servegen,
    fluid_load_from_trace,
    run_fluid,
)
from simulator._policies import (
    DynamoPolicy,
    OraclePolicy,
    ReactivePolicy,
    StaticPolicy,
    demand_plan,
    size_for_peak,
)
from simulator._runner import EventWorld, run_event
from simulator._simulate import POLICIES, SimOptions, result_files, simulate
from simulator._trace import (
    FORMATS,
    Trace,
    TraceError,
    TraceStats,
    load_trace,
    synthetic_trace,
    trace_stats,
)
from simulator._world import SimClock, SimResult, World, run_world

__all__ = [
    "FORMATS",
    "POLICIES",
    "DynamoPolicy",
    "EventSimulator",
    "EventWorld",
    "FluidLoad",
    "FluidWorld",
    "InstanceProfile",
    "OraclePolicy",
    "PoolSetup",
    "ProfileError",
    "ReactivePolicy",
    "SimClock",
    "SimOptions",
    "SimResult",
    "SimSetup",
    "StaticPolicy",
    "Trace",
    "TraceError",
    "TraceStats",
    "World",
    "builtin_profiles",
    "demand_plan",
    "fluid_load_from_servegen",
    "fluid_load_from_trace",
    "load_profile",
    "load_trace",
    "result_files",
    "run_event",
    "run_fluid",
    "run_world",
    "simulate",
    "size_for_peak",
    "synthetic_trace",
    "trace_stats",
]
