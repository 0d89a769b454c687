"""Cost-matched comparison: each policy at several settings, on the shared traces.

    .venv/bin/python bench/frontier.py [--traces azure,mooncake,servegen-m-large,servegen-m-small]
                                       [--reuse bench/results/policies.json] [--jobs 2]

One point per policy and setting says little when the policies spend different amounts: a
policy that spends half as much and misses the SLO twice as often is neither better nor worse.
This script runs every policy at several settings of its own knob (pdscale: the scale-up
quantile, the recent-burst window and the scale-down stabilisation; reactive: HPA's
utilisation target; dynamo: the planner's interval), at a 60 s cold start, and compares
attainment at matched GPU-hours: for each baseline run, pdscale's attainment interpolated on
its own frontier at that run's GPU-hours (``n/a`` where the baseline spends less than
pdscale's cheapest setting).

``--reuse`` takes runs from a policies.json written by bench/policies.py (its default-setting
runs) or an earlier frontier.json, at the same commit and seed, so they are not simulated
twice (pdscale's 14-day runs take about 5 minutes each). Prints a table; writes
bench/results/frontier.json, frontier.md and bench/results/policies/frontier.png. Needs
../shared/traces.
"""

from __future__ import annotations

import argparse
import itertools
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
sys.path.insert(0, str(ROOT / "bench"))

from policies import RESULTS, SHARED, SPEC, TRACES, chosen_traces  # noqa: E402

COLD_START_S = 60.0
SETTINGS: dict[str, list[dict[str, float]]] = {
    # pdscale's settings spell out the three knobs the defaults set (quantile 0.97, 60-minute
    # burst window, 10-minute stabilisation), so each point means the same when they change.
    "pdscale": [{"scale_up_quantile": 0.99, "burst_window": 7200, "stabilisation": 900},
                {},
                {"scale_up_quantile": 0.9, "burst_window": 900, "stabilisation": 300},
                {"scale_up_quantile": 0.75, "burst_window": 300, "stabilisation": 300},
                {"scale_up_quantile": 0.9, "burst_window": 180, "stabilisation": 60,
                 "max_step_down": 8},
                {"scale_up_quantile": 0.6, "burst_window": 0, "stabilisation": 60,
                 "max_step_down": 8}],
    "reactive": [{"target": 0.3}, {"target": 0.45}, {}, {"target": 0.8}],
    "dynamo": [{"interval_s": 60}, {}],
}
"""Per policy, the settings run ({} is the default, as in bench/policies.py)."""


def _label(setting: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in setting.items()) or "default"


def _run(trace: str, policy: str, setting: dict[str, float], seed: int) -> dict[str, Any]:
    """One simulation in a worker process."""
    sys.path.insert(0, str(ROOT))
    from pdscale.controller import Policy
    from pdscale.simulator import DynamoPolicy, ReactivePolicy, SimOptions, simulate
    from pdscale.simulator._simulate import prepare
    from pdscale.spec import load_spec

    t = TRACES[trace]
    spec = load_spec(SPEC)
    if policy == "pdscale" and setting:
        spec = spec.model_copy(update={"controller": spec.controller.model_copy(
            update=setting)})
    options = SimOptions(trace=str(SHARED / t["file"]), mode=t["mode"], scale=t["scale"],
                         cold_start_s=COLD_START_S, seed=seed, policy=policy,
                         service=t["service"])
    chosen: Policy | None = None
    if policy in ("reactive", "dynamo") and setting:
        setup = prepare(spec, options).setup
        if policy == "reactive":
            chosen = ReactivePolicy(tick_s=setup.tick_s,
                                    decode_max_batch=setup.decode.profile.max_batch, **setting)
        else:
            chosen = DynamoPolicy(setup.prefill.profile, setup.decode.profile,
                                  ttft_slo_s=setup.slo_ttft_s, itl_slo_s=setup.slo_itl_s,
                                  **setting)
    started = time.perf_counter()
    result, _ = simulate(spec, options, policy=chosen)
    s = result.summary
    return {"trace": trace, "policy": policy, "setting": _label(setting), "seed": seed,
            "slo_attainment": s["slo_attainment"], "gpu_hours": s["gpu_hours"],
            "wall_s": round(time.perf_counter() - started, 1)}


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (GPU-hours, attainment) points no other point beats on both, cheapest first."""
    out: list[tuple[float, float]] = []
    for gpu, att in sorted(points):
        if not out or att > out[-1][1]:
            out.append((gpu, att))
    return out


def attainment_at(front: list[tuple[float, float]], gpu_hours: float) -> float | None:
    """Attainment on a frontier at ``gpu_hours`` (linear between its points; beyond its most
    expensive point, that point's: a lower bound; None below its cheapest)."""
    if not front or gpu_hours < front[0][0]:
        return None
    for (g0, a0), (g1, a1) in itertools.pairwise(front):
        if g0 <= gpu_hours <= g1:
            return a0 + (a1 - a0) * (gpu_hours - g0) / (g1 - g0) if g1 > g0 else max(a0, a1)
    return front[-1][1]


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per baseline run: pdscale's attainment at the same GPU-hours."""
    out = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = [r for r in rows if r["trace"] == trace and r["policy"] == "pdscale"]
        front = frontier([(r["gpu_hours"], r["slo_attainment"]) for r in mine])
        for r in rows:
            if r["trace"] != trace or r["policy"] == "pdscale":
                continue
            at = attainment_at(front, r["gpu_hours"])
            better = None if at is None else at > r["slo_attainment"]
            if better is False and r["gpu_hours"] > front[-1][0]:
                better = None  # costlier than any pdscale setting: pdscale was not run there
            out.append({"trace": trace, "policy": r["policy"], "setting": r["setting"],
                        "gpu_hours": r["gpu_hours"], "attainment": r["slo_attainment"],
                        "pdscale_attainment": at, "pdscale_better": better})
    return out


def _table(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    lines = ["| trace | policy | setting | GPU-hours | SLO attainment | pdscale at these "
             "GPU-hours |", "|---|---|---|---|---|---|"]
    by = {(c["trace"], c["policy"], c["setting"]): c for c in checks}
    for r in rows:
        c = by.get((r["trace"], r["policy"], r["setting"]))
        at = ""
        if c is not None and c["pdscale_attainment"] is None:
            at = "n/a (cheaper than any pdscale setting)"
        elif c is not None and c["pdscale_better"] is None:
            at = (f"at least {c['pdscale_attainment']:.2%} (costlier than any pdscale "
                  "setting: undecided)")
        elif c is not None:
            at = f"{c['pdscale_attainment']:.2%}" + \
                (" (better)" if c["pdscale_better"] else " (worse)")
        lines.append(f"| {r['trace']} | {r['policy']} | {r['setting']} | {r['gpu_hours']:.1f} "
                     f"| {r['slo_attainment']:.2%} | {at} |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], oracle: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 4), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        for i, policy in enumerate(SETTINGS):
            pts = sorted((r["gpu_hours"], 100 * r["slo_attainment"]) for r in rows
                         if r["trace"] == trace and r["policy"] == policy)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=f"C{i}", label=policy)
        if trace in oracle:
            ax.scatter(oracle[trace]["gpu_hours"], 100 * oracle[trace]["slo_attainment"],
                       marker="*", s=140, color="k", label="oracle", zorder=3)
        ax.set_title(trace)
        ax.set_xlabel("GPU-hours")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("SLO attainment (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Each policy at several settings, {COLD_START_S:g} s cold start "
                 "(up and left is better)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=",".join(TRACES),
                        help=f"comma-separated, of: {', '.join(TRACES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    parser.add_argument("--reuse", type=Path, action="append", default=[],
                        help="runs to take instead of simulating again: a policies.json "
                        "(its default-setting runs at 60 s) or an earlier frontier.json, from "
                        "the same commit; may be given more than once")
    args = parser.parse_args()
    traces = chosen_traces(parser, args.traces)
    if traces is None:
        return 1
    reused: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in args.reuse:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--reuse {path}: cannot read it ({exc}); run bench/policies.py "
                         "first or leave --reuse out")
        for r in saved.get("rows", []):
            if r.get("cold_start_s", COLD_START_S) == COLD_START_S and r["seed"] == args.seed:
                setting = r.get("setting", "default")
                reused[(r["trace"], r["policy"], setting)] = {
                    "trace": r["trace"], "policy": r["policy"], "setting": setting,
                    "seed": r["seed"], "slo_attainment": r["slo_attainment"],
                    "gpu_hours": r["gpu_hours"], "wall_s": r["wall_s"], "reused": True}
    runs = [(t, p, s, args.seed) for t in traces for p, settings in SETTINGS.items()
            for s in settings]
    todo = [r for r in runs if (r[0], r[1], _label(r[2])) not in reused]
    # Longest first (pdscale on the 14-day traces), so parallel jobs finish together.
    todo.sort(key=lambda r: (TRACES[r[0]]["mode"] != "fluid", r[1] != "pdscale"))
    done: dict[tuple[str, str, str], dict[str, Any]] = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(_run, *run): run for run in todo}
        for n, future in enumerate(futures, 1):
            trace, policy, setting, _ = futures[future]
            row = future.result()
            done[(trace, policy, _label(setting))] = row
            print(f"[{n}/{len(todo)} {time.perf_counter() - started:.0f}s] {trace} {policy} "
                  f"{_label(setting)}: {row['slo_attainment']:.2%}, {row['gpu_hours']:.1f} "
                  f"GPU-h ({row['wall_s']:.0f}s)", file=sys.stderr, flush=True)
    rows = [done.get((t, p, _label(s))) or reused[(t, p, _label(s))] for t, p, s, _ in runs]
    checks = compare(rows)
    table = _table(rows, checks)
    print(table)
    command = "bench/frontier.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "frontier.json").write_text(json.dumps(
        {"bench": "frontier", "python": platform.python_version(), "command": command,
         "cold_start_s": COLD_START_S, "settings": SETTINGS, "rows": rows,
         "matched": checks}, indent=2) + "\n")
    (RESULTS / "frontier.md").write_text(
        f"# Cost-matched comparison\n\n`{command}`, seed {args.seed}, {COLD_START_S:g} s cold "
        f"start; services in `bench/policies.yaml`.\n\n{table}")
    # The oracle (knows the future) from a reused policies.json, as the reference point.
    oracle = {t: reused[(t, "oracle", "default")] for t in traces
              if (t, "oracle", "default") in reused}
    _plot(rows, oracle, RESULTS / "policies" / "frontier.png")
    for path in ("frontier.json", "frontier.md", "policies/frontier.png"):
        print(f"wrote bench/results/{path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
