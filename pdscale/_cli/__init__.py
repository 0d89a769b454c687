"""The ``pdscale`` command line: one module per command, each registering its own arguments
(``register(sub)``) and running it (``_cmd_*``); :func:`build_parser` assembles them.

Exit codes: 0 success; 1 a failure while working (I/O); 2 bad input (an invalid spec, an
unknown signal, a usage error). Heavy modules are imported inside the command that needs them,
so ``pdscale --help`` and ``pdscale validate`` start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pdscale._cli import (
    catalog,
    check,
    demo,
    down,
    forecast,
    load,
    reference,
    run,
    simulate,
    trace,
    up,
    validate,
)
from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK

__all__ = ["build_parser", "main"]

COMMANDS = (validate, check, catalog, forecast, trace, simulate, reference, demo, up, down, load,
            run)
"""The command modules, in the order ``pdscale --help`` lists them."""

_DESCRIPTION = """\
pdscale: observability and forecast-driven autoscaling for prefill/decode disaggregated
LLM serving (vLLM, SGLang, Dynamo, TGI on Kubernetes).

One spec file describes your services, their prefill and decode pools and their SLOs; pdscale
generates tiered Prometheus alerts (with promtool unit tests) and Grafana dashboards from it.
"""

_EPILOG = """\
examples:
  pdscale validate examples/vllm.yaml
  pdscale check examples/vllm.yaml --prometheus http://localhost:9090
  pdscale generate all examples/vllm.yaml --out out/
  pdscale generate alerts examples/sglang.yaml --out out/alerts
  pdscale signals --engine vllm
  pdscale query examples/vllm.yaml --service llama-chat --pool prefill --signal ttft_p95_s
  pdscale simulate --spec examples/vllm.yaml --policy pdscale --out sim/
  pdscale run --spec spec.yaml            (in a cluster; see deploy/)

exit codes: 0 ok, 1 failure while working, 2 bad input (invalid spec, unknown signal)
"""


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
    for command in COMMANDS:
        command.register(sub)
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
    except KeyboardInterrupt:
        # The long commands report Ctrl-C themselves; one that reaches here (a command
        # without its own handler, or the signal landing as a command returns) still exits
        # 130 without a traceback.
        return EXIT_INTERRUPTED
    return code
