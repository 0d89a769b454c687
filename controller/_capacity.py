"""Capacity model: how much demand one replica serves at the SLO.

Prefill demand is uncached prompt tokens per second (prompt tokens x (1 - prefix hit rate));
a replica serves its saturated chunked-prefill throughput for the length mix, times a target
utilisation that leaves room for queueing within the TTFT SLO. Decode demand is generated
tokens per second; a replica serves B tokens per step, where B is the largest batch whose step
time stays within the ITL SLO (with headroom) and whose KV cache fits, so its capacity is
B / step(B) tokens per second. The arithmetic is the performance model's
(:mod:`controller._perf`); this module tracks the length mix and corrects it online.

Online correction: when a pool misses its latency SLO at a load the model said it could carry,
the model was optimistic; when it is well within the SLO at high load, pessimistic. The
correction factor moves slowly towards observed / expected and is bounded, so one bad minute
cannot swing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controller._perf import HEADROOM, DecodePoint, decode_operating_point, prefill_capacity
from controller._profiles import InstanceProfile
from pdscale.spec import Role

__all__ = ["CapacityModel"]

@dataclass
class CapacityModel:
    """Per-replica capacity of one pool, with a bounded online correction."""

    role: Role
    profile: InstanceProfile
    slo_s: float
    """TTFT SLO for prefill, ITL SLO for decode."""
    mean_prompt_tokens: float = 1500.0
    prompt_cv: float = 1.5
    """Coefficient of variation of prompt lengths (LLM prompts are heavy-tailed); with the
    mean it gives E[L^2], which sets the attention cost per token."""
    mean_output_tokens: float = 200.0
    correction: float = 1.0
    min_correction: float = 0.5
    max_correction: float = 1.5
    smoothing: float = 0.1
    history: list[float] = field(default_factory=list)
    _point: tuple[tuple[float, float], DecodePoint] | None = field(default=None, repr=False)

    def observe_lengths(self, mean_prompt: float | None, mean_output: float | None) -> None:
        """Track the length mix slowly (it changes the per-token cost)."""
        if mean_prompt is not None and mean_prompt > 0:
            self.mean_prompt_tokens += 0.05 * (mean_prompt - self.mean_prompt_tokens)
        if mean_output is not None and mean_output > 0:
            self.mean_output_tokens += 0.05 * (mean_output - self.mean_output_tokens)

    def nominal_per_replica(self) -> float:
        """Demand units per second one replica carries at the SLO, before correction."""
        if self.role is Role.PREFILL:
            mean_sq = self.mean_prompt_tokens ** 2 * (1 + self.prompt_cv ** 2)
            return prefill_capacity(self.profile, self.mean_prompt_tokens, mean_sq)
        return self._decode_point().tokens_per_s

    def _decode_point(self) -> DecodePoint:
        """The decode operating point at the ITL SLO with headroom, for the mean context of a
        decoding sequence (cached: the lengths move slowly)."""
        ctx = self.mean_prompt_tokens + self.mean_output_tokens / 2
        key = (round(ctx, 3), self.slo_s)
        if self._point is None or self._point[0] != key:
            self._point = (key, decode_operating_point(self.profile, self.slo_s * HEADROOM, ctx))
        return self._point[1]

    def decode_batch(self) -> int:
        """Sequences one decode replica holds at the ITL SLO (with the correction)."""
        return max(1, math.floor(self._decode_point().batch * min(self.correction, 1.0)))

    def per_replica(self) -> float:
        return self.nominal_per_replica() * self.correction

    def observe_latency(self, *, latency_p95_s: float | None, demand_per_replica: float | None,
                        backlogged: bool = False) -> None:
        """Correct towards what replicas actually deliver, only from informative minutes:
        a miss at or below planned load (optimistic model), or ample slack at or above the
        planned load (pessimistic model). Slack below the planned load says nothing: the plan
        leaves headroom on purpose, so latency is low there whether or not the model is right
        (correcting upwards on it made pools shrink into overload and back, in a cycle)."""
        if demand_per_replica is None or demand_per_replica <= 0:
            return
        if latency_p95_s is None and not backlogged:
            return
        planned = self.per_replica()
        load = demand_per_replica / planned
        target = self.correction
        missed = backlogged or (latency_p95_s is not None and latency_p95_s > self.slo_s)
        if missed and load <= 1.0:
            target = self.correction * max(0.7, load)
        elif latency_p95_s is not None and latency_p95_s < 0.5 * self.slo_s and load >= 1.0:
            target = self.correction * 1.1
        else:
            return
        self.correction += self.smoothing * (target - self.correction)
        self.correction = min(self.max_correction, max(self.min_correction, self.correction))
        self.history.append(self.correction)
