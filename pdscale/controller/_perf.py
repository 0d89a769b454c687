"""The performance model: what one replica of a profile carries at an SLO, written once.

Pure functions of an :class:`~controller._profiles.InstanceProfile`, used by pdscale's
queueing model (:mod:`controller._queueing`, :mod:`controller._model`), the oracle's demand
plan, the Dynamo-style baseline and the fluid simulator, so a change to the arithmetic changes
all of them:

* **Headroom** (:data:`HEADROOM`): the share of saturated prefill throughput the oracle and
  the Dynamo-style baseline plan for, and the share of the ITL SLO a decode step may take;
  the rest absorbs queueing and variance (the queueing model plans for the SLO itself).
* **Uncached prefill demand** (:func:`uncached_prefill_demand`): prompt tokens the prefix
  cache does not serve, which is what prefill computes.
* **Prefill capacity** (:func:`prefill_capacity`): saturated chunked-prefill throughput for a
  length mix (E[L], E[L^2]: the attention term grows with the square), times the headroom.
* **The decode operating point** (:func:`decode_operating_point`): the largest batch whose
  step stays within an ITL budget and whose KV fits in :data:`KV_FILL` of the cache, its step
  time and its token rate. The step is linear in the batch (``d0 + d1 B + d2 B ctx / 1000``
  ms), so the batch has a closed form; :func:`decode_batch_limit` is the KV and engine cap
  alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdscale.controller._profiles import InstanceProfile

__all__ = ["HEADROOM", "KV_FILL", "MAX_CACHE_HIT", "DecodePoint", "decode_batch_limit",
           "decode_operating_point", "prefill_capacity", "uncached_prefill_demand"]

HEADROOM = 0.8
"""Share of saturated prefill throughput planned for, and of the ITL SLO a decode step may
use."""
KV_FILL = 0.95
"""Share of a replica's KV cache a decode batch may fill (the rest: fragmentation and the
sequences' next blocks)."""
MAX_CACHE_HIT = 0.95
"""Highest prefix-cache hit ratio credited to prefill demand: a pool that reads 100 % hits
still computes each prompt's last block, and a bad ratio must not size it to zero."""


def uncached_prefill_demand(prompt_tokens_per_s: float, hit_ratio: float | None) -> float:
    """Prompt tokens per second that prefill computes: those the prefix cache does not serve
    (a missing or out-of-range ratio counts as no hits, and at most :data:`MAX_CACHE_HIT`)."""
    hit = hit_ratio if hit_ratio is not None and math.isfinite(hit_ratio) else 0.0
    return prompt_tokens_per_s * (1 - min(max(hit, 0.0), MAX_CACHE_HIT))


def prefill_capacity(profile: InstanceProfile, mean_tokens: float, mean_sq_tokens: float, *,
                     headroom: float = HEADROOM) -> float:
    """Uncached prompt tokens per second one prefill replica carries at the SLO: its saturated
    throughput for a mix with these E[L] and E[L^2], times ``headroom``."""
    return profile.prefill_tokens_per_s(mean_tokens, mean_sq_tokens) * headroom


@dataclass(frozen=True)
class DecodePoint:
    """Where one decode replica runs at an ITL budget."""

    batch: int
    """Sequences decoded together."""
    step_s: float
    """Time of one step at that batch (every sequence gets a token)."""

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_s

    @property
    def replica_s_per_token(self) -> float:
        """Replica-seconds one generated token holds (the decode cost of a token)."""
        return self.step_s / self.batch


def decode_batch_limit(profile: InstanceProfile, ctx_tokens: float) -> int:
    """The most sequences of ``ctx_tokens`` context one replica holds: the engine's cap, or
    what :data:`KV_FILL` of its KV cache fits (at least 1)."""
    fits = math.floor(profile.kv_capacity_tokens * KV_FILL / max(ctx_tokens, 1e-9))
    return max(1, min(profile.max_batch, fits))


def decode_operating_point(profile: InstanceProfile, itl_budget_s: float,
                           ctx_tokens: float) -> DecodePoint:
    """The largest batch (at least 1) whose step is within ``itl_budget_s`` and whose KV fits
    (:func:`decode_batch_limit`), for sequences of ``ctx_tokens`` mean context."""
    budget_ms = itl_budget_s * 1000
    slope = profile.decode_d1_ms + profile.decode_d2_ms * ctx_tokens / 1000
    limit = decode_batch_limit(profile, ctx_tokens)
    if slope <= 0:
        batch = limit
    else:
        batch = math.floor((budget_ms - profile.decode_d0_ms) / slope)
        # The closed form within a rounding error of the boundary: settle it by the step.
        while batch + 1 <= limit and \
                profile.decode_step_ms(batch + 1, (batch + 1) * ctx_tokens) <= budget_ms:
            batch += 1
        while batch > 1 and profile.decode_step_ms(batch, batch * ctx_tokens) > budget_ms:
            batch -= 1
        batch = max(1, min(batch, limit))
    return DecodePoint(batch, profile.decode_step_ms(batch, batch * ctx_tokens) / 1000)
