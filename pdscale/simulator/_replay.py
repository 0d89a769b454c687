"""Replay a trace against a real OpenAI-compatible frontend (the loopback Dynamo stack) and
measure at the client what ``pdscale simulate`` measures in simulation.

Each request of the trace is sent at its arrival time as a streaming chat completion (SSE):
the prompt is made of the stack's vocabulary words, one word per token under the tiny model's
WordLevel tokenizer (``simulator._tinymodel``), so the frontend sees exactly the trace's
prompt tokens (checked against the ``usage`` it reports); ``max_tokens`` is the trace's output
length (the mocker generates exactly that many). Requests that share Mooncake prefix blocks
share the same words for those blocks, so prefix caching behaves as in the trace.

Measured per request: TTFT (send to first content chunk), mean ITL ((last - first token time)
/ (output tokens - 1), the simulator's TPOT), chunk gaps (for ITL percentiles), errors. The
summary has the simulator's fields (attainment over all requests, errors count as misses;
GPU-hours from sampled replica counts, one worker = ``gpus_per_replica`` GPUs, billed from its
creation to its exit like the simulator bills replicas).

Bounded by construction: loopback URLs only, a duration, an optional mean-rate cap (a denser
trace is thinned, keeping its shape), a request cap, an in-flight cap and a per-request
timeout; prompts longer than the tiny model's context are clipped to it. Whatever thinned,
cut or clipped the trace is said in the summary's ``notes``. Timing is real time: the clock
and the sleep are parameters for tests; a ``progress`` callback sees the requests as they go.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdscale.simulator._tinymodel import SPECIAL_TOKENS
from pdscale.simulator._trace import MOONCAKE_BLOCK_TOKENS, Trace

__all__ = [
    "PromptBuilder",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "RequestRecord",
    "replay",
    "replay_async",
    "vocabulary_from_model",
]


class ReplayError(ValueError):
    """The replay cannot run as asked (the message says what to change)."""


@dataclass(frozen=True)
class ReplayOptions:
    duration_s: float = 60.0
    """Seconds of trace replayed (from ``start_s``)."""
    start_s: float = 0.0
    max_rps: float | None = 20.0
    """Highest mean request rate sent; a denser window is thinned to it (None: none)."""
    max_requests: int = 5000
    max_in_flight: int = 256
    """Requests open at once; later ones wait (their delay is recorded, not hidden)."""
    request_timeout_s: float = 120.0
    max_prompt_tokens: int = 60000
    """Prompts are clipped to this (the tiny model's context is 65,536 tokens), and the
    summary says how many were."""
    max_output_tokens: int | None = None
    """Outputs are clipped to this (None: none)."""
    sample_s: float = 1.0
    """How often replica counts are sampled for GPU-hours."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("duration_s", "max_rps", "request_timeout_s", "sample_s"):
            value = getattr(self, name)
            if value is None and name == "max_rps":
                continue
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ReplayError(f"The '{name}' parameter of ReplayOptions must be a positive "
                                  f"number. Got {value!r}.")
        for name in ("max_requests", "max_in_flight", "max_prompt_tokens", "max_output_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ReplayError(f"The '{name}' parameter of ReplayOptions must be >= 1. "
                                  f"Got {getattr(self, name)!r}.")


@dataclass
class RequestRecord:
    index: int
    scheduled_s: float
    """Arrival time in the replay (seconds from its start)."""
    prompt_tokens: int
    max_tokens: int
    sent_s: float | None = None
    ttft_s: float | None = None
    itl_mean_s: float | None = None
    output_tokens: int = 0
    reported_prompt_tokens: int | None = None
    end_s: float | None = None
    error: str | None = None
    gaps_s: list[float] = field(default_factory=list, repr=False)

    @property
    def finished(self) -> bool:
        return self.error is None and self.end_s is not None

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("gaps_s")
        return out


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    requests: list[RequestRecord]
    replicas: list[tuple[float, dict[str, int]]]
    """(seconds from the start, workers per role) samples."""

    def files(self) -> dict[str, str]:
        """``summary.json`` and ``requests.jsonl`` (one request a line), sorted keys."""
        rows = "".join(json.dumps(r.row(), sort_keys=True) + "\n" for r in self.requests)
        return {"summary.json": json.dumps(self.summary, indent=2, sort_keys=True) + "\n",
                "requests.jsonl": rows}


def vocabulary_from_model(model_dir: Path) -> list[str]:
    """The words of a WordLevel ``tokenizer.json`` (special tokens left out), by id."""
    path = model_dir / "tokenizer.json"
    try:
        model = json.loads(path.read_text())["model"]
    except (OSError, ValueError, KeyError) as exc:
        raise ReplayError(f"{path}: not a readable tokenizer.json ({exc}); build the model "
                          "folder with simulator._tinymodel.build_tiny_model") from exc
    if model.get("type") != "WordLevel":
        raise ReplayError(f"{path}: a {model.get('type')} tokenizer; the replayer needs a "
                          "WordLevel one (one word = one token) to send exact prompt lengths")
    vocab: dict[str, int] = model["vocab"]
    return [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1])
            if w not in SPECIAL_TOKENS]


class PromptBuilder:
    """Prompts of an exact number of words; Mooncake prefix blocks map to fixed words."""

    def __init__(self, vocabulary: Sequence[str], *, seed: int = 0,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if not vocabulary:
            raise ReplayError("The 'vocabulary' parameter of PromptBuilder must not be empty.")
        if any(not w or any(c.isspace() for c in w) for w in vocabulary):
            raise ReplayError("The 'vocabulary' of PromptBuilder must be single words "
                              "without whitespace (one word is one token).")
        self.words = np.asarray(list(vocabulary), dtype=object)
        self.seed = seed
        self.block_tokens = block_tokens

    def _draw(self, n: int, key: tuple[int, ...]) -> list[str]:
        rng = np.random.default_rng([self.seed, *key])
        return list(self.words[rng.integers(0, len(self.words), size=n)])

    def prompt(self, n_tokens: int, *, index: int,
               hash_ids: Sequence[int] | None = None) -> str:
        n = max(1, int(n_tokens))
        words: list[str] = []
        for h in hash_ids or ():
            if len(words) >= n:
                break
            words += self._draw(self.block_tokens, (1, int(h) & 0x7FFFFFFFFFFFFFFF))
        if len(words) < n:
            words += self._draw(n - len(words), (2, index))
        return " ".join(words[:n])


def _check_loopback(url: str) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        loop = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise ReplayError(f"the replayer sends load only to a loopback address; got {url!r}: "
                          "use http://127.0.0.1:<port>")
    return url.rstrip("/")


def _prepare(trace: Trace, options: ReplayOptions) -> tuple[Trace, list[str]]:
    notes: list[str] = []
    window = trace.window(options.start_s, options.duration_s)
    if not len(window):
        raise ReplayError(f"{trace.name}: no requests between {options.start_s:g} s and "
                          f"{options.start_s + options.duration_s:g} s")
    rate = len(window) / options.duration_s
    if options.max_rps is not None and rate > options.max_rps:
        window = window.scaled(options.max_rps / rate, seed=options.seed)
        notes.append(f"thinned from {rate:.2f} to {options.max_rps:g} requests/s on average")
    if len(window) > options.max_requests:
        window = window.take(np.arange(options.max_requests))
        notes.append(f"cut to the first {options.max_requests} requests")
    long = int(np.sum(window.prompt_tokens > options.max_prompt_tokens))
    if long:
        notes.append(f"{long} prompt(s) clipped to {options.max_prompt_tokens} tokens")
        window = window.clipped(options.max_prompt_tokens)
    limit = options.max_output_tokens
    if limit is not None and int(np.sum(window.output_tokens > limit)):
        notes.append(f"{int(np.sum(window.output_tokens > limit))} output(s) clipped to "
                     f"{limit} tokens")
        window = replace(window, output_tokens=np.minimum(window.output_tokens, limit))
    return window, notes


async def _one(client: Any, url: str, model: str, prompt: str, rec: RequestRecord,
               now: Callable[[], float], t0: float, timeout_s: float) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": rec.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = now()
    rec.sent_s = sent - t0
    times: list[float] = []
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 timeout=timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"http {resp.status_code}: {text[:200]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = f"stream error: {str(chunk['error'])[:200]}"
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        times.append(now())
    except Exception as exc:  # any transport failure is this request's error
        rec.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return
    end = now()
    rec.end_s = end - t0
    if usage is not None:
        rec.reported_prompt_tokens = usage.get("prompt_tokens")
        rec.output_tokens = int(usage.get("completion_tokens") or len(times))
    else:
        rec.output_tokens = len(times)
    if not times:
        rec.error = "no tokens"
        return
    rec.ttft_s = times[0] - sent
    rec.gaps_s = [b - a for a, b in itertools.pairwise(times)]
    if rec.output_tokens > 1:
        rec.itl_mean_s = (times[-1] - times[0]) / (rec.output_tokens - 1)
    else:
        rec.itl_mean_s = 0.0


async def replay_async(trace: Trace, url: str, model: str, vocabulary: Sequence[str], *,
                       slo_ttft_s: float, slo_itl_s: float,
                       options: ReplayOptions | None = None,
                       replicas: Callable[[], Mapping[str, int]] | None = None,
                       gpus_per_replica: Mapping[str, int] | None = None,
                       now: Callable[[], float] = time.perf_counter,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                       transport: Any = None,
                       progress: Callable[[float, Sequence[RequestRecord]], None] | None = None,
                       progress_s: float = 10.0) -> ReplayResult:
    """Replay ``trace`` against the frontend at ``url`` (see the module docstring);
    ``progress(seconds, requests)`` is called every ``progress_s`` while it runs."""
    import httpx

    options = options or ReplayOptions()
    url = _check_loopback(url)
    window, notes = _prepare(trace, options)
    builder = PromptBuilder(vocabulary, seed=options.seed)
    records = [RequestRecord(i, float(window.arrival_s[i]),
                             int(window.prompt_tokens[i]),
                             max(1, int(window.output_tokens[i]))) for i in range(len(window))]
    gate = asyncio.Semaphore(options.max_in_flight)
    samples: list[tuple[float, dict[str, int]]] = []
    limits = httpx.Limits(max_connections=options.max_in_flight,
                          max_keepalive_connections=min(64, options.max_in_flight))
    t0 = now()
    done = asyncio.Event()

    async def sampler() -> None:
        while replicas is not None and not done.is_set():
            samples.append((now() - t0, dict(replicas())))
            await sleep(options.sample_s)

    async def reporter() -> None:
        while progress is not None and not done.is_set():
            await sleep(progress_s)
            if not done.is_set():
                progress(now() - t0, records)

    async def run(rec: RequestRecord) -> None:
        delay = rec.scheduled_s - (now() - t0)
        if delay > 0:
            await sleep(delay)
        hashes = window.hash_ids[rec.index] if window.hash_ids is not None else None
        prompt = builder.prompt(rec.prompt_tokens, index=rec.index,
                                hash_ids=None if hashes is None else hashes.tolist())
        async with gate:
            await _one(client, url, model, prompt, rec, now, t0, options.request_timeout_s)

    async with httpx.AsyncClient(limits=limits, transport=transport, trust_env=False) as client:
        sampling = asyncio.create_task(sampler())
        reporting = asyncio.create_task(reporter())
        await asyncio.gather(*(run(r) for r in records))
        done.set()
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting
        await sampling
    if replicas is not None:
        samples.append((now() - t0, dict(replicas())))
    wall = now() - t0
    summary = summarize(records, samples, slo_ttft_s=slo_ttft_s, slo_itl_s=slo_itl_s,
                        gpus_per_replica=gpus_per_replica or {}, wall_s=wall)
    summary.update({"mode": "replay", "trace": window.name, "url": url, "model": model,
                    "notes": notes, "options": asdict(options),
                    "slo": {"ttft_p95_s": slo_ttft_s, "itl_p95_s": slo_itl_s}})
    return ReplayResult(summary, records, samples)


def replay(trace: Trace, url: str, model: str, vocabulary: Sequence[str], *,
           slo_ttft_s: float, slo_itl_s: float, options: ReplayOptions | None = None,
           replicas: Callable[[], Mapping[str, int]] | None = None,
           gpus_per_replica: Mapping[str, int] | None = None,
           progress: Callable[[float, Sequence[RequestRecord]], None] | None = None,
           progress_s: float = 10.0) -> ReplayResult:
    """:func:`replay_async` on a new event loop."""
    return asyncio.run(replay_async(trace, url, model, vocabulary, slo_ttft_s=slo_ttft_s,
                                    slo_itl_s=slo_itl_s, options=options, replicas=replicas,
                                    gpus_per_replica=gpus_per_replica, progress=progress,
                                    progress_s=progress_s))


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def summarize(records: Sequence[RequestRecord], samples: Sequence[tuple[float, Mapping[str, int]]],
              *, slo_ttft_s: float, slo_itl_s: float, gpus_per_replica: Mapping[str, int],
              wall_s: float) -> dict[str, Any]:
    """The simulator's summary fields, from client measurements (pure)."""
    n = len(records)
    fin = [r for r in records if r.finished]
    ttft_ok = [r for r in fin if r.ttft_s is not None and r.ttft_s <= slo_ttft_s]
    itl_ok = [r for r in fin if r.itl_mean_s is not None and r.itl_mean_s <= slo_itl_s]
    both = [r for r in ttft_ok if r.itl_mean_s is not None and r.itl_mean_s <= slo_itl_s]
    ttfts = [r.ttft_s for r in fin if r.ttft_s is not None]
    gaps = [g for r in fin for g in r.gaps_s]
    tpots = [r.itl_mean_s for r in fin if r.itl_mean_s is not None]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            kind = r.error.split(":", 1)[0]
            errors[kind] = errors.get(kind, 0) + 1
    pools: dict[str, Any] = {}
    total: float | None = None
    roles = sorted({role for _, counts in samples for role in counts})
    if len(samples) >= 2:
        total = 0.0
        for role in roles:
            seconds = sum((b[0] - a[0]) * a[1].get(role, 0)
                          for a, b in itertools.pairwise(samples))
            span = max(samples[-1][0] - samples[0][0], 1e-9)
            gpu_h = seconds * gpus_per_replica.get(role, 1) / 3600
            total += gpu_h
            pools[role] = {"gpu_hours": gpu_h, "mean_replicas": seconds / span,
                           "peak_replicas": max(c.get(role, 0) for _, c in samples),
                           "busy_share": None}
    changes = sum(1 for a, b in itertools.pairwise(samples) if a[1] != b[1])
    mismatched = sum(1 for r in fin if r.reported_prompt_tokens is not None
                     and r.reported_prompt_tokens != r.prompt_tokens)
    delays = [r.sent_s - r.scheduled_s for r in records if r.sent_s is not None]
    return {
        "requests": n,
        "finished": len(fin),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "slo_attainment": len(both) / max(n, 1),
        "ttft_attainment": len(ttft_ok) / max(n, 1),
        "itl_attainment": len(itl_ok) / max(n, 1),
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p95_s": _pct(ttfts, 95),
        "ttft_p99_s": _pct(ttfts, 99),
        "itl_p50_s": _pct(gaps, 50),
        "itl_p95_s": _pct(gaps, 95),
        "tpot_p95_s": _pct(tpots, 95),
        "gpu_hours": total,
        "scale_actions": changes if samples else None,
        "preemptions": None,
        "rerouted_requests": None,
        "simulated_s": wall_s,
        "wall_s": wall_s,
        "pools": pools,
        "prompt_token_mismatches": mismatched,
        "client_delay_max_s": max(delays) if delays else None,
        "output_tokens": sum(r.output_tokens for r in fin),
    }
