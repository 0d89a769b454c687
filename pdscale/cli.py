"""The ``pdscale`` command line.

Exit codes: 0 success; 1 a failure while working (I/O); 2 bad input (an invalid spec, an
unknown signal, a usage error). Heavy modules are imported inside the command that needs them,
so ``pdscale --help`` and ``pdscale validate`` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pdscale._servers import alive
from pdscale.spec import Role, Spec, SpecError, SpecProblem, load_spec

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

_DESCRIPTION = """\
pdscale: observability and forecast-driven autoscaling for prefill/decode disaggregated
LLM serving (vLLM, SGLang, Dynamo, TGI on Kubernetes).

One spec file describes your services, their prefill and decode pools and their SLOs; pdscale
generates tiered Prometheus alerts (with promtool unit tests) and Grafana dashboards from it.
"""

_EPILOG = """\
examples:
  pdscale validate examples/vllm.yaml
  pdscale generate all examples/vllm.yaml --out out/
  pdscale generate alerts examples/sglang.yaml --out out/alerts
  pdscale signals --engine vllm
  pdscale query examples/vllm.yaml --service llama-chat --pool prefill --signal ttft_p95_s
  pdscale simulate --spec examples/vllm.yaml --policy pdscale --out sim/
  pdscale run --spec spec.yaml            (in a cluster; see deploy/)

exit codes: 0 ok, 1 failure while working, 2 bad input (invalid spec, unknown signal)
"""


def _err(message: str) -> None:
    print(f"pdscale: error: {message}", file=sys.stderr)


def _load(path: str) -> Spec | None:
    """The spec, validated once for everything later stages need (its schema and cross-field
    checks, then what only other packages know: each pool's performance profile)."""
    try:
        spec = load_spec(path)
        problems = _profile_problems(spec)
        if problems:
            raise SpecError(path, problems)
        return spec
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return None


def _profile_problems(spec: Spec) -> list[SpecProblem]:
    from controller import ProfileError, load_profile

    problems = []
    for i, service in enumerate(spec.services):
        for role, pool in service.pools.items():
            try:
                load_profile(pool.profile)
            except ProfileError as exc:
                problems.append(SpecProblem(
                    f"services[{i}].pools.{role.value}.profile",
                    "a shipped profile name or the path of a profile YAML file",
                    repr(pool.profile), str(exc).split(": ", 1)[-1]))
    return problems


def _cmd_validate(args: argparse.Namespace) -> int:
    spec = _load(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    # Everything `generate` renders is rendered here too (in memory), so a spec that
    # validates also generates.
    from alerts import ScenarioError

    try:
        for what in ("all", "recommend"):
            _generate(spec, what, Path(args.spec).name)
    except ScenarioError as exc:
        print(f"{args.spec}: 1 problem(s) in the spec\n  - alerts.thresholds: expected "
              f"thresholds whose tiers a test can tell apart; got {exc}. Fix: widen the gap "
              "between the warning and critical values or `for` durations", file=sys.stderr)
        return EXIT_BAD_INPUT
    pools = sum(len(s.pools) for s in spec.services)
    print(f"{args.spec}: valid ({len(spec.services)} service(s), {pools} pool(s))")
    return EXIT_OK


def _generate(spec: Spec, what: str, source: str, *,
              prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
              ) -> dict[str, dict[str, str]]:
    """Rendered output per subfolder, all in memory before anything is written."""
    out: dict[str, dict[str, str]] = {}
    if what in ("alerts", "all"):
        from alerts import alert_files

        out["alerts"] = alert_files(spec, source=source)
    if what in ("dashboards", "all"):
        from dashboards import dashboard_files

        out["dashboards"] = dashboard_files(spec)
    if what == "recommend":
        from alerts import dump_yaml
        from controller._recommend import hpa_manifests, keda_manifests

        files: dict[str, str] = {}
        for kind, objs in (("keda", keda_manifests(spec, prometheus_url=prometheus_url)),
                           ("hpa", hpa_manifests(spec))):
            for obj in objs:
                files[f"{kind}/{obj['metadata']['name']}.yaml"] = dump_yaml(obj)
        out["recommend"] = files
    return out


def _cmd_generate(args: argparse.Namespace) -> int:
    from pdscale._io import OutputError, write_tree

    spec = _load(args.spec)
    if spec is None:
        print("nothing was written", file=sys.stderr)
        return EXIT_BAD_INPUT
    started = time.perf_counter()
    source = Path(args.spec).name
    from alerts import ScenarioError

    try:
        rendered = _generate(spec, args.what, source, prometheus_url=args.prometheus_url)
    except ScenarioError as exc:
        _err(f"cannot generate promtool tests: {exc}. Nothing was written.")
        return EXIT_BAD_INPUT
    out = Path(args.out)
    try:
        if args.what == "all":
            # One tree, one rename: alerts and dashboards appear together or not at all.
            write_tree(out, {f"{sub}/{rel}": text for sub, files in rendered.items()
                             for rel, text in files.items()})
        else:
            write_tree(out, rendered[args.what])
    except OutputError as exc:
        _err(str(exc))
        return EXIT_FAILURE
    elapsed = time.perf_counter() - started
    for sub, files in rendered.items():
        where = out / sub if args.what == "all" else out
        print(f"{sub}: {len(files)} file(s) in {where}")
    print(f"generated in {elapsed:.2f}s")
    if "alerts" in rendered:
        tests = out / "alerts" / "tests" if args.what == "all" else out / "tests"
        print(f"check them: promtool check rules {tests.parent}/rules/*.yml && "
              f"(cd {tests} && promtool test rules *.test.yml)")
    return EXIT_OK


def _cmd_signals(args: argparse.Namespace) -> int:
    from pdscale.spec import Engine, ServiceSpec
    from telemetry import engine_signals, signal_def

    engines = [Engine(args.engine)] if args.engine else list(Engine)
    for engine in engines:
        probe = ServiceSpec.model_validate({
            "name": "probe", "namespace": "default", "engine": engine.value, "model_name": "m",
            "slo": {"ttft_p95_s": 0.5, "itl_p95_s": 0.05},
            "dynamo": {"namespace": "probe"} if engine is Engine.DYNAMO else None,
            "pools": {r.value: {"target": {"name": f"probe-{r.value}"}, "max_replicas": 1}
                      for r in Role},
        })
        print(f"{engine.value}:")
        for role in Role:
            names = sorted(s.value for s in engine_signals(probe, role))
            print(f"  {role.value}:")
            for name in names:
                d = signal_def(name)
                print(f"    {name:<34} {d.series:<58} {d.help}")
    return EXIT_OK


def _cmd_query(args: argparse.Namespace) -> int:
    from telemetry import UnknownSignal, pool_expr, pool_query

    spec = _load(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    try:
        service = spec.service(args.service)
    except KeyError as exc:
        _err(str(exc.args[0]))
        return EXIT_BAD_INPUT
    role = Role(args.pool)
    try:
        raw = pool_expr(args.signal, service, role, window=args.window)
    except UnknownSignal as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    print(f"# raw, over {service.engine.value}'s series:\n{raw}")
    matchers = f'pdscale_service="{service.name}",pdscale_pool="{role.value}"'
    print(f"# recorded:\n{pool_query(args.signal, matchers=matchers)}")
    return EXIT_OK


class _Progress:
    """A progress bar on stderr for work that takes more than a couple of seconds."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.shown = False
        self.last = -1

    def __call__(self, fraction: float) -> None:
        if time.perf_counter() - self.started < 2.0:
            return
        percent = int(fraction * 100)
        if percent == self.last:
            return
        self.last = percent
        bar = "#" * (percent // 4) + "." * (25 - percent // 4)
        end = "\r" if sys.stderr.isatty() else "\n"
        if sys.stderr.isatty() or percent % 10 == 0:
            print(f"{self.label} [{bar}] {percent:3d}%", end=end, file=sys.stderr, flush=True)
            self.shown = True

    def close(self) -> None:
        if self.shown and sys.stderr.isatty():
            print(file=sys.stderr)


def _cmd_trace_stats(args: argparse.Namespace) -> int:
    from simulator import TraceError, load_trace, trace_stats

    try:
        trace = load_trace(args.trace, args.format, skip_bad_rows=args.skip_bad_rows,
                           seed=args.seed, duration_s=args.duration)
        trace = trace.scaled(args.scale, seed=args.seed)
    except TraceError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    print(trace_stats(trace).table())
    for note in trace.notes:
        print(f"note: {note}")
    return EXIT_OK


def _parse_failure(text: str) -> tuple[float, Role]:
    try:
        when, role = text.split(":")
        return float(when), Role(role)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected SECONDS:prefill or SECONDS:decode, got {text!r}") from None


def _out_ok(out: str) -> bool:
    """Check ``--out`` before the work that fills it (a simulation can take minutes)."""
    from pdscale._io import OutputError, check_target

    try:
        check_target(Path(out))
    except OutputError as exc:
        _err(f"{exc}. Nothing was run.")
        return False
    return True


def _cmd_simulate(args: argparse.Namespace) -> int:
    from pdscale._io import OutputError, write_tree
    from simulator import ProfileError, SimOptions, TraceError, result_files, simulate

    spec = _load(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    if not _out_ok(args.out):
        return EXIT_BAD_INPUT
    options = SimOptions(trace=args.trace, fmt=args.format, policy=args.policy, mode=args.mode,
                         cold_start_s=args.cold_start, seed=args.seed, scale=args.scale,
                         service=args.service, router=args.router, start_s=args.start,
                         duration_s=args.duration, skip_bad_rows=args.skip_bad_rows,
                         failures=tuple(args.fail or ()),
                         prefix_hit=args.prefix_hit)
    if args.live:
        return _run_live(spec, options, args)
    progress = _Progress(f"simulating {args.policy}")
    try:
        result, meta = simulate(spec, options, progress=progress)
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        progress.close()
        _err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return EXIT_BAD_INPUT
    progress.close()
    try:
        write_tree(Path(args.out), result_files(result, plots=not args.no_plots))
    except OutputError as exc:
        _err(str(exc))
        return EXIT_FAILURE
    s = result.summary
    print(f"{meta['policy']} on {meta['trace']} ({meta['mode']} mode, service "
          f"{meta['service']}): {s['requests']:,} requests in {s['wall_s']:.1f}s")
    print(f"  SLO attainment {s['slo_attainment']:.2%} (TTFT {s['ttft_attainment']:.2%}, "
          f"ITL {s['itl_attainment']:.2%}); TTFT p95 {_fmt_s(s['ttft_p95_s'])}, "
          f"ITL p95 {_fmt_s(s['itl_p95_s'])}")
    pools = s["pools"]
    print(f"  GPU-hours {s['gpu_hours']:.2f} (prefill {pools['prefill']['gpu_hours']:.2f}, "
          f"decode {pools['decode']['gpu_hours']:.2f}); scale actions {s['scale_actions']}")
    print(f"  wrote {args.out}/summary.json, timeseries.csv, decisions.json"
          + ("" if args.no_plots else ", plots/"))
    return EXIT_OK


def _cmd_spec_reference(args: argparse.Namespace) -> int:
    from pdscale._reference import spec_reference

    print(spec_reference(), end="")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from alerts import alert_files
    from dashboards import dashboard_files
    from pdscale._io import OutputError, write_tree
    from simulator import ProfileError, SimOptions, TraceError
    from simulator._compare import compare_policies, comparison_files, comparison_table

    spec = _load(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    if not _out_ok(args.out):
        return EXIT_BAD_INPUT
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in ("static", "reactive", "dynamo", "oracle",
                                                "pdscale")]
    if unknown or not policies:
        _err(f"unknown policy {', '.join(unknown) or '(none)'}; use a comma-separated list of "
             "static, reactive, dynamo, oracle, pdscale")
        return EXIT_BAD_INPUT
    options = SimOptions(trace="synthetic", mode="event", duration_s=args.hours * 3600,
                         cold_start_s=args.cold_start, seed=args.seed, scale=args.scale)
    print(f"pdscale demo: {args.hours:g} h of the synthetic trace (seed {args.seed}, x"
          f"{args.scale:g}), {args.cold_start:g} s cold start, service "
          f"{spec.services[0].name} of {args.spec}; policies {', '.join(policies)}",
          file=sys.stderr)
    bars: dict[str, _Progress] = {}

    def progress(policy: str, share: float) -> None:
        bars.setdefault(policy, _Progress(f"  {policy:>8}"))(share)

    try:
        results = compare_policies(spec, options, policies, progress=progress)
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        _err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return EXIT_BAD_INPUT
    for bar in bars.values():
        bar.close()
    files: dict[str, str | bytes] = {f"simulation/{k}": v
                                     for k, v in comparison_files(results).items()}
    files.update({f"alerts/{k}": v for k, v in alert_files(spec).items()})
    files.update({f"dashboards/{k}": v for k, v in dashboard_files(spec).items()})
    try:
        write_tree(Path(args.out), files)
    except OutputError as exc:
        _err(str(exc))
        return EXIT_FAILURE
    print(comparison_table(results), end="")
    print(f"\nwrote {args.out}/: simulation/comparison.md, simulation/plots/"
          "gpu_hours_vs_attainment.png, simulation/plots/replicas_vs_load.png, per-policy "
          "results in simulation/<policy>/, and the spec's alerts/ and dashboards/")
    return EXIT_OK


def _cmd_up(args: argparse.Namespace) -> int:
    import json
    import subprocess

    import yaml

    from alerts import alert_files, alertmanager_config
    from pdscale._servers import (
        alertmanager_argv,
        find_binary,
        free_port,
        prometheus_argv,
        wait_ready,
        write_rule_files,
    )

    spec = _load(args.spec or ("examples/dynamo.yaml" if args.engine == "dynamo"
                               else "examples/vllm.yaml"))
    if spec is None:
        return EXIT_BAD_INPUT
    folder = Path(args.dir)
    state_file = folder / "up.json"
    if state_file.exists():
        state = _up_state(state_file)
        if state is None:
            return EXIT_BAD_INPUT
        if any(alive(p["pid"]) for p in state["processes"]):
            _err(f"a stack is already up in {folder}: run `pdscale down --dir {folder}` first")
            return EXIT_BAD_INPUT
    if args.engine == "dynamo":  # a real Dynamo frontend and mocker workers, and Prometheus
        from pdscale._dynamo_up import up_dynamo

        return up_dynamo(spec, folder)
    binaries = {name: find_binary(name) for name in ("prometheus", "alertmanager")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        _err(f"{' and '.join(missing)} not found: install the distribution's packages "
             "(apt-get install prometheus prometheus-alertmanager, or scripts/system-deps.sh)")
        return EXIT_BAD_INPUT
    folder.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port()
             for name in ("simulator", "prometheus", "alertmanager", "controller")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    # One service (the simulator runs one), fast ticks for a sped-up simulation, no Lease.
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["services"] = raw["services"][:1]
    raw.pop("gpu_budget", None)
    raw["controller"].update({"tick": max(1, round(15 / args.speed)),
                              "prometheus": {**raw["controller"]["prometheus"],
                                             "url": url["prometheus"], "history": 3600}})
    raw["controller"]["leader_election"]["enabled"] = False
    raw["alerts"]["webhook"] = {**raw["alerts"]["webhook"],
                                "url": f"{url['controller']}/v1/alerts/alertmanager"}
    raw["alerts"]["webhook"].pop("credentials_file", None)
    raw["reactions"]["auth"] = {}
    local = folder / "spec.yaml"
    local.write_text(yaml.safe_dump(raw, sort_keys=False))
    local_spec = load_spec(local)
    rules = write_rule_files(alert_files(local_spec), folder)
    (folder / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": rules,
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [
            {"job_name": "simulator", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['simulator']}"]}]},
            {"job_name": "pdscale", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports['controller']}"]}]}]},
        sort_keys=False))
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(local_spec),
                                                            sort_keys=False))
    py = sys.executable
    f = folder.resolve()
    commands = [
        ("simulator", [py, "-m", "pdscale", "simulate", "--live", "--spec", str(local),
                       "--trace", "synthetic", "--duration", str(args.duration), "--speed",
                       str(args.speed), "--scale", str(args.scale), "--port",
                       str(ports["simulator"]), "--policy", "static", "--out", str(f / "sim")],
         f"{url['simulator']}/status"),
        ("prometheus", prometheus_argv(str(binaries["prometheus"]), f / "prometheus.yml",
                                       f / "prometheus-data", ports["prometheus"]),
         f"{url['prometheus']}/-/ready"),
        ("alertmanager", alertmanager_argv(str(binaries["alertmanager"]),
                                           f / "alertmanager.yml", f / "alertmanager-data",
                                           ports["alertmanager"]),
         f"{url['alertmanager']}/-/ready"),
        ("controller", [py, "-m", "pdscale", "run", "--spec", str(local), "--sim-url",
                        url["simulator"], "--listen", f"127.0.0.1:{ports['controller']}",
                        "--no-leader-election", "--log-level", "warning"],
         f"{url['controller']}/healthz"),
    ]
    started: list[dict[str, Any]] = []

    def stop_all() -> None:
        for p in reversed(started):
            _terminate(p["pid"])

    for name, argv, ready_url in commands:
        with (folder / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        started.append({"name": name, "pid": proc.pid, "url": url[name]})
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        if not wait_ready(ready_url, 60, proc):
            stop_all()
            tail = (folder / f"{name}.log").read_text()[-2000:]
            _err(f"{name} did not come up (log {folder / (name + '.log')}):\n{tail}")
            return EXIT_FAILURE
    state_file.write_text(json.dumps({"processes": started}, indent=2) + "\n")
    print(f"pdscale up: a local stack on loopback (x{args.speed:g} simulated time), "
          f"state in {folder}/")
    print(f"  simulator   {url['simulator']}/metrics  /status  POST /scale")
    print(f"  prometheus  {url['prometheus']}  (the generated rules; alerts at /alerts)")
    print(f"  alertmanager {url['alertmanager']}  (the generated route to pdscale)")
    print(f"  controller  {url['controller']}/v1/status  /v1/decisions  /v1/forecast  /metrics")
    print(f"stop it with: pdscale down --dir {folder}")
    return EXIT_OK


def _terminate(pid: int) -> None:
    import os
    import signal

    if not alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _up_state(state_file: Path) -> dict[str, Any] | None:
    """The state `pdscale up` recorded, or None after saying why it cannot be read."""
    import json

    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not all(
                isinstance(p, dict) and isinstance(p.get("pid"), int)
                and isinstance(p.get("name"), str) for p in state["processes"]):
            raise ValueError("expected {'processes': [{'name': ..., 'pid': ...}, ...]}")
        return state
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        _err(f"cannot read {state_file} ({exc}): the stack's process ids are lost. Stop its "
             "processes by hand (ps -ef | grep -e prometheus -e alertmanager -e pdscale), "
             f"then delete {state_file}")
        return None


def _cmd_down(args: argparse.Namespace) -> int:

    state_file = Path(args.dir) / "up.json"
    if not state_file.exists():
        print(f"pdscale down: nothing is up in {args.dir}", file=sys.stderr)
        return EXIT_OK
    state = _up_state(state_file)
    if state is None:
        return EXIT_BAD_INPUT
    if state.get("dynamo"):  # the Dynamo stack's workers and frontend, by their recorded PIDs
        from simulator._stack import stop_stack

        for name in stop_stack(Path(args.dir) / state["dynamo"]):
            print(f"  {name:<12} stopped")
    for p in reversed(state["processes"]):
        was = alive(p["pid"])
        _terminate(p["pid"])
        print(f"  {p['name']:<12} {'stopped' if was else 'was not running'}")
    state_file.unlink()
    return EXIT_OK


def _run_live(spec: Spec, options: object, args: argparse.Namespace) -> int:
    import signal
    import threading

    from pdscale._io import OutputError, write_tree
    from simulator import EventWorld, ProfileError, TraceError, result_files
    from simulator._live import LiveCluster, serve_live
    from simulator._runner import attach_reconciler
    from simulator._simulate import SimOptions, prepare

    assert isinstance(options, SimOptions)
    try:
        prepared = prepare(spec, SimOptions(**{**options.__dict__, "mode": "event"}))
    except (TraceError, ProfileError, KeyError, ValueError) as exc:
        _err(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return EXIT_BAD_INPUT
    assert prepared.trace is not None
    service = spec.service(prepared.setup.service)
    world = EventWorld(prepared.setup, prepared.trace,
                       observation_delay_s=options.observation_delay_s)
    attach_reconciler(world, prepared.policy, spec=prepared.spec,
                      forecasts=prepared.forecasts)
    sim = world.sim
    cluster = LiveCluster(sim, namespace=service.namespace, model_name=service.model_name,
                          pod_prefix={r: service.pools[r].target.name for r in Role},
                          speed=args.speed)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def announce(port: int) -> None:
        print(f"live: http://127.0.0.1:{port}/metrics  POST /scale  GET /status "
              f"(x{args.speed:g} real time, {len(prepared.trace or [])} requests)", flush=True)

    started = time.perf_counter()
    serve_live(cluster, host=args.host, port=args.port, stop=stop, on_port=announce)
    result = world.result(time.perf_counter() - started)
    result.summary.update(prepared.meta)
    result.summary["mode"] = "live"
    try:
        write_tree(Path(args.out), result_files(result, plots=not args.no_plots))
    except OutputError as exc:
        _err(str(exc))
        return EXIT_FAILURE
    print(f"live run ended at {sim.now:.0f} simulated seconds; wrote {args.out}")
    return EXIT_OK


def _read_series_csv(path: str, time_col: str, value_col: str) -> tuple[list[float],
                                                                         list[float]]:
    import csv
    from datetime import datetime

    times: list[float] = []
    values: list[float] = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for name in (time_col, value_col):
            if name not in (reader.fieldnames or []):
                raise ValueError(f"{path}: no column {name!r}; the columns are "
                                 f"{', '.join(reader.fieldnames or [])}")
        for line, row in enumerate(reader, start=2):
            raw_t, raw_v = row[time_col], row[value_col]
            try:
                t = float(raw_t)
            except ValueError:
                try:
                    t = datetime.fromisoformat(raw_t).timestamp()
                except ValueError:
                    raise ValueError(f"{path}, line {line}, column {time_col!r}: expected "
                                     f"seconds or an ISO time, got {raw_t!r}") from None
            try:
                v = float(raw_v) if raw_v.strip() else float("nan")
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {value_col!r}: expected a "
                                 f"number, got {raw_v!r}") from None
            times.append(t)
            values.append(v)
    return times, values


def _cmd_forecast_backtest(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from forecasting import (
        ExponentialSmoothing,
        LastValue,
        QuantileGBForecaster,
        SeasonalNaive,
        SeriesError,
        backtest,
        regularize,
        series_from_requests,
    )
    from pdscale._io import OutputError, write_tree
    from pdscale.spec import parse_duration

    if not _out_ok(args.out):
        return EXIT_BAD_INPUT
    try:
        resolution = float(parse_duration(args.resolution))
        horizons = [float(parse_duration(h)) for h in args.horizons.split(",") if h.strip()]
        quantiles = tuple(float(q) for q in args.quantiles.split(","))
    except ValueError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    try:
        if args.trace:
            from simulator import TraceError, load_trace

            try:
                trace = load_trace(args.trace, args.format, skip_bad_rows=args.skip_bad_rows)
            except TraceError as exc:
                raise ValueError(str(exc)) from exc
            all_series = series_from_requests(
                trace.arrival_s, trace.prompt_tokens.astype(np.float64),
                trace.output_tokens.astype(np.float64), resolution_s=resolution)
            if args.signal not in all_series:
                raise ValueError(f"unknown --signal {args.signal!r}; use one of "
                                 f"{', '.join(all_series)}")
            series = all_series[args.signal]
            source = args.trace
        else:
            if not (args.series and args.time_col and args.value_col):
                raise ValueError("give --trace, or --series with --time-col and --value-col")
            times, values = _read_series_csv(args.series, args.time_col, args.value_col)
            series = regularize(times, values, resolution_s=resolution,
                                zero_is_missing=args.zero_is_missing)
            source = args.series
        n = len(series)
        period = max(1, round(args.period / resolution))
        train = round(n * args.train_fraction) if args.train_days is None else \
            round(args.train_days * 86400 / resolution)
        models: dict[str, Any] = {
            "last_value": LastValue(resolution_s=resolution, quantiles=quantiles),
            "exp_smoothing": ExponentialSmoothing(resolution_s=resolution, quantiles=quantiles)}
        if train > period + 1:
            models["seasonal_naive"] = SeasonalNaive(period_s=args.period, resolution_s=resolution,
                                                     quantiles=quantiles)
        models["gbqr"] = QuantileGBForecaster(horizons_s=tuple(horizons), period_s=args.period,
                                              random_state=args.seed, resolution_s=resolution,
                                              quantiles=quantiles)
        result = backtest(series, models, horizons_s=horizons, train_steps=train,
                          season_steps=period)
    except (SeriesError, ValueError, OSError) as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    labels = list(next(iter(result.scores.values())))
    print(f"backtest of {source} at {args.resolution}: trained on {result.train_steps} steps, "
          f"{result.test_origins} forecast origins")
    print(f"{'model':<16}{'horizon':>8}{'MAE':>11}{'sMAPE':>8}{'MASE':>7}{'cov q90':>9}"
          f"{'fit s':>7}")
    for name, per_h in result.scores.items():
        for label in labels:
            sc = per_h[label]
            cov = sc.get("coverage_q90")
            print(f"{name:<16}{label:>8}{sc['mae']:>11.4g}{sc['smape']:>8.3f}"
                  f"{sc['mase'] if sc['mase'] is not None else float('nan'):>7.3f}"
                  f"{cov if cov is not None else float('nan'):>9.3f}{result.fit_s[name]:>7.2f}")
    report = {"source": source, "resolution_s": resolution, "horizons_s": horizons,
              "quantiles": list(quantiles), "train_steps": result.train_steps,
              "test_origins": result.test_origins, "series_notes": list(series.notes),
              "fit_s": result.fit_s, "predict_ms": result.predict_ms,
              "models": result.scores}
    files: dict[str, str | bytes] = {
        "backtest.json": json.dumps(report, indent=2, sort_keys=True) + "\n"}
    if not args.no_plots:
        files["forecast.png"] = _backtest_plot(series, result)
    try:
        write_tree(Path(args.out), files)
    except OutputError as exc:
        _err(str(exc))
        return EXIT_FAILURE
    print(f"wrote {args.out}/backtest.json" + ("" if args.no_plots else " and forecast.png"))
    return EXIT_OK


def _backtest_plot(series: object, result: object) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from forecasting import BacktestResult, RegularSeries

    assert isinstance(series, RegularSeries) and isinstance(result, BacktestResult)
    name = "gbqr" if "gbqr" in result.forecasts else next(iter(result.forecasts))
    pred = result.forecasts[name]
    j = len(result.horizons) - 1
    h = int(result.horizons[j])
    target = result.origins + h
    hours = series.times_s[target] / 3600
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.plot(hours, series.values[target], lw=0.8, color="black", label="actual")
    ax.plot(hours, pred[:, j, 0], lw=0.8, color="tab:blue", label=f"{name} median")
    ax.fill_between(hours, pred[:, j, 0], pred[:, j, -1], color="tab:blue", alpha=0.2,
                    label="quantile band")
    ax.set_xlabel("hours")
    ax.set_title(f"{name}: forecast {h * series.resolution_s / 60:g} min ahead against actual")
    ax.legend(loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as 0.0.0.0:8080 or "
                                         f":8080, got {text!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def _port_busy(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None (checked before anything starts, so a
    busy port is a clear error rather than a half-started controller)."""
    import socket

    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    spec = _load(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # pdscale logs the failure itself
    from controller._runtime import (
        Controller,
        KubeConfigError,
        kube_client,
        reader_from_spec,
        serve,
    )

    try:
        api = None if args.sim_url else kube_client(args.kubeconfig)
    except KubeConfigError as exc:
        _err(f"no Kubernetes configuration: {str(exc).rstrip('.')}. In a cluster, run with "
             "a ServiceAccount (deploy/); outside one, pass --kubeconfig FILE")
        return EXIT_BAD_INPUT
    try:
        reader = reader_from_spec(spec, url=args.prometheus_url)
    except (OSError, ValueError) as exc:
        _err(f"Prometheus credentials: {exc}; check spec.controller.prometheus")
        return EXIT_BAD_INPUT
    kwargs: dict[str, Any] = {}
    if args.identity:
        kwargs["identity"] = args.identity
    controller = Controller(spec, api, reader, dry_run=True if args.dry_run else None,
                            leader_election=False if args.no_leader_election else None,
                            sim_url=args.sim_url, **kwargs)
    host, port = args.listen
    busy = _port_busy(host, port)
    if busy:
        _err(f"cannot listen on {host}:{port}: {busy}; stop what holds the port or pass "
             "--listen HOST:PORT with a free one")
        return EXIT_BAD_INPUT
    refusal = controller.expose(host, allow_unauthenticated=args.allow_unauthenticated_webhook)
    if refusal:
        print(f"pdscale: warning: {refusal}", file=sys.stderr, flush=True)
    mode = "dry run" if controller.reconciler.dry_run else spec.controller.mode
    print(f"pdscale: controlling {sum(len(s.pools) for s in spec.services)} pool(s) of "
          f"{len(spec.services)} service(s) ({mode}); Prometheus {reader.url}; API on "
          f"http://{host}:{port} (/v1/status, /metrics)", file=sys.stderr, flush=True)
    stopped_by = serve(controller, host, port, log_level=args.log_level)
    print("pdscale: stopped" + (f" ({stopped_by})" if stopped_by else ""), file=sys.stderr)
    return EXIT_OK


def _number(kind: str) -> Callable[[str], float]:
    """An argparse type for a finite number that is ``positive`` (> 0), ``non-negative``
    (>= 0) or a ``fraction`` (0 <= x < 1): out of range exits 2 with one line that says so."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and (
            value > 0 if kind == "positive" else value >= 0 if kind == "non-negative"
            else 0 <= value < 1)
        if not ok:
            want = {"positive": "a number > 0", "non-negative": "a number >= 0",
                    "fraction": "a fraction from 0 up to (not including) 1"}[kind]
            raise argparse.ArgumentTypeError(f"expected {want}, got {text}")
        return value

    parse.__name__ = kind  # argparse names the type in its messages
    return parse


_POSITIVE, _NON_NEGATIVE, _FRACTION = (_number(k) for k in ("positive", "non-negative",
                                                          "fraction"))


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text}")
    return value


_PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def _prom_window(text: str) -> str:
    if not _PROM_DURATION.match(text) or not any(ch in "123456789" for ch in text):
        raise argparse.ArgumentTypeError(
            f"expected a Prometheus duration such as 30s, 5m or 1h30m, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdscale", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("pdscale")
    except PackageNotFoundError:  # running from a source tree without installing
        ver = "unknown"
    parser.add_argument("--version", action="version", version=f"pdscale {ver}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("validate", help="check a spec and list every problem",
                       description="Validate a spec; every problem is listed with its field "
                                   "path, what was expected, what was given and how to fix it.")
    p.add_argument("spec", help="path to the spec YAML")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("generate", help="generate alerts and/or dashboards from a spec",
                       description="Generate Prometheus rules, a PrometheusRule, an "
                                   "Alertmanager config and promtool tests (alerts), Grafana "
                                   "dashboards and ConfigMaps (dashboards), or both (all). The "
                                   "output folder is replaced as a whole, atomically; it must "
                                   "be new, empty, or an earlier pdscale output.")
    p.add_argument("what", choices=["alerts", "dashboards", "all", "recommend"],
                   help="recommend: KEDA ScaledObjects and HPAs that follow pdscale's "
                        "pdscale_desired_replicas, for teams that keep their autoscaler")
    p.add_argument("spec", help="path to the spec YAML")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--prometheus-url", default="http://prometheus-operated.monitoring.svc:9090",
                   help="recommend: the Prometheus KEDA queries")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("signals", help="list the signals each engine provides",
                       description="List the catalog: each engine's signals per pool role, "
                                   "with the recorded series name pdscale uses for it.")
    p.add_argument("--engine", choices=["vllm", "sglang", "dynamo", "tgi"])
    p.set_defaults(func=_cmd_signals)

    p = sub.add_parser("query", help="print the PromQL of one signal of one pool",
                       description="Print a signal's PromQL for a pool: the raw expression "
                                   "over the engine's series and the recorded series query.")
    p.add_argument("spec", help="path to the spec YAML")
    p.add_argument("--service", required=True)
    p.add_argument("--pool", required=True, choices=[r.value for r in Role])
    p.add_argument("--signal", required=True, help="signal name, see `pdscale signals`")
    p.add_argument("--window", default="5m", type=_prom_window, help="rate window (default 5m)")
    p.set_defaults(func=_cmd_query)

    forecast = sub.add_parser("forecast", help="load forecasting: backtests")
    forecast_sub = forecast.add_subparsers(dest="forecast_command", metavar="COMMAND",
                                           required=True)
    p = forecast_sub.add_parser(
        "backtest", help="rolling-origin backtest of the forecasters",
        description="Fit the forecasters (last value, exponential smoothing, seasonal naive, "
                    "gradient-boosted quantile regression) on the first part of a series and "
                    "score forecasts from every later origin: MAE, sMAPE, MASE, pinball loss "
                    "per quantile, coverage of the 0.9 quantile. Writes backtest.json and a "
                    "plot into --out.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="a request trace (or 'synthetic')")
    source.add_argument("--series", help="a CSV of (time, value) rows")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"])
    p.add_argument("--signal", default="request_rate",
                   help="from a trace: request_rate, prompt_tokens_per_s, output_tokens_per_s, "
                        "mean_input_tokens or mean_output_tokens")
    p.add_argument("--time-col", help="CSV time column (seconds or ISO times)")
    p.add_argument("--value-col", help="CSV value column")
    p.add_argument("--zero-is-missing", action="store_true",
                   help="treat zeros in a busy series as collection gaps")
    p.add_argument("--resolution", default="1m")
    p.add_argument("--horizons", default="5m,30m")
    p.add_argument("--quantiles", default="0.5,0.9")
    p.add_argument("--period", type=_POSITIVE, default=86400.0, help="seasonal period, seconds")
    p.add_argument("--train-fraction", type=_FRACTION, default=0.7)
    p.add_argument("--train-days", type=_POSITIVE, help="train on this many days instead")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--skip-bad-rows", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_forecast_backtest)

    trace = sub.add_parser("trace", help="inspect request traces")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    p = trace_sub.add_parser("stats", help="span, requests, rate and token-length percentiles",
                             description="Load a trace and print its span, request count, "
                                         "per-minute rate percentiles and token-length "
                                         "percentiles. TRACE is a file or 'synthetic'.")
    p.add_argument("trace")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"], help="default: from the name or header")
    p.add_argument("--scale", type=_POSITIVE, default=1.0,
                   help="thin (<1) or multiply (>1) arrivals")
    p.add_argument("--duration", type=_POSITIVE, help="seconds to load (ServeGen: default all, "
                   "which can be hundreds of millions of requests)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows and report how many")
    p.set_defaults(func=_cmd_trace_stats)

    p = sub.add_parser("simulate", help="replay a trace through simulated P/D pools",
                       description="Replay a trace through the service's prefill and decode "
                                   "pools (profiles and SLOs from the spec) under a scaling "
                                   "policy; writes summary.json, timeseries.csv, "
                                   "decisions.json and plots/ into --out.")
    p.add_argument("--spec", required=True)
    p.add_argument("--trace", default="synthetic", help="trace file or 'synthetic' (default)")
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
    p.add_argument("--cold-start", type=_NON_NEGATIVE, help="seconds; overrides the spec's pools")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--scale", type=_POSITIVE, default=1.0)
    p.add_argument("--service", help="service of the spec (default: the first)")
    p.add_argument("--router", default="least_loaded", choices=["least_loaded", "prefix"])
    p.add_argument("--start", type=_NON_NEGATIVE, default=0.0, help="seconds into the trace")
    p.add_argument("--duration", type=_POSITIVE, help="seconds of the trace to replay")
    p.add_argument("--prefix-hit", type=_FRACTION, help="fluid mode: assumed prefix hit rate")
    p.add_argument("--fail", action="append", type=_parse_failure, metavar="SECONDS:ROLE",
                   help="lose a replica of ROLE at SECONDS (repeatable)")
    p.add_argument("--skip-bad-rows", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--live", action="store_true",
                   help="run in scaled real time, serving /metrics (vLLM and DCGM names) "
                        "and POST /scale until the trace ends or Ctrl-C")
    p.add_argument("--speed", type=_POSITIVE, default=1.0,
                   help="live mode: simulated seconds per wall second (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="live mode: listen address")
    p.add_argument("--port", type=int, default=8400, help="live mode: port (0: any free)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("spec-reference", help="print the spec reference (markdown)",
                       description="Every field of a spec file, generated from the models "
                                   "pdscale validates against (docs/spec-reference.md).")
    p.set_defaults(func=_cmd_spec_reference)

    p = sub.add_parser(
        "demo", help="compare scaling policies on a synthetic trace; generate alerts and "
                     "dashboards",
        description="Replay the embedded synthetic trace (daily swing, bursts, three length "
                    "mixes) through the first service of the spec under each policy, print a "
                    "comparison table (SLO attainment, GPU-hours, latency), and write it with "
                    "plots, per-policy results and the spec's alerts and dashboards into --out.")
    p.add_argument("--spec", default="examples/vllm.yaml")
    p.add_argument("--out", default="out")
    p.add_argument("--policies", default="static,reactive,pdscale",
                   help="comma-separated (static, reactive, dynamo, oracle, pdscale)")
    p.add_argument("--hours", type=_POSITIVE, default=2.0, help="trace length (default 2)")
    p.add_argument("--scale", type=_POSITIVE, default=2.0,
                   help="load multiplier of the synthetic trace (default 2: ~40 req/s)")
    p.add_argument("--cold-start", type=_NON_NEGATIVE, default=60.0, help="seconds (default 60)")
    p.add_argument("--seed", type=_seed, default=0)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser(
        "up", help="start a local stack on loopback: simulator, Prometheus, Alertmanager, "
                   "controller",
        description="Start, in the background on loopback ports, the simulator in live mode "
                    "(the spec's first service, synthetic trace), a real Prometheus with the "
                    "generated rules scraping it and the controller, Alertmanager with the "
                    "generated route, and the controller driving the simulator. Prints the "
                    "URLs. Needs the prometheus and prometheus-alertmanager binaries.")
    p.add_argument("--spec", help="default: examples/vllm.yaml (examples/dynamo.yaml with "
                                  "--engine dynamo)")
    p.add_argument("--engine", choices=["sim", "dynamo"], default="sim",
                   help="sim: the simulator's live mode (default); dynamo: a real NVIDIA Dynamo "
                        "frontend and mocker workers for the spec's dynamo service, and "
                        "Prometheus (needs scripts/dynamo-setup.sh)")
    p.add_argument("--dir", default=".pdscale-up", help="state, configs and logs")
    p.add_argument("--speed", type=_POSITIVE, default=10.0,
                   help="simulated seconds per wall second (default 10)")
    p.add_argument("--duration", type=_POSITIVE, default=6 * 3600,
                   help="simulated seconds of trace (default 6 h)")
    p.add_argument("--scale", type=_POSITIVE, default=1.0, help="load multiplier")
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser("down", help="stop the stack pdscale up started")
    p.add_argument("--dir", default=".pdscale-up")
    p.set_defaults(func=_cmd_down)

    p = sub.add_parser(
        "run", help="run the controller (in a cluster, or against one with --kubeconfig)",
        description="Run pdscale's controller: every tick it reads the pools' signals from "
                    "Prometheus, forecasts demand one cold start ahead, and sets the prefill "
                    "and decode replicas through the scale subresource of each pool's target. "
                    "Serves /healthz, /readyz, /metrics, /v1/status, /v1/decisions, "
                    "/v1/forecast and the Alertmanager webhook. Stops cleanly on SIGTERM.",
        epilog="examples:\n  pdscale run --spec /etc/pdscale/spec.yaml\n"
               "  pdscale run --spec examples/vllm.yaml --kubeconfig ~/.kube/config --dry-run "
               "--prometheus-url http://localhost:9090",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True)
    p.add_argument("--dry-run", action="store_true",
                   help="decide and record, never scale or label anything")
    p.add_argument("--kubeconfig", help="default: the in-cluster ServiceAccount")
    p.add_argument("--listen", type=_parse_listen, default=("0.0.0.0", 8080),
                   metavar="HOST:PORT", help="API address (default 0.0.0.0:8080). Without "
                   "spec.reactions.auth the Alertmanager webhook is served only on a loopback "
                   "address")
    p.add_argument("--allow-unauthenticated-webhook", action="store_true",
                   help="serve the webhook without authentication on a non-loopback address "
                        "(anyone who reaches the port can scale and drain pools)")
    p.add_argument("--prometheus-url", help="overrides spec.controller.prometheus.url")
    p.add_argument("--identity", help="leader-election identity (default: POD_NAME or the "
                                      "host name)")
    p.add_argument("--no-leader-election", action="store_true",
                   help="act without a Lease (one replica only)")
    p.add_argument("--sim-url", help="drive the simulator's live mode at this URL instead of "
                                     "Kubernetes (what pdscale up does)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return EXIT_OK
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
