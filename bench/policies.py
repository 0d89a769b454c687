"""Scaling policies side by side on the shared production traces (the start of the policy
benchmark; issue 7 extends it to every trace and cold starts of 30, 60 and 180 s).

    .venv/bin/python bench/policies.py [--traces azure] [--cold-start 60] [--seed 0]

Each trace is replayed in event mode through the first service of examples/vllm.yaml (max
replicas raised to 64 so the pools can follow the load) under reactive (HPA-like), dynamo
(Dynamo's planner), pdscale and oracle (knows the future; the cost floor), with the same seed.
Needs ../shared/traces. Prints a table per trace and writes bench/results/policies.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
TRACES = {"azure": ("azure_llm_2023_code.csv", 4.0)}
"""name -> (file under ../shared/traces, load multiplier)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="azure", help=f"comma-separated: {', '.join(TRACES)}")
    parser.add_argument("--cold-start", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="reactive,dynamo,pdscale,oracle")
    args = parser.parse_args()
    if not SHARED.is_dir():
        print(f"bench/policies.py needs the shared traces in {SHARED}", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT))
    from pdscale.spec import load_spec
    from simulator import SimOptions
    from simulator._compare import compare_policies, comparison_table

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    raw = spec.model_dump(by_alias=True)
    for pool in raw["services"][0]["pools"].values():
        pool["max_replicas"] = 64
    spec = type(spec).model_validate(raw)
    out = []
    for name in args.traces.split(","):
        file, scale = TRACES[name]
        options = SimOptions(trace=str(SHARED / file), mode="event", scale=scale,
                             cold_start_s=args.cold_start, seed=args.seed)
        print(f"== {name} x{scale:g}, {args.cold_start:g} s cold start", file=sys.stderr,
              flush=True)
        results = compare_policies(spec, options, args.policies.split(","))
        print(f"\n{name} (x{scale:g}), cold start {args.cold_start:g} s\n")
        print(comparison_table(results))
        for policy, result in results.items():
            s = result.summary
            out.append({"trace": name, "scale": scale, "cold_start_s": args.cold_start,
                        "seed": args.seed, "policy": policy,
                        "slo_attainment": s["slo_attainment"], "gpu_hours": s["gpu_hours"],
                        "ttft_p95_s": s["ttft_p95_s"], "itl_p95_s": s["itl_p95_s"],
                        "scale_actions": s["scale_actions"], "requests": s["requests"]})
    path = ROOT / "bench" / "results" / "policies.json"
    path.write_text(json.dumps({"bench": "policies", "python": platform.python_version(),
                                "command": "bench/policies.py " + " ".join(sys.argv[1:]),
                                "rows": out}, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
