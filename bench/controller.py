"""Controller tick cost and memory against a real Prometheus and the Kubernetes API stand-in.

    .venv/bin/python bench/controller.py [--pools 10,100] [--ticks 20] [--history-h 24]
                                         [--source prometheus|memory]

For each pool count: a spec of N/2 services (a prefill and a decode pool each); a loopback
exporter serves every pool's recorded series (the names the controller queries); the
distribution's Prometheus scrapes it every second; the Kubernetes API stand-in runs in its own
process. The controller warms each pool's forecaster with --history-h hours of synthetic
demand and fits them (not timed), then runs --ticks ticks back to back.

Reported per pool count: CPU of the tick thread, p50 and max, over steady ticks (forecasts
reused, as for two minutes in production) and over ticks while the worker thread recomputes
every forecast without pause (the worst case; in production once per two minutes); the first
tick after start on its own (the Kubernetes client's validators are built before it, during
warm-up, as the controller does); wall time,
Prometheus queries per tick, the process's peak RSS, and the CPU of fitting every pool's
forecaster once (process time, so a busy machine does not inflate it) as a share of one core
over the spec's refit interval (every pool refits once per interval). Prometheus runs in its
own process, so its time is not in the CPU figure; the HTTP client work of the queries is.
Targets: tick < 200 ms CPU with 100 pools, queries per tick independent of the pool count,
RSS < 300 MB (issue 5); with 1,000 pools (500 services) a tick < 1 s of CPU, a refit cycle
under a quarter of one core, RSS < 1 GB (issue 14).
``--source memory`` replaces Prometheus and the Kubernetes stand-in with an in-process
observation source and actuator (the controller's own CPU and memory alone, for pool counts
where a loopback Prometheus on this machine would be the bottleneck); it writes
bench/results/controller-memory.json.
Prints a table and writes bench/results/controller.json.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The packages come before bench/ itself, whose simulator.py and controller.py would shadow them.
sys.path.insert(0, str(ROOT))


def _spec_text(services: int) -> str:
    lines = ["version: 1", "services:"]
    for i in range(services):
        lines += [f"  - name: svc-{i:03d}", "    namespace: llm", "    engine: vllm",
                  "    model_name: llama", "    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}",
                  "    pools:",
                  f"      prefill: {{target: {{name: svc-{i:03d}-prefill}}, max_replicas: 40}}",
                  f"      decode: {{target: {{name: svc-{i:03d}-decode}}, max_replicas: 40}}"]
    return "\n".join(lines) + "\n"


def _wait_scraped(url: str, series: int, timeout_s: float = 60.0) -> None:
    """Wait until Prometheus holds the exporter's series for every pool (its first scrape can
    take seconds on a busy machine; a fixed sleep raced it and the ticks read nothing)."""
    import urllib.parse
    import urllib.request

    from pdscale.telemetry import Signal, recorded_name

    query = urllib.parse.quote(f"count({recorded_name(Signal.SAMPLE_AGE_S)})")
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=5) as resp:
            result = json.load(resp)["data"]["result"]
        if result and float(result[0]["value"][1]) >= series:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"Prometheus at {url} has not scraped the benchmark's exporter "
                             f"within {timeout_s:.0f}s: see its log in the work directory")
        time.sleep(0.5)


def _check_read(decisions: Any) -> None:
    """Every pool's decision must come from data read this tick: a degraded pool means the
    benchmark's source did not serve what the policy reads, and its figures would measure a
    controller that holds every pool."""
    degraded = [f"{k[0]}/{k[1].value}" for k, r in decisions.items()
                if str(getattr(r, "cause", "")) == "degraded"]
    if degraded:
        raise SystemExit(f"{len(degraded)} pools degraded (their signals were not read), e.g. "
                         f"{degraded[0]}: {decisions[next(iter(decisions))].reasons[0]}")


def _signal_values() -> dict[Any, float]:
    """Every signal the policy reads, with a plausible steady value (the exporter's and the
    in-memory world's). A signal the policy reads and this table lacks is an error here, not
    a benchmark of a controller that reads nothing (the catalog grows)."""
    from pdscale.controller._cluster import POLICY_SIGNALS
    from pdscale.telemetry import Signal

    values = {Signal.PROMPT_TOKENS_PER_S: 150_000.0, Signal.GENERATION_TOKENS_PER_S: 20_000.0,
              Signal.PREFIX_CACHE_HIT_RATIO: 0.3, Signal.TTFT_P95_S: 0.3,
              Signal.ITL_P95_S: 0.03, Signal.QUEUE_DEPTH: 1.0, Signal.REQUEST_RATE: 60.0,
              Signal.PROMPT_TOKENS_COMPUTED_PER_S: 105_000.0, Signal.TTFT_P95_RECENT_S: 0.3,
              Signal.PROMPT_TOKENS_PEAK_PER_S: 180_000.0, Signal.RUNNING_REQUESTS: 40.0,
              Signal.PROMPT_TOKENS_DISPERSION: 30_000.0}
    missing = [s.value for s in POLICY_SIGNALS if s not in values]
    if missing:
        raise SystemExit(f"bench/controller.py has no value for the policy's signals "
                         f"{', '.join(missing)}: add them to _signal_values()")
    return values


def _exporter(spec: Any) -> tuple[ThreadingHTTPServer, int]:
    from pdscale.controller._cluster import HEALTH_SIGNALS, POLICY_SIGNALS
    from pdscale.spec import Role
    from pdscale.telemetry import Signal, recorded_name

    values = {sig.value: v for sig, v in _signal_values().items()}
    # The health series: every pool's one target up, its newest sample fresh (the data
    # health check holds a pool whose engines it cannot see).
    health = {Signal.SAMPLE_AGE_S: 0.0, Signal.TARGETS_UP: 1.0, Signal.TARGETS: 1.0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            t = time.time()
            out = []
            for svc in spec.services:
                for role in Role:
                    for sig in POLICY_SIGNALS + HEALTH_SIGNALS:
                        v = health[sig] if sig in health else values[sig.value] * (
                            1 + 0.2 * math.sin(t / 60 + hash(svc.name) % 7))
                        out.append(f'{recorded_name(sig)}{{namespace="llm",model_name="llama",'
                                   f'pdscale_service="{svc.name}",pdscale_pool="{role.value}"}}'
                                   f" {v:.4f}")
            body = ("\n".join(out) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def _standin(services: int, port_out: Any, stop: Any) -> None:
    from tests.controller.kube_standin import ApiState, make_handler

    state = ApiState()
    for i in range(services):
        for role in ("prefill", "decode"):
            state.add("llm", "deployments", f"svc-{i:03d}-{role}", 2)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    port_out.value = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def _warm_and_fit(forecasts: Any, history_h: float, now: float) -> float:
    """Warm every pool's forecaster with ``history_h`` hours of synthetic per-minute demand
    (a daily cycle with noise), fit it and compute its forecast, as Controller.warm() does
    before ready; returns the CPU seconds that took."""
    import numpy as np

    from pdscale.spec import Role

    n = int(history_h * 60)
    times = [now - 60 * (n - i) for i in range(n)]
    rng = np.random.default_rng(0)
    fit_started = time.process_time()
    for key in forecasts.forecasters:
        base = 150_000.0 if key[1] is Role.PREFILL else 20_000.0
        series = base * (1 + 0.3 * np.sin(np.arange(n) * 2 * np.pi / 1440)) * \
            rng.lognormal(0, 0.05, n)
        forecasts.warm(key, times, [float(v) for v in series])
        forecasts.refit(key, now)
        forecasts.refresh_forecast(key, now)
    return time.process_time() - fit_started


def run_case(pools: int, ticks: int, history_h: float, workdir: Path,
             profile: bool = False) -> dict[str, Any]:
    from kubernetes import client as k8s

    from pdscale.controller._reconciler import SystemClock
    from pdscale.controller._runtime import Controller, reader_from_spec
    from pdscale.spec import parse_spec
    from tests.conftest import free_port
    from tests.e2e.prom import prometheus

    services = pools // 2
    spec = parse_spec(_spec_text(services))
    exporter, exporter_port = _exporter(spec)
    ctx = multiprocessing.get_context("spawn")
    port = ctx.Value("i", 0)
    stop = ctx.Event()
    proc = ctx.Process(target=_standin, args=(services, port, stop), daemon=True)
    proc.start()
    try:
        while port.value == 0:
            time.sleep(0.05)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "pools", "honor_labels": True,
                                      "static_configs": [{"targets": [
                                          f"127.0.0.1:{exporter_port}"]}]}]}
        with prometheus(config, workdir, free_port()) as url:
            _wait_scraped(url, len(spec.services) * 2)
            kconf = k8s.Configuration(host=f"http://127.0.0.1:{port.value}")
            kconf.retries = False
            api = k8s.ApiClient(kconf)
            controller = Controller(spec, api, reader_from_spec(spec, url), clock=SystemClock(),
                                    leader_election=False)
            rec = controller.reconciler
            forecasts = controller.forecasts
            now = time.time()
            fit_s = _warm_and_fit(forecasts, history_h, now)
            # As Controller.warm() does before the controller is ready: the Kubernetes client
            # builds its validators on first use (dry-run calls here, reported on their own).
            primed = time.perf_counter()
            controller.kube.prime()
            prime_s = time.perf_counter() - primed
            first = rec.tick()

            def timed(n: int) -> tuple[list[float], list[float], list[int]]:
                cpu, wall, queries = [], [], []
                for i in range(n):
                    q0 = controller.reader.queries
                    if profile and i == n - 1:
                        import cProfile
                        import pstats

                        prof = cProfile.Profile()
                        report = prof.runcall(rec.tick)
                        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumtime") \
                            .print_stats(30)
                    else:
                        report = rec.tick()
                    if report.errors:
                        raise SystemExit(f"tick errors: {[e.message for e in report.errors]}")
                    cpu.append(report.cpu_s)
                    wall.append(report.wall_s)
                    queries.append(controller.reader.queries - q0)
                return cpu, wall, queries

            # Steady ticks: forecasts reused (in production for two minutes).
            forecasts.forecast_every_s = 1e9
            cpu, wall, queries = timed(ticks)
            # Worst case: every forecast expires every second, so the worker recomputes all of
            # them without pause while the ticks run (in production: once per two minutes).
            forecasts.forecast_every_s = 1.0
            busy_cpu, busy_wall, _ = timed(ticks)
            report = rec.last_tick
            assert report is not None
            _check_read(report.decisions)
            forecasts = sum(1 for r in report.decisions.values()
                            if r.forecast is not None)
            rec.close()
            api.close()
    finally:
        stop.set()
        proc.join(timeout=10)
        exporter.shutdown()
    return {"pools": pools, "ticks": ticks, "history_h": history_h,
            "tick_cpu_ms_p50": statistics.median(cpu) * 1000,
            "tick_cpu_ms_max": max(cpu) * 1000,
            "kube_prime_s": prime_s,
            "first_tick_cpu_ms": first.cpu_s * 1000,
            "tick_wall_ms_p50": statistics.median(wall) * 1000,
            "refreshing_tick_cpu_ms_p50": statistics.median(busy_cpu) * 1000,
            "refreshing_tick_cpu_ms_max": max(busy_cpu) * 1000,
            "refreshing_tick_wall_ms_p50": statistics.median(busy_wall) * 1000,
            "queries_per_tick": sorted(set(queries)),
            "pools_with_forecast": forecasts,
            "forecaster_fit_s_total": fit_s,
            "refit_every_s": float(spec.controller.refit_every),
            "refit_cycle_core_share": fit_s / float(spec.controller.refit_every),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _memory_world(spec: Any, now: float) -> Any:
    """An in-process source and actuator for every pool of ``spec`` (the exporter's values)."""
    from pdscale.controller import Observation, PoolObservation, PoolReplicas, SourceResult
    from pdscale.telemetry import Signal

    values = {**_signal_values(), Signal.MEAN_PROMPT_TOKENS: 2500.0,
              Signal.MEAN_OUTPUT_TOKENS: 333.0}
    keys = [(svc.name, role) for svc in spec.services for role in svc.pools]

    class World:
        writes = 0

        def observe(self, now_s: float) -> Any:
            return SourceResult(Observation(now_s, {
                key: PoolObservation(key, PoolReplicas(10, 0, 0, 10, 1, 40), dict(values),
                                     now_s - 30) for key in keys}))

        def set_replicas(self, key: Any, replicas: int, reasons: Any) -> None:
            self.writes += 1

    return World()


def run_memory_case(pools: int, ticks: int, history_h: float) -> dict[str, Any]:
    """The controller's own tick, refits and memory without Prometheus or Kubernetes."""

    from pdscale.controller import Constraints, Reconciler, build_forecasts, build_policy
    from pdscale.spec import parse_spec
    from pdscale.telemetry import ControllerTelemetry

    spec = parse_spec(_spec_text(pools // 2))
    forecasts = build_forecasts(spec)
    policy = build_policy(spec, forecasts=forecasts)
    now = time.time()
    fit_s = _warm_and_fit(forecasts, history_h, now)
    world = _memory_world(spec, now)

    start = now

    class Clock:
        t = start

        def now(self) -> float:
            return self.t

        def wait(self, seconds: float, stop: threading.Event) -> bool:
            return stop.is_set()

    clock = Clock()
    rec = Reconciler(policy, world, world, clock, constraints=Constraints.from_spec(spec),
                     telemetry=ControllerTelemetry(spec), tick_s=float(spec.controller.tick),
                     forecasts=forecasts, refit_in_background=True)

    def timed(count: int) -> tuple[list[float], list[float]]:
        cpu, wall = [], []
        for _ in range(count):
            clock.t += 15.0
            report = rec.tick()
            cpu.append(report.cpu_s)
            wall.append(report.wall_s)
        return cpu, wall

    first = rec.tick()
    forecasts.forecast_every_s = 1e9
    cpu, wall = timed(ticks)
    forecasts.forecast_every_s = 1.0
    busy_cpu, busy_wall = timed(ticks)
    rec.close()
    if rec.last_tick is not None:
        _check_read(rec.last_tick.decisions)
    return {"pools": pools, "ticks": ticks, "history_h": history_h, "source": "memory",
            "tick_cpu_ms_p50": statistics.median(cpu) * 1000,
            "tick_cpu_ms_max": max(cpu) * 1000, "kube_prime_s": 0.0,
            "first_tick_cpu_ms": first.cpu_s * 1000,
            "tick_wall_ms_p50": statistics.median(wall) * 1000,
            "refreshing_tick_cpu_ms_p50": statistics.median(busy_cpu) * 1000,
            "refreshing_tick_cpu_ms_max": max(busy_cpu) * 1000,
            "refreshing_tick_wall_ms_p50": statistics.median(busy_wall) * 1000,
            "queries_per_tick": [0], "pools_with_forecast": sum(
                1 for r in (rec.last_tick.decisions.values() if rec.last_tick else ())
                if r.forecast is not None),
            "forecaster_fit_s_total": fit_s,
            "refit_every_s": float(spec.controller.refit_every),
            "refit_cycle_core_share": fit_s / float(spec.controller.refit_every),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child(pools: int, ticks: int, history_h: float, profile: bool, source: str,
           out: Any) -> None:
    if source == "memory":
        out.put(run_memory_case(pools, ticks, history_h))
        return
    with tempfile.TemporaryDirectory(prefix="pdscale-bench-") as tmp:
        out.put(run_case(pools, ticks, history_h, Path(tmp), profile))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default="10,100")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--history-h", type=float, default=24.0)
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the last tick (stderr)")
    parser.add_argument("--source", choices=["prometheus", "memory"], default="prometheus",
                        help="memory: an in-process source and actuator instead of a real "
                             "Prometheus and the Kubernetes stand-in")
    parser.add_argument("--out", default=None,
                        help="results under bench/results/<out>.json (default: controller, or "
                        "controller-memory with --source memory); another name keeps a trial "
                        "run from replacing the recorded one; an absolute path writes "
                        "<out>.json there")
    args = parser.parse_args()
    if args.source == "prometheus" and shutil.which("prometheus") is None:
        print("bench/controller.py needs the prometheus binary: run scripts/system-deps.sh",
              file=sys.stderr)
        return 1
    rows = []
    ctx = multiprocessing.get_context("spawn")
    for pools in (int(p) for p in args.pools.split(",")):
        print(f"== {pools} pools: fitting forecasters, then {args.ticks} ticks ...",
              file=sys.stderr, flush=True)
        q = ctx.Queue()
        proc = ctx.Process(target=_child, args=(pools, args.ticks, args.history_h, args.profile,
                                                 args.source, q))
        proc.start()
        rows.append(q.get())  # each case in its own process: its peak RSS is its own
        proc.join()
    print(f"{'pools':>6} {'first tick CPU ms':>18} {'CPU p50 ms':>11} {'CPU max ms':>11} "
          f"{'refreshing p50/max':>19} "
          f"{'wall p50 ms':>12} {'queries/tick':>13} {'forecasting':>12} {'refit core':>11} "
          f"{'peak RSS MB':>12}")
    for r in rows:
        busy = f"{r['refreshing_tick_cpu_ms_p50']:.0f}/{r['refreshing_tick_cpu_ms_max']:.0f}"
        print(f"{r['pools']:>6} {r['first_tick_cpu_ms']:>18.1f} "
              f"{r['tick_cpu_ms_p50']:>11.1f} {r['tick_cpu_ms_max']:>11.1f} {busy:>19} "
              f"{r['tick_wall_ms_p50']:>12.1f} {','.join(map(str, r['queries_per_tick'])):>13} "
              f"{r['pools_with_forecast']:>12} {r['refit_cycle_core_share']:>11.2f} "
              f"{r['peak_rss_mb']:>12.0f}")
    result = {"bench": "controller", "machine": platform.machine(),
              "python": platform.python_version(), "cpus": multiprocessing.cpu_count(),
              "command": "bench/controller.py " + " ".join(sys.argv[1:]), "cases": rows,
              "targets": {"tick_cpu_ms_100_pools": 200, "peak_rss_mb_100_pools": 300,
                          "tick_cpu_ms_1000_pools": 1000, "refit_cycle_core_share": 0.25,
                          "peak_rss_mb_1000_pools": 1024}}
    name = args.out or ("controller" if args.source == "prometheus" else "controller-memory")
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
