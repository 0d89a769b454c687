"""The P/D cluster simulator: trace loaders, instance profiles, event and fluid modes,
baseline policies, and results (summary, time series, plots)."""

from controller._profiles import InstanceProfile, ProfileError, builtin_profiles, load_profile
from simulator._event import EventSimulator, PoolSetup, SimSetup
from simulator._fluid import FluidLoad, fluid_load_from_servegen, fluid_load_from_trace, run_fluid
from simulator._policies import (
    DynamoPolicy,
    OraclePolicy,
    ReactivePolicy,
    StaticPolicy,
    demand_plan,
    size_for_peak,
)
from simulator._runner import SimResult, run_event
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

__all__ = [
    "FORMATS",
    "POLICIES",
    "DynamoPolicy",
    "EventSimulator",
    "FluidLoad",
    "InstanceProfile",
    "OraclePolicy",
    "PoolSetup",
    "ProfileError",
    "ReactivePolicy",
    "SimOptions",
    "SimResult",
    "SimSetup",
    "StaticPolicy",
    "Trace",
    "TraceError",
    "TraceStats",
    "builtin_profiles",
    "demand_plan",
    "fluid_load_from_servegen",
    "fluid_load_from_trace",
    "load_profile",
    "load_trace",
    "result_files",
    "run_event",
    "run_fluid",
    "simulate",
    "size_for_peak",
    "synthetic_trace",
    "trace_stats",
]
