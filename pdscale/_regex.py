"""Example strings that a regular expression matches in full.

The spec selects a pool's pods by a regex on the ``pod`` label. Generated promtool tests need
pod names that the regex matches, and validation needs them to tell whether two pools' regexes
can select the same pod. Replacing ``.*`` by a character (the first approach) fails on the
regexes people write for ReplicaSet hashes (``llama-p-[a-z0-9]{5}``), so the examples come
from the parsed pattern: a seeded random walk over literals, classes, repeats, groups and
alternatives, kept only when ``re.fullmatch`` agrees. Prometheus uses RE2, whose syntax for
these constructs is Python's; a pattern with constructs RE2 lacks (look-around,
back-references) yields no example.
"""

from __future__ import annotations

import random
import re
from re import _constants as c  # type: ignore[attr-defined]
from re import _parser as p  # type: ignore[attr-defined]
from typing import Any

__all__ = ["regex_examples"]

# Pod names are DNS-1123: prefer these characters wherever a pattern leaves the choice open.
_PREFERRED = "abcdefghijklmnopqrstuvwxyz0123456789-"
_FALLBACK = _PREFERRED + "ABCDEFGHIJKLMNOPQRSTUVWXYZ_."


class _Unsupported(Exception):
    pass


def _in_class(ch: str, items: list[tuple[Any, Any]]) -> bool:
    code = ord(ch)
    negate = False
    hit = False
    for op, av in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            hit |= code == av
        elif op is c.RANGE:
            hit |= av[0] <= code <= av[1]
        elif op is c.CATEGORY:
            hit |= {c.CATEGORY_DIGIT: ch.isdigit(), c.CATEGORY_NOT_DIGIT: not ch.isdigit(),
                    c.CATEGORY_WORD: ch.isalnum() or ch == "_",
                    c.CATEGORY_NOT_WORD: not (ch.isalnum() or ch == "_"),
                    c.CATEGORY_SPACE: ch.isspace(),
                    c.CATEGORY_NOT_SPACE: not ch.isspace()}.get(av, False)
        else:
            raise _Unsupported(str(op))
    return hit != negate


def _walk(items: Any, rng: random.Random, out: list[str]) -> None:
    for op, av in items:
        if op is c.LITERAL:
            out.append(chr(av))
        elif op is c.NOT_LITERAL:
            out.append(next(ch for ch in _FALLBACK if ord(ch) != av))
        elif op is c.ANY:
            out.append(rng.choice(_PREFERRED[:36]))
        elif op is c.IN:
            allowed = [ch for ch in _FALLBACK if _in_class(ch, av)]
            if not allowed:
                raise _Unsupported("empty class")
            preferred = [ch for ch in allowed if ch in _PREFERRED]
            out.append(rng.choice(preferred or allowed))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            hi = lo + 3 if hi is c.MAXREPEAT else min(hi, lo + 3)
            for _ in range(rng.randint(lo, max(lo, hi))):
                _walk(sub, rng, out)
        elif op is c.SUBPATTERN:
            _walk(av[-1], rng, out)
        elif op is c.BRANCH:
            _walk(rng.choice(av[1]), rng, out)
        elif op is c.AT:
            continue
        else:  # look-around, back-references, conditionals: not RE2
            raise _Unsupported(str(op))


def regex_examples(pattern: str, n: int = 2, *, seed: int = 0, tries: int = 400) -> list[str]:
    """Up to ``n`` distinct strings that ``pattern`` matches in full (fewer when the pattern
    matches fewer, or uses constructs outside RE2's syntax; none for an invalid pattern)."""
    try:
        parsed = p.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError):
        return []
    rng = random.Random(seed)
    found: list[str] = []
    for _ in range(tries):
        out: list[str] = []
        try:
            _walk(parsed, rng, out)
        except _Unsupported:
            return found
        text = "".join(out)
        if text not in found and compiled.fullmatch(text):
            found.append(text)
            if len(found) >= n:
                break
    return found
