"""Engine facts the spec is validated against: released versions, latency histogram buckets,
and the labels each engine's own series carry.

Design. Every fact here was read from the engines' released code or a running engine
(shared/REFERENCE.md §1 and §6; the metric lists in shared/reference/engine-metrics/, checked by
tests/telemetry/test_reference.py): vLLM 0.34.0, SGLang 0.5.23, NVIDIA Dynamo 1.6.1. TGI and the
DCGM exporter were not verified against a release. The spec layer needs them (an SLO threshold
must be a bucket boundary the engine really exposes; a selector may only use labels the engine
or the user's scrape configuration provides), and the spec is the bottom layer, so they live
here rather than in ``telemetry`` (shared/DESIGN.md, "Packages").

Dynamo's frontend does not take a bucket list: its TTFT and ITL histograms are log-spaced with
two significant digits, shaped only by ``DYN_METRICS_{TTFT,ITL}_{MIN,MAX,COUNT}``, and their
first boundary is always 0. :func:`dynamo_buckets` reproduces them (it matches the defaults and
the two settings observed on a running frontend).
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = [
    "DYNAMO_BUCKET_DEFAULTS",
    "DYNAMO_BUCKET_ENV",
    "ENGINE_BUCKET_SETTING",
    "ENGINE_HISTOGRAM_BUCKETS",
    "ENGINE_SERIES_LABELS",
    "ENGINE_VERSIONS",
    "POD_MONITOR_LABELS",
    "dynamo_buckets",
    "nearest_boundaries",
    "suggest_dynamo_setting",
]

LatencyKind = Literal["ttft", "itl"]

ENGINE_VERSIONS: dict[str, str] = {
    "vllm": "0.34.0",
    "sglang": "0.5.23",
    "dynamo": "1.6.1",
    "tgi": "unverified",
}
"""Releases the catalog was checked against (their metric lists are in shared/reference/)."""

POD_MONITOR_LABELS: tuple[str, ...] = ("namespace", "pod", "container", "endpoint", "job",
                                       "instance")
"""Target labels a prometheus-operator PodMonitor puts on every scraped series by default."""

ENGINE_SERIES_LABELS: dict[str, frozenset[str]] = {
    # vLLM V1: model_name and engine on every series, plus per-metric labels.
    "vllm": frozenset({"model_name", "engine", "finished_reason", "reason", "source"}),
    # SGLang scheduler and tokenizer collectors.
    "sglang": frozenset({"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank",
                         "dp_rank", "priority", "is_streaming", "cache_source", "mode"}),
    # Dynamo's frontend: only `model` (and four labels on requests_total); its workers'
    # dynamo_component_* series carry the runtime's labels; re-exported vllm:*/sglang:* series
    # carry the backend's labels.
    "dynamo_frontend": frozenset({"model", "endpoint", "request_type", "status",
                                  "error_type"}),
    "dynamo_worker": frozenset({"dynamo_namespace", "dynamo_component", "dynamo_endpoint",
                                "worker_id"}),
    # DCGM exporter with its Kubernetes pod mapping on.
    "dcgm": frozenset({"gpu", "UUID", "modelName", "Hostname", "hostname", "device",
                       "pci_bus_id", "namespace", "pod", "container"}),
    "tgi": frozenset(),
}
"""Labels an engine's own process puts on its series (scrape labels come on top)."""

ENGINE_HISTOGRAM_BUCKETS: dict[str, dict[str, tuple[float, ...]]] = {
    "vllm": {
        "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
        "itl": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0),
    },
    "sglang": {
        "ttft": (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                 80.0, 100.0, 200.0, 400.0),
        "itl": (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
                0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0),
    },
    "dynamo": {},  # computed: dynamo_buckets()
    "tgi": {},  # unverified: no check unless the spec states the buckets
}
"""Default latency buckets (seconds) per engine, as its released version exposes them."""

ENGINE_BUCKET_SETTING: dict[str, dict[str, str]] = {
    "vllm": {"ttft": "--custom-histogram-buckets '{\"time_to_first_token\": [...]}'",
             "itl": "--custom-histogram-buckets '{\"inter_token_latency\": [...]}'"},
    "sglang": {"ttft": "--bucket-time-to-first-token", "itl": "--bucket-inter-token-latency"},
    "dynamo": {"ttft": "DYN_METRICS_TTFT_MIN/MAX/COUNT", "itl": "DYN_METRICS_ITL_MIN/MAX/COUNT"},
    "tgi": {},
}
"""The engine's own setting that changes each latency histogram's buckets."""

DYNAMO_BUCKET_DEFAULTS: dict[str, tuple[float, float, int]] = {
    "ttft": (0.001, 480.0, 18),
    "itl": (0.001, 80.0, 20),
}
"""(MIN, MAX, COUNT) of Dynamo 1.6.1's frontend histograms when DYN_METRICS_* are unset."""

DYNAMO_BUCKET_ENV: dict[str, str] = {"ttft": "DYN_METRICS_TTFT", "itl": "DYN_METRICS_ITL"}


def _two_digits(value: float) -> float:
    return float(f"{value:.2g}")


def dynamo_buckets(minimum: float, maximum: float, count: int) -> tuple[float, ...]:
    """Dynamo's log-spaced boundaries: 0, then MIN x r^i for i = 1 .. COUNT-1 with
    r = (MAX/MIN)^(1/(COUNT-1)), each rounded to two significant digits (the last is MAX)."""
    if not (0 < minimum < maximum) or count < 2:
        raise ValueError(f"expected 0 < MIN < MAX and COUNT >= 2, got MIN={minimum:g}, "
                         f"MAX={maximum:g}, COUNT={count}")
    ratio = (maximum / minimum) ** (1.0 / (count - 1))
    out = [0.0]
    for i in range(1, count):
        value = _two_digits(minimum * ratio ** i)
        if value > out[-1]:
            out.append(value)
    return tuple(out)


def nearest_boundaries(value: float, buckets: tuple[float, ...]) -> tuple[float | None,
                                                                          float | None]:
    """The boundaries just below and just above ``value`` (None where there is none)."""
    below = [b for b in buckets if b < value and not math.isclose(b, value)]
    above = [b for b in buckets if b > value and not math.isclose(b, value)]
    return (below[-1] if below else None), (above[0] if above else None)


def suggest_dynamo_setting(kind: str, threshold: float) -> tuple[float, float, int] | None:
    """DYN_METRICS_<KIND>_{MIN,MAX,COUNT} under which ``threshold`` is a boundary, keeping
    about the default's spread (three boundaries a decade); None if none was found."""
    for decades_below, decades_above in ((3, 3), (2, 3), (3, 2), (2, 2), (4, 3)):
        lo = _two_digits(threshold / 10 ** decades_below)
        hi = _two_digits(threshold * 10 ** decades_above)
        count = 3 * (decades_below + decades_above) + 1
        if any(math.isclose(b, threshold, rel_tol=1e-9) for b in dynamo_buckets(lo, hi, count)):
            return lo, hi, count
    return None
