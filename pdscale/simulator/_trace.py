"""Request traces: loaders for public production formats, a seeded synthetic default, stats.

A :class:`Trace` holds one row per request as numpy arrays (arrival seconds from the first
request, prompt and output tokens, optional prefix-block hashes). Formats:

* ``azure``: Azure LLM inference traces, ``TIMESTAMP,ContextTokens,GeneratedTokens``; both the
  2023 (``2023-11-16 18:17:03.9799600``) and 2024 (``2024-05-10 00:00:00.009930+00:00``)
  timestamp styles.
* ``burstgpt``: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
  (seconds from the trace start).
* ``mooncake``: JSON lines with ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (512-token prefix blocks); plain or gzip. A file that is one JSON array of the
  same objects (a JSON-lines trace re-saved by ``json.dump``) is read too: a JSON-lines file
  cannot start with ``[``, so the two cannot be confused.
* ``servegen``: ServeGen per-client rate windows (``client_id, window_start_s, rate_rps, cv,
  arrival_dist, dist_param1, dist_param2``), rebuilt into arrivals as ServeGen's own generator
  does: ceil(rate x window) inter-arrival gaps drawn from the client's Gamma or Weibull
  distribution, rescaled to fill the window; token lengths drawn from the per-6-hour quantiles
  of a length file (``servegen_token_lengths_6h``). Fourteen days of ServeGen are hundreds of
  millions of requests: :func:`simulator._servegen.servegen_load_series` aggregates them for the
  fluid simulator without materialising them, and :func:`load_trace` takes a
  ``start_s``/``duration_s`` window. The loader is :mod:`simulator._servegen`.
* ``synthetic``: the embedded default (:func:`synthetic_trace`): a daily cycle, random bursts,
  and a mixture of chat, retrieval-augmented and code requests, fully determined by a seed.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FORMATS",
    "Trace",
    "TraceError",
    "TraceStats",
    "detect_format",
    "load_trace",
    "synthetic_trace",
    "trace_stats",
]

FORMATS = ("azure", "burstgpt", "mooncake", "servegen", "synthetic")
MOONCAKE_BLOCK_TOKENS = 512
MAX_TOKENS = 2**31 - 1
"""Largest token count a row may give (far beyond any context; more is a corrupt row)."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceError(ValueError):
    """A trace cannot be read: the message names the file, line and column, and the fix."""


def check_max_prompt_tokens(max_prompt_tokens: int) -> None:
    """Refuse a prompt-length cap below one token (a trace's or a fluid load's)."""
    if max_prompt_tokens < 1:
        raise TraceError(f"max_prompt_tokens must be at least 1 (None: no clipping); got "
                         f"{max_prompt_tokens}")


@dataclass(frozen=True)
class Trace:
    name: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    hash_ids: list[IntArray] | None = None
    start: datetime | None = None
    """Wall-clock time of arrival 0, when the format records one."""
    skipped_rows: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def take(self, index: IntArray) -> Trace:
        hashes = [self.hash_ids[i] for i in index] if self.hash_ids is not None else None
        return replace(self, arrival_s=self.arrival_s[index],
                       prompt_tokens=self.prompt_tokens[index],
                       output_tokens=self.output_tokens[index], hash_ids=hashes)

    def window(self, start_s: float, duration_s: float) -> Trace:
        mask = (self.arrival_s >= start_s) & (self.arrival_s < start_s + duration_s)
        out = self.take(np.flatnonzero(mask))
        return replace(out, arrival_s=out.arrival_s - start_s)

    def clipped(self, max_prompt_tokens: int) -> Trace:
        """Prompts longer than ``max_prompt_tokens`` cut to it, as a model's context limit cuts
        them (a replay against a real stack sends them so)."""
        check_max_prompt_tokens(max_prompt_tokens)
        return replace(self, prompt_tokens=np.minimum(self.prompt_tokens, max_prompt_tokens))

    def scaled(self, factor: float, *, seed: int = 0) -> Trace:
        """Thin (factor < 1) or multiply (factor > 1) arrivals, keeping the time pattern.

        Each request is kept floor(factor) times plus once more with probability
        frac(factor); copies arrive within a second of the original (uniform jitter)."""
        if not factor > 0 or not math.isfinite(factor):
            raise TraceError(f"--scale must be a positive number, got {factor!r}")
        if factor == 1:
            return self
        rng = np.random.default_rng(seed)
        copies = np.floor(factor).astype(np.int64) + (rng.random(len(self)) < factor % 1)
        index = np.repeat(np.arange(len(self)), copies)
        out = self.take(index)
        jitter = rng.random(len(index))
        first = np.ones(len(index), dtype=bool)
        first[1:] = index[1:] != index[:-1]
        arrivals = out.arrival_s + np.where(first, 0.0, jitter)
        order = np.argsort(arrivals, kind="stable")
        out = out.take(order)
        return replace(out, arrival_s=arrivals[order], name=f"{self.name} x{factor:g}")


# --------------------------------------------------------------------------------------------


def _check_file(path: Path) -> None:
    """Raise TraceError unless ``path`` is an existing file (checked before it is opened, so
    a typo or a folder is one clear line)."""
    if not path.exists():
        raise TraceError(f"{path}: no such file; give a trace path or 'synthetic'")
    if not path.is_file():
        raise TraceError(f"{path}: a folder, not a trace file; give the file's path")


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn a corrupt or truncated file's errors into a TraceError naming it."""
    try:
        yield
    except (OSError, EOFError, UnicodeDecodeError, zlib.error, csv.Error) as exc:
        # gzip.BadGzipFile is an OSError; a truncated gzip ends in EOFError.
        raise TraceError(f"{path}: cannot be read as a trace ({type(exc).__name__}: {exc}); "
                         "check that the file is complete (a truncated download?) and its "
                         "format") from exc


def detect_format(path: Path) -> str:
    name = path.name.lower()
    for fmt in ("mooncake", "servegen", "burstgpt", "azure"):
        if fmt in name:
            return fmt
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "mooncake"
    _check_file(path)
    with _reading(path), _open(path) as handle:
        header = handle.readline()
    if header.startswith("TIMESTAMP"):
        return "azure"
    if header.startswith("Timestamp,Model"):
        return "burstgpt"
    if header.startswith("client_id"):
        return "servegen"
    raise TraceError(f"{path}: cannot tell the trace format from its name or header; pass "
                     f"--format with one of {', '.join(FORMATS)}")


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _finish(name: str, arrivals: list[float], prompts: list[int], outputs: list[int],
            hashes: list[IntArray] | None, *, start: datetime | None, skipped: int,
            path: Path) -> Trace:
    if not arrivals:
        raise TraceError(f"{path}: the trace has no requests; check the file and --format")
    a = np.asarray(arrivals, dtype=np.float64)
    notes: list[str] = []
    if skipped:
        notes.append(f"skipped {skipped} malformed row(s)")
    if np.any(np.diff(a) < 0):
        warnings.warn(f"{path}: timestamps are not sorted; sorting them", stacklevel=3)
        notes.append("timestamps were not sorted; sorted them")
        order = np.argsort(a, kind="stable")
    else:
        order = np.arange(len(a))
    a = a[order]
    trace = Trace(name=name, arrival_s=a - a[0],
                  prompt_tokens=np.asarray(prompts, dtype=np.int64)[order],
                  output_tokens=np.asarray(outputs, dtype=np.int64)[order],
                  hash_ids=[hashes[i] for i in order] if hashes is not None else None,
                  start=start, skipped_rows=skipped, notes=tuple(notes))
    return trace


def _bad(path: Path, line: int, column: str, problem: str, *, row: str = "line",
         skippable: bool = True) -> TraceError:
    fix = ("fix the row or pass --skip-bad-rows to skip malformed rows" if skippable
           else "fix the row")
    return TraceError(f"{path}, {row} {line}, column {column!r}: {problem}; {fix}")


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, infinite, or too
    large for a float)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _int_field(row: dict[str, str], key: str, path: Path, line: int) -> int:
    text = row.get(key)
    if text is None:
        raise _bad(path, line, key, "missing value")
    number = _finite(text)
    if number is None or number > MAX_TOKENS:
        raise _bad(path, line, key, f"expected a token count, got {text!r}")
    value = int(number)
    if value < 0:
        raise _bad(path, line, key, f"expected a non-negative token count, got {value}")
    return value


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected "
                             f"{', '.join(required)} (header was {reader.fieldnames})")
        yield from enumerate(reader, start=2)


def _load_csv(path: Path, columns: tuple[str, str, str], parse_time: Any, *,
              skip_bad_rows: bool) -> tuple[list[float], list[int], list[int], int]:
    """Rows of (time, prompt tokens, output tokens) from a CSV; ``parse_time(text, line)``
    returns seconds or raises TraceError."""
    time_col, prompt_col, output_col = columns
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    skipped = 0
    for line, row in _csv_rows(path, columns):
        try:
            t = parse_time(row[time_col], line)
            p = _int_field(row, prompt_col, path, line)
            o = _int_field(row, output_col, path, line)
        except TraceError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        arrivals.append(t)
        prompts.append(p)
        outputs.append(o)
    return arrivals, prompts, outputs, skipped


def load_azure(path: Path, *, skip_bad_rows: bool = False) -> Trace:
    first: list[datetime] = []

    def parse(text: str, line: int) -> float:
        try:
            stamp = datetime.fromisoformat(text)
        except (TypeError, ValueError):
            raise _bad(path, line, "TIMESTAMP",
                       f"expected 'YYYY-MM-DD HH:MM:SS.fff', got {text!r}") from None
        if not first:
            first.append(stamp)
        try:
            return (stamp - first[0]).total_seconds()
        except TypeError:
            raise _bad(path, line, "TIMESTAMP", "mixes time zones with naive times") from None

    arrivals, prompts, outputs, skipped = _load_csv(
        path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), parse,
        skip_bad_rows=skip_bad_rows)
    return _finish(path.name, arrivals, prompts, outputs, None,
                   start=first[0] if first else None, skipped=skipped, path=path)


def load_burstgpt(path: Path, *, skip_bad_rows: bool = False) -> Trace:
    def parse(text: str, line: int) -> float:
        seconds = _finite(text)
        if seconds is None:
            raise _bad(path, line, "Timestamp", f"expected a finite number of seconds, got "
                                                f"{text!r}")
        return seconds

    arrivals, prompts, outputs, skipped = _load_csv(
        path, ("Timestamp", "Request tokens", "Response tokens"), parse,
        skip_bad_rows=skip_bad_rows)
    return _finish(path.name, arrivals, prompts, outputs, None, start=None, skipped=skipped,
                   path=path)


def _mooncake_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    """(``"line"`` or ``"request"``, its number, the parsed JSON or the TraceError of a row
    that is not JSON) per request of a Mooncake file: JSON lines, or one JSON array."""
    with _open(path) as handle:
        head = handle.read(4096).lstrip()
    if head.startswith("["):
        with _open(path) as handle:
            try:
                rows = json.load(handle)
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"{path}: starts with '[' but is not a JSON array ({exc.msg} at line "
                    f"{exc.lineno}, char {exc.colno}); a Mooncake trace is JSON lines (one "
                    "request object per line) or one JSON array of them") from None
        for i, row in enumerate(rows, start=1):
            yield "request", i, row
        return
    with _open(path) as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                yield "line", line, _bad(path, line, f"char {exc.colno}", f"not JSON ({exc.msg})")
                continue
            yield "line", line, row


def load_mooncake(path: Path, *, skip_bad_rows: bool = False) -> Trace:
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hashes: list[IntArray] = []
    skipped = 0
    for where, number, row in _mooncake_rows(path):
        try:
            if isinstance(row, TraceError):
                raise row
            if not isinstance(row, dict):
                raise _bad(path, number, "(row)", "expected a JSON object with timestamp, "
                           f"input_length and output_length (one request), got "
                           f"{type(row).__name__}", row=where)
            values = {}
            for key in ("timestamp", "input_length", "output_length"):
                value = _finite(row.get(key))
                if value is None or value < 0 or (key != "timestamp" and value > MAX_TOKENS):
                    raise _bad(path, number, key, "expected a finite non-negative number, "
                               f"got {row.get(key)!r}", row=where)
                values[key] = value
            ids = row.get("hash_ids", [])
            if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) and -2**63 <= h < 2**63
                    for h in ids):
                raise _bad(path, number, "hash_ids", "expected a list of 64-bit integers",
                           row=where)
        except TraceError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        arrivals.append(values["timestamp"] / 1000.0)
        prompts.append(int(values["input_length"]))
        outputs.append(int(values["output_length"]))
        hashes.append(np.asarray(ids, dtype=np.int64))
    return _finish(path.name, arrivals, prompts, outputs, hashes, start=None, skipped=skipped,
                   path=path)


# Synthetic ----------------------------------------------------------------------------------

_MIX = (  # share, prompt (median, sigma), output (median, sigma): chat, RAG, code
    (0.55, (600.0, 0.9), (220.0, 0.8)),
    (0.30, (3000.0, 0.6), (160.0, 0.7)),
    (0.15, (1500.0, 0.8), (40.0, 1.0)),
)


def _mix_lengths(n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
    shares = np.array([m[0] for m in _MIX])
    kind = rng.choice(len(_MIX), size=n, p=shares / shares.sum())
    prompts = np.empty(n)
    outputs = np.empty(n)
    for k, (_, (pm, ps), (om, os_)) in enumerate(_MIX):
        idx = kind == k
        prompts[idx] = rng.lognormal(math.log(pm), ps, idx.sum())
        outputs[idx] = rng.lognormal(math.log(om), os_, idx.sum())
    return (np.clip(prompts, 16, 32000).astype(np.int64),
            np.clip(outputs, 1, 4096).astype(np.int64))


def synthetic_trace(*, duration_s: float = 3 * 3600, mean_rps: float = 20.0,
                    daily_swing: float = 0.6, period_s: float = 86400.0,
                    phase_s: float = 0.0, bursts_per_hour: float = 1.5,
                    burst_factor: float = 2.5, burst_duration_s: float = 240.0,
                    seed: int = 0) -> Trace:
    """A seeded synthetic trace: sinusoidal daily cycle (``daily_swing`` is the relative
    amplitude), random bursts that multiply the rate for a few minutes, and a three-way length
    mix (chat, retrieval-augmented, code). The same seed gives the same trace."""
    if duration_s <= 0 or mean_rps <= 0:
        raise TraceError("synthetic trace: duration_s and mean_rps must be positive")
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, 1.0)
    rate = mean_rps * (1 + daily_swing * np.sin(2 * np.pi * (t + phase_s) / period_s -
                                                np.pi / 2))
    n_bursts = rng.poisson(bursts_per_hour * duration_s / 3600)
    for start in rng.uniform(0, duration_s, n_bursts):
        length = rng.exponential(burst_duration_s)
        ramp = np.clip((t - start) / 30.0, 0, 1) * np.clip((start + length - t) / 30.0, 0, 1)
        rate *= 1 + (burst_factor - 1) * ramp
    counts = rng.poisson(np.maximum(rate, 0))
    arrivals = np.repeat(t, counts) + rng.random(int(counts.sum()))
    arrivals.sort()
    prompts, outputs = _mix_lengths(len(arrivals), rng)
    return Trace(name=f"synthetic(seed={seed})", arrival_s=arrivals - arrivals[0],
                 prompt_tokens=prompts, output_tokens=outputs,
                 notes=(f"{n_bursts} burst(s)",))


SYNTHETIC_MAX_S = 14 * 86400.0
"""Longest synthetic trace (from t=0 to the end of the window asked for): two weeks, as long
as the longest shared trace."""


def load_trace(path: str | Path, fmt: str | None = None, *, skip_bad_rows: bool = False,
               seed: int = 0, start_s: float = 0.0, duration_s: float | None = None) -> Trace:
    """Load a trace file (format from ``fmt`` or detected), or ``synthetic`` for the default."""
    if str(path) == "synthetic" or fmt == "synthetic":
        span = (duration_s or 3 * 3600) + start_s
        if span > SYNTHETIC_MAX_S:
            # It is generated from t=0: a far --start built (and held) every request before it.
            raise TraceError(f"the synthetic trace runs up to {SYNTHETIC_MAX_S / 86400:g} days; "
                             f"--start plus --duration asks for {span / 86400:.3g}. Use a "
                             "shorter window, or a trace file for longer runs")
        trace = synthetic_trace(seed=seed, duration_s=span)
        return trace.window(start_s, duration_s or math.inf) if start_s else trace
    p = Path(path)
    _check_file(p)
    with _reading(p):
        fmt = fmt or detect_format(p)
        if fmt not in FORMATS:
            raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
        if fmt == "servegen":
            # Imported here: simulator._servegen builds on this module's Trace and helpers.
            from pdscale.simulator._servegen import load_servegen

            return load_servegen(p, seed=seed, start_s=start_s, duration_s=duration_s)
        loader = {"azure": load_azure, "burstgpt": load_burstgpt,
                  "mooncake": load_mooncake}[fmt]
        trace = loader(p, skip_bad_rows=skip_bad_rows)
    if start_s or duration_s is not None:
        trace = trace.window(start_s, duration_s if duration_s is not None else math.inf)
        if not len(trace):
            raise TraceError(f"{p}: no requests in the chosen window")
    return trace


# Stats ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceStats:
    name: str
    requests: int
    span_s: float
    rate_rps: dict[str, float]
    prompt_tokens: dict[str, float]
    output_tokens: dict[str, float]
    prefix_blocks_mean: float | None

    def table(self) -> str:
        def row(label: str, d: dict[str, float], fmt: str) -> str:
            return f"{label:<22}" + "".join(f"{format(d[k], fmt):>10}" for k in d)

        keys = list(self.rate_rps)
        lines = [
            f"trace       {self.name}",
            f"requests    {self.requests:,}",
            f"span        {self.span_s:,.0f} s ({self.span_s / 3600:.2f} h)",
            f"{'':<22}" + "".join(f"{k:>10}" for k in keys),
            row("rate (req/s, 1-min)", self.rate_rps, ".2f"),
            row("prompt tokens", self.prompt_tokens, ".0f"),
            row("output tokens", self.output_tokens, ".0f"),
        ]
        if self.prefix_blocks_mean is not None:
            lines.append(f"prefix blocks/request {self.prefix_blocks_mean:.1f}")
        return "\n".join(lines)


def _pcts(values: npt.NDArray[Any]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "p5": float(np.percentile(v, 5)),
            "p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max())}


def trace_stats(trace: Trace) -> TraceStats:
    minutes = np.floor(trace.arrival_s / 60).astype(np.int64)
    per_minute = np.bincount(minutes) / 60.0
    blocks = (float(np.mean([len(h) for h in trace.hash_ids])) if trace.hash_ids else None)
    return TraceStats(name=trace.name, requests=len(trace), span_s=trace.span_s,
                      rate_rps=_pcts(per_minute), prompt_tokens=_pcts(trace.prompt_tokens),
                      output_tokens=_pcts(trace.output_tokens), prefix_blocks_mean=blocks)
