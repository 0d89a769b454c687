"""What a real-stack window needs, and what pdscale's signals show of it, in the simulator.

    PYTHONPATH=. .venv/bin/python bench/window.py [--trace azure] [--minutes 20] [--start-min 14]
        [--statics 1,2,3,4] [--cold-starts 30,60] [--seeds 0-9] [--sample-s 2]
        [--queue-window-s 300] [--out window-azure]

``bench/stack.py`` replays a window of a shared trace on a real Dynamo stack and through the
simulator, which now agrees with the stack request by request (its *Simulator against stack*
table). This script asks the simulator, with the same window, the mocker's profile and the
stack's routing (``bench/stack.py``'s ``load_window``, ``as_sent``, ``ROUTER``), why a window
needs the workers it needs:

* **arrivals**: the window's mean prompt-token rate, its peak minute and its peak second, and
  the dispersion of the per-second request counts (variance over mean: 1 for Poisson arrivals)
  against one worker's throughput by the profile (saturated, and at the capacity model's
  planning headroom);
* **static sizes**: each prefill size with one decode worker, its SLO attainment and TTFT
  percentiles;
* **pdscale's policy** over ``--seeds`` (each a draw of the cold starts) at each cold start:
  ``bench/stack.py``'s ``simulate_policy``, what ``pdscale simulate`` runs (seed 0 is the
  ``stack-20m`` row's *simulator under the policy*);
* **a sampled queue's peak**: the prefill queue sampled every ``--sample-s`` seconds at each
  static size, its highest sample over the last ``--queue-window-s``, and the workers that
  serve that backlog within the TTFT SLO by the rule pdscale's prefill burst sizing uses
  (``controller._sizing``: the queue at the mean prompt length, at the profile's capacity
  with headroom). It is a signal pdscale does not read; the script says what it would ask for.

Writes bench/results/<out>.json, <out>.md and <out>.png (the per-second prompt-token rate
against one, two and three workers' throughput, and the sampled queue at each static size).
Needs ../shared/traces; no stack is started. About a minute for the defaults on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # after the packages: bench/controller.py is a script

from stack import (  # noqa: E402
    ROUTER,
    SHARED,
    TRACES,
    Schedule,
    SchedulePolicy,
    as_sent,
    load_window,
    simulate_policy,
    write_spec,
)

from pdscale.controller import CapacityModel, load_profile  # noqa: E402
from pdscale.controller._perf import HEADROOM  # noqa: E402
from pdscale.spec import Role, load_spec  # noqa: E402
from pdscale.telemetry import Signal  # noqa: E402

RESULTS = ROOT / "bench" / "results"


# -- measurements (pure) ---------------------------------------------------------------------


def per_second(arrival_s: np.ndarray, prompt_tokens: np.ndarray, seconds: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, requests) arriving in each of the window's ``seconds`` seconds."""
    idx = np.clip(np.floor(arrival_s).astype(np.int64), 0, seconds - 1)
    return (np.bincount(idx, weights=prompt_tokens.astype(np.float64), minlength=seconds),
            np.bincount(idx, minlength=seconds).astype(np.float64))


def arrival_stats(arrival_s: np.ndarray, prompt_tokens: np.ndarray, span_s: float
                  ) -> dict[str, float]:
    """Per-second and per-minute bins of the window's arrivals: the mean prompt-token rate,
    the peak minute's and the peak second's, the 99th percentile of the seconds, and the
    dispersion (variance over mean) of the per-second request counts."""
    seconds = max(1, math.ceil(span_s))
    tokens, counts = per_second(arrival_s, prompt_tokens, seconds)
    minutes = max(1, seconds // 60)
    per_minute = tokens[:minutes * 60].reshape(minutes, 60).sum(axis=1) / 60
    mean_count = float(counts.mean())
    return {"requests": float(len(arrival_s)), "seconds": float(seconds),
            "mean_prompt_tokens": float(prompt_tokens.mean()) if len(prompt_tokens) else 0.0,
            "mean_tokens_per_s": float(tokens.mean()),
            "peak_minute_tokens_per_s": float(per_minute.max()),
            "peak_second_tokens_per_s": float(tokens.max()),
            "p99_second_tokens_per_s": float(np.percentile(tokens, 99)),
            "dispersion_per_second": float(counts.var() / mean_count) if mean_count else 0.0}


def rolling_max(values: np.ndarray, n: int) -> np.ndarray:
    """The highest of the last ``n`` values at each position (fewer at the start)."""
    out = np.empty(len(values))
    for i in range(len(values)):
        out[i] = values[max(0, i - n + 1):i + 1].max()
    return out


def queue_need(queue: np.ndarray, *, window: int, prompt_tokens: float,
               per_replica: float, slo_s: float) -> np.ndarray:
    """Workers that serve the highest sampled queue of the last ``window`` samples within the
    SLO: ceil(queue x prompt tokens / (per-replica capacity x SLO)), as
    ``controller._sizing``'s burst rule sizes a queue seen at a tick (at least 1)."""
    peak = rolling_max(np.asarray(queue, dtype=np.float64), window)
    return np.maximum(1, np.ceil(peak * prompt_tokens / (per_replica * slo_s) - 1e-9))


def need_shares(need: np.ndarray) -> dict[str, float]:
    """Share of the samples at which the queue rule asks for each worker count."""
    values, counts = np.unique(need.astype(np.int64), return_counts=True)
    return {str(int(v)): float(c) / len(need) for v, c in zip(values, counts, strict=True)}


# -- simulations -----------------------------------------------------------------------------


class _Sampling(SchedulePolicy):
    """A fixed schedule that records the prefill queue the simulator exports at every tick."""

    def __init__(self, service: str, schedule: Schedule) -> None:
        super().__init__(service, schedule)
        self.samples: list[tuple[float, float]] = []

    def decide(self, observation: Any) -> Mapping[Any, Any]:
        pool = observation.pools.get((self.service, Role.PREFILL))
        if pool is not None:
            self.samples.append((observation.now_s,
                                 float(pool.signals.get(Signal.QUEUE_DEPTH) or 0.0)))
        return super().decide(observation)


def simulate_static(trace: Any, spec_path: Path, prefill: int, *, sample_s: float,
                    seed: int) -> dict[str, Any]:
    """The window at ``prefill``+1 workers through the event simulator, as bench/stack.py
    replays the stack's runs (its send order, its routing, fixed cold starts), ticking every
    ``sample_s`` seconds; the summary and the prefill queue at each tick."""
    from pdscale.simulator._runner import EventWorld
    from pdscale.simulator._simulate import SimOptions, _setup
    from pdscale.simulator._world import run_world

    service = load_spec(spec_path).services[0]
    schedule = Schedule(((0.0, prefill),), ((0.0, 1),))
    setup = _setup(service, SimOptions(cold_start_s=60.0, router=ROUTER),
                   {Role.PREFILL: prefill, Role.DECODE: 1}, tick_s=sample_s)
    policy = _Sampling(service.name, schedule)
    world = EventWorld(setup, as_sent(trace, seed))
    s = run_world(world, policy).summary
    return {"prefill": prefill, "decode": 1, "slo_attainment": s["slo_attainment"],
            "ttft_p95_s": s["ttft_p95_s"], "ttft_p99_s": s["ttft_p99_s"],
            "gpu_hours": s["gpu_hours"],
            "queue": [q for _, q in policy.samples], "queue_t": [t for t, _ in policy.samples]}


# -- options and output ----------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    trace: str
    start_min: float
    minutes: float
    scale: float
    statics: tuple[int, ...]
    cold_starts_s: tuple[float, ...]
    seeds: tuple[int, ...]
    sample_s: float
    queue_window_s: float
    out: str
    command: str


def _ints(text: str, what: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise argparse.ArgumentTypeError(
                f"{what}: expected whole numbers or ranges such as 0-9,12; got {text!r}")
        out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    if not out:
        raise argparse.ArgumentTypeError(f"{what}: no values in {text!r}")
    return tuple(out)


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="bench/window.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: PYTHONPATH=. .venv/bin/python bench/window.py --trace azure "
               "--seeds 0-9 --cold-starts 30,60")
    p.add_argument("--trace", default="azure", choices=sorted(TRACES),
                   help="the stack window's trace (default azure)")
    p.add_argument("--start-min", type=float, default=None,
                   help="window start in the trace, minutes (default: bench/stack.py's)")
    p.add_argument("--minutes", type=float, default=20.0,
                   help="window length, minutes (default 20, the stack-20m runs')")
    p.add_argument("--scale", type=float, default=None,
                   help="load scale (default: bench/stack.py's)")
    p.add_argument("--statics", default="1,2,3,4",
                   help="static prefill sizes to simulate, one decode worker each "
                        "(default 1,2,3,4)")
    p.add_argument("--cold-starts", default="30,60",
                   help="cold starts for pdscale's policy, seconds (default 30,60)")
    p.add_argument("--seeds", default="0-9", help="cold-start draws (default 0-9)")
    p.add_argument("--sample-s", type=float, default=2.0,
                   help="seconds between queue samples (default 2)")
    p.add_argument("--queue-window-s", type=float, default=300.0,
                   help="the sampled queue's peak is over this many seconds (default 300)")
    p.add_argument("--out", default=None,
                   help="result name in bench/results (default window-<trace>)")
    a = p.parse_args(argv)
    try:
        statics = _ints(a.statics, "--statics")
        seeds = _ints(a.seeds, "--seeds")
        colds = tuple(float(x) for x in a.cold_starts.split(","))
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(str(e))
    if min(statics) < 1:
        p.error("--statics: each size must be at least 1")
    if not all(c > 0 for c in colds):
        p.error(f"--cold-starts: seconds, each > 0; got {a.cold_starts!r}")
    for name, value in (("--minutes", a.minutes), ("--sample-s", a.sample_s),
                        ("--queue-window-s", a.queue_window_s)):
        if not value > 0:
            p.error(f"{name} must be > 0; got {value:g}")
    window = TRACES[a.trace]
    return Options(trace=a.trace,
                   start_min=window.start_min if a.start_min is None else a.start_min,
                   minutes=a.minutes, scale=window.scale if a.scale is None else a.scale,
                   statics=statics, cold_starts_s=colds, seeds=seeds, sample_s=a.sample_s,
                   queue_window_s=a.queue_window_s, out=a.out or f"window-{a.trace}",
                   command="PYTHONPATH=. .venv/bin/python bench/window.py "
                           + " ".join(argv))


def _pct(x: float) -> str:
    return f"{x:.2%}"


def report(result: Mapping[str, Any]) -> str:
    a = result["arrivals"]
    cap = result["capacity"]
    sat = cap["saturated_tokens_per_s"]
    lines = [f"# What the {result['trace']} window needs\n",
             f"`{result['command']}`\n",
             f"Window: minutes {result['start_min']:g}-{result['start_min'] + result['minutes']:g}"
             f" of {result['file']}, x{result['scale']:g}, {a['requests']:.0f} requests; "
             f"SLO TTFT {result['ttft_slo_s']:g} s. Simulated with the mocker's profile, the "
             "stack's routing and send order.\n",
             "## Arrivals against one worker\n",
             "| measure | prompt tokens/s | share of one worker's saturated throughput |",
             "|---|---|---|"]
    for label, key in (("mean", "mean_tokens_per_s"), ("peak minute", "peak_minute_tokens_per_s"),
                       ("99th percentile of the seconds", "p99_second_tokens_per_s"),
                       ("peak second", "peak_second_tokens_per_s")):
        lines.append(f"| {label} | {a[key]:.4g} | {a[key] / sat:.0%} |")
    planned = cap["planned_tokens_per_s"]
    lines += ["", f"One worker: {sat:.4g} prompt tokens/s saturated, {planned:.4g}"
              f" at the planning headroom ({cap['headroom']:g}), for {a['mean_prompt_tokens']:.0f}"
              f"-token prompts. Per-second request counts: dispersion (variance / mean) "
              f"{a['dispersion_per_second']:.2f} (1 for Poisson arrivals).\n",
              "## Static sizes\n",
              f"| prefill + decode | SLO attainment | TTFT p95 s | TTFT p99 s | GPU-hours | "
              f"sampled queue's rule asks for (share of samples; {result['sample_s']:g} s samples,"
              f" peak over {result['queue_window_s']:g} s) |",
              "|---|---|---|---|---|---|"]
    for s in result["statics"]:
        asks = ", ".join(f"{k}: {v:.0%}" for k, v in s["queue_rule"].items())
        lines.append(f"| {s['prefill']}+{s['decode']} | {_pct(s['slo_attainment'])} | "
                     f"{s['ttft_p95_s']:.3f} | {s['ttft_p99_s']:.3f} | {s['gpu_hours']:.3f} | "
                     f"{asks} |")
    lines += ["", "## pdscale's policy over the seeds (cold-start draws)\n",
              "| cold start s | seeds | SLO attainment mean (range) | GPU-hours mean (range) | "
              "seeds at >= 99 % |", "|---|---|---|---|---|"]
    for c in result["policy"]:
        att = [r["slo_attainment"] for r in c["runs"]]
        gpu = [r["gpu_hours"] for r in c["runs"]]
        lines.append(f"| {c['cold_start_s']:g} | {len(att)} | {_pct(float(np.mean(att)))} "
                     f"({_pct(min(att))}-{_pct(max(att))}) | {np.mean(gpu):.4f} "
                     f"({min(gpu):.4f}-{max(gpu):.4f}) | {sum(x >= 0.99 for x in att)} |")
    return "\n".join(lines) + "\n"


def plot(result: Mapping[str, Any], trace: Any, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    sat = result["capacity"]["saturated_tokens_per_s"]
    seconds = int(result["arrivals"]["seconds"])
    tokens, _ = per_second(trace.arrival_s, trace.prompt_tokens, seconds)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    top.plot(np.arange(seconds), tokens, lw=0.6, color="tab:blue",
             label="prompt tokens, per second")
    per_minute = np.repeat(tokens[:seconds // 60 * 60].reshape(-1, 60).mean(axis=1), 60)
    top.plot(np.arange(len(per_minute)), per_minute, lw=1.5, color="black",
             label="per-minute rate")
    for n, style in ((1, ":"), (2, "--"), (3, "-.")):
        top.axhline(n * sat, ls=style, color="tab:red", lw=1,
                    label=f"{n} worker{'s' if n > 1 else ''}, saturated")
    top.set_yscale("log")
    top.set_ylabel("prompt tokens/s")
    top.legend(loc="upper right", fontsize=7, ncol=2)
    top.set_title(f"{result['trace']} window: arrivals bunch within the second")
    for s in result["statics"]:
        bottom.plot(s["queue_t"], s["queue"], lw=0.8,
                    label=f"{s['prefill']}+1: {s['slo_attainment']:.2%} within the SLO")
    bottom.set_ylabel(f"prefill queue (sampled every {result['sample_s']:g} s)")
    bottom.set_xlabel("seconds into the window")
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    window = TRACES[opts.trace]
    if not (SHARED / window.file).is_file():
        print(f"bench/window.py needs the shared trace {SHARED / window.file}; the project's "
              "tests and benches read ../shared beside the checkout", file=sys.stderr)
        return 1
    started = time.monotonic()
    trace = load_window(opts.trace, opts.start_min, opts.minutes, opts.scale, 0)
    with tempfile.TemporaryDirectory(prefix="pdscale-window-") as tmp:
        spec_path = write_spec(Path(tmp) / "spec", window, cold_start_s=60.0,
                               max_replicas=max(4, *opts.statics), speedup=1.0)
        service = load_spec(spec_path).services[0]
        profile = load_profile(service.pools[Role.PREFILL].profile)
        arrivals = arrival_stats(trace.arrival_s, trace.prompt_tokens, opts.minutes * 60)
        model = CapacityModel(Role.PREFILL, profile, window.ttft_slo_s,
                              mean_prompt_tokens=max(1.0, arrivals["mean_prompt_tokens"]),
                              prompt_cv=float(np.std(trace.prompt_tokens)
                                              / max(1.0, np.mean(trace.prompt_tokens))))
        capacity = {"saturated_tokens_per_s": model._prefill_capacity(1.0),
                    "planned_tokens_per_s": model.nominal_per_replica(), "headroom": HEADROOM}
        statics = []
        for n in opts.statics:
            s = simulate_static(trace, spec_path, n, sample_s=opts.sample_s, seed=0)
            need = queue_need(np.asarray(s["queue"]),
                              window=max(1, round(opts.queue_window_s / opts.sample_s)),
                              prompt_tokens=arrivals["mean_prompt_tokens"],
                              per_replica=capacity["planned_tokens_per_s"],
                              slo_s=window.ttft_slo_s)
            s["queue_rule"] = need_shares(need)
            s["queue_rule_max"] = int(need.max())
            statics.append(s)
            print(f"[{time.monotonic() - started:.0f}s] static {n}+1: "
                  f"{s['slo_attainment']:.2%}", file=sys.stderr, flush=True)
        policy = []
        for cold in opts.cold_starts_s:
            cold_spec = write_spec(Path(tmp) / f"cold-{cold:g}", window, cold_start_s=cold,
                                   max_replicas=4, speedup=1.0)
            runs = []
            for seed in opts.seeds:
                row = {"policy": "pdscale", "trace": opts.trace, "start_min": opts.start_min,
                       "minutes": opts.minutes, "scale": opts.scale, "cold_start_s": cold,
                       "seed": seed}
                got = simulate_policy(row, cold_spec)
                assert got is not None
                runs.append({"seed": seed, **got})
                print(f"[{time.monotonic() - started:.0f}s] pdscale {cold:g}s seed {seed}: "
                      f"{got['slo_attainment']:.2%}, {got['gpu_hours']:.3f} GPU-h",
                      file=sys.stderr, flush=True)
            policy.append({"cold_start_s": cold, "runs": runs})
    result = {"bench": "window", "python": platform.python_version(), "cpus": os.cpu_count(),
              "command": opts.command, "trace": opts.trace, "file": window.file,
              "start_min": opts.start_min, "minutes": opts.minutes, "scale": opts.scale,
              "ttft_slo_s": window.ttft_slo_s, "sample_s": opts.sample_s,
              "queue_window_s": opts.queue_window_s, "arrivals": arrivals,
              "capacity": capacity, "statics": statics, "policy": policy}
    text = report(result)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, body in ((".json", json.dumps(result, indent=1) + "\n"), (".md", text)):
        path = RESULTS / f"{opts.out}{suffix}"
        tmp_path = path.with_suffix(suffix + ".tmp")
        tmp_path.write_text(body)
        tmp_path.replace(path)  # whole or not at all
        written.append(path)
    png = plot(result, trace, RESULTS / f"{opts.out}.png")
    for path in [*written, *([png] if png else [])]:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
