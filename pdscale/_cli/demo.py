"""``pdscale demo``: policies side by side on the synthetic trace, with the spec's alerts and
dashboards."""

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
    )

    args.spec = args.spec or example_spec("vllm.yaml")
    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    if not out_ok(args.out):
        return EXIT_BAD_INPUT
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in ("static", "reactive", "dynamo", "oracle",
                                                "pdscale")]
    if unknown or not policies:
        err(f"unknown policy {', '.join(unknown) or '(none)'}; use a comma-separated list of "
             "static, reactive, dynamo, oracle, pdscale")
        return EXIT_BAD_INPUT
    options = SimOptions(trace="synthetic", mode="event", duration_s=args.hours * 3600,
                         cold_start_s=args.cold_start, seed=args.seed, scale=args.scale)
    print(f"pdscale demo: {args.hours:g} h of the synthetic trace (seed {args.seed}, x"
          f"{args.scale:g}), {args.cold_start:g} s cold start, service "
          f"{spec.services[0].name} of {args.spec}; policies {', '.join(policies)}",
          file=sys.stderr)
    bars: dict[str, Progress] = {}

    def progress(policy: str, share: float) -> None:
        bars.setdefault(policy, Progress(f"  {policy:>8}"))(share)

    try:
        results = compare_policies(spec, options, policies, progress=progress)
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
        "demo", help="compare scaling policies on a synthetic trace; generate alerts and "
                     "dashboards",
        description="Replay the embedded synthetic trace (daily swing, bursts, three length "
                    "mixes) through the first service of the spec under each policy, print a "
                    "comparison table (SLO attainment, GPU-hours, latency), and write it with "
                    "plots, per-policy results and the spec's alerts and dashboards into --out.")
    p.add_argument("--spec", help="the spec whose first service is replayed (default: the "
                                  "shipped examples/vllm.yaml)")
    p.add_argument("--out", default="out")
    p.add_argument("--policies", default="static,reactive,pdscale",
                   help="comma-separated (static, reactive, dynamo, oracle, pdscale)")
    p.add_argument("--hours", type=POSITIVE, default=2.0, help="trace length (default 2)")
    p.add_argument("--scale", type=POSITIVE, default=2.0,
                   help="load multiplier of the synthetic trace (default 2: ~40 req/s)")
    p.add_argument("--cold-start", type=NON_NEGATIVE, default=60.0, help="seconds (default 60)")
    p.add_argument("--seed", type=seed, default=0)
    p.set_defaults(func=_cmd_demo)
