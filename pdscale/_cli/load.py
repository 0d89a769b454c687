"""``pdscale load``: replay a trace against the Dynamo stack ``pdscale up --engine dynamo``
runs, as streaming chat completions, with progress while it runs and a summary at the end.

The trace is sent as it is: nothing is thinned, cut or clipped unless an option asks for it
(``--max-rps``, ``--max-requests``, ``--max-output-tokens``, ``--max-prompt-tokens``), except
prompts longer than the stack's tiny model's context (65,536 tokens), clipped to 60,000; every
one of these is said in the summary. Measured at the client (``simulator._replay``): TTFT, ITL,
errors, SLO attainment against the stack's spec, worker-hours from the workers the controller
ran."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    NON_NEGATIVE,
    POSITIVE,
    count,
    err,
    seed,
)


def _stack(folder: Path) -> tuple[dict[str, Any], Path] | str:
    """(the stack's state, its spec file), or why there is no Dynamo stack to load."""
    state_file = folder / "dynamo" / "stack.json"
    if not state_file.is_file():
        return (f"no Dynamo stack in {folder} (no dynamo/stack.json): start one with pdscale "
                f"up --engine dynamo --dir {folder}; the simulated stack (--engine sim) "
                "replays its own trace")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        port = int(state["frontend"]["port"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"cannot read {state_file} ({exc}): restart the stack (pdscale down, pdscale up)"
    if port <= 0:
        return f"{state_file} names no frontend port: restart the stack"
    return state, folder / "spec.yaml"


def _pct(values: Sequence[float], q: float) -> str:
    import numpy as np

    return f"{float(np.percentile(values, q)):.3g}s" if values else "-"


def _progress(total: int) -> Any:
    def show(elapsed_s: float, records: Sequence[Any]) -> None:
        sent = [r for r in records if r.sent_s is not None]
        done = [r for r in sent if r.end_s is not None or r.error is not None]
        failed = sum(1 for r in done if r.error is not None)
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        gaps = [g for r in done for g in r.gaps_s]
        print(f"  {elapsed_s:5.0f}s  sent {len(sent)}/{total}, done {len(done)}, failed "
              f"{failed}, in flight {len(sent) - len(done)}; TTFT p95 {_pct(ttft, 95)}, "
              f"ITL p95 {_pct(gaps, 95)}", flush=True)

    return show


def _cmd_load(args: argparse.Namespace) -> int:
    from pdscale.simulator import (
        ReplayError,
        ReplayOptions,
        TraceError,
        load_trace,
        replay,
        vocabulary_from_model,
    )
    from pdscale.spec import Role, SpecError, load_spec

    folder = Path(args.dir)
    found = _stack(folder)
    if isinstance(found, str):
        err(found)
        return EXIT_BAD_INPUT
    state, spec_file = found
    try:
        spec = load_spec(spec_file)
        service = spec.service(str(state.get("service")))
    except (SpecError, OSError, KeyError, ValueError) as exc:
        err(f"cannot read the stack's spec {spec_file} ({exc}): restart the stack")
        return EXIT_BAD_INPUT
    try:
        trace = load_trace(args.trace, args.format, seed=args.seed,
                           duration_s=args.start + args.duration)
        window = trace.window(args.start, args.duration)
        options = ReplayOptions(duration_s=args.duration, start_s=args.start,
                                max_rps=args.max_rps,
                                max_requests=args.max_requests or max(1, len(window)),
                                max_prompt_tokens=args.max_prompt_tokens,
                                max_output_tokens=args.max_output_tokens, seed=args.seed,
                                request_timeout_s=args.timeout)
    except (TraceError, ReplayError, OSError, ValueError) as exc:
        err(f"--trace {args.trace}: {exc}")
        return EXIT_BAD_INPUT
    workers = folder / "dynamo" / "workers.json"

    def replicas() -> dict[str, int]:
        try:
            pools = json.loads(workers.read_text())["pools"]
        except (OSError, ValueError, KeyError):
            return {}
        return {key.rsplit("/", 1)[1]: len(pool["workers"]) for key, pool in pools.items()}

    url = f"http://127.0.0.1:{state['frontend']['port']}"
    total = min(len(window), options.max_requests)
    print(f"pdscale load: {total} requests of {trace.name} over {args.duration:g}s to {url} "
          f"(model {service.model_name}); progress every {args.progress_every:g}s",
          flush=True)
    try:
        result = replay(trace, url, service.model_name,
                        vocabulary_from_model(folder / "dynamo" / "model"),
                        slo_ttft_s=service.slo.ttft_p95_s, slo_itl_s=service.slo.itl_p95_s,
                        options=options, replicas=replicas,
                        gpus_per_replica={r.value: service.pools[r].gpus_per_replica
                                          for r in Role},
                        progress=_progress(total), progress_s=args.progress_every)
    except ReplayError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    except OSError as exc:
        err(f"cannot read the stack's model in {folder / 'dynamo' / 'model'} ({exc}): restart "
            "the stack")
        return EXIT_FAILURE
    _report(result.summary)
    return _write(args.out, result.files()) if args.out else EXIT_OK


def _report(s: dict[str, Any]) -> None:
    """The replay's summary, as ``pdscale load`` prints it."""
    for note in s["notes"]:
        print(f"note: {note}")
    print(f"{s['requests']} requests, {s['finished']} finished, {s['errors']} failed; SLO "
          f"attainment {s['slo_attainment']:.3f} (TTFT {s['ttft_attainment']:.3f}, ITL "
          f"{s['itl_attainment']:.3f}); TTFT p50/p95 {_s(s['ttft_p50_s'])}/"
          f"{_s(s['ttft_p95_s'])}, ITL p50/p95 {_s(s['itl_p50_s'])}/{_s(s['itl_p95_s'])}")
    pools = s.get("pools") or {}
    if pools:
        print("workers: " + ", ".join(f"{role} mean {p['mean_replicas']:.2f} (peak "
                                      f"{p['peak_replicas']})" for role, p in pools.items()))
    if s["errors"]:
        print("errors: " + ", ".join(f"{k} x{n}" for k, n in s["error_kinds"].items()))


def _write(where: str, files: dict[str, str]) -> int:
    out = Path(where)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
    except OSError as exc:
        err(f"cannot write {out} ({exc.strerror}); choose an --out you can write to")
        return EXIT_FAILURE
    print(f"wrote {out}/summary.json and requests.jsonl")
    return EXIT_OK


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}s"


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "load", help="replay a trace against the Dynamo stack pdscale up runs",
        description="Send a trace to the Dynamo stack in --dir (pdscale up --engine dynamo) "
                    "as streaming chat completions, each at its arrival time, and measure it "
                    "at the client: progress while it runs, a summary at the end. Nothing is "
                    "thinned, cut or clipped unless an option asks for it (prompts longer than "
                    "the stack's model context are clipped to 60,000 tokens); the summary says "
                    "what was. The trace is any format pdscale simulate reads.",
        epilog="examples:\n"
               "  pdscale load --trace synthetic --duration 120 --max-rps 5\n"
               "  pdscale load --trace azure_conv.csv --start 600 --duration 300 --out out/load",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=".pdscale-up", help="the folder pdscale up used")
    p.add_argument("--trace", default="synthetic",
                   help="a trace file (Azure, Mooncake, BurstGPT, ServeGen) or 'synthetic' "
                        "(20 requests/s on average, with bursts)")
    p.add_argument("--format", help="the trace's format (default: detected)")
    p.add_argument("--start", type=NON_NEGATIVE, default=0.0,
                   help="trace seconds to skip (default 0)")
    p.add_argument("--duration", type=POSITIVE, default=60.0,
                   help="seconds of trace to replay (default 60)")
    p.add_argument("--max-rps", type=POSITIVE,
                   help="thin the trace to this mean request rate (default: as it is)")
    p.add_argument("--max-requests", type=count,
                   help="send at most this many requests (default: all)")
    p.add_argument("--max-prompt-tokens", type=count, default=60000,
                   help="clip longer prompts to this (default 60000, within the stack's "
                        "model context)")
    p.add_argument("--max-output-tokens", type=count,
                   help="clip longer outputs to this (default: as they are)")
    p.add_argument("--timeout", type=POSITIVE, default=120.0,
                   help="seconds a request may take (default 120)")
    p.add_argument("--progress-every", type=POSITIVE, default=10.0,
                   help="seconds between progress lines (default 10)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", help="write summary.json and requests.jsonl here")
    p.set_defaults(func=_cmd_load)
