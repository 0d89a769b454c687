"""Scale-downs under steady load on a real Dynamo stack on loopback, with and without draining.

    .venv/bin/python bench/drain.py                     # 50 scale-downs per mode, ~9 minutes
    .venv/bin/python bench/drain.py --cycles 5 --modes drain

A real NVIDIA Dynamo 1.6.1 frontend and mocker workers (``simulator._stack``: one prefill
worker, two decode workers) take a steady Poisson load of streaming chat requests with long
outputs, replayed and measured at the client (``simulator._replay``). Every ``--cycle``
seconds the decode pool goes 2 -> 3 (a new worker, routable after about 2 s) and, ``--up``
seconds later, 3 -> 2. How the scale-down is done is the mode:

* ``drain``: pdscale's drainer (``controller._drain``) over the process actuator: the worker
  with the fewest requests in flight is chosen and SIGTERMed (a Dynamo worker leaves routing
  and finishes its streams), and it may drain for ``--timeout`` seconds before SIGKILL.
* ``k8s-5s`` / ``k8s-30s`` (the baseline, what Kubernetes does without pdscale's drain): a
  worker chosen without regard to its load (at random among ready workers of similar age: a
  ReplicaSet's logarithmic scale-down, KEP-2185), SIGTERM, then SIGKILL after a grace period
  of 5 s (Dynamo's planner aborts requests after 5 s) or 30 s (Kubernetes' default
  ``terminationGracePeriodSeconds``).

A request fails when the client gets an error, and is cut when its stream ends with fewer
tokens than asked for. Loopback only, bounded by the cycle count and the request timeout.
Writes ``bench/results/drain.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdscale.controller._drain import Drainer  # noqa: E402
from pdscale.simulator._replay import ReplayOptions, ReplayResult, replay, vocabulary_from_model  # noqa: E402
from pdscale.simulator._stack import DynamoStack  # noqa: E402
from pdscale.simulator._trace import Trace  # noqa: E402
from pdscale.spec import Engine, Role, load_spec  # noqa: E402

MODES = {"drain": None, "k8s-5s": 5.0, "k8s-30s": 30.0}
"""Mode -> SIGKILL grace of the baseline (None: pdscale's drain)."""


def _trace(*, seconds: float, rps: float, prompt: int, outputs: tuple[int, int],
           seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    n = rng.poisson(rps * seconds)
    return Trace(name=f"poisson {rps:g}/s", arrival_s=np.sort(rng.uniform(0, seconds, n)),
                 prompt_tokens=np.full(n, prompt, dtype=np.int64),
                 output_tokens=rng.integers(outputs[0], outputs[1] + 1, n).astype(np.int64))


def run_mode(mode: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    spec = load_spec(args.spec)
    service = next(s for s in spec.services if s.engine is Engine.DYNAMO)
    grace = MODES[mode]
    kill_after = args.timeout if grace is None else grace
    stack = DynamoStack(service, folder / mode, replicas={Role.PREFILL: 1, Role.DECODE: 2},
                        cold_start_s={Role.PREFILL: 0.0, Role.DECODE: 0.0},
                        kill_after_s=kill_after).start()
    try:
        act = stack.actuator
        assert act is not None
        act.victim_order = "least_loaded" if grace is None else "random"
        key = stack.keys()[Role.DECODE]
        stack.supervise(interval_s=0.1)
        drainer = Drainer(act, act, timeout_s=args.timeout, settle_s=0.0) \
            if grace is None else None
        seconds = args.warmup + args.cycles * args.cycle
        trace = _trace(seconds=seconds, rps=args.rps, prompt=args.prompt,
                       outputs=(args.min_output, args.max_output), seed=args.seed)
        result: dict[str, ReplayResult] = {}

        def load() -> None:
            result["r"] = replay(trace, stack.frontend_url, service.model_name,
                                 vocabulary_from_model(stack.model_dir),
                                 slo_ttft_s=service.slo.ttft_p95_s,
                                 slo_itl_s=service.slo.itl_p95_s,
                                 options=ReplayOptions(duration_s=seconds, max_rps=args.rps * 3,
                                                       request_timeout_s=300, seed=args.seed))

        stopped_at: dict[str, float] = {}
        gone_at: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:  # when each stopped worker's process is gone
            while not stop.is_set():
                present = {w.name for w in act.workers(key)}
                for name in list(stopped_at):
                    if name not in present and name not in gone_at:
                        gone_at[name] = time.monotonic()
                stop.wait(0.05)

        loader = threading.Thread(target=load, name="load")
        watcher = threading.Thread(target=watch, name="watch", daemon=True)
        t0 = time.monotonic()
        loader.start()
        watcher.start()
        downs: list[dict[str, Any]] = []
        for i in range(args.cycles):
            start = t0 + args.warmup + i * args.cycle
            time.sleep(max(0.0, start - time.monotonic()))
            current = act.read_status(key).desired
            if drainer is not None:
                drainer.reach(key, 3, current=current, reasons=["bench: up"], now_s=time.time())
            else:
                act.set_replicas(key, 3, ["bench: up"])
            time.sleep(max(0.0, start + args.up - time.monotonic()))
            before = {w.name for w in act.workers(key) if w.phase == "draining"}
            loads = act.pod_work(key, time.time())
            ready = [w.name for w in act.workers(key) if w.phase == "ready"]
            current = act.read_status(key).desired
            if drainer is not None:
                drainer.reach(key, 2, current=current, reasons=["bench: down"],
                              now_s=time.time())
            else:
                act.set_replicas(key, 2, ["bench: down"])
            stopped = [w.name for w in act.workers(key) if w.phase == "draining"
                       and w.name not in before]
            for name in stopped:
                stopped_at[name] = time.monotonic()
            in_flight = {n: loads[n].running for n in ready if n in loads}
            for name in stopped:
                held = in_flight.get(name)
                downs.append({"cycle": i, "victim": name, "in_flight": held,
                              "pool_in_flight": in_flight,
                              "least_loaded": held is not None and held == min(
                                  (v for v in in_flight.values() if v is not None),
                                  default=held),
                              })
        loader.join()
        deadline = time.monotonic() + kill_after + 15
        while any(w.phase == "draining" for w in act.workers(key)) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        if drainer is not None:  # follow the last victims to their exit
            drainer.reach(key, act.read_status(key).desired,
                          current=act.read_status(key).desired, reasons=[], now_s=time.time())
        time.sleep(0.2)
        stop.set()
        for d in downs:
            gone = gone_at.get(d["victim"])
            d["exited_after_s"] = None if gone is None else gone - stopped_at[d["victim"]]
        killed = sum(1 for e in act.events if e[2] == "WorkerKilled")
        return _summary(mode, result["r"], downs, killed=killed, grace=grace, args=args,
                        drain_records=list(drainer.records) if drainer is not None else [],
                        wall_s=time.monotonic() - t0)
    finally:
        stack.stop(grace_s=5)


def _summary(mode: str, result: ReplayResult, downs: list[dict[str, Any]], *, killed: int,
             grace: float | None, args: argparse.Namespace,
             drain_records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    reqs = result.requests
    failed = [r for r in reqs if r.error is not None]
    cut = [r for r in reqs if r.error is None and r.end_s is not None
           and r.output_tokens < r.max_tokens]
    held = [d["in_flight"] for d in downs if d["in_flight"] is not None]
    durations = [d["exited_after_s"] for d in downs if d["exited_after_s"] is not None]
    recorded = [r for r in drain_records if r["outcome"] in ("drained", "timeout")]
    s = result.summary
    return {
        "mode": mode,
        "how": ("pdscale drain: least in-flight worker, SIGTERM, drains up to "
                f"{args.timeout:g} s" if grace is None else
                f"Kubernetes-like: worker at random (load ignored), SIGTERM, SIGKILL after "
                f"{grace:g} s"),
        "scale_downs": len(downs),
        "requests": len(reqs),
        "failed": len(failed),
        "cut": len(cut),
        "failed_or_cut": len(failed) + len(cut),
        "error_kinds": s["error_kinds"],
        "sigkills": killed,
        "victim_in_flight_mean": statistics.fmean(held) if held else None,
        "victim_least_loaded_share": (sum(1 for d in downs if d["least_loaded"]) / len(downs)
                                      if downs else None),
        "pool_in_flight_mean": statistics.fmean(
            v for d in downs for v in d["pool_in_flight"].values() if v is not None)
        if downs else None,
        "in_flight_on_victims": sum(held),
        "drain_outcomes": {o: sum(1 for r in recorded if r["outcome"] == o)
                           for o in ("drained", "timeout")} if drain_records else None,
        "drain_s_p50": statistics.median(durations) if durations else None,
        "drain_s_max": max(durations) if durations else None,
        "ttft_p95_s": s["ttft_p95_s"], "itl_p95_s": s["itl_p95_s"],
        "slo_attainment": s["slo_attainment"],
        "wall_s": wall_s,
        "scale_down_log": downs,
    }


def _row(r: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return (f"| {r['mode']} | {r['scale_downs']} | {r['requests']} | {r['failed']} | "
            f"{r['cut']} | {r['sigkills']} | {r['in_flight_on_victims']:g} | "
            f"{f(r['victim_in_flight_mean'], '.1f')} / "
            f"{f(r['pool_in_flight_mean'], '.1f')} | "
            f"{f(r['victim_least_loaded_share'], '.0%')} | {f(r['drain_s_p50'], '.1f')} / "
            f"{f(r['drain_s_max'], '.1f')} | {f(r['ttft_p95_s'], '.3f')} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "examples" / "dynamo.yaml"))
    parser.add_argument("--modes", default="drain,k8s-5s",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--cycles", type=int, default=50, help="scale-downs per mode")
    parser.add_argument("--cycle", type=float, default=5.0, help="seconds per up/down cycle")
    parser.add_argument("--up", type=float, default=3.5,
                        help="seconds from the scale-up to the scale-down of a cycle")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--rps", type=float, default=3.0)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--min-output", type=int, default=200)
    parser.add_argument("--max-output", type=int, default=1500)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="drain mode: longest drain before SIGKILL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "drain.json"))
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or args.cycles < 1:
        parser.error(f"--modes takes {', '.join(MODES)} (got {', '.join(unknown) or '-'}); "
                     "--cycles at least 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdscale-drain-") as tmp:
        for mode in modes:
            print(f"==> {mode}: {args.cycles} scale-downs under {args.rps:g} requests/s",
                  file=sys.stderr, flush=True)
            rows.append(run_mode(mode, args, Path(tmp)))
    header = ("| mode | scale-downs | requests | failed | cut | SIGKILLs | requests on the "
              "victims when stopped | in flight on the victim / per worker (mean) | victim was "
              "the least loaded | stop to exit s p50 / max | TTFT p95 s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")
    print(header)
    for r in rows:
        print(_row(r))
    for r in rows:
        print(f"{r['mode']}: {r['how']}; errors {r['error_kinds']}; {r['wall_s']:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": "bench/drain.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "results": rows}
    out.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
