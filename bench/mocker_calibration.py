"""The mocker's timing on the loopback stack, request by request, against its profile.

    PYTHONPATH=. .venv/bin/python bench/mocker_calibration.py [--repeats 5] [--gap 1.5]

Starts a static 1+1 ``pdscale._stackrun.StackRun`` (the Dynamo 1.6.1 frontend and router, one
mocker prefill and one decode worker, no controller) and sends isolated streaming requests,
one at a time with ``--gap`` seconds between them, of fixed prompt lengths (16 to 32,768
tokens, two output tokens), so no request waits for another: each TTFT is the mocker's prefill
plus what the stack adds around it. For every length it prints the client TTFT (median and
spread over ``--repeats``), the profile's prefill time for that length
(``pdscale/controller/profiles/dynamo-mocker-1.6.1.yaml``) and their difference, the overhead,
beside what the profile expects for that length (``ttft_overhead_ms``, ``frontend_ms_per_1k_tokens``
and the KV transfer), and fits the overhead as a fixed part plus a part per prompt token. The
real-stack benchmark's windows are not used for that fit, so a profile set from it is not
judged on its own training data there (only the split of the per-token part, before or after
the prefill, comes from a Mooncake window: see ``fit_overhead``).

Writes bench/results/mocker-calibration.json. Needs .venv-dynamo (scripts/dynamo-setup.sh) and
prometheus (scripts/system-deps.sh); about two minutes.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # after the packages: bench/controller.py is a script

from stack import MOCKER_PROFILE, TRACES, _warm, write_spec  # noqa: E402

from pdscale.controller import load_profile  # noqa: E402
from pdscale.spec import Role  # noqa: E402

LENGTHS = (16, 512, 2048, 4096, 8192, 12288, 16384, 32768)
PROFILE = load_profile(str(MOCKER_PROFILE))


def schedule(lengths: tuple[int, ...], repeats: int, gap_s: float, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times and prompt lengths: every length ``repeats`` times, in a shuffled order
    (so a drift over the run does not fall on one length), ``gap_s`` apart after the longest
    prefill the profile expects."""
    rng = np.random.default_rng(seed)
    prompts = np.repeat(np.asarray(lengths, dtype=np.int64), repeats)
    rng.shuffle(prompts)
    arrivals = np.zeros(len(prompts))
    t = 0.0
    for i, length in enumerate(prompts):
        arrivals[i] = t
        t += PROFILE.prefill_ms(float(length)) / 1000 + gap_s
    return arrivals, prompts


def summarize(prompts: np.ndarray, ttfts: list[float | None]) -> list[dict[str, Any]]:
    """Per prompt length: the client TTFTs, the profile's prefill and the difference, and the
    overhead the profile expects for that length (its fixed share, the frontend's share per
    prompt token and the KV transfer; pure)."""
    rows = []
    for length in sorted(set(int(p) for p in prompts)):
        got = [t for p, t in zip(prompts, ttfts, strict=True) if int(p) == length and t is not None]
        prefill = PROFILE.prefill_ms(float(length)) / 1000
        median = float(np.median(got)) if got else None
        rows.append({
            "prompt_tokens": length, "requests": len(got),
            "ttft_median_s": median,
            "ttft_min_s": float(min(got)) if got else None,
            "ttft_max_s": float(max(got)) if got else None,
            "profile_prefill_s": prefill,
            "overhead_s": None if median is None else median - prefill,
            "profile_overhead_s": (PROFILE.overhead_ms(float(length)) +
                                   PROFILE.kv_transfer_ms(float(length))) / 1000,
        })
    return rows


def fit_overhead(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The overhead as ``fixed + per_1k * tokens / 1000`` ms, least squares over the lengths
    (None with fewer than two measured lengths). Requests sent one at a time cannot say which
    part comes before the prefill: the profile puts the share that orders prompts sent together
    (``frontend_ms_per_1k_tokens``, fitted on the Mooncake window's requests) there and the rest
    after it, as its KV transfer."""
    got = [(r["prompt_tokens"], 1000 * r["overhead_s"]) for r in rows
           if r["overhead_s"] is not None]
    if len({length for length, _ in got}) < 2:
        return None
    x = np.array([length / 1000 for length, _ in got])
    y = np.array([ms for _, ms in got])
    per_1k, fixed = np.polyfit(x, y, 1)
    return float(fixed), float(per_1k)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| prompt tokens | requests | client TTFT median (min-max) s | profile prefill s | "
             "TTFT - prefill ms | the profile's overhead ms |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        expected = f"{1000 * r['profile_overhead_s']:.0f}"
        if r["ttft_median_s"] is None:
            lines.append(f"| {r['prompt_tokens']} | 0 | n/a | {r['profile_prefill_s']:.3f} | "
                         f"n/a | {expected} |")
            continue
        lines.append(f"| {r['prompt_tokens']} | {r['requests']} | {r['ttft_median_s']:.3f} "
                     f"({r['ttft_min_s']:.3f}-{r['ttft_max_s']:.3f}) | "
                     f"{r['profile_prefill_s']:.3f} | {1000 * r['overhead_s']:.0f} | "
                     f"{expected} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="requests per prompt length")
    parser.add_argument("--gap", type=float, default=1.5,
                        help="idle seconds between one request's expected end and the next")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" /
                                             "mocker-calibration.json"))
    args = parser.parse_args()
    if args.repeats < 1 or not args.gap > 0:
        parser.error("--repeats must be at least 1 and --gap positive")

    from pdscale._stackrun import StackRun
    from pdscale.simulator._replay import ReplayOptions, replay, vocabulary_from_model
    from pdscale.simulator._stack import dynamo_python
    from pdscale.simulator._trace import Trace
    from pdscale.spec import load_spec

    arrivals, prompts = schedule(LENGTHS, args.repeats, args.gap)
    trace = Trace("calibration", arrivals, prompts, np.full(len(prompts), 2, dtype=np.int64))
    window = TRACES["azure"]
    print(f"{len(prompts)} isolated requests over {arrivals[-1]:.0f} s on a static 1+1 stack",
          flush=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="pdscale-mocker-calibration-") as tmp:
        folder = Path(tmp)
        spec = load_spec(write_spec(folder, window, cold_start_s=0.0, max_replicas=1,
                                    speedup=1.0))
        run = StackRun(spec, folder / "stack", python=dynamo_python(),
                       replicas={Role.PREFILL: 1, Role.DECODE: 1}, controller=False,
                       scrape_interval_s=2.0)
        try:
            run.start()
            _warm(run, controller=False)
            result = replay(trace, run.stack.frontend_url, spec.services[0].model_name,
                            vocabulary_from_model(run.stack.model_dir),
                            slo_ttft_s=window.ttft_slo_s, slo_itl_s=window.itl_slo_s,
                            options=ReplayOptions(duration_s=float(arrivals[-1]) + 1.0,
                                                  max_rps=1000.0, max_requests=10_000,
                                                  request_timeout_s=60.0,
                                                  max_prompt_tokens=max(LENGTHS)))
        finally:
            run.stop()
    by_index = {r.index: r for r in result.requests}
    ttfts = [by_index[i].ttft_s if i in by_index and by_index[i].finished else None
             for i in range(len(prompts))]
    rows = summarize(prompts, ttfts)
    overheads = [r["overhead_s"] for r in rows if r["overhead_s"] is not None]
    print()
    print(table(rows))
    fit = fit_overhead(rows)
    if fit is not None:
        print(f"TTFT - prefill = {fit[0]:.1f} ms + {fit[1]:.2f} ms per 1,000 prompt tokens (the "
              f"profile: {PROFILE.ttft_overhead_ms:g} ms fixed, "
              f"{PROFILE.frontend_ms_per_1k_tokens:g} ms per 1,000 before the prefill, and its KV "
              f"transfer, {PROFILE.kv_latency_ms:g} ms + "
              f"{PROFILE.kv_transfer_ms(1000.0) - PROFILE.kv_latency_ms:.2f} ms per 1,000)")
    errors = sum(1 for t in ttfts if t is None)
    out = {"bench": "mocker_calibration", "python": platform.python_version(),
           "profile": PROFILE.name, "profile_overhead_ms": PROFILE.ttft_overhead_ms,
           "profile_frontend_ms_per_1k_tokens": PROFILE.frontend_ms_per_1k_tokens,
           "overhead_fit_ms": None if fit is None else {"fixed": fit[0], "per_1k_tokens": fit[1]},
           "repeats": args.repeats, "gap_s": args.gap, "failed_requests": errors,
           "wall_s": time.time() - started, "rows": rows,
           "median_overhead_ms": 1000 * float(np.median(overheads)) if overheads else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(args.out).with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(out, indent=1) + "\n")
    tmp_out.replace(args.out)
    print(f"wrote {args.out}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
