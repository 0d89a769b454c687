"""Shared fixtures: example specs, tools from the distribution, free loopback ports."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pdscale._servers import free_port as free_port  # for the tests: one loopback port picker
from pdscale.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# shared/ (reference data) sits beside the repository; a worktree elsewhere can point at it.
SHARED = Path(os.environ.get("PDSCALE_SHARED") or ROOT.parent / "shared")


def example_ids() -> list[str]:
    return [p.stem for p in EXAMPLES]


@pytest.fixture(params=EXAMPLES, ids=example_ids())
def example(request: pytest.FixtureRequest) -> tuple[str, Spec]:
    path: Path = request.param
    return path.stem, load_spec(path)


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; the README's test command installs it "
                    "(scripts/system-deps.sh)")
    return path




# Property tests draw the same examples on every run: a failure in CI reproduces here.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("pdscale", derandomize=True, deadline=None)
_hypothesis_settings.load_profile("pdscale")
