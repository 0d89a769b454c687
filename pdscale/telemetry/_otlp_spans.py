"""What an engine's request span says: its timings and token counts, read from OTLP spans.

Design. vLLM (0.34.0, ``vllm/v1/engine/output_processor.py``, ``do_tracing``) and SGLang
(0.5.23, ``sglang/srt/observability/req_time_stats.py`` and ``tokenizer_manager.py``) end one
span per finished request whose attributes carry the request's latencies in seconds and its
token counts (tests/telemetry/reference/engine_spans.json records both shapes with their
source). A request span is recognised by its attributes, not its name (vLLM names it
``llm_request``; SGLang ``"<role> Req <rid>"``): it carries ``gen_ai.latency.e2e`` or
``gen_ai.latency.time_to_first_token``. Every other span (SGLang's per-thread and per-stage
spans, the engines' own startup spans) is ignored.

TTFT is split into stages where the engine says so:

* queue: ``gen_ai.latency.time_in_queue`` (vLLM: from the engine's QUEUED to its first
  SCHEDULED event; SGLang does not export it);
* prefill: ``gen_ai.latency.time_in_model_prefill`` (vLLM: first SCHEDULED to the first token;
  SGLang: from dispatch to the scheduler to the first token, its queue included);
* transfer: the rest of TTFT, ``ttft - queue - prefill`` (in P/D, the KV transfer; also the
  API server's tokenisation and hand-off): only where both other stages are known.

The inter-token latency is the request's mean time per output token after the first,
``time_in_model_decode / (completion_tokens - 1)``, what both engines compute for their own
TPOT; a request of one output token has none. The store weights it by the request's
``completion_tokens - 1`` gaps (``telemetry._otlp``). A request failed where the span's status is
ERROR or its ``gen_ai.response.finish_reasons`` holds ``abort`` or ``error`` (SGLang); vLLM's
span records neither, so its pools' error ratio from spans stays unknown, never zero.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ATTR", "RequestTiming", "SpanProblem", "request_timing"]


class ATTR:
    """The span attribute names both engines write (``SpanAttributes`` in each)."""

    TTFT = "gen_ai.latency.time_to_first_token"
    E2E = "gen_ai.latency.e2e"
    QUEUE = "gen_ai.latency.time_in_queue"
    PREFILL = "gen_ai.latency.time_in_model_prefill"
    DECODE = "gen_ai.latency.time_in_model_decode"
    PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    CACHED_TOKENS = "gen_ai.usage.cached_tokens"
    FINISH_REASONS = "gen_ai.response.finish_reasons"


_TIMINGS = {ATTR.TTFT: "ttft", ATTR.E2E: "e2e", ATTR.QUEUE: "queue", ATTR.PREFILL: "prefill",
            ATTR.DECODE: "decode"}
_COUNTS = {ATTR.PROMPT_TOKENS: "prompt", ATTR.COMPLETION_TOKENS: "completion",
           ATTR.CACHED_TOKENS: "cached"}
_FAILED_REASONS = frozenset({"abort", "error"})
_STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR
_STATUS_OK = 1
_TOLERANCE_S = 0.001
"""Rounding between an engine's clocks: a stage may exceed TTFT by this much."""


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One finished request as its span reports it (seconds, tokens; None: not reported)."""

    end_s: float
    """When the span ended (the engine's clock, Unix seconds)."""
    ttft_s: float
    e2e_s: float
    queue_s: float | None
    prefill_s: float | None
    transfer_s: float | None
    itl_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    failed: bool | None
    """True: failed; False: finished normally; None: the span does not say."""


@dataclass(frozen=True, slots=True)
class SpanProblem:
    """Why a request span cannot be used: ``reason`` is the drop counter's label."""

    reason: str
    """missing_timing, invalid_timing or inconsistent_timing."""
    detail: str


def _number(value: Any) -> float | None:
    """An AnyValue's number (double or int), or None."""
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return float(value.double_value)
    if kind == "int_value":
        return float(value.int_value)
    return None


def request_timing(span: Any) -> RequestTiming | SpanProblem | None:
    """The request an OTLP ``Span`` (protobuf message) reports, why it cannot be used, or
    None when it is not a request span."""
    timings: dict[str, float | None] = {}
    counts: dict[str, float | None] = {}
    reasons: str | None = None
    for kv in span.attributes:
        key = kv.key
        name = _TIMINGS.get(key)
        if name is not None:
            timings[name] = _number(kv.value)
            continue
        name = _COUNTS.get(key)
        if name is not None:
            counts[name] = _number(kv.value)
        elif key == ATTR.FINISH_REASONS:
            reasons = kv.value.string_value
    if not timings.keys() & {"ttft", "e2e"}:
        return None
    for name, value in timings.items():
        if value is None or not math.isfinite(value):
            return SpanProblem("invalid_timing", f"{name} is not a finite number of seconds")
        if value < 0:
            return SpanProblem("invalid_timing", f"{name} is negative ({value:g} s)")
    ttft, e2e = timings.get("ttft"), timings.get("e2e")
    if ttft is None or e2e is None:
        missing = "gen_ai.latency.time_to_first_token" if ttft is None else "gen_ai.latency.e2e"
        return SpanProblem("missing_timing", f"a request span without {missing}")
    if ttft > e2e + _TOLERANCE_S:
        return SpanProblem("inconsistent_timing",
                           f"time to first token {ttft:g} s exceeds the request's {e2e:g} s")
    queue, prefill = timings.get("queue"), timings.get("prefill")
    if (queue or 0.0) + (prefill or 0.0) > ttft + _TOLERANCE_S:
        return SpanProblem("inconsistent_timing",
                           f"queue {queue or 0.0:g} s + prefill {prefill or 0.0:g} s exceed "
                           f"the time to first token {ttft:g} s")
    transfer = max(0.0, ttft - queue - prefill) if queue is not None and prefill is not None \
        else None
    prompt, completion, cached = (_count(counts.get(k)) for k in ("prompt", "completion",
                                                                  "cached"))
    decode = timings.get("decode")
    itl = decode / (completion - 1) if decode is not None and completion is not None \
        and completion > 1 else None
    return RequestTiming(
        end_s=span.end_time_unix_nano / 1e9, ttft_s=ttft, e2e_s=e2e, queue_s=queue,
        prefill_s=prefill, transfer_s=transfer, itl_s=itl, prompt_tokens=prompt,
        completion_tokens=completion, cached_tokens=cached,
        failed=_failed(span.status.code, reasons))


def _count(value: float | None) -> int | None:
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _failed(status_code: int, reasons: str | None) -> bool | None:
    if status_code == _STATUS_ERROR:
        return True
    if reasons:
        try:
            given = json.loads(reasons)
        except ValueError:
            given = [reasons]
        names = {str(r) for r in given} if isinstance(given, list) else {str(given)}
        return bool(names & _FAILED_REASONS)
    if status_code == _STATUS_OK:
        return False
    return None
