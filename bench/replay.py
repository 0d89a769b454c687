"""Replay a trace against a real Dynamo stack on loopback and measure it at the client.

    .venv/bin/python bench/replay.py --trace synthetic --duration 120 --max-rps 5
    .venv/bin/python bench/replay.py --stack-dir .pdscale-up/dynamo --trace trace.csv

(``pdscale load`` is the command for a stack ``pdscale up`` runs: it prints progress too.)

Without ``--stack-dir`` it starts the spec's first dynamo service (``simulator._stack``, each
pool at ``--prefill``/``--decode`` workers, kept at size by the process actuator) and stops it
after; with it, it replays against the stack ``pdscale up --engine dynamo`` left running. The
trace is any format ``pdscale simulate`` reads (Azure, Mooncake, BurstGPT, ServeGen,
synthetic), sent as it is unless ``--max-rps`` thins it or ``--max-prompt-tokens`` /
``--max-output-tokens`` clip it (prompts beyond the tiny model's context are clipped to
60,000 tokens); what was thinned or clipped is printed. Writes ``summary.json`` (the
simulator's fields, measured at the client) and ``requests.jsonl`` to ``--out`` and prints
the headline.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdscale.simulator._replay import ReplayOptions, replay, vocabulary_from_model  # noqa: E402
from pdscale.simulator._stack import DynamoStack  # noqa: E402
from pdscale.simulator._trace import load_trace  # noqa: E402
from pdscale.spec import Engine, Role, load_spec  # noqa: E402


def _recorded_replicas(stack_dir: Path) -> Callable[[], Mapping[str, int]]:
    def counts() -> dict[str, int]:
        try:
            pools = json.loads((stack_dir / "workers.json").read_text())["pools"]
        except (OSError, ValueError, KeyError):
            return {}
        return {key.rsplit("/", 1)[1]: len(pool["workers"]) for key, pool in pools.items()}

    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "examples" / "dynamo.yaml"))
    parser.add_argument("--stack-dir", help="a running stack (pdscale up --engine dynamo)")
    parser.add_argument("--trace", default="synthetic")
    parser.add_argument("--format", dest="fmt")
    parser.add_argument("--start", type=float, default=0.0, help="trace seconds to skip")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-rps", type=float, help="thin to this mean rate (default: none)")
    parser.add_argument("--max-prompt-tokens", type=int, default=60000)
    parser.add_argument("--max-output-tokens", type=int, help="default: none")
    parser.add_argument("--prefill", type=int, help="workers (default: the pool's min)")
    parser.add_argument("--decode", type=int, help="workers (default: the pool's min)")
    parser.add_argument("--out", default=str(ROOT / "out" / "replay"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    spec = load_spec(args.spec)
    service = next(s for s in spec.services if s.engine is Engine.DYNAMO)
    trace = load_trace(args.trace, args.fmt, seed=args.seed,
                       duration_s=args.start + args.duration)
    options = ReplayOptions(duration_s=args.duration, start_s=args.start, max_rps=args.max_rps,
                            max_prompt_tokens=args.max_prompt_tokens,
                            max_output_tokens=args.max_output_tokens, seed=args.seed)
    gpus = {r.value: service.pools[r].gpus_per_replica for r in Role}
    stack: DynamoStack | None = None
    if args.stack_dir:
        folder = Path(args.stack_dir)
        state = json.loads((folder / "stack.json").read_text())
        url, model_dir = f"http://127.0.0.1:{state['frontend']['port']}", folder / "model"
        replicas = _recorded_replicas(folder)
    else:
        counts = {r: n for r, n in ((Role.PREFILL, args.prefill), (Role.DECODE, args.decode))
                  if n is not None}
        stack = DynamoStack(service, Path(args.out) / "stack", replicas=counts).start()
        stack.supervise()
        url, model_dir, replicas = stack.frontend_url, stack.model_dir, stack.replica_counts
    try:
        result = replay(trace, url, service.model_name, vocabulary_from_model(model_dir),
                        slo_ttft_s=service.slo.ttft_p95_s, slo_itl_s=service.slo.itl_p95_s,
                        options=options, replicas=replicas, gpus_per_replica=gpus)
    finally:
        if stack is not None:
            stack.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in result.files().items():
        (out / name).write_text(text)
    s = result.summary
    for note in s["notes"]:
        print(f"note: {note}")
    print(f"{s['requests']} requests, {s['finished']} finished, {s['errors']} errors; "
          f"SLO attainment {s['slo_attainment']:.3f} (TTFT {s['ttft_attainment']:.3f}, "
          f"ITL {s['itl_attainment']:.3f}); TTFT p95 {s['ttft_p95_s'] or float('nan'):.3f} s, "
          f"ITL p95 {s['itl_p95_s'] or float('nan'):.4f} s; GPU-hours {s['gpu_hours'] or 0:.4f}")
    print(f"wrote {out}/summary.json and requests.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
