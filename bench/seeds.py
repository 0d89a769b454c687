"""Seed spread: how much of a policy's result on the one-hour traces is the draw, not the policy.

    .venv/bin/python bench/seeds.py [--traces azure,mooncake] [--policies pdscale]
                                    [--cold-starts 30,60,180] [--seeds 0,1,2,3,4] [--jobs 2]
                                    [--compare bench/results/seeds-BEFORE.json] [--out seeds]

bench/policies.py runs one seed. The seed draws the cold starts (the spec's median and
spread), and a policy's decisions feed back into the load it meets, so one run of a bursty
trace can land a point away from the next. This script runs each trace, cold start and policy
at several seeds (the runs of bench/policies.py, same services) and prints the mean, the lowest
and the highest attainment and GPU-hours. With ``--compare`` (an earlier seeds.json, for
example of the commit before a change, run with this script) it prints the change of the means
and how many seeds moved each way: a change is read as better only where it holds on the mean
and on most seeds.

Needs ../shared/traces. Writes bench/results/<out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core a job: --jobs sets the parallelism

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from policies import RESULTS, TRACES, _run, chosen_traces, shown  # noqa: E402

Key = tuple[str, float, str]


def summarise(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Per (trace, cold start, policy): the seeds run and the mean, lowest and highest SLO
    attainment and GPU-hours, with each seed's pair."""
    out: dict[Key, dict[str, Any]] = {}
    for r in rows:
        key = (r["trace"], float(r["cold_start_s"]), r["policy"])
        out.setdefault(key, {"by_seed": {}})["by_seed"][int(r["seed"])] = (
            r["slo_attainment"], r["gpu_hours"])
    for s in out.values():
        att = [a for a, _ in s["by_seed"].values()]
        gpu = [g for _, g in s["by_seed"].values()]
        s.update(seeds=sorted(s["by_seed"]), attainment_mean=statistics.fmean(att),
                 attainment_min=min(att), attainment_max=max(att),
                 gpu_hours_mean=statistics.fmean(gpu), gpu_hours_min=min(gpu),
                 gpu_hours_max=max(gpu))
    return out


def compare(now: dict[Key, dict[str, Any]], before: dict[Key, dict[str, Any]]
            ) -> dict[Key, dict[str, Any]]:
    """Per key in both: the change of the means (attainment in points, GPU-hours in per
    cent) and, over the seeds both ran, how many moved each way."""
    out = {}
    for key, s in now.items():
        b = before.get(key)
        if b is None:
            continue
        common = sorted(set(s["by_seed"]) & set(b["by_seed"]))
        d_att = [s["by_seed"][i][0] - b["by_seed"][i][0] for i in common]
        d_gpu = [s["by_seed"][i][1] - b["by_seed"][i][1] for i in common]
        out[key] = {
            "attainment_points": 100 * (s["attainment_mean"] - b["attainment_mean"]),
            "gpu_hours_pct": 100 * (s["gpu_hours_mean"] / b["gpu_hours_mean"] - 1),
            "seeds_compared": len(common),
            "attainment_up": sum(d > 1e-9 for d in d_att),
            "attainment_down": sum(d < -1e-9 for d in d_att),
            "gpu_hours_up": sum(d > 1e-9 for d in d_gpu),
            "gpu_hours_down": sum(d < -1e-9 for d in d_gpu)}
    return out


def load_summary(path: Path) -> dict[Key, dict[str, Any]]:
    """The summary of an earlier run of this script (its rows, summarised again)."""
    data = json.loads(path.read_text())
    if data.get("bench") != "seeds" or "rows" not in data:
        raise ValueError(f"{path} is not a bench/seeds.py result (no 'bench': 'seeds' rows); "
                         "pass a seeds JSON written by this script")
    return summarise(data["rows"])


def table(summary: dict[Key, dict[str, Any]], diff: dict[Key, dict[str, Any]]) -> str:
    head = ("| trace | cold start | policy | seeds | SLO attainment mean (range) "
            "| GPU-hours mean (range) |")
    rule = "|---|---|---|---|---|---|"
    if diff:
        head += " change of the means | seeds: attainment up/down, GPU-h up/down |"
        rule += "---|---|"
    lines = [head, rule]
    for key in sorted(summary):
        s = summary[key]
        line = (f"| {key[0]} | {key[1]:g} s | {key[2]} | {len(s['seeds'])} | "
                f"{s['attainment_mean']:.2%} ({s['attainment_min']:.2%}-"
                f"{s['attainment_max']:.2%}) | {s['gpu_hours_mean']:.2f} "
                f"({s['gpu_hours_min']:.2f}-{s['gpu_hours_max']:.2f}) |")
        if diff:
            d = diff.get(key)
            line += (" n/a | n/a |" if d is None else
                     f" {d['attainment_points']:+.2f} points, {d['gpu_hours_pct']:+.1f} % "
                     f"GPU-h | {d['attainment_up']}/{d['attainment_down']}, "
                     f"{d['gpu_hours_up']}/{d['gpu_hours_down']} of {d['seeds_compared']} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 0,1,2,3,4, got {text!r}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="azure,mooncake",
                        help=f"comma-separated, of: {', '.join(TRACES)} (the 14-day ServeGen "
                             "runs take minutes each)")
    parser.add_argument("--policies", default="pdscale", help="comma-separated")
    parser.add_argument("--cold-starts", default="30,60,180", help="seconds, comma-separated")
    parser.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4],
                        help="comma-separated (default 0,1,2,3,4)")
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    parser.add_argument("--compare", type=Path, default=None,
                        help="an earlier seeds JSON to compare the means and seeds with")
    parser.add_argument("--out", default="seeds", help="results as bench/results/<out>.json/.md")
    args = parser.parse_args()
    before = None
    if args.compare is not None:
        try:
            before = load_summary(args.compare)
        except (OSError, ValueError) as exc:
            parser.error(f"--compare: {exc}")
    traces = chosen_traces(parser, args.traces)
    if traces is None:
        return 1
    colds = [float(c) for c in args.cold_starts.split(",")]
    runs = [(t, c, p, s) for t in traces for c in colds for p in args.policies.split(",")
            for s in args.seeds]
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(_run, *run): run for run in runs}
        for n, future in enumerate(futures, 1):
            row = future.result()["row"]
            rows.append(row)
            print(f"[{n}/{len(runs)} {time.perf_counter() - started:.0f}s] {row['trace']} "
                  f"{row['cold_start_s']:g}s {row['policy']} seed {row['seed']}: "
                  f"{row['slo_attainment']:.2%}, {row['gpu_hours']:.1f} GPU-h",
                  file=sys.stderr, flush=True)
    summary = summarise(rows)
    diff = compare(summary, before) if before is not None else {}
    text = table(summary, diff)
    print(text)
    command = "bench/seeds.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"bench": "seeds", "python": platform.python_version(), "command": command,
         "rows": rows,
         "summary": [{"trace": k[0], "cold_start_s": k[1], "policy": k[2],
                      **{f: v for f, v in s.items() if f != "by_seed"}}
                     for k, s in sorted(summary.items())],
         "compared_with": str(args.compare) if args.compare else None,
         "changes": [{"trace": k[0], "cold_start_s": k[1], "policy": k[2], **d}
                     for k, d in sorted(diff.items())]}, indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(f"# Seed spread\n\n`{command}`\n\n{text}")
    for path in (RESULTS / f"{args.out}.json", RESULTS / f"{args.out}.md"):
        print(f"wrote {shown(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
