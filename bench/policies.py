"""The policy benchmark: scaling policies side by side on the shared production traces.

    .venv/bin/python bench/policies.py [--traces azure,mooncake,servegen-m-large,servegen-m-small]
                                       [--cold-starts 30,60,180] [--seed 0] [--jobs 2]
                                       [--policies static,...,oracle] [--out policies]

Every trace is replayed through its service in bench/policies.yaml (Llama-3.1-8B on
H100-80GB, one GPU a replica, SLOs the trace's prompts allow) under ``static`` (sized for the
peak), ``reactive`` (HPA semantics), ``dynamo`` (Dynamo's planner as published), ``pdscale``
and ``oracle`` (knows the future: the GPU-hour floor for the SLO), with the same seed, at each
cold start. The two one-hour traces run in event mode (per request), scaled up so their peaks
need dozens of replicas; the two 14-day ServeGen traces run in fluid mode at their real rate.

Needs ../shared/traces. Prints a table per trace and cold start and the issue's targets
checked at 60 s, and writes bench/results/policies.json, bench/results/policies.md and the
plots in bench/results/policies/ (GPU-hours against attainment for every trace and cold start;
replicas against the load at 60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core a job: --jobs sets the parallelism

ROOT = Path(__file__).resolve().parent.parent
# The packages come before bench/ itself, whose simulator.py and controller.py would shadow them.
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "traces"
SPEC = ROOT / "bench" / "policies.yaml"
RESULTS = ROOT / "bench" / "results"
POLICIES = ("static", "reactive", "dynamo", "pdscale", "oracle")
TRACES: dict[str, dict[str, Any]] = {
    "azure": {"file": "azure_llm_2023_code.csv", "service": "azure-code", "scale": 12.0,
              "mode": "event", "window_h": None},
    "mooncake": {"file": "mooncake_fast25_conversation_trace.jsonl.gz",
                 "service": "mooncake-conversation", "scale": 8.0, "mode": "event",
                 "window_h": None},
    "servegen-m-large": {"file": "servegen_m-large_client_rates.csv.gz",
                         "service": "servegen-m-large", "scale": 1.0, "mode": "fluid",
                         "window_h": (12 * 24, 13 * 24)},
    "servegen-m-small": {"file": "servegen_m-small_client_rates.csv.gz",
                         "service": "servegen-m-small", "scale": 1.0, "mode": "fluid",
                         "window_h": (12 * 24, 13 * 24)},
}
"""name -> file under ../shared/traces, service of bench/policies.yaml, load multiplier,
simulation mode, and the hours shown in the replicas plot (None: all)."""


def shown(path: Path) -> Path:
    """``path`` as the "wrote ..." lines show it: from the project root when it is under it
    (an ``--out`` given as an absolute path writes elsewhere, and says where)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _run(trace: str, cold_start_s: float, policy: str, seed: int) -> dict[str, Any]:
    """One simulation (in a worker process): the summary row and, at 60 s, the series."""
    sys.path.insert(0, str(ROOT))
    from pdscale.simulator import SimOptions, simulate
    from pdscale.simulator._compare import REPLICAS_COLUMNS
    from pdscale.spec import load_spec

    t = TRACES[trace]
    options = SimOptions(trace=str(SHARED / t["file"]), mode=t["mode"], scale=t["scale"],
                         cold_start_s=cold_start_s, seed=seed, policy=policy,
                         service=t["service"])
    started = time.perf_counter()
    result, _ = simulate(load_spec(SPEC), options)
    s = result.summary
    row = {"trace": trace, "service": t["service"], "scale": t["scale"], "mode": t["mode"],
           "cold_start_s": cold_start_s, "seed": seed, "policy": policy,
           "slo_attainment": s["slo_attainment"], "gpu_hours": s["gpu_hours"],
           "ttft_p95_s": s["ttft_p95_s"], "itl_p95_s": s["itl_p95_s"],
           "scale_actions": s["scale_actions"], "requests": s["requests"],
           "peak_prefill": s["pools"]["prefill"]["peak_replicas"],
           "peak_decode": s["pools"]["decode"]["peak_replicas"],
           "wall_s": round(time.perf_counter() - started, 1)}
    series = None
    if cold_start_s == 60.0:
        window = t["window_h"]
        rows = result.timeseries
        if window is not None:
            rows = [r for r in rows if window[0] * 60 <= r["minute"] < window[1] * 60]
        series = {k: [r[k] for r in rows] for k in REPLICAS_COLUMNS}
    return {"row": row, "series": series}


ORACLE_FACTOR = 1.10
"""pdscale's GPU-hours at most this multiple of the oracle's (issue 16; 1.15 before it)."""


ATTAINMENT_TARGET = 0.99
CEILING_MARGIN = 0.003
"""Where static (sized for the trace's peak) itself stays under 99 %, the attainment target is
static's ceiling less 0.3 points (issue 16: "on Mooncake, at least static's own ceiling less
0.3 points"): requests that no allocation serves within the SLO are not the policy's to win."""


def attainment_target(static_attainment: float | None) -> float:
    """99 %, or static's own ceiling less :data:`CEILING_MARGIN` where that is lower."""
    if static_attainment is None:
        return ATTAINMENT_TARGET
    return min(ATTAINMENT_TARGET, static_attainment - CEILING_MARGIN)


def targets(rows: list[dict[str, Any]], cold_start_s: float = 60.0) -> list[dict[str, Any]]:
    """The targets per trace at one cold start: pdscale attainment >= 99 % (or static's
    ceiling less 0.3 points, :func:`attainment_target`) on at most :data:`ORACLE_FACTOR` x the
    oracle's GPU-hours (issue 16); >= 20 % fewer GPU-hours than reactive at equal or better
    attainment; better than dynamo on both."""
    out = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        by = {r["policy"]: r for r in rows
              if r["trace"] == trace and r["cold_start_s"] == cold_start_s}
        if not {"pdscale", "oracle", "reactive", "dynamo"} <= by.keys():
            continue
        p, o, r, d = by["pdscale"], by["oracle"], by["reactive"], by["dynamo"]
        goal = attainment_target(by["static"]["slo_attainment"] if "static" in by else None)
        out.append({
            "trace": trace, "cold_start_s": cold_start_s, "attainment_target": goal,
            "attainment": p["slo_attainment"], "attainment_ok": p["slo_attainment"] >= goal,
            "vs_oracle_gpu": p["gpu_hours"] / o["gpu_hours"],
            "vs_oracle_ok": p["gpu_hours"] <= ORACLE_FACTOR * o["gpu_hours"],
            "saving_vs_reactive": 1 - p["gpu_hours"] / r["gpu_hours"],
            "vs_reactive_ok": p["gpu_hours"] <= 0.8 * r["gpu_hours"]
            and p["slo_attainment"] >= r["slo_attainment"],
            "vs_dynamo_ok": p["gpu_hours"] <= d["gpu_hours"]
            and p["slo_attainment"] >= d["slo_attainment"]})
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| policy | SLO attainment | GPU-hours | x oracle | TTFT p95 s | ITL p95 s "
            "| scale actions | peak P | peak D |")
    lines = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        for cold in sorted({r["cold_start_s"] for r in rows if r["trace"] == trace}):
            group = [r for r in rows if r["trace"] == trace and r["cold_start_s"] == cold]
            oracle = next((r["gpu_hours"] for r in group if r["policy"] == "oracle"), None)
            first = group[0]
            lines += [f"\n**{trace}** (x{first['scale']:g}, {first['mode']} mode), cold start "
                      f"{cold:g} s\n", head, "|---|---|---|---|---|---|---|---|---|"]
            for r in group:
                ratio = f"{r['gpu_hours'] / oracle:.2f}" if oracle else "n/a"
                lines.append(f"| {r['policy']} | {r['slo_attainment']:.2%} | "
                             f"{r['gpu_hours']:.2f} | {ratio} | {r['ttft_p95_s']:.3f} | "
                             f"{r['itl_p95_s']:.4f} | {r['scale_actions']} | "
                             f"{r['peak_prefill']} | {r['peak_decode']} |")
    return "\n".join(lines) + "\n"


def cost_ratio(value: float, ok: bool | None = None) -> str:
    """A ratio to the oracle's GPU-hours at two decimals, or four where two would round it
    across the target (1.1004 is not 1.10); ``ok`` defaults to the ratio's own verdict."""
    ok = value <= ORACLE_FACTOR if ok is None else ok
    short = f"{value:.2f}"
    return short if (float(short) <= ORACLE_FACTOR) == ok else f"{value:.4f}"


def _targets_table(checks: list[dict[str, Any]]) -> str:
    def mark(ok: bool) -> str:
        return "yes" if ok else "**no**"

    lines = [f"| trace | pdscale attainment (target: 99 %, or static's less 0.3 points) | "
             f"GPU-hours / oracle "
             f"(<= {ORACLE_FACTOR:.2f}) | "
             "fewer GPU-hours than reactive (>= 20 %, attainment >= reactive) | "
             "beats dynamo on both |", "|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['trace']} | {c['attainment']:.2%} of {c['attainment_target']:.2%} "
                     f"{mark(c['attainment_ok'])} | "
                     f"{cost_ratio(c['vs_oracle_gpu'], c['vs_oracle_ok'])} "
                     f"{mark(c['vs_oracle_ok'])} | "
                     f"{c['saving_vs_reactive']:.1%} {mark(c['vs_reactive_ok'])} | "
                     f"{mark(c['vs_dynamo_ok'])} |")
    return "\n".join(lines) + "\n"


def _plots(rows: list[dict[str, Any]], series: dict[tuple[str, str], dict[str, list[float]]],
           out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from pdscale.simulator._compare import replicas_figure

    out.mkdir(parents=True, exist_ok=True)
    written = []
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    colours = {p: f"C{i}" for i, p in enumerate(POLICIES)}
    markers = {30.0: "o", 60.0: "s", 180.0: "^"}
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 4), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        for r in (r for r in rows if r["trace"] == trace):
            ax.scatter(r["gpu_hours"], 100 * r["slo_attainment"],
                       color=colours[r["policy"]], marker=markers.get(r["cold_start_s"], "x"),
                       s=45, label=f"{r['policy']} {r['cold_start_s']:g}s")
        ax.set_title(trace)
        ax.set_xlabel("GPU-hours")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("SLO attainment (%)")
    handles = [Line2D([], [], color=c, marker="o", ls="", label=p)
               for p, c in colours.items()]
    handles += [Line2D([], [], color="k", marker=m, ls="", label=f"{c:g} s cold start")
                for c, m in markers.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle("GPU-hours against SLO attainment (up and left is better)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = out / "gpu_hours_vs_attainment.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    for trace in traces:
        got = {p: series[(trace, p)] for p in POLICIES if (trace, p) in series}
        if not got:
            continue
        fig = replicas_figure({p: s for p, s in got.items() if p != "static"},
                              f"{trace}, 60 s cold start: replicas (ready + starting) against "
                              "the load", "hours into the trace", colours)
        path = out / f"replicas_{trace}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def chosen_traces(parser: argparse.ArgumentParser, arg: str) -> list[str] | None:
    """The --traces list, checked; None (said on stderr) when ../shared/traces is absent."""
    if not SHARED.is_dir():
        print(f"{parser.prog} needs the shared traces in {SHARED}", file=sys.stderr)
        return None
    traces = arg.split(",")
    unknown = [t for t in traces if t not in TRACES]
    if unknown:
        parser.error(f"unknown trace(s) {', '.join(unknown)}; use {', '.join(TRACES)}")
    return traces


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=",".join(TRACES),
                        help=f"comma-separated, of: {', '.join(TRACES)}")
    parser.add_argument("--cold-starts", default="30,60,180", help="seconds, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    parser.add_argument("--out", default="policies",
                        help="results under bench/results/<out>.json, .md and <out>/ (another "
                             "name keeps a partial run, e.g. one trace's timings, from "
                             "replacing the full one)")
    args = parser.parse_args()
    traces = chosen_traces(parser, args.traces)
    if traces is None:
        return 1
    colds = [float(c) for c in args.cold_starts.split(",")]
    runs = [(t, c, p, args.seed) for t in traces for c in colds
            for p in args.policies.split(",")]
    # Longest first (pdscale on the 14-day traces), so parallel jobs finish together.
    order = sorted(runs, key=lambda r: (TRACES[r[0]]["mode"] != "fluid", r[2] != "pdscale"))
    done: dict[tuple[str, float, str, int], dict[str, Any]] = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(_run, *run): run for run in order}
        for n, future in enumerate(futures, 1):
            run = futures[future]
            done[run] = future.result()
            row = done[run]["row"]
            print(f"[{n}/{len(runs)} {time.perf_counter() - started:.0f}s] {run[0]} "
                  f"{run[1]:g}s {run[2]}: {row['slo_attainment']:.2%}, "
                  f"{row['gpu_hours']:.1f} GPU-h ({row['wall_s']:.0f}s)",
                  file=sys.stderr, flush=True)
    rows = [done[r]["row"] for r in runs]
    series = {(r[0], r[2]): done[r]["series"] for r in runs if done[r]["series"] is not None}
    checks = targets(rows)
    table = _table(rows)
    checks_md = _targets_table(checks)
    print(table)
    print("Targets at a 60 s cold start:\n")
    print(checks_md)
    command = "bench/policies.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"bench": "policies", "python": platform.python_version(), "command": command,
         "spec": str(SPEC.relative_to(ROOT)), "rows": rows, "targets_60s": checks},
        indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(
        f"# Policy benchmark\n\n`{command}`, seed {args.seed}; services in "
        f"`bench/policies.yaml`.\n\n## Targets at a 60 s cold start\n\n{checks_md}\n"
        f"## Every run\n{table}")
    plots = _plots(rows, series, RESULTS / args.out)
    for path in [RESULTS / f"{args.out}.json", RESULTS / f"{args.out}.md", *plots]:
        print(f"wrote {shown(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
