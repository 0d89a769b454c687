"""``pdscale simulate``: replay a trace through the simulated pools under a policy (the
production reconcile loop on a simulated clock), or serve it live."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Progress,
    err,
    fmt_s,
    interrupted,
    load_checked,
    out_ok,
    parse_failure,
    seed,
    write_output,
)
from pdscale.spec import Role, Spec


def otlp_endpoint(text: str) -> str:
    """An argparse type for an OTLP/HTTP traces URL."""
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected an OTLP/HTTP URL such as http://127.0.0.1:4318/v1/traces, got {text!r}")
    return text if parts.path not in ("", "/") else text.rstrip("/") + "/v1/traces"


def port(text: str) -> int:
    """An argparse type for a TCP port to listen on: 0 (any free) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got "
                                         f"{text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535 (0: any "
                                         f"free port), got {value}")
    return value


def failure(text: str) -> tuple[float, Role]:
    """``--fail SECONDS:ROLE``: a finite, non-negative time (the end of the run is checked
    once the trace is loaded)."""
    when, role = parse_failure(text)
    if not math.isfinite(when) or when < 0:
        raise argparse.ArgumentTypeError(
            f"expected SECONDS:prefill or SECONDS:decode with SECONDS a finite number >= 0 "
            f"(simulated seconds from the start of the replay), got {text!r}")
    return when, role


def _cmd_simulate(args: argparse.Namespace) -> int:
    try:
        return _simulate(args)
    except KeyboardInterrupt:
        return interrupted(args.out, wrote=False)


def _simulate(args: argparse.Namespace) -> int:
    from pdscale.simulator import (
        ProfileError,
        SimOptions,
        TraceError,
        resolve_trace,
        result_files,
        simulate,
        traces_dir,
    )

    if args.otlp_endpoint and not args.live:
        err("--otlp-endpoint exports the live simulator's request spans: add --live")
        return EXIT_BAD_INPUT
    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    if not out_ok(args.out):
        return EXIT_BAD_INPUT
    try:
        trace = resolve_trace(args.trace, traces_dir(args.traces))
    except TraceError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    options = SimOptions(trace=trace, fmt=args.format, policy=args.policy, mode=args.mode,
                         cold_start_s=args.cold_start, seed=args.seed, scale=args.scale,
                         service=args.service, router=args.router, start_s=args.start,
                         duration_s=args.duration, skip_bad_rows=args.skip_bad_rows,
                         failures=tuple(args.fail or ()),
                         prefix_hit=args.prefix_hit, idle_before=args.idle_before,
                         initial_replicas=args.initial_replicas)
    if args.live:
        return _run_live(spec, options, args)
    progress = Progress(f"simulating {args.policy}")
    try:
        result, meta = simulate(spec, options, progress=progress)
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return EXIT_BAD_INPUT
    finally:
        progress.close()

    def report() -> None:
        s = result.summary
        print(f"{meta['policy']} on {meta['trace']} ({meta['mode']} mode, service "
              f"{meta['service']}): {s['requests']:,} requests in {s['wall_s']:.1f}s")
        print(f"  SLO attainment {s['slo_attainment']:.2%} (TTFT {s['ttft_attainment']:.2%}, "
              f"ITL {s['itl_attainment']:.2%}); TTFT p95 {fmt_s(s['ttft_p95_s'])}, "
              f"ITL p95 {fmt_s(s['itl_p95_s'])}")
        pools = s["pools"]
        print(f"  GPU-hours {s['gpu_hours']:.2f} (prefill {pools['prefill']['gpu_hours']:.2f}, "
              f"decode {pools['decode']['gpu_hours']:.2f}); scale actions {s['scale_actions']}")
        failed = s.get("failures")
        if failed:
            print(f"  failures: {failed['asked']} asked, {failed['took_a_replica']} took a "
                  f"replica, {failed['no_ready_replica']} found none ready, "
                  f"{failed['after_the_run']} due after the run ended (never happened)")
        print(f"  wrote {args.out}/summary.json, timeseries.csv, decisions.json"
              + ("" if args.no_plots else ", plots/"))

    return write_output(args.out, result_files(result, plots=not args.no_plots), report)


def _live_world(spec: Spec, options: object, args: argparse.Namespace
                ) -> tuple[Any, Any, Any] | None:
    """The event world the live cluster serves, with the controller attached: (prepared
    run, world, cluster); None after saying why the trace or the spec cannot be run."""
    from pdscale.simulator import (
        EventWorld,
        LiveCluster,
        ProfileError,
        SimOptions,
        TraceError,
        attach_reconciler,
        prepare,
    )

    assert isinstance(options, SimOptions)
    try:
        prepared = prepare(spec, SimOptions(**{**options.__dict__, "mode": "event"}))
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return None
    assert prepared.trace is not None
    world = EventWorld(prepared.setup, prepared.trace,
                       observation_delay_s=options.observation_delay_s,
                       idle_before=options.idle_before)
    attach_reconciler(world, prepared.policy, spec=prepared.spec,
                      forecasts=prepared.forecasts)
    try:
        cluster = LiveCluster.for_service(world.sim, spec.service(prepared.setup.service),
                                          speed=args.speed)
    except ValueError as exc:
        err(str(exc))
        return None
    if args.otlp_endpoint:
        cluster.export_spans(args.otlp_endpoint)
    return prepared, world, cluster


def _run_live(spec: Spec, options: object, args: argparse.Namespace) -> int:
    import signal
    import threading

    from pdscale._cli.run import _port_busy
    from pdscale._io import OutputError, write_tree
    from pdscale.simulator import result_files, serve_live

    def cannot_listen(why: str) -> int:
        err(f"cannot listen on {args.host}:{args.port}: {why}; stop what holds the port or "
            "pass --port with a free one (0: any free port)")
        return EXIT_BAD_INPUT

    busy = _port_busy(args.host, args.port)  # before the trace loads: fail at once
    if busy:
        return cannot_listen(busy)
    live = _live_world(spec, options, args)
    if live is None:
        return EXIT_BAD_INPUT
    prepared, world, cluster = live
    sim = world.sim
    stop = threading.Event()
    # Ctrl-C or SIGTERM ends the run, whose results are then written (and a second Ctrl-C
    # while they are cannot cut the write short); the handlers are put back on return.
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    announced: list[int] = []

    def announce(port: int) -> None:
        announced.append(port)
        print(f"live: http://127.0.0.1:{port}/metrics  POST /scale  GET /status "
              f"(x{args.speed:g} real time, {len(prepared.trace or [])} requests)", flush=True)
        if args.otlp_endpoint:
            print(f"live: request spans to {args.otlp_endpoint} (OTLP/HTTP)", flush=True)

    try:
        started = time.perf_counter()
        try:
            serve_live(cluster, host=args.host, port=args.port, stop=stop, on_port=announce)
        except OSError as exc:
            if announced:  # not the listening socket: a failure while running
                raise
            return cannot_listen(exc.strerror or str(exc))  # taken since the check above
        result = world.result(time.perf_counter() - started)
        result.summary.update(prepared.meta)
        result.summary["mode"] = "live"
        try:
            write_tree(Path(args.out), result_files(result, plots=not args.no_plots))
        except OutputError as exc:
            err(str(exc))
            return EXIT_FAILURE
        print(f"live run ended at {sim.now:.0f} simulated seconds; wrote {args.out}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


def replica_pair(text: str) -> tuple[int, int]:
    """``P,D``: two replica counts of at least 1."""
    parts = text.split(",")
    try:
        pair = tuple(int(x) for x in parts)
    except ValueError:
        pair = ()
    if len(pair) != 2 or min(pair) < 1:
        raise argparse.ArgumentTypeError(
            f"expected PREFILL,DECODE as two whole numbers of at least 1, e.g. 4,2; got "
            f"{text!r}")
    return pair[0], pair[1]


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser("simulate", help="replay a trace through simulated P/D pools",
                       description="Replay a trace through the service's prefill and decode "
                                   "pools (profiles and SLOs from the spec) under a scaling "
                                   "policy; writes summary.json, timeseries.csv, "
                                   "decisions.json and plots/ into --out.")
    p.add_argument("--spec", required=True,
                   help="the spec: profiles, SLOs and pool bounds of the service replayed")
    p.add_argument("--trace", default="synthetic",
                   help="trace file, a public trace's name in --traces (azure-code, "
                        "mooncake-conversation, servegen-m-large, ...: `pdscale trace list`), "
                        "'synthetic' (default), or 'scenario:NAME' for a generated "
                        "scenario family (daily-rise, flash-crowd, steps, slow-ramp, "
                        "length-shift, decode-heavy, cold-morning)")
    p.add_argument("--traces", metavar="DIR",
                   help="folder of the public traces, where --trace NAME is looked up "
                        "(default: $PDSCALE_TRACES, else ~/.local/share/pdscale/traces; "
                        "`pdscale trace fetch NAME --to DIR` fills it)")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"])
    p.add_argument("--policy", default="static", choices=["static", "reactive", "dynamo",
                                                          "oracle", "pdscale"],
                   help="static: sized for the peak; reactive: HPA semantics; dynamo: Dynamo's "
                   "planner as published; oracle: knows the future; pdscale: the controller's "
                   "policy with the spec's controller settings (default: static)")
    p.add_argument("--mode", default="auto", choices=["event", "fluid", "auto"],
                   help="event: per request; fluid: aggregates (multi-day); auto: event up "
                        "to 6 h and 3M requests")
    p.add_argument("--cold-start", type=NON_NEGATIVE, help="seconds; overrides the spec's pools")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--scale", type=POSITIVE, default=1.0)
    p.add_argument("--service", help="service of the spec (default: the first)")
    p.add_argument("--router",
                   choices=["least_loaded", "round_robin", "prefix"],
                   help="how prefill work reaches the workers: least_loaded, a shared queue "
                        "idle workers pull from; round_robin, each request to the next ready "
                        "worker's own queue (Dynamo's default --router-mode); prefix, to the "
                        "worker holding most of its prefix (default: prefix where the spec's "
                        "service has routing: prefix_aware, else least_loaded; event mode "
                        "only: fluid mode has no workers to route to)")
    p.add_argument("--start", type=NON_NEGATIVE, default=0.0, help="seconds into the trace")
    p.add_argument("--duration", type=POSITIVE, help="seconds of the trace to replay")
    p.add_argument("--prefix-hit", type=FRACTION,
                   help="fluid mode: assumed prefix hit rate, the same at any replica count "
                        "(as a prefix-aware router keeps it)")
    p.add_argument("--fail", action="append", type=failure, metavar="SECONDS:ROLE",
                   help="lose a replica of ROLE at SECONDS, from 0 up to (not including) "
                        "--duration or the trace's length (repeatable)")
    p.add_argument("--initial-replicas", type=replica_pair, metavar="PREFILL,DECODE",
                   help="replicas ready at the start, the same for every policy (default: "
                        "the pools' minimum, a cold start; static: sized for the trace's "
                        "peak); each kept within its pool's bounds")
    p.add_argument("--idle-before", action="store_true",
                   help="event mode: the pools ran idle and were measured before the trace "
                        "starts (a fresh deployment the load then reaches): the first sample, "
                        "at t=0, reads the idle pools. Default: the trace is cut from "
                        "continuous traffic, and that sample is no data")
    p.add_argument("--skip-bad-rows", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--live", action="store_true",
                   help="run in scaled real time, serving /metrics (the spec's engine and DCGM, "
                        "as their releases export them) "
                        "and POST /scale until the trace ends or Ctrl-C")
    p.add_argument("--speed", type=POSITIVE, default=1.0,
                   help="live mode: simulated seconds per wall second (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="live mode: listen address")
    p.add_argument("--port", type=port, default=8400,
                   help="live mode: port, 0 to 65535 (0: any free; default 8400)")
    p.add_argument("--otlp-endpoint", type=otlp_endpoint, metavar="URL",
                   help="live mode: the pods also export one vLLM-shaped request span a "
                        "request over OTLP/HTTP to URL (e.g. http://127.0.0.1:4318/v1/traces, "
                        "pdscale run's receiver)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_simulate)
