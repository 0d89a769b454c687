"""``pdscale demo``: policies side by side on a generated working morning, beside the best
fixed allocation in hindsight, with the spec's alerts and dashboards."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    NON_NEGATIVE,
    POSITIVE,
    Progress,
    err,
    example_spec,
    interrupted,
    load_checked,
    out_ok,
    seed,
    write_output,
)


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        return _demo(args)
    except KeyboardInterrupt:
        return interrupted(args.out, wrote=False)


def _demo(args: argparse.Namespace) -> int:
    from pdscale.alerts import alert_files
    from pdscale.dashboards import dashboard_files
    from pdscale.simulator import (
        ProfileError,
        SimOptions,
        TraceError,
        compare_policies,
        comparison_files,
        comparison_table,
        fixed_in_hindsight,
    )

    args.spec = args.spec or example_spec("vllm.yaml")
    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    if not out_ok(args.out):
        return EXIT_BAD_INPUT
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    known = ("static", "reactive", "dynamo", "oracle", "pdscale", "best-fixed")
    unknown = [p for p in policies if p not in known]
    if unknown or not policies:
        err(f"unknown policy {', '.join(unknown) or '(none)'}; use a comma-separated list of "
            f"{', '.join(known)}")
        return EXIT_BAD_INPUT
    options = SimOptions(trace=args.trace, mode="event",
                         duration_s=None if args.hours is None else args.hours * 3600,
                         cold_start_s=args.cold_start, seed=args.seed, scale=args.scale)
    print(f"pdscale demo: {args.trace} (seed {args.seed}, x{args.scale:g}"
          + ("" if args.hours is None else f", {args.hours:g} h") + f"), {args.cold_start:g} s "
          f"cold start, service {spec.services[0].name} of {args.spec}; "
          f"{', '.join(policies)}", file=sys.stderr)
    bars: dict[str, Progress] = {}

    def progress(policy: str, share: float) -> None:
        bars.setdefault(policy, Progress(f"  {policy:>10}"))(share)

    def tried(p: int, d: int, attainment: float) -> None:
        print(f"  best-fixed: {p}+{d} replicas held reach {100 * attainment:.1f} %",
              file=sys.stderr)

    try:
        results = compare_policies(spec, options, [p for p in policies if p != "best-fixed"],
                                   progress=progress)
        for bar in bars.values():
            bar.close()
        bars.clear()
        if "best-fixed" in policies:
            found, run = fixed_in_hindsight(spec, options, progress=tried)
            results = {**results, "best-fixed": run}
            results = {p: results[p] for p in policies}
            print(f"best fixed in hindsight: {found.prefill} prefill + {found.decode} decode "
                  f"replicas held throughout (the fewest that reach "
                  f"{100 * found.target:.1f} % of requests within the SLO; "
                  f"{found.evaluated} allocations tried)"
                  + ("" if found.reached else "; none within the pools' maximums reached it"))
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return EXIT_BAD_INPUT
    finally:  # end a bar's line before any message (Ctrl-C's included)
        for bar in bars.values():
            bar.close()
    files: dict[str, str | bytes] = {f"simulation/{k}": v
                                     for k, v in comparison_files(results).items()}
    files.update({f"alerts/{k}": v for k, v in alert_files(spec).items()})
    files.update({f"dashboards/{k}": v for k, v in dashboard_files(spec).items()})

    def report() -> None:
        print(comparison_table(results), end="")
        print(f"\nwrote {args.out}/: simulation/comparison.md, simulation/plots/"
              "gpu_hours_vs_attainment.png, simulation/plots/replicas_vs_load.png, per-policy "
              "results in simulation/<policy>/, and the spec's alerts/ and dashboards/")

    return write_output(args.out, files, report)


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "demo", help="compare scaling policies on a generated morning; generate alerts and "
                     "dashboards",
        description="Replay a generated working morning (the load rises from 07:00 as on the "
                    "three earlier days the forecasters learn from, a flash crowd doubles it "
                    "at 08:10, prompts grow 2.5 times longer from 08:30) through the first "
                    "service of the spec under each policy, and search the best fixed "
                    "allocation in hindsight (the fewest replicas that, held all morning, "
                    "serve 99 %% of requests within the SLO). Prints a comparison table (SLO "
                    "attainment, GPU-hours, latency) and writes it with plots, per-policy "
                    "results and the spec's alerts and dashboards into --out. The scaling "
                    "policies start at the pools' minimum replicas; static holds the peak "
                    "need, best-fixed its allocation.")
    p.add_argument("--spec", help="the spec whose first service is replayed (default: the "
                                  "shipped examples/vllm.yaml)")
    p.add_argument("--out", default="out")
    p.add_argument("--policies", default="static,reactive,pdscale,best-fixed",
                   help="comma-separated (static, reactive, dynamo, oracle, pdscale, "
                        "best-fixed; default %(default)s)")
    p.add_argument("--trace", default="scenario:demo-day",
                   help="what to replay: scenario:NAME (a generated family, pdscale simulate "
                        "--help lists them), 'synthetic', or a trace file (default "
                        "%(default)s)")
    p.add_argument("--hours", type=POSITIVE, help="replay only the first HOURS (default: all)")
    p.add_argument("--scale", type=POSITIVE, default=1.0,
                   help="load multiplier (default 1: the morning reaches 24 req/s, about 48 "
                        "in the flash crowd)")
    p.add_argument("--cold-start", type=NON_NEGATIVE, default=60.0, help="seconds (default 60)")
    p.add_argument("--seed", type=seed, default=0)
    p.set_defaults(func=_cmd_demo)
