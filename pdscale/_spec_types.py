"""The spec's vocabulary: engines, roles, durations, the frozen base model, and
the problem a check reports (pdscale.spec re-exports them)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator

from pdscale import _engines


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    DYNAMO = "dynamo"
    TGI = "tgi"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


# Default latency histogram buckets (seconds) as the engines' released versions export them;
# the tables and the versions live in pdscale._engines (shared/REFERENCE.md §1). Engines can
# be started with other buckets, which is why a service may state them in its spec. Dynamo's
# are computed from its DYN_METRICS_* settings (ServiceSpec.buckets); TGI's are not known, so
# no boundary check is made unless the spec states them.
ENGINE_HISTOGRAM_BUCKETS: dict[Engine, dict[str, tuple[float, ...]]] = {
    engine: dict(_engines.ENGINE_HISTOGRAM_BUCKETS[engine.value]) for engine in Engine}

def check_http_url(value: object) -> str:
    """An http(s) URL with a host (and, if given, a port from 1 to 65535); ValueError saying
    what was expected otherwise. A URL without its scheme (``localhost:9090``) is refused here,
    before it reaches the controller's loop."""
    from urllib.parse import urlsplit

    want = "an http(s) URL with a host, such as http://prometheus:9090"
    if not isinstance(value, str):
        raise ValueError(f"expected {want}, got {value!r}")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError(f"expected {want}, got {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0 \
            or any(ch.isspace() for ch in value):
        raise ValueError(f"expected {want}, got {value!r}")
    return value


HttpUrl = Annotated[str, BeforeValidator(check_http_url)]
"""A spec field holding an http(s) URL (:func:`check_http_url`)."""

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object) -> int:
    """Parse a Prometheus-style duration ("90s", "5m", "1h30m") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '5m' or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"expected a non-negative duration, got {value!r}")
        return round(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as '5m' or a number of seconds, got {value!r}")
    text = value.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _DURATION_UNITS_S[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(
            f"expected a duration such as '30s', '5m' or '1h30m' (units ms, s, m, h, d, w), "
            f"got {value!r}"
        )
    return round(total)


def format_duration(seconds: int | float) -> str:
    """Seconds as the shortest exact Prometheus duration: 600 -> '10m', 5400 -> '1h30m'."""
    remaining = round(seconds)
    if remaining == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


Duration = Annotated[int, BeforeValidator(parse_duration)]

_NORMAL_Z = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}


def cold_start_quantile(median_s: float, spread: float, q: float) -> float:
    """The ``q`` quantile (0.5, 0.9 or 0.99) of a log-normal cold start with this median and
    sigma ``spread``."""
    return median_s * math.exp(spread * _NORMAL_Z[q])


def _accepts_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    return any(_accepts_bool(a) for a in getattr(annotation, "__args__", ()))


class _Model(BaseModel):
    # A field's docstring is its description (the spec reference and the JSON schema show it).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's true/false would otherwise pass as 1/0 for a number (min_replicas: true).
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _accepts_bool(field.annotation):
                raise ValueError("expected a number or text as the field says, not true/false")
        return value


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec: where, what was expected, what was given, how to fix it."""

    path: str
    expected: str
    given: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: expected {self.expected}; got {self.given}. Fix: {self.fix}"


class SpecError(Exception):
    """The spec is invalid; ``problems`` lists every problem found. Give up: the user fixes it."""

    def __init__(self, source: str, problems: Sequence[SpecProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = [f"{source}: {len(self.problems)} problem(s) in the spec"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))
