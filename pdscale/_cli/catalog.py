"""``pdscale signals`` and ``pdscale query``: the signal catalog and one signal's PromQL."""

from __future__ import annotations

import argparse
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_OK, err, load_checked, prom_window
from pdscale.spec import Role


def _cmd_signals(args: argparse.Namespace) -> int:
    from pdscale.spec import Engine, ServiceSpec
    from pdscale.telemetry import engine_signals, signal_def

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
    from pdscale.telemetry import UnknownSignal, pool_expr, pool_query

    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    try:
        service = spec.service(args.service)
    except KeyError as exc:
        err(str(exc.args[0]))
        return EXIT_BAD_INPUT
    role = Role(args.pool)
    try:
        raw = pool_expr(args.signal, service, role, window=args.window)
    except UnknownSignal as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    print(f"# raw, over {service.engine.value}'s series:\n{raw}")
    matchers = f'pdscale_service="{service.name}",pdscale_pool="{role.value}"'
    print(f"# recorded:\n{pool_query(args.signal, matchers=matchers)}")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser("signals", help="list the signals each engine provides",
                       description="List the catalog: each engine's signals per pool role, "
                                   "with the recorded series name pdscale uses for it.")
    p.add_argument("--engine", choices=["vllm", "sglang", "dynamo", "tgi"])
    p.set_defaults(func=_cmd_signals)

    p = sub.add_parser("query", help="print the PromQL of one signal of one pool",
                       description="Print a signal's PromQL for a pool: the raw expression "
                                   "over the engine's series and the recorded series query.")
    p.add_argument("spec", help="path to the spec YAML")
    p.add_argument("--service", required=True, help="a service name from the spec")
    p.add_argument("--pool", required=True, choices=[r.value for r in Role])
    p.add_argument("--signal", required=True, help="signal name, see `pdscale signals`")
    p.add_argument("--window", default="5m", type=prom_window, help="rate window (default 5m)")
    p.set_defaults(func=_cmd_query)
