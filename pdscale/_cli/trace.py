"""``pdscale trace``: a trace's statistics (``stats``), the public traces (``list``) and
downloading them (``fetch``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    POSITIVE,
    err,
    seed,
)


def _cmd_trace_stats(args: argparse.Namespace) -> int:
    from pdscale.simulator import TraceError, load_trace, resolve_trace, trace_stats, traces_dir

    try:
        path = resolve_trace(args.trace, traces_dir(args.traces))
        trace = load_trace(path, args.format, skip_bad_rows=args.skip_bad_rows,
                           seed=args.seed, duration_s=args.duration)
        trace = trace.scaled(args.scale, seed=args.seed)
    except TraceError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    print(trace_stats(trace).table())
    for note in trace.notes:
        print(f"note: {note}")
    return EXIT_OK


def _cmd_trace_list(args: argparse.Namespace) -> int:
    from pdscale.simulator import PUBLIC_TRACES, traces_dir

    folder = traces_dir(args.traces)
    print(f"traces folder: {folder}")
    for trace in PUBLIC_TRACES.values():
        print(f"\n{trace.name}: {trace.summary}")
        print(f"  source:  {trace.source_label} (commit {trace.commit[:7]})")
        print(f"  licence: {trace.licence}")
        for file in trace.files:
            where = "present" if (folder / file.name).is_file() else "missing"
            print(f"  file:    {file.name} ({where})")
    return EXIT_OK


def _cmd_trace_fetch(args: argparse.Namespace) -> int:
    from pdscale.simulator import (
        PUBLIC_TRACES,
        TraceFetchError,
        fetch_trace,
        traces_dir,
    )

    names = list(PUBLIC_TRACES) if args.name == ["all"] else args.name
    if unknown := [n for n in names if n not in PUBLIC_TRACES]:
        err(f"unknown trace(s) {', '.join(unknown)}; use any of {', '.join(PUBLIC_TRACES)} "
            "or 'all' (`pdscale trace list` describes them)")
        return EXIT_BAD_INPUT
    folder = traces_dir(args.to)
    done: list[str] = []
    try:
        for name in names:
            written = fetch_trace(name, folder, base_url=args.base_url, force=args.force,
                                  progress=lambda line: print(line, file=sys.stderr,
                                                              flush=True))
            done.append(name)
            for path in written:
                print(f"{name}: {path}")
    except TraceFetchError as exc:  # TraceUnavailable included: both end the run
        err(f"{exc}{_kept(done)}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"pdscale: interrupted; no file half-written{_kept(done)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _kept(done: list[str]) -> str:
    return f" ({', '.join(done)} fetched before it, and kept)" if done else ""


def _fetch_epilog() -> str:
    from pdscale.simulator import BASE_URL_ENV, PUBLIC_TRACES, TRACES_ENV

    lines = ["traces (name (licence): summary; source repository : path; files written):"]
    for trace in PUBLIC_TRACES.values():
        lines += [f"  {trace.name} ({trace.licence}): {trace.summary}",
                  f"      {trace.source_label}",
                  *(f"      -> {f.name}" for f in trace.files)]
    lines += ["",
              "Each file's content is checked against the SHA-256 of the copies the "
              "benchmarks\nran on; a file is written only once it matches, by renaming a "
              "temporary file.\nServeGen's token-length files cannot be rebuilt from the "
              "source and are not\nfetched: a ServeGen replay without one draws lengths from "
              "the synthetic mix.",
              "",
              f"--to defaults to ${TRACES_ENV}, else ~/.local/share/pdscale/traces; "
              "`pdscale\nsimulate --trace NAME` and `pdscale trace stats NAME` read the same "
              f"folder.\n${BASE_URL_ENV} sets the base URL as --base-url does.",
              "",
              "exit status: 0 fetched (or already there), 1 a download or hash check "
              "failed,\n2 an unknown name, 130 interrupted (nothing half-written is left)."]
    return "\n".join(lines)


_FETCH_EPILOG = "{traces}"
"""Stands for :func:`_fetch_epilog` until help is shown: the list comes from the simulator's
catalog, which the parser does not import at start-up (it pulls in numpy)."""


class _FetchHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Writes the catalog's list in place of :data:`_FETCH_EPILOG` when help is formatted."""

    def add_text(self, text: str | None) -> None:
        super().add_text(_fetch_epilog() if text == _FETCH_EPILOG else text)


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    trace = sub.add_parser("trace", help="inspect, list and fetch request traces")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    traces_help = ("folder of the public traces, where a trace's short name is looked up "
                   "(default: $PDSCALE_TRACES, else ~/.local/share/pdscale/traces)")

    p = trace_sub.add_parser("stats", help="span, requests, rate and token-length percentiles",
                             description="Load a trace and print its span, request count, "
                                         "per-minute rate percentiles and token-length "
                                         "percentiles. TRACE is a file, 'synthetic', or a "
                                         "public trace's name in --traces "
                                         "(`pdscale trace list`).")
    p.add_argument("trace")
    p.add_argument("--traces", metavar="DIR", help=traces_help)
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

    p = trace_sub.add_parser("list", help="the public traces: files, source, licence, present",
                             description="List the public traces `pdscale trace fetch` "
                                         "downloads: short name, files, source, licence, and "
                                         "whether each file is in the traces folder.")
    p.add_argument("--traces", metavar="DIR", help=traces_help)
    p.set_defaults(func=_cmd_trace_list)

    p = trace_sub.add_parser("fetch", help="download public traces into the traces folder",
                             description="Download public traces from their sources (pinned "
                                         "commits on GitHub), rebuild the files\nthe "
                                         "simulator and benchmarks read, check their "
                                         "SHA-256 and write them into --to.",
                             epilog=_FETCH_EPILOG, formatter_class=_FetchHelpFormatter)
    p.add_argument("name", nargs="+", metavar="NAME", help="a trace's short name, or 'all'")
    p.add_argument("--to", metavar="DIR", help="folder to write into (created if missing; "
                   "default: $PDSCALE_TRACES, else ~/.local/share/pdscale/traces)")
    p.add_argument("--base-url", metavar="URL",
                   help="download from URL/{repository}/{commit}/{path} instead of "
                        "https://raw.githubusercontent.com (a mirror)")
    p.add_argument("--force", action="store_true",
                   help="download again even when the files are there and verified")
    p.set_defaults(func=_cmd_trace_fetch)
