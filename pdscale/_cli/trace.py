"""``pdscale trace stats``: a trace's span, rate and length percentiles."""

from __future__ import annotations

import argparse
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_OK, POSITIVE, err, seed


def _cmd_trace_stats(args: argparse.Namespace) -> int:
    from pdscale.simulator import TraceError, load_trace, trace_stats

    try:
        trace = load_trace(args.trace, args.format, skip_bad_rows=args.skip_bad_rows,
                           seed=args.seed, duration_s=args.duration)
        trace = trace.scaled(args.scale, seed=args.seed)
    except TraceError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    print(trace_stats(trace).table())
    for note in trace.notes:
        print(f"note: {note}")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    trace = sub.add_parser("trace", help="inspect request traces")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)

    p = trace_sub.add_parser("stats", help="span, requests, rate and token-length percentiles",
                             description="Load a trace and print its span, request count, "
                                         "per-minute rate percentiles and token-length "
                                         "percentiles. TRACE is a file or 'synthetic'.")
    p.add_argument("trace")
    p.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "servegen",
                                        "synthetic"], help="default: from the name or header")
    p.add_argument("--scale", type=POSITIVE, default=1.0,
                   help="thin (<1) or multiply (>1) arrivals")
    p.add_argument("--duration", type=POSITIVE, help="seconds to load (ServeGen: default all, "
                   "which can be hundreds of millions of requests)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows and report how many")
    p.set_defaults(func=_cmd_trace_stats)
