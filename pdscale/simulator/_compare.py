"""Policies side by side on one trace: the table and plots people compare autoscalers by.

Used by ``pdscale demo``, with the best fixed allocation in hindsight beside the policies
(:func:`fixed_in_hindsight`). Every policy replays the same trace with the same seed, pools,
profiles and cold start; the table reports SLO attainment, GPU-hours, latency percentiles and
scale actions, and the plots show GPU-hours against attainment and each policy's replicas
against the load.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pdscale.simulator._bestfixed import GENEROUS, BestFixed, search_best_fixed
from pdscale.simulator._runner import SimResult
from pdscale.simulator._simulate import SimOptions, prepare, result_files, simulate
from pdscale.spec import Role, Spec

__all__ = ["compare_policies", "comparison_files", "comparison_table", "fixed_in_hindsight"]

_COLUMNS = (("policy", "policy", "{}"), ("slo_attainment", "SLO attainment", "{:.1%}"),
            ("gpu_hours", "GPU-hours", "{:.2f}"), ("ttft_p95_s", "TTFT p95 s", "{:.3f}"),
            ("itl_p95_s", "ITL p95 s", "{:.4f}"), ("scale_actions", "scale actions", "{}"),
            ("peak_prefill", "peak P", "{}"), ("peak_decode", "peak D", "{}"),
            ("wall_s", "run s", "{:.1f}"))


def compare_policies(spec: Spec, base: SimOptions, policies: Sequence[str], *,
                     progress: Callable[[str, float], None] | None = None
                     ) -> dict[str, SimResult]:
    """Run ``base`` once per policy; results in the order given."""
    results: dict[str, SimResult] = {}
    for policy in policies:

        def step(share: float, policy: str = policy) -> None:
            if progress is not None:
                progress(policy, share)

        result, _ = simulate(spec, replace(base, policy=policy), progress=step)
        results[policy] = result
    return results


def fixed_in_hindsight(spec: Spec, base: SimOptions, *,
                       progress: Callable[[int, int, float], None] | None = None
                       ) -> tuple[BestFixed, SimResult]:
    """The best fixed allocation of ``base``'s trace (seed and cold start as given) and its
    run: the fewest replicas held fixed that reach the attainment target, searched between
    the pools' minimums and the oracle plan's peak need times :data:`GENEROUS` plus one
    (within their maximums). ``progress(prefill, decode, attainment)`` follows each run."""
    runs: dict[tuple[int, int], SimResult] = {}

    def run(p: int, d: int) -> SimResult:
        if (p, d) not in runs:
            runs[(p, d)], _ = simulate(spec, replace(base, policy="static",
                                                     initial_replicas=(p, d)))
            if progress is not None:
                progress(p, d, runs[(p, d)].summary["slo_attainment"])
        return runs[(p, d)]

    meta = prepare(spec, replace(base, policy="static")).meta  # the oracle plan's peak
    service = spec.service(base.service) if base.service else spec.services[0]
    pools = [service.pools[role] for role in (Role.PREFILL, Role.DECODE)]
    p_max, d_max = [max(pool.min_replicas, min(pool.max_replicas, math.ceil(
        meta["peak_need"][role.value] * GENEROUS) + 1))
        for pool, role in zip(pools, (Role.PREFILL, Role.DECODE), strict=True)]
    found = search_best_fixed(lambda p, d: [run(p, d).summary["slo_attainment"]], p_max,
                              d_max, p_min=pools[0].min_replicas, d_min=pools[1].min_replicas)
    return found, run(found.prefill, found.decode)


def _row(policy: str, result: SimResult) -> dict[str, Any]:
    s = result.summary
    pools = s.get("pools", {})
    return {"policy": policy, "slo_attainment": s.get("slo_attainment"),
            "gpu_hours": s.get("gpu_hours"), "ttft_p95_s": s.get("ttft_p95_s"),
            "itl_p95_s": s.get("itl_p95_s"), "scale_actions": s.get("scale_actions"),
            "peak_prefill": pools.get("prefill", {}).get("peak_replicas"),
            "peak_decode": pools.get("decode", {}).get("peak_replicas"),
            "wall_s": s.get("wall_s")}


def comparison_table(results: dict[str, SimResult]) -> str:
    """A markdown table, one row per policy."""
    header = "| " + " | ".join(title for _, title, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    lines = [header, rule]
    for policy, result in results.items():
        row = _row(policy, result)
        cells = []
        for key, _, fmt in _COLUMNS:
            value = row[key]
            cells.append("n/a" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plots(results: dict[str, SimResult]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}

    def png(fig: Any) -> bytes:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        return buffer.getvalue()

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, result in results.items():
        s = result.summary
        ax.scatter([s["gpu_hours"]], [100 * s["slo_attainment"]], s=60)
        ax.annotate(policy, (s["gpu_hours"], 100 * s["slo_attainment"]),
                    textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("Cost against SLO attainment (up and left is better)")
    ax.grid(alpha=0.3)
    out["plots/gpu_hours_vs_attainment.png"] = png(fig)

    series = {policy: {c: [r[c] for r in result.timeseries] for c in REPLICAS_COLUMNS}
              for policy, result in results.items()}
    fig = replicas_figure(series, "Replicas (ready + starting) against the load", "hours")
    out["plots/replicas_vs_load.png"] = png(fig)
    return out


REPLICAS_COLUMNS = ("minute", "arrivals_rps", "prefill_ready", "prefill_starting",
                    "decode_ready", "decode_starting")
"""The time-series columns :func:`replicas_figure` draws."""


def replicas_figure(series: Mapping[str, Mapping[str, Sequence[float]]], title: str,
                    xlabel: str, colours: Mapping[str, str] | None = None) -> Any:
    """Load (from the first policy's series) over prefill and decode replicas, ready plus
    starting, one line a policy. Each series has the columns of ``REPLICAS_COLUMNS``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    first = next(iter(series.values()))
    axes[0].plot([m / 60 for m in first["minute"]], first["arrivals_rps"], color="tab:gray",
                 lw=1)
    axes[0].set_ylabel("load (req/s)")
    for policy, s in series.items():
        hours = [m / 60 for m in s["minute"]]
        for ax, role in zip(axes[1:], ("prefill", "decode"), strict=True):
            total = [a + b for a, b in zip(s[f"{role}_ready"], s[f"{role}_starting"],
                                           strict=True)]
            ax.plot(hours, total, lw=1, label=policy,
                    color=None if colours is None else colours.get(policy))
    for ax, role in zip(axes[1:], ("prefill", "decode"), strict=True):
        ax.set_ylabel(f"{role} replicas")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel(xlabel)
    axes[0].set_title(title)
    return fig


def comparison_files(results: dict[str, SimResult], *, plots: bool = True
                     ) -> dict[str, str | bytes]:
    """comparison.md, comparison.json, the two comparison plots, and each policy's own
    result files under ``<policy>/``."""
    rows = [_row(p, r) for p, r in results.items()]
    files: dict[str, str | bytes] = {
        "comparison.md": comparison_table(results),
        "comparison.json": json.dumps(rows, indent=2, default=str) + "\n",
    }
    if plots:
        files.update(_plots(results))
    for policy, result in results.items():
        for rel, data in result_files(result, plots=plots).items():
            files[f"{policy}/{rel}"] = data
    return files
