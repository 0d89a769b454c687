"""Simulator speed and memory.

    .venv/bin/python bench/simulator.py [--quick] [--cases a,b]

Event mode: simulated requests per minute of wall time on one core (a 2-hour synthetic trace at
40 req/s, and the Azure code trace x4 when ../shared is present), oracle policy. Fluid mode:
14 days of ServeGen m-large (../shared/traces) with the reactive policy, and the same 14 days
through examples/vllm.yaml as it ships (production defaults: forecaster refits, three days of
history) under pdscale and under the oracle. Every policy runs in the production reconcile
loop on the simulated clock. Each case runs in its own process so its peak RSS is its own;
CPU is the process's. Targets: event >= 200,000 requests/min; fluid 14 days < 60 s; peak
memory < 2 GB; the 14-day m-large run under pdscale within 5x the oracle's wall time. Prints a
table, writes bench/results/simulator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"


def _traces() -> Path:
    """The public traces: ``--traces`` (passed to the cases as ``$PDSCALE_TRACES``),
    ``$PDSCALE_TRACES`` or ../shared/traces (``pdscale trace fetch all --to DIR``)."""
    sys.path.insert(0, str(ROOT))
    from pdscale.simulator import traces_dir

    return traces_dir(None, default=DEFAULT_TRACES)
PDSCALE_OVER_ORACLE = 5.0
"""pdscale's 14-day m-large replay may take at most this many times the oracle's wall time."""


def _case(name: str) -> dict[str, object]:
    shared = _traces()
    from pdscale.simulator import SimOptions, simulate
    from pdscale.spec import load_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    raw = spec.model_dump(by_alias=True)
    for pool in raw["services"][0]["pools"].values():
        pool["max_replicas"] = 500  # let the pools grow to what the traces need
    spec = type(spec).model_validate(raw)
    if name == "event-synthetic":
        options = SimOptions(trace="synthetic", policy="oracle", mode="event",
                             duration_s=7200, scale=4.0)
    elif name == "event-azure":
        options = SimOptions(trace=str(shared / "azure_llm_2023_code.csv"), policy="oracle",
                             mode="event", scale=4.0)
    elif name == "fluid-servegen-14d":
        options = SimOptions(trace=str(shared / "servegen_m-large_client_rates.csv.gz"),
                             policy="reactive", mode="fluid")
    elif name in ("fluid-m-large-14d-pdscale", "fluid-m-large-14d-oracle"):
        spec = load_spec(ROOT / "examples" / "vllm.yaml")  # as it ships: production defaults
        options = SimOptions(trace=str(shared / "servegen_m-large_client_rates.csv.gz"),
                             policy=name.rsplit("-", 1)[1], mode="fluid")
    else:
        raise SystemExit(f"unknown case {name}")
    started, cpu0 = time.perf_counter(), time.process_time()
    result, meta = simulate(spec, options)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    s = result.summary
    return {"case": name, "mode": meta["mode"], "requests": s["requests"],
            "simulated_s": s["simulated_s"], "wall_s": wall, "cpu_s": cpu,
            "requests_per_min": s["requests"] / wall * 60,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "slo_attainment": s["slo_attainment"], "gpu_hours": s["gpu_hours"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="skip the 14-day fluid cases")
    parser.add_argument("--cases", help="comma-separated, instead of all")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulator.json"))
    parser.add_argument("--traces", help="folder of the public traces (default: "
                        "$PDSCALE_TRACES or ../shared/traces)")
    args = parser.parse_args()
    if args.traces:
        os.environ["PDSCALE_TRACES"] = args.traces  # the cases run in child processes
    shared = _traces()
    if args.case:
        print(json.dumps(_case(args.case)))
        return 0
    cases = ["event-synthetic"]
    if shared.exists():
        cases.append("event-azure")
        if not args.quick:
            cases += ["fluid-servegen-14d", "fluid-m-large-14d-pdscale",
                      "fluid-m-large-14d-oracle"]
    else:
        print(f"{shared} is absent: only the synthetic case runs (--traces DIR, or "
              "`pdscale trace fetch all --to DIR`)")
    if args.cases:
        cases = args.cases.split(",")
    rows = []
    for case in cases:
        print(f"running {case} ...", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True,
                             text=True, check=True, env=env)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{'case':<27}{'mode':>7}{'requests':>13}{'sim h':>8}{'wall s':>9}{'CPU s':>8}"
          f"{'req/min':>12}{'peak MB':>9}")
    for r in rows:
        print(f"{r['case']:<27}{r['mode']:>7}{r['requests']:>13,}{r['simulated_s'] / 3600:>8.1f}"
              f"{r['wall_s']:>9.1f}{r['cpu_s']:>8.1f}{r['requests_per_min']:>12,.0f}"
              f"{r['peak_rss_mb']:>9.0f}")
    walls = {r["case"]: r["wall_s"] for r in rows}
    ratio = None
    if {"fluid-m-large-14d-pdscale", "fluid-m-large-14d-oracle"} <= walls.keys():
        ratio = walls["fluid-m-large-14d-pdscale"] / walls["fluid-m-large-14d-oracle"]
        verdict = "met" if ratio <= PDSCALE_OVER_ORACLE else "missed"
        print(f"\n14-day m-large with examples/vllm.yaml: pdscale {ratio:.2f}x the oracle's "
              f"wall time (target <= {PDSCALE_OVER_ORACLE:g}x: {verdict})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "rows": rows, "m_large_14d_pdscale_over_oracle": ratio,
        "targets": {"event_requests_per_min": 200000, "fluid_14d_wall_s": 60,
                    "peak_rss_mb": 2048, "m_large_14d_pdscale_over_oracle": PDSCALE_OVER_ORACLE},
        "python": platform.python_version(), "machine": platform.machine(),
        "threads": 1}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
