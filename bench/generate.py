"""Generation speed: `pdscale generate all` on a spec with many services.

Builds an N-service spec from examples/vllm.yaml's first service (each copy in its own
namespace), renders alerts (rules, PrometheusRule, Alertmanager config, promtool tests) and
dashboards in memory, and reports the median wall time over several runs.

    .venv/bin/python bench/generate.py [--services 50] [--repeat 5]

Prints a table and writes bench/results/generate.json. Target (issue 2): under 5 s for 50
services.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdscale.alerts import alert_files  # noqa: E402
from pdscale.dashboards import dashboard_files  # noqa: E402
from pdscale.spec import parse_spec  # noqa: E402


def many_services_spec(n: int) -> str:
    base = yaml.safe_load((ROOT / "examples" / "vllm.yaml").read_text())
    template = base["services"][0]
    services = []
    for i in range(n):
        svc = json.loads(json.dumps(template))
        svc["name"] = f"svc-{i:03d}"
        svc["namespace"] = f"team-{i:03d}"
        for role, pool in svc["pools"].items():
            pool["target"]["name"] = f"svc-{i:03d}-{role}"
        services.append(svc)
    base["services"] = services
    base.pop("gpu_budget", None)
    return yaml.safe_dump(base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate.json"))
    args = parser.parse_args()

    text = many_services_spec(args.services)
    rows = []
    for label, fn in (("alerts", alert_files), ("dashboards", dashboard_files)):
        times, files, size = [], 0, 0
        for _ in range(args.repeat):
            spec = parse_spec(text)
            start = time.perf_counter()
            out = fn(spec)
            times.append(time.perf_counter() - start)
            files, size = len(out), sum(len(v) for v in out.values())
        rows.append({"what": label, "median_s": statistics.median(times),
                     "max_s": max(times), "files": files, "bytes": size})
    total = sum(r["median_s"] for r in rows)
    print(f"pdscale generate, {args.services} services, median of {args.repeat} runs")
    print(f"{'what':<12}{'median s':>10}{'max s':>10}{'files':>8}{'MB':>8}")
    for r in rows:
        print(f"{r['what']:<12}{r['median_s']:>10.2f}{r['max_s']:>10.2f}{r['files']:>8}"
              f"{r['bytes'] / 1e6:>8.1f}")
    print(f"{'all':<12}{total:>10.2f}   target < 5 s: {'met' if total < 5 else 'NOT met'}")
    result = {"services": args.services, "repeat": args.repeat, "rows": rows,
              "total_median_s": total, "target_s": 5.0, "python": platform.python_version(),
              "machine": platform.machine(), "cpus_used": 1}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
