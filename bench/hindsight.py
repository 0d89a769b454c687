"""What a policy that forecasts nothing could reach at best: the hindsight bound.

    .venv/bin/python bench/hindsight.py [--traces azure,mooncake] [--cold-starts 60]
                                        [--windows 15,300,900,1800,3600]
                                        [--margins 1,1.25,1.5] [--jobs 1] [--out hindsight]

The oracle of bench/policies.py knows the future: its GPU-hours are the floor the issue's cost
target (at most 1.10x the oracle's) is measured from. This script asks how much of that target
is reachable without knowing the future. Its **hindsight** policy knows the past perfectly: at
every tick it reads the oracle's own per-second need (``simulator._policies.demand_plan``: the
replicas the true arrivals needed, second by second) up to now, with no scrape delay, no rate
window and no capacity error, and asks for ``margin`` x the largest need of the last ``window``
seconds; replicas it asks for are ready one cold start later, like everyone's, and it scales
down at once when the window's need falls. A reactive policy with a recent-peak hold and
perfect telemetry, then: pdscale's sizing without its forecast is such a policy with
imperfect telemetry. Where no (window, margin) reaches 99 % within 1.10x the oracle's
GPU-hours, no such policy can, and the target needs a forecast of the load one cold start
ahead (on a one-hour trace, without history to learn it from).

By default the one-hour traces (Azure code x12, Mooncake conversation x8, as in
bench/policies.py). The 14-day ServeGen traces can be run too (``--traces
servegen-m-large,...``), but there a forecaster has the daily season to learn from, so
hindsight is a reference point, not a bound. Prints a table; writes
bench/results/<out>.json and <out>.md and the plot bench/results/policies/<out>.png
(attainment against GPU-hours / oracle, the hindsight settings beside pdscale's and the
baselines' runs from bench/results/policies.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core a job: --jobs sets the parallelism

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from policies import (  # noqa: E402
    ORACLE_FACTOR,
    RESULTS,
    SHARED,
    SPEC,
    TRACES,
    cost_ratio,
    shown,
)

sys.path.insert(0, str(ROOT))

from pdscale.controller import Observation, PoolDecision, PoolKey  # noqa: E402
from pdscale.simulator._policies import DemandPlan  # noqa: E402
from pdscale.spec import Role  # noqa: E402

ONE_HOUR = ("azure", "mooncake")
TARGET_ATTAINMENT = 0.99
TARGET_COST = ORACLE_FACTOR  # the policy benchmark's cost target, which cost_ratio reads too


class HindsightPolicy:
    """``margin`` x the largest true need of the last ``window_s`` seconds (see the module
    docstring)."""

    name = "hindsight"

    def __init__(self, plan: DemandPlan, *, window_s: float, margin: float,
                 tick_s: float) -> None:
        if window_s <= 0 or margin <= 0:
            raise ValueError(f"window and margin must be positive; got {window_s}, {margin}")
        self.plan = plan
        self.window_s = max(window_s, tick_s)
        self.margin = margin

    def need(self, role: Role, now_s: float) -> int:
        series = self.plan.prefill if role is Role.PREFILL else self.plan.decode
        hi = min(len(series), max(1, int(now_s)))
        lo = max(0, hi - int(self.window_s))
        return math.ceil(self.margin * int(series[lo:hi].max()) - 1e-9)

    def decide(self, observation: Observation) -> Mapping[PoolKey, PoolDecision]:
        out = {}
        for key, pool in observation.pools.items():
            r = pool.replicas
            want = max(r.min_replicas, min(r.max_replicas, self.need(key[1],
                                                                     observation.now_s)))
            out[key] = PoolDecision(want, (f"hindsight: {self.margin:g}x the true need of the "
                                           f"last {self.window_s:.0f}s",))
        return out


def _run(trace: str, cold_start_s: float, window_s: float, margin: float,
         seed: int) -> dict[str, Any]:
    """One simulation in a worker process."""
    from pdscale.simulator import SimOptions, simulate
    from pdscale.simulator._policies import OraclePolicy
    from pdscale.simulator._simulate import prepare
    from pdscale.spec import load_spec

    t = TRACES[trace]
    spec = load_spec(SPEC)
    options = SimOptions(trace=str(SHARED / t["file"]), mode=t["mode"], scale=t["scale"],
                         cold_start_s=cold_start_s, seed=seed, policy="oracle",
                         service=t["service"])
    prepared = prepare(spec, options)
    assert isinstance(prepared.policy, OraclePolicy)
    policy = HindsightPolicy(prepared.policy.plan, window_s=window_s, margin=margin,
                             tick_s=prepared.setup.tick_s)
    started = time.perf_counter()
    result, _ = simulate(spec, options, policy=policy)
    s = result.summary
    return {"trace": trace, "cold_start_s": cold_start_s, "window_s": window_s,
            "margin": margin, "seed": seed, "slo_attainment": s["slo_attainment"],
            "gpu_hours": s["gpu_hours"], "wall_s": round(time.perf_counter() - started, 1)}


def reference_runs(path: Path) -> list[dict[str, Any]]:
    """The policy benchmark's runs (pdscale, the baselines, the oracle), if recorded."""
    if not path.exists():
        return []
    return list(json.loads(path.read_text()).get("rows", []))


def attainment_target(static: float | None) -> float:
    """The issue's attainment target: 99 %, or static's own ceiling less 0.3 points where
    static (sized for the peak) cannot reach 99 % (Mooncake's longest prompts)."""
    if static is None:
        return TARGET_ATTAINMENT
    return min(TARGET_ATTAINMENT, static - 0.003)


def summarise(rows: list[dict[str, Any]], reference: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Per trace and cold start: the cheapest hindsight setting at the attainment target, its
    cost against the oracle's, and the best hindsight attainment within 1.10x the oracle's
    GPU-hours."""
    out = []
    for (trace, cold), group in itertools.groupby(
            sorted(rows, key=lambda r: (r["trace"], r["cold_start_s"])),
            key=lambda r: (r["trace"], r["cold_start_s"])):
        runs = list(group)
        oracle = next((r["gpu_hours"] for r in reference if r["trace"] == trace
                       and r["policy"] == "oracle" and r["cold_start_s"] == cold), None)
        pdscale = next((r for r in reference if r["trace"] == trace
                        and r["policy"] == "pdscale" and r["cold_start_s"] == cold), None)
        static = next((r["slo_attainment"] for r in reference if r["trace"] == trace
                       and r["policy"] == "static" and r["cold_start_s"] == cold), None)
        target = attainment_target(static)
        reaching = [r for r in runs if r["slo_attainment"] >= target - 1e-12]
        cheapest = min(reaching, key=lambda r: r["gpu_hours"]) if reaching else None
        within = [r for r in runs if oracle is not None
                  and r["gpu_hours"] <= TARGET_COST * oracle]
        best = max(within, key=lambda r: r["slo_attainment"]) if within else None
        out.append({
            "trace": trace, "cold_start_s": cold, "oracle_gpu_hours": oracle,
            "attainment_target": target, "cheapest_at_target": cheapest,
            "cheapest_at_target_x_oracle": (cheapest["gpu_hours"] / oracle
                                        if cheapest and oracle else None),
            "best_within_1_10x": best,
            "pdscale": ({"slo_attainment": pdscale["slo_attainment"],
                         "gpu_hours": pdscale["gpu_hours"]} if pdscale else None),
        })
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def tables(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    lines = ["| trace | cold s | window s | margin | SLO attainment | GPU-hours | x oracle |",
             "|---|---|---|---|---|---|---|"]
    oracle = {(s["trace"], s["cold_start_s"]): s["oracle_gpu_hours"] for s in summary}
    for r in sorted(rows, key=lambda r: (r["trace"], r["cold_start_s"], r["window_s"],
                                         r["margin"])):
        o = oracle.get((r["trace"], r["cold_start_s"]))
        lines.append(f"| {r['trace']} | {r['cold_start_s']:g} | {r['window_s']:g} | "
                     f"{r['margin']:g} | {_pct(r['slo_attainment'])} | {r['gpu_hours']:.2f} | "
                     + (f"{r['gpu_hours'] / o:.2f}" if o else "n/a") + " |")
    lines += ["", "| trace | cold s | oracle GPU-h | attainment target | cheapest hindsight at "
              "the target (x oracle) | best hindsight within 1.10x oracle | pdscale (x oracle) |",
              "|---|---|---|---|---|---|---|"]
    for s in summary:
        c, b, p, o = (s["cheapest_at_target"], s["best_within_1_10x"], s["pdscale"],
                      s["oracle_gpu_hours"])
        lines.append(
            f"| {s['trace']} | {s['cold_start_s']:g} | "
            + (f"{o:.2f}" if o else "n/a") + f" | {_pct(s['attainment_target'])} | "
            + (f"{c['window_s']:g} s x{c['margin']:g}: {_pct(c['slo_attainment'])}, "
               f"{c['gpu_hours']:.2f} ({s['cheapest_at_target_x_oracle']:.2f}x)"
               if c and o else "none") + " | "
            + (f"{b['window_s']:g} s x{b['margin']:g}: {_pct(b['slo_attainment'])}"
               if b else "none") + " | "
            + (f"{_pct(p['slo_attainment'])}, {p['gpu_hours']:.2f} "
               f"({cost_ratio(p['gpu_hours'] / o)}x)" if p and o else "n/a") + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], reference: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({r["trace"] for r in rows})
    colds = sorted({r["cold_start_s"] for r in rows})
    fig, axes = plt.subplots(len(traces), len(colds), figsize=(5.5 * len(colds),
                                                               4.2 * len(traces)),
                             squeeze=False)
    for ax, (trace, cold) in zip(axes.flat, itertools.product(traces, colds), strict=True):
        ref = {r["policy"]: r for r in reference if r["trace"] == trace
               and r["cold_start_s"] == cold}
        oracle = ref.get("oracle", {}).get("gpu_hours")
        if not oracle:
            continue
        mine = [r for r in rows if r["trace"] == trace and r["cold_start_s"] == cold]
        for window in sorted({r["window_s"] for r in mine}):
            pts = sorted((r["gpu_hours"] / oracle, 100 * r["slo_attainment"])
                         for r in mine if r["window_s"] == window)
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"hindsight, {window:g} s")
        for name, r in ref.items():
            ax.scatter([r["gpu_hours"] / oracle], [100 * r["slo_attainment"]], marker="*",
                       s=120, zorder=5)
            ax.annotate(name, (r["gpu_hours"] / oracle, 100 * r["slo_attainment"]),
                        textcoords="offset points", xytext=(4, 4))
        ax.axhline(100 * TARGET_ATTAINMENT, color="grey", ls="--", lw=0.8)
        ax.axvline(TARGET_COST, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{trace}, cold start {cold:g} s")
        ax.set_xlabel("GPU-hours / oracle's")
        ax.set_ylabel("SLO attainment, %")
        ax.set_ylim(max(50.0, ax.get_ylim()[0]), 100.5)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--{what}: expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"--{what}: expected positive numbers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/hindsight.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs ../shared/traces. About 15 s a run on one core.")
    parser.add_argument("--traces", default=",".join(ONE_HOUR),
                        help="comma-separated, of: " + ", ".join(TRACES) + " (the 14-day "
                             "ServeGen traces take about 30 s a run; there hindsight is a "
                             "reference, not a bound)")
    parser.add_argument("--cold-starts", default="60", help="seconds, comma-separated")
    parser.add_argument("--windows", default="15,300,900,1800,3600",
                        help="seconds of the past whose largest need is held")
    parser.add_argument("--margins", default="1,1.25,1.5",
                        help="multipliers on that need")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--reference", type=Path, default=RESULTS / "policies.json",
                        help="the policy benchmark's results (the oracle's GPU-hours)")
    parser.add_argument("--out", default="hindsight", help="results name under bench/results")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="an earlier hindsight.json: summarise its runs again, simulate "
                             "nothing (the other grid options are ignored)")
    args = parser.parse_args(argv)
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    bad = [t for t in traces if t not in TRACES]
    if bad:
        parser.error(f"unknown trace(s) {', '.join(bad)}; use {', '.join(TRACES)}")
    if not SHARED.is_dir():
        print(f"no traces at {SHARED}: this benchmark needs the shared traces",
              file=sys.stderr)
        return 2
    if args.reuse is not None and not args.reuse.exists():
        parser.error(f"--reuse: {args.reuse} does not exist; run without --reuse first")
    colds = _floats(args.cold_starts, "cold-starts")
    grid = list(itertools.product(traces, colds, _floats(args.windows, "windows"),
                                  _floats(args.margins, "margins")))
    reference = reference_runs(args.reference)
    if not reference:
        print(f"warning: {args.reference} has no runs; x-oracle columns will read n/a",
              file=sys.stderr)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    if args.reuse is not None:
        earlier = json.loads(args.reuse.read_text())
        rows, grid = earlier["runs"], []
    print(f"{len(grid)} runs on {args.jobs} job(s)", file=sys.stderr)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run, t, c, w, m, args.seed) for t, c, w, m in grid]
        for i, fut in enumerate(futures, 1):
            row = fut.result()
            rows.append(row)
            print(f"[{i}/{len(grid)} {time.perf_counter() - started:.0f}s] {row['trace']} "
                  f"{row['cold_start_s']:g}s window {row['window_s']:g}s x{row['margin']:g}: "
                  f"{_pct(row['slo_attainment'])}, {row['gpu_hours']:.2f} GPU-h",
                  file=sys.stderr)
    summary = summarise(rows, reference)
    text = tables(rows, summary)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    head = (f"# Hindsight bound\n\n`bench/hindsight.py --traces {args.traces} --cold-starts "
            f"{args.cold_starts} --windows {args.windows} --margins {args.margins}`, seed "
            f"{args.seed}; oracle and pdscale from {args.reference.name}"
            + (f"; runs reused from {args.reuse}" if args.reuse else "") + ".\n\n")
    payload = {"runs": rows, "summary": summary, "reference": str(shown(args.reference.resolve())),
               "python": platform.python_version(),
               "wall_s": (earlier["wall_s"] if args.reuse is not None
                          else round(time.perf_counter() - started, 1))}
    for name, body in ((f"{args.out}.json", json.dumps(payload, indent=1) + "\n"),
                       (f"{args.out}.md", head + text)):
        tmp = RESULTS / (name + ".tmp")
        tmp.write_text(body)
        tmp.replace(RESULTS / name)
    if reference:
        plot(rows, reference, RESULTS / "policies" / f"{args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
