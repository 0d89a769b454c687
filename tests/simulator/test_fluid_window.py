"""The fluid simulator's rate window: the recent signals over its ring of steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pdscale.simulator._fluid import _Window


def _hist(bin_: int, n: float, bins: int = 6) -> np.ndarray:
    h = np.zeros(bins)
    h[bin_] = n
    return h


def test_the_recent_signals_read_the_last_steps_of_the_ring() -> None:
    w = _Window(size=5, bins=6)
    assert w.peak_prompt_tokens(2) is None  # not two steps yet
    prompts = [100.0, 900.0, 50.0, 60.0, 70.0, 80.0, 5.0]  # wraps the ring of five
    for i, p in enumerate(prompts):
        w.push(1.0, p, 1.0, _hist(5 if i < 3 else 0, 10.0), 0)
        held = prompts[max(0, i - 4):i + 1]
        pairs = [a + b for a, b in itertools.pairwise(held)]
        if pairs:
            assert w.peak_prompt_tokens(2) == pytest.approx(max(pairs))
        assert w.prompt_tokens == pytest.approx(sum(held))
    # The last two steps carry only fast requests; the window still holds one slow step.
    assert w.recent_ttft(2)[5] == 0.0 and w.recent_ttft(2)[0] == 20.0
    assert w.ttft[5] == 10.0 and w.ttft[0] == 40.0
    assert w.recent_ttft(9).sum() == w.ttft.sum()  # more steps than held: the whole window
