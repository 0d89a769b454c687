"""Instance performance profiles: how fast one prefill or decode replica is.

A profile is a small YAML file (see ``pdscale/controller/profiles/`` for the shipped ones and where
their numbers come from). Prefill time of one prompt of L tokens is ``a + b*L + c*L^2`` ms;
under chunked prefill an iteration that advances a prompt from p to p + x tokens costs the
linear term on x and the quadratic term on ``(p + x)^2 - p^2`` (so the chunks of one prompt add
up to the whole prompt's cost), plus ``a`` once per iteration. That is attention over the
whole context prefilled so far, as real engines compute it (``prefill_attention: context``, the
default). ``prefill_attention: iteration`` charges an iteration of T new tokens ``a + b*T +
c*T^2`` whichever prompts they come from, as if they were one: Dynamo's mocker does that (its
polynomial takes the batch's total new tokens), so a 32k-token prompt takes it about 0.68 s of
prefill in four 8,192-token chunks (0.735 s measured with the frontend's overhead,
shared/REFERENCE.md section 6) where the context rule gives 1.02 s, and a full iteration costs
the same however many prompts share it. A decode step of B sequences holding
K resident KV tokens takes ``d0 + d1*B + d2*K/1000`` ms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ATTENTION_SCOPES", "InstanceProfile", "ProfileError", "builtin_profiles",
           "load_profile"]


ATTENTION_SCOPES = ("context", "iteration")
"""What prefill's quadratic term is charged on: each prompt's whole context prefilled so far
(real engines), or an iteration's total new tokens (Dynamo's mocker)."""


class ProfileError(ValueError):
    """A profile is missing or malformed; the message names the field and the fix."""


@dataclass(frozen=True)
class InstanceProfile:
    name: str
    gpu: str
    prefill_a_ms: float
    prefill_b_ms: float
    prefill_c_ms: float
    ttft_overhead_ms: float
    max_prefill_tokens_per_iter: int
    decode_d0_ms: float
    decode_d1_ms: float
    decode_d2_ms: float
    kv_capacity_tokens: int
    max_batch: int
    kv_bytes_per_token: int
    kv_latency_ms: float
    kv_bandwidth_gb_s: float
    cold_start_s: float
    prefill_attention: str = "context"
    """One of :data:`ATTENTION_SCOPES` (see the module docstring)."""
    frontend_ms_per_1k_tokens: float = 0.0
    """Time a request spends before any worker sees it, per 1,000 prompt tokens: the client
    sending the prompt and the frontend parsing and tokenising it. It grows with the prompt, so
    requests that arrive together reach the workers shortest first. ``ttft_overhead_ms`` is the
    rest of the overhead, the same for every prompt."""

    def frontend_ms(self, tokens: float) -> float:
        """Time before any worker sees a prompt of ``tokens`` tokens."""
        return self.frontend_ms_per_1k_tokens * tokens / 1000

    def overhead_ms(self, tokens: float) -> float:
        """TTFT beyond the prefill for a prompt of ``tokens`` tokens (without the KV
        transfer): the frontend's share before the prefill and the fixed share."""
        return self.ttft_overhead_ms + self.frontend_ms(tokens)

    def _poly_ms(self, tokens: float) -> float:
        """``a + b*T + c*T^2`` for T tokens: one prompt in one iteration, or (iteration scope)
        one iteration of T tokens in all."""
        return self.prefill_a_ms + self.prefill_b_ms * tokens + self.prefill_c_ms * tokens**2

    def prefill_ms(self, tokens: float) -> float:
        """GPU time to prefill one prompt of ``tokens`` tokens alone: one iteration (context
        scope, as always), or one iteration per chunk (iteration scope)."""
        if self.prefill_attention == "iteration" and tokens > self.max_prefill_tokens_per_iter:
            size = float(self.max_prefill_tokens_per_iter)
            whole, rest = divmod(float(tokens), size)
            return whole * self._poly_ms(size) + (self._poly_ms(rest) if rest > 0 else 0.0)
        return self._poly_ms(tokens)

    def chunk_ms(self, done: float, chunk: float) -> float:
        """Linear and attention cost of advancing a prompt from ``done`` by ``chunk`` tokens
        against its whole context so far (without the per-iteration constant)."""
        return self.prefill_b_ms * chunk + self.prefill_c_ms * ((done + chunk) ** 2 - done**2)

    def iteration_ms(self, chunks: Sequence[tuple[float, float]]) -> float:
        """One prefill iteration advancing prompts by ``(done, chunk)`` tokens each: ``a``
        plus each chunk's cost (context scope), or ``a + b*T + c*T^2`` for its T tokens in all
        (iteration scope)."""
        if self.prefill_attention == "iteration":
            return self._poly_ms(float(sum(x for _, x in chunks)))
        return self.prefill_a_ms + sum(self.chunk_ms(done, x) for done, x in chunks)

    def decode_step_ms(self, batch: float, kv_tokens: float) -> float:
        return self.decode_d0_ms + self.decode_d1_ms * batch + self.decode_d2_ms * kv_tokens / 1000

    def kv_transfer_ms(self, tokens: float) -> float:
        return self.kv_latency_ms + tokens * self.kv_bytes_per_token / (
            self.kv_bandwidth_gb_s * 1e9) * 1000

    def prefill_tokens_per_s(self, mean_tokens: float, mean_sq_tokens: float) -> float:
        """Saturated prefill throughput (full chunked iterations) for a length mix with the
        given E[L] and E[L^2]. A token's attention costs ``c`` times E[L^2]/E[L] (context
        scope), or ``c`` times a full iteration's tokens (iteration scope)."""
        attended = mean_sq_tokens / max(mean_tokens, 1.0)
        if self.prefill_attention == "iteration":
            attended = float(self.max_prefill_tokens_per_iter)
        per_token_ms = (self.prefill_b_ms + self.prefill_c_ms * attended + self.prefill_a_ms /
                        self.max_prefill_tokens_per_iter)
        return 1000.0 / per_token_ms


_FIELDS: dict[str, tuple[str, ...]] = {
    "prefill_ms": ("a", "b", "c"),
    "decode_step_ms": ("d0", "d1", "d2"),
    "kv_transfer": ("latency_ms", "bandwidth_gb_s"),
}
_SCALARS = ("name", "gpu", "ttft_overhead_ms", "max_prefill_tokens_per_iter",
            "kv_capacity_tokens", "max_batch", "kv_bytes_per_token", "cold_start_s")


def _parse(raw: Any, source: str) -> InstanceProfile:
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: expected a mapping of profile fields, got {raw!r}")
    missing = [f for f in (*_SCALARS, *_FIELDS) if f not in raw]
    for group, keys in _FIELDS.items():
        if isinstance(raw.get(group), dict):
            missing += [f"{group}.{k}" for k in keys if k not in raw[group]]
    if missing:
        raise ProfileError(f"{source}: missing field(s) {', '.join(missing)}; see the shipped "
                           "profiles in pdscale/controller/profiles/ for the format")

    def num(value: Any, where: str, *, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or (positive and value <= 0) or value < 0:
            kind = "positive" if positive else "non-negative"
            raise ProfileError(f"{source}: {where} must be a {kind} number, got {value!r}")
        return float(value)

    p, d, kv = raw["prefill_ms"], raw["decode_step_ms"], raw["kv_transfer"]
    scope = raw.get("prefill_attention", "context")
    if scope not in ATTENTION_SCOPES:
        raise ProfileError(f"{source}: prefill_attention must be one of "
                           f"{', '.join(ATTENTION_SCOPES)} (context: over each prompt's whole "
                           f"context so far, as real engines; iteration: over an iteration's "
                           f"total tokens, as Dynamo's mocker), got {scope!r}")
    return InstanceProfile(
        name=str(raw["name"]), gpu=str(raw["gpu"]),
        prefill_a_ms=num(p["a"], "prefill_ms.a", positive=False),
        prefill_b_ms=num(p["b"], "prefill_ms.b"),
        prefill_c_ms=num(p["c"], "prefill_ms.c", positive=False),
        ttft_overhead_ms=num(raw["ttft_overhead_ms"], "ttft_overhead_ms", positive=False),
        max_prefill_tokens_per_iter=int(num(raw["max_prefill_tokens_per_iter"],
                                            "max_prefill_tokens_per_iter")),
        decode_d0_ms=num(d["d0"], "decode_step_ms.d0"),
        decode_d1_ms=num(d["d1"], "decode_step_ms.d1", positive=False),
        decode_d2_ms=num(d["d2"], "decode_step_ms.d2", positive=False),
        kv_capacity_tokens=int(num(raw["kv_capacity_tokens"], "kv_capacity_tokens")),
        max_batch=int(num(raw["max_batch"], "max_batch")),
        kv_bytes_per_token=int(num(raw["kv_bytes_per_token"], "kv_bytes_per_token")),
        kv_latency_ms=num(kv["latency_ms"], "kv_transfer.latency_ms", positive=False),
        kv_bandwidth_gb_s=num(kv["bandwidth_gb_s"], "kv_transfer.bandwidth_gb_s"),
        cold_start_s=num(raw["cold_start_s"], "cold_start_s", positive=False),
        prefill_attention=scope,
        frontend_ms_per_1k_tokens=num(raw.get("frontend_ms_per_1k_tokens", 0.0),
                                      "frontend_ms_per_1k_tokens", positive=False),
    )


def builtin_profiles() -> dict[str, InstanceProfile]:
    out = {}
    folder = resources.files("pdscale.controller") / "profiles"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            profile = _parse(yaml.safe_load(entry.read_text()), entry.name)
            out[profile.name] = profile
    return out


def load_profile(name_or_path: str) -> InstanceProfile:
    """A shipped profile by name, or a user's profile file by path."""
    builtin = builtin_profiles()
    if name_or_path in builtin:
        return builtin[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ProfileError(f"{path}: not valid YAML ({exc})") from exc
        return _parse(raw, str(path))
    raise ProfileError(f"unknown profile {name_or_path!r}: use one of "
                       f"{', '.join(sorted(builtin))} or the path of a profile YAML file")
