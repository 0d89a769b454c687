"""Where the prefill correction settles on a long replay, and what it costs.

    .venv/bin/python bench/correction.py [--jobs 2] [--traces DIR]

The 14-day ServeGen m-small replay (fluid mode, seed 0) through ``examples/vllm.yaml`` with
the pools' maximum raised to 500 (the traces need more than the example's), under pdscale as
the spec sets it, with ``prompt_length_cv2`` at the replay's own prompt-length cv2, and with
``calibration_min: 1`` (no correction below the profile); and under the oracle. For each: SLO
attainment, GPU-hours (and over the oracle's), the mean prefill and decode replicas, and the
share of prefill decisions whose correction sits at ``calibration_min``. Prints a table;
writes bench/results/correction.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
TRACE = "servegen_m-small_client_rates.csv.gz"


def _spec(sizing: dict[str, float]) -> Any:
    from pdscale.spec import load_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    raw = spec.model_dump(by_alias=True)
    for pool in raw["services"][0]["pools"].values():
        pool["max_replicas"] = 500
    raw["controller"]["sizing"].update(sizing)
    return type(spec).model_validate(raw)


def _prompt_cv2(trace: Path) -> float:
    """The replay's prompt lengths' squared coefficient of variation, over its samples."""
    import numpy as np

    from pdscale.simulator import SimOptions, prepare

    prepared = prepare(_spec({}), SimOptions(trace=str(trace), policy="oracle", mode="fluid",
                                             seed=0))
    lengths = np.concatenate([np.asarray(p, float) for p in prepared.load.prompt_samples])
    return float(lengths.var() / lengths.mean() ** 2)


def _run(case: tuple[str, str, dict[str, float], str]) -> dict[str, Any]:
    from pdscale.simulator import SimOptions, simulate

    name, policy, sizing, trace = case
    spec = _spec(sizing)
    result, _ = simulate(spec, SimOptions(trace=trace, policy=policy, mode="fluid", seed=0))
    floor = float(spec.controller.sizing.calibration_min)
    prefill = [d["detail"]["correction"] for d in result.decisions
               if d["pool"] == "prefill" and "correction" in d["detail"]]
    ts = result.timeseries
    return {"case": name, "policy": policy, "sizing": sizing,
            "slo_attainment": result.summary["slo_attainment"],
            "gpu_hours": result.summary["gpu_hours"],
            "mean_prefill": statistics.fmean(t["prefill_ready"] + t["prefill_starting"]
                                             for t in ts),
            "mean_decode": statistics.fmean(t["decode_ready"] + t["decode_starting"]
                                            for t in ts),
            "decisions_at_floor": (sum(c <= floor + 1e-9 for c in prefill) / len(prefill)
                                   if prefill else None)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--traces", help="folder of the public traces (default: "
                        "$PDSCALE_TRACES or ../shared/traces)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "correction.json"))
    args = parser.parse_args()
    from pdscale.simulator import traces_dir

    trace = traces_dir(args.traces, default=DEFAULT_TRACES) / TRACE
    if not trace.exists():
        print(f"{trace} is absent: pass --traces DIR (`pdscale trace fetch all --to DIR`)",
              file=sys.stderr)
        return 2
    cv2 = _prompt_cv2(trace)
    cases = [("oracle", "oracle", {}, str(trace)),
             ("pdscale", "pdscale", {}, str(trace)),
             (f"pdscale, prompt_length_cv2 {cv2:.2f}", "pdscale",
              {"prompt_length_cv2": round(cv2, 2)}, str(trace)),
             ("pdscale, calibration_min 1", "pdscale", {"calibration_min": 1.0}, str(trace))]
    print(f"14-day {TRACE}, seed 0: {len(cases)} runs on {args.jobs} processes "
          "(a few minutes each) ...", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, cases))
    oracle = rows[0]["gpu_hours"]
    print(f"\n{'case':<36}{'attainment %':>13}{'GPU-h':>9}{'x oracle':>9}{'prefill':>9}"
          f"{'decode':>8}{'at floor':>9}")
    for r in rows:
        r["over_oracle"] = r["gpu_hours"] / oracle
        at = r["decisions_at_floor"]
        print(f"{r['case']:<36}{100 * r['slo_attainment']:>13.2f}{r['gpu_hours']:>9.0f}"
              f"{r['over_oracle']:>9.2f}{r['mean_prefill']:>9.2f}{r['mean_decode']:>8.2f}"
              f"{'-' if at is None else f'{100 * at:.0f} %':>9}")
    Path(args.out).write_text(json.dumps({"trace": TRACE, "seed": 0, "prompt_cv2": cv2,
                                          "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
